"""`conductor pools check` as a user runs it: every missing key named before any
request (in ask's words), and each model's result shown as it comes: live rows on a
terminal, one plain line each when piped."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, run_cli, worker, write_pool

from conductor.testing import FakeLLMServer, Reply

# Every test here starts a child process.
pytestmark = pytest.mark.process


def slow_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    """w0 and the Conductor answer at once; w1 takes two seconds."""
    server.script("w0", ["ready"])
    server.script(CONDUCTOR_MODEL, ["ready"])
    server.script("w1", [Reply("ready, slowly", latency_s=2.0)])
    workers = [worker(server, "w0"), worker(server, "w1")]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


def test_missing_keys_are_named_up_front_in_asks_words(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    hosted = worker(fake_server, "hosted", api_key_env="H18_UNSET_KEY_A")
    del hosted["api_base"]  # a hosted model: its key must be set
    other = worker(fake_server, "other", api_key_env="H18_UNSET_KEY_B")
    del other["api_base"]
    pool = write_pool(
        tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0"), hosted, other])
    )
    checked = run_cli("pools", "check", str(pool))
    asked = run_cli("ask", "2 + 2?", "--pool", str(pool))
    assert checked.returncode == asked.returncode == 2, checked.stderr
    said = " ".join(checked.stderr.split())
    assert said.startswith(
        "error: 2 API keys are not set, so nothing was sent: set H18_UNSET_KEY_A (for worker "
        "'hosted') and H18_UNSET_KEY_B (for worker 'other')"
    ), said
    assert said == " ".join(asked.stderr.split())
    assert checked.stdout == ""  # no table of failures
    assert fake_server.requests == []  # not even the workers whose keys are fine


def test_piped_each_model_is_a_line_as_soon_as_it_answers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = slow_pool(tmp_path, fake_server)
    gate = threading.Event()

    async def w1(_request: object) -> Reply:
        while not gate.is_set():  # w1 answers only once the test has read two lines
            await asyncio.sleep(0.02)
        return Reply("ready, at last")

    fake_server.script("w1", w1)
    child = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor", "pools", "check", str(pool)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child,
    )
    assert proc.stdout is not None
    try:
        first = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        gate.set()
    rest, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 0, err
    # The two quick models, each on its line, while w1 had not answered yet.
    assert sorted(line.split("  ")[1] for line in first) == ["conductor", "w0"], first
    for line in first:
        assert re.fullmatch(r"(Model 0  w0|Conductor  conductor)  ok  \d+\.\d\d s  'ready'\n", line)
    *_, w1_line, summary = rest.splitlines()
    assert w1_line.startswith("Model 1  w1  ok  ") and w1_line.endswith("'ready, at last'")
    assert summary == "3 of 3 models answered"


def test_on_a_terminal_the_rows_fill_in_as_results_come(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = slow_pool(tmp_path, fake_server)
    main, sub = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor", "pools", "check", str(pool)],
        stdout=sub,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(sub)
    seen = b""
    deadline = time.monotonic() + scaled(60)  # a hang guard, not a speed bound
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(scaled(60)) == 0, proc.stderr.read() if proc.stderr else ""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode("utf-8", "replace"))
    # A frame while w1 was still out, then the last one with every result.
    waiting = [line for line in text.splitlines() if "w1" in line and "waiting" in line]
    assert waiting, text
    final = text[text.rindex("one tiny request per model") :]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"(w0|w1|conductor)\s+│\s+(\w+)", final)}
    assert rows == {"w0": "ok", "w1": "ok", "conductor": "ok"}, final
    assert "3 of 3 models answered" in final
