"""Work placed on a real local Ray cluster (a head and two worker nodes, separate
processes, started here once for the module): code grading as tasks that need the
``sandbox`` resource, with the verdicts of local grading on the agreement corpora."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from conductor.grading.code import CodeGrader  # noqa: E402
from conductor.placement import raycluster  # noqa: E402
from conductor.placement.raycluster import SANDBOX_RESOURCE, RayGrader  # noqa: E402
from conductor.sandbox import bubblewrap_available  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def _perf_script() -> Any:
    path = REPO / "benchmarks" / "perf" / "ray_grading.py"
    spec = importlib.util.spec_from_file_location("ray_grading", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ray_grading"] = module
    spec.loader.exec_module(module)
    return module


class Nodes:
    """The module's cluster: ``sandboxed`` declares one ``sandbox`` unit, ``plain``
    none (a node without bubblewrap)."""

    def __init__(self) -> None:
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        self.sandboxed = self.cluster.add_node(num_cpus=2, resources={SANDBOX_RESOURCE: 2})
        self.plain = self.cluster.add_node(num_cpus=2)
        self.cluster.wait_for_nodes()
        raycluster.connect(self.cluster.address)

    def close(self) -> None:
        raycluster.disconnect()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    started = Nodes()
    try:
        yield started
    finally:
        started.close()


@pytest.mark.skipif(not bubblewrap_available(), reason="code grading needs bubblewrap")
def test_grades_on_the_cluster_are_the_local_grades(nodes: Nodes) -> None:
    """Every program of the LiveCodeBench and BigCodeBench agreement corpora gets,
    graded on the cluster, the very verdict local grading gives it."""
    perf = _perf_script()
    jobs = perf.agreement_jobs()
    assert len(jobs) > 60
    assert raycluster.sandbox_slots() == 2
    local = perf.grade_all(CodeGrader(**perf.OPTIONS), jobs, 2)
    grader = RayGrader("code", perf.OPTIONS)
    assert (grader.name, grader.version) == ("code", CodeGrader.version)
    remote = perf.grade_all(grader, jobs, 2)
    differ = [job[1].id for job, a, b in zip(jobs, local, remote, strict=True) if a != b]
    assert differ == []
    statuses = {v["status"] for v in remote}
    assert {"correct", "incorrect"} <= statuses  # the corpus is graded, not refused


def test_a_grade_never_runs_on_a_node_without_the_sandbox(nodes: Nodes) -> None:
    """A grading task that does not hold the resource (one placed on the plain node on
    purpose, as a caller leaving the resource out could) refuses to run the code; the
    same task through RayGrader, which asks for the resource, grades it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sample = _perf_script().agreement_jobs()[0]
    unplaced = ray.remote(raycluster._grade_on_node).options(
        num_cpus=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes.plain.node_id, soft=False),
    )
    verdict = ray.get(unplaced.remote("code", {}, sample[0], sample[1]))
    assert verdict["status"] == "grader_error"
    assert "holds no 'sandbox' resource" in verdict["reason"]
