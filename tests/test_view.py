"""``conductor view`` without a browser: what it reads from each kind of run, the
numbers and comparisons it embeds, the page's data blocks, and the command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, run_cli
from kit.records import (
    VIEW_WORKERS,
    chain,
    fan,
    planned_record,
    write_ask,
    write_bench,
    write_serve,
)
from kit.servekit import ServeProcess, make_pool_file

from conductor.errors import UsageError
from conductor.record import RunRecord
from conductor.runs.stats import mcnemar_exact, wilson_interval
from conductor.testing import FakeLLMServer
from conductor.view.companion import DetailSpool, companion_dir, read_chunk
from conductor.view.data import compare_runs, load_run, load_runs
from conductor.view.page import page_data, write_view

pytest.importorskip("jinja2")

VERDICTS_A = ["correct", "incorrect", "correct", "correct", "no_answer", "correct", "incorrect"]
VERDICTS_B = ["correct", "correct", "incorrect", "correct", "incorrect", "incorrect", "incorrect"]


def conductor_records(verdicts: list[str]) -> list[RunRecord]:
    plans = [chain("gpt-small", "claude-mid"), fan("gpt-small", "claude-mid", "gemini-big")]
    return [
        planned_record(
            f"q{i}", f"Question {i}: what is {i} + 1?", plans[i % 2], verdict=v, cost=0.002
        )
        for i, v in enumerate(verdicts)
    ]


def single_records(worker: str, verdicts: list[str]) -> list[RunRecord]:
    return [
        planned_record(
            f"q{i}", f"Question {i}: what is {i} + 1?", chain(worker), verdict=v, cost=0.0005
        )
        for i, v in enumerate(verdicts)
    ]


@pytest.fixture
def runs_on_disk(tmp_path: Path) -> tuple[Path, Path]:
    bench = write_bench(tmp_path / "conductor-run", conductor_records(VERDICTS_A))
    singles = tmp_path / "singles-run"
    write_bench(
        singles / "single-gemini-big",
        single_records("gemini-big", VERDICTS_B),
        strategy="single:gemini-big",
    )
    write_bench(
        singles / "single-gpt-small",
        single_records("gpt-small", ["incorrect"] * len(VERDICTS_B)),
        strategy="single:gpt-small",
    )
    return bench, singles


def test_a_bench_directory_and_a_singles_run_load_as_runs(runs_on_disk: tuple[Path, Path]) -> None:
    bench, singles = runs_on_disk
    runs = load_runs([bench, singles])
    assert [r.strategy for r in runs] == ["conductor", "single:gemini-big", "single:gpt-small"]
    assert [r.is_single for r in runs] == [False, True, True]
    a = runs[0]
    assert a.kind == "bench" and a.benchmark == "math500" and a.conductor == "conductor-7b"
    assert len(a.samples) == a.overview.samples == len(VERDICTS_A)
    right = VERDICTS_A.count("correct")
    assert a.overview.accuracy == pytest.approx(right / len(VERDICTS_A))
    assert (a.overview.acc_lo, a.overview.acc_hi) == pytest.approx(
        wilson_interval(right, len(VERDICTS_A))
    )
    assert a.overview.cost == pytest.approx(0.002)
    # One row per record: steps, workers, topology and subtasks as the records hold them.
    first, second = a.samples[0], a.samples[1]
    assert (first.steps, first.kind, first.workers) == (2, "chain", ["gpt-small", "claude-mid"])
    assert second.steps == 3 and second.kind == "parallel attempts + judge"
    # Its details are spooled apart, for the page's companion.
    detail = a.details.detail(1)
    assert detail["subtasks"][-1] == "judge the attempts"
    assert detail["svg"].startswith("<svg") and detail["svg"].count("class='step") == 3
    # Step views keep the messages and the response for the page's collapsed blocks.
    _rnd, _index, _worker, _status, sees, messages, response, _error = detail["steps"][2]
    assert sees == [0, 1] and messages[0] == ["system", "You are a careful worker."]
    assert response == "gemini-big says 42"
    # The usage by position and the shapes come from the bench summary.
    assert a.overview.worker_usage["gemini-big"] == {2: 3}
    assert a.overview.topology_counts == {"parallel attempts + judge": 3, "chain": 4}


def test_runs_disagree_and_the_comparison_counts(runs_on_disk: tuple[Path, Path]) -> None:
    runs = load_runs(list(runs_on_disk))
    right_a = [v == "correct" for v in VERDICTS_A]
    right_b = [v == "correct" for v in VERDICTS_B]
    # The gpt-small single is wrong everywhere: a sample disagrees when anyone was right.
    expected = [x or y for x, y in zip(right_a, right_b, strict=True)]
    assert [s.disagree for s in runs[0].samples] == expected
    cmp = compare_runs(runs, 0, 1)
    assert cmp is not None and cmp.n == len(VERDICTS_A)
    both = sum(x and y for x, y in zip(right_a, right_b, strict=True))
    only_a = sum(x and not y for x, y in zip(right_a, right_b, strict=True))
    only_b = sum(y and not x for x, y in zip(right_a, right_b, strict=True))
    assert (cmp.both_right, cmp.only_a, cmp.only_b) == (both, only_a, only_b)
    assert cmp.both_wrong == len(VERDICTS_A) - both - only_a - only_b
    assert cmp.p_value == pytest.approx(mcnemar_exact(only_a, only_b))
    assert cmp.diff == pytest.approx((sum(right_a) - sum(right_b)) / len(VERDICTS_A))
    assert cmp.diff_lo <= cmp.diff <= cmp.diff_hi


def test_serve_records_and_an_ask_record_load(tmp_path: Path) -> None:
    served = [
        planned_record(None, f"served question {i}", chain("gpt-small"), verdict=None, wall_s=i + 1)
        for i in range(4)
    ]
    serve_dir = write_serve(tmp_path / "records", served)
    ask = write_ask(
        tmp_path / "run.json", planned_record(None, "asked once", fan(*VIEW_WORKERS), verdict=None)
    )
    s, a = load_runs([serve_dir, ask])
    assert s.kind == "serve" and len(s.samples) == 4 and s.overview.accuracy is None
    assert {x.verdict for x in s.samples} == {"ungraded"}
    assert s.overview.latency_p50 == pytest.approx(2.5)
    assert s.overview.worker_usage == {"gpt-small": {0: 4}}
    assert a.kind == "ask" and [x.question for x in a.samples] == ["asked once"]
    assert a.samples[0].steps == 3
    assert compare_runs([s, a], 0, 1) is None


def test_a_path_that_is_no_run_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not a run"):
        load_runs([tmp_path / "empty"])


def _blocks(html: str) -> dict[str, Any]:
    found = re.findall(r'<script type="application/json" id="([\w-]+)">(.*?)</script>', html, re.S)
    return {name: json.loads(text) for name, text in found}


def _chunks(page: Path, kind: str) -> list[tuple[str, str, int, Any]]:
    """The companion files of ``kind`` beside ``page``, in order, read back."""
    return [read_chunk(p) for p in sorted(companion_dir(page).glob(f"{kind}-*.js"))]


def test_the_page_holds_its_data_safely_and_requests_nothing(tmp_path: Path) -> None:
    hostile = 'Is 1 < 2? </script><script>document.title="pwned"</script><!-- x'
    records = [planned_record("x1", hostile, chain("gpt-small")), *conductor_records(VERDICTS_A)]
    runs = load_runs([write_bench(tmp_path / "run", records)])
    page = write_view(runs, tmp_path / "view.html")
    html = page.read_text()
    # The data block and the script are the only two script elements; the question
    # stayed inside its block and reads back whole.
    assert html.count("</script>") == 2 and 'pwned"</script>' not in html
    main = _blocks(html)["view-data"]
    rows = main["rows"]
    assert rows[0][4] == hostile and len(rows) == len(records)
    # The details are beside the page, a file per chunk of samples, each naming the page.
    (chunk,) = _chunks(page, "d")
    assert chunk[:3] == (main["details"]["token"], "d", 0)
    assert main["details"]["dir"] == "view.details"
    items, texts = chunk[3]["items"], chunk[3]["texts"]
    assert len(items) == len(records) and items[0][7] == hostile
    # A text that recurs in every step is stored once.
    assert texts.count("You are a careful worker.") == 1
    ((_token, _kind, _n, search),) = _chunks(page, "s")
    assert search[0].startswith(hostile.lower()) and len(search) == len(records)
    # Nothing outside the file: no resource address, and a policy that forbids any.
    assert "default-src 'none'" in html
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?(?:https?:)?//""", html, re.I)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//|@import", html, re.I)


def test_page_data_embeds_every_comparison_and_the_chart(runs_on_disk: tuple[Path, Path]) -> None:
    runs = load_runs(list(runs_on_disk))
    main = page_data(runs)
    pairs = [(c["a"], c["b"]) for c in main["compare"]]
    assert pairs == [(0, 1), (0, 2), (1, 2)]
    assert main["accuracy_cost_svg"].startswith("<svg")
    assert [r["single"] for r in main["runs"]] == [False, True, True]


@pytest.mark.process
def test_the_command_writes_the_page_and_prints_its_path(
    runs_on_disk: tuple[Path, Path], tmp_path: Path
) -> None:
    bench, singles = runs_on_disk
    res = run_cli("view", str(bench), str(singles), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "conductor-view.html"
    assert res.stdout.strip() == "conductor-view.html" and out.is_file()
    assert len(_blocks(out.read_text())["view-data"]["runs"]) == 3
    assert (tmp_path / "conductor-view.details" / "d-00000.js").is_file()
    chosen = tmp_path / "page.html"
    res = run_cli("view", str(bench), "--out", str(chosen))
    assert res.returncode == 0 and res.stdout.strip() == str(chosen) and chosen.is_file()
    res = run_cli("view", str(tmp_path / "nothing-here"))
    assert res.returncode == 2 and "nothing-here" in res.stderr


@pytest.mark.process
def test_help_loads_neither_jinja2_nor_matplotlib_nor_numpy() -> None:
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', [m for m in ('jinja2', 'matplotlib', 'numpy', 'conductor.view.data')"
        " if m in sys.modules])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert "LOADED []" in res.stdout, res.stdout + res.stderr
    assert "view" in run_cli("--help").stdout


def test_a_fresh_summary_json_is_read_and_a_stale_one_is_not(tmp_path: Path) -> None:
    import os

    from conductor.record import record_to_dict
    from conductor.runs.rundir import SAMPLES, SUMMARY, record_line
    from conductor.runs.summary import write_summary

    run = write_bench(tmp_path / "run", conductor_records(VERDICTS_A))
    write_summary(run)
    saved = json.loads((run / SUMMARY).read_text())
    saved["latency_p95"] = 123.0  # a mark only the file carries
    (run / SUMMARY).write_text(json.dumps(saved))
    assert load_runs([run])[0].overview.latency_p95 == 123.0
    # A record appended after the summary was written: the summary is summarised again.
    with (run / SAMPLES).open("a") as fh:
        fh.write(record_line(record_to_dict(planned_record("late", "late?", chain("gpt-small")))))
    later = (run / SUMMARY).stat().st_mtime + 5
    os.utime(run / SAMPLES, (later, later))
    (fresh,) = load_runs([run])
    assert fresh.overview.samples == len(VERDICTS_A) + 1 and fresh.overview.latency_p95 != 123.0


@pytest.mark.process
def test_open_hands_the_page_to_the_browser(
    runs_on_disk: tuple[Path, Path], tmp_path: Path
) -> None:
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.py"
    browser.write_text(f"import sys\nopen({str(opened)!r}, 'w').write(sys.argv[1])\n")
    out = tmp_path / "view.html"
    res = run_cli(
        "view",
        str(runs_on_disk[0]),
        "--out",
        str(out),
        "--open",
        env={"BROWSER": f"{sys.executable} {browser} %s"},
    )
    assert res.returncode == 0, res.stderr
    assert opened.read_text() == out.resolve().as_uri()


SMOKE_TEMPLATE = (
    'Answer the question. Keep it short, and end with a line "ANSWER: <answer>" where the\n'
    "answer is one word or one number.\n\nQuestion: {q}\n"
)


def test_the_question_is_the_question_not_the_prompt_around_it(tmp_path: Path) -> None:
    asked = ["What is 9 + 10?", "Capital of France?", "What is 2 + 2?"]
    records = [
        planned_record(f"q{i}", q, chain("gpt-small"), template=SMOKE_TEMPLATE)
        for i, q in enumerate(asked)
    ]
    (run,) = load_runs([write_bench(tmp_path / "run", records)])
    assert [s.question for s in run.samples] == asked
    # The prompt the run was given is kept for the sample's page.
    details = [run.details.detail(i) for i in range(len(asked))]
    assert [d["prompt"] for d in details] == [SMOKE_TEMPLATE.replace("{q}", q) for q in asked]
    assert [d["question"] for d in details] == asked
    main = page_data([run])
    assert [row[4] for row in main["rows"]] == asked


def test_records_that_only_hold_the_prompt_lose_the_template_around_it(tmp_path: Path) -> None:
    # Written before records kept the question apart: the record's question is the
    # prompt.  What every prompt of the run starts and ends with, cut at line breaks,
    # is the template's; questions that begin alike keep their words.
    asked = ["What is 9 + 10?", "What is the capital\nof France?", "What is 2 + 2?"]
    prompts = [SMOKE_TEMPLATE.replace("{q}", q) for q in asked]
    records = [planned_record(f"q{i}", p, chain("gpt-small")) for i, p in enumerate(prompts)]
    (run,) = load_runs([write_bench(tmp_path / "old", records)])
    assert [s.question for s in run.samples] == [f"Question: {q}" for q in asked]
    assert [run.details.detail(i)["prompt"] for i in range(3)] == prompts
    # One prompt alone (or the same prompt over epochs) shows no template: it stays whole.
    alone = [planned_record("q0", prompts[0], chain("gpt-small"), epoch=e) for e in range(2)]
    (one,) = load_runs([write_bench(tmp_path / "alone", alone)])
    assert [s.question for s in one.samples] == [prompts[0]] * 2
    assert [one.details.detail(i)["prompt"] for i in range(2)] == ["", ""]
    # Questions a user asked (serve, ask) are never cut, however alike they begin.
    served = [
        planned_record(None, f"Context line.\nQuestion {i}?", chain("gpt-small")) for i in (1, 2)
    ]
    (s,) = load_runs([write_serve(tmp_path / "served", served)])
    assert [x.question for x in s.samples] == [
        "Context line.\nQuestion 1?",
        "Context line.\nQuestion 2?",
    ]


def test_rounds_are_numbered_from_1_and_steps_from_0(tmp_path: Path) -> None:
    import copy

    record = planned_record("q0", "two rounds", chain("gpt-small", "claude-mid"))
    later = copy.deepcopy(record.rounds[0])
    later.index = 1
    later.steps = later.steps[:1]
    record.rounds.append(later)
    (run,) = load_runs([write_bench(tmp_path / "run", [record])])
    (_sample,) = run.samples
    detail = run.details.detail(0)
    # The record's rounds 0 and 1 are the page's rounds 1 and 2, as in conductor trace.
    assert [[st[0], st[1]] for st in detail["steps"]] == [[1, 0], [1, 1], [2, 0]]
    assert [pos for pos, _reply in detail["replies"]] == [1, 2]
    assert "data-round='1'" in detail["svg"] and "data-round='2'" in detail["svg"]


@pytest.mark.process
def test_a_serve_records_directory_is_one_run_per_served_model(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Records written by a real `conductor serve` (the CLI) answering five models.
    pytest.importorskip("fastapi")
    fake_server.script(CONDUCTOR_MODEL, lists([0, 1], ["Draft.", "Check."], [[], [0]]))
    fake_server.script("w0", "ANSWER: Paris")
    fake_server.script("w1", "ANSWER: Madrid")
    pool = make_pool_file(tmp_path, fake_server)
    records = tmp_path / "records"
    asked = [
        ("single:w0", "Capital of France?"),
        ("conductor", "Capital of Spain?"),
        ("moa", "Capital of Italy?"),
        ("single:w1", "Capital of Peru?"),
        ("conductor", "Capital of Chile?"),
        ("single:w0", "Capital of Japan?"),
        ("vote:2:w1", "Capital of Kenya?"),
    ]
    with ServeProcess("--pool", str(pool), "--records", str(records), "--no-cache") as server:
        url = server.wait_url()
        for model, question in asked:
            reply = httpx.post(
                f"{url}/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": question}]},
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
    runs = load_runs([records])
    # The Conductor first, then the others by name; each with its own label and samples.
    assert [r.strategy for r in runs] == ["conductor", "moa", "single:w0", "single:w1", "vote:2:w1"]
    assert [r.label for r in runs] == [f"serve · records · {r.strategy}" for r in runs]
    assert {r.kind for r in runs} == {"serve"}
    by = {r.strategy: r for r in runs}
    for model in by:
        mine = [q for m, q in asked if m == model]
        assert [s.question for s in by[model].samples] == mine
        assert by[model].overview.samples == len(mine)
    # Each run's numbers are its own records': calls per question and the workers used.
    assert by["conductor"].overview.calls == 3.0  # the Conductor, then two steps
    assert by["single:w0"].overview.calls == 1.0 and by["vote:2:w1"].overview.calls == 2.0
    assert by["single:w0"].overview.worker_usage == {"w0": {0: 2}}
    assert by["conductor"].conductor == "conductor-7b" and by["moa"].conductor == "—"
    assert [r.is_single for r in runs] == [False, False, True, True, False]
    main = page_data(runs)
    assert [row[0] for row in main["rows"]] == [0, 0, 1, 2, 2, 3, 4]


def test_serve_records_written_before_they_named_their_model_are_split_too(
    tmp_path: Path,
) -> None:
    # A baseline's record names itself in its Conductor field; the rest are the Conductor's.
    single = planned_record(None, "alone?", chain("gpt-small"), verdict=None, with_conductor=False)
    single.conductor = {"backend": "strategy", "strategy": "single:gpt-small"}
    planned = planned_record(None, "planned?", fan(*VIEW_WORKERS), verdict=None)
    runs = load_runs([write_serve(tmp_path / "records", [single, planned])])
    assert [(r.strategy, [s.question for s in r.samples]) for r in runs] == [
        ("conductor", ["planned?"]),
        ("single:gpt-small", ["alone?"]),
    ]


def test_the_details_are_spooled_a_chunk_at_a_time_and_published_beside_the_page(
    tmp_path: Path,
) -> None:
    records = [planned_record(f"q{i}", f"question {i}", chain("gpt-small")) for i in range(5)]
    spool = DetailSpool(chunk=2)
    runs = load_run(write_bench(tmp_path / "run", records), spool)
    # Read back from a written chunk and from the one still filling.
    assert [spool.detail(i)["question"] for i in range(5)] == [f"question {i}" for i in range(5)]
    page = write_view(runs, tmp_path / "view.html")
    chunks = _chunks(page, "d")
    assert [(n, len(payload["items"])) for _t, _k, n, payload in chunks] == [(0, 2), (1, 2), (2, 1)]
    assert [item[7] for *_head, payload in chunks for item in payload["items"]] == [
        f"question {i}" for i in range(5)
    ]
    assert [spool.detail(i)["question"] for i in range(5)] == [f"question {i}" for i in range(5)]
    # A page written again over it leaves no chunk of the earlier one.
    (companion_dir(page) / "d-00009.js").write_text("stale")
    write_view(load_runs([tmp_path / "run"]), page)
    assert sorted(p.name for p in companion_dir(page).iterdir()) == ["d-00000.js", "s-00000.js"]


@pytest.mark.parametrize("summarised", [False, True])
def test_a_sample_recorded_again_is_shown_once_as_last_recorded(
    tmp_path: Path, summarised: bool
) -> None:
    from conductor.runs.summary import write_summary

    records = [
        planned_record("q0", "first try", chain("gpt-small"), verdict="run_failed"),
        planned_record("q1", "other", chain("gpt-small")),
        planned_record("q0", "second try", chain("gpt-small"), verdict="correct"),
    ]
    run = write_bench(tmp_path / "run", records)
    if summarised:
        write_summary(run)
    (loaded,) = load_runs([run])
    assert [(s.key, s.question, s.verdict) for s in loaded.samples] == [
        ("q1#0", "other", "correct"),
        ("q0#0", "second try", "correct"),
    ]
    assert [loaded.details.detail(i)["question"] for i in range(2)] == ["other", "second try"]
