"""Small text helpers shared by the parser, the executor and the graders.

Reasoning models wrap their private reasoning in ``<think>...</think>`` (some write
``<thinking>``).  That text is never part of an answer or of a workflow: a model often
drafts decoy plans inside it.  :func:`strip_think` removes it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from .errors import CONDUCTOR_TARGET, UsageError

__all__ = [
    "MAX_QUESTION_CHARS",
    "check_question",
    "joined",
    "plural",
    "printable",
    "question_limit",
    "strip_think",
    "targets_named",
]

#: The longest question accepted (characters), from ``conductor ask`` or a benchmark
#: row.  Far above any benchmark's questions, far below what would make every prompt,
#: request body, cache key and record carry copies of a runaway text.  The environment
#: variable ``CONDUCTOR_MAX_QUESTION_CHARS`` sets another limit.
MAX_QUESTION_CHARS = 1_000_000


def question_limit() -> int:
    """The longest question accepted, in characters (see :data:`MAX_QUESTION_CHARS`)."""
    raw = os.environ.get("CONDUCTOR_MAX_QUESTION_CHARS", "").strip()
    if not raw:
        return MAX_QUESTION_CHARS
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise UsageError(
            f"CONDUCTOR_MAX_QUESTION_CHARS={raw!r} must be a positive whole number of characters"
        )
    return limit


def check_question(question: str) -> None:
    """Refuse (:class:`~conductor.errors.UsageError`) a question that could not be sent:
    empty or only whitespace (there is nothing to answer, and a model would answer
    anyway), longer than the limit (:data:`MAX_QUESTION_CHARS`), or holding a lone
    surrogate, which no UTF-8 request body can carry."""
    if not question.strip():
        raise UsageError("the question is empty; give the question to answer")
    limit = question_limit()
    if len(question) > limit:
        raise UsageError(
            f"the question is {len(question):,} characters long, over the limit of "
            f"{limit:,} (set CONDUCTOR_MAX_QUESTION_CHARS to change it)"
        )
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"the question holds a lone surrogate ({question[exc.start]!r} at character "
            f"{exc.start}), which is not text that can be sent"
        ) from None


# One pattern for both the opening and the closing tag of either spelling, so that a
# single left-to-right pass can track nesting.
_TAG = re.compile(r"<\s*(/?)\s*think(?:ing)?\b[^>]*>", re.IGNORECASE)


def strip_think(text: str) -> str:
    """Return ``text`` without its reasoning blocks.

    - ``<think>...</think>`` and ``<thinking>...</thinking>`` (any case) are removed,
      nested ones included.
    - A closing tag with no opening tag before it means the reply began inside a
      reasoning block (chat templates often put the opening tag in the prompt):
      everything up to that tag is dropped.
    - An opening tag never closed means the rest of the text is reasoning (the model
      ran out of tokens while thinking): everything from it is dropped.

    Whitespace around the remaining text is kept; callers strip it when they need to.
    """
    if "<" not in text:
        return text
    kept: list[str] = []
    depth = 0
    pos = 0
    for match in _TAG.finditer(text):
        closing = bool(match.group(1))
        if depth == 0:
            if closing:
                # A stray closing tag: what came before it was reasoning.
                kept.clear()
            else:
                kept.append(text[pos : match.start()])
                depth = 1
        elif closing:
            depth -= 1
        else:
            depth += 1
        pos = match.end()
    if depth == 0:
        kept.append(text[pos:])
    return "".join(kept)


# Characters a terminal acts on instead of showing: C0 controls other than tab and
# newline (ESC starts colour, cursor, title and clipboard sequences), DEL, the C1
# controls (U+009B is a one-character CSI), and the bidirectional overrides and
# isolates that make shown text read differently from what it is.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe to show on a terminal: each control character is written out as a
    visible escape (ESC becomes ``\\x1b``); newlines and tabs are kept, and a
    Windows line end becomes a newline.  Model replies, subtasks and provider error
    messages pass through here before they are rendered."""
    if _UNPRINTABLE.search(text) is None:
        return text
    return _UNPRINTABLE.sub(_escape_char, text.replace("\r\n", "\n"))


def plural(n: int, one: str, many: str | None = None, *, shown: str | None = None) -> str:
    """``n`` with its noun in the right number: ``"1 step"``, ``"2 steps"``, ``"0 steps"``.

    ``many`` is the plural when it is not ``one + "s"`` (``"try"``, ``"tries"``);
    ``shown`` is how to write ``n`` when not as ``str(n)`` (``"1,024"``).
    """
    noun = one if n == 1 else (many if many is not None else f"{one}s")
    return f"{shown if shown is not None else n} {noun}"


def joined(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def targets_named(ids: Sequence[str]) -> str:
    """Call targets as a sentence names them: ``worker 'a'``, ``workers 'a' and 'b'``,
    ``... and the Conductor`` (the Conductor last, whatever the order of ``ids``)."""
    workers = [repr(i) for i in ids if i != CONDUCTOR_TARGET]
    names: list[str] = []
    if workers:
        names.append(f"worker{'s' if len(workers) > 1 else ''} {joined(workers)}")
    if CONDUCTOR_TARGET in ids:
        names.append("the Conductor")
    return " and ".join(names)
