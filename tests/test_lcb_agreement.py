"""LiveCodeBench is graded as its official checker grades it: the corpus of
tests/cases/lcb_agreement.json (verdicts recomputed by LiveCodeBench's own code with
benchmarks/graders/lcb_agreement.py), the bench CLI on data in the dataset's schema, the
report of a run whose benchmark turns on ``float_tolerance``, and the GRPO reward."""

from __future__ import annotations

import base64
import importlib.util
import json
import pickle
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import cli, read_samples
from kit.poolkit import lists, pool_dict, worker, write_pool

from conductor.conductors.spec import Conductor
from conductor.grading.code import CodeGrader
from conductor.pool import load_pool
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, FakeRequest
from conductor.train.dataset import build_rows
from conductor.train.reward import WorkflowReward
from conductor.train.settings import DataMix, RewardSettings, TrainConfig

REPO = Path(__file__).resolve().parent.parent
SHIPPED_YAML = REPO / "benchmarks" / "livecodebench.yaml"


def _agreement_script() -> Any:
    path = REPO / "benchmarks" / "graders" / "lcb_agreement.py"
    spec = importlib.util.spec_from_file_location("lcb_agreement", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lcb_agreement"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


AGREEMENT = _agreement_script()
CASES = AGREEMENT.load_cases()


@pytest.fixture(scope="module")
def grader() -> CodeGrader:
    # 2 s instead of the official 6 s per test: the corpus's slow cases pass and its
    # endless ones fail under any limit from 1 s to 6 s (the script runs at 6 s)
    return CodeGrader(time_limit_s=2)


@pytest.mark.process
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_project_agrees_with_the_official_checker(
    case: dict[str, Any], grader: CodeGrader
) -> None:
    verdict = AGREEMENT.project_verdict(case, grader)
    passed = verdict.status == "correct"
    if case.get("known_difference"):
        # documented, and still the way it is described: a change must update the note
        assert passed != case["official"]["passed"], verdict
    else:
        assert passed == case["official"]["passed"], verdict


def test_the_corpus_covers_what_the_issue_names() -> None:
    names = {c["name"] for c in CASES}
    for needed in (
        "big_int_off_by_one",
        "big_int_off_by_seven",
        "scientific_for_integer_inexact",
        "trailing_whitespace",
        "extra_line",
        "missing_line",
        "blank_line_inside",
        "float_within_1e-6",
        "slow_within_limit",
        "crash",
        "infinite_loop",
        "call_big_int_off_by_one",
    ):
        assert needed in names
    verdicts = [c["official"]["passed"] for c in CASES]
    assert verdicts.count(True) >= 15 and verdicts.count(False) >= 15
    assert all(isinstance(c["official"]["results"], list) for c in CASES)
    assert sum(bool(c.get("known_difference")) for c in CASES) <= 4


def test_the_defaults_are_the_official_checkers() -> None:
    grader = CodeGrader()
    assert grader.time_limit_s == AGREEMENT.OFFICIAL_TIMEOUT
    assert grader.float_tolerance is None


def test_a_bad_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="float_tolerance"):
        CodeGrader(float_tolerance=-1)


# ------------------------------------------------------------------ bench CLI and report


def _encode_private(tests: list[dict[str, str]]) -> str:
    """LiveCodeBench's private-test encoding: JSON text, pickled, zlib, base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def _problem(qid: str, content: str, public: tuple[str, str], private: tuple[str, str]) -> str:
    def tests(pair: tuple[str, str]) -> list[dict[str, str]]:
        return [{"input": pair[0], "output": pair[1], "testtype": "stdin"}]

    row = {
        "question_title": qid,
        "question_content": content,
        "platform": "atcoder",
        "question_id": qid,
        "contest_id": "abc999",
        "contest_date": "2024-10-05T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(tests(public)),
        "private_test_cases": _encode_private(tests(private)),
        "metadata": "{}",
    }
    return json.dumps(row) + "\n"


@pytest.fixture
def lcb_data(tmp_path: Path) -> Path:
    """Two problems in LiveCodeBench's own schema: a large triangular number, and a
    third of N (whose expected output has 7 digits)."""
    path = tmp_path / "lcb.jsonl"
    path.write_text(
        _problem("tri", "Print 1 + 2 + ... + N.", ("2000000\n", "2000001000000\n"),
                 ("10000000\n", "50000005000000\n"))
        + _problem("third", "Print N / 3.", ("1\n", "0.3333333\n"), ("2\n", "0.6666667\n"))
    )  # fmt: skip
    return path


def _code_answers(server: FakeLLMServer) -> None:
    """w0 answers the triangular number off by one, and a third in full precision."""

    def answer(request: FakeRequest) -> str:
        if "1 + 2 + ... + N" in request.last_user_message:
            return "```python\nn = int(input())\nprint(n * (n + 1) // 2 + 1)\n```"
        return "```python\nprint(int(input()) / 3)\n```"

    server.script("w0", answer)


def _bench(tmp_path: Path, server: FakeLLMServer, benchmark: str, data: Path, out: Path) -> Any:
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0")]))
    res = cli(
        "bench", benchmark, "--pool", str(pool), "--data", str(data), "--out", str(out),
        "--strategy", "single:w0", cache=tmp_path / "cache",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {r["sample_id"].rsplit("/", 1)[-1]: r["grade"] for r in read_samples(out)}


@pytest.mark.process
def test_bench_grades_a_wrong_big_integer_wrong(
    tmp_path: Path, fake_server: FakeLLMServer, lcb_data: Path
) -> None:
    _code_answers(fake_server)
    out = tmp_path / "run"
    grades = _bench(tmp_path, fake_server, "livecodebench", lcb_data, out)
    # 2000001000001 for 2000001000000: within 1e-6 relative, yet wrong, as officially
    assert grades["tri"]["status"] == "incorrect", grades
    assert grades["tri"]["detail"]["outcome"] == "wrong_answer"
    assert "2000001000001" in grades["tri"]["reason"]
    # 0.3333333333333333 for 0.3333333: the official checker compares decimals exactly
    assert grades["third"]["status"] == "incorrect", grades
    config = json.loads((out / "config.json").read_text())
    assert config["benchmark"]["grader_version"] == CodeGrader.version
    assert config["benchmark"]["grader_options"] == {}
    report = cli("report", str(out), cache=tmp_path / "cache")
    assert report.returncode == 0, report.stderr
    # nothing departs from the official checker, so no grader row is shown
    assert "float_tolerance" not in report.stdout and "code v" not in report.stdout


@pytest.mark.process
def test_a_tolerance_is_recorded_and_reported(
    tmp_path: Path, fake_server: FakeLLMServer, lcb_data: Path
) -> None:
    _code_answers(fake_server)
    spec = tmp_path / "lcb-tolerant.yaml"
    spec.write_text(SHIPPED_YAML.read_text() + "grader_options:\n  float_tolerance: 1.0e-6\n")
    out = tmp_path / "run"
    grades = _bench(tmp_path, fake_server, str(spec), lcb_data, out)
    assert grades["third"]["status"] == "correct", grades
    assert grades["tri"]["status"] == "incorrect", grades  # integers stay exact
    config = json.loads((out / "config.json").read_text())
    assert config["benchmark"]["grader_options"] == {"float_tolerance": 1e-6}
    report = cli("report", str(out), cache=tmp_path / "cache")
    assert report.returncode == 0, report.stderr
    assert "float_tolerance=1e-06" in report.stdout
    assert f"code v{CodeGrader.version}" in report.stdout


# ------------------------------------------------------------------------- GRPO reward


@pytest.mark.process
def test_the_reward_grades_code_as_the_bench_does(
    tmp_path: Path, fake_server: FakeLLMServer, lcb_data: Path
) -> None:
    _code_answers(fake_server)
    data = pool_dict(fake_server, [worker(fake_server, "w0", max_retries=0)])
    del data["conductor"]
    pool = load_pool(write_pool(tmp_path / "pool.yaml", data))
    conductor = Conductor(backend="prompted", target=Worker(id="c", model="p"), max_steps=2)
    config = TrainConfig(
        base_model="gguf:smollm2",
        pool=str(pool.path),
        data=(DataMix(benchmark="livecodebench", split="test", file=str(lcb_data)),),
        output_dir="unused",
    )
    rows = build_rows(config, pool, conductor, rng_seed=0)
    by_id = {r["sample_id"].rsplit("/", 1)[-1]: r for r in rows}
    rows = [by_id["tri"], by_id["third"]]
    reward = WorkflowReward(pool, conductor, RewardSettings())
    try:
        plan = lists([0], ["Write the program"], [[]])
        scores = reward(
            prompts=[r["prompt"] for r in rows],
            completions=[plan, plan],
            **{key: [r[key] for r in rows] for key in rows[0]},
        )
    finally:
        reward.close()
    # both answers ran and were graded wrong, as the bench grades them
    assert [r.correct for r in reward.last_batch] == [False, False]
    assert scores[0] == scores[1]
