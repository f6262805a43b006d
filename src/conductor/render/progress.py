"""The live view of a running question, fed by executor events (:class:`ProgressView`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.console import RenderableType
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from ..events import Event
from .format import one_line, shown


@dataclass
class _StepRow:
    round: int
    step: int
    worker_id: str
    state: Literal["running", "done", "failed"] = "running"
    latency_s: float | None = None
    cached: bool = False
    detail: str | None = None


class ProgressView:
    """A live view of a running question, fed by :class:`~conductor.events.Event`.

    Pass it as the executor's event sink and render it with ``rich.live.Live(view)``.
    It assumes ``Event.round`` counts from 0 like ``RoundRecord.index``; round labels
    appear only once a second round shows up.
    """

    def __init__(self, title: str = "conductor") -> None:
        self.title = title
        self._conductor: dict[int, str] = {}
        self._conductor_running: dict[int, bool] = {}
        self._retries: dict[int, int] = {}
        self._steps: dict[tuple[int, int], _StepRow] = {}
        self._rounds: list[int] = []
        self._finished: str | None = None

    def _see_round(self, rnd: int) -> None:
        if rnd not in self._rounds:
            self._rounds.append(rnd)

    def __call__(self, event: Event) -> None:
        """Take in one event."""
        event = shown(event)
        r = event.round
        self._see_round(r)
        kind = event.kind
        if kind == "conductor_started":
            n = self._retries.get(r, 0)
            self._conductor[r] = "planning" if n == 0 else f"parse retry {n}"
            self._conductor_running[r] = True
        elif kind == "conductor_parse_failed":
            n = self._retries.get(r, 0) + 1
            self._retries[r] = n
            self._conductor[r] = f"parse retry {n}"
            self._conductor_running[r] = True
        elif kind == "conductor_finished":
            self._conductor_running[r] = False
            word = "failed" if event.failed else "done"
            detail = one_line(event.detail, 70)
            self._conductor[r] = word + (f" ({detail})" if detail else "")
        elif kind in ("step_started", "step_finished") and event.step is not None:
            key = (r, event.step)
            row = self._steps.get(key)
            if row is None:
                row = _StepRow(r, event.step, event.worker_id or "?")
                self._steps[key] = row
            if event.worker_id:
                row.worker_id = event.worker_id
            if kind == "step_finished":
                row.state = "failed" if event.failed else "done"
                row.latency_s = event.latency_s
                row.cached = event.cached
                # A failed step's detail is the whole error message: one short line here.
                row.detail = one_line(event.detail, 70) or None
        elif kind == "run_finished":
            self._finished = "failed" if event.failed else "done"
            if event.detail:
                self._finished += f" ({event.detail})"

    def _round_prefix(self, r: int) -> str:
        return f"round {r + 1} " if len(self._rounds) > 1 else ""

    def __rich__(self) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for r in self._rounds:
            if r in self._conductor:
                state = self._conductor[r]
                if self._conductor_running.get(r):
                    cell: RenderableType = Spinner("dots", text=Text(state + "…"))
                else:
                    style = "red" if state.startswith("failed") else "green"
                    cell = Text(state, style=style)
                grid.add_row(Text(f"{self._round_prefix(r)}Conductor", "magenta"), "", cell)
            for (rr, _), row in sorted(self._steps.items()):
                if rr != r:
                    continue
                name = Text(f"{self._round_prefix(r)}step {row.step}")
                if row.state == "running":
                    cell = Spinner("dots", text=Text("running…"))
                else:
                    parts: list[str] = [row.state]
                    if row.latency_s is not None:
                        parts.append(f"{row.latency_s:.2f} s")
                    if row.cached:
                        parts.append("cached")
                    if row.detail:
                        parts.append(row.detail)
                    cell = Text(" · ".join(parts), style="red" if row.state == "failed" else "")
                grid.add_row(name, Text(row.worker_id, style="cyan"), cell)
        if self._finished:
            style = "red" if self._finished.startswith("failed") else "green bold"
            grid.add_row(Text("run"), "", Text(self._finished, style=style))
        return Panel(grid, title=self.title, title_align="left")
