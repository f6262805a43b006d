"""Nothing to read: records keep no hidden tests, and what conductor writes (run
directories, the call and sample cache) is private to its owner whatever the umask and
the user; a cache that cannot be written stops a bench, and a damaged one is cleared.

The full disk is simulated twice: by fault injection (SQLite's own "database or disk is
full" error raised from the cache's writes, everywhere) and, as root only, for real on
a tiny tmpfs mounted for the test.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.cachefaults import caches_made, full_after, settle
from kit.clock import scaled
from kit.poolkit import pool_dict, worker, write_pool

from conductor.bench.runconfig import BenchOptions
from conductor.bench.runner import run_benchmark
from conductor.bench.spec import load_benchmark
from conductor.datasets.loaders import hidden_tests_sha256
from conductor.datasets.samples import iter_samples, recorded_metadata, reload_sample
from conductor.datasets.sources import DatasetError
from conductor.errors import CacheError
from conductor.grading import get_grader
from conductor.grading.short import ShortAnswerGrader
from conductor.grading.types import Sample, Verdict
from conductor.llm.cache import DB_FILE, ResponseCache
from conductor.llm.caller import CallerSet
from conductor.llm.types import RawCompletion, Usage
from conductor.pool import load_pool, pool_to_public_dict
from conductor.private import make_private_dir, open_private, tighten, write_private
from conductor.strategies import parse_strategy
from conductor.testing import FakeLLMServer

SRC = Path(__file__).resolve().parents[1] / "src"
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def loose(top: Path) -> list[str]:
    """Every entry under ``top`` (itself included) with a group or other permission bit."""
    found = []
    for path in [top, *top.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & (stat.S_IRWXG | stat.S_IRWXO):
            found.append(f"{path.relative_to(top.parent)} {stat.filemode(mode)}")
    return found


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# -- the private-file helpers -----------------------------------------------------------


def test_files_and_directories_are_private_whatever_the_umask(
    tmp_path: Path, umask_000: None
) -> None:
    made = make_private_dir(tmp_path / "a" / "b")
    with open_private(made / "appended.jsonl", "ab", buffering=0) as fh:
        fh.write(b"x\n")
    old = made / "old.json"
    old.write_text("{}")
    old.chmod(0o666)
    write_private(old, "{}\n")  # replaces a readable file with a private one
    write_private(made / "bytes.bin", b"\0", atomic=False)
    assert loose(tmp_path / "a") == []
    assert sorted(p.name for p in made.iterdir()) == ["appended.jsonl", "bytes.bin", "old.json"]


def test_tighten_walks_only_a_readable_tree_and_counts_what_it_changed(tmp_path: Path) -> None:
    top = tmp_path / "old"
    (top / "sub").mkdir(parents=True)
    (top / "f").write_text("x")
    for p, mode in ((top, 0o755), (top / "sub", 0o777), (top / "f", 0o664)):
        p.chmod(mode)
    assert tighten(top) == 3
    assert loose(top) == []
    assert stat.S_IMODE((top / "f").stat().st_mode) == 0o600
    (top / "g").write_text("y")
    (top / "g").chmod(0o644)
    assert tighten(top) == 0  # the directory is private: nobody reaches g
    assert tighten(top, walk=True) == 1 and loose(top) == []


def test_tighten_with_names_leaves_other_files_and_a_shared_directory_alone(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "samples.jsonl").write_text("x")
    (shared / "theirs.txt").write_text("y")
    shared.chmod(0o1777)  # sticky, as /tmp is: --out /tmp must not close it
    for name in ("samples.jsonl", "theirs.txt"):
        (shared / name).chmod(0o644)
    assert tighten(shared, names=("samples.jsonl",)) == 1
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "samples.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((shared / "theirs.txt").stat().st_mode) == 0o644


# -- a real bench run, as root and as nobody, umask 022 and 000 ---------------------------


def _smoke_pool(root: Path, server: FakeLLMServer) -> Path:
    return write_pool(root / "pool.yaml", pool_dict(server, [worker(server, "w0")]))


@pytest.mark.process
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask022", "umask000"])
@pytest.mark.parametrize("user", ["me", "nobody"])
def test_a_bench_run_and_its_cache_are_private_to_their_owner(
    fake_server: FakeLLMServer, user: str, umask: int
) -> None:
    if user == "nobody" and not IS_ROOT:
        pytest.skip("switching to uid 65534 needs root")
    # Somewhere uid 65534 can reach (pytest's tmp_path is root's own).
    root = Path(tempfile.mkdtemp(prefix="conductor-private-"))
    try:
        root.chmod(0o777)
        pool = _smoke_pool(root, fake_server)
        pool.chmod(0o644)
        fake_server.set_default(lambda r: "ANSWER: 4")
        command = [sys.executable, "-m", "conductor", "bench", "smoke", "--pool", str(pool),
                   "--strategy", "single:w0", "--limit", "3",
                   "--out", str(root / "run")]  # fmt: skip
        if user == "nobody":
            command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                       *command]  # fmt: skip
        env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(root / "cache"), "PYTHONPATH": str(SRC)}
        res = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(300),
            preexec_fn=lambda: os.umask(umask),  # noqa: PLW1509 - the child's own umask
        )
        assert res.returncode == 0, res.stderr
        run, cache = root / "run", root / "cache"
        assert {p.name for p in run.iterdir()} >= {"config.json", "samples.jsonl", "summary.json"}
        assert (cache / DB_FILE).is_file()
        if user == "nobody":
            assert run.stat().st_uid == NOBODY == (cache / DB_FILE).stat().st_uid
        assert loose(run) == [] and loose(cache) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench(tmp_path: Path, server: FakeLLMServer, out: Path, **kw: Any) -> Any:
    pool = load_pool(_smoke_pool(tmp_path, server))
    strat = parse_strategy("single:w0", pool, CallerSet(kw.pop("cache", None)))
    options = BenchOptions(out_dir=out, limit=kw.pop("limit", 2), **kw)
    return run_benchmark(
        load_benchmark("smoke"), strat, get_grader("short"), pool_to_public_dict(pool), options
    )


def test_a_run_directory_an_older_version_left_readable_is_made_private(
    tmp_path: Path, fake_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    asyncio.run(_bench(tmp_path, fake_server, out, limit=1))
    (out / "notes.txt").write_text("the user's own file, not the run's")
    for path, mode in ((out, 0o755), (out / "samples.jsonl", 0o644), (out / "notes.txt", 0o644)):
        path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="conductor"):
        asyncio.run(_bench(tmp_path, fake_server, out, limit=1, resume=True))
    assert loose(out) == [f"run/notes.txt {stat.filemode(0o100644)}"]
    assert any("the run directory was readable" in r.getMessage() for r in caplog.records)


def test_a_cache_an_older_version_left_readable_is_made_private(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "calls"
    with ResponseCache(directory) as cache:
        cache.set("k", RawCompletion("hello", Usage(1, 1), {}))
    directory.chmod(0o755)
    (directory / DB_FILE).chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="conductor"), ResponseCache(directory) as cache:
        assert cache.get("k") is not None
    assert loose(directory) == []
    assert any("the call cache was readable" in r.getMessage() for r in caplog.records)


def test_large_cached_values_are_private_files_too(tmp_path: Path, umask_000: None) -> None:
    # diskcache keeps a value over 32 KiB in a file of its own, in directories of its own.
    with ResponseCache(tmp_path / "calls") as cache:
        cache.set("big", RawCompletion("x" * 100_000, Usage(1, 1), {}))
        assert cache.get("big") is not None
    assert list((tmp_path / "calls").rglob("*.val"))
    assert loose(tmp_path / "calls") == []


# -- records keep no hidden tests -----------------------------------------------------------

SECRET = "SECRET-EXPECTED-OUTPUT"


def _lcb_file(path: Path) -> Path:
    public = [{"input": "1\n", "output": "shown-output\n", "testtype": "stdin"}]
    private = [
        {"input": f"{i}\n", "output": f"{SECRET}-{i}\n", "testtype": "stdin"} for i in range(3)
    ]
    row = {
        "question_title": "Echo",
        "question_content": "Read a number and print the secret.",
        "platform": "atcoder",
        "question_id": "p1",
        "contest_id": "c1",
        "contest_date": "2024-09-14T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": json.dumps(private),
        "metadata": "{}",
    }
    path.write_text(json.dumps(row) + "\n")
    return path


class _NoSandbox(ShortAnswerGrader):
    """Grades without running the code (and without a gold to compare with)."""

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        return Verdict("incorrect", "not run here")


def test_records_and_the_sample_cache_keep_no_hidden_tests_and_can_be_regraded(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    spec = load_benchmark("livecodebench")
    data = _lcb_file(tmp_path / "lcb.jsonl")
    fake_server.set_default(lambda r: "```python\nprint(input())\n```")
    pool = load_pool(_smoke_pool(tmp_path, fake_server))
    out = tmp_path / "run"
    with ResponseCache(tmp_path / "calls") as cache:
        strat = parse_strategy("single:w0", pool, CallerSet(cache))
        # A grader that needs no sandbox: what the record keeps does not depend on it.  Its
        # verdict is no grader_error, which the sample cache would not keep.
        options = BenchOptions(out_dir=out, data_file=data)
        asyncio.run(
            run_benchmark(
                spec, strat, _NoSandbox(), pool_to_public_dict(pool), options, cache=cache
            )
        )
    text = (out / "samples.jsonl").read_text()
    assert SECRET not in text and "shown-output" in text
    # Every file the cache wrote (its database, and large values diskcache keeps in files
    # of their own), and the sample cache's entry among them: this checks where the
    # sample was cached, not an empty directory.
    cached = b"".join(p.read_bytes() for p in (tmp_path / "calls").rglob("*") if p.is_file())
    assert SECRET.encode() not in cached
    (record,) = [json.loads(line) for line in text.splitlines()]
    assert record["run_id"].encode() in cached, "the sample cache holds no entry"
    kept = record["sample_metadata"]
    (sample,) = iter_samples(spec, data_file=data)
    assert kept["tests"] == sample.metadata["tests"][:1]
    hidden = kept["hidden_tests"]
    assert hidden["count"] == 3
    assert hidden["sha256"] == hidden_tests_sha256(sample.metadata["tests"][1:])
    assert hidden["source"]["sample_id"] == sample.id == record["sample_id"]
    assert hidden["source"]["file"] == str(data.resolve())
    # Regrading reads the tests again from the data the record names.
    assert reload_sample(spec, hidden).metadata["tests"] == sample.metadata["tests"]
    moved = data.rename(tmp_path / "elsewhere.jsonl")
    with pytest.raises(DatasetError, match=r"not kept in run records.*--data FILE"):
        reload_sample(spec, hidden)
    assert reload_sample(spec, hidden, data_file=moved).id == sample.id
    _lcb_file(moved)
    changed = moved.read_text().replace(f"{SECRET}-2", "other")
    moved.write_text(changed)
    with pytest.raises(DatasetError, match="differ from those its record was graded with"):
        reload_sample(spec, hidden, data_file=moved)


def test_bigcodebench_records_drop_the_unittest_source() -> None:
    spec = load_benchmark("bigcodebench-hard")
    sample = Sample(
        id="bcb/1",
        input={"question": "q"},
        gold=None,
        metadata={"test": f"class TestCases: '{SECRET}'", "entry_point": "task_func", "libs": []},
    )
    kept = recorded_metadata(spec, sample)
    assert SECRET not in json.dumps(kept)
    assert kept["entry_point"] == "task_func" and kept["hidden_tests"]["count"] is None
    assert kept["hidden_tests"]["sha256"] == hidden_tests_sha256(sample.metadata["test"])


def test_other_benchmarks_keep_their_metadata_as_it_is() -> None:
    (sample, *_rest) = iter_samples(load_benchmark("smoke"))
    assert recorded_metadata(load_benchmark("smoke"), sample) == sample.metadata


# -- cache faults ------------------------------------------------------------------------------


# One sample writes its call, then itself: the 3rd write is the second sample's call
# (the call cache fails inside the strategy), the 4th that sample (the sample cache).
# The writes are made by the cache's writer thread: the fault it meets stops the run at
# the next write handed to it, so a sample or two may be recorded after the failed
# write (complete records; only their cache entries are missing).  The third question
# is answered only once the writes before it are settled (a busy machine may leave the
# writer waiting until all 20 samples are done): the fault is known by then, so the
# third sample's first write stops the run, on any machine.
@pytest.mark.parametrize("writes", [2, 3], ids=["call-cache", "sample-cache"])
def test_a_full_cache_stops_the_bench_with_one_message_and_exit_1(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    writes: int,
) -> None:
    from conductor.cli import main

    caches = caches_made(monkeypatch)
    asked = itertools.count(1)

    def answer(request: object) -> str:
        if next(asked) >= 3:
            settle(caches)
        return "ANSWER: 4"

    fake_server.set_default(answer)
    full_after(monkeypatch, writes)
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(tmp_path / "calls"))
    out = tmp_path / "run"
    args = ["bench", "smoke", "--pool", str(_smoke_pool(tmp_path, fake_server)),
            "--strategy", "single:w0", "--out", str(out), "--concurrency", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("error:") == 1 and "could not be written" not in err
    assert f"error: stopped: the call cache in {tmp_path / 'calls'} cannot be written" in err
    assert "database or disk is full" in err and f"conductor bench --resume {out}" in err
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert 1 <= len(records) <= 3 and all(r["status"] != "failed" for r in records)


@pytest.mark.process
@pytest.mark.skipif(not IS_ROOT or not shutil.which("mount"), reason="mounts a tmpfs: root only")
def test_a_cache_on_a_really_full_disk_stops_the_bench(
    fake_server: FakeLLMServer, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "none", str(mnt)])
    if mounted.returncode != 0:
        pytest.skip("this machine refuses to mount a tmpfs")
    try:
        # Replies that fill 600 KiB within the smoke set's 20 samples.
        fake_server.set_default(lambda r: "x" * 20_000 + "\nANSWER: 4")
        out = tmp_path / "run"
        command = [sys.executable, "-m", "conductor", "bench", "smoke", "--pool",
                   str(_smoke_pool(tmp_path, fake_server)), "--strategy", "single:w0",
                   "--out", str(out)]  # fmt: skip
        env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(mnt / "calls"), "PYTHONPATH": str(SRC)}
        res = subprocess.run(command, env=env, capture_output=True, text=True, timeout=scaled(300))
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
    assert res.returncode == 1, res.stderr
    err = " ".join(res.stderr.split())
    assert "cannot be written (No space left on device, ENOSPC)" in err or "disk is full" in err
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) < 20 and all(r["status"] != "failed" for r in records)


def exit_code(args: list[str]) -> int:
    from conductor.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _fill(directory: Path) -> None:
    with ResponseCache(directory) as cache:
        for i in range(200):
            cache.set(f"k{i}", RawCompletion(f"answer {i} " * 50, Usage(1, 1), {}))


@pytest.mark.parametrize("damage", ["random bytes", "truncated"])
def test_a_damaged_cache_says_what_to_do_and_cache_clear_recreates_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: str,
) -> None:
    directory = tmp_path / "calls"
    db = directory / DB_FILE
    _fill(directory)
    if damage == "random bytes":
        db.write_bytes(os.urandom(8192))
    else:
        with db.open("r+b") as fh:
            fh.truncate(db.stat().st_size // 3)
    # Random bytes fail on opening; a truncated file opens and fails on reading.
    with pytest.raises(CacheError) as info, ResponseCache(directory) as cache:  # noqa: PT012
        for i in range(200):
            cache.get(f"k{i}")
    assert info.value.corrupt
    assert f"the call cache {db} is damaged" in str(info.value)
    assert "run `conductor cache clear`" in str(info.value) and f"delete {db}" in str(info.value)

    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(directory))
    assert exit_code(["cache", "clear", "--older-than", "1d"]) == 2
    assert "without it" in capsys.readouterr().err
    assert exit_code(["cache", "clear"]) == 0
    assert "was damaged: deleted it and made it again" in " ".join(capsys.readouterr().out.split())
    with ResponseCache(directory) as cache:
        assert cache.stats().entries == 0
        cache.set("k", RawCompletion("fresh", Usage(1, 1), {}))
        assert cache.get("k") is not None
    assert loose(directory) == []


def test_a_read_only_cache_is_a_write_fault_not_damage(tmp_path: Path) -> None:
    with ResponseCache(tmp_path / "calls") as cache:
        cache._store._cache.set = lambda *a, **k: (_ for _ in ()).throw(  # type: ignore[attr-defined]
            sqlite3.OperationalError("attempt to write a readonly database")
        )
        with pytest.raises(CacheError) as info:  # noqa: PT012 - the write, then its commit
            cache.set("k", RawCompletion("x", Usage(1, 1), {}))
            cache.flush()
    assert not info.value.corrupt and "--no-cache" in str(info.value)


@pytest.mark.process
@pytest.mark.parametrize(
    ("printed", "quoted"),
    [("wrong-public", "'shown-output\\n'"), ("shown-output", "a hidden output")],
    ids=["public-test-fails", "private-test-fails"],
)
def test_a_verdict_never_quotes_a_hidden_expected_output(printed: str, quoted: str) -> None:
    from conductor.grading.code import CodeGrader

    sample = Sample(
        id="lcb/1",
        input={"question": "?"},
        gold=None,
        metadata={
            "tests": [
                {"input": "1\n", "output": "shown-output\n", "testtype": "stdin"},
                {"input": "2\n", "output": f"{SECRET}\n", "testtype": "stdin"},
            ],
            "num_public_tests": 1,
            "fn_name": None,
        },
    )
    # Right on the public test only when it prints the public output.
    verdict = CodeGrader().grade(f"```python\nprint({printed!r})\n```", sample)
    assert verdict.status == "incorrect", verdict
    assert f"expected {quoted}" in verdict.reason and SECRET not in json.dumps(verdict.to_dict())


def test_downloaded_data_is_private_and_an_older_copy_is_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_000: None
) -> None:
    from conductor.bench.spec import load_benchmark_text

    folder = tmp_path / "data"
    monkeypatch.setenv("CONDUCTOR_DATA_DIR", str(folder))
    url = (Path(__file__).resolve().parent / "fixtures" / "bench" / "aime25.jsonl").as_uri()
    spec = load_benchmark_text(
        f"source: {{url: '{url}'}}\ngrader: math\nprompt: '${{question}}'\nfields: {{id: id}}\n",
        source="u.yaml",
    )
    assert len(list(iter_samples(spec))) == 4
    (copy,) = folder.iterdir()
    assert loose(folder) == []
    folder.chmod(0o755)
    copy.chmod(0o644)  # as an older version left it
    assert len(list(iter_samples(spec))) == 4
    assert loose(folder) == []
