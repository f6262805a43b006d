"""The paper authors' evaluation sets (math500-paper, mmlu-paper, rlpr-paper, lcb-v6):
their seeded selection, on small files in each dataset's schema, against the library
shuffles the authors called; and the report's paper column, shown beside those sets
only.

The authors' rules (their code, read from the released repository): MATH-500 and
RLPR are cut from ``random.Random(42).shuffle`` of the row positions (test 20%,
validation 20%, training the rest; RLPR after dropping gold answers over 30
characters); MMLU keeps the first 1,531 test rows of ``Dataset.shuffle(seed=42)``;
LiveCodeBench v6 is the whole of test6.jsonl.
"""

from __future__ import annotations

import io
import json
import random
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from conductor.bench.paper import AUTHORS_SETS, paper_note, paper_reference
from conductor.bench.spec import list_benchmarks, load_benchmark, load_benchmark_text, training_spec
from conductor.benchmark import BenchmarkSpec, Selection, lcb_release_files
from conductor.datasets.samples import count_samples, dataset_provenance, iter_samples
from conductor.datasets.selection import part_sizes, selected_positions
from conductor.errors import BenchmarkFileError
from conductor.render.comparison import summary_table
from conductor.render.markdown import markdown_summary
from conductor.runs.config import BenchConfig, BenchmarkInfo, read_run_config
from conductor.runs.summary import RunSummary


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _math500_rows(n: int) -> list[dict[str, Any]]:
    """Rows in HuggingFaceH4/MATH-500's schema (made up problems)."""
    return [
        {
            "problem": f"What is {i} + {i}?",
            "solution": f"It is $\\boxed{{{2 * i}}}$.",
            "answer": str(2 * i),
            "subject": ("Algebra", "Geometry")[i % 2],
            "level": 1 + i % 5,
            "unique_id": f"test/synthetic/{i}.json",
        }
        for i in range(n)
    ]


def _authors_cut(n: int, seed: int = 42) -> dict[str, list[int]]:
    """The authors' three parts of ``n`` positions, as their split helper cuts them."""
    ids = list(range(n))
    random.Random(seed).shuffle(ids)
    n_test, n_valid = int(n * 0.2), int(n * 0.2)
    return {
        "test": ids[:n_test],
        "valid": ids[n_test : n_test + n_valid],
        "train": ids[n_test + n_valid :],
    }


# --------------------------------------------------------------------------- MATH-500


def test_math500_paper_is_the_authors_test_fifth_and_disjoint_from_their_training(
    tmp_path: Path,
) -> None:
    rows = _math500_rows(37)
    data = _jsonl(tmp_path / "math500.jsonl", rows)
    spec = load_benchmark("math500-paper")
    assert (spec.paper_key, spec.paper_set) == ("MATH500", True)
    cut = _authors_cut(len(rows))

    test = [s.id for s in iter_samples(spec, data_file=data)]
    # The same problems as the authors' test part, read in dataset order.
    wanted = sorted(cut["test"])
    assert test == [f"math500-paper/{rows[i]['unique_id']}" for i in wanted]
    assert len(test) == int(37 * 0.2) == 7
    assert count_samples(spec, data_file=data) == 7
    # Deterministic: the same file gives the same part every time.
    assert [s.id for s in iter_samples(spec, data_file=data)] == test

    train_spec = training_spec(spec)
    assert train_spec is not None
    train = [s.id for s in iter_samples(train_spec, data_file=data)]
    assert train == [f"math500-paper/{rows[i]['unique_id']}" for i in sorted(cut["train"])]
    assert len(train) == 37 - 7 - 7
    assert not set(train) & set(test)


def test_the_real_sizes_of_the_python_cut() -> None:
    spec = load_benchmark("math500-paper")
    assert spec.source.select is not None and spec.train_source is not None
    assert part_sizes(spec.source.select, 500) == {"test": 100, "valid": 100, "rest": 300}
    positions = selected_positions(spec.source.select, 500)
    assert positions == _authors_cut(500)["test"]
    train_select = spec.train_source.select
    assert train_select is not None
    assert selected_positions(train_select, 500) == _authors_cut(500)["train"]
    # LiveCodeBench's release_v1 (400 problems) is cut the same way: 240 to train on.
    lcb = load_benchmark("lcb-v6")
    assert lcb.train_source is not None and lcb.train_source.select is not None
    assert part_sizes(lcb.train_source.select, 400)["rest"] == 240


# --------------------------------------------------------------------------- MMLU


def _mmlu_rows(n: int) -> list[dict[str, Any]]:
    """Rows in cais/mmlu's schema (made up questions)."""
    return [
        {
            "question": f"Which number is {i}?",
            "subject": "arithmetic",
            "choices": [str(i), str(i + 1), str(i + 2), str(i + 3)],
            "answer": 0,
        }
        for i in range(n)
    ]


def test_the_numpy_cut_is_what_datasets_shuffle_keeps(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _mmlu_rows(53)
    data = _jsonl(tmp_path / "mmlu.jsonl", rows)
    shipped = load_benchmark("mmlu-paper")
    assert shipped.source.select is not None and shipped.source.select.shuffle == "numpy"
    # The shipped count (1,531) is larger than this file: the same rule, a smaller count.
    select = replace(shipped.source.select, cut=(("test", 11),))
    spec = replace(shipped, source=replace(shipped.source, select=select))

    kept = datasets.Dataset.from_list(rows).shuffle(seed=42).select(range(11))
    ours = [s.input["question"] for s in iter_samples(spec, data_file=data)]
    assert sorted(ours) == sorted(kept["question"])
    assert len(ours) == 11
    # In dataset order.
    assert ours == [r["question"] for r in rows if r["question"] in set(ours)]


def test_mmlu_paper_counts_follow_the_authors_ratios() -> None:
    # The authors' MMLU loader: the largest total the 0.6 / 0.2 / 0.2 ratios allow over
    # auxiliary_train, validation and test, then each split's share of it.
    train, valid, test = 99_842, 1_531, 14_042
    total = min(train / 0.6, valid / 0.2, test / 0.2)
    spec = load_benchmark("mmlu-paper")
    assert spec.source.select is not None and spec.train_source is not None
    assert spec.train_source.select is not None
    assert part_sizes(spec.source.select, test)["test"] == int(total * 0.2) == 1531
    assert part_sizes(spec.train_source.select, train)["train"] == int(total * 0.6) == 4593
    positions = selected_positions(spec.source.select, test)
    assert len(set(positions)) == 1531 and max(positions) < test


# --------------------------------------------------------------------------- RLPR


def _rlpr_row(i: int, gold: str) -> dict[str, Any]:
    """A row in openbmb/RLPR-Train-Dataset's (verl) schema (made up question)."""
    return {
        "data_source": "synthetic",
        "prompt": [
            {"role": "system", "content": "A conversation."},
            {"role": "user", "content": f"Question number {i}?"},
        ],
        "ability": ("physics", "finance")[i % 2],
        "reward_model": {"ground_truth": gold, "style": "rule"},
        "extra_info": {"index": i},
    }


def test_rlpr_paper_cuts_the_rows_left_after_the_answer_filter(tmp_path: Path) -> None:
    rows = []
    for i in range(41):
        if i % 7 == 3:
            gold = "x" * 31  # too long: dropped before the cut
        elif i % 7 == 5:
            gold = " " + "y" * 30  # 31 characters as stored: dropped too
        else:
            gold = str(i)
        rows.append(_rlpr_row(i, gold))
    data = _jsonl(tmp_path / "rlpr.jsonl", rows)
    kept = [i for i, r in enumerate(rows) if len(r["reward_model"]["ground_truth"]) <= 30]
    cut = _authors_cut(len(kept))
    spec = load_benchmark("rlpr-paper")
    assert (spec.paper_key, spec.paper_set) == ("RLPR", True)

    test = [s.input["question"] for s in iter_samples(spec, data_file=data)]
    assert test == [f"Question number {kept[p]}?" for p in sorted(cut["test"])]
    assert len(test) == int(len(kept) * 0.2)
    train_spec = training_spec(spec)
    assert train_spec is not None
    train = [s.input["question"] for s in iter_samples(train_spec, data_file=data)]
    assert train == [f"Question number {kept[p]}?" for p in sorted(cut["train"])]
    assert not set(train) & set(test)


# --------------------------------------------------------------------------- LCB v6


def test_lcb_v6_is_the_whole_sixth_release_file() -> None:
    spec = load_benchmark("lcb-v6")
    assert (spec.paper_key, spec.paper_set) == ("LCB", True)
    assert lcb_release_files(spec.fields["release"]) == ("test6.jsonl",)
    assert spec.source.select is None and spec.filters == {}
    assert spec.train_source is not None
    assert spec.train_source.fields is not None
    assert lcb_release_files(spec.train_source.fields["release"]) == ("test.jsonl",)


def test_a_run_records_its_selection(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "math500.jsonl", _math500_rows(10))
    spec = load_benchmark("math500-paper")
    assert dataset_provenance(spec)["select"] == {
        "shuffle": "python",
        "seed": 42,
        "cut": {"test": 0.2, "valid": 0.2},
        "part": "test",
    }
    assert dataset_provenance(spec, data)["select"]["part"] == "test"
    assert dataset_provenance(load_benchmark("math500"))["select"] is None


# --------------------------------------------------------------------------- the file


_BASE = """\
name: picked
paper_key: MATH500
source:
  file: data.jsonl
  select:
{select}
fields: {{loader: math, question: problem, answer: answer}}
prompt: "${{question}}"
grader: math
"""


def _spec(select: str, extra: str = "") -> BenchmarkSpec:
    text = _BASE.format(select=textwrap.indent(textwrap.dedent(select), "    ")) + extra
    return load_benchmark_text(text, source="picked.yaml")


def test_a_selection_reads_back_as_written() -> None:
    spec = _spec("shuffle: numpy\nseed: 7\ncut: {a: 3, b: 0.5}\npart: rest\n")
    assert spec.source.select == Selection("numpy", 7, (("a", 3), ("b", 0.5)), "rest")
    assert part_sizes(spec.source.select, 10) == {"a": 3, "b": 5, "rest": 2}
    assert not spec.paper_set


@pytest.mark.parametrize(
    ("select", "message"),
    [
        (
            "shuffle: python\nseed: 1\ncut: {a: 0.2}\n",
            r"picked\.yaml:\d+: source\.select needs part",
        ),
        ("shuffle: perl\nseed: 1\ncut: {a: 0.2}\npart: a\n", "source.select.shuffle"),
        ("shuffle: python\nseed: 1\ncut: {a: 1.5}\npart: a\n", r"fraction in \(0, 1\]"),
        ("shuffle: python\nseed: 1\ncut: {a: 0.6, b: 0.6}\npart: a\n", "add up to more than 1"),
        ("shuffle: python\nseed: 1\ncut: {a: 0.2}\npart: b\n", "must be one of a, rest"),
        ("shuffle: python\nseed: 1\ncut: {rest: 0.2}\npart: rest\n", "cannot name a cut part"),
        ("shuffle: python\nseed: 1\ncut: {a: true}\npart: a\n", "a fraction"),
        ("shuffle: python\nseed: 1\ncut: []\npart: a\n", "must map part names to sizes"),
    ],
)
def test_a_bad_selection_is_refused_naming_the_field(select: str, message: str) -> None:
    with pytest.raises(BenchmarkFileError, match=message):
        _spec(select)


def test_paper_set_needs_a_paper_key() -> None:
    text = _BASE.format(select="    shuffle: python\n    seed: 1\n    cut: {a: 0.2}\n    part: a")
    text = text.replace("paper_key: MATH500\n", "paper_set: true\n")
    with pytest.raises(BenchmarkFileError, match="paper_set .* name it with paper_key"):
        load_benchmark_text(text, source="picked.yaml")


# --------------------------------------------------------------------------- the report


def test_the_paper_figures_stand_beside_the_authors_sets_only() -> None:
    for key, name in AUTHORS_SETS.items():
        assert paper_reference(key, "conductor", paper_set=True)
        assert paper_reference(key, "conductor", paper_set=False) == []
        note = paper_note(key, "conductor", paper_set=False)
        assert note is not None and name in note
        assert paper_note(key, "conductor", paper_set=True) is None
    # Whole datasets (out of domain): comparable with any run on them.
    assert paper_reference("GPQA-D", "conductor", paper_set=False)
    assert paper_note("GPQA-D", "conductor", paper_set=False) is None
    # No note where the paper has no figure for the strategy anyway.
    assert paper_note("MATH500", "vote:3:w1", paper_set=False) is None


def test_each_authors_set_is_a_shipped_benchmark_saying_so() -> None:
    names = set(list_benchmarks())
    for key, name in AUTHORS_SETS.items():
        assert name in names
        spec = load_benchmark(name)
        assert (spec.paper_key, spec.paper_set) == (key, True)
    # No other shipped benchmark claims to be one of those sets.
    for name in names - set(AUTHORS_SETS.values()):
        spec = load_benchmark(name)
        assert not (spec.paper_set and spec.paper_key in AUTHORS_SETS), name


def _summary(benchmark: str, paper_set: bool) -> RunSummary:
    return RunSummary(
        run_dir=f"/runs/{benchmark}",
        benchmark=benchmark,
        paper_key="MATH500",
        strategy="conductor",
        pool_name="trio",
        label=benchmark,
        paper_set=paper_set,
        n_samples=2,
        n_records=2,
        accuracy=50.0,
        status_counts={"correct": 1, "incorrect": 1},
    )


def test_the_markdown_report_says_where_the_figures_are() -> None:
    text = markdown_summary([_summary("math500", False), _summary("math500-paper", True)])
    whole, authors = text.split("### math500")[1:]
    assert "another set: benchmark math500-paper" in whole and "99.4" not in whole
    assert "99.4 Conductor (Table 1, unconstrained)" in authors
    assert "another set" not in authors


def test_the_terminal_report_says_where_the_figures_are() -> None:
    def shown(summary: RunSummary) -> str:
        console = Console(width=200, file=io.StringIO(), color_system=None)
        console.print(summary_table([summary]))
        return " ".join(console.file.getvalue().split())  # type: ignore[attr-defined]

    whole = shown(_summary("math500", False))
    assert "another set: benchmark math500-paper" in whole and "99.4" not in whole
    assert "99.4 Conductor" in shown(_summary("math500-paper", True))


def test_the_marker_goes_into_the_run_record_and_reads_back(tmp_path: Path) -> None:
    info = BenchmarkInfo(name="math500-paper", paper_key="MATH500", paper_set=True)
    (tmp_path / "config.json").write_text(BenchConfig(benchmark=info).to_json())
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["benchmark"]["paper_set"] is True
    assert read_run_config(tmp_path).benchmark.paper_set is True
    # A record from before the marker was kept: not the authors' set.
    del data["benchmark"]["paper_set"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert read_run_config(tmp_path).benchmark.paper_set is False


def test_rlpr_paper_scores_the_first_2000_of_the_shuffled_test_part(tmp_path: Path) -> None:
    """The authors' evaluation kept ``dataset.select(range(eval_max_samples))`` (2,000)
    of their test part, which their split helper leaves in the shuffled order: the set
    is the first 2,000 shuffled test positions, not the first 2,000 rows in dataset
    order (what ``--limit 2000`` picks).  Enough rows here for the test part to hold
    more than 2,000; the training part is the authors' rest either way."""
    rows = [_rlpr_row(i, "x" * 31 if i % 50 == 7 else str(i)) for i in range(10_700)]
    data = _jsonl(tmp_path / "rlpr.jsonl", rows)
    # The authors' rule, written from their code: filter, shuffle positions, cut,
    # then the first eval_max_samples of the test part in that order.
    kept = [i for i, r in enumerate(rows) if len(r["reward_model"]["ground_truth"]) <= 30]
    cut = _authors_cut(len(kept))
    assert len(cut["test"]) > 2000
    authors = {f"Question number {kept[p]}?" for p in cut["test"][:2000]}
    spec = load_benchmark("rlpr-paper")
    assert spec.source.select is not None and spec.source.select.take == 2000
    picked = [s.input["question"] for s in iter_samples(spec, data_file=data)]
    assert len(picked) == 2000 and set(picked) == authors
    # Not the first 2,000 of the test part in dataset order (the old reading).
    in_dataset_order = {f"Question number {kept[p]}?" for p in sorted(cut["test"])[:2000]}
    assert set(picked) != in_dataset_order
    train_spec = training_spec(spec)
    assert train_spec is not None and train_spec.source.select is not None
    assert train_spec.source.select.take is None
    train = {s.input["question"] for s in iter_samples(train_spec, data_file=data)}
    assert train == {f"Question number {kept[p]}?" for p in cut["train"]}
    assert dataset_provenance(spec)["select"]["take"] == 2000


def test_take_is_a_count(tmp_path: Path) -> None:
    shipped = load_benchmark("rlpr-paper").path
    assert shipped is not None
    text = Path(shipped).read_text("utf-8").replace("take: 2000", "take: 0")
    with pytest.raises(BenchmarkFileError, match=r"select\.take must be a count"):
        load_benchmark_text(text)
