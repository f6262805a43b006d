"""What each worker sees: the overall question, the earlier steps it may see, its subtask.

Following the paper's runner, every worker gets the original question (the paper's
text says only the first step does; the released code gives it to every step), then,
for each visible earlier step, the subtask that agent was given and its response,
wrapped in tags naming the agent, then its own subtask, all in one user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .llm.types import Message

__all__ = ["SharedStep", "build_worker_messages", "render_shared_step"]

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
    with reasoning blocks removed, or ``None`` when that agent failed.
    """

    label: str
    agent: int
    subtask: str
    response: str | None


def render_shared_step(step: SharedStep) -> str:
    """One visible step, wrapped in tags that name the agent."""
    body = step.response if step.response is not None else "(this agent failed and gave no answer)"
    tag = f"agent_{step.agent}"
    return (
        f'<{tag} step="{step.label}">\n'
        f"Subtask given to this agent:\n{step.subtask}\n\n"
        f"Response of this agent:\n{body}\n"
        f"</{tag}>"
    )


def build_worker_messages(
    question: str, visible: Sequence[SharedStep], subtask: str
) -> list[Message]:
    """The messages sent to a worker: one user message, as described in the module doc."""
    parts = [_PREAMBLE, f"# The task\n{question}"]
    if visible:
        shared = "\n\n".join(render_shared_step(s) for s in visible)
        parts.append(f"# Work of other agents that you may see\n{shared}")
    parts.append(f"# Your assigned subtask\n{subtask}")
    return [{"role": "user", "content": "\n\n".join(parts)}]
