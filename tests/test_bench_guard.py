"""`conductor bench` under faults: no sample is lost, a full disk or a refused key stops
the run at once, run directories are locked, and a resume continues the same run."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
from kit.benchkit import bench_pool, cli, make_math_file, number_in, read_samples, script_math
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, worker, write_pool

from conductor.bench import runner
from conductor.bench.faults import BenchStopped
from conductor.bench.runconfig import BenchOptions
from conductor.bench.runner import run_benchmark
from conductor.bench.spec import load_benchmark
from conductor.conductors.spec import resolve_conductor
from conductor.execute import RunSettings
from conductor.grading import get_grader
from conductor.grading.types import Sample, Verdict
from conductor.llm.caller import CallerSet
from conductor.pool import load_pool, pool_to_public_dict
from conductor.record import RunRecord
from conductor.strategies import ConductorStrategy, parse_strategy
from conductor.testing import FakeLLMServer, Fault

MATH = load_benchmark("math500")


def single(tmp_path: Path, server: FakeLLMServer, name: str = "single:w0") -> Any:
    pool = load_pool(bench_pool(tmp_path, server))
    return parse_strategy(name, pool, CallerSet(None)), pool_to_public_dict(pool)


def keys(run_dir: Path) -> list[tuple[str, int]]:
    return [(r["sample_id"], r["epoch"]) for r in read_samples(run_dir)]


# -- no lost sample -------------------------------------------------------------------


class _Flaky:
    """A strategy that raises for every third question and answers the rest."""

    name = "flaky"

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}

    async def run(self, question: str, **kw: Any) -> RunRecord:
        record: RunRecord = await self.inner.run(question, **kw)
        if int(question.split("What is ")[1].split(" ")[0]) % 3 == 0:
            raise RuntimeError("malformed body from the provider")
        return record

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BrokenGrader:
    """The math grader, except that it raises on item 4."""

    name = "math"
    version = get_grader("math").version

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        if sample.input["question"].startswith("What is 4 "):
            raise ValueError("the grader tripped")
        return get_grader("math").grade(response, sample)


async def test_exceptions_of_finished_samples_become_records(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    inner, pool = single(tmp_path, fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 9)
    out = tmp_path / "run"
    opts = BenchOptions(out_dir=out, data_file=data, concurrency=3)
    progress = await run_benchmark(MATH, _Flaky(inner), _BrokenGrader(), pool, opts)
    records = {r["sample_id"].rsplit("/", 1)[1]: r for r in read_samples(out)}
    assert len(records) == 9 == progress.done
    failed = [k for k, r in records.items() if r["status"] == "failed"]
    assert sorted(failed) == ["0.json", "3.json", "6.json"]
    assert all("RuntimeError: malformed body" in records[k]["error"] for k in failed)
    assert records["4.json"]["grade"]["status"] == "grader_error"
    assert "ValueError: the grader tripped" in records["4.json"]["grade"]["reason"]
    assert progress.errors == 4 and progress.correct == 5


class _Leaky:
    """A strategy whose error message quotes the API key."""

    name = "leaky"

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}

    async def run(self, question: str, **kw: Any) -> RunRecord:
        raise RuntimeError(f"bad body for key {os.environ['BENCH_TEST_KEY']}\n" + "x" * 5000)

    async def aclose(self) -> None:
        pass


async def test_a_failed_sample_reason_is_clipped_and_masks_the_key(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_TEST_KEY", "sk-test-0123456789abcdef")
    pool = pool_dict(fake_server, [worker(fake_server, "w0", api_key_env="BENCH_TEST_KEY")])
    public = pool_to_public_dict(load_pool(write_pool(tmp_path / "p.yaml", pool)))
    data = make_math_file(tmp_path / "m.jsonl", 2)
    out = tmp_path / "run"
    opts = BenchOptions(out_dir=out, data_file=data)
    await run_benchmark(MATH, _Leaky(), get_grader("math"), public, opts)
    text = (out / "samples.jsonl").read_text()
    assert "sk-test-0123456789abcdef" not in text
    errors = [r["error"] for r in read_samples(out)]
    assert len(errors) == 2
    assert all(e.startswith("the run raised RuntimeError: bad body for key ***") for e in errors)
    assert all(len(e) < 600 for e in errors)


async def test_a_lone_surrogate_in_the_data_is_recorded(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", lambda r: f"\\boxed{{{number_in(r)}}} \udc80")
    strat, pool = single(tmp_path, fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 3)
    text = data.read_text().replace("Algebra", "Alg\\udc80ebra")
    data.write_text(text)
    out = tmp_path / "run"
    progress = await run_benchmark(
        MATH, strat, get_grader("math"), pool, BenchOptions(out_dir=out, data_file=data)
    )
    assert progress.done == 3 == len(read_samples(out))
    assert read_samples(out)[0]["sample_metadata"]["subject"] == "Alg\udc80ebra"


async def test_a_deeply_nested_conductor_reply_is_a_failed_record(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lambda r: "model_id = " + "[" * 100_000 + "]" * 100_000)
    pool = load_pool(bench_pool(tmp_path, fake_server))
    strat = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
    data = make_math_file(tmp_path / "m.jsonl", 4)
    out = tmp_path / "run"
    progress = await run_benchmark(
        MATH, strat, get_grader("math"), {}, BenchOptions(out_dir=out, data_file=data)
    )
    records = read_samples(out)
    assert progress.done == 4 == len(records) and progress.errors == 4
    assert all("could not be parsed" in r["error"] for r in records)


# -- a full disk ----------------------------------------------------------------------


class _FullDisk:
    """The samples file, failing with ENOSPC from its ``after``-th write on."""

    def __init__(self, fh: IO[bytes], after: int) -> None:
        self.fh, self.left = fh, after

    def write(self, data: bytes) -> int:
        if self.left <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= 1
        return self.fh.write(data)

    def close(self) -> None:
        self.fh.close()


def test_a_full_disk_stops_dispatching_and_the_run_resumes(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    script_math(fake_server)
    fake_server.latency_s = 0.02
    data = make_math_file(tmp_path / "m.jsonl", 50)
    out = tmp_path / "run"
    opened = runner.open_samples
    monkeypatch.setattr(runner, "open_samples", lambda p: _FullDisk(opened(p), after=10))
    strat, pool = single(tmp_path, fake_server)
    opts = BenchOptions(out_dir=out, data_file=data, concurrency=4, grader_concurrency=1)
    with pytest.raises(BenchStopped) as info:
        asyncio.run(run_benchmark(MATH, strat, get_grader("math"), pool, opts))
    assert "No space left on device" in str(info.value) and f"--resume {out}" in str(info.value)
    # The 10 written, and those in flight when the write failed (4 slots, 1 grader).
    assert len(fake_server.requests) <= 10 + 4 + 1
    assert len(keys(out)) == 10
    monkeypatch.setattr(runner, "open_samples", opened)
    strat, pool = single(tmp_path, fake_server)
    resumed = BenchOptions(out_dir=out, data_file=data, concurrency=4, resume=True)
    asyncio.run(run_benchmark(MATH, strat, get_grader("math"), pool, resumed))
    assert len(keys(out)) == len(set(keys(out))) == 50
    assert all(r["grade"]["status"] == "correct" for r in read_samples(out))


def test_a_full_disk_exits_1_with_how_to_resume(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conductor.cli import main

    script_math(fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 6)
    out = tmp_path / "run"
    opened = runner.open_samples
    monkeypatch.setattr(runner, "open_samples", lambda p: _FullDisk(opened(p), after=2))
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(tmp_path / "c"))
    args = ["bench", "math500", "--pool", str(bench_pool(tmp_path, fake_server)),
            "--data", str(data), "--out", str(out), "--strategy", "single:w0",
            "--concurrency", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "No space left on device" in err and "conductor bench --resume" in err
    assert len(keys(out)) == 2


# -- a refused key --------------------------------------------------------------------


@pytest.mark.process
def test_a_refused_key_stops_the_run_early(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", lambda r: Fault(401, "Incorrect API key provided: sk-te***"))
    data = make_math_file(tmp_path / "m.jsonl", 50)
    out = tmp_path / "run"
    res = cli("bench", "math500", "--pool", str(bench_pool(tmp_path, fake_server)),
              "--data", str(data), "--out", str(out), "--strategy", "single:w0",
              "--concurrency", "4", cache=tmp_path / "c")  # fmt: skip
    assert res.returncode == 1, res.stderr
    err = " ".join(res.stderr.split())
    assert "Incorrect API key provided" in err and "HTTP 401" in err
    assert f"--resume {out}" in err
    assert len(fake_server.requests) <= 4 + 2
    assert not (out / "samples.jsonl").read_text()  # refused samples run again on resume


async def test_a_refused_conductor_key_stops_the_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lambda r: Fault(403, "permission denied for model"))
    pool = load_pool(bench_pool(tmp_path, fake_server))
    strat = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
    data = make_math_file(tmp_path / "m.jsonl", 30)
    opts = BenchOptions(out_dir=tmp_path / "run", data_file=data, concurrency=2)
    with pytest.raises(BenchStopped, match="permission denied for model"):
        await run_benchmark(MATH, strat, get_grader("math"), {}, opts)
    assert len(fake_server.requests) <= 2 + 2


# -- grading never slows the requests -------------------------------------------------


class _SlowGrader:
    """Blocks every grade until released, counting how many run at once."""

    name = "math"
    version = get_grader("math").version

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.running = self.most = 0

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(30)
        with self.lock:
            self.running -= 1
        return get_grader("math").grade(response, sample)


async def test_grading_frees_the_slot_and_runs_in_its_own_pool(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    import asyncio

    script_math(fake_server)
    strat, pool = single(tmp_path, fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 4)
    grader = _SlowGrader()
    opts = BenchOptions(out_dir=tmp_path / "run", data_file=data, concurrency=1,
                        grader_concurrency=3)  # fmt: skip
    run = asyncio.create_task(run_benchmark(MATH, strat, grader, pool, opts))
    deadline = time.monotonic() + scaled(20)
    while len(fake_server.requests) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    # One slot, yet every sample's call was made while the first grade still waits.
    assert len(fake_server.requests) == 4 and grader.most == 3
    grader.release.set()
    progress = await run
    assert progress.correct == 4 and grader.most == 3


# -- guarded run directories ----------------------------------------------------------


@pytest.mark.process
def test_a_second_process_on_a_run_directory_is_refused(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    fake_server.latency_s = 0.2
    data = make_math_file(tmp_path / "m.jsonl", 40)
    out = tmp_path / "run"
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    first = subprocess.Popen(
        [sys.executable, "-m", "conductor", "bench", "math500", "--pool",
         str(bench_pool(tmp_path, fake_server)), "--data", str(data), "--out", str(out),
         "--strategy", "single:w0", "--concurrency", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + scaled(60)
        while time.monotonic() < deadline and not (out / "samples.jsonl").exists():
            time.sleep(0.05)
        second = cli("bench", "--resume", str(out), cache=tmp_path / "c")
        assert second.returncode == 2, second.stderr
        assert f"in use by another conductor process (pid {first.pid})" in " ".join(
            second.stderr.split()
        )
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    # The lock dies with its process: the killed run resumes and completes.
    res = cli("bench", "--resume", str(out), cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert len(keys(out)) == len(set(keys(out))) == 40


def _started_run(tmp_path: Path, server: FakeLLMServer, *extra: str) -> tuple[Path, list[str]]:
    """A finished 4-sample run with non-default settings, minus its last two records."""
    script_math(server)
    data = make_math_file(tmp_path / "m.jsonl", 4)
    out = tmp_path / "run"
    args = ["bench", "math500", "--pool", str(bench_pool(tmp_path, server)),
            "--data", str(data), "--epochs", "2", "--seed", "3", "--max-steps", "2",
            "--budget-usd", "5", *extra]  # fmt: skip
    res = cli(*args, "--out", str(out), cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    lines = (out / "samples.jsonl").read_text().splitlines(keepends=True)
    (out / "samples.jsonl").write_text("".join(lines[:-2]))
    return out, args


@pytest.mark.process
def test_resume_from_the_directory_alone(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    out, _ = _started_run(tmp_path, fake_server)
    n = len(fake_server.requests)
    res = cli("bench", "--resume", str(out), "--no-cache", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert len(keys(out)) == len(set(keys(out))) == 8
    assert all(r["grade"]["status"] == "correct" for r in read_samples(out))
    assert len(fake_server.requests) == n + 4  # two samples: Conductor and worker each
    config = json.loads((out / "config.json").read_text())
    assert config["invocation"]["seed"] == 3 and config["schema_version"] == 2


@pytest.mark.process
def test_resume_from_a_schema_1_directory(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    out, _ = _started_run(tmp_path, fake_server)
    config = json.loads((out / "config.json").read_text())
    for key in ("invocation", "pool_sha256"):
        del config[key]
    config["schema_version"] = 1
    # Written before the Conductor's description named its sampling and template form.
    for key in ("sampling", "template_form"):
        assert key in config["strategy_detail"]["conductor"]
        del config["strategy_detail"]["conductor"][key]
    (out / "config.json").write_text(json.dumps(config))
    res = cli("bench", "--resume", str(out), "--no-cache", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert len(keys(out)) == len(set(keys(out))) == 8


@pytest.mark.process
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("pool", "pool changed (workers[0].params.temperature was 0.2, now 0.9)"),
        ("data", "data file contents"),
        ("--strategy", "the strategy was"),
        ("--max-steps", "max_steps was 2, now 4"),
        ("--budget-usd", "settings.budget_usd was 5.0, now 1.0"),
        ("--limit", "the limit was null, now 1"),
    ],
)
def test_resume_refuses_changed_settings(
    tmp_path: Path, fake_server: FakeLLMServer, change: str, named: str
) -> None:
    out, _ = _started_run(tmp_path, fake_server)
    before = (out / "samples.jsonl").read_text()
    n = len(fake_server.requests)
    if change == "pool":
        changed = pool_dict(fake_server, [worker(fake_server, "w0"), worker(fake_server, "w1")])
        changed["workers"][0]["temperature"] = 0.9
        extra = ["--pool", str(write_pool(tmp_path / "other.yaml", changed))]
    elif change == "data":
        extra = ["--data", str(make_math_file(tmp_path / "other.jsonl", 5))]
    else:
        value = {"--strategy": "single:w0", "--max-steps": "4", "--budget-usd": "1",
                 "--limit": "1"}[change]  # fmt: skip
        extra = [change, value]
    res = cli("bench", "--resume", str(out), *extra, cache=tmp_path / "c")
    assert res.returncode == 2, res.stderr
    assert named in " ".join(res.stderr.split())
    assert len(fake_server.requests) == n
    assert (out / "samples.jsonl").read_text() == before


@pytest.mark.process
def test_resume_accepts_a_moved_pool_with_a_new_time_out(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    out, _ = _started_run(tmp_path, fake_server)
    # Another path, and a longer time-out: neither decides an answer.
    moved = tmp_path / "moved.yaml"
    moved.write_text((tmp_path / "pool.yaml").read_text().replace("timeout_s: 10", "timeout_s: 30"))
    assert "timeout_s: 30" in moved.read_text()
    res = cli("bench", "--resume", str(out), "--pool", str(moved), "--concurrency", "3",
              cache=tmp_path / "c")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert len(keys(out)) == 8


@pytest.mark.process
def test_resume_a_singles_run_from_its_directory(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 3)
    out = tmp_path / "singles"
    res = cli("bench", "math500", "--pool", str(bench_pool(tmp_path, fake_server)),
              "--data", str(data), "--strategy", "singles", "--out", str(out),
              cache=tmp_path / "c")  # fmt: skip
    assert res.returncode == 0, res.stderr
    for d in ("single-w0", "single-w1"):
        lines = (out / d / "samples.jsonl").read_text().splitlines(keepends=True)
        (out / d / "samples.jsonl").write_text(lines[0])
    res = cli("bench", "--resume", str(out), "--no-cache", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert len(keys(out / "single-w0")) == len(keys(out / "single-w1")) == 3
    assert {r["conductor"]["strategy"] for r in read_samples(out / "single-w1")} == {"single:w1"}


async def test_an_error_outside_any_sample_stops_the_run_with_its_reason(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    strat, pool = single(tmp_path, fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 20)

    def progress(p: Any) -> None:
        if p.done == 3:
            raise KeyError("display broke")

    opts = BenchOptions(out_dir=tmp_path / "run", data_file=data, concurrency=2,
                        grader_concurrency=1)  # fmt: skip
    with pytest.raises(BenchStopped, match="unexpected error .KeyError: 'display broke'"):
        await run_benchmark(MATH, strat, get_grader("math"), pool, opts, on_progress=progress)
    # The three that were counted, and at most those already being written alongside;
    # each once.  Nothing new is dispatched.
    written = [r["sample_id"] for r in read_samples(tmp_path / "run")]
    assert 3 <= len(written) <= 3 + 2 + 1 and len(set(written)) == len(written)
    assert len(fake_server.requests) <= 3 + 2 + 1  # written, and in flight (2 slots, 1 grader)


class _Instant:
    """A strategy that answers at once: samples finish as fast as the loop can turn."""

    name = "instant"

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}

    async def run(self, question: str, **kw: Any) -> RunRecord:
        await asyncio.sleep(0)
        return RunRecord(
            question=question, pool={}, conductor={}, settings={}, status="ok",
            final_answer="\\boxed{1}",
        )  # fmt: skip

    async def aclose(self) -> None:
        pass


async def test_a_stop_never_strands_the_dispatcher(tmp_path: Path) -> None:
    # With instant samples the dispatcher often starts a task that the stop then cancels
    # before its first step; that task must still give back its slot, or the run hangs
    # waiting for one (it did, about one run in two, before).
    data = make_math_file(tmp_path / "m.jsonl", 20)

    def progress(p: Any) -> None:
        if p.done == 3:
            raise KeyError("display broke")

    for i in range(40):
        opts = BenchOptions(out_dir=tmp_path / f"run{i}", data_file=data, concurrency=2,
                            grader_concurrency=1)  # fmt: skip
        run = run_benchmark(MATH, _Instant(), get_grader("math"), {}, opts, on_progress=progress)
        with pytest.raises(BenchStopped, match="display broke"):
            await asyncio.wait_for(run, timeout=30)
        assert 3 <= len(read_samples(tmp_path / f"run{i}")) <= 20


# -- a directory that already holds a run --------------------------------------------


@pytest.mark.process
def test_a_complete_run_is_named_complete_and_overwrite_starts_it_again(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 3)
    out = tmp_path / "run"
    args = ["bench", "math500", "--pool", str(bench_pool(tmp_path, fake_server)),
            "--data", str(data), "--out", str(out)]  # fmt: skip
    assert cli(*args, cache=tmp_path / "c").returncode == 0
    first = read_samples(out)
    # The same command again: the run is complete; how to see it, how to start again.
    again = cli(*args, cache=tmp_path / "c")
    assert again.returncode == 2, again.stderr
    said = " ".join(again.stderr.split())
    assert f"{out} already holds this run, and it is complete (3 samples recorded)" in said
    assert f"`conductor report {out}`" in said and "pass --overwrite" in said
    # A resume of it has nothing to do, says so and succeeds, writing no record.
    n = len(fake_server.requests)
    resumed = cli("bench", "--resume", str(out), "--no-cache", cache=tmp_path / "c")
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert f"nothing to resume: the run in {out} is complete (3 samples recorded)" in said
    assert read_samples(out) == first and len(fake_server.requests) == n
    # --overwrite starts it again from nothing, deleting only what bench wrote (with
    # the temporary file of a summary whose writer was killed mid-write).
    (out / "notes.txt").write_text("mine")
    (out / ".summary.json.4242.0a1b2c3d4e5f.tmp").write_text('{"half')
    (out / ".notes.txt.4242.0a1b2c3d4e5f.tmp").write_text("mine too")
    redone = cli(*args, "--overwrite", "--no-cache", cache=tmp_path / "c")
    assert redone.returncode == 0, redone.stderr
    second = read_samples(out)
    assert len(second) == 3 and len(fake_server.requests) == n + 6
    assert {r["run_id"] for r in second}.isdisjoint(r["run_id"] for r in first)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / ".notes.txt.4242.0a1b2c3d4e5f.tmp").read_text() == "mine too"
    assert not (out / ".summary.json.4242.0a1b2c3d4e5f.tmp").exists()
    assert (out / "summary.json").is_file() and (out / "config.json").is_file()


@pytest.mark.process
def test_a_directory_holding_part_of_a_run_or_another_run_says_which(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    out, args = _started_run(tmp_path, fake_server)
    res = cli(*args, "--out", str(out), cache=tmp_path / "c")
    assert res.returncode == 2, res.stderr
    said = " ".join(res.stderr.split())
    assert f"{out} already holds this run, 6 of 8 samples recorded" in said
    assert f"pass --resume {out}" in said and "--overwrite" in said
    other = cli(*args, "--out", str(out), "--seed", "5", cache=tmp_path / "c")
    assert other.returncode == 2, other.stderr
    said = " ".join(other.stderr.split())
    assert f"{out} already holds another run (the seed was 3, now 5)" in said
    assert "--overwrite to replace it" in said
    both = cli(*args, "--resume", str(out), "--overwrite", cache=tmp_path / "c")
    assert both.returncode == 2 and "not both" in both.stderr
    assert len(keys(out)) == 6


@pytest.mark.process
def test_overwrite_refuses_a_directory_that_is_not_a_run_directory(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 2)
    # What `conductor serve --records DIR` writes: a samples.jsonl without a config.json.
    records = tmp_path / "served"
    records.mkdir()
    (records / "samples.jsonl").write_text('{"run_id": "r1"}\n')
    res = cli("bench", "math500", "--pool", str(bench_pool(tmp_path, fake_server)),
              "--data", str(data), "--out", str(records), "--overwrite",
              cache=tmp_path / "c")  # fmt: skip
    assert res.returncode == 2, res.stderr
    said = " ".join(res.stderr.split())
    assert f"--overwrite: {records} does not look like a bench run directory" in said
    assert "nothing was deleted" in said
    assert (records / "samples.jsonl").read_text() == '{"run_id": "r1"}\n'
    assert [p.name for p in records.iterdir()] == ["samples.jsonl"]  # not even a lock
    assert fake_server.requests == []
