"""``conductor bench --ray`` on a local cluster of three nodes sharing one state server,
measured against a one-process run.

Run:  python benchmarks/perf/ray_bench.py [--smoke] [--questions N] [--rpm R] [--nodes K]

The figures of benchmarks/perf/shared_state.py (three bench processes on one state
server), here for one bench driver whose samples run as Ray tasks on K worker nodes;
its data, pool, fake provider, record checks and judged lines are that script's (it is
imported, not copied).  A local cluster (``ray.cluster_utils.Cluster``: a head with no
CPU, which runs nothing, and K worker nodes of ``--cpus`` CPUs each, all processes of
this machine), a real ``redis-server`` and the fake OpenAI provider (in this process,
recording every request).  Default 3 nodes, 3,000 questions (1,000 distinct texts x 3,
the copies side by side) and ``rpm: 3000``; ``--smoke``: 2 nodes, 60 questions,
``rpm: 600``.

1. One process (its own cache, no Ray): the reference records.
2. ``bench --ray ADDRESS --state URL`` with ``rpm: R`` on the worker (the Conductor
   shares its key): every (id, epoch) recorded once, no torn line, the records'
   (id, epoch, verdict, answer) equal to the one-process run's; each distinct request
   body reaches the provider once, whichever node asks it; the arrivals' rate over the
   run's steady part (its middle 80%) within 5% of R; then (not with ``--smoke``) the
   same run with no ``rpm:``, the cluster's own pace, to tell a limit that holds too
   much from a cluster that cannot go faster.
3. ``--max-usd`` with ``--ray --state``: the nodes charge the run's spend counter on
   the state server, and the driver stops placing samples once it reaches the cap.  On
   questions of their own (at most 300 distinct ones), the cap a third of what they
   would cost, ``--concurrency`` the cluster's sample slots (nodes x CPUs): what was
   spent (the records' cost; the server's counter; the fake server's view, every
   request's words as tokens at the pool's price) against the cap and the bound, the
   cap passed by at most one wave (--concurrency x the dearest sample).  Without
   ``--state`` the CLI's refusal is printed (there is no figure).
4. A node SIGKILLed mid-run (the worker processes its raylet started, then the raylet
   and the rest, ``Cluster.remove_node`` without grace) once a third of the records are
   written, while its samples wait inside calls (held 3 s at the provider): those
   samples are retried on the other nodes; no pair lost, none recorded twice, no torn
   line, the records equal to the one-process run's.  The calls the kill cut are made
   again elsewhere once their cache leases lapse (about 10 s), and are counted.

The exit status is 1 when a judged line says FAIL (with ``--smoke`` the rate's line is
the log's, not a verdict).  Without ray, the ``redis`` package or ``redis-server`` the
script says so and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The shared figures' script, beside this one (its import puts src/ on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import shared_state as ss  # noqa: E402

from conductor.testing import FakeLLMServer  # noqa: E402
from conductor.testing.fake_wire import word_count  # noqa: E402

#: How long a call waits at the provider around the kill (see :func:`phase_kill`).
HELD_S = 3.0


class LocalCluster:
    """A head that runs nothing and ``nodes`` worker nodes of ``cpus`` CPUs each; a
    dead node is noticed within a second or two (not Ray's default half minute)."""

    def __init__(self, nodes: int, cpus: int) -> None:
        from ray.cluster_utils import Cluster

        quick = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
        self.cluster: Any = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": quick}
        )
        self.workers = [self.cluster.add_node(num_cpus=cpus) for _ in range(nodes)]
        self.cluster.wait_for_nodes()

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def kill(self, i: int) -> list[int]:
        """Node ``i`` gone at once: the processes its raylet started (the worker
        processes running samples among them) SIGKILLed, then the raylet and the rest
        of the node; returns the killed children's pids.  (Removing the node alone
        leaves its worker processes a moment in which a sample in flight can still
        finish and return: the kill would then never land inside a sample.)"""
        import psutil

        node = self.workers.pop(i)
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        children = raylet.children(recursive=True)
        for child in children:
            child.send_signal(signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)
        return [child.pid for child in children]

    def shutdown(self) -> None:
        self.cluster.shutdown()


@contextmanager
def local_cluster(nodes: int, cpus: int, cache: Path) -> Iterator[LocalCluster]:
    # The nodes' worker processes inherit this environment: a call cache they might open
    # without --state is this run's, never the user's.
    os.environ["CONDUCTOR_CACHE_DIR"] = str(cache)
    started = LocalCluster(nodes, cpus)
    try:
        yield started
    finally:
        started.shutdown()


def check_records(
    judge: ss.Verdicts, name: str, run: Path, n: int, alone: ss.Outcome
) -> list[dict[str, Any]]:
    """The run's pairs lost / recorded twice / torn, and its outcome against one process's."""
    rows, torn = ss.records(run)
    pairs = Counter((r["sample_id"], r["epoch"]) for r in rows)
    judge(f"{name}: lost / twice / torn",
          f"{n - len(pairs)} / {sum(v > 1 for v in pairs.values())} / {torn}", "0 / 0 / 0",
          len(pairs) == n and len(rows) == n and torn == 0)  # fmt: skip
    differ = len({pair[:2] for pair in ss.outcome(rows) ^ alone})  # samples, not rows
    judge(f"{name}: (id, epoch, verdict, answer)",
          "same as one process" if differ == 0 else f"{differ} differ",
          "same as one process", differ == 0)  # fmt: skip
    return rows


def phase_calls_and_rate(
    fake: FakeLLMServer,
    work: Path,
    url: str,
    cluster: LocalCluster,
    data: Path,
    n: int,
    rpm: float,
    judge: ss.Verdicts,
    alone: ss.Outcome,
    *,
    contrast: bool,
) -> None:
    pool = ss.write_pool(work / "pool-rpm.json", fake.openai_base, rpm)
    ss.flush(url)
    mark = len(fake.requests)
    bench = ss.Bench(work, pool, data)
    t0 = time.monotonic()
    bench.start("ray", work / "ray", "--concurrency", "16", "--ray", cluster.address,
                "--state", url)  # fmt: skip
    (code,) = bench.wait()
    wall = time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"--ray: exit {code}: {bench.tail(0)}")
    asked = fake.requests[mark:]
    print(f"  --ray: {len(asked)} provider calls, {wall:.1f} s wall, {ss.load()}", flush=True)
    check_records(judge, "--ray run", work / "ray", n, alone)
    by_body = Counter(ss.body_key(r) for r in asked)
    distinct = 2 * n // ss.COPIES  # a Conductor call and a worker call for each text
    judge("--ray: calls per distinct request (max)", str(max(by_body.values())), "1",
          max(by_body.values()) == 1)  # fmt: skip
    calls = sum(by_body.values())
    judge("--ray: provider calls / distinct bodies", f"{calls} / {len(by_body)}",
          f"{distinct} / {distinct}", calls == len(by_body) == distinct)  # fmt: skip
    rate = ss.steady_rpm(asked)
    judge("--ray: aggregate rate (rpm, steady part)", f"{rate:.0f} ({ss.load()})",
          f"{rpm:.0f} +-5%", abs(rate - rpm) <= 0.05 * rpm, timing=True)  # fmt: skip
    if not contrast:
        return
    # The limit only holds calls back: a rate below it is the limit's fault only if the
    # cluster could go faster.  The same run with no rpm: says how fast it can go here.
    ss.flush(url)
    mark = len(fake.requests)
    free = ss.Bench(work, ss.write_pool(work / "pool-free.json", fake.openai_base, None), data)
    free.start("ray-free", work / "ray-free", "--concurrency", "16", "--ray", cluster.address,
               "--state", url)  # fmt: skip
    (code,) = free.wait()
    if code != 0:
        raise RuntimeError(f"--ray without rpm: exit {code}: {free.tail(0)}")
    print(f"  contrast, no rpm: the cluster's own pace {ss.steady_rpm(fake.requests[mark:]):.0f} "
          f"rpm ({ss.load()})")  # fmt: skip


def phase_cap(
    fake: FakeLLMServer,
    work: Path,
    url: str,
    cluster: LocalCluster,
    n: int,
    slots: int,
    per_sample: float,
    judge: ss.Verdicts,
) -> None:
    """``--max-usd`` with ``--ray --state``: the spend reached against the cap and the
    bound of one wave; then, without ``--state``, the CLI's refusal."""
    from conductor.runs.rundir import STATE_TOKEN
    from conductor.state import StateURL
    from conductor.state.claims import RunClaims

    data = ss.write_data(work / "distinct.jsonl", n, 1)
    pool = ss.write_pool(work / "pool.json", fake.openai_base, None)
    ss.flush(url)
    mark = len(fake.requests)
    fake.latency_s = 0.02  # samples overlap: a wave is in flight when the cap is reached
    # The cap: about a third of what the data would cost (``per_sample``: the dearest
    # sample of the one-process run).
    cap = round(n * per_sample / 3, 2)
    run = work / "capped"
    bench = ss.Bench(work, pool, data)
    bench.start("cap", run, "--concurrency", str(slots), "--ray", cluster.address,
                "--state", url, "--max-usd", str(cap))  # fmt: skip
    (code,) = bench.wait()
    fake.latency_s = 0.0
    stopped = code == 1 and "--max-usd" in bench.tail(0)
    rows, _ = ss.records(run)
    costs = [r["totals"]["cost_usd"] for r in rows]
    dearest = max(costs)
    bound = cap + slots * dearest
    words = [sum(word_count(m["content"]) for m in r.messages) + word_count(ss.reply_text(r))
             for r in fake.requests[mark:]]  # fmt: skip
    paid = sum(words) * ss.PRICE_PER_MTOK / 1e6
    claims = RunClaims(StateURL.parse(url), (run / STATE_TOKEN).read_text().strip())
    counted = claims.spent()
    claims.close()
    print(f"  cap ${cap:.2f}: {len(rows)} of {n} samples recorded, exit {code}; reached "
          f"${sum(costs):.4f} (records), ${counted:.4f} (the state server's counter); "
          f"bound = cap + --concurrency {slots} x ${dearest:.4f} = ${bound:.4f}; "
          f"{ss.load()}")  # fmt: skip
    if not stopped:
        print(f"  its output: {bench.tail(0)}")
    judge("--ray --max-usd: records' cost", f"${sum(costs):.4f}", f"${cap:.2f}..${bound:.4f}",
          stopped and cap <= sum(costs) + 1e-9 and sum(costs) <= bound + 1e-9)  # fmt: skip
    judge("--ray --max-usd: provider's view / counter", f"${paid:.4f} / ${counted:.4f}",
          "equal, <= bound", abs(paid - counted) < 1e-6 and paid <= bound + 1e-9)  # fmt: skip
    # Without --state the nodes' spend has nowhere to be counted: refused.
    cmd = [sys.executable, "-m", "conductor", "bench", "math500", "--pool", str(pool),
           "--data", str(data), "--out", str(work / "refused"), "--ray", cluster.address,
           "--max-usd", "1"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_STATE_URL"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    said = " ".join((done.stderr or done.stdout).split())
    print(f"--max-usd with --ray, no --state: refused (exit {done.returncode}): {said[-200:]}")


def phase_kill(
    fake: FakeLLMServer,
    work: Path,
    url: str,
    cluster: LocalCluster,
    data: Path,
    n: int,
    judge: ss.Verdicts,
    alone: ss.Outcome,
) -> None:
    pool = ss.write_pool(work / "pool.json", fake.openai_base, None)
    ss.flush(url)
    mark = len(fake.requests)
    # Samples take a while, so that some are in flight on the node when it dies.
    fake.latency_s = 0.05
    run = work / "killed"
    bench = ss.Bench(work, pool, data)
    bench.start("kill", run, "--concurrency", "16", "--ray", cluster.address, "--state", url)
    deadline = time.monotonic() + 600
    while ss.written(run) < n // 3:
        if time.monotonic() > deadline or bench.procs[0].poll() is not None:
            raise RuntimeError(f"the run ended (or stalled) before the kill: {bench.tail(0)}")
        time.sleep(0.02)
    # The calls made from now on wait 3 s at the provider: when the node dies, each of
    # its sample slots is inside a call, never between two samples.
    fake.latency_s = HELD_S
    time.sleep(0.5)
    at = ss.written(run)
    killed = cluster.kill(0)
    fake.latency_s = 0.05
    (code,) = bench.wait()
    fake.latency_s = 0.0
    asked = Counter(ss.body_key(r) for r in fake.requests[mark:])
    # A call cut by the kill is made again from another node (by the retried sample or
    # a copy of its question, once the dead caller's lease on the cache key lapses):
    # bodies asked twice show the node died inside samples, not between them.
    again = sum(v > 1 for v in asked.values())
    print(f"  SIGKILLed node 0 (its raylet and {len(killed)} processes it started) at {at} "
          f"records; exit {code}; {sum(asked.values())} provider "
          f"calls for {len(asked)} bodies ({again} cut by the kill, asked again), "
          f"{ss.load()}")  # fmt: skip
    if code != 0:
        print(f"  its output: {bench.tail(0)}")
    check_records(judge, "node killed", run, n, alone)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=3000, help="questions in the data")
    parser.add_argument("--rpm", type=float, default=3000.0, help="the worker's stated rate")
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs (sample slots) a node")
    parser.add_argument("--smoke", action="store_true", help="2 nodes x 60 questions (CI)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.rpm, args.nodes = 60, 600.0, 2
    binary = shutil.which("redis-server")
    try:
        import ray  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        print(f"skipped: the package {exc.name!r} is missing (pip install "
              "'conductor-orchestrate[ray,state]')")  # fmt: skip
        return 0
    if binary is None:
        print("skipped: redis-server is not installed (Debian: apt-get install redis-server)")
        return 0
    # The killed node's requests in flight end in a reset the fake server would log
    # with a traceback: expected here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    n = args.questions - args.questions % ss.COPIES
    print(f"{args.nodes} Ray nodes x {args.cpus} CPUs, {n} questions ({n // ss.COPIES} "
          f"distinct, {ss.COPIES} copies each), rpm {args.rpm:.0f}; {os.cpu_count()} CPUs, "
          f"{ss.load()}")  # fmt: skip
    judge = ss.Verdicts(timings=not args.smoke)
    with (
        tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp,
        ss.redis_server(binary) as url,
        FakeLLMServer() as fake,
    ):
        work = Path(tmp)
        fake.script("conductor-7b", ss.PLAN)
        fake.script("w0", ss.reply)
        data = ss.write_data(work / "repeats.jsonl", n // ss.COPIES, ss.COPIES)
        pool = ss.write_pool(work / "pool.json", fake.openai_base, None)
        _cpu, wall, rows = ss.cpu_alone(work, pool, data, n, None)
        alone = ss.outcome(rows)
        dearest = max(r["totals"]["cost_usd"] for r in rows)
        print(f"one process, own cache:   {wall:.1f} s wall, {ss.load()}", flush=True)
        t0 = time.monotonic()
        with local_cluster(args.nodes, args.cpus, work / "node-cache") as cluster:
            print(f"cluster up in {time.monotonic() - t0:.1f} s, {ss.load()}", flush=True)
            phase_calls_and_rate(
                fake, work, url, cluster, data, n, args.rpm, judge, alone, contrast=not args.smoke
            )
            print(f"--max-usd with --ray --state ({ss.load()}):", flush=True)
            phase_cap(fake, work, url, cluster, min(n, 300), args.nodes * args.cpus, dearest,
                      judge)  # fmt: skip
            phase_kill(fake, work, url, cluster, data, n, judge, alone)
    print(f"done, {ss.load()}")
    return 1 if judge.failed else 0


if __name__ == "__main__":
    sys.exit(main())
