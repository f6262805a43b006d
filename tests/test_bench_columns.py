"""What a `--data` file needs per benchmark: data_columns, the loaders that follow it,
and the README's table generated from the benchmark files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled

from conductor.bench.spec import (
    builtin_benchmarks_dir,
    data_columns_table,
    list_benchmarks,
    load_benchmark,
    load_benchmark_text,
    training_spec,
)
from conductor.datasets.columns import data_columns
from conductor.datasets.samples import iter_samples
from conductor.datasets.sources import DataFileError

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_table_is_the_one_the_benchmark_files_give() -> None:
    table = data_columns_table()
    assert table in README.read_text(encoding="utf-8"), (
        "README.md's --data table is out of date; regenerate it with "
        "`python -m conductor.bench.spec --readme-table`"
    )
    # One row per benchmark file, whatever files there are.
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list_benchmarks()


@pytest.mark.process
def test_the_table_command_prints_the_table() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "conductor.bench.spec", "--readme-table"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == data_columns_table()


def test_a_new_benchmark_file_gets_its_row(tmp_path: Path) -> None:
    for name in ("math500", "mmlu"):
        (tmp_path / f"{name}.yaml").write_text(
            (builtin_benchmarks_dir() / f"{name}.yaml").read_text()
        )
    (tmp_path / "smoke.yaml").write_text(
        "source: {file: smoke.jsonl}\n"
        "fields: {question: q, answer: a, id: qid, metadata: 'kind, source'}\n"
        "prompt: ${question}\n"
        "grader: math\n"
    )
    rows = [line for line in data_columns_table(tmp_path).splitlines() if line.startswith("| `")]
    assert rows == [
        "| `math500` | `problem`, `answer` | `unique_id`, `subject`, `level` |",
        "| `mmlu` | `question`, `choices`, `answer` | `subject` |",
        "| `smoke` | `q`, `a` | `qid`, `kind`, `source` |",
    ]


def test_columns_follow_each_layout() -> None:
    gpqa = data_columns(load_benchmark("gpqa-diamond"))
    assert gpqa.required == (
        "Question",
        "Correct Answer",
        "Incorrect Answer 1",
        "Incorrect Answer 2",
        "Incorrect Answer 3",
    )
    assert gpqa.optional == ("Record ID", "High-level domain")
    rlpr = data_columns(load_benchmark("rlpr"))
    assert rlpr.required == ("prompt[role=user].content", "reward_model.ground_truth")
    # The contest-date window filters every row, so its column is required.
    lcb = data_columns(load_benchmark("livecodebench"))
    assert lcb.required == ("question_content", "contest_date")
    assert "contest_date" not in lcb.optional and "public_test_cases" in lcb.optional
    # MATH's training split has no answer column: its solution is required instead.
    train = training_spec(load_benchmark("math500"))
    assert train is not None
    assert data_columns(train).required == ("problem", "solution")
    assert data_columns(train).optional == ("type", "level")
    assert data_columns(train).describe() == "columns problem, solution (optional: type, level)"


def test_a_pipe_in_a_column_name_does_not_break_the_table(tmp_path: Path) -> None:
    (tmp_path / "odd.yaml").write_text(
        "source: {file: x.jsonl}\nfields: {question: 'a|b', answer: ans}\n"
        "prompt: ${question}\ngrader: math\n"
    )
    row = data_columns_table(tmp_path).splitlines()[-1]
    assert row == "| `odd` | `a\\|b`, `ans` | - |"


# -------------------------------------------------------- the loaders agree with it


def _value(key: str | None, loader: str) -> Any:
    if key == "choices":
        return ["one", "two", "three"]
    if key == "answer":
        return 1 if loader == "choice" else "2"
    if key == "date":
        return "2024-09-01"  # inside livecodebench's window
    if key == "question":
        return "What is 1 + 1?"
    return "text"


def _put(row: dict[str, Any], column: str, value: Any) -> None:
    """Set ``column`` in ``row``, building the nesting a path such as
    ``prompt[role=user].content`` or ``reward_model.ground_truth`` names."""
    steps = re.findall(r"\[([^=\]]+)=([^\]]*)\]|\.?([^.\[\]]+)", column)
    target: Any = row
    for i, (attr, wanted, key) in enumerate(steps):
        last = i == len(steps) - 1
        if key:
            if last:
                target[key] = value
            else:
                nxt = steps[i + 1]
                target = target.setdefault(key, [] if nxt[0] else {})
        else:
            item = {attr: wanted}
            target.append(item)
            target = item


def _minimal_row(name: str) -> tuple[Any, dict[str, Any]]:
    spec = load_benchmark(name)
    # A one-row file has no seeded part to select (a fifth of one row is none).
    spec = replace(spec, source=replace(spec.source, select=None))
    by_column = {v: k for k, v in spec.fields.items()}
    loader = spec.fields["loader"]
    row: dict[str, Any] = {}
    for column in data_columns(spec).required:
        _put(row, column, _value(by_column.get(column), loader))
    return spec, row


@pytest.mark.parametrize("name", list_benchmarks())
def test_a_row_with_only_the_required_columns_loads(tmp_path: Path, name: str) -> None:
    spec, row = _minimal_row(name)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(row) + "\n")
    samples = list(iter_samples(spec, data_file=data))
    assert len(samples) == 1
    assert samples[0].input["question"] == "What is 1 + 1?"


@pytest.mark.parametrize("name", list_benchmarks())
def test_a_row_without_a_required_column_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    spec = load_benchmark(name)
    required = data_columns(spec).required
    # Every benchmark reads a question from some column: a test over none checks nothing.
    assert required, f"{name} requires no column"
    for column in required:
        _, row = _minimal_row(name)
        top = re.split(r"[.\[]", column, maxsplit=1)[0]
        del row[top]
        data = tmp_path / "data.jsonl"
        data.write_text(json.dumps(row) + "\n")
        with pytest.raises(DataFileError, match=re.escape(f"no column {column!r}")) as info:
            list(iter_samples(spec, data_file=data))
        assert data_columns(spec).describe() in str(info.value)


def test_spec_text_without_file_loads_for_columns() -> None:
    spec = load_benchmark_text(
        "source: {file: x.csv}\nfields: {question: Q, correct: C, incorrect_2: I2, "
        "incorrect_1: I1, subject: S}\nprompt: ${question} ${choices_text}\ngrader: choice\n"
    )
    columns = data_columns(spec)
    assert columns.required == ("Q", "C", "I1", "I2")
    assert columns.optional == ("S",)
