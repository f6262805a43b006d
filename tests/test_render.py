"""Tests of the rich views in conductor.render, on hand-built run records."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from kit.records import call, judge_record, make_record, make_round, step
from rich.console import Console, RenderableType

from conductor.events import Event
from conductor.record import (
    RoundRecord,
    RunRecord,
    record_from_dict,
)
from conductor.render import (
    ProgressView,
    answer_panel,
    step_table,
    to_json,
    to_mermaid,
    topology,
    topology_kind,
    trace_renderable,
)
from conductor.render.format import format_usd


def render(obj: RenderableType) -> str:
    console = Console(width=100, file=io.StringIO(), force_terminal=False, color_system=None)
    console.print(obj)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return out


def flat(text: str) -> str:
    """Rendered text with box characters and runs of spaces squeezed, for phrase checks."""
    text = re.sub(r"[│┃┆┊║├└─┌┐┘┬┴┼╭╮╯╰━┏┓┗┛┣┫┳┻╋|]", " ", text)
    return " ".join(text.split())


def single_record() -> RunRecord:
    return make_record([make_round(0, [step(0, 1, "Answer the question", [], [])])])


def chain_record() -> RunRecord:
    steps = [
        step(0, 0, "Plan an approach", [], []),
        step(1, 1, "Carry out the plan", ["all"], [0]),
        step(2, 2, "Check the work", ["all"], [0, 1]),
    ]
    return make_record([make_round(0, steps)])


def recursive_record() -> RunRecord:
    first = make_round(0, [step(0, 0, "Plan", [], []), step(1, 1, "Do it", ["all"], [0])])
    second = RoundRecord(
        index=1,
        conductor_calls=[call("model_id = []\nsubtasks = []\naccess_list = []")],
        workflow={"model_id": [], "subtasks": [], "access_list": []},
        steps=[],
        final_answer=None,
        stop_reason="kept previous answer",
    )
    return make_record([first, second])


# --------------------------------------------------------------------------- topology


def test_topology_kinds() -> None:
    assert topology_kind(judge_record().rounds[0]) == "parallel attempts + judge"
    assert topology_kind(single_record().rounds[0]) == "single call"
    assert topology_kind(chain_record().rounds[0]) == "chain"
    rec = recursive_record()
    assert topology_kind(rec.rounds[0]) == "chain"
    assert topology_kind(rec.rounds[1]) == "kept previous answer"
    independent = make_round(0, [step(0, 0, "a", [], []), step(1, 1, "b", [], [])])
    assert topology_kind(independent) == "parallel (independent)"
    mixed = make_round(
        0,
        [
            step(0, 0, "a", [], []),
            step(1, 1, "b", [], []),
            step(2, 2, "c", [0], [0]),
            step(3, 3, "d", [1, 2], [1, 2]),
        ],
    )
    assert topology_kind(mixed) == "mixed DAG"
    # A judge that sees only some of the attempts is not "attempts + judge".
    partial_judge = make_round(
        0, [step(0, 0, "a", [], []), step(1, 1, "b", [], []), step(2, 2, "c", [0], [0])]
    )
    assert topology_kind(partial_judge) == "mixed DAG"
    no_plan = RoundRecord(index=0, conductor_calls=[call("junk")], parse_errors=["no lists"])
    assert topology_kind(no_plan) == "no workflow"


def test_topology_kind_from_workflow_when_steps_missing() -> None:
    rnd = RoundRecord(
        index=0,
        workflow={
            "model_id": [0, 1, 2],
            "subtasks": ["a", "b", "c"],
            "access_list": [[], [], ["all"]],
        },
    )
    assert topology_kind(rnd) == "parallel attempts + judge"


def test_a_damaged_recorded_workflow_is_shown_as_far_as_it_goes() -> None:
    from conductor.shapes import is_empty_workflow, round_plan

    rnd = RoundRecord(
        index=0,
        workflow={"model_id": [0, "x", 1], "subtasks": ["a"], "access_list": [[], ["all"]]},
    )
    plan = round_plan(rnd, {"workers": [{"id": "alpha"}, {"id": "beta"}]})
    assert [(p.worker_index, p.worker_id, p.subtask) for p in plan] == [
        (0, "alpha", "a"), (-1, "Model -1", ""), (1, "beta", ""),
    ]  # fmt: skip
    assert [p.visible for p in plan] == [(), (0,), ()]
    assert [p.access for p in plan] == [[], ["all"], []]
    assert not is_empty_workflow(rnd)
    assert is_empty_workflow(RoundRecord(index=1, workflow={"model_id": []}))
    assert not is_empty_workflow(RoundRecord(index=1))
    assert round_plan(RoundRecord(index=1)) == []


def test_topology_tree_shows_waves_and_sees() -> None:
    out = flat(render(topology(judge_record())))
    assert "Round 1: parallel attempts + judge (4 steps)" in out
    assert "steps 0, 1, 2 run in parallel -> step 3 sees all" in out
    assert "wave 1: steps 0, 1, 2 run in parallel" in out
    assert "step 3 judge-x (Model 3) sees: all earlier" in out
    assert "step 0 alpha (Model 0) sees: nothing" in out
    assert '"Judge the attempts and give the final answer"' in out


def test_topology_explicit_indices_and_chain() -> None:
    rnd = make_round(
        0,
        [
            step(0, 0, "a", [], []),
            step(1, 1, "b", [], []),
            step(2, 2, "c", [], []),
            step(3, 3, "d", [0, 2], [0, 2]),
        ],
    )
    out = flat(render(topology(make_record([rnd]))))
    assert "sees: 0, 2" in out
    assert "mixed DAG" in out
    out = flat(render(topology(chain_record())))
    assert "Round 1: chain (3 steps)" in out
    assert "step 0 -> step 1 sees all -> step 2 sees all" in out
    assert "wave" not in out


def test_topology_recursive_round_kept_previous_answer() -> None:
    out = flat(render(topology(recursive_record())))
    assert "Round 1: chain (2 steps)" in out
    assert "Round 2: kept previous answer" in out


def test_topology_subtask_excerpt_is_short_and_markup_safe() -> None:
    long = "[bold]Compute[/bold] " + "x" * 500
    out = render(topology(make_record([make_round(0, [step(0, 0, long, [], [])])])))
    assert "[bold]Compute[/bold]" in out  # not eaten as rich markup
    assert "x" * 100 not in out
    assert "…" in out


# --------------------------------------------------------------------------- step table


def test_step_table_rows_and_totals() -> None:
    rec = judge_record()
    out = render(step_table(rec))
    f = flat(out)
    assert "conductor" in f and "try 1" in f and "parsed" in f
    assert "cached" in f
    # 4 steps + 1 Conductor call; one cached.
    assert "Totals: 5 calls (1 cached)" in f
    assert "tokens 50 in / 25 out" in f
    assert "cost $0.0035" in f
    assert "wall 4.50 s" in f
    rows = [ln for ln in out.splitlines() if "judge-x" in ln]
    assert rows and "all earlier" in flat(rows[0])
    alpha = [ln for ln in out.splitlines() if "alpha" in ln]
    assert "cached" in alpha[0] and "nothing" in alpha[0]
    beta = [ln for ln in out.splitlines() if "beta" in ln]
    assert "cached" not in beta[0]


@pytest.mark.parametrize(
    ("cost", "shown"),
    [
        (0.000046, "$0.000046"),
        (0.0000461234, "$0.0000461"),
        (0.0123, "$0.0123"),
        (0.0035, "$0.0035"),
        (0.5, "$0.50"),
        (0.9996, "$1.00"),
        (12.3, "$12.30"),
        (1234.5, "$1,234.50"),
        (0.0, "$0"),
        (None, "?"),
        (float("nan"), "?"),
        (3e-12, "$3.0e-12"),
    ],
)
def test_costs_keep_their_significant_digits(cost: float | None, shown: str) -> None:
    assert format_usd(cost) == shown


def test_every_view_shows_a_small_cost_the_same_way() -> None:
    """A call of $0.000046 reads the same in the call table, the totals line and the
    trace (before, the report and bench's progress wrote "$0.0000")."""
    rec = make_record([make_round(0, [step(0, 0, "a", [], [], call("4", cost=0.000046))])])
    rec.totals.cost_usd = 0.000046
    rec.rounds[0].conductor_calls[0].cost_usd = 0.0
    table = flat(render(step_table(rec)))
    assert "Totals: 2 calls" in table and "cost $0.000046 ·" in table
    # The Conductor's free call is a true zero, the step's its own digits.
    assert re.search(r"conductor - 1\.00 10/5 \$0 parsed", table), table
    assert "alpha nothing 1.00 10/5 $0.000046 ok" in table
    assert "cost $0.000046" in flat(render(trace_renderable(rec, "tree")))


def test_step_table_unknown_cost_and_failed_step() -> None:
    steps = [
        step(0, 0, "a", [], [], call("fine", cost=None)),
        step(
            1,
            1,
            "b",
            ["all"],
            [0],
            call(None, error="HTTP 504 from server", error_kind="timeout", cost=0.0),
            status="failed",
        ),
    ]
    rec = make_record([make_round(0, steps)], status="partial")
    out = render(step_table(rec))
    alpha = [ln for ln in out.splitlines() if "alpha" in ln][0]
    assert " ? " in alpha
    f = flat(out)
    assert "beta all earlier 1.00 10/5 $0 failed (timeout)" in f
    assert "1 failed" in f
    assert "(1 call of unknown price)" in f
    rec.totals.cost_usd = None
    assert "cost ? (unknown price)" in flat(render(step_table(rec)))


def test_step_table_marks_conductor_parse_failures() -> None:
    steps = [step(0, 0, "a", [], [])]
    rnd = make_round(0, steps, conductor=[call("nonsense"), call("still bad"), call("good")])
    rnd.parse_errors = ["no model_id list", "unequal lengths"]
    out = render(step_table(make_record([rnd])))
    conductor_rows = [flat(ln) for ln in out.splitlines() if "conductor" in ln]
    assert len(conductor_rows) == 3
    assert "parse error" in conductor_rows[0] and "try 1" in conductor_rows[0]
    assert "parse error" in conductor_rows[1]
    assert "parsed" in conductor_rows[2]


# --------------------------------------------------------------------------- answer


def test_answer_panel_ok_failed_partial() -> None:
    out = render(answer_panel(judge_record()))
    assert "Answer" in out and "answer from step 3" in out
    failed = make_record([], status="failed", error="the Conductor never produced a workflow")
    out = render(answer_panel(failed))
    assert "Run failed" in out and "never produced a workflow" in out
    steps = [
        step(0, 0, "a", [], []),
        step(
            1,
            1,
            "b",
            [],
            [],
            call(None, error="rate limited", error_kind="rate_limit"),
            status="failed",
        ),
    ]
    partial = make_record([make_round(0, steps)], status="partial", final_answer="42")
    out = flat(render(answer_panel(partial)))
    assert "42" in out
    assert "Partial run" in out
    assert "round 1 step 1 (beta) failed, rate_limit: rate limited" in out


def test_an_answer_of_the_embedded_demo_model_says_so_and_no_other_does() -> None:
    demo = make_record([make_round(0, [step(0, 1, "Answer the question", [], [])])])
    demo.pool = {
        "name": "local",
        "workers": [
            {"id": "alpha", "client": "local", "model": "smollm2"},
            {"id": "beta", "client": "local", "model": "smollm2"},
        ],
    }
    out = flat(render(answer_panel(demo)))
    assert "embedded 135M demo model" in out and "--pool" in out
    # The note fits the panel's bottom border at 80 columns, whole.
    narrow = Console(width=80, file=io.StringIO(), force_terminal=False, color_system=None)
    narrow.print(answer_panel(demo))
    assert "(--pool for real ones)" in narrow.file.getvalue()  # type: ignore[attr-defined]
    # Another model, or the same name given a file of one's own, gets no note.
    demo.pool["workers"][1] = {"id": "beta", "client": "openai", "model": "smollm2"}
    assert "demo model" not in flat(render(answer_panel(demo)))
    demo.pool["workers"][1] = {
        "id": "beta",
        "client": "local",
        "model": "smollm2",
        "model_path": "/m.gguf",
    }
    assert "demo model" not in flat(render(answer_panel(demo)))
    assert "demo model" not in flat(render(answer_panel(judge_record())))


# --------------------------------------------------------------------------- traces


def test_trace_tree_truncates_long_response() -> None:
    long = "A" * 5000
    rec = make_record([make_round(0, [step(0, 0, "Write a lot", [], [], call(long))])])
    out = render(trace_renderable(rec, "tree"))
    assert "A" * 300 in out.replace("\n", "").replace(" ", "")
    assert "A" * 400 not in out.replace("\n", "")
    assert "[+4700 chars]" in flat(out)
    assert "messages sent (1)" in out
    assert "user: prompt" in out


def test_trace_tree_structure() -> None:
    rnd = make_round(0, [step(0, 0, "a", [], [])], conductor=[call("junk"), call("good")])
    rnd.parse_errors = ["could not find model_id"]
    out = flat(render(trace_renderable(make_record([rnd]), "tree")))
    assert "Round 1: single call" in out
    assert "Conductor (2 tries)" in out
    assert "Conductor (1 try)" in flat(render(trace_renderable(single_record(), "tree")))
    assert "try 1: parse error: could not find model_id" in out
    assert "try 2: parsed" in out
    assert "step 0 · alpha · sees: nothing" in out
    assert "Final answer: answer from step 0" in out


def test_trace_table_details() -> None:
    reasoning = "I think " + "z" * 3000 + " model_id = [0]"
    rnd = make_round(0, [step(0, 0, "Solve carefully", [], [])], conductor=[call(reasoning)])
    rec = make_record([rnd])
    out = render(trace_renderable(rec, "table"))
    f = flat(out)
    assert "Question" in f and "What is 2+2?" in f
    assert "chars omitted" in f
    assert "model_id = [0]" in f  # the tail (the lists) survives truncation
    assert "Solve carefully" in f
    assert "answer from step 0" in f
    assert "Totals: 2 calls" in f
    with pytest.raises(ValueError):
        trace_renderable(rec, "graph")  # type: ignore[arg-type]


def test_trace_table_recursive_and_failed_step() -> None:
    rec = recursive_record()
    rec.rounds[0].steps[1] = step(
        1, 1, "Do it", ["all"], [0], call(None, error="boom", error_kind="server"), "failed"
    )
    f = flat(render(trace_renderable(rec, "table")))
    assert "Round 2: kept previous answer" in f
    assert "kept the previous answer" in f
    assert "failed (server): boom" in f


# --------------------------------------------------------------------------- mermaid / json


def test_mermaid_edges_for_judge() -> None:
    m = to_mermaid(judge_record())
    lines = [ln.strip() for ln in m.splitlines()]
    assert lines[0] == "flowchart TD"
    for i in range(3):
        assert f"S1.{i} --> S1.3" in lines
        assert f"Q --> S1.{i}" in lines
    assert "Q --> S1.3" not in lines
    assert "S1.3 --> A" in lines
    assert any(ln.startswith('subgraph R1["Round 1: parallel attempts + judge"]') for ln in lines)
    assert lines.count("end") == 1
    assert any(ln.startswith('S1.3["S1.3: judge-x<br/>Judge the attempts') for ln in lines)


def test_mermaid_escapes_labels() -> None:
    nasty = 'Say "hi" [now]\nthen {go} <b> | `x` #1'
    m = to_mermaid(make_record([make_round(0, [step(0, 0, nasty, [], [])])]))
    node = [ln for ln in m.splitlines() if ln.strip().startswith("S1.0[")][0]
    label = node.split('["', 1)[1].rsplit('"]', 1)[0]
    assert '"' not in label
    for ch in "[]{}<>|`\n":
        assert ch not in label.replace("<br/>", "")
    assert "#quot;hi#quot;" in label
    assert "#91;now#93;" in label
    assert "#35;1" in label


def test_mermaid_recursive_rounds_linked() -> None:
    rec = recursive_record()
    rec.rounds[1] = make_round(1, [step(0, 2, "Fix it", ["all"], [])])
    m = [ln.strip() for ln in to_mermaid(rec).splitlines()]
    assert "S1.0 --> S1.1" in m
    assert "S1.1 -.->|previous answer| R2" in m
    assert "Q --> S2.0" in m
    assert "S2.0 --> A" in m
    assert m.count("end") == 2
    empty = [ln.strip() for ln in to_mermaid(recursive_record()).splitlines()]
    assert 'K2["kept previous answer"]' in empty
    assert "S1.1 -.-> K2" in empty
    assert "S1.1 --> A" in empty


def test_to_json_round_trips() -> None:
    rec = judge_record()
    text = to_json(rec)
    assert "\n  " in text
    back = record_from_dict(json.loads(text))
    assert back == rec


# --------------------------------------------------------------------------- progress


def test_progress_view_sequence() -> None:
    view = ProgressView()
    view(Event("conductor_started", 0))
    assert "planning" in render(view)
    view(Event("conductor_parse_failed", 0, detail="no lists"))
    view(Event("conductor_started", 0))
    assert "parse retry 1" in render(view)
    view(Event("conductor_finished", 0, detail="4 steps"))
    for i, w in enumerate(["alpha", "beta", "gamma"]):
        view(Event("step_started", 0, step=i, worker_id=w))
    view(Event("step_finished", 0, step=0, worker_id="alpha", latency_s=1.25))
    view(Event("step_finished", 0, step=1, worker_id="beta", latency_s=0.0, cached=True))
    long_error = "timeout: " + "the server did not answer in time " * 10
    view(Event("step_finished", 0, step=2, worker_id="gamma", failed=True, detail=long_error))
    view(Event("step_started", 0, step=3, worker_id="judge-x"))
    out = render(view)
    lines = {ln.split()[1] + ln.split()[2]: ln for ln in out.splitlines() if "step" in ln}
    assert "done (4 steps)" in out
    assert "parse retry" not in out
    assert "done · 1.25 s" in lines["step0"]
    assert "cached" in lines["step1"]
    assert "failed" in lines["step2"] and "timeout" in lines["step2"]
    assert out.count("answer in time") < 3 and "…" in out  # the long error is clipped
    assert "running" in lines["step3"] and "judge-x" in lines["step3"]
    assert "round 1" not in out  # only one round: no round labels
    view(Event("step_finished", 0, step=3, worker_id="judge-x", latency_s=2.0))
    view(Event("round_finished", 0))
    view(Event("conductor_started", 1))
    out = render(view)
    assert "round 1 step 0" in out and "round 2 Conductor" in out
    view(Event("conductor_finished", 1, detail="kept answer"))
    view(Event("run_finished", 1))
    out = render(view)
    assert "running" not in out and "planning" not in out
    assert re.search(r"run\s+done", out)


# --------------------------------------------------------------------------- import cost


@pytest.mark.process
def test_render_imports_nothing_heavy() -> None:
    code = (
        "import sys, conductor.render; "
        "heavy = [m for m in ('litellm','openai','anthropic','google.genai','transformers',"
        "'llama_cpp','httpx','aiohttp') if m in sys.modules]; print(heavy)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"
