"""Speed and memory of the embedded local model, printed as numbers.

Run:  python benchmarks/perf/local_speed.py

1. Tokens per second of one local worker call through the project (LocalClient, the
   path every `client: local` worker takes) against a bare `llama_cpp.Llama` call on the
   same prompt and settings, in the same process (target: >= 0.9x).
2. Wall time and peak RSS of the quick-start command, `conductor ask "What is 17 * 23?"`
   on the default pool with an empty cache (targets: under 30 s on two cores; RSS a few
   hundred MB).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from conductor.llm.local_client import LocalClient
from conductor.llm.local_model import default_n_threads, embedded_model_path, get_llama
from conductor.llm.types import ModelRequest
from conductor.targets import Worker

PROMPT = "Explain in a few sentences why the sky looks blue during the day."
MAX_TOKENS = 128


def bare_call(llama: object) -> tuple[int, float]:
    t0 = time.perf_counter()
    out = llama.create_chat_completion(  # type: ignore[attr-defined]
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        seed=0,
    )
    return int(out["usage"]["completion_tokens"]), time.perf_counter() - t0


async def project_call(client: LocalClient) -> tuple[int, float]:
    request = ModelRequest(
        messages=({"role": "user", "content": PROMPT},),
        params={"temperature": 0.0, "max_tokens": MAX_TOKENS},
    )
    t0 = time.perf_counter()
    raw = await client.send(request, timeout_s=300)
    return raw.usage.output_tokens, time.perf_counter() - t0


def tokens_per_second(repeats: int = 5) -> None:
    path = embedded_model_path()
    llama, _lock = get_llama(path)  # the same shared instance the client uses
    client = LocalClient(Worker(id="w", model="smollm2", client="local"))
    bare_call(llama)  # warm the prompt cache equally for both
    asyncio.run(project_call(client))
    bare_rates, ours_rates = [], []
    for _ in range(repeats):
        n, s = bare_call(llama)
        bare_rates.append(n / s)
        n, s = asyncio.run(project_call(client))
        ours_rates.append(n / s)
    b, o = statistics.median(bare_rates), statistics.median(ours_rates)
    print(
        f"[1] SmolLM2-135M, {MAX_TOKENS} tokens, {default_n_threads()} thread(s): bare Llama "
        f"{b:.1f} tok/s  conductor {o:.1f} tok/s  ratio {o / b:.3f}  (target >= 0.9)"
    )


def quick_start_ask() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "CONDUCTOR_CACHE_DIR": cache}
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "conductor", "ask", "What is 17 * 23?"],
            capture_output=True,
            text=True,
            env=env,
        )
        wall = time.perf_counter() - t0
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if res.returncode != 0:
        print(res.stderr)
    rss = f"{peak_kb / 1024:.0f} MB" if peak_kb > before else "n/a (an earlier child was larger)"
    print(
        f"[2] quick-start ask (cold cache): exit {res.returncode}, wall {wall:.1f} s, "
        f"peak RSS {rss}  (targets: < 30 s; a few hundred MB)"
    )


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    quick_start_ask()  # first, so its peak RSS is the largest child so far
    tokens_per_second()


if __name__ == "__main__":
    main()
