"""What tracing costs a bench: the same run with ``--otel`` and without, on the fake
provider, printed as a ratio.

Run:  python benchmarks/perf/otel_overhead.py [--quick | --smoke]

Each run is ``conductor bench`` in-process (the runner, not the CLI) on N synthetic
MATH questions: a Conductor plan of three steps (w0, w1 seeing step 0, w0 seeing both),
so 4 calls and 10 spans per question, answered by a fake server in another process.
With tracing, every record's spans go over OTLP/HTTP to a receiver in a third process
that reads and counts them.  Runs alternate off/on, R times each, and the figures are
ratios of medians:

1. wall time with 50 ms per call (a fast provider; real ones take seconds): the
   overhead a bench sees (target: <= 1.03);
2. CPU with no latency at all, where the orchestration's own CPU is all there is: what
   tracing costs per question, in milliseconds, in the bench process (handing records
   over) and in the tracer's child process (the SDK's span objects and protobuf
   encoding); no target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def fake_provider(port_queue: Any, stop: Event, latency_s: float) -> None:
    """The fake provider: a three-step plan for the Conductor, right answers from both
    workers."""
    import re

    from conductor.testing import FakeLLMServer

    def answer(request: Any) -> str:
        m = re.search(r"What is (\d+) \+ 0\?", request.messages[-1]["content"])
        return f"\\boxed{{{m.group(1) if m else 0}}}"

    plan = (
        'model_id = [0, 1, 0]\nsubtasks = ["Solve it.", "Check it.", "Combine."]\n'
        "access_list = [[], [0], [0, 1]]"
    )
    with FakeLLMServer(latency_s=latency_s) as server:
        server.script("conductor", [plan])
        server.script("w0", answer)
        server.script("w1", answer)
        port_queue.put(server.openai_base)
        stop.wait()


def receiver(port_queue: Any, counts: Any, stop: Event) -> None:
    """An OTLP/HTTP traces receiver that decodes each request and counts its spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with counts.get_lock():
                counts.value += n
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_queue.put(f"http://127.0.0.1:{server.server_address[1]}")
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def make_data(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            row = {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"s/{i}"}
            fh.write(json.dumps(row) + "\n")


async def one_run(
    base: str, data: Path, out: Path, otel: str | None
) -> tuple[float, float, float, int]:
    """One bench run; returns its wall seconds, the CPU seconds of the bench process
    and of the tracer's child process, and the spans it sent."""
    import resource

    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.grading import get_grader
    from conductor.llm.caller import CallerSet
    from conductor.otel import open_tracer, otel_settings
    from conductor.pool import load_pool_text
    from conductor.strategies import ConductorStrategy

    common = f"client: openai, api_base: {base}, price: {{input_per_mtok: 0, output_per_mtok: 0}}"
    pool = load_pool_text(
        "workers:\n"
        f"  - {{id: w0, model: w0, max_concurrency: 1000, {common}}}\n"
        f"  - {{id: w1, model: w1, max_concurrency: 1000, {common}}}\n"
        f"conductor: {{backend: endpoint, model: conductor, {common}}}\n"
    )
    strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
    tracer = open_tracer(settings) if (settings := otel_settings(otel, env={})) else None
    options = BenchOptions(out_dir=out, data_file=data, concurrency=32)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        progress = await run_benchmark(
            load_benchmark("math500"), strategy, get_grader("math"), {}, options, tracer=tracer
        )
    finally:
        await strategy.aclose()
    sent = 0
    if tracer is not None:
        report = tracer.close()  # the queue drained: part of what tracing costs
        assert report.problem() is None, report
        sent = report.sent
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    # The tracer's child is the only child reaped during the run (the fake servers are
    # reaped at the end), so this is its CPU.
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    assert progress.done == progress.correct, (progress.done, progress.correct)
    return wall, cpu, child_cpu, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument("--smoke", action="store_true", help="tiny runs (seconds, for CI)")
    args = parser.parse_args()
    n, reps = (30, 1) if args.smoke else (200, 3) if args.quick else (500, 5)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {n} questions x {reps} runs each"
    )
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    slow_q, fast_q, receiver_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    counts = ctx.Value("l", 0)
    procs = [
        ctx.Process(target=fake_provider, args=(slow_q, stop, 0.05), daemon=True),
        ctx.Process(target=fake_provider, args=(fast_q, stop, 0.0), daemon=True),
        ctx.Process(target=receiver, args=(receiver_q, counts, stop), daemon=True),
    ]
    for p in procs:
        p.start()
    try:
        slow, fast = slow_q.get(timeout=60), fast_q.get(timeout=60)
        sink = receiver_q.get(timeout=60)
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            data = tmp / "data.jsonl"
            make_data(data, n)
            results = {}
            for label, base in (("slow", slow), ("fast", fast)):
                # One run of each first, not counted: imports and the SDK's set-up.
                asyncio.run(one_run(base, data, tmp / f"{label}-warm-off", None))
                asyncio.run(one_run(base, data, tmp / f"{label}-warm-on", sink))
                off: list[tuple[float, float, float]] = []
                on: list[tuple[float, float, float]] = []
                sent = 0
                for i in range(reps):
                    w, c, k, _ = asyncio.run(one_run(base, data, tmp / f"{label}-off{i}", None))
                    off.append((w, c, k))
                    w, c, k, got = asyncio.run(one_run(base, data, tmp / f"{label}-on{i}", sink))
                    on.append((w, c, k))
                    sent += got
                results[label] = (off, on, sent)
    finally:
        stop.set()
        for p in procs:
            p.join(10)

    def medians(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
        return (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
            statistics.median(r[2] for r in runs),
        )

    off, on, sent = results["slow"]
    (wall_off, _, _), (wall_on, _, _) = medians(off), medians(on)
    print(f"spans sent in the measured runs: {sent} ({sent // max(1, reps * n)} per question)")
    print(f"[1] wall, 50 ms per call: off {wall_off:.2f} s, on {wall_on:.2f} s", end="  ")
    print(f"ratio {wall_on / wall_off:.3f}  (target <= 1.03)")
    off, on, sent = results["fast"]
    (_, cpu_off, _), (_, cpu_on, child) = medians(off), medians(on)
    print(
        f"[2] CPU of the bench process, no latency: off {cpu_off:.2f} s, on {cpu_on:.2f} s",
        end="  ",
    )
    print(f"ratio {cpu_on / cpu_off:.3f}; tracing {(cpu_on - cpu_off) / n * 1000:.2f} ms", end=" ")
    print(f"per question there, {child / n * 1000:.2f} ms in the tracer's process (10 spans)")


if __name__ == "__main__":
    main()
