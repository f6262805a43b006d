"""Speed of the core engine against a local fake server, printed as numbers.

Run:  python benchmarks/perf/core_speed.py [--quick | --smoke]

1. Per-call overhead: the project's call path (ModelCaller, no cache) against a bare SDK
   call to the same server, for the `openai` and `litellm` clients (target: <= 1.10x).
2. A workflow of three independent steps plus a final step that sees them all, at 200 ms
   per call, against its critical path (Conductor + one parallel wave + the final step
   = 3 x 200 ms; target: <= 1.10x).
3. A fully cached rerun of N questions against the cold run at 100 ms per call
   (target: >= 50x faster).
4. `conductor --help` wall time (target: < 0.3 s on an idle machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conductor.conductors.spec import resolve_conductor  # noqa: E402
from conductor.execute import Orchestrator, RunSettings  # noqa: E402
from conductor.llm.cache import ResponseCache  # noqa: E402
from conductor.llm.caller import ModelCaller  # noqa: E402
from conductor.llm.types import Message, ModelRequest  # noqa: E402
from conductor.pool import Pool, load_pool_text  # noqa: E402
from conductor.targets import Worker  # noqa: E402
from conductor.testing import FakeLLMServer, Reply  # noqa: E402

QUESTION = "Say something short about the number 7."
MESSAGES: tuple[Message, ...] = ({"role": "user", "content": QUESTION},)


def workflow_reply(model_id: list[int], access: list[str]) -> str:
    subtasks = ", ".join(f'"part {i}"' for i in range(len(model_id)))
    return f"model_id = {model_id}\nsubtasks = [{subtasks}]\naccess_list = [{', '.join(access)}]"


async def per_call_overhead(server: FakeLLMServer, client: str, n: int, rounds: int) -> None:
    if client == "openai":
        import openai

        bare_client = openai.AsyncOpenAI(base_url=server.openai_base, api_key="k", max_retries=0)

        async def bare() -> None:
            await bare_client.chat.completions.create(
                model="w",
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0.2,
                max_tokens=64,
            )

        target = Worker(id="w", model="w", client="openai", api_base=server.openai_base)
    else:
        import litellm

        async def bare() -> None:
            await litellm.acompletion(
                model="openai/w",
                messages=list(MESSAGES),
                api_base=server.openai_base,
                api_key="k",
                temperature=0.2,
                max_tokens=64,
                num_retries=0,
            )

        target = Worker(id="w", model="openai/w", client="litellm", api_base=server.openai_base)
    caller = ModelCaller(target)
    request = ModelRequest(messages=MESSAGES, params={"temperature": 0.2, "max_tokens": 64})

    async def ours() -> None:
        await caller.complete(request)

    for fn in (bare, ours):  # warm up connections and imports
        for _ in range(20):
            await fn()
    bare_t: list[float] = []
    ours_t: list[float] = []
    for _ in range(rounds):  # interleave so drift hits both equally
        for fn, sink in ((bare, bare_t), (ours, ours_t)):
            t0 = time.perf_counter()
            for _ in range(n):
                await fn()
            sink.append((time.perf_counter() - t0) / n)
    b, o = statistics.median(bare_t), statistics.median(ours_t)
    print(
        f"[1] per-call ({client:7s}): bare SDK {b * 1e3:6.2f} ms  conductor {o * 1e3:6.2f} ms  "
        f"ratio {o / b:.3f}  (target <= 1.10)"
    )
    await caller.client.aclose()


def fake_pool(server: FakeLLMServer, n_workers: int) -> Pool:
    workers = "\n".join(
        f"  - {{id: w{i}, model: w{i}, client: openai, api_base: {server.openai_base}}}"
        for i in range(n_workers)
    )
    text = (
        f"name: bench\nworkers:\n{workers}\n"
        f"conductor: {{backend: endpoint, model: conductor, api_base: {server.openai_base}}}\n"
    )
    return load_pool_text(text)


async def critical_path(server: FakeLLMServer, repeats: int) -> None:
    server.latency_s = 0.2
    server.script("conductor", [workflow_reply([0, 1, 2, 0], ["[]", "[]", "[]", '["all"]'])])
    pool = fake_pool(server, 3)
    orch = Orchestrator(pool, resolve_conductor(pool))
    walls = []
    for i in range(repeats):
        t0 = time.perf_counter()
        record = await orch.run(f"question {i}", RunSettings())
        walls.append(time.perf_counter() - t0)
        assert record.status == "ok", record.error
    await orch.aclose()
    ideal = 3 * 0.2
    w = statistics.median(walls)
    print(
        f"[2] 3 parallel + 1 final step at 200 ms/call: {w * 1e3:.0f} ms vs critical path "
        f"{ideal * 1e3:.0f} ms  ratio {w / ideal:.3f}  (target <= 1.10)"
    )
    server.latency_s = 0.0


async def cached_rerun(server: FakeLLMServer, n_questions: int) -> None:
    server.latency_s = 0.1
    server.script("conductor", [workflow_reply([0, 1], ["[]", '["all"]'])])
    pool = fake_pool(server, 2)
    with tempfile.TemporaryDirectory() as tmp:
        cache = ResponseCache(Path(tmp))
        timings = []
        for _ in range(2):
            orch = Orchestrator(pool, resolve_conductor(pool), cache=cache)
            t0 = time.perf_counter()
            for i in range(n_questions):
                record = await orch.run(f"question number {i}?", RunSettings())
                assert record.status == "ok", record.error
            timings.append(time.perf_counter() - t0)
            await orch.aclose()
        cache.close()
    cold, warm = timings
    print(
        f"[3] {n_questions} questions (3 calls each, 100 ms/call), one after another: cold "
        f"{cold:.2f} s, cached {warm:.3f} s ({warm / n_questions * 1e3:.2f} ms/question)  "
        f"speed-up {cold / warm:.0f}x  (target >= 50x)"
    )
    server.latency_s = 0.0


def help_time(repeats: int) -> None:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "conductor", "--help"], check=True, capture_output=True
        )
        walls.append(time.perf_counter() - t0)
    print(f"[4] conductor --help: median {statistics.median(walls):.3f} s  (target < 0.3 s)")


async def main_async(size: str) -> None:
    """``size``: ``full``, ``quick`` (fewer repeats) or ``smoke`` (once each, tiny)."""
    calls, rounds, repeats, questions, helps = {
        "full": (200, 5, 10, 200, 7),
        "quick": (50, 3, 3, 20, 3),
        "smoke": (5, 1, 1, 3, 1),
    }[size]
    with FakeLLMServer() as server:
        server.set_default([Reply("a short reply of a few words", output_tokens=8)])
        for client in ("openai", "litellm"):
            await per_call_overhead(server, client, n=calls, rounds=rounds)
        await critical_path(server, repeats=repeats)
        await cached_rerun(server, n_questions=questions)
    help_time(helps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true", help="once each, tiny (seconds, for CI)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    asyncio.run(main_async("smoke" if args.smoke else "quick" if args.quick else "full"))


if __name__ == "__main__":
    main()
