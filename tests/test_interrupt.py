"""Ctrl-C and question input: `conductor ask` stops at once, says what it kept and exits
130; blank questions are refused; `ask -` and `ask --file` read the question."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.poolkit import (
    CONDUCTOR_MODEL,
    embedded_model_or_skip,
    lists,
    pool_dict,
    run_cli,
    worker,
    write_pool,
)

from conductor.testing import FakeLLMServer, Fault


def error_line(res: Any) -> str:
    """The one line a refused command prints on stderr."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def last_line(text: str) -> str:
    """The last line of ``text`` (log warnings, such as unknown prices, come before)."""
    return text.strip().splitlines()[-1]


def hang_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    workers = [worker(server, "first"), worker(server, "second")]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


def start_cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -m conductor ARGS`` in a child process, its output piped.

    SIGINT is set back to its default in the child: a suite started in the background
    by a shell without job control inherits SIGINT ignored, and Python then installs
    no Ctrl-C handler (right for ``nohup conductor ... &``, not what these tests ask).
    """
    return subprocess.Popen(
        [sys.executable, "-m", "conductor", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", **env},
        preexec_fn=_default_sigint,  # noqa: PLW1509 - only a signal disposition
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def interrupt(proc: subprocess.Popen[str]) -> tuple[float, str, str]:
    """Send SIGINT; return the seconds until the process ended, its stdout and stderr."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=scaled(30))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running 30 s after SIGINT: {err}") from None
    return time.monotonic() - sent, out, err


# -- the question -------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("blank", ["", "   ", "\n\t "])
def test_a_blank_question_is_a_usage_error_before_any_pool_loads(
    tmp_path: Path, blank: str
) -> None:
    # The pool does not exist: the blank question is refused before anything is read.
    res = run_cli("ask", blank, "--pool", str(tmp_path / "missing.yaml"))
    assert res.returncode == 2
    assert error_line(res) == "error: the question is empty; give the question to answer"


@pytest.mark.process
def test_ask_without_a_question_says_how_to_give_one() -> None:
    res = run_cli("ask")
    assert res.returncode == 2
    line = error_line(res)
    assert "conductor ask -" in line and "--file PATH" in line


@pytest.mark.process
def test_ask_dash_reads_the_question_from_standard_input(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["Solve it"], [[]])])
    fake_server.script("first", ["ANSWER: 391"])
    pool = hang_pool(tmp_path, fake_server)
    question = "What is 17 * 23?\nShow the product only."
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "ask", "-", "--pool", str(pool), "--json"],
        input=question + "\n\n",
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    assert record["question"] == question  # the final newlines dropped, the rest kept
    sent = fake_server.requests_for(CONDUCTOR_MODEL)[0].messages
    assert any(question in m["content"] for m in sent)


@pytest.mark.process
def test_ask_dash_with_empty_standard_input_is_the_blank_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "ask", "-", "--pool", str(tmp_path / "no.yaml")],
        input=" \n",
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert res.returncode == 2
    assert error_line(res) == "error: the question is empty; give the question to answer"


@pytest.mark.process
def test_ask_file_reads_the_question(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["Solve it"], [[]])])
    fake_server.script("first", ["ANSWER: 4"])
    pool = hang_pool(tmp_path, fake_server)
    question_file = tmp_path / "question.txt"
    question_file.write_text("What is 2 + 2?\n", encoding="utf-8")
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    res = run_cli("ask", "--file", str(question_file), "--pool", str(pool), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["question"] == "What is 2 + 2?"


@pytest.mark.process
def test_ask_file_refusals_exit_2_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    res = run_cli("ask", "--file", str(missing))
    assert res.returncode == 2
    assert error_line(res) == f"error: {missing}: no such question file"

    res = run_cli("ask", "--file", str(tmp_path))
    assert res.returncode == 2
    assert error_line(res).startswith(f"error: {tmp_path}: is a directory, not a question file")

    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    res = run_cli("ask", "--file", str(empty))
    assert res.returncode == 2
    assert error_line(res) == "error: the question is empty; give the question to answer"

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Qu'est-ce qu'une \xe9toile ?".encode("latin-1"))
    res = run_cli("ask", "--file", str(latin1))
    assert res.returncode == 2
    assert f"the question in {latin1} is not UTF-8 text" in error_line(res)

    question = tmp_path / "q.txt"
    question.write_text("What is 2 + 2?")
    res = run_cli("ask", "What is 3 + 3?", "--file", str(question))
    assert res.returncode == 2
    assert "either as an argument or with --file, not both" in error_line(res)


@pytest.mark.process
def test_the_question_limit_holds_for_files_and_standard_input(tmp_path: Path) -> None:
    env = {"CONDUCTOR_MAX_QUESTION_CHARS": "100"}
    at_limit = tmp_path / "100.txt"
    at_limit.write_text("y" * 100)
    # At the limit the question passes the check and the run goes on to the pool.
    res = run_cli("ask", "--file", str(at_limit), "--pool", str(tmp_path / "no.yaml"), env=env)
    assert res.returncode == 2 and "no.yaml" in error_line(res)

    over = tmp_path / "101.txt"
    over.write_text("y" * 101)
    res = run_cli("ask", "--file", str(over), env=env)
    assert res.returncode == 2
    assert "over the limit of 100" in error_line(res)

    huge = "y" * 5000  # more bytes than the limit allows: refused without reading it all
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "ask", "-"],
        input=huge,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        env={**os.environ, **env},
    )
    assert res.returncode == 2
    assert "the question in standard input is over the limit of 100" in error_line(res)


# -- Ctrl-C -------------------------------------------------------------------------


@pytest.mark.process
def test_ctrl_c_while_the_conductor_hangs_exits_130_and_keeps_the_record(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [Fault.hang()])
    pool = hang_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    proc = start_cli("ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), env=env)
    wait_for(lambda: bool(fake_server.requests_for(CONDUCTOR_MODEL)), "the Conductor call")
    _, out_text, err = interrupt(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert last_line(err) == (
        f"interrupted: the record of the steps done so far (0 finished calls) is in {out} "
        f"(conductor trace {out})"
    )
    record = json.loads(out.read_text())
    assert record["status"] == "failed"
    assert record["error"] == "the run was interrupted before it finished"
    (call,) = record["rounds"][0]["conductor_calls"]
    assert call["error_kind"] == "Interrupted" and call["response"] is None
    # The partial record is a record like any other.
    shown = run_cli("trace", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "interrupted before it finished" in shown.stdout


@pytest.mark.process
def test_ctrl_c_during_a_step_keeps_the_steps_done(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["Solve it", "Check step 0"], [[], [0]])])
    fake_server.script("first", ["ANSWER: 391"])
    fake_server.script("second", [Fault.hang()])
    pool = hang_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    proc = start_cli("ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), env=env)
    wait_for(lambda: bool(fake_server.requests_for("second")), "the hanging step")
    _, _, err = interrupt(proc)
    assert proc.returncode == 130, err
    assert "(2 finished calls)" in err and str(out) in err
    record = json.loads(out.read_text())
    steps = record["rounds"][0]["steps"]
    assert [(s["worker_id"], s["status"]) for s in steps] == [
        ("first", "ok"),
        ("second", "failed"),
    ]
    assert steps[0]["answer"] == "ANSWER: 391"
    assert steps[1]["call"]["error"] == "interrupted before it finished"
    assert record["final_answer"] is None and record["status"] == "failed"
    assert record["totals"]["calls"] == 3 and record["totals"]["failed_calls"] == 1


@pytest.mark.process
def test_ctrl_c_without_out_says_nothing_was_recorded_and_what_the_cache_keeps(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["Solve it", "Check"], [[], [0]])])
    fake_server.script("first", ["ANSWER: 391"])
    fake_server.script("second", [Fault.hang()])
    pool = hang_pool(tmp_path, fake_server)
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    proc = start_cli("ask", "What is 17 * 23?", "--pool", str(pool), env=env)
    wait_for(lambda: bool(fake_server.requests_for("second")), "the hanging step")
    _, _, err = interrupt(proc)
    assert proc.returncode == 130, err
    assert last_line(err) == (
        "interrupted: nothing was recorded (--out FILE keeps the record of the steps done); "
        "the 2 finished calls are in the call cache, and asking again reuses them"
    )
    # And so they are: asking again sends only the call that never finished.
    fake_server.script("second", ["ANSWER: 391, checked"])
    before = len(fake_server.requests)
    res = run_cli("ask", "What is 17 * 23?", "--pool", str(pool), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert [r.model for r in fake_server.requests[before:]] == ["second"]


def test_ctrl_c_in_a_command_without_its_own_handling_says_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import conductor.cli as cli
    import conductor.cli.pools as cli_pools

    def interrupted(name_or_path: str | None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_pools, "load_pool", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main(["pools", "check", "local"])
    assert info.value.code == 130
    assert capsys.readouterr().err.strip() == "interrupted"


# -- local generations --------------------------------------------------------------


def _embedded_model() -> Path:
    return embedded_model_or_skip()


@pytest.mark.process
def test_stop_all_ends_a_busy_host_at_once_and_fails_its_calls() -> None:
    from conductor.localmodel.models import get_host, stop_all

    stop_all()
    host = get_host(_embedded_model())
    future = host.submit(
        {"messages": [{"role": "user", "content": "Count from 1 to 500."}], "max_tokens": 500}
    )
    deadline = time.monotonic() + scaled(60)
    while not any(p.started for p in host._pending.values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = host.pid
    assert pid is not None
    stop_all(kill=True)  # as Ctrl-C does
    # The process is gone (not left generating 500 tokens), and the call says so.
    assert host._process is None or not host._process.alive
    with pytest.raises(Exception, match="closed|killed|stopped"):
        future.result(timeout=10)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.process
def test_a_call_cancelled_while_queued_never_generates(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from conductor.localmodel.models import get_host, stop_all

    stop_all()
    host = get_host(_embedded_model())
    messages = [{"role": "user", "content": "Count from 1 to 100."}]
    with caplog.at_level(logging.DEBUG, logger="conductor"):
        first = host.submit({"messages": messages, "max_tokens": 60}, label="first")
        queued = host.submit({"messages": messages, "max_tokens": 60}, label="queued")
        host.cancel(queued)
        assert first.result(timeout=scaled(120))["completion_tokens"] > 0
        with pytest.raises(Exception, match="cancelled"):
            queued.result(timeout=scaled(120))
    said = caplog.text
    assert "generating for 'first'" in said
    assert "generating for 'queued'" not in said  # it never started
    assert "cancelled before it started" in said
    stop_all()


@pytest.mark.slow
def test_ctrl_c_during_a_local_generation_exits_130_within_two_seconds(tmp_path: Path) -> None:
    _embedded_model()
    out = tmp_path / "run.json"
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    # --debug logs when a local generation starts; the Conductor's is the first.
    proc = start_cli("--debug", "ask", "What is 17 * 23?", "--out", str(out), env=env)
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if "generating for 'conductor'" in line:
            break
    else:
        raise AssertionError(f"no local generation started: {''.join(seen)}")
    time.sleep(0.3)  # well inside the generation (it takes seconds)
    took, _, err = interrupt(proc)
    assert proc.returncode == 130, err
    assert took < 2, f"exited {took:.2f} s after SIGINT"
    assert f"interrupted: the record of the steps done so far (0 finished calls) is in {out}" in err
    record = json.loads(out.read_text())
    assert record["error"] == "the run was interrupted before it finished"
