"""Many ``conductor bench`` processes on one run (``--state``), on a real redis-server
and the fake provider server: each pair recorded once, a killed process's pairs taken
up by the others, one spend cap for all, and a lost server stopping the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kit.benchkit import make_math_file, script_math
from kit.clock import scaled
from kit.poolkit import invoke_cli, pool_dict, worker, write_pool
from kit.redisserver import RedisServer

from conductor.bench.shared import LEASE_ENV, RunShare
from conductor.grading.types import Sample
from conductor.runs.lock import join_run_dir, share_lock
from conductor.runs.rundir import STATE_TOKEN, SampleLines, record_line
from conductor.runs.summary import write_summary
from conductor.state import StateURL
from conductor.state.claims import RunClaims
from conductor.testing import FakeLLMServer

pytestmark = pytest.mark.process  # bench processes and a redis-server

N = 60
#: The runs that stop part-way need fewer questions.
M = 30
#: A dollar a thousand tokens, in and out: the fake server counts words as tokens.
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def pool(tmp_path: Path, fake: FakeLLMServer) -> Path:
    workers = [worker(fake, "w0", price=PRICE), worker(fake, "w1", price=PRICE)]
    return write_pool(tmp_path / "pool.yaml", pool_dict(fake, workers, price=PRICE))


def start(tmp_path: Path, i: int, *args: str, lease_s: float = 30.0) -> subprocess.Popen[str]:
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / f"cache{i}"),
           "CONDUCTOR_STATE_LEASE_S": str(lease_s), "COLUMNS": "200"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "conductor", "bench", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    done = []
    for p in procs:
        out, err = p.communicate(timeout=scaled(240))
        done.append((p.returncode, " ".join((out + err).split())))
    return done


def lines(run: Path) -> tuple[list[dict[str, Any]], int]:
    """Every record line of the run as written (duplicates kept), and the lines the
    reader skipped (torn or garbled)."""
    reader = SampleLines(run / "samples.jsonl")
    records = [data for _n, data in reader]
    return records, reader.skipped


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + scaled(120)
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def outcome(records: list[dict[str, Any]]) -> set[tuple[str, int, str, str]]:
    return {(r["sample_id"], r["epoch"], r["grade"]["status"], r["final_answer"]) for r in records}


def test_three_processes_record_every_sample_once_as_one_process_does(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer
) -> None:
    script_math(fake_server)
    fake_server.latency_s = 0.05  # the three overlap
    data = make_math_file(tmp_path / "math.jsonl", N)
    common = ("math500", "--pool", str(pool(tmp_path, fake_server)), "--data", str(data),
              "--concurrency", "2")  # fmt: skip
    alone = tmp_path / "alone"
    res = invoke_cli("bench", *common, "--out", str(alone),
                     env={"CONDUCTOR_CACHE_DIR": str(tmp_path / "c")})  # fmt: skip
    assert res.returncode == 0, res.stderr
    run = tmp_path / "run"
    procs = [
        start(tmp_path, i, *common, "--out", str(run), "--state", server.url) for i in range(3)
    ]
    results = finish(procs)
    assert [code for code, _ in results] == [0, 0, 0], results
    records, skipped = lines(run)
    keys = Counter((r["sample_id"], r["epoch"]) for r in records)
    assert len(keys) == N and set(keys.values()) == {1} and skipped == 0
    assert outcome(records) == outcome(lines(alone)[0])
    # Each process ran some: the run was shared, not taken whole by the first.
    report = invoke_cli("report", str(run))
    assert report.returncode == 0 and f"{N}" in report.stdout, report.stderr


def test_a_killed_process_leaves_its_samples_to_the_others(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer
) -> None:
    script_math(fake_server)
    fake_server.latency_s = 0.1
    data = make_math_file(tmp_path / "math.jsonl", M)
    run = tmp_path / "run"
    common = ("math500", "--pool", str(pool(tmp_path, fake_server)), "--data", str(data),
              "--concurrency", "2", "--out", str(run), "--state", server.url)  # fmt: skip
    procs = [start(tmp_path, i, *common, lease_s=1.5) for i in range(3)]
    wait_for(lambda: len(lines(run)[0]) >= 10, "records being written")
    procs[0].send_signal(signal.SIGKILL)  # mid-run, its two samples in flight
    results = finish(procs)
    assert results[0][0] == -signal.SIGKILL
    assert [code for code, _ in results[1:]] == [0, 0], results
    records, skipped = lines(run)
    keys = Counter((r["sample_id"], r["epoch"]) for r in records)
    assert len(keys) == M, "a sample was lost"
    assert set(keys.values()) == {1}, "a sample was recorded twice"
    # A line torn by the kill (if its write was cut) is skipped, and its pair ran again.
    assert skipped <= 1


def test_the_cap_holds_for_all_the_processes_together(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer
) -> None:
    script_math(fake_server)
    fake_server.latency_s = 0.05
    data = make_math_file(tmp_path / "math.jsonl", M)
    run = tmp_path / "run"
    common = ("math500", "--pool", str(pool(tmp_path, fake_server)), "--data", str(data),
              "--concurrency", "1", "--out", str(run), "--state", server.url,
              "--max-usd", "5")  # fmt: skip
    results = finish([start(tmp_path, i, *common) for i in range(3)])
    records, _ = lines(run)
    costs = [r["totals"]["cost_usd"] for r in records]
    assert all(code == 1 and "reaching its --max-usd $5.0000" in text for code, text in results)
    # The bound: the cap, passed by at most the samples in flight when it was reached,
    # one per process at --concurrency 1.
    assert 5 <= sum(costs) <= 5 + 3 * max(costs) + 1e-9
    assert len(records) < M
    assert len({(r["sample_id"], r["epoch"]) for r in records}) == len(records)


@pytest.mark.parametrize("loss", ["killed", "restarted empty"])
def test_a_lost_state_server_stops_the_run_closed(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer, loss: str
) -> None:
    script_math(fake_server)
    fake_server.latency_s = 0.1
    data = make_math_file(tmp_path / "math.jsonl", M)
    run = tmp_path / "run"
    common = ("math500", "--pool", str(pool(tmp_path, fake_server)), "--data", str(data),
              "--concurrency", "2", "--out", str(run), "--state", server.url)  # fmt: skip
    procs = [start(tmp_path, i, *common) for i in range(2)]
    wait_for(lambda: len(lines(run)[0]) >= 5, "records being written")
    if loss == "killed":
        server.stop()
    else:  # reachable, but holding nothing: a fresh claim or spend would start from zero
        redis.Redis.from_url(server.url).flushall()
    results = finish(procs)
    for code, text in results:
        assert code == 1, text
        assert f"stopped: the state server at {server.url} cannot be trusted" in text
        assert text.count("WARNING: the state server") == 1  # one line in the log
        assert f"continue with `conductor bench --resume {run} --state {server.url}`" in text
    asked = len(fake_server.requests)
    records, _ = lines(run)
    assert 5 <= len(records) < M
    assert len({(r["sample_id"], r["epoch"]) for r in records}) == len(records)
    time.sleep(0.5)
    assert len(fake_server.requests) == asked  # nothing left running


def test_who_may_join_a_shared_run_and_who_is_refused(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 2)
    run = tmp_path / "run"
    common = ("bench", "math500", "--pool", str(pool(tmp_path, fake_server)), "--data",
              str(data), "--out", str(run))  # fmt: skip
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    first = invoke_cli(*common, "--state", server.url, env=env)
    assert first.returncode == 0, first.stderr
    asked = len(fake_server.requests)
    lock, alone = join_run_dir(run)  # as a process still running the run holds it
    try:
        assert alone
        share_lock(lock)
        refusals = {
            "is in use by another conductor process": invoke_cli(*common, env=env),
            "is being run by other conductor processes (--state); stop them first": (
                invoke_cli(*common, "--overwrite", "--state", server.url, env=env)
            ),
            "cannot join the processes running it: the seed was 0, now 7": (
                invoke_cli(*common, "--seed", "7", "--state", server.url, env=env)
            ),
        }
        for sentence, res in refusals.items():
            assert res.returncode == 2 and sentence in " ".join(res.stderr.split()), res.stderr
        joined = invoke_cli(*common, "--state", server.url, env=env)  # the same run
        assert joined.returncode == 0, joined.stderr
    finally:
        lock.close()
    assert len(fake_server.requests) == asked  # every sample was done already


def test_a_sample_longer_than_its_lease_is_run_and_recorded_once(
    tmp_path: Path, fake_server: FakeLLMServer, server: RedisServer
) -> None:
    # Each call outlasts a lease, each sample two calls: only the heartbeat keeps the others off it
    # (without it, they take it over and ask again), and only the check on the lease
    # before the write keeps a second line out.
    script_math(fake_server)
    fake_server.latency_s = 2.5
    n = 4
    data = make_math_file(tmp_path / "math.jsonl", n)
    run = tmp_path / "run"
    common = ("math500", "--pool", str(pool(tmp_path, fake_server)), "--data", str(data),
              "--concurrency", "2", "--out", str(run), "--state", server.url)  # fmt: skip
    results = finish([start(tmp_path, i, *common, lease_s=2.0) for i in range(2)])
    assert [code for code, _ in results] == [0, 0], results
    records, _ = lines(run)
    assert Counter(r["sample_id"] for r in records) == {
        f"math500/test/synthetic/{i}.json": 1 for i in range(n)
    }
    asked = Counter(r.messages[-1]["content"] for r in fake_server.requests_for("w0"))
    assert len(asked) == n and set(asked.values()) == {1}, asked


def test_processes_ending_together_leave_one_whole_summary(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Threads stand for the processes, each writing through a temporary file of its
    # own.  (Through one fixed temporary name, as before, a rename found the file another
    # renamed, or renamed another writer's half-written bytes.)
    script_math(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 2)
    run = tmp_path / "run"
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    res = invoke_cli("bench", "math500", "--pool", str(pool(tmp_path, fake_server)), "--data",
                     str(data), "--out", str(run), env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    failures: list[BaseException] = []

    def write() -> None:
        for _ in range(40):
            try:
                write_summary(run)
            except OSError as exc:
                failures.append(exc)

    writing = threading.Event()
    writing.set()
    torn: list[str] = []

    def read() -> None:  # a reader never finds half a summary
        while writing.is_set():
            text = (run / "summary.json").read_text()
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)

    threads = [threading.Thread(target=write) for _ in range(4)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writing.clear()
    reader.join()
    assert torn == []
    json.loads((run / "summary.json").read_text())
    assert failures == []
    assert sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp")) == []


@pytest.mark.parametrize("recorded", [True, False])
def test_a_pair_written_by_a_process_killed_before_marking_it_done_is_not_run_again(
    tmp_path: Path, server: RedisServer, monkeypatch: pytest.MonkeyPatch, recorded: bool
) -> None:
    # The window of the record protocol between the append and ``finish``: the holder's
    # line is in the file, the pair not done, its lease lapsing (no heartbeat: dead).
    # Whoever retakes it finds the line and marks it done; with no line, it runs it.
    # (Without the look-up, the retaker ran it too: two lines for one pair.)
    monkeypatch.setenv(LEASE_ENV, "0.3")
    run = tmp_path / "run"
    run.mkdir()
    first = RunShare(StateURL.parse(server.url), run)
    first.start(0.0)
    token = (run / STATE_TOKEN).read_text().strip()
    dead = RunClaims(StateURL.parse(server.url), token, lease_s=0.3)
    assert dead.claim("s/1", 0) == "claimed"
    if recorded:
        with (run / "samples.jsonl").open("a") as fh:
            fh.write("\n" + record_line({"sample_id": "s/1", "epoch": 0, "status": "ok"}))

    async def taken() -> list[str]:
        work = iter([(Sample(id="s/1", input={}, gold=None), 0)])
        got = []
        async for sample, epoch in first.claimed(work, halted=lambda: False):
            got.append(sample.id)
            first.settle(sample.id, epoch)  # as the runner does once it has ended
        return got

    try:
        got = asyncio.run(taken())  # waits out the dead holder's lease
        assert got == ([] if recorded else ["s/1"])
        assert first.claims is not None
        assert first.claims.claim("s/1", 0) == ("done" if recorded else "claimed")
    finally:
        first.close()
        dead.close()
