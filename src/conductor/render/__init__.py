"""Rich views of run records: topology trees, step tables, traces, Mermaid, progress.

Everything here turns a :class:`~conductor.record.RunRecord` (or a stream of
:class:`~conductor.events.Event`) into a rich renderable or a string; nothing prints.
The CLI imports this package at start-up (``conductor trace`` must feel instant), so it
imports only rich and the standard library, and each name below on first use: a command
that shows one view (``bench``'s progress lines, a report) loads no other.

Numbering: rounds are shown 1-based by their position in ``record.rounds`` ("Round 1",
``S1.0``), steps 0-based as in the Conductor's access lists ("step 0", "sees: 0, 2").

One module per thing rendered: ``plan`` (a round's steps and the topology tree),
``calls`` (the call table and the answer panel), ``trace`` (detailed traces),
``samples`` (bench samples: grade panel and listing), ``export`` (Mermaid and JSON),
``progress`` (the live view), ``bench_progress`` (a bench's progress lines),
``comparison`` and ``report`` (runs side by side), ``estimate`` (``bench --estimate``),
``router`` (a fitted router), ``junit`` and ``markdown`` (the CI summaries); ``format``
and ``fitted`` are the helpers they share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..shapes import topology_kind
    from .calls import answer_panel, step_table
    from .export import to_json, to_mermaid
    from .fitted import Fitted
    from .plan import topology
    from .progress import ProgressView
    from .samples import SampleListing, grade_panel
    from .trace import trace_renderable

__all__ = [
    "Fitted",
    "ProgressView",
    "SampleListing",
    "answer_panel",
    "grade_panel",
    "step_table",
    "to_json",
    "to_mermaid",
    "topology",
    "topology_kind",
    "trace_renderable",
]

# Each name's module, relative to this package.
_LAZY = {
    "Fitted": ".fitted",
    "ProgressView": ".progress",
    "SampleListing": ".samples",
    "answer_panel": ".calls",
    "grade_panel": ".samples",
    "step_table": ".calls",
    "to_json": ".export",
    "to_mermaid": ".export",
    "topology": ".plan",
    "topology_kind": "..shapes",
    "trace_renderable": ".trace",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
