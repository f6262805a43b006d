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

Run (about 45 minutes on two quiet CPU cores at the default 40 steps; docs/training.md
gives the measured curve)::

    python benchmarks/train/routing_proof.py [--steps 40] [--out runs/routing-proof]

``--async-rollouts`` trains with ``grpo.async_rollouts`` (each batch one step stale,
its worker calls overlapping the next generation); docs/training.md gives both curves.

``--smoke`` (what CI runs, about 7 minutes): the format warm start and five GRPO steps
in a temporary directory; it exits non-zero unless the mean reward of the last two
steps is :data:`SMOKE_RISE` above the first step's, and writes no results file.

It prints the reward curve (step, mean reward, parse rate, share of parsed workflows
whose last step uses the reliable worker) and a before/after comparison on the held-out
items, and writes both to ``--results`` (by default ``routing_proof_results.json``
beside this script, not kept in the repository); ``--cost-sweep`` writes
``benchmarks/train/routing_cost_sweep_results.json`` (the stored one is the run
docs/training.md quotes: its penalty-0 run trains exactly as the plain proof).

``--cost-conditioned W1,W2,...`` trains ONE checkpoint on the priced pool with
``reward.cost_weights: [W1, W2, ...]`` (each question draws a weight, stated in its
prompt and charged per USD), then evaluates it on the held-out items at each of
``--eval-weights`` (default 0, 150, 400; the task's break-even is about
0.5 / (0.002746 - 0.000279) = 203 per USD), the weight stated in the prompt as
``--cost-weight`` states it, and writes
``benchmarks/train/routing_cost_conditioned_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
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


#: USD per million tokens (input and output alike) of each worker in the cost sweep: the
#: reliable worker ten times the guessers' price, about $0.001 a call against $0.0001
#: (the fake server counts a word as a token).
SWEEP_PRICES = {"guess-a": 3.0, "table": 30.0, "guess-b": 3.0}


def write_pool(server: Any, directory: Path, *, priced: bool = False) -> Path:
    import yaml

    def price(worker: str) -> dict[str, float]:
        per_mtok = SWEEP_PRICES[worker] if priced else 0.0  # scripted: free unless swept
        return {"input_per_mtok": per_mtok, "output_per_mtok": per_mtok}

    workers = [
        {
            "id": w,
            "model": w,
            "client": "openai",
            "api_base": server.openai_base,
            "max_retries": 1,
            "price": price(w),
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


def make_config(
    pool_file: Path,
    base_model: str,
    out: Path,
    args: argparse.Namespace,
    *,
    cost_penalty_per_usd: float = 0.0,
    cost_weights: tuple[float, ...] = (),
) -> Any:
    from conductor.train.settings import DataMix, GRPOSettings, RewardSettings, TrainConfig

    return TrainConfig(
        reward=RewardSettings(cost_penalty_per_usd=cost_penalty_per_usd, cost_weights=cost_weights),
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
            async_rollouts=bool(getattr(args, "async_rollouts", False)),
        ),
    )


def warm_start(config: Any, rows: list[dict[str, Any]], out: Path, seed: int) -> dict[str, Any]:
    """The library's format warm start (uniformly random workers); saves to out/warm."""
    from conductor.train.policy import load_policy
    from conductor.train.settings import WarmStartSettings
    from conductor.train.warmstart import format_warm_start

    model, tok = load_policy("gguf:smollm2")
    report = format_warm_start(
        model, tok, rows, WarmStartSettings(passes=3), max_steps=config.max_steps, seed=seed
    )
    directory = out / "warm"
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    peak = {"peak_rss_gb": MEMORY.take()} if MEMORY is not None else {}
    return {**report.to_dict(), **peak}


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
        "cost_usd_per_question": round(sum(r.cost_usd for r in results) / len(results), 6),
        "example": texts[0],
    }


class PeakMemory:
    """The process's largest resident set since the last :meth:`take` (sampled every
    0.1 s from /proc; where there is no /proc, the lifetime peak from getrusage)."""

    def __init__(self) -> None:
        import threading

        self._peak = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True, name="peak-memory").start()

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def _watch(self) -> None:
        while True:
            rss = self._rss()
            with self._lock:
                self._peak = max(self._peak, rss)
            time.sleep(0.1)

    def take(self) -> float:
        """The peak in GB since the last call; starts the next interval."""
        with self._lock:
            peak, self._peak = max(self._peak, self._rss()), 0
        return round(peak / 1e9, 2)


MEMORY: PeakMemory | None = None


def curve_point(row: dict[str, Any]) -> dict[str, Any]:
    """One training step's line of the reward curve, from ``train``'s metrics line."""
    last = row.get("last_worker_usage") or {}
    return {
        "peak_rss_gb": MEMORY.take() if MEMORY is not None else None,
        "step": row["step"],
        "reward_mean": row["reward_mean"],
        "parse_rate": row["parse_rate"],
        "correct_rate": row.get("correct_rate"),
        "reliable_last_share": round(last.get(RELIABLE, 0) / max(1, sum(last.values())), 4),
        "cost_usd": row.get("cost_usd"),
        "loss": row["loss"],
        "elapsed_s": row["elapsed_s"],
    }


def show(point: dict[str, Any]) -> None:
    print(
        f"step {point['step']:3d}  reward {point['reward_mean']:.3f}  "
        f"parsed {point['parse_rate']:.2f}  last step by Model 1 "
        f"{point['reliable_last_share']:.2f}  {point['elapsed_s']:.0f}s  "
        f"peak {point['peak_rss_gb']} GB",
        flush=True,
    )


def mean_of(points: list[dict[str, Any]], key: str) -> float:
    return round(sum(float(p[key] or 0.0) for p in points) / max(1, len(points)), 4)


class Setup:
    """The workers, the pool file, the training and held-out rows of one run."""

    def __init__(
        self,
        args: argparse.Namespace,
        out: Path,
        *,
        priced: bool = False,
        cost_weights: tuple[float, ...] = (),
    ) -> None:
        from dataclasses import replace

        from conductor.train.dataset import build_rows
        from conductor.train.pools import load_train_pool, training_conductor
        from conductor.train.settings import DataMix

        self.server = start_workers()
        out.mkdir(parents=True, exist_ok=True)
        self.pool_file = write_pool(self.server, out, priced=priced)
        self.config = make_config(
            self.pool_file, "gguf:smollm2", out, args, cost_weights=cost_weights
        )
        pool = load_train_pool(self.config)
        conductor = training_conductor(self.config, pool)
        self.train_rows = build_rows(self.config, pool, conductor, rng_seed=args.seed)
        held = replace(self.config, data=(DataMix(benchmark=str(BENCHMARK), split="test"),))
        self.held_rows = build_rows(held, pool, conductor, rng_seed=args.seed)
        self._held, self._pool, self._conductor, self._seed = held, pool, conductor, args.seed

    def held_rows_at(self, weight: float) -> list[dict[str, Any]]:
        """The held-out rows with every prompt stating ``weight`` (and every reward
        charging it): one weight drawn from a list of one is the weight the library's
        rows, and ``--cost-weight``, state."""
        from dataclasses import replace

        from conductor.train.dataset import build_rows

        reward = replace(self._held.reward, cost_weights=(weight,))
        held = replace(self._held, reward=reward)
        return build_rows(held, self._pool, self._conductor, rng_seed=self._seed)

    def close(self) -> None:
        self.server.stop()


def grpo(
    setup: Setup,
    base_model: str,
    out: Path,
    args: argparse.Namespace,
    *,
    cost_penalty_per_usd: float = 0.0,
    cost_weights: tuple[float, ...] = (),
    on_point: Any = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """GRPO from ``base_model`` (``conductor.train.trainer.train``); the checkpoint and
    the reward curve."""
    from conductor.train.trainer import train

    curve: list[dict[str, Any]] = []

    def on_metrics(row: dict[str, Any]) -> None:
        point = curve_point(row)
        curve.append(point)
        show(point)
        if on_point is not None:
            on_point(curve)

    config = make_config(
        setup.pool_file,
        base_model,
        out,
        args,
        cost_penalty_per_usd=cost_penalty_per_usd,
        cost_weights=cost_weights,
    )
    checkpoint = train(config, on_metrics=on_metrics)
    return checkpoint, curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (40; smoke: 5)")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/routing-proof"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CI size: the warm start and a few GRPO steps; fails unless the reward rises",
    )
    parser.add_argument(
        "--cost-sweep",
        metavar="P1,P2,...",
        default=None,
        help="priced workers; one GRPO run per cost_penalty_per_usd value, from one warm start",
    )
    parser.add_argument(
        "--cost-conditioned",
        metavar="W1,W2,...",
        default=None,
        help="priced workers; ONE GRPO run with reward.cost_weights, evaluated at --eval-weights",
    )
    parser.add_argument(
        "--eval-weights",
        metavar="W1,W2,...",
        default="0,150,400",
        help="--cost-conditioned: the cost weights the checkpoint is evaluated at",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (all CPUs)")
    parser.add_argument(
        "--async-rollouts",
        action="store_true",
        help="grpo.async_rollouts: worker calls overlap the next generation (one step stale)",
    )
    parser.add_argument(
        "--warm", type=Path, default=None, help="cost sweep: reuse this warm-start directory"
    )
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 5 if args.smoke else 40

    import torch

    torch.set_num_threads(args.threads or max(1, os.cpu_count() or 1))
    global MEMORY
    MEMORY = PeakMemory()
    if args.smoke:
        smoke(args)
    elif args.cost_sweep is not None:
        cost_sweep(args, [float(v) for v in args.cost_sweep.split(",") if v.strip()])
    elif args.cost_conditioned is not None:
        cost_conditioned(
            args,
            tuple(float(v) for v in args.cost_conditioned.split(",") if v.strip()),
            [float(v) for v in args.eval_weights.split(",") if v.strip()],
        )
    else:
        proof(args)


def proof(args: argparse.Namespace) -> None:
    results = args.results or RESULTS
    out = args.out
    setup = Setup(args, out)
    t0 = time.monotonic()
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}

    def keep(curve: list[dict[str, Any]]) -> None:
        report["curve"] = curve
        results.write_text(json.dumps(report, indent=2) + "\n")

    try:
        config = setup.config
        print("evaluating the base model (no warm start) ...", flush=True)
        report["base"] = evaluate("gguf:smollm2", config, setup.held_rows, 4, args.seed)
        print(json.dumps(report["base"]), flush=True)
        print("format warm start (uniformly random workers) ...", flush=True)
        report["warm_start"] = warm_start(config, setup.train_rows, out, args.seed)
        print(json.dumps(report["warm_start"]), flush=True)
        warm = str(out / "warm")
        report["before"] = evaluate(warm, config, setup.held_rows, args.eval_samples, args.seed)
        print("before GRPO:", json.dumps(report["before"]), flush=True)
        checkpoint, curve = grpo(setup, warm, out, args, on_point=keep)
        report["checkpoint"] = str(checkpoint)
        report["after"] = evaluate(
            str(checkpoint), config, setup.held_rows, args.eval_samples, args.seed
        )
        print("after GRPO:", json.dumps(report["after"]), flush=True)
        k = min(3, len(curve))
        report["summary"] = {
            "reward_first_steps": mean_of(curve[:k], "reward_mean"),
            "reward_last_steps": mean_of(curve[-k:], "reward_mean"),
            "reliable_share_first_steps": mean_of(curve[:k], "reliable_last_share"),
            "reliable_share_last_steps": mean_of(curve[-k:], "reliable_last_share"),
            "steps_averaged": k,
            "total_seconds": round(time.monotonic() - t0),
        }
        print("summary:", json.dumps(report["summary"]), flush=True)
    finally:
        setup.close()
        results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {results}", file=sys.stderr)


#: What the smoke run asks of its reward curve: the mean reward of its last two steps
#: above its first step's by at least this much.  The proof's stored run rose from
#: 0.70 to 0.89 in two steps; the noise of one step's mean (32 rollouts) is ~0.04.
SMOKE_RISE = 0.05


def smoke(args: argparse.Namespace) -> None:
    """CI's run: the warm start and ``--steps`` GRPO steps in a temporary directory;
    exits non-zero unless the reward rises (nothing is written to the stored results)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="routing-proof-smoke-") as tmp:
        out = Path(tmp)
        setup = Setup(args, out)
        try:
            warm = warm_start(setup.config, setup.train_rows, out, args.seed)
            print(f"warm start: {json.dumps(warm)}", flush=True)
            _checkpoint, curve = grpo(setup, str(out / "warm"), out, args)
        finally:
            setup.close()
    first = curve[0]["reward_mean"]
    last = mean_of(curve[-2:], "reward_mean")
    verdict = "rises" if last >= first + SMOKE_RISE else "does NOT rise"
    print(
        f"smoke: reward {first:.3f} at step 1, {last:.3f} over the last two steps: "
        f"{verdict} (asked: +{SMOKE_RISE})"
    )
    if last < first + SMOKE_RISE:
        sys.exit(1)


SWEEP_RESULTS = HERE / "routing_cost_sweep_results.json"


def cost_sweep(args: argparse.Namespace, penalties: list[float]) -> None:
    """One warm start, then one GRPO run per penalty on the priced pool; each checkpoint
    evaluated on the held-out items (accuracy, spend per question, routing)."""
    results = args.results or SWEEP_RESULTS
    out = args.out
    setup = Setup(args, out, priced=True)
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "prices_per_mtok": SWEEP_PRICES,
        "runs": [],
    }
    try:
        if args.warm is not None:  # an earlier sweep's warm start: the same seed, the same model
            warm = str(args.warm)
            report["warm_start"] = {"reused": warm}
        else:
            report["warm_start"] = warm_start(setup.config, setup.train_rows, out, args.seed)
            warm = str(out / "warm")
        report["before"] = evaluate(
            warm, setup.config, setup.held_rows, args.eval_samples, args.seed
        )
        print("before GRPO:", json.dumps(report["before"]), flush=True)
        for penalty in penalties:
            print(f"cost_penalty_per_usd = {penalty:g}", flush=True)
            run_out = out / f"penalty-{penalty:g}"
            checkpoint, curve = grpo(setup, warm, run_out, args, cost_penalty_per_usd=penalty)
            after = evaluate(
                str(checkpoint), setup.config, setup.held_rows, args.eval_samples, args.seed
            )
            print("after GRPO:", json.dumps(after), flush=True)
            report["runs"].append({"cost_penalty_per_usd": penalty, "curve": curve, "after": after})
            results.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        setup.close()
        results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {results}", file=sys.stderr)


CONDITIONED_RESULTS = HERE / "routing_cost_conditioned_results.json"


def cost_conditioned(
    args: argparse.Namespace, weights: tuple[float, ...], eval_weights: list[float]
) -> None:
    """One warm start and ONE GRPO run on the priced pool, each question drawing its
    cost weight from ``weights``; the checkpoint evaluated at each of ``eval_weights``
    (accuracy, spend per question, routing) without retraining."""
    import resource

    results = args.results or CONDITIONED_RESULTS
    out = args.out
    t0, cpu0 = time.monotonic(), time.process_time()
    setup = Setup(args, out, priced=True, cost_weights=weights)
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "prices_per_mtok": SWEEP_PRICES,
        "cost_weights": list(weights),
        "train_weights_drawn": {
            f"{w:g}": sum(1 for r in setup.train_rows if r["cost_weight"] == w) for w in weights
        },
        "points": [],
    }
    try:
        if args.warm is not None:
            warm = str(args.warm)
            report["warm_start"] = {"reused": warm}
        else:
            report["warm_start"] = warm_start(setup.config, setup.train_rows, out, args.seed)
            warm = str(out / "warm")
        print("warm start:", json.dumps(report["warm_start"]), flush=True)

        def keep(curve: list[dict[str, Any]]) -> None:
            report["curve"] = curve
            results.write_text(json.dumps(report, indent=2) + "\n")

        checkpoint, curve = grpo(
            setup, warm, out / "conditioned", args, cost_weights=weights, on_point=keep
        )
        report["checkpoint"] = str(checkpoint)
        report["curve"] = curve
        # The warm start once, at the first weight: it was taught the format with
        # uniformly random workers, whatever weight its prompts stated.
        first = setup.held_rows_at(eval_weights[0])
        report["before"] = evaluate(warm, setup.config, first, args.eval_samples, args.seed)
        print(f"warm start at {eval_weights[0]:g}:", json.dumps(report["before"]), flush=True)
        for weight in eval_weights:
            rows = setup.held_rows_at(weight)
            after = evaluate(str(checkpoint), setup.config, rows, args.eval_samples, args.seed)
            print(
                f"cost weight {weight:g}: correct {after['correct_rate']:.3f}, "
                f"USD/question {after['cost_usd_per_question']:.6f}, "
                f"last step by Model 1 {after['reliable_last_share']:.2f}, "
                f"mean reward {after['mean_reward']:.3f}",
                flush=True,
            )
            report["points"].append({"cost_weight": weight, "after": after})
            results.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        setup.close()
        report["wall_s"] = round(time.monotonic() - t0)
        report["cpu_s"] = round(time.process_time() - cpu0)
        report["peak_rss_gb_lifetime"] = round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2
        )
        results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
