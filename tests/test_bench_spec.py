"""Benchmark files: the shipped ones load, and bad ones fail with FILE:LINE errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conductor.bench.schema import template_placeholders
from conductor.bench.spec import (
    builtin_benchmarks_dir,
    list_benchmarks,
    load_benchmark,
    load_benchmark_text,
)
from conductor.benchmark import is_pinned, lcb_release_files
from conductor.errors import BenchmarkFileError, UsageError

SHIPPED = [
    "aime24",
    "aime25",
    "bigcodebench-hard",
    "gpqa-diamond",
    "lcb-v6",
    "livecodebench",
    "math500",
    "math500-paper",
    "mmlu",
    "mmlu-paper",
    "rlpr",
    "rlpr-paper",
    "smoke",
    "smoke-route",
]
PAPER_KEYS = {
    "gpqa-diamond": "GPQA-D",
    "math500": "MATH500",
    "math500-paper": "MATH500",
    "aime25": "AIME25",
    "mmlu": "MMLU",
    "mmlu-paper": "MMLU",
    "livecodebench": "LCB",
    "lcb-v6": "LCB",
    "rlpr-paper": "RLPR",
    "bigcodebench-hard": "BCB",
}


def test_list_benchmarks_names_every_shipped_file() -> None:
    assert list_benchmarks() == SHIPPED


def test_package_symlink_points_at_the_repository_folder() -> None:
    link = Path(__file__).resolve().parent.parent / "src" / "conductor" / "benchmarks"
    assert link.is_symlink()
    assert (link / "gpqa-diamond.yaml").is_file()
    assert builtin_benchmarks_dir().resolve() == link.resolve()


# Every benchmark but smoke and smoke-route, whose questions ship as local files
# (tests/test_smoke.py, tests/test_router.py).
@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in ("smoke", "smoke-route")])
def test_every_shipped_benchmark_loads(name: str) -> None:
    spec = load_benchmark(name)
    assert spec.name == name
    assert spec.path is not None and spec.path.name == f"{name}.yaml"
    assert spec.source.kind == "hf" and spec.source.id and spec.source.revision
    assert spec.grader in ("choice", "math", "code")
    assert spec.prompt.strip()
    if name in PAPER_KEYS:
        assert spec.paper_key == PAPER_KEYS[name]
    # Every source is pinned to a full commit SHA (each file's comment says where from).
    assert is_pinned(spec.source)
    if spec.train_source is not None:
        assert spec.train_source.kind == "hf" and spec.train_source.revision
        assert is_pinned(spec.train_source)
        assert spec.train_source.fields is not None and spec.train_source.filters is not None


def test_shipped_specs_carry_kind_specific_settings() -> None:
    gpqa = load_benchmark("gpqa-diamond")
    assert gpqa.source.config == "gpqa_diamond" and gpqa.source.split == "train"
    assert gpqa.fields["correct"] == "Correct Answer"
    assert gpqa.answer_format == "letter"
    lcb = load_benchmark("livecodebench")
    assert lcb.fields["release"] == "release_v6"
    assert lcb.filters == {"contest_date_from": "2024-08-01", "contest_date_to": "2025-05-01"}
    bcb = load_benchmark("bigcodebench-hard")
    assert bcb.source.split == "v0.1.4" and bcb.fields["question"] == "complete_prompt"


def test_load_by_path_and_relative_file_source(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    path = tmp_path / "mine.yaml"
    path.write_text(
        "source: {file: data/items.jsonl}\nprompt: 'Q: ${question}'\ngrader: math\n",
        encoding="utf-8",
    )
    spec = load_benchmark(str(path))
    assert spec.name == "mine"
    assert spec.source.kind == "file"
    assert Path(spec.source.path or "") == tmp_path / "data" / "items.jsonl"
    assert spec.fields["loader"] == "math" and spec.answer_format == "math"


def test_unknown_benchmark_name_suggests_a_close_one() -> None:
    with pytest.raises(UsageError, match=r'did you mean "gpqa-diamond"'):
        load_benchmark("gpqa-diamnd")


def test_release_files() -> None:
    assert lcb_release_files("release_v1") == ("test.jsonl",)
    assert lcb_release_files("release_v3") == ("test.jsonl", "test2.jsonl", "test3.jsonl")
    assert lcb_release_files("v6") == ("test6.jsonl",)
    assert len(lcb_release_files("release_latest") or ()) == 6
    assert lcb_release_files("release_v9") is None


def test_template_placeholders() -> None:
    assert template_placeholders("${question} $$5 $choices_text ${question}") == [
        "question",
        "choices_text",
    ]


GOOD_HEAD = "source:\n  hf: org/data\n  revision: main\n"

# (YAML text, expected line, text the message must contain)
BAD_CASES = [
    ("", 1, "empty"),
    ("- a\n- b\n", 1, "top level must be a mapping"),
    (GOOD_HEAD + "prompt: x\n", 1, 'missing required key "grader"'),
    (GOOD_HEAD + "prompt: x\ngrader: math\nepochz: 2\n", 6, 'did you mean "epochs"'),
    (GOOD_HEAD + "prompt: x\ngrader: maths\n", 5, 'did you mean "math"'),
    ("source:\n  hf: org/data\nprompt: x\ngrader: math\n", 2, "needs a revision"),
    (
        "source:\n  hf: org/data\n  file: a.jsonl\n  revision: main\nprompt: x\ngrader: math\n",
        2,
        "exactly one of hf, url or file",
    ),
    ("source: {file: data.txt}\nprompt: x\ngrader: math\n", 1, ".jsonl, .json, .csv"),
    ("source: {hf: nodash, revision: main}\nprompt: x\ngrader: math\n", 1, "org/name"),
    (
        GOOD_HEAD + "prompt: |\n  Solve:\n  ${problem}\ngrader: math\n",
        6,
        "${problem}, which the math loader does not give",
    ),
    (GOOD_HEAD + "prompt: |\n  Costs 5$ each\n  ${question}\ngrader: math\n", 5, "$$"),
    (GOOD_HEAD + "prompt: x\ngrader: math\nepochs: 0\n", 6, "an integer from 1 to 1,000"),
    (GOOD_HEAD + "prompt: x\ngrader: math\nfields:\n  questoin: q\n", 7, 'did you mean "question"'),
    (GOOD_HEAD + "prompt: x\ngrader: choice\nfields:\n  question: q\n", 7, "where the options are"),
    (GOOD_HEAD + "prompt: x\ngrader: choice\nfields:\n  choices: c\n", 7, "needs answer"),
    (GOOD_HEAD + "prompt: x\ngrader: code\n", 1, "fields.loader"),
    (
        GOOD_HEAD + "prompt: x\ngrader: code\nfields:\n  loader: livecodebench\n"
        "  release: release_v9\n",
        8,
        "release_v1 .. release_v6",
    ),
    (
        GOOD_HEAD + "prompt: x\ngrader: code\nfields: {loader: livecodebench}\n"
        "filters:\n  contest_date_from: Aug 2024\n",
        8,
        "YYYY-MM-DD",
    ),
    (
        GOOD_HEAD + "prompt: x\ngrader: code\nfields: {loader: livecodebench}\n"
        "filters:\n  contest_date_from: 2025-01-01\n  contest_date_to: 2024-01-01\n",
        8,
        "after contest_date_to",
    ),
    (
        GOOD_HEAD + "prompt: x\ngrader: math\nfilters:\n  subjects: [Algebra]\n",
        7,
        "needs fields.subject",
    ),
    (GOOD_HEAD + "prompt: x\ngrader: math\nfilters:\n  dates: []\n", 7, "unknown key"),
    (GOOD_HEAD + "prompt: x\ngrader: math\nname: a b\n", 6, "name may hold only"),
    (GOOD_HEAD + "prompt: [x\n", 5, "invalid YAML"),
    (GOOD_HEAD + "prompt: x\ngrader: math\nprompt: y\n", 6, "appears twice"),
    (
        GOOD_HEAD + "prompt: x\ngrader: choice\nanswer_format: math\n"
        "fields: {choices: c, answer: a}\n",
        6,
        "answer_format must be letter",
    ),
]


@pytest.mark.parametrize(("text", "line", "needle"), BAD_CASES)
def test_bad_benchmark_files_name_file_and_line(
    tmp_path: Path, text: str, line: int, needle: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BenchmarkFileError) as info:
        load_benchmark(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message, message
    assert isinstance(info.value, UsageError)


def test_block_prompt_error_points_at_the_line_inside_the_block() -> None:
    text = textwrap.dedent(
        """\
        source: {hf: org/data, revision: main}
        grader: math
        prompt: |
          line one
          line two
          ${nope}
        """
    )
    with pytest.raises(BenchmarkFileError, match=r"^x.yaml:6: "):
        load_benchmark_text(text, source="x.yaml")


def test_environment_style_placeholders_are_not_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("question", "FROM THE ENVIRONMENT")
    spec = load_benchmark_text(
        "source: {hf: org/data, revision: main}\ngrader: math\nprompt: 'Q: ${question}'\n"
    )
    assert spec.prompt == "Q: ${question}"
