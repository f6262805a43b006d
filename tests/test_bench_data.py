"""Benchmark data loading over the synthetic fixtures in tests/fixtures/bench/."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import tracemalloc
import zlib
from pathlib import Path

import pytest

from conductor.bench.spec import load_benchmark, load_benchmark_text
from conductor.datasets.loaders import decode_lcb_tests
from conductor.datasets.samples import (
    count_samples,
    dataset_provenance,
    iter_samples,
    render_prompt,
)
from conductor.datasets.sources import DatasetError
from conductor.errors import UsageError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"


def rows(name: str) -> list[dict]:
    with open(FIXTURES / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def samples(name: str, **kw: object) -> list:
    spec = load_benchmark(name)
    return list(iter_samples(spec, data_file=FIXTURES / f"{name}.jsonl", **kw))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- choice


def test_gpqa_ids_gold_and_recorded_permutation() -> None:
    data = rows("gpqa-diamond.jsonl")
    got = samples("gpqa-diamond", seed=3)
    assert [s.id for s in got] == [f"gpqa-diamond/{r['Record ID']}" for r in data]
    for sample, row in zip(got, data, strict=True):
        original = [row["Correct Answer"]] + [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        shuffled = sample.input["choices"]
        assert sorted(shuffled) == sorted(original)
        # The gold letter points at the correct answer after shuffling.
        assert shuffled["ABCD".index(sample.gold)] == row["Correct Answer"]
        perm = sample.metadata["permutation"]
        assert sorted(perm) == [0, 1, 2, 3]
        assert [original[p] for p in perm] == shuffled
        assert sample.metadata["subject"] == row["High-level domain"]
        # The formatted block shows every shuffled option under its letter.
        text = sample.input["choices_text"]
        for letter, option in zip("ABCD", shuffled, strict=True):
            assert letter in text and option in text
        assert text.index(shuffled[0]) < text.index(shuffled[3])


def test_shuffle_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    a = samples("gpqa-diamond", seed=1)
    b = samples("gpqa-diamond", seed=1)
    assert [s.input["choices"] for s in a] == [s.input["choices"] for s in b]
    assert [s.gold for s in a] == [s.gold for s in b]
    orders = {
        tuple(tuple(s.input["choices"]) for s in samples("gpqa-diamond", seed=k)) for k in range(6)
    }
    assert len(orders) > 1
    # Ids never depend on the seed.
    assert [s.id for s in a] == [s.id for s in samples("gpqa-diamond", seed=99)]


def test_mmlu_list_choices_hash_ids_and_duplicates() -> None:
    data = rows("mmlu.jsonl")
    got = samples("mmlu")
    first = hashlib.sha256(data[0]["question"].encode()).hexdigest()[:16]
    assert got[0].id == f"mmlu/{first}"
    # Row 3 repeats row 0's question: it still gets its own stable id.
    assert got[3].id == f"mmlu/{first}-2"
    assert len({s.id for s in got}) == len(got)
    for sample, row in zip(got, data, strict=True):
        correct = row["choices"][row["answer"]]
        assert sample.input["choices"]["ABCD".index(sample.gold)] == correct
        assert sample.metadata["correct_text"] == correct


def test_mmlu_from_csv_and_parquet_match_jsonl(tmp_path: Path) -> None:
    spec = load_benchmark("mmlu")
    want = [
        (s.id, s.gold, s.input["choices"])
        for s in iter_samples(spec, data_file=FIXTURES / "mmlu.jsonl", seed=5)
    ]
    from_csv = [
        (s.id, s.gold, s.input["choices"])
        for s in iter_samples(spec, data_file=FIXTURES / "mmlu.csv", seed=5)
    ]
    assert from_csv == want
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows("mmlu.jsonl"))
    pq.write_table(table, tmp_path / "mmlu.parquet")
    from_parquet = [
        (s.id, s.gold, s.input["choices"])
        for s in iter_samples(spec, data_file=tmp_path / "mmlu.parquet", seed=5)
    ]
    assert from_parquet == want


def test_subject_filter(tmp_path: Path) -> None:
    spec = load_benchmark_text(
        (FIXTURES.parent.parent.parent / "benchmarks" / "mmlu.yaml").read_text()
        + "filters:\n  subjects: [biology]\n",
        source="mmlu.yaml",
    )
    got = list(iter_samples(spec, data_file=FIXTURES / "mmlu.jsonl"))
    assert [s.metadata["subject"] for s in got] == ["biology", "biology"]
    assert count_samples(spec, data_file=FIXTURES / "mmlu.jsonl") == 2


# --------------------------------------------------------------------------- prompts


def test_prompts_keep_dollars_and_braces_in_questions_literal() -> None:
    spec = load_benchmark("gpqa-diamond")
    sample = samples("gpqa-diamond")[1]
    assert "${mass}" in sample.input["question"]
    prompt = render_prompt(spec, sample)
    assert sample.input["question"] in prompt
    assert "$5 per gram" in prompt and "${mass}" in prompt and "{catalyst}" in prompt
    assert sample.input["choices_text"] in prompt
    mmlu = load_benchmark("mmlu")
    tricky = samples("mmlu")[2]
    text = render_prompt(mmlu, tricky)
    assert "A price of $$3 becomes ${x}; what is {y}?" in text
    assert "${3}" in text and "{2}" in text


def test_math_prompt_and_gold() -> None:
    spec = load_benchmark("math500")
    got = samples("math500")
    data = rows("math500.jsonl")
    assert [s.id for s in got] == [f"math500/{r['unique_id']}" for r in data]
    assert [s.gold for s in got] == [r["answer"] for r in data]
    assert got[0].metadata == {"subject": "Algebra", "level": 1}
    prompt = render_prompt(spec, got[0])
    assert "Compute $2^{10} - 24$." in prompt and "\\boxed{}" in prompt


@pytest.mark.parametrize("name", ["aime24", "aime25"])
def test_aime_samples(name: str) -> None:
    got = samples(name)
    data = rows(f"{name}.jsonl")
    assert [s.id for s in got] == [f"{name}/{r['id']}" for r in data]
    assert [s.gold for s in got] == [str(r["answer"]) for r in data]
    assert all(set(s.input) == {"question"} for s in got)


def test_math_level_filter() -> None:
    text = (FIXTURES.parent.parent.parent / "benchmarks" / "math500.yaml").read_text()
    spec = load_benchmark_text(text + "filters:\n  levels: [1, 5]\n", source="m.yaml")
    got = list(iter_samples(spec, data_file=FIXTURES / "math500.jsonl"))
    assert [s.metadata["level"] for s in got] == [1, 1, 5]


# --------------------------------------------------------------------------- code


def test_livecodebench_date_window_and_tests() -> None:
    spec = load_benchmark("livecodebench")
    got = samples("livecodebench")
    # 2023 and 2025-05-02 rows fall outside [2024-08-01, 2025-05-01]; the edge day is in.
    assert [s.id for s in got] == [
        "livecodebench/syn001_a",
        "livecodebench/9001",
        "livecodebench/syn002_b",
    ]
    assert count_samples(spec, data_file=FIXTURES / "livecodebench.jsonl") == 3
    stdin, call, edge = got
    assert stdin.gold is None and stdin.metadata["fn_name"] is None
    assert stdin.metadata["tests"] == [
        {"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"},
        {"input": "1\n5\n", "output": "5\n", "testtype": "stdin"},
        {"input": "4\n-1 1 -1 1\n", "output": "0\n", "testtype": "stdin"},
    ]
    assert stdin.metadata["num_public_tests"] == 1
    assert call.metadata["fn_name"] == "containsValue"
    assert [t["testtype"] for t in call.metadata["tests"]] == ["functional"] * 3
    assert call.metadata["tests"][1] == {
        "input": "[4, 5]\n7",
        "output": "false",
        "testtype": "functional",
    }
    assert call.input["starter_code"].startswith("class Solution:")
    assert "class Solution:" in call.input["starter_code_block"]
    assert "standard input" in stdin.input["starter_code_block"]
    assert edge.metadata["tests"] == [{"input": "", "output": "ok\n", "testtype": "stdin"}]
    prompt = render_prompt(spec, call)
    assert call.input["question"] in prompt and "def containsValue" in prompt


def test_livecodebench_without_date_filter_reads_plain_json_private_tests() -> None:
    text = (FIXTURES.parent.parent.parent / "benchmarks" / "livecodebench.yaml").read_text()
    text = text.replace("contest_date_from: 2024-08-01", "contest_date_from: 2020-01-01")
    # The training window must still end before the (now wider) evaluation window.
    text = text.replace("contest_date_to: 2024-07-31", "contest_date_to: 2019-12-31")
    spec = load_benchmark_text(text, source="lcb.yaml")
    got = list(iter_samples(spec, data_file=FIXTURES / "livecodebench.jsonl"))
    old = [s for s in got if s.id == "livecodebench/1999A"][0]
    assert len(old.metadata["tests"]) == 3


def test_decode_lcb_tests_forms() -> None:
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    encoded = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert decode_lcb_tests(encoded) == tests
    assert decode_lcb_tests(json.dumps(tests)) == tests
    assert decode_lcb_tests("") == []
    with pytest.raises(DatasetError):
        decode_lcb_tests("not base64 at all!")


def test_decode_refuses_pickles_that_load_objects() -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    payload = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(DatasetError, match="refusing"):
        decode_lcb_tests(payload)


def test_bigcodebench_samples() -> None:
    spec = load_benchmark("bigcodebench-hard")
    got = samples("bigcodebench-hard")
    data = rows("bigcodebench-hard.jsonl")
    assert [s.id for s in got] == [f"bigcodebench-hard/{r['task_id']}" for r in data]
    for sample, row in zip(got, data, strict=True):
        assert sample.input["question"] == row["complete_prompt"]
        assert sample.metadata["test"] == row["test"]
        assert sample.metadata["entry_point"] == "task_func"
        assert sample.gold is None
    assert got[0].metadata["libs"] == ["math"]
    prompt = render_prompt(spec, got[1])
    assert "${price}" in prompt and "'{x} $5'" in prompt


def test_bigcodebench_instruct_variant() -> None:
    text = (FIXTURES.parent.parent.parent / "benchmarks" / "bigcodebench-hard.yaml").read_text()
    spec = load_benchmark_text(
        text.replace("question: complete_prompt", "question: instruct_prompt"), source="b.yaml"
    )
    first = next(iter_samples(spec, data_file=FIXTURES / "bigcodebench-hard.jsonl"))
    assert first.input["question"].startswith("Write a function task_func")


# --------------------------------------------------------------------------- streaming


def test_limit_stops_early() -> None:
    assert len(samples("math500", limit=2)) == 2
    assert samples("math500", limit=0) == []
    spec = load_benchmark("math500")
    assert count_samples(spec, data_file=FIXTURES / "math500.jsonl", limit=3) == 3
    assert count_samples(spec, data_file=FIXTURES / "math500.jsonl") == 5


def _big_file(path: Path, n: int) -> None:
    filler = "x" * 800
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"problem": f"Q{i} {filler}", "answer": str(i)}) + "\n")


def test_iteration_is_lazy_on_a_large_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    _big_file(path, 10_000)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("{this line is broken\n")
    spec = load_benchmark_text(
        "source: {file: x.jsonl}\ngrader: math\nprompt: '${question}'\n", source="big.yaml"
    )
    it = iter_samples(spec, data_file=path)
    # The first sample comes out although the file's last line is not even valid JSON.
    first = next(it)
    assert first.gold == "0"
    with pytest.raises(UsageError, match=r"big.jsonl:10001: not valid JSON"):
        for _ in it:
            pass


@pytest.mark.long
def test_memory_stays_small_over_ten_thousand_samples(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    _big_file(path, 10_000)  # about 8.5 MB
    spec = load_benchmark_text(
        "source: {file: x.jsonl}\ngrader: math\nprompt: '${question}'\n", source="big.yaml"
    )
    tracemalloc.start()
    try:
        count = 0
        for sample in iter_samples(spec, data_file=path):
            count += 1
            render_prompt(spec, sample)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 10_000
    assert path.stat().st_size > 8_000_000
    assert peak < 3_000_000, peak


# --------------------------------------------------------------------------- provenance


def test_provenance_of_a_local_file() -> None:
    spec = load_benchmark("gpqa-diamond")
    data = FIXTURES / "gpqa-diamond.jsonl"
    prov = dataset_provenance(spec, data)
    assert prov["file_sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert prov["file"] == str(data.resolve())
    assert prov["template_sha256"] == hashlib.sha256(spec.prompt.encode()).hexdigest()
    assert prov["benchmark"] == "gpqa-diamond" and prov["loader"] == "choice"
    assert (
        prov["benchmark_file_sha256"]
        == hashlib.sha256(Path(spec.path or "").read_bytes()).hexdigest()
    )
    json.dumps(prov)  # record-ready


def test_provenance_of_the_hf_source() -> None:
    spec = load_benchmark("math500")
    prov = dataset_provenance(spec)
    assert prov["dataset_id"] == "HuggingFaceH4/MATH-500"
    assert prov["revision"] == "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"
    assert prov["pinned"] is True and prov["split"] == "test"
    assert prov["file_sha256"] is None
    lcb = dataset_provenance(load_benchmark("livecodebench"))
    assert lcb["pinned"] is True and lcb["release"] == "release_v6"
    assert lcb["release_files"][-1] == "test6.jsonl"


def test_url_source_downloads_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(tmp_path / "data"))
    url = (FIXTURES / "aime25.jsonl").resolve().as_uri()
    spec = load_benchmark_text(
        f"source: {{url: '{url}'}}\ngrader: math\nprompt: '${{question}}'\nfields: {{id: id}}\n",
        source="u.yaml",
    )
    got = list(iter_samples(spec))
    assert [s.gold for s in got] == ["11", "1", "210", "13"]
    prov = dataset_provenance(spec)
    assert prov["url"] == url
    assert (
        prov["file_sha256"] == hashlib.sha256((FIXTURES / "aime25.jsonl").read_bytes()).hexdigest()
    )


def test_missing_column_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    spec = load_benchmark("math500")
    with pytest.raises(DatasetError, match="no column 'problem'"):
        list(iter_samples(spec, data_file=path))


@pytest.mark.parametrize("count", [False, True], ids=["iter", "count"])
def test_missing_column_names_the_row_and_the_columns_found(tmp_path: Path, count: bool) -> None:
    path = tmp_path / "d.jsonl"
    good = {"problem": "What is 1+1?", "answer": "2"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"problem": "q", "gold": "1"}) + "\n")
    spec = load_benchmark("math500")
    read = count_samples if count else (lambda spec, **kw: list(iter_samples(spec, **kw)))
    # Bad input (exit 2), found before any sample of a bench runs: counting checks rows.
    with pytest.raises(UsageError) as info:
        read(spec, data_file=path)
    assert isinstance(info.value, DatasetError)
    assert str(info.value).startswith(f"{path}:3: ")
    assert "no column 'answer' (it has: gold, problem)" in str(info.value)


def _latin1(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("latin-1"))
    return path


def test_data_files_that_are_not_utf8_are_refused_with_their_line(tmp_path: Path) -> None:
    spec = load_benchmark("math500")
    ok = json.dumps({"problem": "fine", "answer": "1"})
    jsonl = _latin1(tmp_path / "d.jsonl", ok + "\n" + '{"problem": "caf\u00e9", "answer": "1"}\n')
    with pytest.raises(UsageError, match=r"d.jsonl:2: is not UTF-8 text \(byte 0xe9"):
        count_samples(spec, data_file=jsonl)
    csv_file = _latin1(tmp_path / "d.csv", "problem,answer\nfine,1\ncaf\u00e9,2\n")
    with pytest.raises(UsageError, match=r"d.csv:\d+: is not UTF-8 text"):
        list(iter_samples(spec, data_file=csv_file))
    json_file = _latin1(tmp_path / "d.json", '[{"problem": "caf\u00e9", "answer": "1"}]')
    with pytest.raises(UsageError, match=r"d.json:1: is not UTF-8 text"):
        list(iter_samples(spec, data_file=json_file))


def test_a_question_over_the_limit_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_MAX_QUESTION_CHARS", "50")
    path = tmp_path / "d.jsonl"
    rows_ = [{"problem": "short", "answer": "1"}, {"problem": "x" * 51, "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    spec = load_benchmark("math500")
    with pytest.raises(UsageError, match=r"d.jsonl:2: the question is 51 characters long"):
        count_samples(spec, data_file=path)
    monkeypatch.setenv("CONDUCTOR_MAX_QUESTION_CHARS", "51")
    assert count_samples(spec, data_file=path) == 2
    monkeypatch.setenv("CONDUCTOR_MAX_QUESTION_CHARS", "lots")
    with pytest.raises(UsageError, match="CONDUCTOR_MAX_QUESTION_CHARS"):
        count_samples(spec, data_file=path)


def test_the_default_question_limit_is_documented() -> None:
    from conductor.text import MAX_QUESTION_CHARS, check_question

    check_question("x" * MAX_QUESTION_CHARS)
    with pytest.raises(UsageError, match="over the limit of 1,000,000"):
        check_question("x" * (MAX_QUESTION_CHARS + 1))


def test_a_lone_surrogate_in_a_question_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "bad \\ud800 text", "answer": "1"}\n')
    with pytest.raises(UsageError, match=r"d.jsonl:1: the question holds a lone surrogate"):
        count_samples(load_benchmark("math500"), data_file=path)


def test_a_huge_line_is_refused_without_being_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conductor.datasets import samples as data_mod

    monkeypatch.setattr(data_mod, "MAX_ROW_BYTES", 100_000)
    path = tmp_path / "d.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"problem": "fine", "answer": "1"}) + "\n")
        fh.write(json.dumps({"problem": "x" * 20_000_000, "answer": "1"}) + "\n")
    spec = load_benchmark("math500")
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match=r"d.jsonl:2: the line is longer than 100,000 bytes"):
            count_samples(spec, data_file=path)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, peak  # a 20 MB line, never held


def test_livecodebench_rows_have_no_line_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conductor.datasets import samples as data_mod

    # Their test cases make LiveCodeBench rows large; only the question is limited.
    monkeypatch.setattr(data_mod, "MAX_ROW_BYTES", 100)
    spec = load_benchmark("livecodebench")
    assert count_samples(spec, data_file=FIXTURES / "livecodebench.jsonl") > 0


def test_missing_data_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such data file"):
        list(iter_samples(load_benchmark("math500"), data_file=tmp_path / "nope.jsonl"))


def test_a_huge_csv_cell_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.datasets import samples as data_mod

    monkeypatch.setattr(data_mod, "MAX_ROW_BYTES", 1000)
    path = tmp_path / "d.csv"
    path.write_text("problem,answer\nfine,1\n" + "x" * 5000 + ",2\n", encoding="utf-8")
    # The line is over the bound before the csv module sees the cell.
    with pytest.raises(UsageError, match=r"d.csv:3: the line is longer than 1,000 bytes"):
        count_samples(load_benchmark("math500"), data_file=path)
    # A quoted cell over many short lines is refused by the csv module's own bound.
    path.write_text('problem,answer\nfine,1\n"' + "x\n" * 2500 + '",2\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"d.csv:\d+: not valid CSV \(field larger than"):
        count_samples(load_benchmark("math500"), data_file=path)
