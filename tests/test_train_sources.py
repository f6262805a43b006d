"""Held-out training sources: the shipped benchmarks' train_source field mappings read
fixture files in the real schemas, the seeded balanced sampler, the refusal to train
on evaluation questions, and the GRPO knobs passed to TRL."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled

from conductor.bench.spec import load_benchmark, load_benchmark_text, training_spec
from conductor.benchmark import BenchmarkSpec
from conductor.datasets.samples import balanced_indices, iter_samples, render_prompt, sample_subset
from conductor.errors import BenchmarkFileError, TrainConfigError, UsageError
from conductor.train.config import load_train_config, load_train_config_text
from conductor.train.dataset import mix_spec
from conductor.train.settings import DataMix, GRPOSettings, TrainConfig

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "train"
MATH_TYPES = {
    "Algebra",
    "Counting & Probability",
    "Geometry",
    "Intermediate Algebra",
    "Number Theory",
    "Prealgebra",
    "Precalculus",
}


def shipped_train(name: str, fixture: str) -> BenchmarkSpec:
    """The shipped benchmark's training view, its train_source read from a local fixture
    (same fields, filters and balance; only where the rows come from changes)."""
    spec = load_benchmark(name)
    assert spec.train_source is not None, name
    local = dataclasses.replace(
        spec.train_source, kind="file", path=str(FIXTURES / fixture), id=None, revision=None
    )
    train = training_spec(dataclasses.replace(spec, train_source=local))
    assert train is not None
    return train


# --------------------------------------------------------------------------- MATH


def test_math_train_split_answers_are_the_last_boxed() -> None:
    spec = shipped_train("math500", "math_train.jsonl")
    samples = list(iter_samples(spec))
    # 34 rows have a boxed answer; the one without is left out (it cannot be graded).
    assert len(samples) == 34
    first = samples[0]
    assert first.input["question"] == "[Algebra 0] What is $2 \\times 7$?"
    assert first.gold == "14"
    assert first.metadata == {"subject": "Algebra", "level": "Level 1"}
    assert all(not s.input["question"].startswith("[Geometry x]") for s in samples)
    # No id column: ids hash the problem, prefixed with the benchmark's name.
    assert first.id.startswith("math500/") and len(first.id) == len("math500/") + 16


def test_balanced_sample_covers_every_subject() -> None:
    spec = shipped_train("math500", "math_train.jsonl")
    # The first 14 rows are all Algebra; a balanced sample of 14 is 2 per subject.
    first = [s.metadata["subject"] for s in iter_samples(spec, limit=14)]
    assert set(first) == {"Algebra"}
    picked = sample_subset(spec, limit=14, seed=0, balance=("subject",))
    counts = Counter(s.metadata["subject"] for s in picked)
    assert counts == dict.fromkeys(MATH_TYPES, 2)
    # A subject with fewer rows than its share gives all it has; Algebra makes up the rest.
    picked = sample_subset(spec, limit=25, seed=0, balance=("subject",))
    counts = Counter(s.metadata["subject"] for s in picked)
    assert counts["Algebra"] == 7 and all(counts[t] == 3 for t in MATH_TYPES - {"Algebra"})
    # Seeded: the same seed gives the same questions, another seed others.
    again = sample_subset(spec, limit=14, seed=0, balance=("subject",))
    other = sample_subset(spec, limit=14, seed=1, balance=("subject",))
    ids = [s.id for s in sample_subset(spec, limit=14, seed=0, balance=("subject",))]
    assert [s.id for s in again] == ids
    assert [s.id for s in other] != ids
    # The shipped balance is subject x level: 7 x 5 cells, one question each here.
    shipped = sample_subset(spec, limit=7, seed=3)
    assert {s.metadata["subject"] for s in shipped} <= MATH_TYPES
    assert len(shipped) == 7
    cells = Counter((s.metadata["subject"], s.metadata["level"]) for s in shipped)
    assert max(cells.values()) == 1


def test_balanced_indices_spread_and_cap() -> None:
    groups = [("a",)] * 10 + [("b",)] * 2 + [("c",)] * 1
    picked = balanced_indices(groups, 6, seed=0)
    assert picked == sorted(picked) and len(set(picked)) == 6
    assert Counter(groups[i] for i in picked) == {("a",): 3, ("b",): 2, ("c",): 1}
    assert balanced_indices(groups, 100, seed=0) == list(range(13))
    assert balanced_indices([], 5, seed=0) == []
    # Remainders go to groups drawn by the seed, not always the first ones.
    even = [("a",)] * 5 + [("b",)] * 5 + [("c",)] * 5
    firsts = {
        tuple(sorted(Counter(even[i] for i in balanced_indices(even, 4, s)).items()))
        for s in range(10)
    }
    assert len(firsts) > 1


# --------------------------------------------------------------------------- MMLU


def test_mmlu_auxiliary_train_rows_are_unwrapped() -> None:
    spec = shipped_train("mmlu", "mmlu_aux_train.jsonl")
    assert spec.source.row == "train" and spec.source.config == "auxiliary_train"
    samples = list(iter_samples(spec, seed=2))
    assert len(samples) == 12
    sample = samples[0]
    assert sample.input["question"] == "Which of these is a mammal? (variant 0)"
    assert sample.metadata["correct_text"] == "whale"
    assert sample.input["choices"][ord(sample.gold) - ord("A")] == "whale"
    # Its subject column is empty: a limit is a seeded uniform draw over all rows.
    picked = sample_subset(spec, limit=5, seed=4)
    assert len(picked) == 5
    assert [s.id for s in picked] != [s.id for s in samples[:5]]


def test_a_row_missing_its_wrapper_column_is_a_data_error(tmp_path: Path) -> None:
    bad = tmp_path / "aux.jsonl"
    bad.write_text('{"question": "flat row", "choices": ["a", "b"], "answer": 0}\n')
    spec = shipped_train("mmlu", "mmlu_aux_train.jsonl")
    spec = dataclasses.replace(spec, source=dataclasses.replace(spec.source, path=str(bad)))
    with pytest.raises(UsageError, match=r"aux.jsonl:1: .*under column 'train'"):
        list(iter_samples(spec))


# --------------------------------------------------------------------------- RLPR


def test_rlpr_reads_the_user_message_and_reference_answer() -> None:
    base = load_benchmark("rlpr")
    assert base.training_only
    spec = shipped_train("rlpr", "rlpr_train.jsonl")
    samples = list(iter_samples(spec))
    # 13 rows, one with a reference answer over 30 characters: left out.
    assert len(samples) == 12
    first = samples[0]
    assert first.input["question"] == "[Physics 0] Compute 0 + 7."
    assert first.gold == "7"
    assert first.metadata["subject"] == "Physics"
    prompt = render_prompt(spec, first)
    assert "[Physics 0] Compute 0 + 7." in prompt and "A conversation between" not in prompt
    picked = sample_subset(spec, limit=8, seed=0)
    assert Counter(s.metadata["subject"] for s in picked) == {
        "Physics": 2,
        "Chemistry": 2,
        "Economics": 2,
        "Biology": 2,
    }


@pytest.mark.process
def test_rlpr_cannot_be_benchmarked_without_data() -> None:
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(
        [sys.executable, "-m", "conductor", "bench", "rlpr", "--pool", "local"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env=env,
    )
    assert result.returncode == 2, result.stderr
    assert "training only" in result.stderr


# --------------------------------------------------------------------------- LiveCodeBench


def test_livecodebench_release_v1_stays_before_the_evaluation_window() -> None:
    spec = shipped_train("livecodebench", "lcb_release_v1.jsonl")
    evaluation = load_benchmark("livecodebench")
    assert spec.fields["release"] == "release_v1"
    start = evaluation.filters["contest_date_from"]
    assert spec.filters["contest_date_to"] < start
    samples = list(iter_samples(spec))
    assert len(samples) == 10
    assert all(s.metadata["date"][:10] < start for s in samples)
    assert "livecodebench/new01_a" not in {s.id for s in samples}
    picked = sample_subset(spec, limit=6, seed=0)
    assert Counter(s.metadata["difficulty"] for s in picked) == {
        "easy": 2,
        "medium": 2,
        "hard": 2,
    }


BASE = """\
source: {file: eval.jsonl}
fields: {loader: livecodebench}
filters: {contest_date_from: 2024-08-01}
prompt: "${question}"
grader: code
"""


@pytest.mark.parametrize(
    ("train", "line", "needle"),
    [
        (
            "train_source:\n  file: t.jsonl\n  filters: {contest_date_to: 2024-08-01}\n",
            8,
            "must be before the evaluation window's contest_date_from (2024-08-01)",
        ),
        ("train_source:\n  file: t.jsonl\n", 7, "got nothing"),
        ("train_source:\n  file: t.jsonl\n  balance: [topic]\n", 8, "cannot balance over"),
        ("train_source:\n  file: t.jsonl\n  fields: {titel: x}\n", 8, 'did you mean "title"'),
        ("train_source:\n  file: t.jsonl\n  fields: {loader: math}\n", 8, "own loader"),
        ("train_source:\n  file: t.jsonl\n  split_by: x\n", 8, "split_by"),
    ],
)
def test_train_source_mistakes_name_file_and_line(train: str, line: int, needle: str) -> None:
    with pytest.raises(BenchmarkFileError) as info:
        load_benchmark_text(BASE + train, source="b.yaml")
    message = str(info.value)
    assert message.startswith(f"b.yaml:{line}: "), message
    assert needle in message


def test_math_fields_need_an_answer_or_a_solution() -> None:
    text = 'source: {file: x.jsonl}\nfields: {answer: null}\nprompt: "${question}"\ngrader: math\n'
    with pytest.raises(BenchmarkFileError, match=r"b.yaml:2: fields must name the answer"):
        load_benchmark_text(text, source="b.yaml")
    with pytest.raises(BenchmarkFileError, match=r'missing required key "source"'):
        load_benchmark_text('prompt: "${question}"\ngrader: math\n', source="b.yaml")


def test_every_shipped_train_source_loads() -> None:
    for name in ("math500", "mmlu", "livecodebench", "rlpr"):
        spec = load_benchmark(name)
        assert spec.train_source is not None and spec.train_source.kind == "hf", name
        assert training_spec(spec) is not None
    for name in ("aime24", "aime25", "gpqa-diamond", "bigcodebench-hard"):
        assert load_benchmark(name).train_source is None, name


# --------------------------------------------------------------------------- configs


def config_text(data: str, tmp_path: Path) -> str:
    return f"base_model: x/y\npool: local\ndata:\n{data}output_dir: {tmp_path / 'out'}\n"


def test_split_train_without_a_train_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config_text("  - benchmark: math500\n  - benchmark: aime24\n", tmp_path))
    with pytest.raises(TrainConfigError) as info:
        load_train_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:5: "), message
    assert "aime24 has no train_source" in message
    # The shorthand form is refused the same way.
    path.write_text(config_text("  - aime24\n", tmp_path))
    with pytest.raises(TrainConfigError, match=r"c.yaml:4: data\[0\]: benchmark aime24"):
        load_train_config(path)
    # With a file of training questions, or on purpose with split: test, it loads.
    items = tmp_path / "mine.jsonl"
    items.write_text('{"id": "1", "problem": "1+1?", "answer": "2"}\n')
    path.write_text(config_text(f"  - {{benchmark: aime24, file: {items}}}\n", tmp_path))
    assert load_train_config(path).data[0].file == str(items)
    path.write_text(config_text("  - {benchmark: aime24, split: test}\n", tmp_path))
    assert load_train_config(path).data[0].split == "test"
    # A config built in code is refused when its rows are read.
    with pytest.raises(UsageError, match="aime24 has no train_source"):
        mix_spec(DataMix(benchmark="aime24"))


@pytest.mark.process
def test_conductor_train_exits_2_before_loading_anything(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config_text("  - benchmark: gpqa-diamond\n    limit: 5\n", tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "conductor", "train", str(path)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 2, result.stderr
    assert f"{path}:4:" in result.stderr and "gpqa-diamond has no train_source" in result.stderr
    assert not (tmp_path / "out").exists()


def test_mix_reads_the_train_source_and_a_file_the_benchmark_schema(tmp_path: Path) -> None:
    spec = mix_spec(DataMix(benchmark="math500"))
    assert spec.source.id == "DigitalLearningGmbH/MATH-lighteval"
    assert spec.fields["solution"] == "solution" and "answer" not in spec.fields
    items = tmp_path / "mine.jsonl"
    items.write_text('{"unique_id": "u1", "problem": "1+1?", "answer": "2"}\n')
    own = mix_spec(DataMix(benchmark="math500", file=str(items)))
    assert own.fields["answer"] == "answer"
    assert [s.gold for s in sample_subset(own, data_file=items, limit=3)] == ["2"]


def test_shipped_configs_train_on_the_papers_held_out_mix() -> None:
    paper = load_train_config(REPO / "configs" / "train" / "paper.yaml")
    assert [(m.benchmark, m.split, m.limit) for m in paper.data] == [
        ("math500", "train", 240),
        ("mmlu", "train", 240),
        ("rlpr-paper", "train", 240),  # the authors' training part, not all of RLPR
        ("livecodebench", "train", 240),
    ]
    g = paper.grpo
    assert g.loss_type == "bnpo" and g.vllm_gpu_memory_utilization == 0.3
    # The stated layout: 2 processes x accumulation x micro-batch = one step's completions.
    assert 2 * (g.gradient_accumulation_steps or 0) * (g.per_device_batch_size or 0) == (
        g.questions_per_step * g.group_size
    )
    rec = load_train_config(REPO / "configs" / "train" / "recursion.yaml")
    assert sorted((m.benchmark, m.limit) for m in rec.data) == [
        ("livecodebench", 175),
        ("rlpr-paper", 175),
    ]
    assert rec.recursion is not None and rec.recursion.discount == 0.2
    assert rec.recursion.fraction == 1.0 and rec.grpo.steps == 20
    for config in (paper, rec):
        for mix in config.data:
            assert mix.file is None and training_spec(load_benchmark(mix.benchmark))


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("grpo:\n  loss_type: bnp0\n", 'did you mean "bnpo"'),
        ("grpo:\n  vllm_gpu_memory_utilization: 1.5\n", "between 0 and 1"),
        ("grpo:\n  per_device_batch_size: 0\n", "must be an integer from 1 to 1,000,000"),
    ],
)
def test_grpo_knob_mistakes(tmp_path: Path, body: str, needle: str) -> None:
    text = config_text("  - math500\n", tmp_path) + body
    with pytest.raises(TrainConfigError, match=r"c.yaml:7: ") as info:
        load_train_config_text(text, source="c.yaml")
    assert needle in str(info.value)


def test_grpo_knobs_reach_trl(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from conductor.train.trainer import build_grpo_config

    def config(**grpo: Any) -> TrainConfig:
        return TrainConfig(
            base_model="x",
            pool="local",
            data=(DataMix(benchmark="math500"),),
            output_dir=str(tmp_path),
            grpo=GRPOSettings(group_size=8, questions_per_step=4, **grpo),
        )

    args = build_grpo_config(
        config(
            loss_type="bnpo",
            vllm_gpu_memory_utilization=0.45,
            gradient_accumulation_steps=4,
            per_device_batch_size=8,
        ),
        output_dir=tmp_path,
    )
    assert args.loss_type == "bnpo"
    assert args.vllm_gpu_memory_utilization == 0.45
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 4)
    # Unset knobs keep TRL's defaults.
    plain = build_grpo_config(config(), output_dir=tmp_path)
    defaults = {f.name: f.default for f in dataclasses.fields(type(plain))}
    assert plain.loss_type == defaults["loss_type"]
    assert plain.vllm_gpu_memory_utilization == defaults["vllm_gpu_memory_utilization"]
    # A layout that does not give the stated micro-batch on this many processes stops.
    with pytest.raises(UsageError, match="per_device_batch_size is 4, but 32 completions"):
        build_grpo_config(
            config(gradient_accumulation_steps=4, per_device_batch_size=4), output_dir=tmp_path
        )


def test_batch_layout_follows_from_either_knob_or_neither(tmp_path: Path) -> None:
    """Neither knob: micro-batches of at most DEFAULT_MICRO_BATCH (the memory of a step
    is one micro-batch's activations); one knob: the other follows; a layout that does
    not split the step's completions is refused, naming the numbers."""
    from conductor.train.settings import DEFAULT_MICRO_BATCH
    from conductor.train.trainer import batch_layout

    def config(group: int, questions: int, **grpo: Any) -> TrainConfig:
        return TrainConfig(
            base_model="x",
            pool="local",
            data=(DataMix(benchmark="math500"),),
            output_dir=str(tmp_path),
            grpo=GRPOSettings(group_size=group, questions_per_step=questions, **grpo),
        )

    assert DEFAULT_MICRO_BATCH == 4
    assert batch_layout(config(8, 4), 1) == (4, 8)
    assert batch_layout(config(8, 4), 2) == (4, 4)
    assert batch_layout(config(3, 3), 1) == (3, 3)  # 9 completions: the largest divisor <= 4
    assert batch_layout(config(7, 1), 1) == (1, 7)
    assert batch_layout(config(2, 1), 1) == (2, 1)
    assert batch_layout(config(8, 4, per_device_batch_size=16), 1) == (16, 2)
    assert batch_layout(config(8, 4, gradient_accumulation_steps=2), 1) == (16, 2)
    both = config(8, 4, gradient_accumulation_steps=2, per_device_batch_size=8)
    assert batch_layout(both, 2) == (8, 2)
    with pytest.raises(UsageError, match="per_device_batch_size 5 does not divide the 32"):
        batch_layout(config(8, 4, per_device_batch_size=5), 1)
    with pytest.raises(UsageError, match="split evenly over 3 process"):
        batch_layout(config(8, 4), 3)


@pytest.mark.process
def test_training_rows_are_a_balanced_sample(tmp_path: Path) -> None:
    from conductor.pool import resolve_pool_path
    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor

    bench = tmp_path / "mathtrain.yaml"
    bench.write_text(
        "source: {file: unused.jsonl}\n"
        "train_source:\n"
        f"  file: {FIXTURES / 'math_train.jsonl'}\n"
        "  fields: {answer: null, solution: solution, subject: type, level: level}\n"
        "  balance: [subject]\n"
        'prompt: "${question}"\n'
        "grader: math\n"
    )
    config = TrainConfig(
        base_model="gguf:smollm2",
        pool=str(resolve_pool_path("local")),
        data=(DataMix(benchmark=str(bench), limit=14),),
        output_dir=str(tmp_path / "out"),
        template="compact",
    )
    pool = load_train_pool(config)
    rows = build_rows(config, pool, training_conductor(config, pool), rng_seed=0)
    subjects = Counter(json.loads(r["sample"])["metadata"]["subject"] for r in rows)
    assert subjects == dict.fromkeys(MATH_TYPES, 2)
    # Golds are the boxed answers, e.g. "[Algebra 3] What is $5 \times 7$?" -> 35.
    for row in rows:
        question = json.loads(row["sample"])["input"]["question"]
        a, b = (int(x) for x in question.split("$")[1].split(" \\times "))
        assert json.loads(row["gold"]) == str(a * b)
