"""Speed and memory of `conductor serve`, printed as numbers.

Run:  python benchmarks/perf/serve.py [--requests N] [--client http|openai] [--smoke]

The fake provider runs in a child process and `conductor serve` is the real CLI in
another (`--no-cache`), so that neither one's work or memory counts against the other.

1. Added latency: the same orchestration (the Conductor, then one step; 0 ms per call)
   run in this process through `ConductorStrategy`, and asked of the server over HTTP
   with one kept-alive connection, sequential requests.  Added latency per request =
   p50(server) - p50(in-process)  (target: p50 <= 5 ms).
2. 200 concurrent requests whose workflows are two dependent steps at 200 ms per worker
   call (the Conductor answers at once: a 2 x 200 ms critical path) against the ideal
   ceil(200 / limit) x 0.4 s, for --max-concurrency 200 and 64  (target: <= 1.2x).
   Beside it, the same 200 questions in-process (no server), at 200 ms and at 0 ms per
   call: the ideal counts only the waits, and on a small machine the work of 600 calls
   (client, server and fake provider, each one event loop) adds to them.
3. RSS of the server process before and after `--requests` requests (default 5,000;
   64 in flight, 0 ms per call), after a warm-up of 200  (target: growth < 20 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ONE_STEP = 'model_id = [0]\nsubtasks = ["Answer it."]\naccess_list = [[]]'
TWO_STEPS = 'model_id = [0, 1]\nsubtasks = ["Draft.", "Finish."]\naccess_list = [[], [0]]'


def fake_provider(
    port_queue: multiprocessing.Queue,  # type: ignore[type-arg]
    worker_latency_s: float,
    plan: str,
    stop: Event,
) -> None:
    """The fake provider in a child process: the Conductor answers ``plan`` at once,
    the workers after ``worker_latency_s``."""
    from conductor.testing import FakeLLMServer, Reply

    with FakeLLMServer(latency_s=worker_latency_s) as server:
        server.script("conductor", Reply(plan, latency_s=0.0))
        server.script("w0", "draft")
        server.script("w1", "final answer")
        port_queue.put(server.openai_base)
        stop.wait()


def cpu_of(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The fake provider's process id, while one runs (for its CPU time).
PROVIDER_PID: list[int] = []


def with_provider(worker_latency_s: float, plan: str, fn: Callable[[str], Any]) -> Any:
    ctx = multiprocessing.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(
        target=fake_provider, args=(queue, worker_latency_s, plan, stop), daemon=True
    )
    proc.start()
    try:
        base = queue.get(timeout=60)
        assert proc.pid is not None
        PROVIDER_PID[:] = [proc.pid]
        return fn(base)
    finally:
        stop.set()
        proc.join(10)


def pool_text(base: str, client: str) -> str:
    common = f"client: {client}, api_base: {base}, max_concurrency: 1000, max_retries: 0"
    free = "price: {input_per_mtok: 0, output_per_mtok: 0}"
    return (
        "name: perf\n"
        "workers:\n"
        f"  - {{id: w0, model: w0, {common}, {free}}}\n"
        f"  - {{id: w1, model: w1, {common}, {free}}}\n"
        f"conductor: {{backend: endpoint, model: conductor, client: {client}, api_base: {base},"
        f" max_concurrency: 1000, {free}}}\n"
    )


class Server:
    """``conductor serve`` in a child process; ``url`` once it listens."""

    def __init__(self, pool: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conductor", "serve", "--pool", str(pool), "--port", "0",
             "--no-cache", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                m = re.search(r"http://\S+/v1", line)
                if m and not self.url:
                    self.url = m.group(0)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(120)
        if not self.url:
            self.close()
            raise SystemExit("conductor serve did not start")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def cpu_s(self) -> float:
        """User + system CPU seconds the server process has used."""
        return cpu_of(self.proc.pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def body(i: int) -> dict[str, Any]:
    return {"model": "conductor", "messages": [{"role": "user", "content": f"Question {i}?"}]}


async def in_process_p50(base: str, client: str, n: int) -> float:
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.llm.caller import CallerSet
    from conductor.pool import load_pool_text
    from conductor.strategies import ConductorStrategy

    pool = load_pool_text(pool_text(base, client))
    strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
    times = []
    for i in range(n + n // 10):
        t0 = time.perf_counter()
        record = await strategy.run(f"Question {i}?", sample_index=0)
        times.append(time.perf_counter() - t0)
        assert record.final_answer == "draft", record.error
    await strategy.aclose()
    return statistics.median(times[n // 10 :])


async def in_process_burst(base: str, client: str, n: int) -> float:
    """``n`` questions at once through one in-process `ConductorStrategy`: the same
    orchestration without the server, as a reference for [2]."""
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.llm.caller import CallerSet
    from conductor.pool import load_pool_text
    from conductor.strategies import ConductorStrategy

    pool = load_pool_text(pool_text(base, client))
    strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
    await asyncio.gather(*(strategy.run(f"Warm {i}?", sample_index=0) for i in range(8)))
    t0 = time.perf_counter()
    records = await asyncio.gather(
        *(strategy.run(f"Question {i}?", sample_index=0) for i in range(n))
    )
    wall = time.perf_counter() - t0
    await strategy.aclose()
    assert all(r.final_answer == "final answer" for r in records)
    return wall


def served_p50(url: str, n: int) -> float:
    import httpx

    times = []
    with httpx.Client(timeout=60) as http:
        for i in range(n + n // 10):
            t0 = time.perf_counter()
            resp = http.post(f"{url}/chat/completions", json=body(i))
            times.append(time.perf_counter() - t0)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"] == "draft"
    return statistics.median(times[n // 10 :])


async def burst(url: str, n: int, in_flight: int) -> float:
    """``n`` requests, at most ``in_flight`` at once; wall seconds.  The client is
    aiohttp, the lightest at hand, so that it takes as little of the CPUs as it can."""
    import aiohttp

    gate = asyncio.Semaphore(in_flight)
    connector = aiohttp.TCPConnector(limit=in_flight)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def one(i: int) -> None:
            async with gate, http.post(f"{url}/chat/completions", json=body(i)) as resp:
                text = await resp.text()
            assert resp.status == 200, text

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000, help="requests for the RSS run")
    parser.add_argument("--latency-requests", type=int, default=300)
    parser.add_argument("--client", choices=("http", "openai"), default="http")
    parser.add_argument(
        "--limits", type=int, nargs="+", default=[200, 64], help="--max-concurrency values for [2]"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes (seconds, for CI): 50 and 10 requests"
    )
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.latency_requests, args.limits = 50, 10, [200]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, worker client {args.client}")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)

        def latency(base: str) -> tuple[float, float]:
            pool = tmp / "pool.yaml"
            pool.write_text(pool_text(base, args.client))
            local = asyncio.run(in_process_p50(base, args.client, args.latency_requests))
            server = Server(pool)
            try:
                remote = served_p50(server.url, args.latency_requests)
            finally:
                server.close()
            return local, remote

        local, remote = with_provider(0.0, ONE_STEP, latency)
        print(
            f"[1] {args.latency_requests} sequential requests, Conductor + 1 step, 0 ms/call: "
            f"in-process p50 {local * 1e3:.2f} ms, through the server p50 {remote * 1e3:.2f} ms, "
            f"added {(remote - local) * 1e3:.2f} ms  (target <= 5 ms)"
        )

        def concurrent(base: str) -> list[tuple[int, float, float, float]]:
            pool = tmp / "pool2.yaml"
            pool.write_text(pool_text(base, args.client))
            provider = PROVIDER_PID[0]
            all0 = time.process_time() + cpu_of(provider)
            wall = asyncio.run(in_process_burst(base, args.client, 200))
            out = [(0, wall, 0.0, time.process_time() + cpu_of(provider) - all0)]
            for limit in args.limits:
                server = Server(pool, "--max-concurrency", str(limit), "--max-queue", "256")
                try:
                    asyncio.run(burst(server.url, 8, 8))  # warm the connections' code paths
                    cpu0 = server.cpu_s()
                    all0 = cpu0 + time.process_time() + cpu_of(provider)
                    wall = asyncio.run(burst(server.url, 200, 200))
                    cpu1 = server.cpu_s()
                    all1 = cpu1 + time.process_time() + cpu_of(provider)
                    out.append((limit, wall, cpu1 - cpu0, all1 - all0))
                finally:
                    server.close()
            return out

        floor = with_provider(
            0.0, TWO_STEPS, lambda base: asyncio.run(in_process_burst(base, args.client, 200))
        )
        print(
            f"[2] floor: the same 200 questions in-process at 0 ms per call: {floor:.2f} s "
            "(the work itself, which the ideal leaves out)"
        )
        # "CPU, all" is the CPU seconds the client, the server and the fake provider
        # used together: near wall x CPUs, the run was bound by the machine, not by waits.
        for limit, wall, cpu, total in with_provider(0.2, TWO_STEPS, concurrent):
            if limit == 0:
                print(
                    f"[2] reference: the same 200 questions at once in-process (no server): "
                    f"{wall:.2f} s vs ideal 0.40 s  ratio {wall / 0.4:.3f}; CPU, all "
                    f"{total:.2f} s"
                )
                continue
            ideal = math.ceil(200 / limit) * 0.4
            print(
                f"[2] 200 concurrent requests, 2 x 200 ms critical path, --max-concurrency "
                f"{limit}: {wall:.2f} s vs ideal {ideal:.2f} s  ratio {wall / ideal:.3f}  "
                f"(target <= 1.2); server CPU {cpu * 1e3 / 200:.1f} ms per request, CPU, all "
                f"{total:.2f} s"
            )

        def memory(base: str) -> tuple[float, float, float, float]:
            pool = tmp / "pool3.yaml"
            pool.write_text(pool_text(base, args.client))
            server = Server(pool, "--max-concurrency", "64", "--max-queue", "256")
            try:
                asyncio.run(burst(server.url, 200, 64))
                before, cpu0 = server.rss_mb(), server.cpu_s()
                wall = asyncio.run(burst(server.url, args.requests, 64))
                after, cpu = server.rss_mb(), server.cpu_s() - cpu0
            finally:
                server.close()
            return before, after, wall, cpu

        before, after, wall, cpu = with_provider(0.0, ONE_STEP, memory)
        print(
            f"[3] {args.requests} requests ({args.requests / wall:.0f} requests/s, server CPU "
            f"{cpu * 1e3 / args.requests:.1f} ms per request): server RSS {before:.1f} MB -> "
            f"{after:.1f} MB, growth {after - before:.1f} MB  (target < 20 MB)"
        )


if __name__ == "__main__":
    main()
