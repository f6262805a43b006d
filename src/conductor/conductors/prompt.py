"""The Conductor's prompt: a template filled with the pool listing and the question.

Templates are text files with ``${name}`` placeholders (``string.Template``):
``${workers}``, ``${question}`` and ``${max_steps}``.  A built-in template is named
by its file stem (``default``); anything else is read as a path, because a trained
checkpoint needs exactly the template it was trained with.  Recursive rounds append
the revision text (``revise.txt``) with ``${previous_workflow}`` and
``${previous_answer}``.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import UsageError
from ..llm.types import Message
from ..pool import Worker

__all__ = [
    "REASK_REASON_CHARS",
    "REASK_REPLY_CHARS",
    "PreviousRound",
    "build_conductor_messages",
    "build_reask_messages",
    "builtin_templates",
    "describe_workers",
    "load_template",
]

_PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


def builtin_templates() -> list[str]:
    """Names of the templates shipped with conductor."""
    return sorted(p.stem for p in _PROMPTS.glob("*.txt") if p.stem != "revise")


@lru_cache(maxsize=32)
def load_template(name_or_path: str) -> str:
    """The text of a built-in template (by name) or of a template file (by path)."""
    builtin = _PROMPTS / f"{name_or_path}.txt"
    if "/" not in name_or_path and builtin.is_file():
        return builtin.read_text(encoding="utf-8")
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise UsageError(
        f"template {name_or_path!r} is neither a built-in template "
        f"({', '.join(builtin_templates())}) nor a readable file"
    )


def describe_workers(workers: Sequence[Worker], *, show_descriptions: bool = False) -> str:
    """The pool as the Conductor sees it: ordinals only, names hidden.

    Descriptions are shown only when enabled, because a trained Conductor learns each
    worker's skills from reward, not from what a pool author says about it.
    """
    lines = []
    for i, w in enumerate(workers):
        line = f"Model {i}"
        if show_descriptions and w.description:
            line += f": {w.description.strip()}"
        lines.append(f"- {line}")
    return "\n".join(lines)


@dataclass(frozen=True)
class PreviousRound:
    """What a recursive round is shown of the round before it."""

    workflow_text: str
    final_answer: str


def build_conductor_messages(
    question: str,
    workers: Sequence[Worker],
    *,
    max_steps: int = 5,
    template: str = "default",
    show_descriptions: bool = False,
    previous: PreviousRound | None = None,
) -> list[Message]:
    """The messages that ask the Conductor for a workflow (one user message)."""
    values = {
        "workers": describe_workers(workers, show_descriptions=show_descriptions),
        "question": question.strip(),
        "max_steps": str(max_steps),
    }
    try:
        text = string.Template(load_template(template)).substitute(values)
    except (KeyError, ValueError) as exc:
        raise UsageError(f"template {template!r} has a bad placeholder: {exc}") from None
    if previous is not None:
        text += string.Template(load_template("revise")).safe_substitute(
            previous_workflow=previous.workflow_text,
            previous_answer=previous.final_answer,
            max_steps=str(max_steps),
        )
    return [{"role": "user", "content": text}]


#: How much of a Conductor reply that did not parse is quoted back when re-asking: its
#: end, where the lists belong.  A huge or hostile reply is not resent whole with every
#: try (the parser itself reads only the last ``MAX_REPLY_CHARS``).
REASK_REPLY_CHARS = 4_000
#: How much of the parse error is quoted (a reason may quote a bad value).
REASK_REASON_CHARS = 500


def _tail(text: str, limit: int, unit: str) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit:,} earlier {unit} left out ...]\n{text[-limit:]}"


def build_reask_messages(messages: Sequence[Message], reply: str, reason: str) -> list[Message]:
    """``messages`` followed by the reply that did not parse (its end only) and a request
    to write the plan again, naming ``reason``."""
    if len(reason) > REASK_REASON_CHARS:
        reason = reason[:REASK_REASON_CHARS] + " ..."
    return [
        *messages,
        {"role": "assistant", "content": _tail(reply, REASK_REPLY_CHARS, "characters")},
        {
            "role": "user",
            "content": (
                f"That reply could not be used: {reason}. Write your plan "
                "again and end it with the three lists model_id, subtasks and "
                "access_list, of equal length, as described above."
            ),
        },
    ]
