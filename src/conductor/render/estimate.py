"""The view of a bench run's spend estimate (``conductor bench --estimate``, and the
figure for the rest of a run that ``--pilot N`` ends with).

Per run: the pairs left to pay for, a table of the calls, tokens and dollars each role
is expected to take (at live and at batch prices), then where the figures come from, in
words, so that a user can judge them: how many records they were measured on, or what
was assumed instead.  The figures are :mod:`conductor.bench.estimate`'s; this module
lays out what it is given.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..bench.estimate import RoleEstimate, RunEstimate
from ..text import plural, printable
from .fitted import Fitted
from .format import format_tokens, format_usd

__all__ = ["estimate_table", "estimate_view"]


def _calls(n: float) -> str:
    """A call count: whole when it is, else with one decimal (an expectation)."""
    return f"{n:,.0f}" if abs(n - round(n)) < 0.05 else f"{n:,.1f}"


def _figures(of: RoleEstimate | RunEstimate) -> list[str]:
    """A row's figures: calls, tokens in and out, USD live and batched."""
    return [
        _calls(of.calls),
        format_tokens(round(of.input_tokens)),
        format_tokens(round(of.output_tokens)),
        format_usd(of.usd),
        format_usd(of.batch_usd),
    ]


def _row(role: RoleEstimate) -> list[str]:
    return [printable(role.role), printable(role.model), *_figures(role)]


def estimate_table(estimate: RunEstimate) -> Table:
    """Each role's expected calls, tokens and dollars over the pairs left, and the
    total."""
    title = f"Estimate: {printable(estimate.benchmark)} · {printable(estimate.strategy)}"
    table = Table(
        title=title, box=box.SIMPLE_HEAD, min_width=len(title), show_edge=False, pad_edge=False
    )
    table.add_column("role", no_wrap=True)
    table.add_column("model")
    for name in ("calls", "tokens in", "tokens out", "USD live", "USD batch"):
        table.add_column(name, justify="right", no_wrap=True)
    for role in estimate.roles:
        table.add_row(*_row(role))
    table.add_row(Text("total", style="bold"), "", *_figures(estimate))
    return table


def _stacked(estimate: RunEstimate) -> RenderableType:
    """The table for a narrow terminal: each role on a line of its own, its figures on
    the next (wrapping between figures, never inside one)."""
    title = f"Estimate: {printable(estimate.benchmark)} · {printable(estimate.strategy)}"
    names = ("calls", "tokens in", "tokens out", "USD live", "USD batch")
    parts: list[RenderableType] = [Text(title, style="bold")]
    total = ["total", "", *_figures(estimate)]
    for cells in [*(_row(r) for r in estimate.roles), total]:
        line = Text(cells[0], style="bold")
        if cells[1] and cells[1] != cells[0]:
            line.append(f" ({cells[1]})")
        figures = zip(names, cells[2:], strict=True)
        line.append("\n  " + ", ".join(f"{n} {c}" for n, c in figures))
        parts.append(line)
    return Group(*parts)


def _pairs_line(estimate: RunEstimate) -> str:
    """How many pairs are left to pay for, and why the others cost nothing."""
    free = []
    if estimate.recorded:
        free.append(f"{estimate.recorded} recorded already")
    if estimate.replayed:
        free.append(f"{estimate.replayed} replayed from the sample cache at $0")
    apart = f" ({'; '.join(free)})" if free else ""
    return f"{plural(estimate.pairs, '(sample, epoch) pair')} to run of {estimate.total}{apart}"


def _spend_lines(estimate: RunEstimate) -> list[str]:
    """What the run as asked pays, against its cap, and what is unknown."""
    lines = []
    if estimate.unpriced:
        names = ", ".join(repr(printable(r)) for r in estimate.unpriced)
        lines.append(
            f"USD unknown: no price is known for {names}; give it a price: "
            "{input_per_mtok, output_per_mtok} in the pool file"
        )
        return lines
    pays = estimate.run_usd
    batched = any(r.batched and r.calls > 0 for r in estimate.roles)
    how = "its batched calls at the batch price" if batched else "every call live"
    lines.append(f"this run pays about {format_usd(pays)} ({how})")
    cap = estimate.max_usd
    if cap is not None and pays is not None:
        room = cap - estimate.spent_usd
        spent = f" ({format_usd(estimate.spent_usd)} spent already)" if estimate.spent_usd else ""
        if room <= 0:
            lines.append(
                f"--max-usd {format_usd(cap)} is reached{spent}: the run starts nothing "
                "unless it is given a higher cap"
            )
        elif pays > room:
            lines.append(
                f"--max-usd {format_usd(cap)}{spent} stops it first, after about "
                f"{room / pays:.0%} of the pairs left"
            )
        else:
            lines.append(f"within its --max-usd {format_usd(cap)}{spent}")
    return lines


def _basis_lines(estimate: RunEstimate) -> list[str]:
    """Where the figures come from: measured or assumed, role by role."""
    lines = [f"figures {printable(estimate.source)}"]
    if estimate.calibrated:
        lines.append(
            f"text: {estimate.chars_per_token:.2f} characters a token, calibrated on the "
            "measured calls"
        )
    lines += [f"assumed {printable(a)}" for a in estimate.assumptions]
    lines += [f"{printable(r.role)}: {printable(r.basis)}" for r in estimate.roles]
    return lines


def estimate_view(estimate: RunEstimate) -> RenderableType:
    """The estimate of one run: the pairs left, the table, what the run pays, and where
    the figures come from."""
    head = Text(_pairs_line(estimate), style="bold")
    if estimate.pairs == 0:
        run_dir = printable(str(estimate.run_dir))
        why = (
            f"nothing to estimate: every pair of the run in {run_dir} is recorded"
            if estimate.replayed == 0
            else "nothing to pay for: the sample cache replays every pair left"
        )
        return Group(head, Text(why))
    keep = [printable(r.role) for r in estimate.roles] + [
        printable(r.model) for r in estimate.roles
    ]
    table = Fitted([estimate_table(estimate), _stacked(estimate)], keep, whole_words=True)
    parts: list[RenderableType] = [head, table]
    parts += [Text(line) for line in _spend_lines(estimate)]
    parts += [Text(line, style="dim") for line in _basis_lines(estimate)]
    return Group(*parts)
