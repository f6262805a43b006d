"""The page ``conductor view`` writes: one self-contained HTML file.

The template, script and style are package files (``view/assets``) inlined into the
page with the data as JSON, so the file opens from disk and makes no request; its
Content-Security-Policy forbids any.  The data comes in two blocks: the small one the
sample list needs, read at once, and each sample's details (graph, reply, steps), packed
(gzip, base64) and unpacked the first time a sample is opened, so a 10,000-sample page
is small and interactive quickly.
Texts that recur across samples (a system prompt in every step) are stored once, in a
table of strings the details point into.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import MissingDependencyError, install_hint
from ..private import write_private
from .data import ViewRun, ViewSample, compare_runs

__all__ = ["page_html", "write_view"]

_INSTALL = install_hint("view")


def _asset(name: str) -> str:
    return resources.files("conductor.view").joinpath("assets").joinpath(name).read_text("utf-8")


def _script_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` block: neither ``</script>`` nor
    ``<!--`` in a question can end the block early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # Only these two open an end tag or a comment there; ``<\/`` is JSON for ``</``.
    return text.replace("</", "<\\/").replace("<!--", "\\u003c!--")


def _packed_json(data: Any) -> str:
    """``data`` as gzip-compressed JSON in base64 (no ``<`` at all): a sample's details
    are mostly prose that compresses several times over, and the page unpacks them
    with the browser's own ``DecompressionStream`` the first time a sample is opened."""
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return base64.b64encode(gzip.compress(raw.encode("utf-8"), compresslevel=5, mtime=0)).decode()


class _Strings:
    """A table of texts, each stored once; a text is referred to by its place."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.items)
            self.items.append(text)
        return found


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


def _row(run: int, s: ViewSample, names: _Strings) -> list[Any]:
    # A list, not an object: 10,000 rows of repeated keys would double the list's size.
    return [
        run,
        s.key,
        s.sample_id,
        s.epoch,
        s.question,
        s.verdict,
        s.answer,
        s.gold,
        [names(w) for w in s.workers],
        s.steps,
        names(s.kind),
        s.subtasks,
        _finite(s.cost),
        1 if s.disagree else 0,
    ]


def _detail(s: ViewSample, texts: _Strings, names: _Strings) -> list[Any]:
    steps = [
        [
            st.round,
            st.index,
            names(st.worker),
            st.status,
            st.sees,
            [[role, texts(content)] for role, content in st.messages],
            texts(st.response),
            st.error,
        ]
        for st in s.step_views
    ]
    replies = [[pos, texts(reply)] for pos, reply in s.replies]
    return [s.svg, replies, s.parse_errors, steps, s.why, s.error, s.prompt]


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


def _accuracy_cost(runs: Sequence[ViewRun]) -> str:
    from .plots import accuracy_cost_svg

    points = _chart_points(runs)
    return _bare_svg(accuracy_cost_svg(points)) if points else ""


def page_data(runs: Sequence[ViewRun]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The page's two data blocks: what the list needs, and each sample's details."""
    names = _Strings()
    texts = _Strings()
    rows: list[list[Any]] = []
    details: list[list[Any]] = []
    for i, run in enumerate(runs):
        for s in run.samples:
            rows.append(_row(i, s, names))
            details.append(_detail(s, texts, names))
    comparisons = []
    for a in range(len(runs)):
        for b in range(a + 1, len(runs)):
            cmp = compare_runs(runs, a, b)
            if cmp is not None:
                comparisons.append(asdict(cmp))
    main = {
        "version": __version__,
        "runs": [_run_json(r) for r in runs],
        "names": names.items,
        "rows": rows,
        "compare": comparisons,
        "accuracy_cost_svg": _accuracy_cost(runs),
    }
    return main, {"texts": texts.items, "items": details}


def page_html(runs: Sequence[ViewRun]) -> str:
    """The whole page for ``runs``."""
    try:
        import jinja2
    except ImportError:
        raise MissingDependencyError(
            f"conductor view needs jinja2, which is not installed; install it with {_INSTALL}"
        ) from None
    from markupsafe import Markup

    env = jinja2.Environment(autoescape=True, keep_trailing_newline=True)
    template = env.from_string(_asset("page.html.j2"))
    main, details = page_data(runs)
    title = runs[0].label if len(runs) == 1 else f"{len(runs)} runs"
    return template.render(
        title=f"conductor view · {title}",
        version=__version__,
        css=Markup(_asset("page.css")),
        script=Markup(_asset("page.js")),
        data=Markup(_script_json(main)),
        details=Markup(_packed_json(details)),
    )


def write_view(runs: Sequence[ViewRun], out: Path) -> Path:
    """Write the page for ``runs`` to ``out`` (its directory must exist); return ``out``."""
    if not runs:
        raise ValueError("write_view needs at least one run")
    html = page_html(runs)
    out = Path(out)
    write_private(out, html)
    return out
