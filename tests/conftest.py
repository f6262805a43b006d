"""Shared fixtures: offline environment, a fresh cache directory, the fake LLM server."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Set before any test module imports litellm / huggingface libraries, so nothing reaches
# the network and no user cache is touched.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# numpy's OpenBLAS starts a thread per core for each product: beside the other pytest-xdist
# workers (one per core) those threads only wait on each other (the router tests took
# twice the CPU time with them on a busy two-core machine).  Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="conductor-test-cache-")
os.environ["CONDUCTOR_CACHE_DIR"] = _SESSION_CACHE.name

from conductor.redact import SECRETS  # noqa: E402
from conductor.testing import FakeLLMServer  # noqa: E402

# Tests that run native code (the real model, torch) run in child processes, so that a
# crash there fails one test and the run goes on to its summary (tests/kit/isolation.py);
# a test that starts a child process and is not marked ``process`` fails
# (tests/kit/processes.py), so that the fast subset stays fast.
pytest_plugins = ["kit.isolation", "kit.processes"]


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """Each test starts with no secret values held: those a test's pools took from the
    environment (conductor.redact.SECRETS, one per process) would otherwise be masked
    in every later test's output."""
    yield
    SECRETS.forget()


@pytest.fixture
def fake_server() -> Iterator[FakeLLMServer]:
    """A started fake OpenAI/Anthropic/Gemini server with empty scripts and log."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory, exported as CONDUCTOR_CACHE_DIR for this test."""
    path = tmp_path / "cache"
    path.mkdir()
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(path))
    return path
