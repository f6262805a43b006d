"""Small text helpers shared by the parser, the executor and the graders.

Reasoning models wrap their private reasoning in ``<think>...</think>`` (some write
``<thinking>``).  That text is never part of an answer or of a workflow: a model often
drafts decoy plans inside it.  :func:`strip_think` removes it, and
:func:`final_answer_text` picks the answer of a workflow (the last non-empty step
response, reasoning removed).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["final_answer_text", "strip_think"]

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


def final_answer_text(responses: Sequence[str | None]) -> str | None:
    """The final answer of a workflow: the last step response that is not empty once its
    reasoning blocks are removed, stripped of surrounding whitespace.

    A response that holds only reasoning (for example a worker cut off while thinking)
    counts as empty, so the answer falls back to the step before it.  ``None`` when no
    response has any answer text.
    """
    for response in reversed(responses):
        if response is None:
            continue
        cleaned = strip_think(response).strip()
        if cleaned:
            return cleaned
    return None
