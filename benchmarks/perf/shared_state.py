"""Many ``conductor bench`` processes sharing one state server (``--state``), measured.

Run:  python benchmarks/perf/shared_state.py [--smoke] [--questions N] [--rpm R]

A real ``redis-server`` (started here on a free 127.0.0.1 port) and the fake OpenAI
provider (:class:`conductor.testing.FakeLLMServer`, in this process, recording every
request) serve three ``conductor bench math500`` processes.  The data repeats: N/3
distinct questions, each three times under different ids, the copies side by side, so
that the processes ask identical calls at the same moment.  Default 3 processes x 3,000
questions and ``rpm: 3000``; ``--smoke`` (CI): 3 x 60 and ``rpm: 600`` (seconds).

1. Identical calls: with ``--state`` (one run directory, one shared call cache) each
   distinct request body reaches the provider once; the contrast is today's way, three
   processes each with its own cache and a static ``--shard i/3``, which pays copies.
2. The rate: the worker states ``rpm: R`` (the Conductor shares its provider key);
   arrivals at the fake server over the run's steady part (its middle 80%) against R
   (within 5%); without ``--state`` each process keeps its own R (about 3R).
3. ``--max-usd``: three processes on distinct questions with one cap; what was spent
   (the records' cost, and the fake server's view: every request's words as tokens at
   the pool's price) against the cap, passed by at most the samples in flight when it
   was reached (processes x --concurrency x the dearest sample).
4. SIGKILL one of three processes mid-run: the others finish the run (or a ``--resume``
   does), with no pair lost, none recorded twice, no torn line, and the records'
   (id, epoch, verdict, answer) equal to a one-process run's.

Also: CPU seconds per sample of one process alone, with and without ``--state``, with
the load average beside every timing.  Judged lines read ``figure ... target ...
PASS|FAIL``; the exit status is 1 when one says FAIL (with ``--smoke``, one of
records, calls or spend: the rate's line is then the log's).  Without
``redis-server`` or the ``redis`` package the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from conductor.runs.rundir import SampleLines  # noqa: E402
from conductor.testing import FakeLLMServer, FakeRequest  # noqa: E402
from conductor.testing.fake_wire import word_count  # noqa: E402

PROCESSES = 3
COPIES = 3
#: $1,000 a million tokens in and out: a thousandth of a dollar a word at the fake server.
PRICE_PER_MTOK = 1000.0
PLAN = 'The plan follows.\nmodel_id = [0]\nsubtasks = ["Solve the problem."]\naccess_list = [[]]\n'
_QUESTION = re.compile(r"What is (\d+) \+ 0\?")

Outcome = set[tuple[str, int, str, str]]


def reply(request: FakeRequest) -> str:
    """The worker's answer: right on every question (the fake server's responder)."""
    m = _QUESTION.search(request.messages[-1]["content"])
    return f"Easy. \\boxed{{{m.group(1) if m else -1}}}"


def reply_text(request: FakeRequest) -> str:
    return PLAN if request.model == "conductor-7b" else reply(request)


def load() -> str:
    return "load " + "/".join(f"{x:.2f}" for x in os.getloadavg())


class Verdicts:
    """The judged lines printed so far; ``failed`` when one said FAIL.  A line of
    ``timing`` (the rate) fails the run only when ``timings`` count: a smoke run's few
    dozen arrivals on a busy machine are a figure for the log, not a verdict; what is
    recorded, paid and lost is judged at every size."""

    def __init__(self, *, timings: bool = True) -> None:
        self.failed = False
        self.timings = timings

    def __call__(
        self, figure: str, value: str, target: str, ok: bool, *, timing: bool = False
    ) -> None:
        if self.timings or not timing:
            self.failed |= not ok
        print(f"{figure:<44} {value:<34} target {target:<26} {'PASS' if ok else 'FAIL'}")


@contextmanager
def redis_server(binary: str) -> Iterator[str]:
    """A ``redis-server`` of its own (no persistence) on a free port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    home = Path(tempfile.mkdtemp(prefix="conductor-redis-"))
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(home)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)


def flush(url: str) -> None:
    """An empty state server, so that a phase finds nothing another one left."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()


def write_data(path: Path, distinct: int, copies: int) -> Path:
    """``distinct`` questions, each ``copies`` times under its own id, copies adjacent."""
    with path.open("w") as fh:
        for i in range(distinct):
            for c in range(copies):
                item = {"problem": f"What is {i} + 0?", "answer": str(i), "subject": "Algebra",
                        "level": 1, "unique_id": f"copy{c}/{i}.json"}  # fmt: skip
                fh.write(json.dumps(item) + "\n")
    return path


def write_pool(path: Path, base: str, rpm: float | None) -> Path:
    price = {"input_per_mtok": PRICE_PER_MTOK, "output_per_mtok": PRICE_PER_MTOK}
    w0: dict[str, Any] = {"id": "w0", "model": "w0", "client": "openai", "api_base": base,
                          "max_retries": 2, "timeout_s": 30, "max_concurrency": 64,
                          "price": price}  # fmt: skip
    if rpm is not None:
        w0["rpm"] = rpm
    pool = {
        "name": "fake",
        "defaults": {"temperature": 0.2, "max_tokens": 256},
        "workers": [w0],
        "conductor": {
            "backend": "endpoint",
            "model": "conductor-7b",
            "api_base": base,
            "max_retries": 1,
            "price": price,
        },  # fmt: skip
    }
    path.write_text(json.dumps(pool))  # JSON is YAML
    return path


class Bench:
    """``conductor bench math500`` processes of one phase, their output in files."""

    def __init__(self, work: Path, pool: Path, data: Path) -> None:
        self.work, self.pool, self.data = work, pool, data
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, name: str, out: Path, *extra: str, lease_s: float = 30.0) -> None:
        log = self.work / f"{name}.log"
        env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(self.work / f"cache-{name}"),
               "CONDUCTOR_STATE_LEASE_S": str(lease_s), "COLUMNS": "200"}  # fmt: skip
        cmd = [sys.executable, "-m", "conductor", "bench", "math500", "--pool", str(self.pool),
               "--data", str(self.data), "--out", str(out), *extra]  # fmt: skip
        with log.open("wb") as fh:
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT))
        self.logs.append(log)

    def wait(self) -> list[int]:
        codes = [p.wait(timeout=1800) for p in self.procs]
        return codes

    def tail(self, i: int) -> str:
        return " ".join(self.logs[i].read_text(errors="replace").split())[-400:]


def records(run: Path) -> tuple[list[dict[str, Any]], int]:
    """Every record line of the run as written (copies kept), and the lines skipped as
    torn or garbled."""
    reader = SampleLines(run / "samples.jsonl")
    return [data for _n, data in reader], reader.skipped


def written(run: Path) -> int:
    """About how many records the run holds while it runs (its line ends: read as
    records, a line caught mid-write would be logged as torn)."""
    try:
        return (run / "samples.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def outcome(rows: list[dict[str, Any]]) -> Outcome:
    """Each record's (id, epoch, verdict, answer); a sample that failed (no grade) has
    the verdict ``error``, so the comparison says "differ" rather than crashing."""
    return {
        (r["sample_id"], r["epoch"], r["grade"]["status"] if r["grade"] else "error",
         r["final_answer"])
        for r in rows
    }  # fmt: skip


def body_key(request: FakeRequest) -> str:
    return json.dumps(request.body, sort_keys=True)


def steady_rpm(requests: list[FakeRequest]) -> float:
    """Requests a minute over the middle 80% of the arrivals (the start's burst and the
    tail's stragglers left out)."""
    times = sorted(r.received_at for r in requests)
    lo, hi = len(times) // 10, len(times) - 1 - len(times) // 10
    if hi <= lo or times[hi] <= times[lo]:
        return float("nan")
    return (hi - lo) / (times[hi] - times[lo]) * 60


def cpu_alone(
    work: Path, pool: Path, data: Path, n: int, state: str | None
) -> tuple[float, float, list[dict[str, Any]]]:
    """One process on the whole data: CPU seconds a sample, wall seconds, its records."""
    name = "alone-state" if state else "alone"
    bench = Bench(work, pool, data)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    bench.start(name, work / name, "--concurrency", "16", *(("--state", state) if state else ()))
    (code,) = bench.wait()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"{name}: exit {code}: {bench.tail(0)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows, _ = records(work / name)
    return cpu / n, wall, rows


def phase_calls_and_rate(
    fake: FakeLLMServer,
    work: Path,
    url: str,
    data: Path,
    n: int,
    rpm: float,
    judge: Verdicts,
    alone: Outcome,
) -> None:
    pool = write_pool(work / "pool-rpm.json", fake.openai_base, rpm)
    seen: dict[str, tuple[Counter[str], float]] = {}
    for mode in ("state", "shards"):
        flush(url)
        mark = len(fake.requests)
        bench = Bench(work / mode, pool, data)
        bench.work.mkdir()
        for i in range(PROCESSES):
            if mode == "state":
                bench.start(f"p{i}", work / mode / "run", "--concurrency", "16", "--state", url)
            else:
                bench.start(f"p{i}", work / mode / f"run{i}", "--concurrency", "16",
                            "--shard", f"{i}/{PROCESSES}")  # fmt: skip
        codes = bench.wait()
        if codes != [0] * PROCESSES:
            raise RuntimeError(f"{mode}: exits {codes}: {bench.tail(codes.index(max(codes)))}")
        asked = fake.requests[mark:]
        seen[mode] = (Counter(body_key(r) for r in asked), steady_rpm(asked))
        print(f"  {mode}: {len(asked)} provider calls, {load()}", flush=True)
        if mode == "state":
            rows, torn = records(work / mode / "run")
            pairs = Counter((r["sample_id"], r["epoch"]) for r in rows)
            judge("shared run: pairs recorded / twice / torn",
                  f"{len(pairs)} / {sum(v > 1 for v in pairs.values())} / {torn}",
                  f"{n} / 0 / 0", len(pairs) == n and len(rows) == n and torn == 0)  # fmt: skip
            judge("shared run's (id, epoch, verdict, answer)",
                  "same as one process" if outcome(rows) == alone else "differ",
                  "same as one process", outcome(rows) == alone)  # fmt: skip
    by_body, rate = seen["state"]
    distinct = 2 * n // COPIES  # a Conductor call and a worker call for each text
    judge("--state: calls per distinct request (max)", str(max(by_body.values())), "1",
          max(by_body.values()) == 1)  # fmt: skip
    calls = sum(by_body.values())
    judge("--state: provider calls / distinct bodies", f"{calls} / {len(by_body)}",
          f"{distinct} / {distinct}", calls == len(by_body) == distinct)  # fmt: skip
    shard_bodies, shard_rate = seen["shards"]
    print(f"  contrast, own caches and --shard i/3: max {max(shard_bodies.values())} calls a body, "
          f"{sum(shard_bodies.values())} calls for {len(shard_bodies)} bodies")  # fmt: skip
    judge("--state: aggregate rate (rpm, steady part)", f"{rate:.0f} ({load()})",
          f"{rpm:.0f} +-5%", abs(rate - rpm) <= 0.05 * rpm, timing=True)  # fmt: skip
    print(f"  contrast, no --state: aggregate {shard_rate:.0f} rpm "
          f"({shard_rate / rpm:.2f}x the stated {rpm:.0f})")  # fmt: skip


def phase_cap(
    fake: FakeLLMServer, work: Path, url: str, n: int, per_sample: float, judge: Verdicts
) -> None:
    data = write_data(work / "distinct.jsonl", n, 1)
    pool = write_pool(work / "pool.json", fake.openai_base, None)
    flush(url)
    mark = len(fake.requests)
    fake.latency_s = 0.02  # samples overlap: some are in flight when the cap is reached
    concurrency = 2
    # The cap: about a third of what the whole data would cost (``per_sample``: the
    # dearest sample of the one-process run).
    cap = round(n * per_sample / 3, 2)
    bench = Bench(work, pool, data)
    run = work / "capped"
    for i in range(PROCESSES):
        bench.start(f"cap{i}", run, "--concurrency", str(concurrency), "--state", url,
                    "--max-usd", str(cap))  # fmt: skip
    codes = bench.wait()
    fake.latency_s = 0.0
    stopped = all("--max-usd" in bench.tail(i) for i in range(PROCESSES))
    rows, _ = records(run)
    costs = [r["totals"]["cost_usd"] for r in rows]
    dearest = max(costs)
    bound = cap + PROCESSES * concurrency * dearest
    paid = sum(
        (sum(word_count(m["content"]) for m in r.messages) + word_count(reply_text(r)))
        * PRICE_PER_MTOK / 1e6
        for r in fake.requests[mark:]
    )  # fmt: skip
    print(f"  cap ${cap:.2f}: {len(rows)} of {n} samples recorded, exits {codes}; bound = cap "
          f"+ {PROCESSES} processes x --concurrency {concurrency} x ${dearest:.4f}")  # fmt: skip
    judge("--max-usd: records' cost", f"${sum(costs):.4f}", f"${cap:.2f}..${bound:.4f}",
          stopped and cap <= sum(costs) + 1e-9 and sum(costs) <= bound + 1e-9)  # fmt: skip
    judge("--max-usd: the provider's view (tokens x price)", f"${paid:.4f}",
          f"<= ${bound:.4f}", paid <= bound + 1e-9)  # fmt: skip


def phase_kill(
    fake: FakeLLMServer, work: Path, url: str, data: Path, n: int, judge: Verdicts, alone: Outcome
) -> None:
    pool = write_pool(work / "pool.json", fake.openai_base, None)
    flush(url)
    fake.latency_s = 0.02
    run = work / "killed"
    bench = Bench(work, pool, data)
    for i in range(PROCESSES):
        bench.start(f"kill{i}", run, "--concurrency", "4", "--state", url, lease_s=1.5)
    deadline = time.monotonic() + 600
    while written(run) < n // 3:
        if time.monotonic() > deadline or bench.procs[0].poll() is not None:
            raise RuntimeError("the run ended (or stalled) before the kill")
        time.sleep(0.02)
    at = written(run)
    bench.procs[0].send_signal(signal.SIGKILL)
    codes = bench.wait()
    resumed = ""
    if len({(r["sample_id"], r["epoch"]) for r in records(run)[0]}) < n:
        again = Bench(work, pool, data)
        again.start("resume", run, "--resume", str(run), "--state", url)
        resumed = f", then --resume exit {again.wait()[0]}"
    fake.latency_s = 0.0
    rows, torn = records(run)
    pairs = Counter((r["sample_id"], r["epoch"]) for r in rows)
    # A live process that lost a lease while writing says so (bench/shared.py); a copy
    # with no such line was written by the killed process before it marked the pair done.
    lapsed = sum(log.read_text().count("its lease lapsed") for log in bench.logs[1:])
    print(f"  killed process 0 at {at} records; exits {codes}{resumed}; the others' "
          f"lapsed-lease warnings: {lapsed}")  # fmt: skip
    judge("SIGKILL: lost / twice / torn",
          f"{n - len(pairs)} / {sum(v > 1 for v in pairs.values())} / {torn}", "0 / 0 / 0",
          len(pairs) == n and len(rows) == n and torn == 0)  # fmt: skip
    judge("SIGKILL: (id, epoch, verdict, answer)",
          "same as one process" if outcome(rows) == alone else "differ", "same as one process",
          outcome(rows) == alone)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=3000, help="questions in the data")
    parser.add_argument("--rpm", type=float, default=3000.0, help="the worker's stated rate")
    parser.add_argument("--smoke", action="store_true", help="3 x 60 questions (seconds, for CI)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.rpm = 60, 600.0
    binary = shutil.which("redis-server")
    try:
        import redis  # noqa: F401
    except ImportError:
        print("skipped: the `redis` package is missing (pip install 'conductor[state]')")
        return 0
    if binary is None:
        print("skipped: redis-server is not installed (Debian: apt-get install redis-server)")
        return 0
    # The killed process's requests in flight end in a reset the fake server would log
    # with a traceback: expected here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    n = args.questions - args.questions % COPIES
    print(f"{PROCESSES} processes x {n} questions ({n // COPIES} distinct, {COPIES} copies each), "
          f"rpm {args.rpm:.0f}; {os.cpu_count()} CPUs, {load()}")  # fmt: skip
    judge = Verdicts(timings=not args.smoke)
    with (
        tempfile.TemporaryDirectory(prefix="shared-state-") as tmp,
        redis_server(binary) as url,
        FakeLLMServer() as fake,
    ):
        work = Path(tmp)
        fake.script("conductor-7b", PLAN)
        fake.script("w0", reply)
        data = write_data(work / "repeats.jsonl", n // COPIES, COPIES)
        pool = write_pool(work / "pool.json", fake.openai_base, None)
        per_sample, wall, rows = cpu_alone(work, pool, data, n, None)
        alone = outcome(rows)
        dearest = max(r["totals"]["cost_usd"] for r in rows)
        print(f"one process, own cache:   {per_sample * 1000:.2f} ms CPU a sample, "
              f"{wall:.1f} s wall, {load()}")  # fmt: skip
        flush(url)
        per_sample, wall, rows = cpu_alone(work, pool, data, n, url)
        print(f"one process, --state:     {per_sample * 1000:.2f} ms CPU a sample, "
              f"{wall:.1f} s wall, {load()}")  # fmt: skip
        judge("one process --state: same records", "same" if outcome(rows) == alone else "differ",
              "same", outcome(rows) == alone)  # fmt: skip
        phase_calls_and_rate(fake, work, url, data, n, args.rpm, judge, alone)
        phase_cap(fake, work, url, n, dearest, judge)
        phase_kill(fake, work, url, data, n, judge, alone)
    print(f"done, {load()}")
    return 1 if judge.failed else 0


if __name__ == "__main__":
    sys.exit(main())
