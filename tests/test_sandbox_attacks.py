"""Every attack in tests/kit/sandbox_attacks.py is stopped, as root and as an ordinary user.

As root the attacks run twice: in this process (bubblewrap, a fresh uid) and in a
``python tests/kit/sandbox_attacks.py`` child that ``setpriv`` drops to uid 65534 (unprivileged
user namespaces).  Run as an ordinary user, the in-process run is the unprivileged one.
Also: the refusal where no OS isolation exists, the opt-in that records ``unisolated``,
and the scrubbing of quoted output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.sandbox_attacks import (
    ATTACKS,
    OS_CONTROLS,
    grading_attack,
    run_on_a_sandbox_that_runs_nothing,
    run_os_control,
)
from kit.sandbox_escapes import NOBODY, NOT_RUN, run_as_nobody

from conductor.errors import UsageError
from conductor.grading import get_grader
from conductor.grading.code import CodeGrader, with_unsafe_opt_in
from conductor.grading.code_text import quote_output
from conductor.grading.types import Sample
from conductor.sandbox import ISOLATION_ENV, NONE, default_engine, weaker_refusal

REPO = Path(__file__).resolve().parent.parent

needs_os = pytest.mark.skipif(
    default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
)


@pytest.mark.process
@needs_os
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_stopped(name: str) -> None:
    defended, detail = ATTACKS[name]()
    if detail.startswith("not run:"):
        pytest.skip(detail)
    assert defended, f"{name}: {detail}"


@pytest.fixture(scope="module")
def as_nobody() -> dict[str, Any]:
    """All attacks run once by an ordinary user (uid 65534); name -> [defended, detail]."""
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_attacks.py")
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.process
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_stopped_for_an_ordinary_user(as_nobody: dict[str, Any], name: str) -> None:
    defended, detail = as_nobody[name]
    if detail.startswith("not run:"):
        pytest.skip(detail)
    assert defended, f"{name} (uid {NOBODY}): {detail}"


# Each OS attack's positive control: the same program with its wall taken down (no
# OS isolation, or the named walls removed) does what it is after.


@pytest.mark.process
@needs_os
@pytest.mark.parametrize("name", list(OS_CONTROLS))
def test_os_attack_works_without_its_wall(name: str) -> None:
    happened, detail = run_os_control(name)
    assert happened, f"{name}: the positive control failed: {detail}"


@pytest.fixture(scope="module")
def controls_as_nobody() -> dict[str, Any]:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_attacks.py", ["--controls"])
    if isinstance(got, str):
        pytest.skip(got)
    return got


@pytest.mark.process
@needs_os
@pytest.mark.parametrize("name", list(OS_CONTROLS))
def test_os_attack_works_without_its_wall_for_an_ordinary_user(
    controls_as_nobody: dict[str, Any], name: str
) -> None:
    happened, detail = controls_as_nobody[name]
    assert happened, f"{name} (uid {NOBODY}): the positive control failed: {detail}"


# The positive control of the attacks themselves: an OS attack is defended only where its
# program proved it ran, so a sandbox broken to run nothing (its driver starts, its
# program job returns at once) fails every one of them, though no effect happened.


def _all_undefended(got: dict[str, Any], who: str) -> None:
    assert set(got) == set(OS_CONTROLS)
    for name, (defended, detail) in got.items():
        assert not defended, f"{name} ({who}): defended by a sandbox that ran nothing: {detail}"
        assert detail.startswith(NOT_RUN), f"{name} ({who}): {detail}"


@pytest.mark.process
@needs_os
def test_a_sandbox_that_runs_nothing_fails_every_os_attack() -> None:
    _all_undefended(run_on_a_sandbox_that_runs_nothing(), "this user")


@pytest.mark.process
@needs_os
def test_a_sandbox_that_runs_nothing_fails_every_os_attack_for_an_ordinary_user() -> None:
    got = run_as_nobody(REPO / "tests" / "kit" / "sandbox_attacks.py", ["--runs-nothing"])
    if isinstance(got, str):
        pytest.skip(got)
    _all_undefended(got, f"uid {NOBODY}")


# ------------------------------------------------------------ without OS isolation


def test_code_grader_refuses_without_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISOLATION_ENV, "off")
    with pytest.raises(UsageError) as err:
        CodeGrader()
    assert str(err.value) == weaker_refusal(NONE)
    assert "--confirm-run-unsafe-code" in str(err.value)
    with pytest.raises(UsageError):
        get_grader("code", {})


@pytest.mark.process
def test_opt_in_runs_and_records_unisolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISOLATION_ENV, "off")
    grader = get_grader("code", with_unsafe_opt_in("code", {}, True))
    sample = Sample(
        id="s",
        input={"question": "?"},
        gold=None,
        metadata={"tests": [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]},
    )
    verdict = grader.grade("```python\nprint(sum(map(int, input().split())))\n```", sample)
    assert verdict.status == "correct", verdict
    assert verdict.detail["unisolated"] is True
    assert "unisolated" in verdict.detail["isolation"]
    assert "netns" not in verdict.detail["isolation"]


def test_opt_in_only_reaches_the_code_grader() -> None:
    assert with_unsafe_opt_in("math", {"a": 1}, True) == {"a": 1}
    assert with_unsafe_opt_in("code", {}, False) == {}
    assert with_unsafe_opt_in("code", {}, True) == {"confirm_run_unsafe_code": True}


@pytest.mark.process
@pytest.mark.parametrize(
    "name",
    [
        "lcb: call the harness's reporting function via sys.modules['__main__']",
        "lcb: replace the output comparison",
        "lcb: return an object whose __eq__ is always true",
        "lcb call: forge every test's record on every fd, then answer wrong",
        "lcb call: answer the first test, then os._exit(0) in the next",
        "bcb: patch unittest.TestCase.assert* at import",
        "bcb: forge a pass verdict on every fd",
        "bcb: walk frames to the per-test tag and forge a pass with every candidate",
        "bcb: patch posixpath.exists (os.path.exists) to always say yes",
        "bcb: return unittest.mock.ANY",
    ],
)
def test_grading_attacks_fail_even_unisolated(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # The judge is a separate process whatever the OS offers: only the OS layer goes.
    monkeypatch.setenv(ISOLATION_ENV, "off")
    defended, detail = grading_attack(name, unisolated=True)()
    assert defended, detail


# ------------------------------------------------------------------- quoted output


@pytest.mark.process
def test_quoted_output_is_scrubbed_and_clipped(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-quoted-secret-0123456789"
    monkeypatch.setenv("CONDUCTOR_FAKE_KEY", secret)
    code = f"print({secret!r} + '\\x1b[31m' + 'x' * 5000)"
    sample = Sample(
        id="s",
        input={"question": "?"},
        gold=None,
        metadata={"tests": [{"input": "", "output": "3\n", "testtype": "stdin"}]},
    )
    verdict = CodeGrader(confirm_run_unsafe_code=True).grade(f"```python\n{code}\n```", sample)
    assert verdict.status == "incorrect"
    assert secret not in verdict.reason
    assert "[redacted]" in verdict.reason
    assert "\x1b" not in verdict.reason
    assert len(verdict.reason) < 600
    assert quote_output("a\x00b") == "a\\x00b"
    monkeypatch.setenv("SOME_ID", "abcdef0123456789xyz")
    monkeypatch.setenv("SOME_LOCALE", "en_US.UTF-8")
    assert (
        quote_output("id abcdef0123456789xyz, locale en_US.UTF-8")
        == "id [redacted], locale en_US.UTF-8"
    )


# ------------------------------------------------------------------------------ CLI


def _bench_cli(tmp_path: Path, server: Any, *extra: str) -> subprocess.CompletedProcess[str]:
    from kit.poolkit import pool_dict, worker, write_pool

    pool = write_pool(tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0")]))
    data = REPO / "tests" / "fixtures" / "bench" / "livecodebench.jsonl"
    env = {
        **os.environ,
        "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "COLUMNS": "200",
        ISOLATION_ENV: "off",
    }
    return subprocess.run(
        [sys.executable, "-m", "conductor", "bench", "livecodebench", "--pool", str(pool),
         "--data", str(data), "--limit", "1", "--strategy", "single:w0",
         "--out", str(tmp_path / "run"), *extra],
        capture_output=True, text=True, timeout=scaled(300), env=env,
    )  # fmt: skip


@pytest.mark.process
def test_bench_refuses_code_without_isolation(tmp_path: Path, fake_server: Any) -> None:
    res = _bench_cli(tmp_path, fake_server)
    assert res.returncode == 2, res.stderr
    assert "--confirm-run-unsafe-code" in res.stderr
    assert "Traceback" not in res.stderr
    assert not fake_server.requests  # refused before any paid call


@pytest.mark.process
def test_bench_opt_in_records_unisolated(tmp_path: Path, fake_server: Any) -> None:
    fake_server.script("w0", "```python\nprint(sum(map(int, open(0).read().split()[1:])))\n```")
    res = _bench_cli(tmp_path, fake_server, "--confirm-run-unsafe-code")
    assert res.returncode == 0, res.stderr
    records = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 1
    grade = records[0]["grade"]
    assert grade["status"] == "correct", grade
    assert grade["detail"]["unisolated"] is True


def test_train_config_opt_in_key() -> None:
    from conductor.errors import TrainConfigError
    from conductor.train.config import load_train_config_text

    head = "base_model: x/y\npool: local\ndata: [livecodebench]\noutput_dir: o\n"
    assert not load_train_config_text(head, source="c.yaml").confirm_run_unsafe_code
    on = load_train_config_text(head + "confirm_run_unsafe_code: true\n", source="c.yaml")
    assert on.confirm_run_unsafe_code is True
    with pytest.raises(TrainConfigError, match="confirm_run_unsafe_code"):
        load_train_config_text(head + "confirm_run_unsafe_code: maybe\n", source="c.yaml")


def test_train_rows_carry_the_opt_in_to_the_reward_grader(
    tmp_path: Path, fake_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kit.poolkit import pool_dict, worker, write_pool

    from conductor.conductors.spec import Conductor
    from conductor.pool import load_pool
    from conductor.targets import Worker
    from conductor.train.dataset import build_rows
    from conductor.train.settings import DataMix, TrainConfig

    monkeypatch.setenv(ISOLATION_ENV, "off")
    data = pool_dict(fake_server, [worker(fake_server, "w0")])
    del data["conductor"]
    pool = load_pool(write_pool(tmp_path / "pool.yaml", data))
    conductor = Conductor(backend="prompted", target=Worker(id="c", model="p"), max_steps=2)
    data_file = REPO / "tests" / "fixtures" / "bench" / "livecodebench.jsonl"
    mix = (DataMix(benchmark="livecodebench", split="test", file=str(data_file), limit=1),)

    def config(confirm: bool) -> TrainConfig:
        return TrainConfig(
            base_model="gguf:smollm2", pool=str(pool.path), data=mix, output_dir="unused",
            confirm_run_unsafe_code=confirm,
        )  # fmt: skip

    with pytest.raises(UsageError, match="confirm_run_unsafe_code"):
        build_rows(config(False), pool, conductor, rng_seed=0)
    rows = build_rows(config(True), pool, conductor, rng_seed=0)
    assert json.loads(rows[0]["grader_options"]) == {"confirm_run_unsafe_code": True}
