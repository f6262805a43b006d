"""A bench run's ``config.json``: one typed config, written and read back unchanged, and
one reader, so that a damaged file is the same one-line error (exit code 2, no
traceback) through ``bench --resume``, ``bench merge`` and ``report``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from kit.benchkit import bench_pool, make_math_file, script_math

from conductor.bench.runconfig import check_same_run, run_difference, stored_invocation
from conductor.cli import main
from conductor.errors import UsageError
from conductor.runs.config import (
    CONFIG_SCHEMA,
    BenchConfig,
    BenchmarkInfo,
    Invocation,
    RunConfigError,
    read_run_config,
)
from conductor.runs.rundir import CONFIG, SAMPLES
from conductor.testing import FakeLLMServer

GOOD = BenchConfig(
    benchmark=BenchmarkInfo(name="math500", grader="math", grader_version="3"),
    strategy="single:w0",
    strategy_detail={"strategy": "single", "worker": "w0"},
    pool={"name": "fake", "workers": [{"id": "w0"}]},
    concurrency=2,
    epochs=1,
    seed=0,
    invocation=Invocation(benchmark="math500", strategy="single:w0"),
)


def run_dir(path: Path, config: bytes) -> Path:
    """A run directory whose ``config.json`` holds ``config`` (and no records)."""
    path.mkdir(parents=True)
    (path / CONFIG).write_bytes(config)
    (path / SAMPLES).write_bytes(b"")
    return path


#: Damaged files, with what the one error says about each.
DAMAGED = {
    "not UTF-8": (b'{"benchmark": {"name": "caf\xe9"}}', "not UTF-8 text"),
    "bad JSON": (b'{"benchmark": {"name": "math500"},, }', ":1: not valid JSON"),
    "truncated": (GOOD.to_json().encode()[:200], "not valid JSON"),
    "empty": (b"", ":1: not valid JSON"),
    "not an object": (b"[1, 2]", "a JSON object was expected, not list"),
    "no benchmark": (b'{"seed": 0}', "it names no benchmark"),
    "wrong type": (
        json.dumps({**GOOD.to_dict(), "epochs": "three"}).encode(),
        'epochs must be an integer, not "three"',
    ),
    "wrong nested type": (
        json.dumps({**GOOD.to_dict(), "invocation": {"seed": True}}).encode(),
        "invocation.seed must be an integer, not true",
    ),
    "bad shard": (
        json.dumps({**GOOD.to_dict(), "shard": [0]}).encode(),
        "shard must be [I, N], not [0]",
    ),
    "unknown schema": (
        json.dumps({**GOOD.to_dict(), "schema_version": CONFIG_SCHEMA + 1}).encode(),
        f"config schema {CONFIG_SCHEMA + 1} is not one this version of conductor reads",
    ),
}


def test_a_config_reads_back_as_it_was_written(tmp_path: Path) -> None:
    d = run_dir(tmp_path / "r", GOOD.to_json().encode())
    assert read_run_config(d) == GOOD
    assert read_run_config(d).to_json() == GOOD.to_json()


def test_an_old_config_reads_with_what_it_lacks_as_none(tmp_path: Path) -> None:
    d = run_dir(tmp_path / "r", b'{"benchmark": {"name": "math500"}, "pool": {"path": "p.yaml"}}')
    config = read_run_config(d)
    assert config.schema_version == 1 and config.invocation is None and config.seed is None
    # Schema 1 kept no invocation: what rebuilds the run is read back from the rest.
    rebuilt = stored_invocation(config)
    assert rebuilt.benchmark == "math500" and rebuilt.pool == "p.yaml" and rebuilt.seed == 0


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_config_is_one_sentence_naming_the_file(tmp_path: Path, case: str) -> None:
    content, said = DAMAGED[case]
    d = run_dir(tmp_path / "r", content)
    with pytest.raises(RunConfigError) as info:
        read_run_config(d)
    message = str(info.value)
    assert isinstance(info.value, UsageError) and info.value.path == d / CONFIG
    assert message.startswith(str(d / CONFIG)) and said in message
    assert "\n" not in message


def test_a_missing_config_says_the_directory_is_no_run(tmp_path: Path) -> None:
    with pytest.raises(RunConfigError, match="no config.json; not a bench run directory"):
        read_run_config(tmp_path)


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``conductor ARGS`` prints on stderr; it must exit 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("case", ["not UTF-8", "bad JSON", "truncated", "wrong type"])
def test_every_command_tells_a_damaged_config_the_same_way(
    tmp_path: Path,
    case: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # the line stays whole however narrow
    content, said = DAMAGED[case]
    d = run_dir(tmp_path / "damaged", content)
    good = run_dir(tmp_path / "good", GOOD.to_json().encode())
    resume = _error(["bench", "--resume", str(d)], capsys)
    merge = _error(["bench", "merge", str(good), str(d), "--out", str(tmp_path / "m")], capsys)
    report = _error(["report", str(d)], capsys)
    assert resume == merge == report
    assert resume.startswith(f"error: {d / CONFIG}") and said in resume
    assert not (tmp_path / "m").exists()  # refused before anything was written


def test_a_resume_or_merge_of_another_run_is_refused_by_one_check(tmp_path: Path) -> None:
    other = dataclasses.replace(GOOD, seed=5)
    assert run_difference(GOOD, other) == "the seed was 0, now 5"
    assert run_difference(GOOD, dataclasses.replace(GOOD, shard=(0, 2))) == (
        "--shard was None, now [0, 2]"
    )
    assert run_difference(GOOD, dataclasses.replace(GOOD, shard=(1, 2)), shards=True) is None
    with pytest.raises(UsageError, match=r"cannot resume: the seed was 0, now 5; run it in"):
        check_same_run(GOOD, other, tmp_path)
    with pytest.raises(UsageError, match=r"cannot merge: the seed was 0, now 5; merge only"):
        check_same_run(GOOD, other, tmp_path, shards=True)
    # A tree recorded by the old run is compared field by field; one it did not record
    # is not compared.
    moved = dataclasses.replace(GOOD, pool={"name": "fake", "workers": [{"id": "w1"}]})
    assert run_difference(GOOD, moved) == ('the pool changed (workers[0].id was "w0", now "w1")')
    assert run_difference(dataclasses.replace(GOOD, pool=None), moved) is None


@pytest.mark.process
def test_a_run_writes_a_config_that_reads_back_byte_for_byte(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    script_math(fake_server)
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    data = make_math_file(tmp_path / "m.jsonl", 2)
    pool = bench_pool(tmp_path, fake_server)
    main_args = ["bench", "math500", "--pool", str(pool), "--data", str(data)]
    main_args += ["--out", str(out), "--strategy", "single:w0", "--seed", "3"]
    with pytest.raises(SystemExit) as info:
        main(main_args)
    assert info.value.code in (0, None)
    text = (out / CONFIG).read_text(encoding="utf-8")
    config = read_run_config(out)
    assert config.to_json() == text
    assert config.invocation is not None and config.invocation.seed == 3
    assert config.invocation.pool == str(pool.resolve())
