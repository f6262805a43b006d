"""The bench loop against its floor: `conductor` strategy vs bare aiohttp, same server.

Run:  python benchmarks/perf/loop.py [--smoke] [-n N] [--concurrency C,...] [--latency S]

One fake OpenAI-compatible server (its own process, ``--latency`` seconds per call)
answers both sides:

* **floor**: a bare aiohttp client doing what a sample of the ``conductor`` strategy
  needs on the wire and nothing else: the Conductor's call, then the worker's, each a
  JSON body posted and its reply decoded, ``C`` samples at a time;
* **conductor**: :func:`conductor.bench.runner.run_benchmark` with the ``conductor``
  strategy (``client: http``), the call cache and the sample cache on (a fresh
  directory: every call is asked), the smoke set's short-answer grader (cheap: the
  loop is measured, not a grader), records written and summarised as a bench does.

Each side runs in a fresh process of its own, timed from its first request to its last
answer (imports and start-up are ``startup.py``'s): wall time, and CPU time of that
process (every thread: the cache's writer and the graders too) per sample.  Judged
lines (issue 23's targets, on a quiet machine): wall <= 1.15x the floor at
concurrency 64 and <= 1.3x at 256; CPU per sample <= 3x the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

PLAN = 'model_id = [0]\nsubtasks = ["Solve it."]\naccess_list = [[]]'
#: The wall-time targets by concurrency (others are shown against the larger one).
WALL_TARGETS = {64: 1.15, 256: 1.3}
CPU_TARGET = 3.0


def serve(port_queue: multiprocessing.Queue, latency_s: float, stop: Event) -> None:  # type: ignore[type-arg]
    """The provider, in a process of its own: a one-step plan, then the sum's value."""
    from conductor.testing import FakeLLMServer, FakeRequest

    def worker(request: FakeRequest) -> str:
        m = re.search(r"What is (\d+) \+ 0\?", request.last_user_message)
        return f"ANSWER: {m.group(1) if m else 0}"

    with FakeLLMServer(latency_s=latency_s) as server:
        server.script("conductor", [PLAN])
        server.script("w0", worker)
        port_queue.put(server.openai_base)
        stop.wait()


def questions(n: int) -> list[str]:
    return [f"What is {i} + 0?" for i in range(n)]


#: Wall and CPU seconds of one side's loop.
Timing = tuple[float, float]


def clock() -> Timing:
    return time.perf_counter(), time.process_time()


def since(start: Timing) -> Timing:
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


async def floor_run(base: str, n: int, concurrency: int) -> Timing:
    """The floor: per sample, the Conductor's call and then the worker's, over aiohttp."""
    import aiohttp

    slots = asyncio.Semaphore(concurrency)
    url = f"{base.rstrip('/')}/chat/completions"

    async def ask(session: aiohttp.ClientSession, model: str, text: str) -> str:
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        async with session.post(url, json=body) as reply:
            data = await reply.json()
        return str(data["choices"][0]["message"]["content"])

    async def one(session: aiohttp.ClientSession, question: str) -> None:
        async with slots:
            # The worker's call waits for the Conductor's reply, as a workflow's step does.
            await ask(session, "conductor", question)
            await ask(session, "w0", question)

    start = clock()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, q) for q in questions(n)))
    return since(start)


async def conductor_run(base: str, n: int, concurrency: int, tmp: Path) -> Timing:
    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.conductors.spec import resolve_conductor
    from conductor.datasets.samples import iter_samples
    from conductor.execute import RunSettings
    from conductor.grading import get_grader
    from conductor.llm.cache import ResponseCache
    from conductor.llm.caller import CallerSet
    from conductor.pool import load_pool_text
    from conductor.runs.summary import SummaryBuilder
    from conductor.strategies import ConductorStrategy

    data = tmp / "data.jsonl"
    with data.open("w") as fh:
        for i, q in enumerate(questions(n)):
            fh.write(json.dumps({"id": f"s{i}", "question": q, "answer": str(i)}) + "\n")
    free = "price: {input_per_mtok: 0, output_per_mtok: 0}"
    pool = load_pool_text(
        f"workers:\n  - {{id: w0, model: w0, client: http, api_base: {base}, "
        f"max_concurrency: 1000, {free}}}\n"
        f"conductor: {{backend: endpoint, model: conductor, client: http, api_base: {base}, "
        f"max_concurrency: 1000, {free}}}\n"
    )
    out = tmp / "run"
    # The smoke set's short-answer grader: the loop is measured, not a grader's parser.
    spec, grader = load_benchmark("smoke"), get_grader("short")
    grader.grade("ANSWER: 1", next(iter_samples(spec, data_file=data)))
    with ResponseCache(tmp / "cache") as cache:
        strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(cache))
        options = BenchOptions(out_dir=out, data_file=data, concurrency=concurrency)
        summary = SummaryBuilder(out)
        start = clock()
        progress = await run_benchmark(
            spec, strategy, grader, {}, options, cache=cache, summary=summary
        )
        summary.write()
        timing = since(start)
    if progress.correct != n:
        raise SystemExit(f"conductor side: {progress.correct} of {n} correct")
    return timing


def measure(side: str, base: str, n: int, concurrency: int) -> Timing:
    """One side's loop, in this (fresh) process."""
    if side == "floor":
        return asyncio.run(floor_run(base, n, concurrency))
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(conductor_run(base, n, concurrency, Path(tmp)))


def in_fresh_process(side: str, base: str, n: int, concurrency: int) -> Timing:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        result: Timing = pool.apply(measure, (side, base, n, concurrency))
    return result


def judged(name: str, value: float, floor: float, target: float, unit: str) -> str:
    ratio = value / floor if floor else float("inf")
    verdict = "PASS" if ratio <= target else "FAIL"
    return (
        f"{name}: {value:.3f} {unit} vs floor {floor:.3f} {unit}  ratio {ratio:.2f}  "
        f"(target <= {target}) {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds, for CI)")
    parser.add_argument("-n", type=int, default=None, help="samples per run (default 3000)")
    parser.add_argument("--concurrency", default=None, help="comma-separated (default 64,256)")
    parser.add_argument("--latency", type=float, default=None, help="seconds per call (0.2)")
    args = parser.parse_args()
    n = args.n or (64 if args.smoke else 3000)
    levels = [int(c) for c in (args.concurrency or ("16" if args.smoke else "64,256")).split(",")]
    latency = args.latency if args.latency is not None else (0.05 if args.smoke else 0.2)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{n} samples, {latency * 1000:.0f} ms per call, 2 calls per sample")

    ctx = multiprocessing.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=serve, args=(queue, latency, stop), daemon=True)
    server.start()
    results: dict[int, dict[str, Any]] = {}
    try:
        base = queue.get(timeout=60)
        for c in levels:
            floor = in_fresh_process("floor", base, n, c)
            ours = in_fresh_process("conductor", base, n, c)
            results[c] = {"floor": floor, "conductor": ours}
    finally:
        stop.set()
        server.join(10)

    for c, sides in results.items():
        (f_wall, f_cpu), (c_wall, c_cpu) = sides["floor"], sides["conductor"]
        # The target of the nearest level at or below c (the lowest one below them all).
        target = WALL_TARGETS[max([k for k in WALL_TARGETS if k <= c] or [min(WALL_TARGETS)])]
        print(judged(f"[loop] c={c} wall", c_wall, f_wall, target, "s"))
        print(
            judged(
                f"[loop] c={c} CPU per sample",
                1000 * c_cpu / n,
                1000 * f_cpu / n,
                CPU_TARGET,
                "ms",
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
