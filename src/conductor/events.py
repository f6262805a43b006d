"""Progress events emitted while a question runs.

The executor calls an :data:`EventSink` (any callable taking an :class:`Event`) as
work starts and finishes; the CLI turns these into a live progress view.  Nothing
below the CLI prints, so this is the only way progress leaves the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Event", "EventKind", "EventSink", "null_sink"]

EventKind = Literal[
    "conductor_started",
    "conductor_finished",
    "conductor_parse_failed",
    "step_started",
    "step_finished",
    "round_finished",
    "run_finished",
]


@dataclass(frozen=True)
class Event:
    """One thing that happened.  ``step`` and ``worker_id`` are set for step events."""

    kind: EventKind
    round: int
    step: int | None = None
    worker_id: str | None = None
    detail: str | None = None
    cached: bool = False
    failed: bool = False
    latency_s: float | None = None


EventSink = Callable[[Event], None]


def null_sink(event: Event) -> None:
    """An event sink that ignores everything."""
