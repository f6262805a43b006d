"""A run's workflow as one SVG picture: steps as boxes, "may see" as arrows.

Each round is a band, the rounds one under the other.  Inside a band the steps stand
in columns by depth (the longest path from a step that sees nothing, so every arrow
points right) and, within a column, in the order the Conductor wrote them; the layout
depends on nothing but the record.  Who sees whom is read as the terminal views read
it (:mod:`conductor.shapes`): from the executed steps, else from the parsed workflow.

The SVG is self-contained (no ids, stylesheets, fonts or links; colours are
presentation attributes, which a page's CSS may override) and every text from the
record is escaped.  Hooks for a page: ``<g class="round" data-round="R">``,
``<g class="step [failed|skipped|planned]" data-step="R.I" data-worker="ID">`` and
``<path class="edge" data-from="R.J" data-to="R.I">``, with R the round's position
from 1 (as in ``conductor trace``) and I, J the step numbers of its access lists.
"""

from __future__ import annotations

import re
from html import escape

from ..record import RunRecord
from ..render.format import one_line
from ..shapes import PlanStep, plan_depths, round_plan, topology_kind
from ..text import plural, printable

__all__ = ["workflow_svg"]

NODE_W = 210
NODE_H = 50
GAP_X = 56
GAP_Y = 14
PAD = 12
ROUND_HEAD = 26
ROUND_GAP = 18
#: The spacing of the lanes below a round that carry arrows past a column.
LANE = 8
#: Characters of a subtask shown in its box, and in its tooltip.
SUBTASK_CHARS = 32
WORKER_CHARS = 22
TOOLTIP_CHARS = 400
FONT = "font-family='ui-sans-serif, system-ui, sans-serif'"

_COLOURS = {
    "ok": ("#eef4ff", "#4a6fa5"),
    "planned": ("#f6f6f6", "#888888"),
    "failed": ("#fdecea", "#c0392b"),
    "skipped": ("#f4f4f4", "#999999"),
}

# XML 1.0 cannot hold these at all, even escaped: a lone surrogate (from JSON "\ud800")
# and the two non-characters; printable() has already written the controls out.
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def _text(value: object) -> str:
    """``value`` as text safe inside an SVG element or a quoted attribute."""
    return escape(_NOT_XML.sub("\ufffd", printable(str(value))), quote=True)


def _node(pos: int, p: PlanStep, x: float, y: float) -> str:
    fill, stroke = _COLOURS.get(p.status, _COLOURS["ok"])
    classes = "step" if p.status == "ok" else f"step {p.status}"
    dash = " stroke-dasharray='5 3'" if p.status in ("skipped", "planned") else ""
    head = f"{p.index} · {one_line(p.worker_id, WORKER_CHARS)}"
    if p.status == "failed":
        head += f" ✗ {p.error_kind or 'failed'}"
    elif p.status == "skipped":
        head += " (skipped)"
    tooltip = f"step {p.index} · {p.worker_id}\n{p.subtask}"
    if len(tooltip) > TOOLTIP_CHARS:
        tooltip = tooltip[: TOOLTIP_CHARS - 1] + "…"
    return (
        f"<g class='{classes}' data-step='{pos}.{p.index}' data-worker='{_text(p.worker_id)}'>"
        f"<title>{_text(tooltip)}</title>"
        f"<rect x='{x:g}' y='{y:g}' width='{NODE_W}' height='{NODE_H}' rx='6' "
        f"fill='{fill}' stroke='{stroke}' stroke-width='1.5'{dash}/>"
        f"<text x='{x + 8:g}' y='{y + 19:g}' font-size='12' font-weight='bold' "
        f"fill='#222222'>{_text(one_line(head, WORKER_CHARS + 24))}</text>"
        f"<text x='{x + 8:g}' y='{y + 38:g}' font-size='11' fill='#555555'>"
        f"{_text(one_line(p.subtask, SUBTASK_CHARS))}</text>"
        "</g>"
    )


def _edge(pos: int, src: int, dst: int, d: str, end: tuple[float, float]) -> str:
    x2, y2 = end
    # The arrowhead is part of the path, so that each edge is one element and the
    # picture needs no <marker> (whose id would clash between pictures on one page).
    d += f" M{x2 - 7:g},{y2 - 4:g} L{x2:g},{y2:g} L{x2 - 7:g},{y2 + 4:g}"
    return (
        f"<path class='edge' data-from='{pos}.{src}' data-to='{pos}.{dst}' d='{d}' "
        "fill='none' stroke='#7a7a7a' stroke-width='1.3'/>"
    )


def _near(start: tuple[float, float], end: tuple[float, float]) -> str:
    """A curve from a box to one in the next column (only the gap lies between)."""
    (x1, y1), (x2, y2) = start, end
    bend = (x2 - x1) / 2
    return f"M{x1:g},{y1:g} C{x1 + bend:g},{y1:g} {x2 - bend:g},{y2:g} {x2:g},{y2:g}"


def _around(start: tuple[float, float], end: tuple[float, float], lane: float) -> str:
    """A path to a box columns away, routed round the boxes between: down the gap after
    the source's column, along ``lane`` (below every box of the round), up the gap
    before the target's column."""
    (x1, y1), (x2, y2) = start, end
    a, b, r = x1 + GAP_X / 2, x2 - GAP_X / 2, 6.0
    return (
        f"M{x1:g},{y1:g} L{a - r:g},{y1:g} Q{a:g},{y1:g} {a:g},{y1 + r:g} "
        f"L{a:g},{lane - r:g} Q{a:g},{lane:g} {a + r:g},{lane:g} "
        f"L{b - r:g},{lane:g} Q{b:g},{lane:g} {b:g},{lane - r:g} "
        f"L{b:g},{y2 + r:g} Q{b:g},{y2:g} {b + r:g},{y2:g} L{x2:g},{y2:g}"
    )


def _round(record: RunRecord, pos: int, top: float) -> tuple[list[str], float, float]:
    """The elements of round ``pos`` drawn from ``top``: (parts, width, height)."""
    rnd = record.rounds[pos - 1]
    plan = round_plan(rnd, record.pool)
    kind = topology_kind(rnd)
    title = f"Round {pos}: {kind}"
    if plan:
        title += f" ({plural(len(plan), 'step')})"
    elif kind == "no workflow":
        tries = plural(len(rnd.conductor_calls), "try", "tries")
        title += f" (the Conductor gave no usable plan in {tries})"
    parts = [
        f"<g class='round' data-round='{pos}'>",
        f"<text x='{PAD}' y='{top + 17:g}' font-size='13' font-weight='bold' fill='#333333'>"
        f"{_text(title)}</text>",
    ]
    depth = plan_depths(plan)
    columns: dict[int, list[PlanStep]] = {}
    for p in plan:  # the plan is in step order, so each column is too
        columns.setdefault(depth[p.index], []).append(p)
    at: dict[int, tuple[float, float]] = {}
    for d, steps in columns.items():
        for row, p in enumerate(steps):
            at[p.index] = (PAD + d * (NODE_W + GAP_X), top + ROUND_HEAD + row * (NODE_H + GAP_Y))
    rows = max((len(s) for s in columns.values()), default=0)
    bottom = top + ROUND_HEAD + rows * (NODE_H + GAP_Y) - GAP_Y
    lanes = 0
    for p in plan:  # edges first: the boxes are drawn over their ends
        x2, y2 = at[p.index]
        end = (x2, y2 + NODE_H / 2)
        for j in p.visible:
            if j not in at or depth[j] >= depth[p.index]:
                continue  # a step sees only earlier ones; a record saying else is not drawn
            x1, y1 = at[j]
            start = (x1 + NODE_W, y1 + NODE_H / 2)
            if depth[p.index] - depth[j] == 1:
                route = _near(start, end)
            else:
                lanes += 1
                route = _around(start, end, bottom + LANE * lanes)
            parts.append(_edge(pos, j, p.index, route, end))
    parts.extend(_node(pos, p, *at[p.index]) for p in plan)
    parts.append("</g>")
    width = PAD * 2 + max(len(columns) * (NODE_W + GAP_X) - GAP_X, 360)
    height = ROUND_HEAD + rows * (NODE_H + GAP_Y) + LANE * lanes
    return parts, width, height


def workflow_svg(record: RunRecord, *, width: int | None = None) -> str:
    """One ``<svg>`` element drawing every round of ``record``'s workflow.

    ``width`` sets the drawn width in pixels (the picture scales, keeping its shape);
    by default it is drawn at its natural size.
    """
    body: list[str] = []
    top = float(PAD)
    natural_w = float(360 + 2 * PAD)
    for pos in range(1, len(record.rounds) + 1):
        parts, w, h = _round(record, pos, top)
        body.extend(parts)
        natural_w = max(natural_w, w)
        top += h + ROUND_GAP
    if not record.rounds:
        why = "no rounds ran" + (f": {record.error}" if record.error else "")
        body.append(
            f"<text x='{PAD}' y='{top + 17:g}' font-size='13' fill='#c0392b'>"
            f"{_text(one_line(why, 120))}</text>"
        )
        top += ROUND_HEAD + ROUND_GAP
    natural_h = top - ROUND_GAP + PAD
    shown_w = width if width is not None else natural_w
    shown_h = natural_h * shown_w / natural_w
    label = f"workflow of run {record.run_id}"
    if record.sample_id is not None:
        label += f", sample {record.sample_id}"
    return (
        "<svg xmlns='http://www.w3.org/2000/svg' class='workflow' "
        f"viewBox='0 0 {natural_w:g} {natural_h:g}' width='{shown_w:g}' height='{shown_h:.0f}' "
        f"role='img' aria-label='{_text(label)}' {FONT}>" + "".join(body) + "</svg>"
    )
