"""What form the final answer of a run must take: :class:`AnswerFormat`.

A caller (``conductor serve``, for a request with ``tools``, ``tool_choice`` or a JSON
``response_format``) hands a run one :class:`AnswerFormat`; it travels from
``Strategy.run`` to the :class:`~conductor.steps.StepRunner`, which gives it to the step
that answers (the last step of each round's workflow, a baseline's answering step) and
to no other step, and never to the Conductor.  That step's request carries the tools and
the response format (:meth:`AnswerFormat.apply`), and its reply is checked
(:meth:`AnswerFormat.violation`): a reply that breaks the format is asked again
(:data:`ANSWER_RETRIES` times, as a new sample) and then fails the step, so it is never
returned as if it were valid.

The checks: a text reply to ``json_object`` must be a JSON object, to ``json_schema``
must be JSON that validates against the schema; a tool call must name one of the tools
and carry JSON-object arguments, which, for a ``strict`` tool, validate against its
``parameters``; ``tool_choice`` ``required`` wants at least one call, a named function
its call, ``none`` no call.  JSON Schema validation uses ``jsonschema`` (in the ``serve``
extra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..errors import MissingDependencyError, install_hint
from ..targets import Worker
from .tools import openai_tool, openai_tool_choice
from .types import ForcedTool, ModelRequest, ToolCall, ToolChoice, ToolSpec

__all__ = ["ANSWER_RETRIES", "PLAIN", "AnswerFormat", "schema_problem"]

#: How many more times the answering step is asked when its reply breaks the format.
ANSWER_RETRIES = 1

#: The most of a schema error a violation's sentence quotes.
_QUOTE = 160


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
        one sentence, or ``None`` when it keeps to it."""
        if calls:
            return self._calls_violation(calls)
        if self.tools and self.tool_choice == "required":
            return "tool_choice is required but the reply called no tool"
        if isinstance(self.tool_choice, ForcedTool):
            return f"tool_choice names {self.tool_choice.name} but the reply called no tool"
        fmt = self.response_format
        if fmt is None:
            return None
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            return f"the reply is not JSON ({exc})"
        if fmt.get("type") == "json_object":
            return None if isinstance(value, dict) else "the reply is JSON but not an object"
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            return None if isinstance(value, dict) else "the reply is JSON but not an object"
        problem = _invalid(value, schema)
        return f"the reply does not match the JSON schema: {problem}" if problem else None

    def _calls_violation(self, calls: tuple[ToolCall, ...]) -> str | None:
        if not self.tools:
            return "the reply called a tool, but no tools were given"
        if self.tool_choice == "none":
            return "tool_choice is none but the reply called a tool"
        if not self.parallel_tool_calls and len(calls) > 1:
            return f"parallel_tool_calls is false but the reply made {len(calls)} calls"
        tools = {t.name: t for t in self.tools}
        forced = self.tool_choice.name if isinstance(self.tool_choice, ForcedTool) else None
        if forced is not None and all(c.name != forced for c in calls):
            return f"tool_choice names {forced} but the reply did not call it"
        for call in calls:
            tool = tools.get(call.name)
            if tool is None:
                return f"the reply called {call.name!r}, which is not one of the tools"
            try:
                arguments = json.loads(call.arguments or "{}")
            except (json.JSONDecodeError, RecursionError) as exc:
                return f"the arguments of the call of {call.name} are not JSON ({exc})"
            if not isinstance(arguments, dict):
                return f"the arguments of the call of {call.name} are not a JSON object"
            if tool.strict and tool.parameters is not None:
                problem = _invalid(arguments, tool.parameters)
                if problem:
                    return (
                        f"the arguments of the call of {call.name} do not match its "
                        f"schema: {problem}"
                    )
        return None


#: Free text and no tools: what a run answers with when nothing else is asked.
PLAIN = AnswerFormat()


def _jsonschema() -> Any:
    try:
        import jsonschema
    except ImportError:
        raise MissingDependencyError(
            f"checking a reply against a JSON schema needs jsonschema: {install_hint('serve')}"
        ) from None
    return jsonschema


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a JSON Schema its validator can use, or ``None``."""
    jsonschema = _jsonschema()
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return _short(exc.message)
    used = _keywords_in(schema)
    if {"unevaluatedProperties", "patternProperties"} <= used:
        # jsonschema matches patternProperties for unevaluatedProperties with Python's
        # re, outside the time-out of _search: the two together are refused.
        return "unevaluatedProperties beside patternProperties is not supported"
    return None


def _keywords_in(node: Any, depth: int = 0) -> set[str]:
    """Every object key anywhere in ``node`` (a schema's keywords, and property names,
    which only make the check stricter)."""
    if depth > 64:  # deeper than any real schema; JSON bodies are bounded anyway
        return set()
    if isinstance(node, dict):
        found = set(node)
        for value in node.values():
            found |= _keywords_in(value, depth + 1)
        return found
    if isinstance(node, list):
        return set().union(*(_keywords_in(v, depth + 1) for v in node)) if node else set()
    return set()


#: How long one regular expression of a schema may take on one string.  The schema is
#: the client's and the string a worker's reply, which the client's question steers: a
#: catastrophic pattern (``^(a+)+$``) on Python's ``re`` holds the GIL for minutes and
#: stalls every request of the server, so patterns run on ``regex`` with a time-out.
PATTERN_TIMEOUT_S = 0.05


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``; a match that takes longer than
    :data:`PATTERN_TIMEOUT_S` counts as no match (the reply is then refused, never
    passed unchecked)."""
    import regex

    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        return False


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{_short(repr(instance))} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Any:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in known and not any(_search(p, k) for p in patterns)]
    if validator.is_type(allowed, "object"):
        for key in extras:
            yield from validator.descend(instance[key], allowed, path=key)
    elif allowed is False and extras:
        shown = ", ".join(repr(k) for k in sorted(extras, key=str))
        yield ValidationError(f"Additional properties are not allowed ({shown})")


def _validator(schema: dict[str, Any]) -> Any:
    """A validator of ``schema`` (its draft as ``$schema`` says) whose regular
    expressions run under :data:`PATTERN_TIMEOUT_S`."""
    jsonschema = _jsonschema()
    base = jsonschema.validators.validator_for(schema)
    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    }
    return jsonschema.validators.extend(base, keywords)(schema)


def _invalid(value: Any, schema: dict[str, Any]) -> str | None:
    """The most telling way ``value`` breaks ``schema``, or ``None`` when it validates."""
    jsonschema = _jsonschema()
    validator = _validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return _short(f"{where.lstrip('.') or 'the value'}: {error.message}")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."
