"""Every script under benchmarks/ is run by CI (``.ci/run``) and type-checked: a script
nothing runs rots (the routing proof did: an import of a renamed private function and
a removed keyword went unseen for two releases)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CI = (REPO / ".ci" / "run").read_text(encoding="utf-8")


def _scripts() -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "benchmarks").rglob("*.py")
        if p.name != "__init__.py" and "if __name__ ==" in p.read_text(encoding="utf-8")
    )


def _run_by_scale() -> set[str]:
    """The scripts ``benchmarks/perf/scale.py`` runs (its ``SCRIPTS``), when CI runs it."""
    if "python benchmarks/perf/scale.py" not in CI:
        return set()
    tree = ast.parse((REPO / "benchmarks/perf/scale.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SCRIPTS" for t in node.targets
        ):
            return {f"benchmarks/perf/{name}" for name in ast.literal_eval(node.value)}
    raise AssertionError("benchmarks/perf/scale.py names no SCRIPTS")


def test_every_benchmark_script_is_run_by_ci() -> None:
    scripts = _scripts()
    assert "benchmarks/train/routing_proof.py" in scripts
    run = set(re.findall(r"python (benchmarks/\S+\.py)", CI)) | _run_by_scale()
    assert not [s for s in scripts if s not in run], "scripts .ci/run never runs"


def test_scale_runs_scripts_that_exist() -> None:
    for script in _run_by_scale():
        assert (REPO / script).is_file(), script


def test_ci_type_checks_the_benchmarks() -> None:
    assert re.search(r"^step \"mypy\" mypy src benchmarks\s*$", CI, re.MULTILINE)
    assert re.search(r"ruff check src tests benchmarks", CI)
