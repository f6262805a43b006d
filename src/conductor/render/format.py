"""Formatting shared by every view: printable copies of records, clipping and numbers.

:func:`shown` is the one gate between what models, providers and files wrote and the
terminal; every public view calls it on the record (or event) it is given.  The text
shaping here (:func:`one_line`, :func:`clip`, :func:`clip_middle`) and the words for
numbers (:func:`format_usd`, :func:`format_tokens`, :func:`percent`,
:func:`round_label`) are shared by the views of :mod:`conductor.render` and by
:mod:`conductor.view.graph`, so that every view says them the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TypeVar

from ..record import CallRecord
from ..text import printable

__all__ = [
    "EXCERPT",
    "TREE_CLIP",
    "clip",
    "clip_middle",
    "format_tokens",
    "format_usd",
    "one_line",
    "percent",
    "round_label",
    "shown",
]

#: How much of a long text the tree view keeps.
TREE_CLIP = 300
#: Short excerpts of subtasks in the topology and Mermaid views.
EXCERPT = 60


_T = TypeVar("_T")


def shown(value: _T) -> _T:
    """A copy of ``value`` (a record, or part of one) whose every string is
    :func:`~conductor.text.printable`: answers, subtasks, worker names and errors come
    from models, providers and files, and must not drive the terminal.  Raw provider
    bodies are left out; no view shows them."""
    if isinstance(value, str):
        return printable(value)  # type: ignore[return-value]
    if isinstance(value, CallRecord):
        value = dataclasses.replace(value, raw=None)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: shown(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, list):
        return [shown(v) for v in value]  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(shown(v) for v in value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}  # type: ignore[return-value]
    return value


def one_line(text: str | None, limit: int = EXCERPT) -> str:
    """``text`` squeezed onto one line and cut to ``limit`` characters."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    return flat[: max(limit - 1, 1)].rstrip() + "…"


def clip(text: str | None, limit: int = TREE_CLIP) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    text = (text or "").strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit].rstrip()} … [+{len(text) - limit} chars]"


def clip_middle(text: str | None, head: int = 200, tail: int = 400) -> str:
    """Keep both ends of ``text``: a Conductor reply reasons first and ends with the lists."""
    text = (text or "").strip()
    if len(text) <= head + tail + 40:
        return text
    omitted = len(text) - head - tail
    return f"{text[:head].rstrip()}\n… [{omitted} chars omitted] …\n{text[-tail:].lstrip()}"


#: Significant digits a cost under a dollar keeps: enough to tell $0.000046 from
#: $0.000052, few enough to read at a glance.
_COST_DIGITS = 3


def format_usd(cost: float | None) -> str:
    """A cost in US dollars as every view shows it: cents from a dollar up
    (``$12.30``, ``$1,204.50``), three significant digits below (``$0.0123``,
    ``$0.000046``, never ``$0.0000``), ``$0`` for a true zero and ``?`` for an unknown
    (``None``) or unreadable one.  Only the display: records keep the full float."""
    if cost is None or not math.isfinite(cost):
        return "?"
    if cost == 0:
        return "$0"
    sign = "-" if cost < 0 else ""
    x = abs(cost)
    if x < 1e-9:
        # Below a billionth of a dollar, decimals would outgrow any column.
        return f"{sign}${x:.1e}"
    decimals = max(2, _COST_DIGITS - 1 - math.floor(math.log10(x)))
    text = f"{x:,.{decimals}f}"
    if decimals > 2:
        # 0.00350 -> 0.0035, but 0.50 stays (cents keep their two places).
        whole, frac = text.split(".")
        text = f"{whole}.{frac.rstrip('0').ljust(2, '0')}"
    return f"{sign}${text}"


def percent(share: float | None, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage (``0.125`` -> ``12.5%``); ``-`` for none."""
    return "-" if share is None else f"{100 * share:.{digits}f}%"


def format_tokens(n: int) -> str:
    """A token count with thousands separators (``12,345``)."""
    return f"{n:,}"


def round_label(pos: int) -> str:
    """The heading of a round by its 1-based position in ``record.rounds`` (``Round 2``)."""
    return f"Round {pos}"
