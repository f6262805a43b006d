"""What each per-step credit estimator buys, on a routing task where only step 2 matters.

Every plan has three steps with fixed instructions and access lists::

    model_id = [a, b, c]
    subtasks = ["Draft", "Solve", "Report"]
    access_list = [[], ["all"], ["all"]]

and the pool three scripted workers (the fake LLM server): anyone's "Draft" is a wrong
guess; "Solve" is right only from Model 1; "Report" repeats the last answer it was
shown.  So a plan is right (reward 1) exactly when its SECOND step goes to Model 1, and
wrong (0.5) otherwise, whoever drafts and reports.

The policy is a two-layer Llama with a byte-level tokenizer, built here (the tests' own
builders, tests/kit/tinymodels.py) and first taught, by a few supervised passes, to
write the 27 plans about equally often: it starts at P(step 2 = Model 1) ~ 1/3, a mean
reward near 0.67.  From that one warm checkpoint, ``conductor.train.trainer.train`` runs
GRPO once per estimator (``credit: outcome | structure | descendant | counterfactual``,
same seed, same rows, a fresh call cache each) and the script prints, for each, the
first step at which the mean reward of the last :data:`WINDOW` steps reached
:data:`TARGET` (or "not reached in N"), the worker
calls by step (cache hits apart), the threads, wall and CPU time and the peak memory.

Run (docs/training.md gives the measured table)::

    python benchmarks/train/credit_proof.py [--steps 80] [--seeds 0,1] [--lr 1e-3]

``--smoke`` (CI size): two GRPO steps per estimator; it checks that every estimator
trains, that each per-step credit changed some tokens' advantages in TRL's loss
(``credit_token_share``) and that the counterfactual one made cache hits, not the
learning.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: The mean reward a run must reach (1.0 is every plan right, 0.5 every plan wrong).
TARGET = 0.9
#: Steps whose mean rewards are averaged before comparing with :data:`TARGET`.
WINDOW = 3
ESTIMATORS = ("outcome", "structure", "descendant", "counterfactual")
TEMPLATE = "Models:\n${workers}\nAt most ${max_steps} steps.\nQ: ${question}\n"
QUESTIONS = [(f"q{i}", f"What is the code of item {i}?", str(40 + i)) for i in range(4)]
SUBTASKS = ["Draft", "Solve", "Report"]
GOOD = 1  # the worker whose "Solve" is right


def plan(workers: tuple[int, ...]) -> str:
    ids = ", ".join(str(w) for w in workers)
    return (
        f"model_id = [{ids}]\n"
        'subtasks = ["Draft", "Solve", "Report"]\n'
        'access_list = [[], ["all"], ["all"]]'
    )


PLANS = [plan(w) for w in itertools.product(range(3), repeat=3)]


def worker_script(index: int) -> Any:
    golds = {q: a for _, q, a in QUESTIONS}

    def answer(request: Any) -> str:
        text = request.last_user_message
        task = text.rsplit("\n", 1)[-1]
        if "Report" in task:
            seen = re.findall(r"ANSWER: (\d+)", text)
            return f"ANSWER: {seen[-1]}" if seen else "ANSWER: none"
        if "Solve" in task and index == GOOD:
            return "ANSWER: " + next((a for q, a in golds.items() if q in text), "0")
        return "ANSWER: 7"

    return answer


def setup(directory: Path, server: Any) -> dict[str, Path]:
    """The pool, benchmark and template files in ``directory``."""
    import yaml

    workers = [
        {
            "id": f"w{i}",
            "model": f"w{i}",
            "client": "openai",
            "api_base": server.openai_base,
            "max_retries": 0,
            "price": {"input_per_mtok": 0.0, "output_per_mtok": 0.0},
        }
        for i in range(3)
    ]
    for i in range(3):
        server.script(f"w{i}", worker_script(i))
    pool = directory / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {"name": "credit-proof", "defaults": {"max_tokens": 16}, "workers": workers},
            sort_keys=False,
        )
    )
    rows = [{"id": i, "question": q, "answer": a} for i, q, a in QUESTIONS]
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Evaluation questions apart: the contamination guard refuses training on them.
    (directory / "eval.jsonl").write_text(json.dumps({"question": "Item 99?", "answer": "1"}))
    benchmark = directory / "codes.yaml"
    benchmark.write_text(
        yaml.safe_dump(
            {
                "name": "codes",
                "source": {"file": "eval.jsonl"},
                "train_source": {"file": "train.jsonl"},
                "fields": {"loader": "math", "question": "question", "answer": "answer"},
                "prompt": "${question}",
                "answer_format": "math",
                "grader": "short",
            }
        )
    )
    template = directory / "prompt.txt"
    template.write_text(TEMPLATE)
    return {"pool": pool, "benchmark": benchmark, "template": template}


def warm_policy(directory: Path, files: dict[str, Path], seed: int) -> Path:
    """A tiny policy that writes each of the 27 plans about equally often."""
    sys.path.insert(0, str(REPO / "tests"))
    from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer

    from conductor.conductors.prompt import build_conductor_messages
    from conductor.pool import load_pool

    pool = load_pool(files["pool"])
    prompts = [
        build_conductor_messages(q, pool.workers, max_steps=3, template=str(files["template"]))
        for _, q, _ in QUESTIONS
    ]
    corpus = [*PLANS, TEMPLATE, "Models: - Model 0 - Model 1 - Model 2 At most steps. Q: code"]
    corpus += [f"What is the code of item {i}? {i} user assistant" for i in range(10)]
    tok = tiny_tokenizer(corpus)
    model = tiny_llama(tok, seed=seed, max_positions=512)
    examples = []
    for messages in prompts:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        examples += [(text, p) for p in PLANS]
    # A few passes: the plan's frame is learnt exactly, the three worker digits stay a
    # near-uniform choice (27 targets per prompt cannot all be memorised).
    overfit(model, tok, examples, steps=3, lr=3e-3)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def config_for(
    credit: str, policy: Path, files: dict[str, Path], out: Path, args: argparse.Namespace
) -> Any:
    from conductor.train.settings import DataMix, GRPOSettings, TrainConfig

    return TrainConfig(
        base_model=str(policy),
        pool=str(files["pool"]),
        data=(DataMix(benchmark=str(files["benchmark"]), split="train"),),
        output_dir=str(out),
        max_steps=3,
        template=str(files["template"]),
        seed=args.seed,
        credit=credit,
        credit_weight=args.weight,
        grpo=GRPOSettings(
            group_size=args.group,
            questions_per_step=args.questions,
            learning_rate=args.lr,
            lr_scheduler="constant",
            warmup_ratio=0.0,
            temperature=1.0,
            max_completion_tokens=48,
            steps=args.steps,
            logging_steps=1,
        ),
    )


def run_one(credit: str, policy: Path, files: dict[str, Path], work: Path, args: Any) -> Any:
    from conductor.train.trainer import train

    # A fresh call cache per estimator: hits are this run's own.
    cache = work / f"cache-{credit}"
    cache.mkdir(mode=0o700, parents=True)
    os.environ["CONDUCTOR_CACHE_DIR"] = str(cache)
    curve: list[dict[str, Any]] = []
    made: list[int] = []
    cached: list[int] = []

    def on_metrics(row: dict[str, Any]) -> None:
        curve.append(row)
        if row.get("credit_token_share") is not None:
            shares.append(float(row["credit_token_share"]))
        for totals, key in ((made, "calls_by_step"), (cached, "cached_by_step")):
            values = row.get(key) or []
            totals.extend([0] * (len(values) - len(totals)))
            for i, v in enumerate(values):
                totals[i] += v

    shares: list[float] = []
    wall, cpu = time.monotonic(), time.process_time()
    train(config_for(credit, policy, files, work / f"run-{credit}", args), on_metrics=on_metrics)
    rewards = [row.get("reward_mean") for row in curve]
    known = [0.0 if r is None else float(r) for r in rewards]
    # One step's mean is over group x questions rollouts only (16 by default): the mean
    # of the last WINDOW steps' means must reach the target, not one lucky step.
    reached = next(
        (
            i + 1
            for i in range(WINDOW - 1, len(known))
            if sum(known[i - WINDOW + 1 : i + 1]) / WINDOW >= TARGET
        ),
        None,
    )
    return {
        "credit": credit,
        "steps_to_target": reached,
        "rewards": [None if r is None else round(float(r), 3) for r in rewards],
        "credit_token_share": round(sum(shares) / len(shares), 3) if shares else None,
        "calls_by_step": made,
        "cached_by_step": cached,
        "wall_s": round(time.monotonic() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (80; smoke: 2)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--questions", type=int, default=2)
    # 3e-3 wrecked the warm policy within two steps (every reward 0 after); 5e-4 learnt
    # too slowly to reach the target in 30 steps.
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight", type=float, default=1.0, help="credit_weight")
    # One thread by default: the policy is too small to gain from more, and on a shared
    # machine more threads only contend (the smoke took 21 s on one, 207 s on two).
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--smoke", action="store_true", help="CI size: two steps each")
    parser.add_argument("--results", type=Path, default=None, help="write the table as JSON")
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 2 if args.smoke else 80

    import torch

    from conductor.testing import FakeLLMServer

    torch.set_num_threads(max(1, args.threads))
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    table: list[dict[str, Any]] = []
    started, cpu0 = time.monotonic(), time.process_time()
    with FakeLLMServer() as server, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = setup(work, server)
        for seed in (int(s) for s in args.seeds.split(",")):
            args.seed = seed
            policy = warm_policy(work / f"warm-{seed}", files, seed)
            for credit in estimators:
                row = {"seed": seed, **run_one(credit, policy, files, work / str(seed), args)}
                table.append(row)
                reached = row["steps_to_target"]
                shown = reached if reached else f"not reached in {args.steps}"
                print(
                    f"seed {seed} {credit:>14}: steps to {TARGET}: {shown}; "
                    f"calls by step {row['calls_by_step']} (cache hits {row['cached_by_step']}); "
                    f"tokens moved by credit {row['credit_token_share']}; "
                    f"wall {row['wall_s']} s, cpu {row['cpu_s']} s; rewards {row['rewards']}",
                    flush=True,
                )
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = {
        "threads": torch.get_num_threads(),
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "peak_rss_gb": round(peak_kb / 1e6, 2),
        "steps": args.steps,
        "target": TARGET,
    }
    print(json.dumps(summary))
    if args.results is not None:
        args.results.write_text(json.dumps({"summary": summary, "runs": table}, indent=2) + "\n")
    if args.smoke:
        counterfactual = [r for r in table if r["credit"] == "counterfactual"]
        if any(not sum(r["cached_by_step"]) for r in counterfactual):
            sys.exit("smoke: the counterfactual re-runs made no cache hits")
        stepwise = [r for r in table if r["credit"] != "outcome"]
        if any(not r["credit_token_share"] for r in stepwise):
            sys.exit("smoke: a per-step credit changed no token's advantage")


if __name__ == "__main__":
    main()
