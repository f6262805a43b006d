"""The workflow graph as SVG: one node per step, one edge per "may see", escaped text."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from conductor.record import CallRecord, RoundRecord, RunRecord, StepRecord
from conductor.view.graph import workflow_svg

SVG = "{http://www.w3.org/2000/svg}"
POOL = {"name": "duo", "workers": [{"id": "alpha"}, {"id": "beta"}]}


def step(
    i: int, worker: int, access: list[Any], status: str = "ok", subtask: str = ""
) -> StepRecord:
    visible = list(range(i)) if "all" in access else [j for j in access if isinstance(j, int)]
    return StepRecord(
        index=i,
        worker_index=worker,
        worker_id=POOL["workers"][worker]["id"],  # type: ignore[index]
        model="m",
        subtask=subtask or f"subtask {i}",
        access=access,
        visible_steps=visible,
        call=CallRecord(messages=[], error_kind="timeout" if status == "failed" else None),
        status=status,  # type: ignore[arg-type]
    )


def run(*rounds: RoundRecord, **kw: Any) -> RunRecord:
    return RunRecord(question="q", pool=POOL, conductor={}, settings={}, rounds=list(rounds), **kw)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def steps_of(root: ET.Element) -> dict[str, ET.Element]:
    return {
        g.get("data-step", ""): g
        for g in root.iter(f"{SVG}g")
        if "step" in g.get("class", "").split()
    }


def edges_of(root: ET.Element) -> set[tuple[str, str]]:
    return {
        (p.get("data-from", ""), p.get("data-to", ""))
        for p in root.iter(f"{SVG}path")
        if p.get("class") == "edge"
    }


def test_nodes_and_edges_follow_the_access_lists() -> None:
    # Round 1: 0 and 1 alone, 2 sees 0, 3 sees all (0, 1, 2); round 2: a chain 0 -> 1.
    r1 = RoundRecord(
        index=0,
        steps=[
            step(0, 0, []),
            step(1, 1, []),
            step(2, 0, [0], "failed"),
            step(3, 1, ["all"], "skipped"),
        ],
    )
    r2 = RoundRecord(index=1, steps=[step(0, 1, []), step(1, 0, ["all"])])
    record = run(r1, r2, sample_id="s/1")
    root = parse(workflow_svg(record))
    nodes = steps_of(root)
    assert sorted(nodes) == ["1.0", "1.1", "1.2", "1.3", "2.0", "2.1"]
    assert len(nodes) == sum(len(r.steps) for r in record.rounds)
    expected = {
        (f"{pos}.{j}", f"{pos}.{s.index}")
        for pos, rnd in enumerate(record.rounds, 1)
        for s in rnd.steps
        for j in s.visible_steps
    }
    assert edges_of(root) == expected
    assert expected == {
        ("1.0", "1.2"),
        ("1.0", "1.3"),
        ("1.1", "1.3"),
        ("1.2", "1.3"),
        ("2.0", "2.1"),
    }
    assert nodes["1.2"].get("class") == "step failed"
    assert nodes["1.3"].get("class") == "step skipped"
    assert nodes["1.0"].get("class") == "step"
    assert nodes["2.0"].get("data-worker") == "beta"
    assert [g.get("data-round") for g in root.iter(f"{SVG}g") if g.get("class") == "round"] == [
        "1",
        "2",
    ]


def x_y(node: ET.Element) -> tuple[float, float]:
    rect = node.find(f"{SVG}rect")
    assert rect is not None
    return float(rect.get("x", "nan")), float(rect.get("y", "nan"))


def test_layout_columns_by_depth_and_rounds_stacked() -> None:
    r1 = RoundRecord(
        index=0, steps=[step(0, 0, []), step(1, 1, []), step(2, 0, [1]), step(3, 1, [0, 2])]
    )
    r2 = RoundRecord(index=1, steps=[step(0, 0, [])])
    record = run(r1, r2)
    svg = workflow_svg(record)
    assert svg == workflow_svg(record)  # deterministic
    nodes = steps_of(parse(svg))
    xs = {k: x_y(v)[0] for k, v in nodes.items()}
    ys = {k: x_y(v)[1] for k, v in nodes.items()}
    # Depths: 0 -> 0, 1 -> 0, 2 -> 1 (sees 1), 3 -> 2 (sees 2, the longest path).
    assert xs["1.0"] == xs["1.1"] < xs["1.2"] < xs["1.3"]
    assert ys["1.0"] < ys["1.1"]
    assert ys["2.0"] > max(ys["1.0"], ys["1.1"], ys["1.2"], ys["1.3"])
    # 0 -> 3 skips a column: it runs below the round's boxes, not behind step 2's box.
    root = parse(svg)
    (long,) = [p for p in root.iter(f"{SVG}path") if p.get("data-from") == "1.0"]
    lowest = max(float(y) for y in re.findall(r",(-?[\d.]+)", long.get("d", "")))
    assert lowest > max(ys[k] for k in ("1.0", "1.1", "1.2", "1.3")) + 50  # a box is 50 high
    assert lowest < ys["2.0"]


def test_text_is_escaped() -> None:
    evil = "<script>alert('x')</script> & \x1b[31m \ud800"
    r = RoundRecord(index=0, steps=[step(0, 0, [], subtask=evil)])
    r.steps[0].worker_id = "w' onload='x"
    svg = workflow_svg(run(r, sample_id="<b>"))
    assert "<script>" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg
    root = parse(svg)  # escaped well enough to parse, control characters and all
    node = steps_of(root)["1.0"]
    title = node.find(f"{SVG}title")
    assert (
        title is not None and title.text is not None and "<script>alert('x')</script>" in title.text
    )
    assert not list(root.iter(f"{SVG}script"))
    assert node.get("data-worker") == "w' onload='x" and node.get("onload") is None


def test_a_planned_workflow_and_empty_rounds() -> None:
    # No steps ran (a dry plan): the parsed workflow is drawn, worker names from the pool.
    planned = RoundRecord(
        index=0, workflow={"model_id": [1, 0], "subtasks": ["a", "b"], "access_list": [[], ["all"]]}
    )
    kept = RoundRecord(index=1, workflow={"model_id": [], "subtasks": [], "access_list": []})
    nothing = RoundRecord(index=2, conductor_calls=[CallRecord(messages=[])], parse_errors=["bad"])
    root = parse(workflow_svg(run(planned, kept, nothing)))
    nodes = steps_of(root)
    assert sorted(nodes) == ["1.0", "1.1"]
    assert nodes["1.0"].get("data-worker") == "beta"
    assert nodes["1.1"].get("class") == "step planned"
    assert edges_of(root) == {("1.0", "1.1")}
    text = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "kept previous answer" in text
    assert "no usable plan in 1 try" in text
    assert len([g for g in root.iter(f"{SVG}g") if g.get("class") == "round"]) == 3


def test_no_rounds_and_a_fixed_width() -> None:
    root = parse(workflow_svg(run(status="failed", error="boom"), width=300))
    assert root.get("width") == "300"
    assert not steps_of(root)
    assert "no rounds ran: boom" in " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
