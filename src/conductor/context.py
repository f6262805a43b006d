"""What each worker sees: the overall question, the earlier steps it may see, its subtask.

Following the paper's runner, every worker gets the original question (the paper's
text says only the first step does; the released code gives it to every step), then,
for each visible earlier step, the subtask that agent was given and its response,
wrapped in tags naming the agent, then its own subtask, all in one user message.

A worker's ``context:`` settings (:class:`~conductor.pool.WorkerContext`) add to this:
a prefill, sent as a final assistant message that the worker's reply continues,
whether the earlier responses it sees keep their reasoning blocks, and the ``brief``
form of the message: the task, the earlier answers on one line each, then one line
with the subtask, with no preamble and no tags.  Small models need it: a 135M model
given the full form mostly repeats the preamble (measured on the shipped smoke
benchmark: 3 of 20 right with the full form, 8 with the brief one, 8 with the bare
question).  By default there is no prefill, reasoning is removed and the form is full.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .llm.prefill import prefill_message, unsupported_reason
from .llm.types import Message
from .targets import MessageForm, Worker

__all__ = [
    "SharedStep",
    "build_worker_messages",
    "render_shared_step",
    "worker_prefills",
]

log = logging.getLogger("conductor")

# Workers already warned that their prefill is skipped: training builds an orchestrator
# per sub-pool, and each would otherwise warn again about the same worker.
_warned_prefill: set[tuple[str, str, str, str | None]] = set()

_PREAMBLE = (
    "You are one agent in a team of AI agents that work together on a task. You have "
    "been given one part of it. The task is shown first; after it come the parts that "
    "other agents were given and what they answered, where you are allowed to see them. "
    "Use their work where it helps, check it where it matters, and then do your own part."
)


@dataclass(frozen=True)
class SharedStep:
    """An earlier step as shown to a later worker.

    ``label`` identifies the step in the tags (``"1.2"`` = round 1, step 2), ``agent``
    is the worker's ordinal as the Conductor listed it, and ``response`` is the answer
    with reasoning blocks removed, or ``None`` when that agent failed.  ``reasoned`` is
    the reply as the agent wrote it (its prefill included), reasoning blocks kept, for
    workers whose context says ``reasoning: keep``; ``None`` means the same as
    ``response``.
    """

    label: str
    agent: int
    subtask: str
    response: str | None
    reasoned: str | None = None


def _body(step: SharedStep, keep_reasoning: bool) -> str:
    body = step.response
    if keep_reasoning and step.response is not None and step.reasoned is not None:
        body = step.reasoned
    return "(this agent failed and gave no answer)" if body is None else body


def render_shared_step(step: SharedStep, *, keep_reasoning: bool = False) -> str:
    """One visible step, wrapped in tags that name the agent."""
    body = _body(step, keep_reasoning)
    tag = f"agent_{step.agent}"
    return (
        f'<{tag} step="{step.label}">\n'
        f"Subtask given to this agent:\n{step.subtask}\n\n"
        f"Response of this agent:\n{body}\n"
        f"</{tag}>"
    )


def build_worker_messages(
    question: str,
    visible: Sequence[SharedStep],
    subtask: str,
    *,
    keep_reasoning: bool = False,
    prefill: Message | None = None,
    form: MessageForm = "full",
) -> list[Message]:
    """The messages sent to a worker: one user message, as described in the module doc,
    then ``prefill`` (from :func:`worker_prefills`) when there is one."""
    if form == "brief":
        lines = [question.strip(), ""]
        for step in visible:
            body = _body(step, keep_reasoning)
            lines.append(f"Answer of model {step.agent}: {' '.join(body.split())}")
        lines.append(f"Your part: {subtask}")
        content = "\n".join(lines)
    else:
        parts = [_PREAMBLE, f"# The task\n{question}"]
        if visible:
            shared = "\n\n".join(
                render_shared_step(s, keep_reasoning=keep_reasoning) for s in visible
            )
            parts.append(f"# Work of other agents that you may see\n{shared}")
        parts.append(f"# Your assigned subtask\n{subtask}")
        content = "\n\n".join(parts)
    messages: list[Message] = [{"role": "user", "content": content}]
    if prefill is not None:
        messages.append(prefill)
    return messages


def worker_prefills(workers: Iterable[Worker]) -> dict[str, Message | None]:
    """The prefill message of each worker by id, as it will be sent.

    A worker whose provider cannot continue a reply gets none, and one warning (logged)
    says so, once per worker and process rather than once per call.
    """
    out: dict[str, Message | None] = {}
    for worker in workers:
        text = worker.context.prefill
        message = prefill_message(worker, text)
        key = (worker.id, worker.client, worker.model, worker.api_base)
        if text and message is None and key not in _warned_prefill:
            _warned_prefill.add(key)
            log.warning(
                "worker %r: context.prefill is skipped: %s",
                worker.id,
                unsupported_reason(worker),
            )
        out[worker.id] = message
    return out
