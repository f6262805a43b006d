"""Speed and memory of `conductor bench`, printed as numbers.

Run:  python benchmarks/perf/bench_speed.py [--quick | --smoke]

1. 500 samples at 200 ms per call with concurrency 64, Conductor + one step per sample
   (critical path 2 x 200 ms): wall time against ceil(500 / 64) x 400 ms
   (target: <= 1.15x).
2. The same run again, fully cached: speed-up over the cold run (target: >= 50x).
3. A 10,000-sample run (no latency): peak RSS of the process running it
   (target: < 300 MB).  The fake server runs in another process so that its request
   log does not count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def serve(port_queue: multiprocessing.Queue, latency_s: float, stop: Event) -> None:  # type: ignore[type-arg]
    """The fake provider in a child process: a plan for the Conductor, answers echo."""
    import re

    from conductor.testing import FakeLLMServer

    def answer(request: object) -> str:
        m = re.search(r"What is (\d+) \+ 0\?", request.messages[-1]["content"])  # type: ignore[attr-defined]
        return f"\\boxed{{{m.group(1) if m else 0}}}"

    with FakeLLMServer(latency_s=latency_s) as server:
        server.script("conductor", ['model_id = [0]\nsubtasks = ["Solve it."]\naccess_list = [[]]'])
        server.script("w0", answer)
        port_queue.put(server.openai_base)
        stop.wait()


def make_data(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"s/{i}"}
                )
                + "\n"
            )


async def run(
    base: str, data: Path, out: Path, concurrency: int, cache_dir: Path | None, client: str
) -> float:
    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.grading import get_grader
    from conductor.llm.cache import ResponseCache
    from conductor.llm.caller import CallerSet
    from conductor.pool import load_pool_text
    from conductor.strategies import ConductorStrategy

    pool = load_pool_text(
        "workers:\n"
        f"  - {{id: w0, model: w0, client: {client}, api_base: {base}, max_concurrency: 1000,"
        " price: {input_per_mtok: 0, output_per_mtok: 0}}\n"
        f"conductor: {{backend: endpoint, model: conductor, client: {client}, api_base: {base},"
        " price: {input_per_mtok: 0, output_per_mtok: 0}}\n"
    )
    cache = ResponseCache(cache_dir) if cache_dir else None
    strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(cache))
    spec = load_benchmark("math500")
    options = BenchOptions(out_dir=out, data_file=data, concurrency=concurrency)
    t0 = time.perf_counter()
    progress = await run_benchmark(spec, strategy, get_grader("math"), {}, options, cache=cache)
    wall = time.perf_counter() - t0
    assert progress.done == progress.correct, (progress.done, progress.correct)
    if cache:
        cache.close()
    return wall


def with_server(latency_s: float, fn):  # type: ignore[no-untyped-def]
    ctx = multiprocessing.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=serve, args=(queue, latency_s, stop), daemon=True)
    proc.start()
    try:
        return fn(queue.get(timeout=60))
    finally:
        stop.set()
        proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--smoke", action="store_true", help="tiny runs (seconds, for CI)")
    args = parser.parse_args()
    n_fast, n_big, conc = (
        (16, 100, 16) if args.smoke else (128, 1000, 64) if args.quick else (500, 10_000, 64)
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        make_data(tmp / "fast.jsonl", n_fast)

        def timed(base: str) -> dict[str, tuple[float, float]]:
            out = {}
            for client in ("openai", "http"):
                d = tmp / client
                cold = asyncio.run(run(base, tmp / "fast.jsonl", d / "cold", conc, d / "c", client))
                warm = asyncio.run(run(base, tmp / "fast.jsonl", d / "warm", conc, d / "c", client))
                out[client] = (cold, warm)
            return out

        results = with_server(0.2, timed)
        ideal = math.ceil(n_fast / conc) * 0.4
        for client, (cold, warm) in results.items():
            print(
                f"[1] client {client:6s}: {n_fast} samples, 200 ms/call, concurrency {conc}: "
                f"{cold:.2f} s vs ideal {ideal:.2f} s  ratio {cold / ideal:.3f}  (target <= 1.15)"
            )
            print(
                f"[2] client {client:6s}: fully cached rerun {warm:.3f} s  speed-up "
                f"{cold / warm:.0f}x  (target >= 50x)"
            )
        make_data(tmp / "big.jsonl", n_big)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        wall = with_server(
            0.0,
            lambda base: asyncio.run(run(base, tmp / "big.jsonl", tmp / "big", conc, None, "http")),
        )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(
            f"[3] {n_big} samples: {wall:.1f} s ({n_big / wall:.0f} samples/s), peak RSS of the "
            f"bench process {rss / 1024:.0f} MB (before the run {rss0 / 1024:.0f} MB)  "
            "(target < 300 MB)"
        )


if __name__ == "__main__":
    main()
