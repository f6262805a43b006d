"""Speed of the embedded local model, printed as ratios against floors.

Run:  python benchmarks/perf/local_speed.py [--quick]

For every llama.cpp runtime installed (cyllama, llama-cpp-python):

1. Tokens per second of one local worker call through the project (LocalClient: the
   model's host process, the path every ``client: local`` worker takes) against the same
   generation run in this process with nothing around it: the cost of the host process
   and its pipe (floor: >= 0.9x).
2. Where llama-cpp-python is installed: its own ``Llama.create_chat_completion`` on the
   same prompt and settings, as the reference a user would compare with.
3. Extra buffer types on and off (the setting that crashes AMX Xeons): generation and
   prompt tokens per second (floor: the safe setting within 10% of the faster one).

Then the quick-start command, ``conductor ask "What is 17 * 23?"`` on the default pool
with an empty cache: wall time, the Conductor's and the workers' share, peak RSS.

Numbers on a shared two-core machine move with its load: each rate is the median of
several runs, interleaved so that load falls on every variant alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conductor.llm.local_client import LocalClient
from conductor.llm.types import ModelRequest
from conductor.localmodel import models
from conductor.localmodel.generate import Generator
from conductor.localmodel.models import default_n_threads, embedded_model_path
from conductor.localmodel.runtime import LoadSettings, SamplerSettings
from conductor.localmodel.runtimes import installed_runtimes, load_runtime
from conductor.targets import Worker

PROMPT = "Explain in a few sentences why the sky looks blue during the day."
LONG_PROMPT = "Here is a long preamble about planning work for a team of models. " * 30
MAX_TOKENS = 128


def _median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def _messages(prompt: str = PROMPT) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def _in_process(runtime: str, *, extra: bool) -> Generator:
    model = load_runtime(runtime).load(
        LoadSettings(
            path=str(embedded_model_path()),
            n_ctx=4096,
            n_threads=default_n_threads(),
            extra_buffers=extra,
        )
    )
    return Generator(model)


def _generation_rate(generator: Generator) -> float:
    generator.forget()  # no prompt cache: every variant reads its whole prompt
    result = generator.generate(
        _messages(), SamplerSettings(temperature=0.0), max_tokens=MAX_TOKENS
    )
    return result.completion_tokens / (result.prompt_s + result.generate_s)


def _prompt_rate(generator: Generator) -> float:
    generator.forget()
    result = generator.generate(
        _messages(LONG_PROMPT), SamplerSettings(temperature=0.0), max_tokens=1
    )
    return result.prompt_tokens / result.prompt_s


async def _project_rate(client: LocalClient) -> float:
    request = ModelRequest(
        messages=tuple(_messages()),  # type: ignore[arg-type]
        params={"temperature": 0.0, "max_tokens": MAX_TOKENS},
    )
    t0 = time.perf_counter()
    raw = await client.send(request, timeout_s=600)
    return raw.usage.output_tokens / (time.perf_counter() - t0)


def _interleaved(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():
        run()  # warm up each once
    for _ in range(repeats):
        for name, run in variants.items():
            samples[name].append(run())
    return {name: _median(values) for name, values in samples.items()}


def runtime_rates(runtime: str, repeats: int) -> None:
    os.environ["CONDUCTOR_LOCAL_RUNTIME"] = runtime
    os.environ["CONDUCTOR_LOCAL_EXTRA_BUFFERS"] = "off"
    models.stop_all()
    client = LocalClient(Worker(id="w", model="smollm2", client="local"))
    loop = asyncio.new_event_loop()
    bare = _in_process(runtime, extra=False)
    extra = _in_process(runtime, extra=True)
    variants: dict[str, Callable[[], float]] = {
        "project": lambda: loop.run_until_complete(_project_rate(client)),
        "bare": lambda: _generation_rate(bare),
        "extra": lambda: _generation_rate(extra),
        "prompt_off": lambda: _prompt_rate(bare),
        "prompt_on": lambda: _prompt_rate(extra),
    }
    if runtime == "llama-cpp-python":
        import llama_cpp

        reference: Any = llama_cpp.Llama(
            model_path=str(embedded_model_path()),
            n_ctx=4096,
            n_threads=default_n_threads(),
            verbose=False,
        )

        def llama_rate() -> float:
            reference.reset()
            t0 = time.perf_counter()
            out = reference.create_chat_completion(
                messages=_messages(),
                temperature=0.0,
                max_tokens=MAX_TOKENS,
            )
            return int(out["usage"]["completion_tokens"]) / (time.perf_counter() - t0)

        variants["llama"] = llama_rate
    rates = _interleaved(variants, repeats)
    loop.close()
    models.stop_all()
    name = f"{runtime} ({default_n_threads()} thread(s), {MAX_TOKENS} tokens)"
    print(
        f"[1] {name}: in process {rates['bare']:.1f} tok/s, through the host process "
        f"{rates['project']:.1f} tok/s, ratio {rates['project'] / rates['bare']:.3f} "
        "(floor >= 0.9)"
    )
    if "llama" in rates:
        print(
            f"[2] {name}: llama-cpp-python's Llama {rates['llama']:.1f} tok/s; ours through "
            f"the host {rates['project']:.1f} tok/s, ratio {rates['project'] / rates['llama']:.3f}"
        )
    safe_gen, fast_gen = rates["bare"], max(rates["bare"], rates["extra"])
    safe_pp, fast_pp = rates["prompt_off"], max(rates["prompt_off"], rates["prompt_on"])
    print(
        f"[3] {name}: extra buffers off/on: generation {rates['bare']:.1f} / {rates['extra']:.1f} "
        f"tok/s (safe/best {safe_gen / fast_gen:.3f}), prompt {rates['prompt_off']:.0f} / "
        f"{rates['prompt_on']:.0f} tok/s (safe/best {safe_pp / fast_pp:.3f}; floor >= 0.9)"
    )


def quick_start_ask() -> None:
    with tempfile.TemporaryDirectory() as cache:
        out = Path(cache) / "run.json"
        env = {**os.environ, "CONDUCTOR_CACHE_DIR": cache}
        env.pop("CONDUCTOR_LOCAL_EXTRA_BUFFERS", None)
        env.pop("CONDUCTOR_LOCAL_RUNTIME", None)
        t0 = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-m", "conductor", "ask", "What is 17 * 23?", "--out", str(out)],
            capture_output=True,
            text=True,
            env=env,
        )
        wall = time.perf_counter() - t0
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        shares = ""
        if res.returncode == 0:
            record = json.loads(out.read_text())
            conductor_s = sum(
                c["latency_s"] for r in record["rounds"] for c in r.get("conductor_calls") or []
            )
            worker_s = sum(
                s["call"]["latency_s"]
                for r in record["rounds"]
                for s in r["steps"]
                if s.get("call")
            )
            shares = f", Conductor calls {conductor_s:.1f} s, worker calls {worker_s:.1f} s"
    if res.returncode != 0:
        print(res.stderr)
    print(
        f"[4] quick-start ask (cold cache): exit {res.returncode}, wall {wall:.1f} s{shares}, "
        f"largest process {peak_kb / 1024:.0f} MB peak RSS"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one repeat (for CI)")
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, runtimes {installed_runtimes()}"
    )
    quick_start_ask()
    for runtime in installed_runtimes():
        runtime_rates(runtime, repeats=1 if args.quick else 5)


if __name__ == "__main__":
    main()
