"""What form the final answer of a run must take: :class:`AnswerFormat`.

A caller (``conductor serve``, for a request with ``tools``, ``tool_choice`` or a JSON
``response_format``) hands a run one :class:`AnswerFormat`; it travels from
``Strategy.run`` to the :class:`~conductor.steps.StepRunner`, which gives it to the step
that answers (the last step of each round's workflow, a baseline's answering step) and
to no other step, and never to the Conductor.  That step's request carries the tools and
the response format (:meth:`AnswerFormat.apply`), and its reply is checked
(:meth:`AnswerFormat.check`): a reply that breaks the format is asked again
(:data:`ANSWER_RETRIES` times, as a new sample) and then fails the step, so it is never
returned as if it were valid.

The checks: a text reply to ``json_object`` must be a JSON object, to ``json_schema``
must be JSON that validates against the schema; a tool call must name one of the tools
and carry JSON-object arguments, which, for a ``strict`` tool, validate against its
``parameters``; ``tool_choice`` ``required`` wants at least one call, a named function
its call, ``none`` no call.  JSON Schema validation uses ``jsonschema`` (in the ``serve``
extra), through :mod:`conductor.llm.schema_checks`: linear, under size limits and a time
budget.  Where the checks run is the format's ``checks``: ``conductor serve`` gives each
request its own :class:`~conductor.llm.check_workers.RequestChecks` (worker processes,
one budget for all the request's checks); without one they run in the calling thread,
each under :data:`~conductor.llm.schema_limits.LIMITS`' budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..targets import Worker
from .check_workers import INLINE, Job, RequestChecks, run_job
from .schema_checks import Problem, check_reply
from .schema_limits import LIMITS, size_problem
from .tools import openai_tool, openai_tool_choice
from .types import ForcedTool, ModelRequest, ToolCall, ToolChoice, ToolSpec

__all__ = ["ANSWER_RETRIES", "PLAIN", "AnswerFormat", "schema_problem"]

#: How many more times the answering step is asked when its reply breaks the format.
ANSWER_RETRIES = 1


@dataclass(frozen=True)
class AnswerFormat:
    """The tools the answer may call, how (``tool_choice``), and the JSON shape of a text
    answer (``response_format``, OpenAI's ``{"type": "json_object"}`` or ``{"type":
    "json_schema", "json_schema": {"name", "schema", "strict"}}``; ``None``: free text).
    ``parallel_tool_calls`` false allows one call per reply (checked, not sent: not every
    provider takes it)."""

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    #: Where the JSON checks run and the budget they share (``None``: in the calling
    #: thread, each check under the default budget).  Not part of the format.
    checks: RequestChecks | None = field(default=None, compare=False, repr=False)

    @property
    def plain(self) -> bool:
        """Free text and no tools: nothing to send, nothing to check."""
        return not self.tools and self.response_format is None

    def apply(self, request: ModelRequest) -> ModelRequest:
        """``request`` carrying the tools and the response format."""
        if self.plain:
            return request
        return replace(
            request,
            tools=self.tools,
            tool_choice=self.tool_choice if self.tools else None,
            response_format=self.response_format or request.response_format,
        )

    def refusal(self, worker: Worker) -> str | None:
        """Why ``worker`` cannot answer in this format (its client cannot send tools or a
        response format), or ``None`` when it can."""
        from .factory import capabilities_of

        caps = capabilities_of(worker)
        kind = worker.client or "litellm"
        if self.tools and not caps.tools:
            return f"worker {worker.id!r} ({kind} client) cannot call tools"
        if self.response_format is not None and not caps.json_reply:
            return (
                f"worker {worker.id!r} ({kind} client) cannot be asked for a JSON response_format"
            )
        return None

    def note(self) -> str | None:
        """What the question says of the format, for the Conductor and the workers to
        plan by (``None`` for free text): the tools by name and description, and the
        JSON shape by its name."""
        lines: list[str] = []
        if self.tools and self.tool_choice != "none":
            must = {"required": " (it must call one)"}.get(str(self.tool_choice), "")
            if isinstance(self.tool_choice, ForcedTool):
                must = f" (it must call {self.tool_choice.name})"
            lines.append(f"The final answer may call these tools{must}:")
            for tool in self.tools:
                about = f": {' '.join(tool.description.split())}" if tool.description else ""
                lines.append(f"- {tool.name}{about}")
        fmt = self.response_format
        if fmt is not None:
            spec = fmt.get("json_schema") if fmt.get("type") == "json_schema" else None
            if isinstance(spec, dict):
                name = spec.get("name")
                lines.append(
                    "A text answer must be one JSON object that follows the JSON schema"
                    + (f" {name!s}." if name else ".")
                )
            else:
                lines.append("A text answer must be one JSON object.")
        return "\n".join(lines) or None

    def describe(self) -> dict[str, Any]:
        """The format as the run's record keeps it (the wire's shapes)."""
        out: dict[str, Any] = {}
        if self.tools:
            out["tools"] = [openai_tool(t) for t in self.tools]
        if self.tool_choice is not None:
            out["tool_choice"] = openai_tool_choice(self.tool_choice)
        if self.response_format is not None:
            out["response_format"] = self.response_format
        if not self.parallel_tool_calls:
            out["parallel_tool_calls"] = False
        return out

    def violation(self, text: str, calls: tuple[ToolCall, ...]) -> str | None:
        """How a reply (its answer ``text`` and its tool ``calls``) breaks the format, in
        one sentence, or ``None`` when it keeps to it; the JSON checks are made here, in
        the calling thread (see :meth:`check`)."""
        found, checks = self._plan(text, calls)
        for job in checks:
            problem = check_reply(job.text, job.schema, need_object=job.need_object)
            if problem is not None:
                return job.say(problem)
        return found

    async def check(self, text: str, calls: tuple[ToolCall, ...]) -> str | None:
        """:meth:`violation`, the JSON checks made by the format's ``checks`` (a
        server's worker processes, within its request's budget)."""
        found, checks = self._plan(text, calls)
        runner = self.checks or RequestChecks(INLINE)
        for job in checks:
            problem = await runner.reply(job.text, job.schema, need_object=job.need_object)
            if problem is not None:
                return job.say(problem)
        return found

    def check_refusal(self) -> str | None:
        """Why no more replies can be checked (the request's check budget is spent),
        or ``None``: a step that answers is then not asked at all."""
        return self.checks.refusal() if self.checks is not None else None

    def _plan(self, text: str, calls: tuple[ToolCall, ...]) -> tuple[str | None, list[_JsonCheck]]:
        """What the rules without JSON say of a reply (a violation or ``None``), and the
        JSON checks to make, in order, when they say nothing."""
        if calls:
            return self._calls_plan(calls)
        if self.tools and self.tool_choice == "required":
            return "tool_choice is required but the reply called no tool", []
        if isinstance(self.tool_choice, ForcedTool):
            return f"tool_choice names {self.tool_choice.name} but the reply called no tool", []
        fmt = self.response_format
        if fmt is None:
            return None, []
        spec = fmt.get("json_schema") if fmt.get("type") == "json_schema" else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            return None, [_JsonCheck(text, None, need_object=True)]
        return None, [_JsonCheck(text, schema, need_object=False)]

    def _calls_plan(self, calls: tuple[ToolCall, ...]) -> tuple[str | None, list[_JsonCheck]]:
        if not self.tools:
            return "the reply called a tool, but no tools were given", []
        if self.tool_choice == "none":
            return "tool_choice is none but the reply called a tool", []
        if not self.parallel_tool_calls and len(calls) > 1:
            return f"parallel_tool_calls is false but the reply made {len(calls)} calls", []
        tools = {t.name: t for t in self.tools}
        forced = self.tool_choice.name if isinstance(self.tool_choice, ForcedTool) else None
        if forced is not None and all(c.name != forced for c in calls):
            return f"tool_choice names {forced} but the reply did not call it", []
        checks: list[_JsonCheck] = []
        for call in calls:
            tool = tools.get(call.name)
            if tool is None:
                return f"the reply called {call.name!r}, which is not one of the tools", []
            schema = tool.parameters if tool.strict else None
            checks.append(_JsonCheck(call.arguments or "{}", schema, True, call.name))
        return None, checks


#: Free text and no tools: what a run answers with when nothing else is asked.
PLAIN = AnswerFormat()


@dataclass(frozen=True)
class _JsonCheck:
    """One JSON check a reply needs: ``text`` parsed, an object where ``need_object``,
    valid against ``schema`` where given; ``call`` names the tool call it is of
    (``None``: the reply's text), for the sentence that says how it failed."""

    text: str
    schema: dict[str, Any] | None
    need_object: bool
    call: str | None = None

    def say(self, problem: Problem) -> str:
        """How the reply breaks the format, in one sentence."""
        kind, detail = problem.kind, problem.detail
        if kind == "timeout":  # out of time: unchecked, as a reply too large to check
            kind = "unchecked"
        if self.call is None:
            return {
                "not_json": f"the reply is not JSON ({detail})",
                "not_object": "the reply is JSON but not an object",
                "mismatch": f"the reply does not match the JSON schema: {detail}",
                "unchecked": f"the reply could not be checked against the JSON schema: {detail}",
            }[kind]
        of = f"the arguments of the call of {self.call}"
        return {
            "not_json": f"{of} are not JSON ({detail})",
            "not_object": f"{of} are not a JSON object",
            "mismatch": f"{of} do not match its schema: {detail}",
            "unchecked": f"{of} could not be checked against its schema: {detail}",
        }[kind]


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a JSON Schema its validator can use (over a size limit of
    :data:`~conductor.llm.schema_limits.LIMITS`, not valid, or not checkable within the
    check budget), or ``None``.  Checked here, in the calling thread; ``conductor
    serve`` checks through :class:`~conductor.llm.check_workers.RequestChecks`."""
    over = size_problem(schema)
    if over is not None:
        return f"the schema {over}"
    found = run_job(Job("schema", schema), LIMITS.check_s)
    return found.detail if found is not None else None
