"""The view of a fitted router (``conductor fit-router``): how each way of choosing a
strategy did on the held-out questions, the router against the best single arm, and
the accuracy-cost frontier.  The figures are :mod:`conductor.router.fit`'s; this module
lays out what it is given.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..router import Comparison, RouterFit
from ..text import plural, printable
from .format import format_usd

__all__ = ["fit_view"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _routed(counts: dict[str, int] | None) -> str:
    if not counts:
        return ""
    return ", ".join(f"{printable(a)} {n}" for a, n in counts.items() if n)


def _comparison(c: Comparison, name: str) -> Text:
    sign = "+" if c.difference >= 0 else ""
    return Text(
        f"{name} - {printable(c.against)}: {sign}{100 * c.difference:.1f} points "
        f"(95% CI {100 * c.low:+.1f} to {100 * c.high:+.1f}; paired sign-flip test "
        f"p = {c.p_value:.4f}; {c.router_only} questions only {name} got right, "
        f"{c.other_only} only {printable(c.against)})"
    )


def fit_view(fit: RouterFit) -> RenderableType:
    """The held-out table, the paired comparisons, the frontier and the fit's figures."""
    data = fit.data
    n = len(fit.heldout_rows)
    title = f"Router on {plural(n, 'held-out question')}"
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("policy", no_wrap=True)
    table.add_column("accuracy", justify="right", no_wrap=True)
    table.add_column("95% CI", justify="right", no_wrap=True)
    table.add_column("USD / question", justify="right", no_wrap=True)
    table.add_column("routed to")
    for p in fit.policies:
        name = p.name
        if name == fit.best_single:
            name += " (best single)"
        style = "bold" if p.name in ("router", "cascade") else ""
        table.add_row(
            Text(printable(name), style=style),
            _pct(p.accuracy),
            f"{_pct(p.low)}-{_pct(p.high)}",
            format_usd(p.cost_usd),
            _routed(p.routed),
        )
    parts: list[RenderableType] = [table]
    lead = "cascade" if fit.settings.fallback is not None else "router"
    if fit.versus_best is not None:
        parts.append(_comparison(fit.versus_best, lead))
    if fit.versus_fallback is not None:
        parts.append(_comparison(fit.versus_fallback, "cascade"))
    if fit.frontier:
        frontier = Table(
            title="Accuracy against cost, by cost weight (held out)",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
        )
        frontier.add_column("cost weight (accuracy / USD)", justify="right")
        frontier.add_column("accuracy", justify="right")
        frontier.add_column("USD / question", justify="right")
        for point in fit.frontier:
            frontier.add_row(
                f"{point.cost_weight:,.4g}", _pct(point.accuracy), format_usd(point.cost_usd)
            )
        parts.append(frontier)
    router = fit.router
    benchmarks = printable(", ".join(sorted(set(data.benchmarks))))
    facts = [
        f"fitted on {plural(len(fit.train_rows), 'question')} of {benchmarks} "
        f"in {fit.fit_seconds:.2f} s (L2 penalty {router.head.penalty:g}, "
        f"{router.featurizer.name}, {router.featurizer.dim:,} features); "
        f"routing takes {1000 * fit.route_seconds:.2f} ms a question",
    ]
    facts.append(
        f"decision: the best arm over the training questions unless another is more than "
        f"{router.margin:g} ahead in its chance of a right answer (the margin that did best "
        "on questions the head had not seen)"
    )
    if router.threshold is not None:
        facts.append(
            f"cascade: to {printable(str(router.fallback))} when no other arm's chance "
            f"reaches {router.threshold:.3f}"
        )
    if data.dropped:
        facts.append(f"{plural(data.dropped, 'question')} left out: not answered by every arm")
    if data.unpriced:
        facts.append(
            f"no price known for some calls of {printable(', '.join(data.unpriced))}: "
            "counted as free"
        )
    parts.extend(Text(f) for f in facts)
    return Group(*parts)
