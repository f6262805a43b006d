"""Rollouts per second with and without ``grpo.async_rollouts``, on workers that take
seconds to answer.

The routing proof's task (benchmarks/train/routing_proof.py: its questions, pool and
scripted workers, with a shorter prompt), with every worker answering after ``--latency`` seconds (2
by default: the fake server sleeps, it does not compute).  The policy is built here: a
two-layer Llama with a byte-level tokenizer trained on the prompts, taught by a few
supervised passes to reply with a one-step workflow to Model 1 or Model 0 (as
tests/test_train_trainer.py teaches its policy), so that its completions parse and
call the workers.  Then the same GRPO steps twice from that
policy and seed, synchronous (the paper's) and with ``async_rollouts``; for each it
prints the wall seconds of ``train``, rollouts per second (completions scored over that
wall time), the process's CPU seconds, the most threads alive, the peak resident
memory, the staleness of each step, the worker calls per rollout and the reward curve,
with the load average before and after (the machine is shared: read the figures with
it).

    python benchmarks/train/async_rollouts.py [--steps 6] [--latency 2] [--smoke]

``--smoke`` (CI): three steps, 1 s workers; it fails only if a
run breaks or no completion reached the workers, not on the speed-up (a loaded CI
machine would make that a coin flip).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# The routing proof's task and workers, beside this script.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import routing_proof as rp  # noqa: E402

#: The replies the tiny policy is taught: Model 1 is the reliable worker.
REPLIES = tuple(
    f'model_id = [{i}]\nsubtasks = ["Answer the question."]\naccess_list = [[]]' for i in range(3)
)


def tiny_policy(rows: list[dict[str, Any]], directory: Path, *, passes: int, seed: int) -> Path:
    """A tiny Llama taught the reply format by a few supervised passes; saved to
    ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # The tests' tiny-model kit: its chat template, model and supervised passes.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tests"))
    from kit.tinymodels import CHAT_TEMPLATE, overfit, tiny_llama

    corpus = [json.dumps(r["prompt"]) for r in rows] + 20 * list(REPLIES)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus * 2,
        trainer=trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<|end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    model = tiny_llama(fast, seed=seed, max_positions=1024)
    # Supervised steps on two replies per prompt (the reliable worker or a guesser):
    # the policy then writes workflows that parse, half of them earning the reward.
    examples = [
        (fast.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False), reply)
        for row in rows[:4]
        for reply in (REPLIES[1], REPLIES[0])
    ]
    # Stop below 0.08: what is left is the coin flip between the two replies.
    mean = overfit(model, fast, examples, steps=passes, stop_below=0.08)
    print(f"supervised warm start: loss {mean:.3f} (at most {passes} passes)", flush=True)
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


class Threads:
    """The most threads this process had at once, sampled every 0.05 s from /proc."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="thread-count")
        self._thread.start()

    @staticmethod
    def now() -> int:
        try:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("Threads:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return threading.active_count()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


#: A short Conductor prompt: the tiny policy learns the reply's format in seconds.
TEMPLATE = "Models:\n${workers}\nQ: ${question}\n"


def prepare(server: Any, out: Path, args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    """The routing proof's training config with :data:`TEMPLATE`, and its prompt rows."""
    from dataclasses import replace

    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor

    out.mkdir(parents=True, exist_ok=True)
    (out / "tiny.txt").write_text(TEMPLATE)
    config = rp.make_config(rp.write_pool(server, out), "(built below)", out, args)
    config = replace(config, template=str(out / "tiny.txt"))
    pool = load_train_pool(config)
    rows = build_rows(config, pool, training_conductor(config, pool), rng_seed=args.seed)
    return config, rows


def run(config: Any, policy: Path, out: Path, *, pipelined: bool) -> dict[str, Any]:
    """One GRPO run from ``policy``; its figures."""
    from dataclasses import replace

    from conductor.train.trainer import train

    rows: list[dict[str, Any]] = []
    config = replace(
        config,
        base_model=str(policy),
        output_dir=str(out),
        grpo=replace(config.grpo, async_rollouts=pipelined),
    )
    threads = Threads()
    load_before = load()
    cpu0, t0 = cpu_seconds(), time.monotonic()
    if rp.MEMORY is not None:
        rp.MEMORY.take()
    train(config, on_metrics=rows.append)
    wall = time.monotonic() - t0
    rollouts = sum(int(r["rollouts"] or 0) for r in rows)
    return {
        "mode": "async" if pipelined else "sync",
        "steps": len(rows),
        "rollouts": rollouts,
        "wall_s": round(wall, 2),
        "rollouts_per_s": round(rollouts / wall, 3),
        "cpu_s": round(cpu_seconds() - cpu0, 2),
        "threads_peak": threads.stop(),
        "peak_rss_gb": rp.MEMORY.take() if rp.MEMORY is not None else None,
        "staleness": [r["staleness"] for r in rows],
        "calls_per_rollout": [r["calls_per_rollout"] for r in rows],
        "reward": [r["reward_mean"] for r in rows],
        "load_before": load_before,
        "load_after": load(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (6; smoke: 3)")
    parser.add_argument("--latency", type=float, default=None, help="worker seconds (2; smoke 1)")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument(
        "--warm-passes", type=int, default=None, help="most supervised passes (150)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="CI size (see the docstring)")
    args = parser.parse_args()
    args.steps = args.steps or (3 if args.smoke else 6)
    args.latency = args.latency if args.latency is not None else (1.0 if args.smoke else 2.0)
    passes = args.warm_passes or 150
    # What routing_proof.make_config reads besides.
    args.lr, args.max_tokens, args.async_rollouts = 1e-4, 32, False

    from dataclasses import replace

    import torch

    torch.set_num_threads(args.threads)
    rp.MEMORY = rp.PeakMemory()
    results = []
    server = rp.start_workers()
    with tempfile.TemporaryDirectory(prefix="async-rollouts-") as tmp:
        out = Path(tmp)
        try:
            config, rows = prepare(server, out / "setup", args)
            t0 = time.monotonic()
            policy = tiny_policy(rows, out / "policy", passes=passes, seed=args.seed)
            print(f"tiny policy warm-started in {time.monotonic() - t0:.1f}s", flush=True)
            server.latency_s = args.latency
            # One step first, not counted: the first run pays for imports and caches.
            run(
                replace(config, grpo=replace(config.grpo, steps=1)),
                policy,
                out / "w",
                pipelined=False,
            )
            for pipelined in (False, True):
                figures = run(config, policy, out / str(pipelined), pipelined=pipelined)
                results.append(figures)
                print(json.dumps(figures), flush=True)
        finally:
            server.stop()
    sync, overlapped = results
    print(
        f"workers {args.latency:g}s, {args.steps} steps of {args.questions}x{args.group}: "
        f"sync {sync['rollouts_per_s']} rollouts/s ({sync['wall_s']}s), async "
        f"{overlapped['rollouts_per_s']} rollouts/s ({overlapped['wall_s']}s): "
        f"x{overlapped['rollouts_per_s'] / sync['rollouts_per_s']:.2f}"
    )
    called = all(any(c for c in r["calls_per_rollout"] if c) for r in results)
    if not called or any(r["steps"] != args.steps for r in results):
        print("a run did not reach the workers or did not take every step", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
