"""Proof that ``conductor train`` learns: GRPO teaches a small Conductor whom to ask.

The task has a verifiable answer and one reliable worker.  Each question asks for the
code number of an item in a hidden table (``routing_train.jsonl``: 40 items for
training, ``routing_heldout.jsonl``: 8 held out).  The pool has three workers, listed
to the Conductor only as "Model 0/1/2":

- Model 1 (``table``) knows the table and answers correctly;
- Model 0 (``guess-a``) and Model 2 (``guess-b``) answer with a wrong number.

The workers are scripted stand-ins served by conductor's fake LLM server (think "a
local worker given the right lookup tool" versus two that lack it).  That keeps every
rollout's execution instant, so the CPU time goes to the policy; the Conductor side is
real: its completions are parsed, executed through the normal executor and graded by
the math grader, exactly as in any ``conductor train`` run.

The policy is SmolLM2-135M-Instruct, converted from the GGUF file embedded in the
package (``gguf:smollm2``).  Out of the box that model never writes the three lists
(0 of 16 samples parsed in our probes), so a GRPO signal would be all zeros.  The
script therefore first *warm-starts the format*: a few supervised steps on workflows
whose worker is drawn uniformly at random (so the warm start teaches the format but
nothing about who is reliable).  GRPO (``conductor.train.trainer.train``) must then
discover by reward alone that workflows ending at Model 1 score 1 and the others 0.5.

Run (about 20-30 minutes on two CPU cores)::

    python benchmarks/train/routing_proof.py [--steps 40] [--out runs/routing-proof]

``--smoke`` (what CI runs, seconds): the workers, the pool, the training and held-out
rows and TRL's GRPO config are built, and the run stops before any model is loaded
(loading the policy alone takes a minute on two cores); nothing is written outside a
temporary directory.

It prints the reward curve (step, mean reward, parse rate, share of parsed workflows
whose last step uses the reliable worker) and a before/after comparison on the held-out
items, and writes both to ``benchmarks/train/routing_proof_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
BENCHMARK = HERE / "routing.yaml"
TEMPLATE = HERE / "routing_prompt.txt"
RESULTS = HERE / "routing_proof_results.json"
WORKERS = ("guess-a", "table", "guess-b")  # Model 0, Model 1 (reliable), Model 2
RELIABLE = "table"
SUBTASKS = (
    "Answer the question.",
    "Find the code number and answer.",
    "Look up the item and give its code number.",
)


def _table() -> dict[int, str]:
    table = {}
    for name in ("routing_train.jsonl", "routing_heldout.jsonl"):
        for line in (HERE / name).read_text().splitlines():
            row = json.loads(line)
            table[int(row["id"].split("-")[1])] = row["answer"]
    return table


def start_workers() -> Any:
    """The fake server with the three scripted workers."""
    from conductor.testing import FakeLLMServer

    table = _table()

    def item(request: Any) -> int:
        found = re.search(r"item (\d+)", request.last_user_message)
        return int(found.group(1)) if found else 0

    def knows(request: Any) -> str:
        return f"The table says so.\nANSWER: {table.get(item(request), '0')}"

    def guess_a(request: Any) -> str:
        n = item(request)
        return f"ANSWER: {table.get(n % len(table) + 1, '1000')}"  # another item's code

    def guess_b(request: Any) -> str:
        return f"ANSWER: {1000 + 37 * item(request)}"

    server = FakeLLMServer().start()
    server.script("table", knows)
    server.script("guess-a", guess_a)
    server.script("guess-b", guess_b)
    return server


def write_pool(server: Any, directory: Path) -> Path:
    import yaml

    workers = [
        {
            "id": w,
            "model": w,
            "client": "openai",
            "api_base": server.openai_base,
            "max_retries": 1,
            "price": {"input_per_mtok": 0.0, "output_per_mtok": 0.0},  # scripted: free
        }
        for w in WORKERS
    ]
    data: dict[str, Any] = {
        "name": "routing-proof",
        "defaults": {"temperature": 0.2, "max_tokens": 64},
        "workers": workers,
    }
    path = directory / "pool.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_config(pool_file: Path, base_model: str, out: Path, args: argparse.Namespace) -> Any:
    from conductor.train.config import DataMix, GRPOSettings, TrainConfig

    return TrainConfig(
        base_model=base_model,
        pool=str(pool_file),
        data=(DataMix(benchmark=str(BENCHMARK), split="train"),),
        output_dir=str(out / "grpo"),
        max_steps=2,
        template=str(TEMPLATE),
        seed=args.seed,
        grpo=GRPOSettings(
            group_size=args.group,
            questions_per_step=args.questions,
            learning_rate=args.lr,
            lr_scheduler="constant",
            warmup_ratio=0.0,
            kl_beta=0.0,
            clip_epsilon=0.2,
            temperature=1.0,
            max_completion_tokens=args.max_tokens,
            steps=args.steps,
            logging_steps=1,
        ),
    )


def _target(rng: random.Random) -> str:
    """A format-only warm-start reply: the worker(s) drawn uniformly at random."""
    access: list[list[str]]
    if rng.random() < 0.75:
        ids, subtasks, access = [rng.randrange(3)], [rng.choice(SUBTASKS)], [[]]
    else:
        ids = [rng.randrange(3), rng.randrange(3)]
        subtasks = [rng.choice(SUBTASKS), "Check the answer above and give the code number."]
        access = [[], ["all"]]
    return (
        f"model_id = {json.dumps(ids)}\n"
        f"subtasks = {json.dumps(subtasks)}\n"
        f"access_list = {json.dumps(access)}"
    )


def warm_start(config: Any, rows: list[dict[str, Any]], out: Path, seed: int) -> dict[str, Any]:
    """Supervised format warm start (uniformly random workers); saves to out/warm."""
    import torch

    from conductor.train.policy import load_policy

    model, tok = load_policy("gguf:smollm2")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    examples = []
    for _ in range(3):
        for row in rows:
            prompt = tok.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=False
            )
            p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            t_ids = tok(_target(rng), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            examples.append((p_ids, t_ids))
    rng.shuffle(examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    losses = []
    t0 = time.monotonic()
    for start in range(0, len(examples), 8):
        batch = examples[start : start + 8]
        width = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, t) in enumerate(batch):
            seq = p + t
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(t)
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 4))
    model.eval()
    directory = out / "warm"
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return {"examples": len(examples), "losses": losses, "seconds": round(time.monotonic() - t0)}


def sample_replies(model: Any, tokenizer: Any, chats: list[Any], max_new_tokens: int) -> list[str]:
    """One reply per chat from ``model``, sampled at temperature 1 as the rollouts are."""
    import torch

    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in chats
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # decoder-only batches must end where generation starts
    try:
        replies: list[str] = []
        for start in range(0, len(texts), 8):
            batch = tokenizer(
                texts[start : start + 8],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(model.device)
            with torch.no_grad():
                out = model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    do_sample=True,
                    temperature=1.0,
                    pad_token_id=tokenizer.pad_token_id,
                )
            width = batch["input_ids"].shape[1]
            replies += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        return replies
    finally:
        tokenizer.padding_side = side


def evaluate(
    model_dir: str, config: Any, rows: list[dict[str, Any]], samples: int, seed: int
) -> dict[str, Any]:
    """Sample ``samples`` workflows per held-out question (temperature 1), execute and
    grade them with the training reward; the mean reward, parse rate and routing."""
    import torch

    from conductor.train.policy import load_policy
    from conductor.train.pools import load_train_pool, training_conductor
    from conductor.train.reward import WorkflowReward

    model, tok = load_policy(model_dir)
    model.eval()
    torch.manual_seed(seed)
    expanded = [row for row in rows for _ in range(samples)]
    texts = sample_replies(
        model, tok, [r["prompt"] for r in expanded], config.grpo.max_completion_tokens
    )
    pool = load_train_pool(config)
    reward = WorkflowReward.from_config(config, pool, training_conductor(config, pool))
    try:
        columns = {k: [r[k] for r in expanded] for k in expanded[0] if k != "prompt"}
        rewards = reward([r["prompt"] for r in expanded], texts, **columns)
        results = list(reward.last_batch)
    finally:
        reward.close()
    parsed = [r for r in results if r.parsed]
    scored = [r for r in rewards if r is not None]  # None: TRL's "no score", never ours
    return {
        "completions": len(results),
        "mean_reward": round(sum(scored) / max(1, len(scored)), 4),
        "parse_rate": round(len(parsed) / len(results), 4),
        "correct_rate": round(sum(1 for r in results if r.correct) / len(results), 4),
        "reliable_last_share": round(
            sum(1 for r in parsed if r.workers and r.workers[-1] == RELIABLE) / max(1, len(parsed)),
            4,
        ),
        "example": texts[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/routing-proof"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--smoke", action="store_true", help="build the data and the GRPO config, then stop"
    )
    args = parser.parse_args()
    if args.smoke:
        smoke(args)
        return

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor
    from conductor.train.trainer import train

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    server = start_workers()
    t0 = time.monotonic()
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    try:
        pool_file = write_pool(server, out)
        config = make_config(pool_file, "gguf:smollm2", out, args)
        pool = load_train_pool(config)
        conductor = training_conductor(config, pool)
        train_rows = build_rows(config, pool, conductor, rng_seed=args.seed)
        held_config = make_config(pool_file, "gguf:smollm2", out, args)
        from dataclasses import replace

        from conductor.train.config import DataMix

        held_config = replace(held_config, data=(DataMix(benchmark=str(BENCHMARK), split="test"),))
        held_rows = build_rows(held_config, pool, conductor, rng_seed=args.seed)

        print("evaluating the base model (no warm start) ...", flush=True)
        report["base"] = evaluate("gguf:smollm2", config, held_rows, 4, args.seed)
        print(json.dumps(report["base"]), flush=True)
        print("format warm start (uniformly random workers) ...", flush=True)
        report["warm_start"] = warm_start(config, train_rows, out, args.seed)
        print(json.dumps(report["warm_start"]), flush=True)
        warm = str(out / "warm")
        report["before"] = evaluate(warm, config, held_rows, args.eval_samples, args.seed)
        print("before GRPO:", json.dumps(report["before"]), flush=True)

        curve: list[dict[str, Any]] = []

        def on_metrics(row: dict[str, Any]) -> None:
            last = row.get("last_worker_usage") or {}
            share = last.get(RELIABLE, 0) / max(1, sum(last.values()))
            point = {
                "step": row["step"],
                "reward_mean": row["reward_mean"],
                "parse_rate": row["parse_rate"],
                "reliable_last_share": round(share, 4),
                "loss": row["loss"],
                "elapsed_s": row["elapsed_s"],
            }
            curve.append(point)
            print(
                f"step {point['step']:3d}  reward {point['reward_mean']:.3f}  "
                f"parsed {point['parse_rate']:.2f}  last step by Model 1 {share:.2f}  "
                f"{point['elapsed_s']:.0f}s",
                flush=True,
            )
            report["curve"] = curve
            args.results.write_text(json.dumps(report, indent=2) + "\n")

        grpo_config = make_config(pool_file, warm, out, args)
        checkpoint = train(grpo_config, on_metrics=on_metrics)
        report["checkpoint"] = str(checkpoint)
        report["after"] = evaluate(str(checkpoint), config, held_rows, args.eval_samples, args.seed)
        print("after GRPO:", json.dumps(report["after"]), flush=True)
        k = min(3, len(curve))
        report["summary"] = {
            "reward_first_steps": round(sum(p["reward_mean"] for p in curve[:k]) / k, 4),
            "reward_last_steps": round(sum(p["reward_mean"] for p in curve[-k:]) / k, 4),
            "reliable_share_first_steps": round(
                sum(p["reliable_last_share"] for p in curve[:k]) / k, 4
            ),
            "reliable_share_last_steps": round(
                sum(p["reliable_last_share"] for p in curve[-k:]) / k, 4
            ),
            "steps_averaged": k,
            "total_seconds": round(time.monotonic() - t0),
        }
        print("summary:", json.dumps(report["summary"]), flush=True)
    finally:
        server.stop()
        args.results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.results}", file=sys.stderr)


def smoke(args: argparse.Namespace) -> None:
    """The run up to its first model load: workers, pool, rows and TRL's config."""
    import tempfile

    from conductor.train.dataset import build_rows
    from conductor.train.pools import load_train_pool, training_conductor
    from conductor.train.trainer import build_grpo_config

    server = start_workers()
    try:
        with tempfile.TemporaryDirectory(prefix="routing-proof-smoke-") as tmp:
            out = Path(tmp)
            config = make_config(write_pool(server, out), "gguf:smollm2", out, args)
            pool = load_train_pool(config)
            conductor = training_conductor(config, pool)
            rows = build_rows(config, pool, conductor, rng_seed=args.seed)
            build_grpo_config(config, output_dir=out / "grpo")
    finally:
        server.stop()
    print(
        f"smoke: {len(rows)} training rows, pool {[w.id for w in pool.workers]}, "
        "GRPO config built; stopped before loading the policy"
    )


if __name__ == "__main__":
    main()
