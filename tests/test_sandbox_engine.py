"""The bubblewrap engine of :mod:`conductor.sandbox`: every attack of
tests/kit/sandbox_escapes.py fails, as root and as an ordinary user (uid 65534); the
engine choice and its refusal; the engine recorded in verdicts and shown by
``conductor report``; output floods that keep the grader small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.sandbox_escapes import (
    ATTACKS,
    CONTROLS,
    NOBODY,
    NOT_RUN,
    run_as_nobody,
    run_control,
    runs_nothing,
)

from conductor.errors import UsageError
from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample
from conductor.sandbox import (
    BUBBLEWRAP,
    BUBBLEWRAP_MISSING,
    ISOLATION_ENV,
    NAMESPACES,
    _engine,
    bubblewrap_available,
    require_engine,
    run_sandboxed,
    weaker_refusal,
)

REPO = Path(__file__).resolve().parent.parent
needs_bwrap = pytest.mark.skipif(
    not bubblewrap_available()[0], reason="bubblewrap unusable here: apt-get install bubblewrap"
)


@pytest.mark.process
@needs_bwrap
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_fails(name: str) -> None:
    defended, detail = ATTACKS[name]()
    assert defended, f"{name}: {detail}"


@pytest.fixture(scope="module")
def as_nobody() -> dict[str, Any]:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_escapes.py")
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.process
@needs_bwrap
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_fails_for_an_ordinary_user(as_nobody: dict[str, Any], name: str) -> None:
    defended, detail = as_nobody[name]
    assert defended, f"{name} (uid 65534): {detail}"


# Each attack's positive control: the same program, with its wall taken down (no OS
# isolation, or the named walls removed), does what it is after; a sandbox broken to
# run nothing cannot pass the tests above and these.


@pytest.mark.process
@needs_bwrap
@pytest.mark.parametrize("name", list(CONTROLS))
def test_attack_works_without_its_wall(name: str) -> None:
    happened, detail = run_control(name)
    assert happened, f"{name}: the positive control failed: {detail}"


@pytest.fixture(scope="module")
def controls_as_nobody() -> dict[str, Any]:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_escapes.py", ["--controls"])
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.process
@needs_bwrap
@pytest.mark.parametrize("name", list(CONTROLS))
def test_attack_works_without_its_wall_for_an_ordinary_user(
    controls_as_nobody: dict[str, Any], name: str
) -> None:
    happened, detail = controls_as_nobody[name]
    assert happened, f"{name} (uid 65534): the positive control failed: {detail}"


# The positive control of the attacks themselves: each is defended only where every
# program it ran proved it ran, so a sandbox broken to run nothing (its driver starts,
# its program job returns at once) fails every one, though no effect happened.


def _all_undefended(got: dict[str, Any], who: str) -> None:
    assert set(got) == set(ATTACKS)
    for name, (defended, detail) in got.items():
        assert not defended, f"{name} ({who}): defended by a sandbox that ran nothing: {detail}"
        assert detail.startswith(NOT_RUN), f"{name} ({who}): {detail}"


@pytest.mark.process
@needs_bwrap
def test_a_sandbox_that_runs_nothing_fails_every_attack() -> None:
    with runs_nothing():
        got = {name: attack() for name, attack in ATTACKS.items()}
    _all_undefended(got, "this user")


@pytest.mark.process
@needs_bwrap
def test_a_sandbox_that_runs_nothing_fails_every_attack_for_an_ordinary_user() -> None:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_escapes.py", ["--runs-nothing"])
    if isinstance(got, str):
        pytest.skip(got)
    _all_undefended(got, f"uid {NOBODY}")


@pytest.mark.process
@needs_bwrap
def test_a_plain_program_runs_and_names_its_engine() -> None:
    res = run_sandboxed(
        "import sys\nprint(sys.stdin.read().upper(), open('data.txt').read())",
        stdin="hello",
        files={"data.txt": "world", "sub/x.txt": "y"},
    )
    assert res.ok, res
    assert res.stdout.strip() == "HELLO world"
    assert res.engine == BUBBLEWRAP
    assert "allowlist-fs" in res.isolation and "seccomp" in res.isolation


# ------------------------------------------------------------------ engine choice


def test_missing_bubblewrap_refuses_with_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.setitem(_engine._PROBE, "bwrap", (False, "bwrap is not installed"))
    with pytest.raises(UsageError) as err:
        CodeGrader()
    assert str(err.value) == BUBBLEWRAP_MISSING
    assert "apt-get install bubblewrap" in str(err.value)
    # the opt-in grades in the weaker engine, and says which
    assert require_engine(True) != BUBBLEWRAP


def test_weaker_engine_needs_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISOLATION_ENV, NAMESPACES)
    with pytest.raises(UsageError) as err:
        CodeGrader()
    assert str(err.value) == weaker_refusal(NAMESPACES)
    assert require_engine(True) in (NAMESPACES, "none")


def _lcb_sample(n: int = 1) -> Sample:
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}] * n
    return Sample(id="s", input={"question": "?"}, gold=None, metadata={"tests": tests})


@pytest.mark.process
@pytest.mark.parametrize("engine", ["namespaces", "off"])
def test_verdict_records_the_opted_in_engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    monkeypatch.setenv(ISOLATION_ENV, engine)
    grader = CodeGrader(confirm_run_unsafe_code=True)
    verdict = grader.grade("```python\nprint(sum(map(int, input().split())))\n```", _lcb_sample())
    assert verdict.status == "correct", verdict
    assert verdict.detail["sandbox"] == grader.engine != BUBBLEWRAP


@pytest.mark.process
@needs_bwrap
def test_control_byte_flood_keeps_the_grader_small() -> None:
    """4 MB of control bytes per test on stdout, 10 tests: the grading process stayed
    at 19 MB before the solution ran and grew to 579-751 MB when output came back as
    files read whole; through the bounded pipes it stays under 250 MB."""
    script = (
        "import sys\n"
        "from conductor.grading.code import CodeGrader\n"
        "from conductor.grading.types import Sample\n"
        "tests = [{'input': f'{i}\\n', 'output': 'x\\n', 'testtype': 'stdin'} for i in range(10)]\n"
        "s = Sample(id='s', input={'question': '?'}, gold=None, metadata={'tests': tests})\n"
        "code = 'import sys\\nsys.stdout.write(chr(0) * 4_000_000)\\n'\n"
        "v = CodeGrader().grade(f'```python\\n{code}\\n```', s)\n"
        # VmHWM, not ru_maxrss: the latter survives exec and so holds the RSS of the
        # (large) test process this one was started from; VmHWM is this program's peak.
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "print(v.status, v.detail['sandbox'], hwm)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(300), env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    status, engine, rss_kb = done.stdout.split()
    assert (status, engine) == ("incorrect", BUBBLEWRAP)
    assert int(rss_kb) < 250 * 1024, f"grader grew to {int(rss_kb) // 1024} MB"


# ------------------------------------------------------------------------------ CLI

_READ_DATA = """```python
import json, os, sys
data = sys.stdin.read()
for path in {paths!r}:
    try:
        for line in open(path):
            row = json.loads(line)
            for t in json.loads(row["public_test_cases"]):
                if t["input"] == data:
                    print(t["output"], end="")
                    sys.exit(0)
    except OSError:
        pass
```"""


@pytest.mark.process
@needs_bwrap
def test_bench_cli_grades_an_attack_in_bubblewrap(tmp_path: Path, fake_server: Any) -> None:
    """Through ``conductor bench livecodebench --data``: a solution that reads the --data
    file for the expected output gets nothing, is graded incorrect in bubblewrap, and
    ``conductor report`` names the engine."""
    from kit.poolkit import pool_dict, worker, write_pool

    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    data = REPO / "tests" / "fixtures" / "bench" / "livecodebench.jsonl"
    fake_server.script("w0", _READ_DATA.format(paths=[str(data), f"/proc/1/root{data}"]))
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop(ISOLATION_ENV, None)
    run_dir = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "bench", "livecodebench", "--pool", str(pool),
         "--data", str(data), "--limit", "1", "--strategy", "single:w0", "--out", str(run_dir)],
        capture_output=True, text=True, timeout=scaled(300), env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    record = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert record["grade"]["status"] == "incorrect", record["grade"]
    assert record["grade"]["detail"]["sandbox"] == BUBBLEWRAP
    shown = subprocess.run(
        [sys.executable, "-m", "conductor", "report", str(run_dir)],
        capture_output=True, text=True, timeout=scaled(120), env=env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "sandbox" in shown.stdout and BUBBLEWRAP in shown.stdout, shown.stdout


@pytest.mark.process
@needs_bwrap
def test_the_driver_runs_as_bytecode_for_this_interpreter_and_as_source_for_another() -> None:
    # Compiling the 1,900-line driver on every start cost 43 ms a sample; the bytecode
    # must be this interpreter's own, or another version would refuse to load it.
    import importlib.util

    from conductor.sandbox._driver import driver_bytecode, driver_source

    code = driver_bytecode(sys.executable, driver_source())
    assert code is not None and code[:4] == importlib.util.MAGIC_NUMBER
    assert driver_bytecode("/bin/sh", driver_source()) is None
    result = run_sandboxed("import sys; print(sys.argv[0].endswith('main.py'))")
    assert result.returncode == 0 and result.stdout.strip() == "True", result
