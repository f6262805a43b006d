"""Code grading on a Ray cluster: grades per second on 1 and on 2 worker nodes, and
whether every verdict equals the local grader's.

Run:  python benchmarks/perf/ray_grading.py [--nodes 1,2] [--slots S] [--repeat R] [--smoke]

``--smoke`` (CI, where ray is not installed): without ray it says so and exits 0; with
it, one node and one pass.

A local cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``: a head that runs nothing
and worker nodes, each declaring ``S`` units of the ``sandbox`` resource) grades the
project's agreement corpora (tests/cases/lcb_agreement.json and the programs of
benchmarks/graders/bcb_agreement.py), ``R`` times over, with as many grader threads on
the driver as the cluster has sandbox units.  The same jobs graded locally (the same
number of threads) come first.  Printed: grades, seconds, grades per second, and how
many verdicts differ from the local ones (must be 0).

Nodes of a local cluster share this machine's cores: more nodes add processes, not
cores.  Needs ray (pip install 'conductor-orchestrate[ray]') and bubblewrap.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from conductor.grading.code import CodeGrader  # noqa: E402
from conductor.grading.types import Sample  # noqa: E402
from conductor.placement.raycluster import (  # noqa: E402
    SANDBOX_RESOURCE,
    RayGrader,
    connect,
    disconnect,
)

#: 1 s a test: the corpus's verdicts are the same under any limit from 1 s to 6 s.
OPTIONS: dict[str, Any] = {"time_limit_s": 1, "bigcodebench_time_limit_s": 2}


def _script(name: str) -> Any:
    path = ROOT / "benchmarks" / "graders" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def agreement_jobs() -> list[tuple[str, Sample]]:
    """(reply, sample) for every program of the two agreement corpora, as their scripts
    build them."""
    lcb, bcb = _script("lcb_agreement"), _script("bcb_agreement")
    jobs: list[tuple[str, Sample]] = []
    for case in lcb.load_cases():
        kind = "functional" if case["fn_name"] else "stdin"
        tests = [
            {"input": t["input"], "output": t["output"], "testtype": kind} for t in case["tests"]
        ]
        metadata: dict[str, Any] = {"tests": tests}
        if case["fn_name"]:
            metadata["fn_name"] = case["fn_name"]
        sample = Sample(id=case["name"], input={"question": "?"}, gold=None, metadata=metadata)
        jobs.append((f"```python\n{case['code']}```\n", sample))
    for name, (code, test, _honest) in bcb.CORPUS.items():
        meta = {"test": test, "entry_point": "task_func"}
        sample = Sample(id=f"bcb/{name}", input={"question": "?"}, gold=None, metadata=meta)
        jobs.append((f"```python\n{code}\n```", sample))
    return jobs


def grade_all(grader: Any, jobs: list[tuple[str, Sample]], threads: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(lambda job: grader.grade(*job).to_dict(), jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2", help="worker node counts to try")
    parser.add_argument("--slots", type=int, default=2, help="sandbox units a node declares")
    parser.add_argument("--repeat", type=int, default=2, help="passes over the corpora")
    parser.add_argument(
        "--smoke", action="store_true", help="one node, one pass; no ray installed: skip, exit 0"
    )
    args = parser.parse_args(argv)
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        print(
            "ray_grading: skipped, ray is not installed (pip install 'conductor-orchestrate[ray]')"
        )
        return 0 if args.smoke else 2
    if args.smoke:
        args.nodes, args.repeat = "1", 1

    jobs = agreement_jobs() * args.repeat
    print(f"{len(jobs)} grades; {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    threads = args.slots
    started = time.perf_counter()
    local = grade_all(CodeGrader(**OPTIONS), jobs, threads)
    took = time.perf_counter() - started
    print(f"local, {threads} threads: {took:.1f} s, {len(jobs) / took:.1f} grades/s")
    status = 0
    for count in (int(n) for n in args.nodes.split(",")):
        # Any: ray's cluster utilities are untyped
        cluster: Any = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            for _ in range(count):
                cluster.add_node(
                    num_cpus=args.slots,
                    resources={SANDBOX_RESOURCE: args.slots},
                )
            cluster.wait_for_nodes()
            connect(cluster.address)
            grader = RayGrader("code", OPTIONS)
            threads = count * args.slots
            grade_all(grader, jobs[:threads], threads)  # worker processes started
            started = time.perf_counter()
            remote = grade_all(grader, jobs, threads)
            took = time.perf_counter() - started
            differ = sum(a != b for a, b in zip(local, remote, strict=True))
            status |= differ > 0
            print(
                f"ray, {count} worker node(s) x {args.slots} sandbox: {took:.1f} s, "
                f"{len(jobs) / took:.1f} grades/s, {differ} verdicts differ from local; "
                f"load {os.getloadavg()[0]:.2f}"
            )
        finally:
            disconnect()
            cluster.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
