"""The real `conductor` command, run as a subprocess against the fake provider server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.testing import FakeLLMServer, Fault

SECRET = "sk-test-SECRET-0123456789abcdef"


def conductor(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "conductor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def four_client_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    workers = [
        worker(server, "via-litellm", "litellm", api_key_env="FAKE_KEY"),
        worker(server, "via-openai", "openai", api_key_env="FAKE_KEY"),
        worker(server, "via-anthropic", "anthropic", api_key_env="FAKE_KEY"),
        worker(server, "via-google", "google", api_key_env="FAKE_KEY"),
    ]
    data = pool_dict(server, workers, api_key_env="FAKE_KEY")
    return write_pool(tmp_path / "pool.yaml", data)


def test_ask_end_to_end_with_every_client(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.expected_api_key = SECRET
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            lists(
                [0, 1, 2, 3],
                ["Try it", "Try it too", "And you", "Pick the best and answer"],
                [[], [], [], ["all"]],
            )
        ],
    )
    for wid in ("via-litellm", "via-openai", "via-anthropic"):
        fake_server.script(wid, [f"{wid} says 391"])
    fake_server.script("via-google", ["ANSWER: 391"])
    pool = four_client_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    cache = tmp_path / "cache"
    env = {"FAKE_KEY": SECRET, "CONDUCTOR_CACHE_DIR": str(cache)}
    res = conductor("ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr
    # Topology, step table and answer are all shown.
    assert "parallel" in res.stdout
    for wid in ("via-litellm", "via-openai", "via-anthropic", "via-google"):
        assert wid in res.stdout
    assert "ANSWER: 391" in res.stdout
    protocols = {r.protocol for r in fake_server.requests}
    assert protocols == {"openai", "anthropic", "gemini"}
    assert all(r.api_key == SECRET for r in fake_server.requests)

    record = json.loads(out.read_text())
    assert record["schema_version"] == 1
    assert record["final_answer"] == "ANSWER: 391"
    assert [s["worker_id"] for s in record["rounds"][0]["steps"]] == [
        "via-litellm",
        "via-openai",
        "via-anthropic",
        "via-google",
    ]
    assert all(s["call"]["input_tokens"] > 0 for s in record["rounds"][0]["steps"])

    # The rerun is answered entirely from the cache: no HTTP request at all.
    before = len(fake_server.requests)
    again = conductor("ask", "What is 17 * 23?", "--pool", str(pool), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert len(fake_server.requests) == before
    rerun = json.loads(again.stdout)
    assert rerun["totals"]["cached_calls"] == rerun["totals"]["calls"] == 5

    # No secret in any file written: the record, the cache, or the output.
    written = [p for p in [out, *cache.rglob("*")] if p.is_file()]
    assert written
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in res.stdout + res.stderr + again.stdout + again.stderr

    # trace renders the record in every format.
    for fmt in ("table", "tree", "mermaid", "json"):
        shown = conductor("trace", str(out), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        assert "via-google" in shown.stdout
    assert "flowchart" in conductor("trace", str(out), "--format", "mermaid").stdout


def test_ask_debug_logs_hold_no_secret(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    fake_server.script("via-openai", [Fault(401, "Incorrect API key provided")])
    pool = four_client_pool(tmp_path, fake_server)
    env = {"FAKE_KEY": SECRET, "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    res = conductor(
        "--debug", "ask", "q", "--pool", str(pool), "--out", str(tmp_path / "r.json"), env=env
    )
    assert res.returncode == 1
    assert SECRET not in res.stdout + res.stderr
    assert SECRET not in (tmp_path / "r.json").read_text()


def test_auth_failure_exits_1_with_clear_message(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    fake_server.script("via-openai", [Fault(401, "Incorrect API key provided")])
    pool = four_client_pool(tmp_path, fake_server)
    res = conductor("ask", "q", "--pool", str(pool), "--no-cache", env={"FAKE_KEY": "k"})
    assert res.returncode == 1
    text = " ".join((res.stdout + res.stderr).split())
    assert "via-openai" in text and "401" in text and "Incorrect API key provided" in text
    assert len(fake_server.requests_for("via-openai")) == 1  # not retried
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("yaml_text", "needle", "line"),
    [
        ("name: x\nworkers:\n  - id: a\n    modle: openai/gpt-5\n", 'did you mean "model"', 4),
        ("workers:\n  - id: a\n    model: m\n  - id: a\n    model: m\n", "duplicate", 4),
        ("workers: [\n", "", None),
    ],
)
def test_bad_pool_exits_2_with_file_and_line(
    tmp_path: Path, yaml_text: str, needle: str, line: int | None
) -> None:
    pool = tmp_path / "bad.yaml"
    pool.write_text(yaml_text)
    res = conductor("ask", "q", "--pool", str(pool))
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert str(pool) in err
    if line is not None:
        assert f"{pool}:{line}:" in err
    assert needle in err
    assert "Traceback" not in res.stderr


def test_unknown_pool_name_exits_2() -> None:
    res = conductor("ask", "q", "--pool", "no-such-pool")
    assert res.returncode == 2
    assert "no-such-pool" in res.stderr


def test_help_is_fast_and_does_not_import_litellm() -> None:
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('litellm', 'openai', 'anthropic', 'google.genai', 'llama_cpp')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in res.stdout, res.stdout
    assert "ask" in res.stdout and "trace" in res.stdout


def test_trace_of_a_bad_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    res = conductor("trace", str(bad))
    assert res.returncode == 2
    assert f"{bad}:1" in res.stderr


def test_pools_list_and_show() -> None:
    res = conductor("pools", "list")
    assert res.returncode == 0, res.stderr
    for name in ("frontier", "paper", "open", "local"):
        assert name in res.stdout
    shown = conductor("pools", "show", "paper")
    assert shown.returncode == 0, shown.stderr
    assert "Model 6" in shown.stdout


def test_pools_check_reports_latency_and_errors(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("via-anthropic", [Fault(401, "invalid x-api-key")])
    pool = four_client_pool(tmp_path, fake_server)
    res = conductor("pools", "check", str(pool), env={"FAKE_KEY": "k"})
    assert res.returncode == 1
    out = " ".join(res.stdout.split())
    assert "ok" in out and "invalid x-api-key" in out
    assert {r.model for r in fake_server.requests} >= {"via-openai", "via-google", CONDUCTOR_MODEL}


def test_cache_stats_and_clear(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    pool = four_client_pool(tmp_path, fake_server)
    env = {"FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(tmp_path / "cc")}
    assert conductor("ask", "q", "--pool", str(pool), env=env).returncode == 0
    stats = conductor("cache", "stats", env=env)
    assert "entries:   2" in stats.stdout
    assert "removed 0" in conductor("cache", "clear", "--older-than", "7d", env=env).stdout
    assert "removed 2" in conductor("cache", "clear", env=env).stdout
    bad = conductor("cache", "clear", "--older-than", "soon", env=env)
    assert bad.returncode == 2
