"""GPU check: two GRPO steps of a model built on the spot, through the library's trainer.

What a one-GPU machine with torch, transformers, accelerate and peft installed (TRL and
the project's own dependencies carried as wheels, no network, no weights from any hub)
runs to show that ``conductor train``'s GPU path works, and what it costs:

1. the routing proof's task (``routing.yaml``: which of three workers knows an item's
   code number) with its three scripted workers on conductor's fake LLM server at
   127.0.0.1 (:mod:`routing_proof` beside this file);
2. a byte-level BPE tokenizer trained on the task's prompts and a randomly initialised
   Llama, both built here (``--cpu-smoke``: 2 layers of 64; on a GPU the shape of
   Qwen2.5-0.5B's layers, 24 of 896, over the small vocabulary: ~0.36 B parameters);
3. the library's format warm start (:func:`conductor.train.warmstart.format_warm_start`)
   on the device, so that sampled workflows parse and the workers are called;
4. ``--steps`` (2) GRPO steps through :func:`conductor.train.trainer.train`, the policy
   loaded by the library's loader (bfloat16 on a GPU with bf16, float32 on a CPU).

It prints the versions of torch, transformers, trl, accelerate and peft, the device
name, each step's seconds, reward, parse rate and loss, and the peak GPU memory of each
step and of the run (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``; on
the CPU the process's peak resident set instead).  Exit status: 0 when every step ran
with a finite loss and the checkpoint was saved, 1 on any failure, 2 when there is no
CUDA device and ``--cpu-smoke`` was not given.  docs/training.md ("A GPU check") gives
the command a lent machine runs and how to carry the wheels.

    python benchmarks/train/gpu_check.py               # on the GPU machine
    python benchmarks/train/gpu_check.py --cpu-smoke   # CI: the same path, smallest size
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
# The routing proof's task, workers and config are this check's: one definition of each.
sys.path.insert(0, str(HERE))

#: Exit status when there is no CUDA device and ``--cpu-smoke`` was not given.
NO_CUDA = 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class Size:
    """The model, the batch and the warm start of one size of the check."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    group: int  # rollouts per question
    questions: int  # questions per step
    max_tokens: int  # completion tokens
    warm_passes: int
    warm_lr: float


#: The GPU size: Qwen2.5-0.5B's layer shape (24 x 896, 14 heads, 2 KV heads, MLP 4864)
#: over the tokenizer built here; the routing proof's batch (8 x 4) with longer replies.
GPU = Size(896, 24, 14, 2, 4864, 2000, 8, 4, 256, 6, 3e-4)
#: The smallest size (--cpu-smoke): seconds on two CPU cores.
SMOKE = Size(64, 2, 4, 2, 128, 400, 4, 2, 24, 30, 5e-3)


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "trl", "accelerate", "peft", "datasets"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def build_tokenizer(texts: list[str], vocab: int) -> Any:
    """A byte-level BPE tokenizer trained on ``texts`` (any text round-trips), with a
    plain chat template; nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer: Any, size: Size, seed: int) -> Any:
    """A randomly initialised Llama of ``size`` for ``tokenizer`` (float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


class Memory:
    """Peak memory of the current interval: the GPU's allocator on CUDA, else the
    process's resident set (the routing proof's sampler)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if not cuda:
            import routing_proof

            self.rss = routing_proof.PeakMemory()

    def take(self) -> dict[str, float]:
        """The interval's peaks in GB; starts the next interval."""
        if not self.cuda:
            return {"peak_rss_gb": self.rss.take()}
        import torch

        peak = {
            "max_allocated_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
            "max_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 3),
        }
        torch.cuda.reset_peak_memory_stats()
        return peak


def check(args: argparse.Namespace, size: Size, cuda: bool, out: Path) -> dict[str, Any]:
    """The warm start and the GRPO steps in ``out``; what they measured.  Raises on failure."""
    import routing_proof
    import torch

    from conductor.train.policy import load_policy
    from conductor.train.settings import WarmStartSettings
    from conductor.train.trainer import CHECKPOINT_DIR, build_grpo_config, train
    from conductor.train.warmstart import format_warm_start, warm_start_target

    memory = Memory(cuda)
    report: dict[str, Any] = {}
    proof_args = argparse.Namespace(
        seed=args.seed,
        group=size.group,
        questions=size.questions,
        lr=2e-5,
        max_tokens=size.max_tokens,
        steps=args.steps,
    )
    setup = routing_proof.Setup(proof_args, out)
    try:
        rows = setup.train_rows
        rng = random.Random(args.seed)
        corpus = [str(m["content"]) for row in rows for m in row["prompt"]]
        corpus += [warm_start_target(rng, 3, setup.config.max_steps) for _ in range(200)]
        tokenizer = build_tokenizer(corpus, size.vocab)
        model = build_model(tokenizer, size, args.seed).to("cuda" if cuda else "cpu")
        report["parameters_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
        print(f"model: {report['parameters_m']} M parameters, {len(tokenizer)} tokens", flush=True)
        started = time.monotonic()
        warm = format_warm_start(
            model,
            tokenizer,
            rows,
            WarmStartSettings(passes=size.warm_passes, learning_rate=size.warm_lr, batch_size=8),
            max_steps=setup.config.max_steps,
            seed=args.seed,
        )
        policy_dir = out / "policy"
        model.save_pretrained(policy_dir)
        tokenizer.save_pretrained(policy_dir)
        del model
        report["warm_start"] = {
            "seconds": round(time.monotonic() - started, 1),
            "batches": len(warm.losses),
            "loss_first": warm.losses[0],
            "loss_last": warm.losses[-1],
            **memory.take(),
        }
        print(f"warm start: {json.dumps(report['warm_start'])}", flush=True)

        config = routing_proof.make_config(
            setup.pool_file, str(policy_dir), out, proof_args, cost_penalty_per_usd=0.0
        )
        # What the trainer will get: the loader's dtype and TRL's bf16 switch.
        policy, _tok = load_policy(str(policy_dir))
        report["policy_dtype"] = str(policy.dtype).removeprefix("torch.")
        del policy
        report["grpo_bf16"] = bool(build_grpo_config(config, output_dir=out / "grpo").bf16)
        print(f"policy dtype {report['policy_dtype']}, GRPO bf16={report['grpo_bf16']}", flush=True)
        if cuda:
            torch.cuda.empty_cache()
            memory.take()  # the GRPO steps' peaks start here
        steps: list[dict[str, Any]] = []
        last = [0.0]

        def on_metrics(row: dict[str, Any]) -> None:
            elapsed = float(row["elapsed_s"])
            line = {
                "step": row["step"],
                "seconds": round(elapsed - last[0], 2),
                "reward_mean": row["reward_mean"],
                "parse_rate": row["parse_rate"],
                "calls_per_rollout": row.get("calls_per_rollout"),
                "loss": row["loss"],
                **memory.take(),
            }
            last[0] = elapsed
            steps.append(line)
            print(f"GRPO step: {json.dumps(line)}", flush=True)

        checkpoint = train(config, on_metrics=on_metrics)
        report["steps"] = steps
        report["checkpoint"] = CHECKPOINT_DIR
        problems = []
        if len(steps) != args.steps:
            problems.append(f"{len(steps)} metrics lines for {args.steps} steps")
        if any(s["loss"] is None or not math.isfinite(float(s["loss"])) for s in steps):
            problems.append("a step's loss is missing or not finite")
        if not (checkpoint / "conductor.json").is_file():
            problems.append(f"no conductor.json in {checkpoint}")
        if problems:
            raise RuntimeError("; ".join(problems))
        return report
    finally:
        setup.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="no GPU needed: the same path on the CPU at the smallest size (float32)",
    )
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=None, help="keep the run here")
    args = parser.parse_args()

    import torch

    found = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items()), flush=True)
    cuda = bool(torch.cuda.is_available())
    if not cuda and not args.cpu_smoke:
        print(
            f"no CUDA device: torch {torch.__version__} sees none (torch.version.cuda = "
            f"{torch.version.cuda}); nothing was run.  --cpu-smoke runs the same path on the CPU",
            file=sys.stderr,
        )
        return NO_CUDA
    if args.threads:
        torch.set_num_threads(args.threads)
    size = GPU if cuda and not args.cpu_smoke else SMOKE
    cuda = cuda and not args.cpu_smoke
    device = (
        torch.cuda.get_device_name(0)
        if cuda
        else f"CPU ({platform.machine()}, {torch.get_num_threads()} torch threads)"
    )
    print(f"device: {device}", flush=True)
    started = time.monotonic()
    cpu_started = time.process_time()
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            report = check(args, size, cuda, args.out)
        else:
            with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
                report = check(args, size, cuda, Path(tmp))
    except Exception:
        traceback.print_exc()
        print("gpu check: FAILED", file=sys.stderr)
        return 1
    report.update(
        device=device,
        versions=found,
        size=size.__dict__,
        wall_s=round(time.monotonic() - started, 1),
        cpu_s=round(time.process_time() - cpu_started, 1),
    )
    if cuda:
        report["peak_gpu_gb"] = {
            key: max(s[key] for s in [report["warm_start"], *report["steps"]])
            for key in ("max_allocated_gb", "max_reserved_gb")
        }
    print(f"gpu check: {json.dumps(report)}", flush=True)
    print(f"gpu check: OK ({len(report['steps'])} GRPO steps in {report['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
