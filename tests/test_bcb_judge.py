"""BigCodeBench judging end to end: forged passes through the real CLI, as root and as
an ordinary user (uid 65534), and the parsing of a test's verdict file.

``conductor bench bigcodebench-hard --data tests/fixtures/bench/bigcodebench-forgery.jsonl``
runs eight tasks in the real schema on the fake provider: two answered honestly (one
through ``subprocess.run(["echo", ...])``), six with a forging solution each.  Only the
honest two may be correct, each forgery must be refused with the expected outcome, and
none may have written outside its sandbox.  The in-process attacks (every class and
its variants) are tests/kit/sandbox_attacks.py, run by tests/test_sandbox_attacks.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from kit.sandbox_escapes import nobody_python

from conductor.sandbox import ISOLATION_ENV, NONE, default_engine
from conductor.testing import FakeLLMServer

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "bench" / "bigcodebench-forgery.jsonl"
NOBODY = 65534
CANARY = Path(tempfile.gettempdir()) / f"conductor-bcb-canary-{uuid.uuid4().hex}"

needs_os = pytest.mark.skipif(
    default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
)

# Every forging solution also tries to leave a file outside its sandbox, from a shell
# (subprocesses are allowed, as in the official harness: the OS layer must hold).
_ESCAPE = f"""
import subprocess as _sp
_sp.run(["sh", "-c", "echo escaped > {CANARY}"], capture_output=True)
"""

# task key (the fixture's "TASK:<key>") -> (answer, expected status, expected outcome)
ANSWERS: dict[str, tuple[str, str, str | None]] = {
    "sum": ("def task_func(xs):\n    return sum(xs)\n", "correct", None),
    "echo": (
        "import subprocess\n"
        "def task_func(word):\n"
        "    return subprocess.run(['echo', word], capture_output=True, text=True)"
        ".stdout.strip()\n",
        "correct",
        None,
    ),
    "any": (
        _ESCAPE + "from unittest import mock\ndef task_func(xs):\n    return mock.ANY\n",
        "incorrect",
        "runtime_error",
    ),
    "exists": (
        _ESCAPE + "import posixpath\nposixpath.exists = lambda p: True\n"
        "def task_func(name):\n    return '/nonexistent/' + name\n",
        "incorrect",
        "tampered",
    ),
    "frames": (
        _ESCAPE
        + textwrap.dedent(
            """\
            import os, sys
            def task_func(xs):
                # every string of a tag's length on the stack, as a pass, on every fd
                f, seen = sys._getframe(), set()
                while f is not None:
                    for v in list(f.f_locals.values()) + list(f.f_globals.values()):
                        if isinstance(v, (str, bytes)) and len(v) in (16, 32):
                            seen.add(v.hex() if isinstance(v, bytes) else v)
                    ask = f.f_globals.get("_ask_pass")
                    f = f.f_back
                for tag in seen:
                    for fd in range(3, 64):
                        try:
                            os.write(fd, ("V %s pass 00\\n" % tag).encode())
                        except OSError:
                            pass
                if ask is not None:
                    try:
                        ask()
                    except BaseException:
                        pass
                os._exit(0)
            """
        ),
        "incorrect",
        "tampered",
    ),
    "frame": (
        _ESCAPE + "import pandas as pd\nclass A:\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def task_func(n):\n    return pd.DataFrame({'x': [A() for _ in range(n)]})\n",
        "incorrect",
        "runtime_error",
    ),
    "finaliser": (
        _ESCAPE + "import weakref\nfrom unittest import mock\nclass T:\n    pass\n"
        "def task_func(name):\n    t = T()\n"
        "    weakref.finalize(t, mock.patch('os.path.exists', return_value=True).start)\n"
        "    return '/nonexistent/' + name\n",
        "incorrect",
        "tampered",
    ),
    "instance": (
        _ESCAPE + "import sys, unittest\ndef task_func(xs):\n    f = sys._getframe()\n"
        "    while f is not None:\n"
        "        me = f.f_locals.get('self')\n"
        "        if isinstance(me, unittest.TestCase):\n"
        "            me.assertEqual = lambda *a, **k: None\n"
        "        f = f.f_back\n"
        "    return -1\n",
        "incorrect",
        "tampered",
    ),
}


def _answer(request: Any) -> str:
    text = request.messages[-1]["content"]
    key = text.split("TASK:", 1)[1].split()[0]
    return f"```python\n{ANSWERS[key][0]}```"


def _pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    from kit.poolkit import pool_dict, worker, write_pool

    pool = write_pool(tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0")]))
    pool.chmod(0o644)
    return pool


def _bench(tmp_path: Path, server: FakeLLMServer, prefix: list[str], python: str) -> Any:
    server.script("w0", _answer)
    out = tmp_path / "run"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}",
        "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "COLUMNS": "200",
        "LANG": "C.UTF-8",
    }
    env.pop(ISOLATION_ENV, None)
    done = subprocess.run(
        [*prefix, python, "-m", "conductor", "bench", "bigcodebench-hard",
         "--pool", str(_pool(tmp_path, server)), "--data", str(FIXTURE),
         "--strategy", "single:w0", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    return done, records


def _check(done: Any, records: list[dict[str, Any]]) -> None:
    by_key = {r["sample_id"].rsplit("-", 1)[1]: r["grade"] for r in records}
    assert set(by_key) == set(ANSWERS)
    for key, (_code, status, outcome) in ANSWERS.items():
        grade = by_key[key]
        assert grade["status"] == status, (key, grade)
        assert grade["detail"].get("outcome") == outcome, (key, grade)
        if outcome == "tampered":
            assert grade["detail"]["tampered"], grade  # recorded: what changed
    assert not CANARY.exists(), "a forging solution wrote outside its sandbox"
    # the report counts the two honest programs of eight
    assert "25.0" in done.stdout or "25.00" in done.stdout, done.stdout[-2000:]


def _prepare(tmp_path: Path) -> None:
    for sub in ("home", "tmp", "cache"):
        (tmp_path / sub).mkdir(exist_ok=True)
    for path in (tmp_path, tmp_path / "home", tmp_path / "tmp", tmp_path / "cache"):
        path.chmod(0o777)


@pytest.mark.process
@needs_os
def test_cli_refuses_every_forged_pass(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    _prepare(tmp_path)
    done, records = _bench(tmp_path, fake_server, [], sys.executable)
    _check(done, records)


@pytest.mark.process
@needs_os
def test_cli_refuses_every_forged_pass_for_an_ordinary_user(
    tmp_path_factory: pytest.TempPathFactory, fake_server: FakeLLMServer
) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("dropping privileges needs root and setpriv")
    top = Path(tempfile.mkdtemp(prefix="conductor-bcb-nobody-"))
    try:
        _prepare(top)
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        # an interpreter uid 65534 can run (this one, or a venv of the system's Python
        # seeing this one's packages, where this one lives in a private home), which the
        # sandbox starts again inside its namespaces
        env = {"PATH": "/usr/bin:/bin", "HOME": str(top / "home"),
               "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}"}  # fmt: skip
        python = nobody_python(env)
        if python is None:
            pytest.skip("no interpreter uid 65534 can run imports conductor")
        done, records = _bench(top, fake_server, drop, python)
        _check(done, records)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------ the verdict file


def _driver() -> Any:
    """The BigCodeBench driver as the sandbox runs it: assembled with the sandbox's own
    driver into one module (not started)."""
    import types

    from conductor.grading.drivers import BIGCODEBENCH
    from conductor.sandbox._driver import driver_source

    module = types.ModuleType("sandbox_driver_for_tests")
    exec(compile(driver_source(BIGCODEBENCH), "driver.py", "exec"), module.__dict__)
    return module


def test_verdict_file_trusts_only_the_judges_nonce() -> None:
    outcome = _driver()._bcb_outcome
    nonce = "ab" * 16
    empty = b"".hex()
    assert outcome(f"V {nonce} pass {empty}\n", nonce)[0] == "pass"
    # forged lines: another nonce, the old JSON form, a pass claimed by the process
    forged = f'V {"cd" * 16} pass {empty}\nV {{"nonce": "{nonce}", "outcome": "pass"}}\n'
    assert outcome(forged, nonce)[0] == "no_report"
    # two passes, or a pass and the process's own account of a failure, are no pass
    assert outcome(f"V {nonce} pass {empty}\n" * 2, nonce)[0] == "error"
    failed = 'E {"outcome": "failure", "error": "AssertionError"}\n'
    assert outcome(failed + f"V {nonce} pass {empty}\n", nonce)[0] == "failure"
    # tampering wins whatever else was said, with what changed
    why = "posixpath.exists was replaced"
    text = f"V {nonce} pass {empty}\nV {nonce} tampered {why.encode().hex()}\n"
    assert outcome(text, nonce)[:2] == ("tampered", why)


def test_bigcodebench_hard_runs_with_the_official_rules() -> None:
    from conductor.bench.spec import load_benchmark
    from conductor.grading.code import CodeGrader

    spec = load_benchmark("bigcodebench-hard")
    assert spec.grader_options["bigcodebench_allow_subprocess"] is True
    assert spec.grader_options["bigcodebench_time_limit_s"] == 240
    grader = CodeGrader(confirm_run_unsafe_code=True)
    assert grader.bigcodebench_time_limit_s == 240.0 and grader.bigcodebench_allow_subprocess
