"""A batched bench on the fake providers: rounds, a kill and its resume, and the price.

Run:  python benchmarks/perf/batch_waves.py [--questions 1000] [--smoke]

A benchmark of N questions whose Conductor (OpenAI's protocol) writes a 3-step chain:
OpenAI's worker, then Anthropic's, then Gemini's, each seeing the steps before.  The
run goes through ``conductor bench --batch`` in a child process against the fake
server's three batch APIs (each batch answered 0.5 s after it is made); the child is
killed with SIGKILL once a batch of wave 2 is sent, and the run is resumed.  Judged
lines (exit 1 when one fails):

1. at most 4 batch submissions per provider for the round (the Conductor's plans, then
   one wave per step), however many questions;
2. the resume sends no line that was answered before the kill (each call is paid for
   once) and loses none (N records, every step answered);
3. ``report`` shows the run's spend at 50% of what live calls would have cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

#: What the report must show the spend to be, as a share of the live cost.
BATCH_SHARE = 0.5
#: The most batch submissions one provider may take for the round.
MAX_PER_PROVIDER = 4
PRICE = "{input_per_mtok: 2.0, output_per_mtok: 8.0}"
PLAN = (
    "Three steps.\n"
    "model_id = [0, 1, 2]\n"
    'subtasks = ["Solve the problem.", "Check the answer above.", "Give the final answer."]\n'
    'access_list = [[], ["all"], ["all"]]\n'
)


def make_data(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            row = {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"s/{i}"}
            fh.write(json.dumps(row) + "\n")


def write_pool(path: Path, server: Any) -> None:
    def worker(wid: str, client: str, base: str) -> str:
        return (
            f"  - {{id: {wid}, model: {wid}, client: {client}, api_base: '{base}', "
            f"price: {PRICE}}}\n"
        )

    path.write_text(
        "name: batch-waves\n"
        "defaults: {max_tokens: 256}\n"
        "workers:\n"
        + worker("w-openai", "openai", server.openai_base)
        + worker("w-anthropic", "anthropic", server.anthropic_base)
        + worker("w-gemini", "google", server.gemini_base)
        + f"conductor: {{backend: endpoint, model: conductor, client: openai, "
        f"api_base: '{server.openai_base}', price: {PRICE}}}\n"
    )


def answer(request: Any) -> str:
    import re

    m = re.search(r"What is (\d+) \+ 0\?", request.messages[-1]["content"])
    return f"The answer is \\boxed{{{m.group(1) if m else -1}}}."


def journal(run: Path) -> list[dict[str, Any]]:
    path = run / "batches.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        # A torn last line of the killed process is left out.
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def wave_sent(run: Path, wave: int) -> bool:
    """Whether a batch of ``wave`` was sent (its id written down)."""
    events = journal(run)
    labels = {e["label"] for e in events if e["event"] == "intent" and e["wave"] == wave}
    return any(e["event"] == "submitted" and e["label"] in labels for e in events)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="50 questions (for CI)")
    args = parser.parse_args()
    n = 50 if args.smoke else args.questions

    from conductor.testing import BatchPlan, FakeLLMServer

    failures = 0
    with tempfile.TemporaryDirectory() as tmp_s, FakeLLMServer() as server:
        tmp = Path(tmp_s)
        server.script("conductor", PLAN)
        for wid in ("w-openai", "w-anthropic", "w-gemini"):
            server.script(wid, answer)
        server.batch_script(BatchPlan(run_s=0.5))
        make_data(tmp / "data.jsonl", n)
        write_pool(tmp / "pool.yaml", server)
        run = tmp / "run"
        env = {
            **os.environ,
            "CONDUCTOR_CACHE_DIR": str(tmp / "cache"),
            "CONDUCTOR_BATCH_POLL_S": "0.05",
        }
        command = [sys.executable, "-m", "conductor", "bench"]
        first = [
            *command, "math500", "--pool", str(tmp / "pool.yaml"),
            "--data", str(tmp / "data.jsonl"), "--out", str(run), "--batch",
        ]  # fmt: skip
        t0 = time.perf_counter()
        child = subprocess.Popen(first, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 600
        while not wave_sent(run, 2) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if child.poll() is not None:
            err = child.stderr.read().decode() if child.stderr else ""
            print(f"the first run ended before wave 2 was sent (exit {child.returncode}): {err}")
            return 1
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        if child.stderr:
            child.stderr.close()
        killed_at = time.perf_counter() - t0
        answered_before = {
            line.custom_id
            for batch in server.batches
            for line in batch.lines
            if line.outcome is not None
        }
        sent_before = len(server.batches)
        resumed = subprocess.run(
            [*command, "--resume", str(run)], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if resumed.returncode != 0:
            print(f"the resume failed (exit {resumed.returncode}): {resumed.stderr[-2000:]}")
            return 1

        # 1. Submissions per provider (the round: Conductor's wave and one per step).
        per_provider = Counter(batch.protocol for batch in server.batches)
        print(
            f"{n} questions, 3 steps: {len(server.batches)} batches "
            f"({sent_before} before the kill at {killed_at:.1f} s), total {wall:.1f} s"
        )
        for protocol in ("openai", "anthropic", "gemini"):
            count = per_provider.get(protocol, 0)
            ok = count <= MAX_PER_PROVIDER
            failures += not ok
            print(
                f"[1] {protocol:9s}: {count} submissions for the round "
                f"(at most {MAX_PER_PROVIDER})  {'PASS' if ok else 'FAIL'}"
            )

        # 2. Nothing answered before the kill is sent again; nothing is lost.
        sent = Counter(line.custom_id for batch in server.batches for line in batch.lines)
        again = [key for key in answered_before if sent[key] > 1]
        paid = Counter(
            line.custom_id
            for batch in server.batches
            for line in batch.lines
            if line.outcome is not None
        )
        twice = [key for key, count in paid.items() if count > 1]
        records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        pairs = {(r["sample_id"], r["epoch"]) for r in records}
        complete = [
            r
            for r in records
            if r["status"] == "ok" and all(len(rnd["steps"]) == 3 for rnd in r["rounds"])
        ]
        ok = not again and not twice and len(pairs) == len(records) == len(complete) == n
        failures += not ok
        print(
            f"[2] resume: {len(again)} answered lines sent again, {len(twice)} calls paid "
            f"twice, {len(records)} records of {n}, {len(complete)} with every step answered"
            f"  {'PASS' if ok else 'FAIL'}"
        )

        # 3. The report's spend against what live calls would have cost.
        summary = json.loads((run / "summary.json").read_text())
        spend, live = summary.get("cost_usd"), summary.get("live_cost_usd")
        report = subprocess.run(
            [sys.executable, "-m", "conductor", "report", str(run)],
            env={**env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
        )
        share = spend / live if spend is not None and live else None
        shown = f"{100 * BATCH_SHARE:.1f}% of" in report.stdout
        ok = share is not None and abs(share - BATCH_SHARE) < 1e-6 and shown
        failures += not ok
        print(
            f"[3] spend ${spend} of ${live} live: {share if share is None else f'{share:.4f}'} "
            f"(report shows it: {shown})  {'PASS' if ok else 'FAIL'}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
