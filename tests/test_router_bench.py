"""A router end to end against the fake providers: ``bench --strategy singles``, then
``conductor fit-router``, then ``bench`` / ``ask`` / ``--estimate`` with
``--strategy router:DIR``, as a user runs them (child processes, real HTTP)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import cli
from kit.poolkit import pool_dict, worker, write_pool

from conductor.testing import FakeLLMServer

pytest.importorskip("numpy")
pytestmark = pytest.mark.process

_SUM = re.compile(r"What is (\d+) \+ 0\?")
_TIMES = re.compile(r"Compute (\d+) times one\.")


def _data(path: Path, n: int) -> Path:
    """``n`` questions of two kinds, alternating: sums (w0 knows them) and products
    (w1 knows them)."""
    rows = []
    for i in range(n):
        problem = f"What is {i} + 0?" if i % 2 == 0 else f"Compute {i} times one."
        rows.append({"problem": problem, "answer": str(i), "unique_id": f"mixed/{i}.json"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _knows(kind: re.Pattern[str]) -> Any:
    def answer(request: Any) -> str:
        text = request.messages[-1]["content"]
        found = kind.search(text)
        return f"\\boxed{{{found[1]}}}" if found else "\\boxed{-1}"

    return answer


@pytest.fixture
def setup(tmp_path: Path, fake_server: FakeLLMServer) -> dict[str, Any]:
    fake_server.script("w0", _knows(_SUM))
    fake_server.script("w1", _knows(_TIMES))
    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    dear = {"input_per_mtok": 10.0, "output_per_mtok": 20.0}
    pool = write_pool(
        tmp_path / "pool.yaml",
        pool_dict(
            fake_server,
            [worker(fake_server, "w0", price=price), worker(fake_server, "w1", price=dear)],
        ),
    )
    return {
        "pool": pool,
        "data": _data(tmp_path / "mixed.jsonl", 80),
        "cache": tmp_path / "cache",
        "server": fake_server,
    }


def _bench(
    setup: dict[str, Any], strategy: str, out: Path, *extra: str, cache: Path | None = None
) -> Any:
    return cli(
        "bench", "math500", "--pool", str(setup["pool"]), "--data", str(setup["data"]),
        "--strategy", strategy, "--out", str(out), *extra, cache=cache or setup["cache"],
    )  # fmt: skip


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def test_a_router_fitted_on_singles_runs_answers_what_no_single_worker_does(
    tmp_path: Path, setup: dict[str, Any]
) -> None:
    singles = tmp_path / "singles"
    done = _bench(setup, "singles", singles)
    assert done.returncode == 0, done.stderr

    # The report shows what any router of these workers could at most score.
    chart = tmp_path / "chart.svg"
    report = cli("report", str(singles), "--plot", str(chart), cache=setup["cache"])
    assert report.returncode == 0, report.stderr
    shown = " ".join(report.stdout.split())
    assert "per-question oracle: 100.0% of the 80 questions" in shown, report.stdout
    assert "(the best alone: 50.0%)" in shown, report.stdout
    assert 'id="ceiling"' in chart.read_text()
    page = tmp_path / "view.html"
    viewed = cli("view", str(singles), "--out", str(page), cache=setup["cache"])
    assert viewed.returncode == 0, viewed.stderr
    # The chart's line.
    assert "per-question oracle (the best single on each question)" in page.read_text()

    router_dir = tmp_path / "router"
    fitted = cli("fit-router", str(singles), "--out", str(router_dir), cache=setup["cache"])
    assert fitted.returncode == 0, fitted.stderr
    table = fitted.stdout
    assert re.search(r"router\s+100\.0%", table), table
    assert re.search(r"oracle\s+100\.0%", table), table
    assert re.search(r"router - single:w[01]: \+\d", table), table
    assert "paired sign-flip test" in table, table
    assert "router written to" in fitted.stderr
    info = json.loads((router_dir / "router.json").read_text())
    assert [a["strategy"] for a in info["arms"]] == ["single:w0", "single:w1"]
    train = info["training"]["questions"]
    held = info["training"]["heldout_questions"]
    assert train + held == 80 and held > 10
    assert info["training_questions"]["count"] == train

    routed = tmp_path / "routed"
    server: FakeLLMServer = setup["server"]
    asked = len(server.requests)
    # A cache of its own: every question is asked again, of the worker it is routed to.
    run = _bench(setup, f"router:{router_dir}", routed, cache=tmp_path / "cache2")
    assert run.returncode == 0, run.stderr
    records = _records(routed)
    assert len(records) == 80
    assert all(r["grade"]["status"] == "correct" for r in records)
    for r in records:
        number = int(re.findall(r"\d+", r["sample_id"])[-1])
        arm = "single:w0" if number % 2 == 0 else "single:w1"
        assert r["route"]["arm"] == arm
        assert r["conductor"]["arm"] == arm
        assert r["conductor"]["strategy"] == f"router:{router_dir}"
        assert r["strategy"] == f"router:{router_dir}"
        (step,) = r["rounds"][0]["steps"]
        assert step["worker_id"] == arm.split(":")[1]
    # Each question called the one worker it was routed to, and nothing else.
    new = server.requests[asked:]
    assert sorted(r.model for r in new) == ["w0"] * 40 + ["w1"] * 40
    config = json.loads((routed / "config.json").read_text())
    assert config["trained_on"] == {
        "checkpoint": str(router_dir),
        "questions": train,
        "samples": train,
    }

    # A router's own run is not an arm of another router.
    nested = cli("fit-router", str(singles), str(routed), "--out", str(tmp_path / "r2"),
                 cache=setup["cache"])  # fmt: skip
    assert nested.returncode == 2 and "cannot be a router's arm" in nested.stderr, nested.stderr

    excluded = tmp_path / "excluded"
    run = _bench(setup, f"router:{router_dir}", excluded, "--exclude-trained")
    assert run.returncode == 0, run.stderr
    assert len(_records(excluded)) == held

    # --estimate prices each question as the arm it goes to, calling no model.
    calls_before = len(server.requests)
    estimate = _bench(
        setup, f"router:{router_dir}", tmp_path / "est", "--estimate", cache=tmp_path / "cache3"
    )
    assert estimate.returncode == 0, estimate.stderr
    assert len(server.requests) == calls_before
    assert re.search(r"w0\s.*\b40\b", estimate.stdout), estimate.stdout
    assert re.search(r"w1\s.*\b40\b", estimate.stdout), estimate.stdout
    assert "routed:" in estimate.stdout


def test_ask_routes_one_question(tmp_path: Path, setup: dict[str, Any]) -> None:
    singles = tmp_path / "singles"
    assert _bench(setup, "singles", singles).returncode == 0
    router_dir = tmp_path / "router"
    assert (
        cli("fit-router", str(singles), "-o", str(router_dir), cache=setup["cache"]).returncode == 0
    )
    out = tmp_path / "ask.json"
    asked = cli(
        "ask", "Compute 31 times one.", "--pool", str(setup["pool"]),
        "--strategy", f"router:{router_dir}", "--out", str(out), cache=setup["cache"],
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    record = json.loads(out.read_text())
    assert record["route"]["arm"] == "single:w1"
    assert "31" in (record["final_answer"] or "")


def test_fit_router_refuses_what_it_cannot_fit(tmp_path: Path, setup: dict[str, Any]) -> None:
    one = tmp_path / "one"
    assert _bench(setup, "single:w0", one).returncode == 0
    refused = cli("fit-router", str(one), "--out", str(tmp_path / "r"), cache=setup["cache"])
    assert refused.returncode == 2
    assert "holds runs of 1 strategy: single:w0" in refused.stderr
    assert "Traceback" not in refused.stderr

    missing = cli(
        "fit-router", str(tmp_path / "nope"), "--out", str(tmp_path / "r"), cache=setup["cache"]
    )
    assert missing.returncode == 2 and "no such run directory" in missing.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    two = tmp_path / "two"
    assert _bench(setup, "single:w1", two).returncode == 0
    refused = cli("fit-router", str(one), str(two), "--out", str(busy), cache=setup["cache"])
    assert refused.returncode == 2 and "holds other files" in refused.stderr
    assert (busy / "notes.txt").read_text() == "mine"

    routed = _bench(setup, f"router:{busy}", tmp_path / "x")
    assert routed.returncode == 2 and "not a router directory" in routed.stderr


def test_a_router_on_a_small_models_hidden_states_routes_a_bench(
    tmp_path: Path, setup: dict[str, Any]
) -> None:
    from kit.poolkit import embedded_model_or_skip

    embedded_model_or_skip()
    singles = tmp_path / "singles"
    assert _bench(setup, "singles", singles).returncode == 0
    router_dir = tmp_path / "router"
    fitted = cli("fit-router", str(singles), "--out", str(router_dir), "--features",
                 "gguf-mean-v1", "--json", cache=setup["cache"])  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    measured = json.loads(fitted.stdout)
    router = next(p for p in measured["policies"] if p["name"] == "router")
    assert router["accuracy"] == 1.0, measured
    info = json.loads((router_dir / "router.json").read_text())
    assert info["features"]["name"] == "gguf-mean-v1"
    assert info["features"]["settings"]["model"] == "embedded"
    assert len(info["features"]["settings"]["center"]) == 576

    routed = tmp_path / "routed"
    run = _bench(setup, f"router:{router_dir}", routed, "--exclude-trained",
                 cache=tmp_path / "cache2")  # fmt: skip
    assert run.returncode == 0, run.stderr
    records = _records(routed)
    assert len(records) == info["training"]["heldout_questions"]
    assert all(r["grade"]["status"] == "correct" for r in records)

    # Weights other than the fitted ones are refused before anything runs.
    server: FakeLLMServer = setup["server"]
    asked = len(server.requests)
    info["features"]["settings"]["sha256"] = "0" * 64
    (router_dir / "router.json").write_text(json.dumps(info))
    other = _bench(setup, f"router:{router_dir}", tmp_path / "other", cache=tmp_path / "cache3")
    assert other.returncode == 2, other.stderr
    assert "not the file this router was fitted with" in other.stderr
    assert "Traceback" not in other.stderr and len(server.requests) == asked

    wrong = cli("fit-router", str(singles), "--out", str(tmp_path / "r2"), "--features-model",
                str(tmp_path / "x.gguf"), cache=setup["cache"])  # fmt: skip
    assert wrong.returncode == 2 and "goes with --features gguf-mean-v1" in wrong.stderr
    unknown = cli("fit-router", str(singles), "--out", str(tmp_path / "r3"), "--features",
                  "bert", cache=setup["cache"])  # fmt: skip
    assert unknown.returncode == 2 and "no featurizer 'bert'" in unknown.stderr


def test_a_router_fitted_on_multiple_choice_runs_counts_its_questions_in_a_bench(
    tmp_path: Path, setup: dict[str, Any]
) -> None:
    """A multiple-choice question's key covers its choices (as the bench keys its
    samples): a router fitted on MMLU runs is known to have seen those questions."""
    rows = []
    for i in range(40):
        options = [str(i), str(i + 1), str(i + 2), str(i + 3)]
        ask = f"What is {i} + 0?" if i % 2 == 0 else f"Compute {i} times one."
        rows.append({"question": ask, "subject": "maths", "choices": options, "answer": 0})
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def bench(strategy: str, out: Path, *extra: str) -> Any:
        return cli("bench", "mmlu", "--pool", str(setup["pool"]), "--data", str(data),
                   "--strategy", strategy, "--out", str(out), *extra,
                   cache=setup["cache"])  # fmt: skip

    singles = tmp_path / "singles"
    assert bench("singles", singles).returncode == 0
    record = _records(singles / "single-w0")[0]
    assert len(record["sample_choices"]) == 4
    router_dir = tmp_path / "router"
    fitted = cli("fit-router", str(singles), "--out", str(router_dir), cache=setup["cache"])
    assert fitted.returncode == 0, fitted.stderr
    info = json.loads((router_dir / "router.json").read_text())
    train = info["training"]["questions"]
    assert 0 < train < 40
    routed = tmp_path / "routed"
    run = bench(f"router:{router_dir}", routed)
    assert run.returncode == 0, run.stderr
    config = json.loads((routed / "config.json").read_text())
    assert config["trained_on"]["samples"] == train
    excluded = tmp_path / "excluded"
    assert bench(f"router:{router_dir}", excluded, "--exclude-trained").returncode == 0
    assert len(_records(excluded)) == 40 - train
