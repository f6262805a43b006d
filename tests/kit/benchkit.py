"""Builders for ``conductor bench`` runs against a FakeLLMServer: synthetic MATH files,
workers that answer them, the pool and the command line (shared by several test files)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from conductor.testing import FakeLLMServer
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, worker, write_pool

_QUESTION = re.compile(r"What is (\d+) \+ 0\?")


def make_math_file(path: Path, n: int) -> Path:
    """``n`` synthetic MATH-style items whose answer is the item's number (ids
    ``test/synthetic/I.json``, with a subject and level)."""
    with path.open("w") as fh:
        for i in range(n):
            item = {
                "problem": f"What is {i} + 0?",
                "answer": str(i),
                "subject": "Algebra",
                "level": 1,
                "unique_id": f"test/synthetic/{i}.json",
            }
            fh.write(json.dumps(item) + "\n")
    return path


def make_math(path: Path, n: int) -> Path:
    """The same questions as :func:`make_math_file` in the fewest columns (ids
    ``synthetic/I.json``)."""
    rows = [
        {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"synthetic/{i}.json"}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def number_in(request: Any) -> int:
    """The number a synthetic question asks about; fails the test if there is none."""
    m = _QUESTION.search(request.messages[-1]["content"])
    assert m, request.messages[-1]["content"][:200]
    return int(m.group(1))


def boxed_number(request: object) -> str:
    """The right answer to a synthetic question, boxed (``\\boxed{-1}`` when the
    request asks none)."""
    m = _QUESTION.search(request.messages[-1]["content"])  # type: ignore[attr-defined]
    return f"\\boxed{{{m.group(1) if m else -1}}}"


def script_math(server: FakeLLMServer) -> None:
    """w0 is right on every item, w1 only on even ones; the Conductor routes to w0."""
    server.script(CONDUCTOR_MODEL, [lists([0], ["Solve the problem."], [[]])])
    server.script("w0", lambda r: f"Easy. \\boxed{{{number_in(r)}}}")
    server.script("w1", lambda r: f"\\boxed{{{number_in(r) if number_in(r) % 2 == 0 else -1}}}")


def bench_pool(tmp_path: Path, server: FakeLLMServer, n: int = 2) -> Path:
    """``pool.yaml`` in ``tmp_path``: workers ``w0``.. ``w{n-1}`` on ``server``."""
    workers = [worker(server, f"w{i}") for i in range(n)]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of ``samples.jsonl`` as JSON, strictly (a torn or garbled line fails
    the test), but for blank lines: they are nothing in the format, and processes that
    share a run with ``--state`` start each record with one (runs/rundir.py)."""
    text = (run_dir / "samples.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line]


def cli(*args: str, cache: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``conductor ARGS`` in a child process with its own cache, at 120 columns."""
    return run_cli(*args, env={"CONDUCTOR_CACHE_DIR": str(cache)}, timeout=timeout, columns=120)
