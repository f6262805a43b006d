"""Speed and size of `conductor view` on a large run, printed as numbers.

Run:  python benchmarks/perf/view.py [--samples N] [--keep DIR] [--smoke]

``--smoke`` (CI): 50 samples (seconds; Chromium's part runs only where it is installed).

1. A synthetic bench directory of N samples (default 10,000; records written through
   `conductor.record`, with one- to four-step workflows of three shapes, a system prompt
   shared by every step and a question, subtasks and responses of their own); with
   `--singles`, a `singles` run of one worker on the same questions as well.
2. `write_view` on both: seconds to load and write (target: < 10 s) and the file's size
   (target: < 50 MB).
3. Headless Chromium opens the file from disk: time to interactive, read from the
   `data-ready` attribute the page sets (milliseconds since navigation started) once the
   sample list is drawn and answers input (target: < 2 s); then a deep link that
   filters and searches the list, and one that opens a sample (reading the details).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from conductor.record import (  # noqa: E402
    CallRecord,
    RoundRecord,
    RunRecord,
    StepRecord,
    Totals,
    record_to_dict,
)
from conductor.runs.rundir import CONFIG, SAMPLES, record_line  # noqa: E402
from conductor.workflow import Step, Workflow, workflow_to_dict  # noqa: E402

WORKERS = ["gpt-4o-mini", "claude-3-5-haiku", "gemini-2.0-flash", "qwen-2.5-72b"]
SYSTEM = "You are one worker of a team. " * 40  # long, and the same in every step
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "tokyo",
    "prime",
]


def _plan(rng: random.Random) -> list[tuple[int, list[int]]]:
    """(worker, steps it sees) per step: a single call, a chain, or attempts + a judge."""
    shape = rng.randrange(3)
    if shape == 0:
        return [(rng.randrange(4), [])]
    n = rng.randint(2, 4)
    if shape == 1:
        return [(rng.randrange(4), [i - 1] if i else []) for i in range(n)]
    return [(rng.randrange(4), []) for _ in range(n - 1)] + [(rng.randrange(4), list(range(n - 1)))]


def _record(
    i: int, rng: random.Random, plan: list[tuple[int, list[int]]], right: bool
) -> RunRecord:
    question = f"Problem {i}: " + " ".join(rng.choice(WORDS) for _ in range(60))
    steps = []
    for k, (w, sees) in enumerate(plan):
        subtask = f"Step {k}: " + " ".join(rng.choice(WORDS) for _ in range(12))
        call = CallRecord(
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{question}\n\n{subtask}"},
            ],
            response="Reasoning: " + " ".join(rng.choice(WORDS) for _ in range(80)),
            input_tokens=400,
            output_tokens=120,
            cost_usd=0.0004,
        )
        steps.append(
            StepRecord(
                index=k,
                worker_index=w,
                worker_id=WORKERS[w],
                model=WORKERS[w],
                subtask=subtask,
                access=sees,
                visible_steps=sees,
                call=call,
                answer=call.response,
            )
        )
    workflow = workflow_to_dict(
        Workflow(
            tuple(Step(w, s.subtask, tuple(sees)) for (w, sees), s in zip(plan, steps, strict=True))
        )
    )
    reply = json.dumps(workflow)
    rnd = RoundRecord(
        index=1,
        conductor_calls=[
            CallRecord(messages=[{"role": "user", "content": question}], response=reply)
        ],
        workflow=workflow,
        steps=steps,
        final_answer=str(i),
    )
    status = "correct" if right else "incorrect"
    return RunRecord(
        question=question,
        pool={"name": "perf", "workers": [{"id": w} for w in WORKERS]},
        conductor={"backend": "endpoint", "target": {"id": "conductor", "model": "conductor-7b"}},
        settings={},
        sample_id=f"perf/{i}",
        rounds=[rnd],
        final_answer=str(i),
        totals=Totals(
            calls=len(steps) + 1,
            input_tokens=400 * len(steps),
            output_tokens=120 * len(steps),
            cost_usd=0.0004 * len(steps) + 0.0001,
            wall_s=rng.uniform(0.5, 8.0),
        ),
        gold=str(i),
        grade={
            "status": status,
            "score": float(right),
            "reason": status,
            "extracted": str(i),
            "detail": {},
        },
    )


def write_run(run_dir: Path, n: int, *, single: int | None = None, seed: int = 0) -> Path:
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    config = {
        "benchmark": {"name": "perf"},
        "strategy": f"single:{WORKERS[single]}" if single is not None else "conductor",
        "pool": {"name": "perf", "workers": [{"id": w} for w in WORKERS]},
        "epochs": 1,
    }
    (run_dir / CONFIG).write_text(json.dumps(config))
    with (run_dir / SAMPLES).open("w", encoding="utf-8") as fh:
        for i in range(n):
            plan = [(single, [])] if single is not None else _plan(rng)
            right = rng.random() < (0.55 if single is not None else 0.7)
            fh.write(record_line(record_to_dict(_record(i, rng, plan, right))))
    return run_dir


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def open_in_chromium(
    browser: str, page: Path, fragment: str = "", *extra: str
) -> tuple[float, str]:
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    start = time.perf_counter()
    res = subprocess.run(
        [browser, *flags, *extra, "--dump-dom", url], capture_output=True, text=True, timeout=300
    )
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"chromium failed: {res.stderr[-1000:]}")
    return wall, res.stdout


def _attr(dom: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', dom)
    return found.group(1) if found else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="write the runs and the page here")
    parser.add_argument(
        "--singles", action="store_true", help="add a singles run on the same questions"
    )
    parser.add_argument("--smoke", action="store_true", help="50 samples (seconds, for CI)")
    args = parser.parse_args()
    if args.smoke:
        args.samples = 50

    from conductor.runs.summary import write_summary
    from conductor.view.data import load_runs
    from conductor.view.page import write_view

    work = args.keep or Path(tempfile.mkdtemp(prefix="view-perf-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = write_run(work / "conductor-run", args.samples)
    paths = [run]
    if args.singles:
        write_run(work / "singles" / f"single-{WORKERS[2]}", args.samples, single=2, seed=1)
        paths.append(work / "singles")
    print(
        f"wrote {len(paths)} run(s) of {args.samples} samples in {time.perf_counter() - t0:.1f} s"
    )
    print(f"  {SAMPLES}: {(run / SAMPLES).stat().st_size / 1e6:.1f} MB per run")

    page = work / "view.html"
    t0 = time.perf_counter()
    runs = load_runs(paths)
    loaded = time.perf_counter() - t0
    write_view(runs, page)
    total = time.perf_counter() - t0
    rows = sum(len(r.samples) for r in runs)
    print(
        f"write_view: {rows} rows; loaded in {loaded:.2f} s, written in {total:.2f} s "
        f"(target < 10 s)"
    )
    print(f"file size: {page.stat().st_size / 1e6:.1f} MB (target < 50 MB)")

    # A finished bench run leaves its summary.json, which view reads instead of
    # summarising the samples again.
    write_summary(run)
    t0 = time.perf_counter()
    write_view(load_runs(paths), page)
    print(f"write_view with summary.json present: {time.perf_counter() - t0:.2f} s")

    browser = chromium()
    if browser is None:
        print("chromium not found: time to interactive not measured")
        return
    wall, dom = open_in_chromium(browser, page)
    print(
        f"time to interactive: {_attr(dom, 'data-ready')} ms after navigation "
        f"(target < 2000 ms); charts drawn at {_attr(dom, 'data-drawn')} ms; "
        f"browser run {wall:.1f} s; rows in the DOM: {dom.count('sample-row')}"
    )
    wall, dom = open_in_chromium(browser, page, "verdict=wrong&q=tokyo+alpha&steps=3")
    print(
        f"filtered deep link: ready at {_attr(dom, 'data-ready')} ms, "
        f"{_attr(dom, 'data-count')} matches"
    )
    wall, dom = open_in_chromium(
        browser, page, f"sample={args.samples - 1}", "--virtual-time-budget=30000"
    )
    print(
        f"a sample opened on load (details unpacked): shown at {_attr(dom, 'data-shown')} ms "
        f"(virtual time), graph nodes {len(re.findall(r'<g class=.step', dom))}"
    )
    if args.keep is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
