"""Plain progress lines for a bench run whose output is not a terminal (a pipe, a CI
log, a file): :class:`ProgressLines` decides when a line is due and writes it.

A live bar redraws itself with cursor movements that a log cannot show; a log that
stays empty for the whole run (14 minutes, in issue 18) looks like a hung job, and
some CI systems kill a job that prints nothing for ten minutes.  So: a line when a
twentieth of the run is done or ``every_s`` seconds have brought new results,
whichever comes first, never two within ``min_gap_s`` seconds (a fast run stays
short), and one every ``heartbeat_s`` seconds even when no sample finishes (a slow
run shows it is alive).  Each line holds the counts, the accuracy so far with its
``n``, the failures, the cost so far and an estimate of the time left; in a batched
run also where its provider batches stand (:func:`format_board`), with a line as soon
as a batch is sent or ends (a batched run finishes its samples in bursts, hours apart).

Nothing here prints or reads a clock of its own: the caller passes ``now`` and
prints what it gets back, so the policy is tested without waiting.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from ..batches.waves import BatchBoard
from ..bench.runner import BenchProgress
from ..text import plural
from .format import format_usd

__all__ = ["ProgressLines", "format_board", "format_duration"]


_BOARD_WORDS = {"ended": "collecting", "expired": "collecting", "cancelled": "collecting"}


def format_board(board: BatchBoard) -> str:
    """Where a run's batches stand: ``wave 2 · 3 batches in flight (2 running, 1
    validating) · 40 calls held · 2 live``, its parts only when they say something."""
    parts = ["no wave sent yet" if board.wave < 0 else f"wave {board.wave}"]
    flying = board.in_flight
    if flying:
        # A batch that has ended is in flight until its answers are read and cached.
        states = Counter(
            "sent" if v.status is None else _BOARD_WORDS.get(v.status.state, v.status.state)
            for v in flying
        )
        detail = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        parts.append(f"{plural(len(flying), 'batch', 'batches')} in flight ({detail})")
    if board.held:
        parts.append(f"{plural(board.held, 'call')} held for the next wave")
    if board.live:
        parts.append(f"{plural(board.live, 'call')} made live")
    return " · ".join(parts)


def format_duration(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``, ``2 h 07 min``: whole units, the two largest."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ProgressLines:
    """When the next progress line of a bench run is due, and its text.

    ``label`` names the run (``math500 · conductor``).  Feed every
    :class:`~conductor.bench.runner.BenchProgress` to :meth:`update`, call
    :meth:`tick` every second or so from a timer, and :meth:`final` once at the end;
    each returns the line to print, or ``None`` when none is due.  Not thread-safe:
    a caller with a timer thread holds a lock around the calls.
    """

    def __init__(
        self,
        label: str,
        *,
        start: float,
        min_gap_s: float = 2.0,
        every_s: float = 10.0,
        heartbeat_s: float = 30.0,
        fraction: float = 0.05,
    ) -> None:
        self.label = label
        self.start = start
        self.min_gap_s = min_gap_s
        self.every_s = every_s
        self.heartbeat_s = heartbeat_s
        self.fraction = fraction
        self._latest = BenchProgress()
        self._printed_at: float | None = None
        self._printed_done = -1
        self._printed_board: str | None = None

    def _every_n(self) -> int:
        todo = self._latest.total - self._latest.skipped
        return max(1, math.ceil(todo * self.fraction))

    def update(self, progress: BenchProgress, now: float) -> str | None:
        """Take in the run's totals (as the runner reports them); the line, if one is due."""
        # A copy: the runner goes on changing its object while a timer reads this one.
        self._latest = dataclasses.replace(progress, verdicts=dict(progress.verdicts))
        if self._printed_at is None:
            return self._line(now)  # the first line says the run has started, and its size
        new = self._latest.done - self._printed_done
        since = now - self._printed_at
        board = self._board_text()
        if since >= self.min_gap_s and board is not None and board != self._printed_board:
            return self._line(now)  # a batch was sent or moved: hours may pass before more
        if since < self.min_gap_s or new <= 0:
            return None
        if new >= self._every_n() or since >= self.every_s:
            return self._line(now)
        return None

    def tick(self, now: float) -> str | None:
        """From a timer: the line, if results wait for their line or the run has been
        silent for ``heartbeat_s``."""
        if self._printed_at is None:
            return None
        since = now - self._printed_at
        waiting = self._latest.done > self._printed_done
        if (waiting and since >= self.every_s) or since >= self.heartbeat_s:
            return self._line(now)
        return None

    def final(self, now: float) -> str:
        """The last line, once the run has ended."""
        return self._line(now, final=True)

    def _board_text(self) -> str | None:
        board = self._latest.batches
        return format_board(board) if board is not None else None

    def _line(self, now: float, final: bool = False) -> str:
        p = self._latest
        self._printed_at = now
        self._printed_done = p.done
        self._printed_board = self._board_text()
        elapsed = max(0.0, now - self.start)
        finished = p.skipped + p.done
        total = max(p.total, finished)
        share = f" ({100 * finished / total:.0f}%)" if total else ""
        before = f", {p.skipped} from before" if p.skipped else ""
        parts = [f"{finished}/{total} done{share}{before}"]
        if p.accuracy is None:
            parts.append("accuracy -")
        else:
            parts.append(f"accuracy {p.accuracy:.1f}% (n={p.done})")
        parts.append(f"{plural(p.errors, 'failure')}")
        parts.append(f"cost {format_usd(p.cost_usd)}")
        if self._printed_board is not None:
            parts.append(self._printed_board)
        parts.append(format_duration(elapsed))
        if final:
            parts.append("finished")
        else:
            parts.append(f"ETA {self._eta(elapsed, total - finished)}")
        return f"{self.label}: " + " · ".join(parts)

    def _eta(self, elapsed: float, remaining: int) -> str:
        done = self._latest.done
        if remaining <= 0:
            return "0 s"
        if done == 0 or elapsed <= 0:
            return "?"
        return format_duration(elapsed / done * remaining)
