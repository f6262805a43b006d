"""Performance at scale, every figure in one run and one table.

Run:  python benchmarks/perf/scale.py [--smoke] [--only NAME,...] [--strict]

Runs each script of :data:`SCRIPTS` in a process of its own (so that one's memory and
threads do not count against the next), shows its output as it comes, then prints every
judged line of them together: each script prints a figure with its floor or target, its
ratio and ``PASS`` or ``FAIL`` on one line, and those lines are the table.

* ``loop.py``: the bench loop (``conductor`` strategy, caches on) against a bare aiohttp
  client on the same server, at concurrency 64 and 256: wall time and CPU per sample;
* ``view.py``: `conductor view`, `trace` and `report` on a large run (100,000 samples):
  time, CPU, peak RSS against parsing the file once, page size, time to interactive;
* ``grading.py``: a code grade against an official-style LiveCodeBench execution path
  (1 and 10 tests, stdin and call-based), and 500 samples graded at concurrency 64;
* ``startup.py``: `conductor --help` for each command, and a cached rerun's fixed cost.

``--smoke`` (CI) runs each at its smoke size, in seconds: that they run, their figures
in the log, to be judged on a quiet machine, not there.  ``--strict`` exits 1 when a
line says FAIL.  A script that fails to run makes the exit status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: The scripts whose figures make the table, in the order they run.
SCRIPTS = ("loop.py", "view.py", "grading.py", "startup.py")

#: A judged line: it says PASS or FAIL as a word.
_JUDGED = re.compile(r"\b(PASS|FAIL)\b")


def run_script(name: str, smoke: bool) -> tuple[int, float, list[str]]:
    """Run one script, echoing its output; its exit status, wall time and judged lines."""
    cmd = [sys.executable, str(HERE / name), *(["--smoke"] if smoke else [])]
    print(f"== {name} ({'smoke' if smoke else 'full'})", flush=True)
    started = time.perf_counter()
    judged: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if _JUDGED.search(line):
                judged.append(line.strip())
    return proc.returncode, time.perf_counter() - started, judged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="each script at its smoke size")
    parser.add_argument("--only", default="", help="comma-separated script names to run")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a line says FAIL")
    args = parser.parse_args()
    only = {n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()}
    chosen = [s for s in SCRIPTS if not only or s.removesuffix(".py") in only]
    table: list[tuple[str, str]] = []
    broken: list[str] = []
    for name in chosen:
        status, wall, judged = run_script(name, args.smoke)
        table.extend((name, line) for line in judged)
        if status != 0:
            broken.append(f"{name}: exit status {status} after {wall:.0f} s")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    size = "smoke sizes, not to be judged" if args.smoke else "full sizes"
    print(f"\n== every judged figure ({os.cpu_count()} CPUs, load {load}, {size})")
    for name, line in table:
        print(f"{name:<11} {line}")
    for line in broken:
        print(f"ERROR {line}")
    if broken:
        return 2
    missed = any(re.search(r"\bFAIL\b", line) for _n, line in table)
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
