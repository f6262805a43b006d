"""Start-up cost of the `conductor` command, printed as numbers.

Run:  python benchmarks/perf/startup.py [--quick | --smoke] [--json PATH]

1. `conductor --help`, `conductor bench --help` and `conductor ask --help`: median wall
   time of 10 runs each (target: < 0.3 s on an idle machine), beside the floor, a bare
   `python -c pass` measured in the same run.
2. A fully cached rerun of a 500-sample `conductor bench` (every sample replayed from
   the sample cache; a fake server answers the cold run): the rerun's wall and CPU
   time, and its fixed cost, what it spends before its first sample is written and
   after its last (the process's wall time less the time between those two samples,
   told by the session's progress callback; target: < 0.5 s), and its parts: the
   interpreter's start, the time to the first sample, after the last, the exit.

Every figure is printed with its ratio to the target and PASS or FAIL; ``--json PATH``
writes them to PATH as well.  Timings on a loaded machine are noisy: compare ratios to
the floor measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HELP_TARGET_S = 0.3
FIXED_COST_TARGET_S = 0.5
HELP_COMMANDS: tuple[tuple[str, ...], ...] = ((), ("bench",), ("ask",))

# Bytecode is written and reused, as an installed package's is: without it each start
# would compile every module from source, which no user pays.
_ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one child process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _verdict(value: float, target: float) -> str:
    return f"ratio {value / target:.2f} of target  {'PASS' if value < target else 'FAIL'}"


def help_times(repeats: int) -> dict[str, Any]:
    floor = statistics.median(
        _timed([sys.executable, "-c", "pass"], _ENV)[0] for _ in range(repeats)
    )
    print(f"[1] floor (python -c pass): median {floor:.3f} s")
    out: dict[str, Any] = {"floor_s": floor, "target_s": HELP_TARGET_S, "commands": {}}
    for command in HELP_COMMANDS:
        argv = [sys.executable, "-m", "conductor", *command, "--help"]
        _timed(argv, _ENV)  # the first start writes the bytecode
        walls = [_timed(argv, _ENV)[0] for _ in range(repeats)]
        median = statistics.median(walls)
        name = " ".join(("conductor", *command, "--help"))
        print(
            f"[1] {name:26s} median {median:.3f} s ({median / floor:.1f}x the floor)  "
            f"(target < {HELP_TARGET_S} s)  {_verdict(median, HELP_TARGET_S)}"
        )
        out["commands"][name] = {"median_s": median, "walls_s": walls}
    return out


def _pool_text(base: str) -> str:
    free = "price: {input_per_mtok: 0, output_per_mtok: 0}"
    return (
        "name: startup\n"
        "defaults: {max_concurrency: 256}\n"
        f"workers:\n  - {{id: w0, model: w0, client: openai, api_base: {base}, {free}}}\n"
        f"conductor: {{backend: endpoint, model: conductor, api_base: {base}, {free}}}\n"
    )


# Runs the command line in this process, noting when the script starts, when the first
# and the last sample are counted (the session's progress callback) and when the command
# returns, and writes those times to $MARKS.  perf_counter is the system's monotonic
# clock, so the parent's readings before and after the process are on the same scale.
_MARKED_MAIN = """
import time
marks = {"start": time.perf_counter()}
import json, os, sys
from conductor.bench import session

run = session.BenchSession.run

def marked(self, *, on_progress=None, on_warning=None, **rest):
    def note(p):
        if p.done:
            now = time.perf_counter()
            marks.setdefault("first", now)
            marks["last"] = now
        if on_progress is not None:
            on_progress(p)
    return run(self, on_progress=note, on_warning=on_warning, **rest)

session.BenchSession.run = marked
from conductor.cli import main
try:
    main(sys.argv[1:])
finally:
    marks["end"] = time.perf_counter()
    with open(os.environ["MARKS"], "w") as fh:
        json.dump(marks, fh)
"""


def cached_rerun(n_samples: int, repeats: int) -> dict[str, Any]:
    import re

    from conductor.testing import FakeLLMServer

    def answer(request: Any) -> str:
        m = re.search(r"What is (\d+) \+ 0\?", request.messages[-1]["content"])
        return f"\\boxed{{{m.group(1) if m else 0}}}"

    with tempfile.TemporaryDirectory() as tmp_s, FakeLLMServer() as server:
        tmp = Path(tmp_s)
        server.script("conductor", ['model_id = [0]\nsubtasks = ["Solve it."]\naccess_list = [[]]'])
        server.script("w0", answer)
        pool = tmp / "pool.yaml"
        pool.write_text(_pool_text(server.openai_base))
        data = tmp / "data.jsonl"
        with data.open("w") as fh:
            for i in range(n_samples):
                row = {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"s/{i}"}
                fh.write(json.dumps(row) + "\n")
        env = {**_ENV, "CONDUCTOR_CACHE_DIR": str(tmp / "cache"), "COLUMNS": "200"}
        marks = tmp / "marks.json"
        args = ["bench", "math500", "--pool", str(pool), "--data", str(data)]
        args += ["--concurrency", "64"]

        def bench(name: str) -> tuple[float, float, float, dict[str, float]]:
            """Wall, CPU, the time between the first and the last sample, and the parts
            of the rest: the interpreter's start, up to the first sample, after the
            last one until the command returned, and the exit."""
            argv = [sys.executable, "-c", _MARKED_MAIN, *args, "--out", str(tmp / name)]
            before = time.perf_counter()
            wall, cpu = _timed(argv, {**env, "MARKS": str(marks)})
            after = time.perf_counter()
            seen = json.loads(marks.read_text())
            parts = {
                "interpreter_start_s": seen["start"] - before,
                "to_first_sample_s": seen["first"] - seen["start"],
                "after_last_sample_s": seen["end"] - seen["last"],
                "exit_s": after - seen["end"],
            }
            return wall, cpu, seen["last"] - seen["first"], parts

        cold_wall, cold_cpu, _, _ = bench("cold")
        calls = len(server.requests)
        reruns = [bench(f"warm{i}") for i in range(repeats)]
        if len(server.requests) != calls:
            raise SystemExit("a cached rerun called the models: it was not fully cached")
    wall = statistics.median(w for w, _, _, _ in reruns)
    cpu = statistics.median(c for _, c, _, _ in reruns)
    fixed = [w - between for w, _, between, _ in reruns]
    fixed_s = statistics.median(fixed)
    parts = {k: statistics.median(p[k] for _, _, _, p in reruns) for k in reruns[0][3]}
    # The samples are replayed on one thread, so their CPU time is about their wall
    # time: what is left of the CPU is the fixed part's, which a loaded machine
    # stretches less than its wall time.
    fixed_cpu_s = statistics.median(c - between for _, c, between, _ in reruns)
    per_sample_ms = statistics.median(b for _, _, b, _ in reruns) / max(1, n_samples - 1) * 1e3
    print(
        f"[2] cold run of {n_samples} samples: wall {cold_wall:.2f} s, CPU {cold_cpu:.2f} s "
        f"({calls} calls)"
    )
    print(
        f"[2] cached rerun of {n_samples} samples: wall {wall:.3f} s, CPU {cpu:.3f} s "
        f"(median of {repeats}); {cold_wall / wall:.1f}x faster than cold"
    )
    print(
        f"[2] cached rerun fixed cost (before the first sample and after the last): "
        f"{fixed_s:.3f} s (CPU about {fixed_cpu_s:.3f} s), and {per_sample_ms:.2f} ms/sample "
        "between  "
        f"(target < {FIXED_COST_TARGET_S} s)  "
        f"{_verdict(fixed_s, FIXED_COST_TARGET_S)}"
    )
    print(
        "[2] its parts (medians): interpreter start {interpreter_start_s:.3f} s, then "
        "{to_first_sample_s:.3f} s to the first sample (imports, options, set-up); "
        "{after_last_sample_s:.3f} s after the last (summary, report), exit "
        "{exit_s:.3f} s".format(**parts)
    )
    return {
        "samples": n_samples,
        "cold_wall_s": cold_wall,
        "cold_cpu_s": cold_cpu,
        "rerun_wall_s": wall,
        "rerun_cpu_s": cpu,
        "fixed_s": fixed_s,
        "fixed_walls_s": fixed,
        "fixed_cpu_s": fixed_cpu_s,
        "fixed_parts_s": parts,
        "per_sample_ms": per_sample_ms,
        "target_s": FIXED_COST_TARGET_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true", help="once each, tiny (seconds, for CI)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    sizes = {"smoke": (1, 8, 1), "quick": (5, 500, 3), "full": (10, 500, 5)}
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    helps, samples, reruns = sizes[size]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    figures = {"help": help_times(helps), "cached_rerun": cached_rerun(samples, reruns)}
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
