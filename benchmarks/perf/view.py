"""Speed and size of `conductor view`, `trace` and `report` on a large run, against targets.

Run:  python benchmarks/perf/view.py [--samples N] [--keep DIR] [--json PATH] [--smoke]

``--smoke`` (CI): 50 samples (seconds; Chromium's part runs only where it is installed).

1. A synthetic bench directory of N samples (default 100,000; records written through
   `conductor.record`, with one- to four-step workflows of three shapes, a system prompt
   shared by every step and a question, subtasks and responses of their own); with
   `--singles`, a `singles` run of one worker on the same questions as well.
2. `conductor view` in a child process, first without the run's summary.json (it is
   summarised from the records), then with it (as a finished run leaves it): wall and CPU
   seconds and peak RSS (target: < 30 s, < 500 MB), the page's size (target: < 50 MB)
   and its companion directory's.
3. Headless Chromium opens the page from disk: time to interactive, read from the
   `data-ready` attribute the page sets (milliseconds since navigation started) once the
   sample list is drawn and answers input (target: < 2 s); then a deep link that filters
   and searches the list (the search text read from the companion), and one that opens
   the last sample (its details read from the companion).
4. `conductor trace DIR` (the list of every sample), `conductor trace DIR --sample ID`
   and `conductor report DIR` (without summary.json and with it), each in a child
   process (target: < 10 s wall), with its CPU seconds (on a machine shared with other
   work, the figure that says what the command itself took).

Every figure is printed against its target (PASS/FAIL and the ratio), with the floor
measured in the same run: one child that only parses every line of samples.jsonl as JSON
(what any reader of the run must do once).  ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
from conductor.runs.rundir import CONFIG, SAMPLES, SUMMARY, record_line, run_dirs  # noqa: E402
from conductor.view.companion import companion_dir  # noqa: E402
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
        # What the bench runner keeps beside every record (its SampleLoop.describe).
        benchmark="perf",
        strategy="conductor",
        sample_question=question,
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
        found = shutil.which(name)
        if found:
            return found
    return None


def open_in_chromium(browser: str, page: Path, fragment: str = "", *extra: str) -> str:
    """The DOM of ``page`` (with ``#fragment``) once its script has run, in a fresh
    headless Chromium."""
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    with tempfile.TemporaryDirectory(prefix="view-perf-chromium-") as profile:
        flags = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
        ]
        res = subprocess.run(
            [browser, *flags, *extra, "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=300,
        )
    if res.returncode != 0:
        raise SystemExit(f"chromium failed: {res.stderr[-1000:]}")
    return res.stdout


def _attr(dom: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', dom)
    return found.group(1) if found else "?"


@dataclass
class Child:
    """What a child process took: wall and CPU seconds, peak RSS in MB."""

    wall_s: float
    cpu_s: float
    rss_mb: float


def run_child(argv: list[str]) -> Child:
    """Run ``argv`` (output discarded) and measure it with ``wait4``'s resource usage,
    the child's alone."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err[-2000:]!r}")
    return Child(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def conductor(*args: str) -> list[str]:
    return [sys.executable, "-m", "conductor", *args]


_PARSE = (
    "import json, sys\n"
    "with open(sys.argv[1], 'rb') as fh:\n"
    "    for line in fh:\n"
    "        json.loads(line)\n"
)


def _size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


class Figures:
    """The figures of one run, each printed with its target as it is measured."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, float | str | None]] = {}
        self.failed: list[str] = []

    def add(self, name: str, value: float, unit: str, target: float | None = None) -> None:
        verdict = ""
        if target is not None:
            ok = value < target
            verdict = (
                f"  target < {target:g} {unit}: {'PASS' if ok else 'FAIL'} ({value / target:.2f}x)"
            )
            if not ok:
                self.failed.append(name)
        print(f"  {name:<32} {value:>10.2f} {unit}{verdict}")
        self.data[name] = {"value": value, "unit": unit, "target": target}

    def note(self, name: str, text: str) -> None:
        print(f"  {name:<32} {text}")
        self.data[name] = {"value": text, "unit": "", "target": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="write the runs and the page here")
    parser.add_argument(
        "--singles", action="store_true", help="add a singles run on the same questions"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="50 samples (seconds, for CI)")
    args = parser.parse_args()
    if args.smoke:
        args.samples = 50
    n = args.samples

    work = args.keep or Path(tempfile.mkdtemp(prefix="view-perf-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = work / "conductor-run"
    if not (run / SAMPLES).is_file():
        shutil.rmtree(run, ignore_errors=True)
        write_run(run, n)
    (run / SUMMARY).unlink(missing_ok=True)
    paths = [run]
    if args.singles:
        singles = work / "singles"
        if not singles.is_dir():
            write_run(singles / f"single-{WORKERS[2]}", n, single=2, seed=1)
        (singles / f"single-{WORKERS[2]}" / SUMMARY).unlink(missing_ok=True)
        paths.append(singles)
    print(f"{len(paths)} run(s) of {n} samples ready in {time.perf_counter() - t0:.1f} s")
    print(f"  {SAMPLES}: {(run / SAMPLES).stat().st_size / 1e6:.1f} MB per run")

    figures = Figures()
    floor = run_child([sys.executable, "-c", _PARSE, str(run / SAMPLES)])
    figures.add("floor: parse samples.jsonl once", floor.wall_s, "s")

    page = work / "view.html"
    runs = [str(p) for p in paths]
    for when in ("no summary.json", "summary.json"):
        if when == "summary.json":
            from conductor.runs.summary import write_summary

            for p in paths:
                for d in run_dirs(p):
                    write_summary(d)
        took = run_child(conductor("view", *runs, "--out", str(page)))
        figures.add(f"view ({when}): wall", took.wall_s, "s", 30.0)
        figures.add(f"view ({when}): CPU", took.cpu_s, "s")
        figures.add(f"view ({when}): peak RSS", took.rss_mb, "MB", 500.0)
        figures.add(f"view ({when}): x floor", took.wall_s / floor.wall_s, "x")
    figures.add("page size", _size_mb(page), "MB", 50.0)
    figures.add("companion size", _size_mb(companion_dir(page)), "MB")

    browser = chromium()
    if browser is None:
        figures.note("chromium", "not found: time to interactive not measured")
    else:
        dom = open_in_chromium(browser, page)
        figures.add("time to interactive", float(_attr(dom, "data-ready")), "ms", 2000.0)
        figures.note(
            "  charts drawn, rows in the DOM",
            f"{_attr(dom, 'data-drawn')} ms, {dom.count('sample-row')} rows",
        )
        dom = open_in_chromium(
            browser, page, "verdict=wrong&q=tokyo+alpha&steps=3", "--virtual-time-budget=60000"
        )
        figures.add("search deep link ready (virtual)", float(_attr(dom, "data-ready")), "ms")
        figures.note("  its matches", _attr(dom, "data-count"))
        dom = open_in_chromium(browser, page, f"sample={n - 1}", "--virtual-time-budget=30000")
        figures.add("last sample shown (virtual)", float(_attr(dom, "data-shown")), "ms")
        figures.note("  its graph's nodes", str(len(re.findall(r"<g class=.step", dom))))

    for when in ("no summary.json", "summary.json"):
        if when == "no summary.json":
            (run / SUMMARY).unlink(missing_ok=True)
        else:
            from conductor.runs.summary import write_summary

            write_summary(run)
        took = run_child(conductor("report", str(run)))
        figures.add(f"report ({when})", took.wall_s, "s", 10.0)
        figures.add(f"report ({when}): CPU", took.cpu_s, "s")
    took = run_child(conductor("trace", str(run)))
    figures.add("trace (the list)", took.wall_s, "s", 10.0)
    figures.add("trace (the list): CPU", took.cpu_s, "s")
    took = run_child(conductor("trace", str(run), "--sample", f"perf/{n - 1}"))
    figures.add("trace --sample", took.wall_s, "s", 10.0)
    figures.add("trace --sample: CPU", took.cpu_s, "s")

    if args.json is not None:
        args.json.write_text(json.dumps({"samples": n, "figures": figures.data}, indent=1))
    if args.keep is None:
        shutil.rmtree(work)
    print("all targets met" if not figures.failed else f"missed: {', '.join(figures.failed)}")


if __name__ == "__main__":
    main()
