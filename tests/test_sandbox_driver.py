"""The program a sandbox runs (:mod:`conductor.sandbox._driver`): the sandbox's own
driver (:mod:`conductor.sandbox.inside`) and a grader's job driver
(:mod:`conductor.grading.drivers`), assembled into one module.

What must hold: each assembly compiles and holds the jobs of its files and no others;
no file rebinds a name another defines (they share one namespace); the sandbox's code
names no benchmark; a job of a kind the driver was not given runs nothing.
"""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

from conductor.grading.drivers import BIGCODEBENCH, LIVECODEBENCH
from conductor.sandbox import NONE, JobDriver, default_engine, run_job
from conductor.sandbox._driver import PARTS, driver_bytecode, driver_source

SANDBOX = Path(__file__).resolve().parent.parent / "src" / "conductor" / "sandbox"
OWN = [SANDBOX / "inside" / part for part in PARTS]
DRIVERS = {"none": None, "lcb": LIVECODEBENCH, "bcb": BIGCODEBENCH}


def _assembled(driver: JobDriver | None) -> types.ModuleType:
    """The driver program as a module (its ``main`` not called)."""
    module = types.ModuleType("assembled_driver")
    exec(compile(driver_source(driver), "driver.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("kind", list(DRIVERS))
def test_each_assembly_holds_its_own_jobs_and_no_others(kind: str) -> None:
    module = _assembled(DRIVERS[kind])
    jobs = sorted(k for k, v in vars(module).items() if k.startswith("job_") and callable(v))
    assert jobs == (["job_program"] if kind == "none" else [f"job_{kind}", "job_program"])
    assert callable(module.main) and callable(module.install_guard)


def bindings(source: str) -> dict[str, str]:
    """Each top-level name a file binds, and to what: ``import M`` / ``from M import X``
    (the same object wherever a file imports it) or ``defined`` (its own)."""
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                out[alias.asname or alias.name] = f"from {node.module} import {alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = "defined"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update({t.id: "defined" for t in targets if isinstance(t, ast.Name)})
    return out


def clashes(files: dict[str, str]) -> list[str]:
    """Names that two files of one assembly bind differently (the later would silently
    replace the earlier's for both)."""
    seen: dict[str, tuple[str, str]] = {}
    found = []
    for name, source in files.items():
        for key, what in bindings(source).items():
            if key in seen and (what == "defined" or seen[key][1] != what):
                found.append(f"{key}: {seen[key][0]} and {name}")
            seen.setdefault(key, (name, what))
    return found


def test_the_clash_check_sees_a_rebound_name() -> None:
    files = {"a": "import os\nCFG = {}\ndef f(): ...\n", "b": "import os\ndef f(): ...\n"}
    assert clashes(files) == ["f: a and b"]
    assert clashes({"a": "from os import path\n", "b": "from sys import path\n"}) == [
        "path: a and b"
    ]


@pytest.mark.parametrize("kind", ["lcb", "bcb"])
def test_no_file_rebinds_a_name_another_defines(kind: str) -> None:
    driver = DRIVERS[kind]
    assert driver is not None
    files = {str(p): p.read_text(encoding="utf-8") for p in [*OWN, *driver.files]}
    assert clashes(files) == []


BENCHMARK = re.compile(r"lcb|bcb|livecodebench|bigcodebench", re.IGNORECASE)


def benchmark_names(source: str) -> list[str]:
    """Identifiers and strings (docstrings aside: they may say who uses what) of
    ``source`` that name a benchmark."""
    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            words.append(node.name)
        elif isinstance(node, ast.arg):
            words.append(node.arg)
        elif isinstance(node, ast.alias):
            words.append(node.asname or node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.append(node.module)
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        ):
            words.append(node.value)
    return sorted({w for w in words if BENCHMARK.search(w)})


def test_the_benchmark_check_sees_a_benchmark_in_code() -> None:
    source = '"""Runs BigCodeBench."""\ndef job_bcb(kind="lcb"):\n    """For LCB."""\n'
    assert benchmark_names(source) == ["job_bcb", "lcb"]


def test_the_sandbox_names_no_benchmark() -> None:
    found = {
        str(path.relative_to(SANDBOX)): names
        for path in sorted(SANDBOX.rglob("*.py"))
        if (names := benchmark_names(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_each_driver_is_compiled_once_a_process() -> None:
    import sys

    programs = {k: driver_bytecode(sys.executable, driver_source(d)) for k, d in DRIVERS.items()}
    assert len(set(programs.values())) == 3
    again = driver_bytecode(sys.executable, driver_source(LIVECODEBENCH))
    assert again is programs["lcb"]


@pytest.mark.process
@pytest.mark.skipif(default_engine() == NONE, reason="no namespaces here")
def test_a_job_the_driver_was_not_given_runs_nothing() -> None:
    job = {
        "kind": "lcb",
        "solution": "print('ran')",
        "prelude": "",
        "fn_name": None,
        "time_limit": 5,
        "output_limit": 1000,
        "tests": [{"input": "", "testtype": "stdin"}],
    }
    alone = run_job(job)
    assert [f for f in alone.frames if f.get("event") == "test"] == []
    assert any("no job of kind 'lcb'" in n for n in alone.notes), alone.notes
    given = run_job(job, driver=LIVECODEBENCH)
    assert [f["stdout"] for f in given.frames if f.get("event") == "test"] == ["ran\n"]
