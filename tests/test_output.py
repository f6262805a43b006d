"""What the CLI prints survives narrow terminals and pipes: ids and paths whole, plurals
right, local calls free, pool names with a did-you-mean.

Every CLI test runs the real command in a child process (``run_cli``) at 60 and 80
columns and piped with no COLUMNS at all (rich then lays out for 80 columns)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import boxed_number, make_math
from kit.poolkit import (
    CONDUCTOR_MODEL,
    embedded_model_or_skip,
    lists,
    pool_dict,
    run_cli,
    worker,
    write_pool,
)
from rich.console import Console, RenderableType
from rich.table import Table

from conductor.record import record_from_dict
from conductor.render import Fitted, step_table
from conductor.testing import FakeLLMServer
from conductor.text import plural

#: Ids longer than a narrow table's worker column.
LONG_IDS = ["anthropic-claude-sonnet-4-5-reasoner", "openai-gpt-4o-mini-2024-07-18-long"]
#: None: COLUMNS unset, output piped (not a terminal).
WIDTHS = [60, 80, None]


def width_id(columns: int | None) -> str:
    return "piped" if columns is None else f"{columns}cols"


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def long_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    workers = [worker(server, wid, max_retries=0) for wid in LONG_IDS]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


# --------------------------------------------------------------------------- units


def test_plural() -> None:
    assert plural(1, "step") == "1 step"
    assert plural(0, "step") == "0 steps"
    assert plural(2, "step") == "2 steps"
    assert plural(1, "try", "tries") == "1 try"
    assert plural(3, "try", "tries") == "3 tries"
    assert plural(1, "try", "tries", shown="0/1") == "0/1 try"
    assert plural(1024, "token", shown="1,024") == "1,024 tokens"


def render(obj: RenderableType, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(obj)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_fitted_takes_the_first_layout_that_keeps_ids_whole() -> None:
    wide = Table("id", "notes")
    wide.add_row(LONG_IDS[0], "some free text " * 4)
    narrow = Table("id")
    narrow.add_row(LONG_IDS[0])
    view = Fitted([wide, narrow], [LONG_IDS[0]])
    assert "free text" in render(view, 120)
    # At 40 columns the two-column table would fold the id: the narrow one is shown.
    out = render(view, 40)
    assert "free text" not in out and LONG_IDS[0] in out
    # Without the narrow layout the same width really cuts the id (the test can fail).
    assert LONG_IDS[0] not in render(wide, 40)


def test_fitted_with_whole_words_refuses_a_folded_figure() -> None:
    wide = Table("metric", "run a", "run b")
    wide.add_row("epoch spread", "40.00-60.00 (sd 14.14)", "35.00-65.00 (sd 21.21)")
    rows = Table("run", "spread")
    rows.add_row("a", "40.00-60.00")
    # At 30 columns the wide table folds the figure inside the word, with no ellipsis
    # and no id cut: only the word check sees it (the test can fail).
    assert "40.00-60.00" not in render(wide, 30)
    assert "40.00-6" in render(Fitted([wide, rows], ["run a"]), 30)
    out = render(Fitted([wide, rows], ["run a"], whole_words=True), 30)
    assert "40.00-60.00" in out and "run b" not in out
    # Wide enough, the first layout still wins.
    assert "run b" in render(Fitted([wide, rows], ["run a"], whole_words=True), 80)


# --------------------------------------------------------------------------- ask


@pytest.mark.process
@pytest.mark.parametrize("columns", WIDTHS, ids=width_id)
def test_ask_keeps_ids_and_the_record_path_whole(
    tmp_path: Path, fake_server: FakeLLMServer, columns: int | None
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [lists([0, 1], ["Compute 17 times 23", "Check the product"], [[], ["all"]])],
    )
    for wid in LONG_IDS:
        fake_server.script(wid, [f"{wid}: ANSWER 391"])
    out = tmp_path / "a-directory-with-a-rather-long-name-for-records" / "nested" / "run.json"
    out.parent.mkdir(parents=True)
    pool = long_pool(tmp_path, fake_server)
    res = run_cli(
        "ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), "--no-cache",
        columns=columns,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = lines_of(res.stdout)
    for wid in LONG_IDS:
        # In the topology, the calls view and the answer: never cut, folded or "…".
        assert sum(wid in line for line in lines) >= 2, res.stdout
    assert "…" not in res.stdout
    # The path is a line of its own, whole, whatever the width.
    assert str(out) in lines, res.stdout
    assert "conductor trace" in res.stdout
    width = columns or 80
    assert all(len(line) <= width for line in lines if str(out) not in line), res.stdout
    assert "Totals: 3 calls (0 cached)" in " ".join(res.stdout.split())


@pytest.mark.process
def test_one_step_and_one_call_are_singular(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["Answer it"], [[]])])
    fake_server.script(LONG_IDS[1], ["ANSWER: 4"])
    res = run_cli("ask", "2 + 2?", "--pool", str(long_pool(tmp_path, fake_server)), "--no-cache")
    assert res.returncode == 0, res.stderr
    assert "single call (1 step)" in res.stdout
    assert "1 steps" not in res.stdout
    assert "Totals: 2 calls (0 cached)" in res.stdout
    assert "(2 calls of unknown price)" in res.stdout


@pytest.mark.process
def test_failed_local_call_costs_zero(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """A local (llama.cpp) worker's failed call costs 0; the remote worker of unknown
    price stays "?"."""
    embedded_model_or_skip()
    # The prompt is longer than the local worker's 128-token context: a bad request,
    # answered before any generation.
    local = {"id": "tiny-local-worker", "model": "smollm2", "client": "local", "n_ctx": 128}
    local["max_retries"] = 0
    remote = worker(fake_server, LONG_IDS[0], max_retries=0)
    fake_server.script(
        CONDUCTOR_MODEL, [lists([0, 1], ["Explain the product " * 60, "Answer"], [[], []])]
    )
    fake_server.script(LONG_IDS[0], ["ANSWER: 391"])
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [local, remote]))
    out = tmp_path / "run.json"
    res = run_cli(
        "ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), "--no-cache",
        columns=200,
    )  # fmt: skip
    record = record_from_dict(json.loads(out.read_text()))
    failed, ok = record.rounds[0].steps
    assert failed.status == "failed" and failed.call.error is not None, res.stdout
    assert failed.call.cost_usd == 0.0
    assert ok.call.cost_usd is None
    rows = {r.split()[1]: r.split() for r in lines_of(res.stdout) if re.match(r"\s+\d\s", r)}
    # step, worker, sees, latency, tokens, cost, ...
    assert rows["tiny-local-worker"][5] == "$0", res.stdout
    assert rows[LONG_IDS[0]][5] == "?", res.stdout
    # The same renderer on the same record at 60 columns (stacked layout).
    narrow = " ".join(render(step_table(record), 60).split())
    assert "tiny-local-worker failed (BadRequestError), sees nothing" in narrow
    assert re.search(r"0/0 tokens, cost \$0(?![.\d])", narrow), narrow


def _two_round_record() -> Any:
    """A run of two rounds whose calls end every way a call can: parsed, a parse error,
    ok (once from the cache), failed, skipped, and a round that kept the answer."""
    from kit.records import call, make_record, make_round, step

    from conductor.record import RoundRecord

    first = make_round(
        0,
        [
            step(0, 0, "Plan", [], [], call("a plan", cached=True, cost=0.0)),
            step(1, 1, "Do it", ["all"], [0]),
        ],
    )
    second = make_round(
        1,
        [
            step(0, 2, "Fix it", ["all"], []),
            step(1, 3, "Judge", ["all"], [0],
                 call(None, error="boom", error_kind="ServerError"), status="failed"),
            step(2, 0, "Again", ["all"], [1], call(None, cost=None), status="skipped"),
        ],
        conductor=[call("no lists here", cost=0.0005), call("model_id = [...]", cost=0.0005)],
    )  # fmt: skip
    second.parse_errors = ["no model_id list"]
    third = RoundRecord(
        index=2,
        conductor_calls=[call("model_id = []\nsubtasks = []\naccess_list = []")],
        workflow={"model_id": [], "subtasks": [], "access_list": []},
        stop_reason="kept previous answer",
    )
    return make_record([first, second, third])


#: Each status the record's calls end with, and how many calls end so.
STATUSES = {"parsed": 3, "parse error": 1, "ok": 2, "ok (cached)": 1,
            "failed (ServerError)": 1, "skipped": 1, "kept previous answer": 1}  # fmt: skip


@pytest.mark.parametrize("width", [60, 72, 80, 100, 120])
def test_the_call_table_of_several_rounds_shows_whole_statuses(width: int) -> None:
    text = render(step_table(_two_round_record()), width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    flat = " ".join(text.split())
    for status, n in STATUSES.items():
        # Each status whole (a wrapped one is joined again by the flattening), as often
        # as calls end so: "parsed" three times, never "pars" or "p".
        found = len(re.findall(rf"(?<![\w(]){re.escape(status)}(?![\w)]| \(cached)", flat))
        assert found == n, (status, found, text)
    for label in ("Round 1", "Round 2", "Round 3"):
        assert label in text
    if width >= 80:
        # A table at 80 columns and wider, the rounds as lines, not as a column.
        assert "status" in text and " round " not in text, text


# --------------------------------------------------------------------------- pools


@pytest.mark.process
def test_unknown_pool_name_gets_a_did_you_mean(tmp_path: Path) -> None:
    res = run_cli("ask", "What is 2 + 2?", "--pool", "frontir")
    assert res.returncode == 2
    err = " ".join(res.stderr.split())
    assert 'no pool file or shipped pool named "frontir" (did you mean "frontier"?)' in err
    assert "shipped pools: frontier, local, open, paper" in err
    assert "Traceback" not in res.stderr
    res = run_cli("pools", "show", "opne")
    assert res.returncode == 2 and 'did you mean "open"?' in res.stderr
    # A path that does not exist is named as a missing file, the shipped names offered.
    res = run_cli("pools", "show", str(tmp_path / "frontir.yaml"))
    assert res.returncode == 2
    assert "no such file" in res.stderr and 'the shipped pool "frontier"' in res.stderr
    # Nothing close: no guess, the list only.
    res = run_cli("pools", "show", "zzzzzz")
    assert res.returncode == 2 and "did you mean" not in res.stderr
    assert "shipped pools: frontier" in res.stderr


@pytest.mark.process
@pytest.mark.parametrize("columns", WIDTHS, ids=width_id)
def test_pools_show_and_list_keep_names_whole(columns: int | None) -> None:
    res = run_cli("pools", "show", "frontier", columns=columns)
    assert res.returncode == 0, res.stderr
    for name in ("gpt-5", "claude-sonnet-4", "anthropic/claude-sonnet-4-20250514"):
        assert name in res.stdout
    assert "max 5 steps" in res.stdout
    res = run_cli("pools", "list", columns=columns)
    assert res.returncode == 0, res.stderr
    lines = lines_of(res.stdout)
    for name in ("frontier", "local", "open", "paper"):
        assert any(re.search(rf"\b{name}\b", line) for line in lines)
    # The folder of the shipped files is a line of its own.
    assert any(line.endswith("pools") and line.startswith("/") for line in lines), res.stdout


# --------------------------------------------------------------------------- bench, report


@pytest.mark.process
def test_bench_and_report_keep_ids_and_run_directories_whole(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["Solve it.", "Check it."], [[], [0]])])
    for wid in LONG_IDS:
        fake_server.script(wid, boxed_number)
    pool = str(long_pool(tmp_path, fake_server))
    data = str(make_math(tmp_path / "math.jsonl", 2))
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    run = tmp_path / "runs-with-a-long-directory-name" / "conductor"
    res = run_cli(
        "bench", "math500", "--pool", pool, "--data", data, "--out", str(run), env=env,
        columns=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = lines_of(res.stdout)
    assert "1 run directory (for conductor report and trace):" in lines
    assert str(run) in lines
    singles = tmp_path / "singles"
    res = run_cli(
        "bench", "math500", "--pool", pool, "--data", data, "--strategy", "singles",
        "--out", str(singles), env=env, columns=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    dirs = [str(singles / f"single-{wid}") for wid in LONG_IDS]
    assert "2 run directories (for conductor report and trace):" in lines_of(res.stdout)
    assert all(d in lines_of(res.stdout) for d in dirs)
    for columns in [*WIDTHS, 300]:
        res = run_cli("report", str(run), *dirs, env=env, columns=columns)
        assert res.returncode == 0, res.stderr
        for wid in LONG_IDS:
            # A single:ID run's label and the Conductor run's worker usage row.
            assert f"single:{wid}" in res.stdout, (columns, res.stdout)
            assert any(line.strip().startswith(wid) for line in lines_of(res.stdout))
        assert "…" not in res.stdout
        # One comparison of the three runs and the oracle-best, at every width.
        assert res.stdout.count("accuracy") == 1, res.stdout
        assert res.stdout.count("100.00") == 4, res.stdout
        if columns == 300:  # wide enough for runs as columns: every figure
            assert "2 × 1 (2 records)" in res.stdout
            assert "0/2 tries" in res.stdout
