"""The page ``conductor view`` writes: one HTML file and its companion directory.

The template, script and style are package files (``view/assets``) inlined into the
page with the data the sample list needs as JSON (one short row per sample), so the
page opens from disk and draws its list at once.  Each sample's details (graph, replies,
steps, whole texts) and the text the search looks in are in the companion directory
beside it (:mod:`conductor.view.companion`, which owns that format), loaded from disk
when a sample is opened or a search typed: a page of 100,000 samples stays small and
interactive in a second or two.  Its Content-Security-Policy allows no request but
those scripts of its own directory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .. import __version__
from ..errors import MissingDependencyError, install_hint
from ..private import write_private
from ..redact import mask, mask_text
from .companion import CALLBACK, DetailSpool, Strings, companion_dir
from .data import ViewRun, ViewSample, compare_runs

__all__ = ["page_data", "page_html", "question_ceiling", "write_view"]

_INSTALL = install_hint("view")


def _asset(name: str) -> str:
    return resources.files("conductor.view").joinpath("assets").joinpath(name).read_text("utf-8")


def _script_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` block: neither ``</script>`` nor
    ``<!--`` in a question can end the block early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # Only these two open an end tag or a comment there; ``<\/`` is JSON for ``</``.
    return text.replace("</", "<\\/").replace("<!--", "\\u003c!--")


def _finite(value: float | None) -> float | None:
    return value if value is None or value == value and abs(value) != float("inf") else None


def _run_json(run: ViewRun) -> dict[str, Any]:
    overview = {k: v for k, v in asdict(run.overview).items()}
    for k, v in overview.items():
        if isinstance(v, float):
            overview[k] = _finite(v)
    overview["worker_usage"] = {
        w: {str(pos): n for pos, n in per.items()} for w, per in run.overview.worker_usage.items()
    }
    return {
        "label": run.label,
        "kind": run.kind,
        "path": run.path,
        "benchmark": run.benchmark,
        "strategy": run.strategy,
        "pool": run.pool,
        "conductor": run.conductor,
        "single": run.is_single,
        "o": overview,
    }


def _row(run: int, s: ViewSample, names: Strings) -> list[Any]:
    # A list, not an object, and repeated words as numbers into ``names``: 100,000 rows
    # of repeated keys would be most of the page.
    return [
        run,
        s.key,
        s.sample_id,
        s.epoch,
        s.question,
        names(s.verdict),
        s.answer,
        [names(w) for w in s.workers],
        s.steps,
        names(s.kind),
        _finite(s.cost),
        1 if s.disagree else 0,
    ]


# The mean shown is the summary's; its interval is a bootstrap's, whose ends can differ
# from it in the last bits when every value is the same: an end never crosses the mean.
def _below(end: float | None, value: float) -> float:
    return value if end is None else min(end, value)


def _above(end: float | None, value: float) -> float:
    return value if end is None else max(end, value)


def _chart_points(runs: Sequence[ViewRun]) -> list[Any]:
    from .plots import RunPoint

    points = []
    for i, run in enumerate(runs):
        o = run.overview
        if o.accuracy is None or o.cost is None:
            continue
        points.append(
            RunPoint(
                # The run's number, as the overview and the filters give it: labels
                # cut short, or alike, still say which run they are.
                label=f"{i}: {run.label}",
                accuracy=o.accuracy,
                acc_lo=_below(o.acc_lo, o.accuracy),
                acc_hi=_above(o.acc_hi, o.accuracy),
                cost=o.cost,
                cost_lo=_below(o.cost_lo, o.cost),
                cost_hi=_above(o.cost_hi, o.cost),
                is_single=run.is_single,
            )
        )
    return points


def _bare_svg(svg: str) -> str:
    """An SVG document as an element to inline (no XML prolog or DOCTYPE, whose
    DTD address would be the page's only URL)."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def question_ceiling(runs: Sequence[ViewRun]) -> float | None:
    """The per-question oracle (:mod:`conductor.runs.oracle`, as ``report`` and
    ``fit-router`` count it) of the single-worker runs of one benchmark: on each sample
    graded in every one of them, the best single's mean score over the sample's epochs
    (the most a router among them can score); ``None`` without two such runs, with runs
    of several benchmarks, or without a sample in common."""
    from ..runs.oracle import oracle_of_runs

    singles = [r for r in runs if r.is_single and r.kind == "bench"]
    if len(singles) < 2 or len({r.benchmark for r in runs if r.kind == "bench"}) > 1:
        return None
    scores: dict[str, dict[str, dict[int, float]]] = {}
    for i, run in enumerate(singles):
        mine = scores[str(i)] = {}
        for s in run.samples:
            if s.verdict != "ungraded":
                mine.setdefault(s.sample_id, {})[s.epoch] = s.score
    oracle = oracle_of_runs(scores)
    return oracle.accuracy if oracle is not None else None


def _accuracy_cost(runs: Sequence[ViewRun]) -> str:
    from .plots import accuracy_cost_svg

    points = _chart_points(runs)
    if not points:
        return ""
    return _bare_svg(accuracy_cost_svg(points, ceiling=question_ceiling(runs)))


def _spool_of(runs: Sequence[ViewRun]) -> DetailSpool:
    """The one spool holding the details of every sample of ``runs``, in page order."""
    spool = runs[0].details
    if any(r.details is not spool for r in runs) or spool.count != sum(
        len(r.samples) for r in runs
    ):
        raise ValueError("the runs of one page must be loaded together (load_runs)")
    return spool


def page_data(runs: Sequence[ViewRun], companion: str = "") -> dict[str, Any]:
    """The page's data block: the runs, a row per sample, the comparisons, the chart and
    where the details are (``companion``: the directory's name, beside the page)."""
    names = Strings()
    rows = [_row(i, s, names) for i, run in enumerate(runs) for s in run.samples]
    comparisons = []
    for a in range(len(runs)):
        for b in range(a + 1, len(runs)):
            cmp = compare_runs(runs, a, b)
            if cmp is not None:
                comparisons.append(asdict(cmp))
    spool = _spool_of(runs) if runs else None
    return {
        "version": __version__,
        "runs": [_run_json(r) for r in runs],
        "names": names.items,
        "rows": rows,
        "compare": comparisons,
        "accuracy_cost_svg": _accuracy_cost(runs),
        "details": {
            "dir": quote(companion),
            "token": spool.token if spool is not None else "",
            "chunk": spool.chunk if spool is not None else 1,
            "callback": CALLBACK,
        },
    }


def page_html(runs: Sequence[ViewRun], companion: str = "") -> str:
    """The whole page for ``runs``, its details in the directory ``companion`` beside it."""
    try:
        import jinja2
    except ImportError:
        raise MissingDependencyError(
            f"conductor view needs jinja2, which is not installed; install it with {_INSTALL}"
        ) from None
    from markupsafe import Markup

    env = jinja2.Environment(autoescape=True, keep_trailing_newline=True)
    template = env.from_string(_asset("page.html.j2"))
    main = page_data(runs, companion)
    title = runs[0].label if len(runs) == 1 else f"{len(runs)} runs"
    return template.render(
        title=f"conductor view · {title}",
        version=__version__,
        css=Markup(_asset("page.css")),
        script=Markup(_asset("page.js")),
        data=Markup(_script_json(mask(main))),
    )


def write_view(runs: Sequence[ViewRun], out: Path) -> Path:
    """Write the page for ``runs`` to ``out`` (its directory must exist) and its details
    to the companion directory beside it; return ``out``."""
    if not runs:
        raise ValueError("write_view needs at least one run")
    out = Path(out)
    spool = _spool_of(runs)
    html = page_html(runs, companion_dir(out).name)
    spool.publish(out)
    # The data was masked as JSON; the page's other text (its title) is masked here.
    write_private(out, mask_text(html))
    return out
