"""The shipped training configs train on each benchmark's training part only, and the
held-out guard checks a training-only benchmark against the evaluation sets cut from
its rows (issue 40).

Every shipped config runs through the guard itself (:func:`check_training_data`, the
same rows ``conductor train`` builds), its data replaced by small synthetic files in
each dataset's real schema and every held-out set given as a local copy, so nothing is
downloaded and nothing is left unchecked.  The positive control is the configs' old
RLPR entry (``benchmark: rlpr``, all of RLPR-Train): on the same file the guard stops
on the authors' test questions, with the count and the fix.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from conductor.train.config import load_train_config
from conductor.train.contamination import (
    ContaminationError,
    HoldoutUnavailableError,
    check_training_data,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
BENCH_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
#: Rows in the synthetic copy of RLPR-Train: enough for a test fifth of 294 questions.
RLPR_ROWS = 1500


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rlpr_copy(path: Path) -> Path:
    """A local copy of openbmb/RLPR-Train-Dataset's train split (its verl schema), with
    made-up questions; some answers are over the 30-character limit, as in the real
    set, so the authors' filter runs before their cut."""
    areas = ("physics", "finance", "chemistry", "biology")
    rows = [
        {
            "data_source": "synthetic",
            "prompt": [
                {"role": "system", "content": "A conversation."},
                {"role": "user", "content": f"Synthetic RLPR question {i}: what is {i} * 3?"},
            ],
            "ability": areas[i % len(areas)],
            "reward_model": {
                "ground_truth": "z" * 31 if i % 37 == 0 else str(3 * i),
                "style": "rule",
            },
            "extra_info": {"index": i},
        }
        for i in range(RLPR_ROWS)
    ]
    return _jsonl(path, rows)


def _math_training(path: Path) -> Path:
    """Training questions in HuggingFaceH4/MATH-500's schema (a mix ``file:`` is read in
    the benchmark's evaluation schema), none of them MATH-500 fixture questions."""
    return _jsonl(
        path,
        [
            {
                "problem": f"Synthetic training problem: what is {i} + {i + 1}?",
                "answer": str(2 * i + 1),
                "subject": ("Algebra", "Geometry", "Prealgebra")[i % 3],
                "level": 1 + i % 5,
                "unique_id": f"train/synthetic/{i}.json",
            }
            for i in range(60)
        ],
    )


def _mmlu_training(path: Path) -> Path:
    """Training questions in cais/mmlu's schema."""
    return _jsonl(
        path,
        [
            {
                "question": f"Synthetic training question {i}: which is {i} + 1?",
                "subject": "elementary_mathematics",
                "choices": [str(i), str(i + 1), str(i + 2), str(i + 3)],
                "answer": 1,
            }
            for i in range(60)
        ],
    )


def _lcb_training(path: Path) -> Path:
    """Training problems in livecodebench/code_generation_lite's schema: the fixture's
    rows renamed and retitled (new problems), each keeping its tests and date."""
    rows = []
    for line in (BENCH_FIXTURES / "livecodebench.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        row["question_id"] = "train_" + str(row["question_id"])
        row["question_content"] = "A training variant. " + str(row["question_content"])
        rows.append(row)
    return _jsonl(path, rows)


def _files(directory: Path) -> dict[str, Path]:
    """The synthetic training file of each benchmark a shipped config draws from."""
    return {
        "rlpr-paper": _rlpr_copy(directory / "rlpr_train_split.jsonl"),
        "math500": _math_training(directory / "math_training.jsonl"),
        "mmlu": _mmlu_training(directory / "mmlu_training.jsonl"),
        "livecodebench": _lcb_training(directory / "lcb_training.jsonl"),
    }


#: A local copy of every evaluation set the shipped configs are compared with.
def _holdout(files: dict[str, Path]) -> list[dict[str, str]]:
    return [
        {"benchmark": "math500", "file": str(BENCH_FIXTURES / "math500.jsonl")},
        {"benchmark": "mmlu", "file": str(BENCH_FIXTURES / "mmlu.jsonl")},
        {"benchmark": "livecodebench", "file": str(BENCH_FIXTURES / "livecodebench.jsonl")},
        # The whole RLPR train split: rlpr-paper reads its own test part of it.
        {"benchmark": "rlpr-paper", "file": str(files["rlpr-paper"])},
    ]


def _offline(config: Path, directory: Path, files: dict[str, Path]) -> Path:
    """``config`` with its data read from the synthetic files and every held-out set
    from a local copy; everything else (pool, template, seed, limits) as shipped."""
    body = yaml.safe_load(config.read_text("utf-8"))
    for entry in body["data"]:
        name = entry["benchmark"]
        if "file" in entry:
            entry["file"] = str((config.parent / entry["file"]).resolve())
        else:
            entry["file"] = str(files["rlpr-paper" if name == "rlpr" else name])
    body["holdout"] = _holdout(files)
    body["output_dir"] = str(directory / "out")
    body["base_model"] = "org/model"  # never loaded: the guard runs first
    path = directory / config.name
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _files(tmp_path_factory.mktemp("paper-sets-data"))


def test_the_configs_are_the_shipped_ones() -> None:
    names = {c.stem for c in CONFIGS}
    assert {"paper", "recursion", "randomised", "tiny-cpu"} <= names
    for name in ("paper", "recursion", "randomised"):
        body = yaml.safe_load((ROOT / "configs" / "train" / f"{name}.yaml").read_text("utf-8"))
        benchmarks = {e["benchmark"] for e in body["data"]}
        assert "rlpr-paper" in benchmarks and "rlpr" not in benchmarks, name


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_trains_on_no_held_out_question(
    config: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    """The guard's own count is 0 with every held-out set compared (none unchecked)."""
    result = check_training_data(load_train_config(_offline(config, tmp_path, files)))
    assert result.overlap == 0 and result.near == ()
    assert result.unchecked == ()
    assert result.training_hashes
    body = yaml.safe_load(config.read_text("utf-8"))
    if any(e["benchmark"] == "rlpr-paper" for e in body["data"]):
        assert f"rlpr-paper ({files['rlpr-paper']})" in result.checked
    if any(e["benchmark"] == "livecodebench" for e in body["data"]):
        # lcb-v6 is cut from the same rows as LiveCodeBench's: compared as well, read
        # from the local copy given for livecodebench.
        assert any(label.startswith("lcb-v6 (") for label in result.checked), result.checked


def test_all_of_rlpr_is_refused_with_the_count_and_the_fix(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """Positive control: the configs' old entry, all of RLPR-Train (training-only
    ``rlpr``), on the same file: about a fifth of its questions are the authors' test
    questions, and the guard (which used to skip training-only benchmarks) counts them
    exactly and names the training part to use instead."""
    config = ROOT / "configs" / "train" / "paper.yaml"
    path = _offline(config, tmp_path, files)
    body = yaml.safe_load(path.read_text("utf-8"))
    for entry in body["data"]:
        if entry["benchmark"] == "rlpr-paper":
            entry["benchmark"] = "rlpr"
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    settings = load_train_config(path)
    with pytest.raises(ContaminationError) as info:
        check_training_data(settings)
    message = str(info.value)

    # The count, computed here from the authors' rule (their code: drop answers over 30
    # characters, random.Random(42).shuffle the positions, test = the first int(n * 0.2),
    # scored = the first 2,000 of those) and the rows the trainer drew.
    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor

    rows = [json.loads(r) for r in files["rlpr-paper"].read_text("utf-8").splitlines()]
    kept = [r for r in rows if len(r["reward_model"]["ground_truth"]) <= 30]
    order = list(range(len(kept)))
    random.Random(42).shuffle(order)
    test = {kept[p]["prompt"][1]["content"] for p in order[: int(len(kept) * 0.2)][:2000]}
    pool = load_train_pool(settings)
    drawn = build_rows(settings, pool, training_conductor(settings, pool), rng_seed=settings.seed)
    questions = {json.loads(r["sample"])["input"]["question"] for r in drawn}
    expected = len(questions & test)
    assert 20 <= expected <= 80  # about a fifth of the 240 RLPR questions
    noun = "question is" if expected == 1 else "questions are"
    assert f"{expected} training {noun} also held out ({expected} in rlpr-paper (" in message
    fix = "train on rlpr-paper's training part instead ({benchmark: rlpr-paper, split: train})"
    assert fix in message
    assert "allow_holdout_overlap: true" in message

    # Without a local copy of RLPR the guard cannot compare, and says so: before, a
    # training-only benchmark was never compared with anything and this passed.
    body["holdout"] = [h for h in body["holdout"] if h["benchmark"] != "rlpr-paper"]
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    with pytest.raises(HoldoutUnavailableError, match=r"rlpr-paper evaluation split \(openbmb"):
        check_training_data(load_train_config(path))


# -- the paper pool prompts a paper.yaml checkpoint as it was trained ------------------


def test_the_paper_pool_prompts_as_paper_yaml_trains(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """A checkpoint trained with configs/train/paper.yaml and served behind
    pools/paper.yaml gets, question for question, the prompt it was trained on: the
    trainer's rows against the messages the orchestrator sends the pool's Conductor."""
    import asyncio

    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import Orchestrator
    from conductor.pool import load_pool, resolve_pool_path
    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor

    settings = load_train_config(
        _offline(ROOT / "configs" / "train" / "paper.yaml", tmp_path, files)
    )
    train_pool = load_train_pool(settings)
    rows = build_rows(
        settings, train_pool, training_conductor(settings, train_pool), rng_seed=settings.seed
    )
    pool = load_pool(resolve_pool_path("paper"), environ={})
    conductor = resolve_conductor(pool)
    assert conductor.template == settings.template == "paper"

    async def sent(questions: list[str]) -> list[list[dict[str, Any]]]:
        async with Orchestrator(pool, conductor) as orchestrator:
            return [
                [dict(m) for m in orchestrator.conductor_messages(q, conductor.max_steps)]
                for q in questions
            ]

    picked = rows[::97]  # a few questions of each benchmark
    assert len({json.loads(r["sample"])["input"]["question"][:12] for r in picked}) > 1
    served = asyncio.run(sent([r["question"] for r in picked]))
    for row, messages in zip(picked, served, strict=True):
        assert messages == row["prompt"]
        assert messages[-1]["role"] == "assistant"  # the prefill the policy continued
