"""Held-out questions: the training guard, the hashes a checkpoint keeps, and `bench`
counting or excluding the samples a Conductor was trained on.

Question identity is tested directly (normalisation, options in any order); the guard
through :func:`check_training_data` and through ``conductor train`` in a subprocess
(exit 2 before any model is loaded); the bench side through the real CLI with a tiny
checkpoint Conductor (built here, nothing downloaded) over workers on the fake server.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.poolkit import pool_dict, run_cli, worker, write_pool

from conductor.bench.trained import TrainedQuestions, trained_questions_of
from conductor.conductors.checkpoint import (
    META_FILE,
    TRAINING_QUESTIONS_FILE,
    read_training_guard,
    read_training_questions,
    write_training_questions,
)
from conductor.datasets.questions import (
    NORMALISATION,
    NORMALISATION_V1,
    normalise_question,
    question_key,
    sample_key,
)
from conductor.errors import TrainConfigError, UsageError
from conductor.grading.types import Sample
from conductor.testing import FakeLLMServer
from conductor.train.config import load_train_config
from conductor.train.contamination import (
    ContaminationError,
    HoldoutUnavailableError,
    check_training_data,
)
from conductor.train.settings import HoldoutSet, NgramSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
PAIRS = json.loads(
    (Path(__file__).resolve().parent / "cases" / "question_pairs.json").read_text("utf-8")
)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _arith(directory: Path, eval_rows: list[dict[str, Any]]) -> Path:
    """A math benchmark whose evaluation split is the local file ``eval.jsonl``."""
    _jsonl(directory / "eval.jsonl", eval_rows)
    path = directory / "arith.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "arith",
                "source": {"file": "eval.jsonl"},
                "fields": {
                    "loader": "math",
                    "question": "question",
                    "answer": "answer",
                    "id": "id",
                },
                "prompt": "${question}",
                "answer_format": "math",
                "grader": "math",
            }
        )
    )
    return path


def _config(directory: Path, body: dict[str, Any], *, pool: str = "local") -> Path:
    data = {"base_model": "org/model", "pool": pool, "output_dir": str(directory / "out")}
    path = directory / "train.yaml"
    path.write_text(yaml.safe_dump({**data, **body}, sort_keys=False))
    return path


def _q(i: int) -> dict[str, Any]:
    return {"question": f"What is {i} + 0?", "answer": str(i)}


# -- question identity ------------------------------------------------------------------


def test_normalisation_ignores_formatting_but_not_content() -> None:
    base = normalise_question(r"Find $\frac{1}{2} + x$ when $x = 3$.")
    same = [
        r"find \( \dfrac{1}{2}+x \) when \(x=3\).",  # delimiters, \dfrac, spacing, case
        "Find  $\\frac{1}{2}\\,+\\;x$\nwhen $x = 3$.",  # LaTeX spacing, a line break
        "Ｆｉｎｄ $\\frac{1}{2} + x$ when $x = 3$.",  # full-width letters (NFKC)
        "Find $\\displaystyle\\frac{1}{2} + x$ when\u200b $x\u00a0=\u00a03$.",
    ]
    for text in same:
        assert normalise_question(text) == base, text
    for other in (r"Find $\frac{1}{3} + x$ when $x = 3$.", r"Find $\frac{1}{2} - x$."):
        assert normalise_question(other) != base
    assert normalise_question(r"$\left(x+1\right)^2$") == normalise_question("(x + 1)^2")
    # \right stays where it is the start of another command.
    assert normalise_question(r"$a \rightarrow b$") != normalise_question("$a b$")


def _pair_key(side: str | list[Any]) -> str:
    """The key of one side of a pair in cases/question_pairs.json: a question, or a
    question and its choices (a list or a mapping)."""
    if isinstance(side, list):
        return question_key(side[0], side[1]).full
    return question_key(side).full


def test_the_pair_corpus_is_large_enough() -> None:
    # The measurement: 13 of 23 reformatted pairs were missed.  The corpus keeps
    # at least 30 of each kind, so that a rule that merges too much shows up.
    assert len(PAIRS["same"]) >= 30 and len(PAIRS["different"]) >= 30
    assert len({p["kind"] for p in PAIRS["same"] + PAIRS["different"]}) == len(PAIRS["same"]) + len(
        PAIRS["different"]
    )


@pytest.mark.parametrize("pair", PAIRS["same"], ids=lambda p: p["kind"])
def test_one_question_written_two_ways_has_one_key(pair: dict[str, Any]) -> None:
    assert _pair_key(pair["a"]) == _pair_key(pair["b"])


@pytest.mark.parametrize("pair", PAIRS["different"], ids=lambda p: p["kind"])
def test_two_questions_from_one_template_keep_two_keys(pair: dict[str, Any]) -> None:
    assert _pair_key(pair["a"]) != _pair_key(pair["b"])


def test_instructions_are_dropped_only_around_a_question() -> None:
    # A question that is nothing but an instruction-looking sentence stays as it is.
    assert normalise_question("Answer:") == "answer:"
    assert normalise_question("Let's think step by step.") == "let'sthinkstepbystep."
    # A suffix is whole words: "reanswer:" is not "answer:".
    assert normalise_question("Who must reanswer:") == "whomustreanswer:"
    assert normalise_question("Who must answer? Answer:") == "whomustanswer?"
    # Inside the question the same words are content.
    inside = "Put your final answer within \\boxed{} and explain why 2 + 2 = 4."
    assert "boxed" in normalise_question(inside)


def test_v1_checkpoints_are_still_compared_with_v1_keys() -> None:
    """A checkpoint recorded before v2 keeps its v1 hashes: bench compares a sample with
    them by v1's normalisation (v2 would give another hash for the same question)."""
    import hashlib

    question = r"Find $\frac{1}{2}x$. Put your final answer within \boxed{}."
    v1 = hashlib.sha256(rb"find\frac{1}{2}x.putyourfinalanswerwithin\boxed{}.").hexdigest()
    sample = Sample("arith/1", {"question": question}, "1")
    assert sample_key(sample).full != v1
    old = TrainedQuestions(source="ckpt", hashes=frozenset({v1}), normalisation=NORMALISATION_V1)
    assert old.contains(sample)
    assert not old.contains(Sample("arith/2", {"question": "Find x."}, "1"))
    new = TrainedQuestions(source="ckpt", hashes=frozenset({sample_key(sample).full}))
    assert new.contains(sample) and new.normalisation == NORMALISATION


def test_keys_cover_options_in_any_order() -> None:
    stem = "Which of the following is true?"
    a = question_key(stem, ["Paris is in France", "2 + 2 = 5"])
    assert a == question_key("which of the following is TRUE?", ["2 + 2 = 5", "Paris is in France"])
    assert a.full != question_key(stem, ["The sun is cold", "2 + 2 = 5"]).full
    assert a.text == question_key(stem).text == question_key(stem).full
    assert len(a.full) == 64 and all(c in "0123456789abcdef" for c in a.full)
    # A benchmark sample's options are whatever order its seed shuffled them into.
    one = Sample("m/1", {"question": stem, "choices": ["x", "y", "z"]}, "A")
    two = Sample("m/2", {"question": stem, "choices": ["z", "x", "y"]}, "B")
    assert sample_key(one) == sample_key(two)
    assert sample_key(Sample("m/3", {"question": stem}, "1")).full == a.text


# -- the config keys --------------------------------------------------------------------


def test_holdout_entries_parse(tmp_path: Path) -> None:
    plain = _jsonl(tmp_path / "secret.jsonl", [{"question": "q"}])
    arith = _arith(tmp_path, [_q(0)])
    config = load_train_config(
        _config(
            tmp_path,
            {
                # arith has no train_source: its test split is named outright.
                "data": [{"benchmark": "arith.yaml", "split": "test"}],
                "holdout": [
                    "gpqa-diamond",
                    "secret.jsonl",
                    {"benchmark": "mmlu", "file": str(FIXTURES / "mmlu.jsonl")},
                    {"file": "secret.jsonl"},
                    "arith.yaml",
                ],
                "allow_holdout_overlap": True,
            },
        )
    )
    assert config.holdout == (
        HoldoutSet(benchmark="gpqa-diamond"),
        HoldoutSet(file=str(plain.resolve())),
        HoldoutSet(benchmark="mmlu", file=str(FIXTURES / "mmlu.jsonl")),
        HoldoutSet(file=str(plain.resolve())),
        HoldoutSet(benchmark=str(arith.resolve())),
    )
    assert config.allow_holdout_overlap is True
    assert load_train_config(_config(tmp_path, {"data": ["math500"]})).holdout == ()


@pytest.mark.parametrize(
    ("holdout", "needle"),
    [
        (["missing.jsonl"], "holdout[0]: no such file"),
        (["gpqa-diamnd"], 'did you mean "gpqa-diamond"'),
        ([{"benchmark": "mmlu", "file": "nope.csv"}], "holdout[0].file: no such file"),
        ([{}], "holdout[0] needs a benchmark or a file"),
        ([{"benchmark": "mmlu", "split": "test"}], "holdout[0]"),
        ("gpqa-diamond", "holdout must be a list"),
    ],
)
def test_bad_holdout_names_the_entry(tmp_path: Path, holdout: Any, needle: str) -> None:
    path = _config(tmp_path, {"data": ["math500"], "holdout": holdout})
    with pytest.raises(TrainConfigError) as info:
        load_train_config(path)
    assert str(info.value).startswith(f"{path}:") and needle in str(info.value)


# -- the guard --------------------------------------------------------------------------


def test_training_on_evaluation_questions_stops_with_count_and_examples(tmp_path: Path) -> None:
    long = "What is 5 + 0? " + "Think about it carefully. " * 10
    _arith(tmp_path, [{"question": long, "answer": "5"}, _q(1), _q(2), _q(3), _q(4)])
    # The same questions, formatted differently, plus two that are not held out.
    train = [
        {"question": "what is 1+0 ?", "answer": "1"},
        {"question": "WHAT IS 2 + 0?", "answer": "2"},
        {"question": "  What is\n3 + 0?", "answer": "3"},
        {"question": long.replace(" ", "  "), "answer": "5"},
        _q(7),
        _q(8),
    ]
    _jsonl(tmp_path / "train.jsonl", train)
    path = _config(tmp_path, {"data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}]})
    with pytest.raises(ContaminationError) as info:
        check_training_data(load_train_config(path))
    message = str(info.value)
    assert isinstance(info.value, UsageError)  # exit code 2
    assert message.startswith(f"{path.resolve()}: 4 training questions are also held out")
    assert "4 in arith evaluation split" in message
    assert message.count("(arith/") == 3  # three examples, each with its sample id
    assert "allow_holdout_overlap: true" in message
    # The examples quote the training questions, clipped and on one line.
    assert f'"{long[:60]}' in message and long not in message
    assert '"what is 1+0 ?"' in message and '"What is 3 + 0?"' not in message
    assert "What is 7" not in message and "\n" not in message


def test_allow_holdout_overlap_warns_and_returns_the_training_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _arith(tmp_path, [_q(1), _q(2)])
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(7)])
    path = _config(
        tmp_path,
        {
            "data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}],
            "allow_holdout_overlap": True,
        },
    )
    with caplog.at_level(logging.WARNING, logger="conductor"):
        result = check_training_data(load_train_config(path))
    assert result.overlap == 1
    assert result.training_hashes == {question_key(q["question"]).full for q in (_q(1), _q(7))}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "1 training question is also held out" in line and "training goes on" in line


def test_holdout_sets_plain_files_and_multiple_choice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain file matches by question text; a multiple-choice set by question and
    options in any order; the mix's own Hub evaluation split, not cached here, is read
    from the local copy that holdout: gives for it (no warning, nothing unchecked)."""
    _jsonl(
        tmp_path / "train.jsonl",
        [
            # MMLU's "What is 7 times 8?" with its options in another order: held out.
            {"question": "What is 7 times 8?", "choices": ["64", "58", "56", "54"], "answer": 2},
            # The same stem as a held-out question, with other options: another question.
            {"question": "Which organ pumps blood?", "choices": ["a", "b"], "answer": 0},
            {"question": "Name the capital of France.", "choices": ["Paris", "Rome"], "answer": 0},
        ],
    )
    _jsonl(tmp_path / "secret.jsonl", [{"problem": "name the capital of  FRANCE."}])
    path = _config(
        tmp_path,
        {
            "data": [{"benchmark": "mmlu", "file": "train.jsonl"}],
            "holdout": [
                {"benchmark": "mmlu", "file": str(FIXTURES / "mmlu.jsonl")},
                "secret.jsonl",
            ],
        },
    )
    with (
        caplog.at_level(logging.WARNING, logger="conductor"),
        pytest.raises(ContaminationError) as info,
    ):
        check_training_data(load_train_config(path))
    message = str(info.value)
    assert "2 training questions are also held out" in message
    assert f"1 in mmlu ({FIXTURES / 'mmlu.jsonl'})" in message
    assert f"1 in {(tmp_path / 'secret.jsonl').resolve()}" in message
    assert "organ" not in message
    assert "cais/mmlu" not in message
    assert [r.getMessage() for r in caplog.records] == []


def test_a_held_out_file_without_a_question_column_is_an_error(tmp_path: Path) -> None:
    _arith(tmp_path, [_q(1)])
    _jsonl(tmp_path / "train.jsonl", [_q(7)])
    _jsonl(tmp_path / "bad.jsonl", [{"text": "no question here"}])
    path = _config(
        tmp_path,
        {"data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}], "holdout": ["bad.jsonl"]},
    )
    with pytest.raises(UsageError, match=r"bad.jsonl:1: a held-out row needs a text column"):
        check_training_data(load_train_config(path))


def _cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=timeout)


@pytest.mark.process
def test_cli_train_stops_before_loading_the_model(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """The base model does not exist, so loading it would fail: the overlap error comes
    first.  With allow_holdout_overlap the guard warns and the run goes on to the
    model, which then fails: the guard runs before any model is loaded."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    _arith(tmp_path, [_q(1), _q(2)])
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(2), _q(7)])
    body = {
        "base_model": str(tmp_path / "no-such-model"),
        "data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}],
    }
    config = _config(tmp_path, body, pool=str(pool))
    result = _cli("train", str(config), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "2 training questions are also held out" in result.stderr
    assert "no-such-model" not in result.stderr
    assert not (tmp_path / "out").exists()

    config = _config(tmp_path, {**body, "allow_holdout_overlap": True}, pool=str(pool))
    result = _cli("train", str(config), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    warning, error = result.stderr.index("also held out"), result.stderr.index("no-such-model")
    assert warning < error, result.stderr
    assert "training goes on" in result.stderr
    assert fake_server.requests == []


# -- the checkpoint and bench ---------------------------------------------------------


def test_training_questions_round_trip_and_refusals(tmp_path: Path) -> None:
    keys = [question_key(f"What is {i} + 0?").full for i in range(3)]
    with pytest.raises(UsageError, match="no conductor.json"):
        write_training_questions(tmp_path, keys, normalisation=NORMALISATION)
    (tmp_path / META_FILE).write_text(json.dumps({"format_version": 1, "max_steps": 4}))
    assert read_training_questions(tmp_path) is None
    file = write_training_questions(tmp_path, keys + keys[:1], normalisation=NORMALISATION)
    assert file.name == TRAINING_QUESTIONS_FILE
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert meta["training_questions"] == TRAINING_QUESTIONS_FILE and meta["max_steps"] == 4
    assert read_training_questions(tmp_path) == (NORMALISATION, frozenset(keys))
    assert json.loads(file.read_text())["count"] == 3

    meta["training_questions"] = "../elsewhere.json"
    (tmp_path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(UsageError, match="must be a file name inside"):
        read_training_questions(tmp_path)
    meta["training_questions"] = TRAINING_QUESTIONS_FILE
    (tmp_path / META_FILE).write_text(json.dumps(meta))
    file.write_text(json.dumps({"format_version": 1, "normalisation": "x", "sha256": ["zz"]}))
    with pytest.raises(UsageError, match="not a SHA-256 hex digest"):
        read_training_questions(tmp_path)


async def test_exclude_trained_without_known_questions_is_refused(tmp_path: Path) -> None:
    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.grading import get_grader

    spec = load_benchmark(_arith(tmp_path, [_q(1)]))
    options = BenchOptions(out_dir=tmp_path / "run", exclude_trained=True)
    with pytest.raises(UsageError, match="--exclude-trained needs a Conductor checkpoint"):
        await run_benchmark(spec, object(), get_grader("math"), {}, options)  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


WORKFLOW = 'model_id = [0]\nsubtasks = ["Solve it"]\naccess_list = [[]]'


def _checkpoint(directory: Path, questions: list[str]) -> Path:
    """A tiny model taught to answer each of ``questions`` (its whole prompt) with
    WORKFLOW, saved with a conductor.json whose template is the bare question."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer([WORKFLOW, *questions, "0 1 2 3 4 5 6 7 8 9 [ ] \" ' , = + ?"])
    model = tiny_llama(tok, seed=1)
    examples = [
        (
            tok.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
            ),
            WORKFLOW,
        )
        for question in questions
    ]
    overfit(model, tok, examples, steps=200, stop_below=0.01)
    directory.mkdir(parents=True)
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    (directory / "bare.txt").write_text("${question}")
    meta = {"format_version": 1, "template": "bare.txt", "max_steps": 2, "pool_order": ["w0"]}
    (directory / META_FILE).write_text(json.dumps(meta))
    return directory


def _bench_cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CONDUCTOR_CACHE_DIR": str(cache)}, timeout=300)


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


@pytest.mark.process
def test_bench_counts_and_excludes_what_the_checkpoint_was_trained_on(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """The hashes `conductor train` would record (the guard's, for a checkpoint trained
    with allow_holdout_overlap on two evaluation questions) are counted by bench, and
    with --exclude-trained those samples are not run; resume keeps the exclusion."""
    import re

    eval_rows = [{"id": str(i), **_q(i)} for i in range(5)]
    _arith(tmp_path, eval_rows)
    _jsonl(
        tmp_path / "train.jsonl",
        [{"question": "what is 1 +0?", "answer": "1"}, {"question": "What is 3+0 ?", "answer": "3"}]
        + [_q(9)],
    )
    config = _config(
        tmp_path,
        {
            "data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}],
            "allow_holdout_overlap": True,
        },
    )
    guard = check_training_data(load_train_config(config))
    assert guard.overlap == 2 and len(guard.training_hashes) == 3
    ckpt = _checkpoint(tmp_path / "ckpt", [r["question"] for r in eval_rows])
    # Recorded as if one more held-out set had been accepted unchecked.
    unchecked = "mmlu evaluation split (cais/mmlu test) is not in the local dataset cache"
    record = {**guard.record(), "unchecked": [unchecked], "accept_unchecked_holdout": True}
    write_training_questions(ckpt, guard.training_hashes, normalisation=NORMALISATION, guard=record)

    def solve(request: Any) -> str:
        found = re.search(r"What is (\d+) \+ 0", request.last_user_message)
        assert found, request.last_user_message
        return f"\\boxed{{{found[1]}}}"

    fake_server.script("w0", solve)
    pool = pool_dict(fake_server, [worker(fake_server, "w0")])
    pool["conductor"] = {
        "backend": "checkpoint",
        "model": str(ckpt),
        "params": {"temperature": 0, "max_tokens": 48, "dtype": "float32"},
    }
    pool_file = write_pool(tmp_path / "pool.yaml", pool)
    cache = tmp_path / "cache"
    bench = ["bench", str(tmp_path / "arith.yaml"), "-p", str(pool_file), "-c", str(ckpt)]

    counted = tmp_path / "counted"
    result = _bench_cli(*bench, "--out", str(counted), cache=cache)
    assert result.returncode == 0, result.stderr
    assert re.search(r"trained-on samples\s+2 \(holdout unchecked\)", result.stdout), result.stdout
    assert {r["sample_id"] for r in _records(counted)} == {f"arith/{i}" for i in range(5)}
    assert all(r["grade"]["status"] == "correct" for r in _records(counted))
    trained_on = json.loads((counted / "config.json").read_text())["trained_on"]
    assert trained_on == {
        "checkpoint": str(ckpt),
        "questions": 3,
        "samples": 2,
        "unchecked_holdout": [unchecked],
    }
    assert f"{ckpt} was trained without comparing" in result.stderr
    summary = json.loads((counted / "summary.json").read_text())
    assert (summary["n_samples"], summary["trained_on_samples"]) == (5, 2)
    assert summary["trained_excluded"] is False

    excluded = tmp_path / "excluded"
    result = _bench_cli(*bench, "--out", str(excluded), "--exclude-trained", cache=cache)
    assert result.returncode == 0, result.stderr
    assert re.search(r"trained-on samples\s+2 \(excluded\) \(holdout", result.stdout), result.stdout
    assert {r["sample_id"] for r in _records(excluded)} == {"arith/0", "arith/2", "arith/4"}
    summary = json.loads((excluded / "summary.json").read_text())
    assert (summary["n_samples"], summary["trained_on_samples"]) == (3, 2)
    assert summary["trained_excluded"] is True

    report = _bench_cli("report", str(counted), str(excluded), cache=cache)
    assert report.returncode == 0, report.stderr
    shown = r"trained-on samples\s+2 \(holdout unchecked\)\s+2 \(excluded\) \(holdout"
    assert re.search(shown, report.stdout), report.stdout

    # Resuming from the directory alone keeps the exclusion (it is in the invocation);
    # a resume that would drop it is refused.
    (excluded / "samples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _records(excluded)[:2])
    )
    result = _bench_cli("bench", "--resume", str(excluded), cache=cache)
    assert result.returncode == 0, result.stderr
    assert {r["sample_id"] for r in _records(excluded)} == {"arith/0", "arith/2", "arith/4"}
    config_file = excluded / "config.json"
    stored = json.loads(config_file.read_text())
    stored["invocation"]["exclude_trained"] = False
    config_file.write_text(json.dumps(stored))
    result = _bench_cli("bench", "--resume", str(excluded), cache=cache)
    assert result.returncode == 2
    assert "--exclude-trained setting was true, now null" in result.stderr


def test_merged_shards_add_up_their_trained_on_counts(tmp_path: Path) -> None:
    from conductor.bench.merge import merge_runs

    config = {
        "benchmark": {"name": "arith", "grader": "math", "grader_version": 1},
        "strategy": "conductor",
        "epochs": 1,
        "seed": 0,
        "limit": None,
        "exclude_trained": True,
    }
    shards = []
    for i, count in enumerate((2, 3)):
        shard = tmp_path / f"shard{i}"
        shard.mkdir()
        trained_on = {"checkpoint": "ckpt", "questions": 9, "samples": count}
        (shard / "config.json").write_text(
            json.dumps({**config, "shard": [i, 2], "trained_on": trained_on})
        )
        (shard / "samples.jsonl").write_text("")
        shards.append(shard)
    merge_runs(shards, tmp_path / "merged")
    merged = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert merged["trained_on"] == {"checkpoint": "ckpt", "questions": 9, "samples": 5}
    assert merged["exclude_trained"] is True

    other = json.loads((shards[1] / "config.json").read_text())
    (shards[1] / "config.json").write_text(json.dumps({**other, "exclude_trained": None}))
    with pytest.raises(UsageError, match="--exclude-trained setting"):
        merge_runs(shards, tmp_path / "merged-again")


def test_a_training_only_benchmark_has_no_evaluation_split_to_compare(tmp_path: Path) -> None:
    """A benchmark with only a ``train_source`` (as RLPR) reads its training questions
    as its source; the guard must not call them held out, or the paper's mix would
    always stop.  Its questions still count against the other held-out sets."""
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(2), _q(3)])
    (tmp_path / "onlytrain.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "onlytrain",
                "train_source": {"file": "train.jsonl"},
                "fields": {"loader": "math", "question": "question", "answer": "answer"},
                "prompt": "${question}",
                "answer_format": "math",
                "grader": "math",
            }
        )
    )
    mix = {"data": [{"benchmark": "onlytrain.yaml", "split": "train"}]}
    result = check_training_data(load_train_config(_config(tmp_path, mix)))
    assert len(result.training_hashes) == 3 and result.overlap == 0
    _jsonl(tmp_path / "private.jsonl", [_q(2)])
    held = _config(tmp_path, {**mix, "holdout": ["private.jsonl"]})
    with pytest.raises(ContaminationError, match="1 training question"):
        check_training_data(load_train_config(held))


# -- a held-out set that is not on this machine ------------------------------------------

#: A Hub dataset that is in no cache (and does not exist): what a fresh machine sees of
#: an evaluation split it has never downloaded.
_ABSENT = {"hf": "conductor-tests/never-downloaded", "revision": "0" * 40, "split": "test"}


def _hub_benchmark(directory: Path) -> Path:
    """A math benchmark whose evaluation split is a Hub dataset not cached here."""
    path = directory / "hubmath.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "hubmath",
                "source": _ABSENT,
                "fields": {"loader": "math", "question": "question", "answer": "answer"},
                "prompt": "${question}",
                "answer_format": "math",
                "grader": "math",
            }
        )
    )
    return path


def test_an_evaluation_split_not_on_this_machine_stops_the_guard(tmp_path: Path) -> None:
    """A fresh machine has no copy of the mix's evaluation split: the guard must not
    pass without comparing.  The error names the split and how to make it available."""
    _hub_benchmark(tmp_path)
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(2)])
    path = _config(tmp_path, {"data": [{"benchmark": "hubmath.yaml", "file": "train.jsonl"}]})
    with pytest.raises(HoldoutUnavailableError) as info:
        check_training_data(load_train_config(path))
    message = str(info.value)
    assert isinstance(info.value, ContaminationError) and isinstance(info.value, UsageError)
    assert message.startswith(f"{path.resolve()}: the training questions cannot be compared")
    assert "hubmath evaluation split (conductor-tests/never-downloaded test)" in message
    assert "not in the local dataset cache" in message
    # How to make it available: the dataset at its pinned revision and the command that
    # fetches it, a local copy under holdout:, or the named opt-out.
    assert f"revision {'0' * 40}" in message
    assert "from conductor.datasets.samples import iter_samples" in message
    assert f"load_benchmark('{tmp_path / 'hubmath.yaml'}')" in message
    assert "{benchmark: " in message and "file: PATH}" in message
    assert "accept_unchecked_holdout: true" in message


def test_a_local_copy_under_holdout_stands_in_for_the_missing_split(tmp_path: Path) -> None:
    _hub_benchmark(tmp_path)
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(2)])
    _jsonl(tmp_path / "copy.jsonl", [_q(2), _q(3)])
    body = {
        "data": [{"benchmark": "hubmath.yaml", "file": "train.jsonl"}],
        "holdout": [{"benchmark": "hubmath.yaml", "file": "copy.jsonl"}],
    }
    with pytest.raises(ContaminationError) as info:
        check_training_data(load_train_config(_config(tmp_path, body)))
    assert not isinstance(info.value, HoldoutUnavailableError)
    assert "1 training question is also held out" in str(info.value)
    _jsonl(tmp_path / "copy.jsonl", [_q(3)])
    result = check_training_data(load_train_config(_config(tmp_path, body)))
    assert result.unchecked == () and result.checked == (
        f"hubmath ({(tmp_path / 'copy.jsonl').resolve()})",
    )


def test_accept_unchecked_holdout_warns_and_the_checkpoint_records_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from conductor.train.trainer import _record_training_questions

    _hub_benchmark(tmp_path)
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(2)])
    body = {
        "data": [{"benchmark": "hubmath.yaml", "file": "train.jsonl"}],
        "accept_unchecked_holdout": True,
    }
    config = load_train_config(_config(tmp_path, body))
    assert config.accept_unchecked_holdout is True
    with caplog.at_level(logging.WARNING, logger="conductor"):
        result = check_training_data(config)
    label = "hubmath evaluation split (conductor-tests/never-downloaded test)"
    assert result.unchecked == (f"{label} is not in the local dataset cache",)
    assert result.checked == () and result.accepted_unchecked is True
    (line,) = [r.getMessage() for r in caplog.records]
    assert "accept_unchecked_holdout: true" in line and label in line

    # What the trainer writes into the checkpoint, and what bench reads back from it.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / META_FILE).write_text(json.dumps({"format_version": 1}))
    _record_training_questions(ckpt, result)
    guard = read_training_guard(ckpt)
    assert guard is not None
    assert guard["accept_unchecked_holdout"] is True
    assert guard["unchecked"] == list(result.unchecked)
    assert guard["normalisation"] == NORMALISATION and guard["ngram"] is None
    assert read_training_questions(ckpt) == (NORMALISATION, result.training_hashes)

    class _Target:
        model = str(ckpt)

    class _Checkpoint:
        backend = "checkpoint"
        target = _Target()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="conductor"):
        trained = trained_questions_of(_Checkpoint())  # type: ignore[arg-type]
    assert trained is not None and trained.unchecked == result.unchecked
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"{ckpt} was trained without comparing" in line and label in line


@pytest.mark.process
def test_cli_train_stops_on_an_unavailable_split_unless_accepted(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """Through ``conductor train``: exit 2 naming the split and how to fetch it, before
    the (missing) base model is loaded; with accept_unchecked_holdout the guard warns
    and the run goes on to the model, which then fails."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    _hub_benchmark(tmp_path)
    _jsonl(tmp_path / "train.jsonl", [_q(1), _q(7)])
    body = {
        "base_model": str(tmp_path / "no-such-model"),
        "data": [{"benchmark": "hubmath.yaml", "file": "train.jsonl"}],
    }
    config = _config(tmp_path, body, pool=str(pool))
    result = _cli("train", str(config), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "cannot be compared with 1 held-out set" in result.stderr
    assert "conductor-tests/never-downloaded" in result.stderr
    assert "accept_unchecked_holdout: true" in result.stderr
    assert "no-such-model" not in result.stderr
    assert not (tmp_path / "out").exists()

    config = _config(tmp_path, {**body, "accept_unchecked_holdout": True}, pool=str(pool))
    result = _cli("train", str(config), "--no-live", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    warning = result.stderr.index("not compared with the training questions")
    assert warning < result.stderr.index("no-such-model"), result.stderr
    assert fake_server.requests == []


# -- n-gram overlap -----------------------------------------------------------------------

_LONG = (
    "A farmer has 17 sheep and buys 5 more each week for 6 weeks, then sells half of "
    "the flock at the market. How many sheep does the farmer have left?"
)


def test_holdout_ngram_parses_and_is_off_by_default(tmp_path: Path) -> None:
    mix = {"data": ["math500"]}
    assert load_train_config(_config(tmp_path, mix)).holdout_ngram is None
    parsed = load_train_config(_config(tmp_path, {**mix, "holdout_ngram": {}}))
    assert parsed.holdout_ngram == NgramSettings(n=13, threshold=0.5)
    parsed = load_train_config(
        _config(tmp_path, {**mix, "holdout_ngram": {"n": 8, "threshold": 0.8}})
    )
    assert parsed.holdout_ngram == NgramSettings(n=8, threshold=0.8)
    for bad, needle in (
        ({"n": 0}, "holdout_ngram.n"),
        ({"threshold": 1.5}, "holdout_ngram.threshold"),
        ({"size": 3}, 'unknown key "size"'),
    ):
        with pytest.raises(TrainConfigError, match=needle):
            load_train_config(_config(tmp_path, {**mix, "holdout_ngram": bad}))


def test_holdout_ngram_reports_reworded_copies_with_their_pairs(tmp_path: Path) -> None:
    """A held-out question with a sentence added and a word changed has another key;
    the n-gram comparison finds it and names both sides, and a question of the same
    length on another subject is not reported."""
    reworded = _LONG.replace("at the market", "at the county fair") + " Explain briefly."
    _arith(tmp_path, [{"id": "1", "question": _LONG, "answer": "23"}, _q(2)])
    train = [
        {"question": reworded, "answer": "23"},
        {
            "question": "A baker makes 40 loaves each morning and gives a quarter of them "
            "to the shelter. How many loaves are left for the shop after three mornings?",
            "answer": "90",
        },
        _q(7),
    ]
    _jsonl(tmp_path / "train.jsonl", train)
    mix = {"data": [{"benchmark": "arith.yaml", "file": "train.jsonl"}]}
    assert check_training_data(load_train_config(_config(tmp_path, mix))).overlap == 0

    path = _config(tmp_path, {**mix, "holdout_ngram": {"n": 8, "threshold": 0.5}})
    with pytest.raises(ContaminationError) as info:
        check_training_data(load_train_config(path))
    message = str(info.value)
    assert "1 training question shares at least 50% of 8-word n-grams" in message
    assert f'"{reworded[:40]}' in message and f'~ "{_LONG[:40]}' in message
    assert "(arith/1 in arith evaluation split" in message
    assert "baker" not in message and "allow_holdout_overlap: true" in message

    allowed = _config(
        tmp_path,
        {**mix, "holdout_ngram": {"n": 8, "threshold": 0.5}, "allow_holdout_overlap": True},
    )
    result = check_training_data(load_train_config(allowed))
    (pair,) = result.near
    assert (pair.held_out, pair.training_question) == ("arith/1", reworded)
    assert 0.5 <= pair.overlap < 1
    assert result.record()["ngram"] == {"n": 8, "threshold": 0.5, "near": 1}
    # An exact copy is an overlap, not also a near pair.
    _jsonl(tmp_path / "train.jsonl", [{"question": _LONG, "answer": "23"}])
    result = check_training_data(load_train_config(allowed))
    assert (result.overlap, result.near) == (1, ())


def test_report_marks_a_checkpoint_trained_with_unchecked_holdout(tmp_path: Path) -> None:
    """``bench`` copies the checkpoint's unchecked sets into the run's ``trained_on``;
    the report's trained-on figure says so beside the count."""
    from conductor.render.comparison import TRAINED_ON
    from conductor.runs.summary import summarize_run

    config = {
        "benchmark": {"name": "arith", "grader": "math", "grader_version": 1},
        "strategy": "conductor",
        "epochs": 1,
        "seed": 0,
        "limit": None,
        "trained_on": {"checkpoint": "ckpt", "questions": 9, "samples": 2},
    }
    (tmp_path / "samples.jsonl").write_text("")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert TRAINED_ON.cell(summarize_run(tmp_path)) == "2"
    config["trained_on"]["unchecked_holdout"] = ["mmlu evaluation split (cais/mmlu test)"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert TRAINED_ON.cell(summarize_run(tmp_path)) == "2 (holdout unchecked)"
