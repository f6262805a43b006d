"""How close `conductor bench --estimate` and `--pilot N` come to what the run then
spends, printed as ratios against a 20% floor.

Run:  python benchmarks/perf/estimate_accuracy.py [--smoke]

On the fake providers (a Conductor that writes workflows of one, two and three steps in
turn; workers whose replies grow with what they are sent), for the shipped smoke
benchmark and the math fixture (tests/fixtures/bench/math500.jsonl, several epochs),
with the Conductor and a baseline (moa):

1. `--estimate` before anything has run: no model is called, the figures are assumed
   and take every reply as long as max_tokens allows, so the estimate is a ceiling.
   It passes when the run spends no more than it by the floor (ratio >= 0.8).
2. `--pilot N`: the first N pairs run, then the estimate of the rest, measured on the
   pilot's records, against what `--resume` then spends.  It passes within the floor
   either way (0.8 <= ratio <= 1.2).

Exit 1 when a case is outside its floor.  `--smoke` runs fewer pairs (seconds, for CI).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
MATH_FIXTURE = REPO / "tests" / "fixtures" / "bench" / "math500.jsonl"
#: How far an estimate may be from the spend it predicts.
FLOOR = 0.2
#: A dollar a thousand tokens, in and out (the fake server counts words as tokens).
PRICE = "{input_per_mtok: 1000, output_per_mtok: 1000}"
#: What the Conductor asks of each step of its workflows, in turn.
SUBTASKS = (
    "Work the problem out step by step.",
    "Check the work shown above and correct any mistake you find in it.",
    "Give the final answer in the form the task asks for, nothing else.",
)


def script(server: Any) -> None:
    """The Conductor writes workflows of 1, 2, 3 steps in turn (each step after the
    first sees the ones before it); a worker's reply grows with what it is sent."""
    turns = itertools.count()

    def plan(request: Any) -> str:
        steps = next(turns) % 3 + 1
        access: list[list[str]] = [[]] + [["all"]] * (steps - 1)
        return (
            "A plan of a few steps.\n"
            f"model_id = {json.dumps([i % 2 for i in range(steps)])}\n"
            f"subtasks = {json.dumps(list(SUBTASKS[:steps]))}\n"
            f"access_list = {json.dumps(access)}\n"
        )

    def answer(request: Any) -> str:
        sent = sum(len(str(m.get("content") or "").split()) for m in request.messages)
        return " ".join(["so"] * (8 + sent // 10)) + "\n\\boxed{1}\nANSWER: 1"

    server.script("conductor", plan)
    server.script("w0", answer)
    server.script("w1", answer)


def write_pool(path: Path, base: str) -> Path:
    workers = "".join(
        f"  - {{id: {w}, model: {w}, client: openai, api_base: {base}, price: {PRICE}}}\n"
        for w in ("w0", "w1")
    )
    path.write_text(
        "name: fake\n"
        "defaults: {temperature: 0.2, max_tokens: 400}\n"
        f"workers:\n{workers}"
        "conductor: {backend: endpoint, model: conductor, client: openai, "
        f"api_base: {base}, max_tokens: 200, price: {PRICE}}}\n"
    )
    return path


@dataclass(frozen=True)
class Case:
    name: str
    benchmark: str
    strategy: str
    data: Path | None
    limit: int | None
    epochs: int | None
    pilot: int


@dataclass(frozen=True)
class Outcome:
    case: Case
    ceiling: float
    spent: float
    pilot_estimate: float
    rest_spent: float


def run_case(case: Case, pool: Path, out: Path) -> Outcome:
    """Estimate, run the whole run, then the same with a pilot in a second directory."""
    from conductor.bench.estimate import estimate_run, without_pilot
    from conductor.bench.session import BenchArgs, BenchSession, plan_bench

    def args(run_dir: Path, **extra: Any) -> BenchArgs:
        return BenchArgs(
            benchmark=case.benchmark,
            pool=str(pool),
            strategy=case.strategy,
            data=case.data,
            limit=case.limit,
            epochs=case.epochs,
            out=run_dir,
            no_cache=True,  # each run pays for its calls, as a first run does
            **extra,
        )

    (whole,) = plan_bench(args(out / "whole", estimate=True))
    ceiling = estimate_run(whole).run_usd
    spent = BenchSession(whole).run().cost_usd
    (piloted,) = plan_bench(args(out / "piloted", pilot=case.pilot))
    BenchSession(piloted).run()
    rest = without_pilot(piloted)
    predicted = estimate_run(rest).run_usd
    rest_spent = BenchSession(rest).run().cost_usd
    assert ceiling is not None and predicted is not None  # every model is priced
    return Outcome(case, ceiling, spent, predicted, rest_spent)


def judged(label: str, ratio: float, ok: bool, floor: str) -> str:
    return f"{label:50s} ratio {ratio:6.3f}  ({floor})  {'PASS' if ok else 'FAIL'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="fewer pairs (seconds, for CI)")
    options = parser.parse_args()
    from conductor.testing import FakeLLMServer

    limit, epochs, pilot = (9, 2, 3) if options.smoke else (None, 4, 6)
    cases = [
        Case(f"smoke · {s}", "smoke", s, None, limit, None, pilot) for s in ("conductor", "moa")
    ] + [
        Case(f"math fixture · {s}", "math500", s, MATH_FIXTURE, None, epochs, pilot)
        for s in ("conductor", "moa")
    ]
    failed = False
    with tempfile.TemporaryDirectory() as tmp_s, FakeLLMServer() as server:
        tmp = Path(tmp_s)
        script(server)
        pool = write_pool(tmp / "pool.yaml", server.openai_base)
        for i, case in enumerate(cases):
            got = run_case(case, pool, tmp / f"case{i}")
            ceiling = got.ceiling / got.spent
            measured = got.pilot_estimate / got.rest_spent
            ok_ceiling = ceiling >= 1 - FLOOR
            ok_measured = abs(measured - 1) <= FLOOR
            failed = failed or not (ok_ceiling and ok_measured)
            print(
                f"{case.name}: --estimate ${got.ceiling:.2f}, the run spent ${got.spent:.2f}; "
                f"--pilot {case.pilot} then ${got.pilot_estimate:.2f} for the rest, "
                f"which spent ${got.rest_spent:.2f}"
            )
            print(judged(f"  {case.name}: --estimate / spent", ceiling, ok_ceiling, ">= 0.8"))
            print(
                judged(
                    f"  {case.name}: --pilot {case.pilot} / spent", measured, ok_measured, "0.8-1.2"
                )
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
