"""A fixed concurrency limit against the adaptive one, on a server that rate-limits.

Run:  python benchmarks/perf/limiter_speed.py [--calls N] [--capacity K] [--cap C] [--smoke]

``--smoke`` (CI): 20 calls, capacity 2, cap 4 (seconds).

The fake server serves K requests at once (50 ms each) and answers 429 above that
(a refusal takes 10 ms), with or without a ``Retry-After`` header.  N calls are made
through one worker whose ``max_concurrency`` is C, with the worker's real retry policy
(6 retries, exponential back-off from 0.5 s):

- ``fixed``: the old behaviour, a semaphore of C held across each call's retries;
- ``adaptive``: the per-provider-key AIMD limiter (slots per attempt).

Printed per case: requests the server saw, 429s, calls that failed after every retry,
and wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from conductor.errors import ModelCallError  # noqa: E402
from conductor.llm.caller import CallerSet  # noqa: E402
from conductor.llm.limiter import CallGate  # noqa: E402
from conductor.llm.types import ModelRequest  # noqa: E402
from conductor.targets import Worker  # noqa: E402
from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply  # noqa: E402


class Capacity:
    """Serves ``k`` requests at once; 429 (after a short refusal delay) above that."""

    def __init__(self, k: int, headers: dict[str, str]) -> None:
        self.k, self.headers = k, headers
        self.serving = self.refused = self.served = 0

    async def __call__(self, _: FakeRequest) -> Reply | Fault:
        if self.serving >= self.k:
            self.refused += 1
            await asyncio.sleep(0.01)
            return Fault(429, "Rate limit reached", headers=self.headers, latency_s=0)
        self.serving += 1
        try:
            await asyncio.sleep(0.05)
        finally:
            self.serving -= 1
        self.served += 1
        return Reply("ok", latency_s=0)


async def run_case(
    server: FakeLLMServer, mode: str, calls: int, cap: int, headers: dict[str, str], k: int
) -> dict[str, Any]:
    model = f"m-{mode}-{len(headers)}"
    capacity = Capacity(k, headers)
    server.script(model, capacity)
    before = len(server.requests)
    target = Worker(id=model, model=model, client="http", api_base=server.openai_base)
    callers = CallerSet(None)
    caller = callers.get(Worker(**{**target.__dict__, "max_concurrency": cap}))
    hold = asyncio.Semaphore(cap)
    if mode == "fixed":
        caller.gate = CallGate(cap, None)

    async def one(i: int) -> bool:
        request = ModelRequest(messages=({"role": "user", "content": f"q{i}"},))
        try:
            if mode == "fixed":
                async with hold:  # held across retries, as before the adaptive limiter
                    await caller.complete(request)
            else:
                await caller.complete(request)
        except ModelCallError:
            return False
        return True

    t0 = time.perf_counter()
    ok = await asyncio.gather(*(one(i) for i in range(calls)))
    wall = time.perf_counter() - t0
    await callers.aclose()
    shared = caller.gate.shared
    return {
        "mode": mode,
        "retry_after": bool(headers),
        "requests": len(server.requests) - before,
        "429s": capacity.refused,
        "failed": ok.count(False),
        "wall_s": round(wall, 2),
        "final_limit": shared.limit if shared is not None else cap,
        "min_limit": shared.min_limit if shared is not None else cap,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--cap", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds, for CI)")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.capacity, args.cap = 20, 2, 4
    ideal = args.calls / args.capacity * 0.05
    print(
        f"{args.calls} calls, server capacity {args.capacity}, worker max_concurrency "
        f"{args.cap}; ideal wall {ideal:.2f} s"
    )
    with FakeLLMServer() as server:
        for headers in ({}, {"Retry-After": "0.2"}):
            for mode in ("fixed", "adaptive"):
                row = await run_case(server, mode, args.calls, args.cap, headers, args.capacity)
                print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
