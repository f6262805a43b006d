"""How a local-model host process died, told in one sentence, and the crashes this
machine remembers.

A host that dies of a native crash while llama.cpp's extra CPU buffer types are on is
remembered (per model file and runtime, in ``<cache>/local-model-crashes.json``), so the
next run on this machine loads that model without them from the start
(:mod:`conductor.localmodel.models` restarts the host and asks here).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError, UsageError
from ..private import default_cache_dir
from ..redact import masked_json
from .runtime import EXTRA_BUFFERS_ENV
from .runtimes import RUNTIME_ENV, choose_runtime

logger = logging.getLogger("conductor")

# -- how a host died, in words -------------------------------------------------------

# Windows reports a crash as an NTSTATUS exit code.
_WINDOWS_CRASHES = {
    0xC0000005: "an access violation",
    0xC000001D: "an illegal instruction",
    0xC00000FD: "a stack overflow",
    0xC0000409: "a failed stack check",
}


def signal_name(returncode: int) -> str | None:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    if returncode >= 0xC0000000 and returncode in _WINDOWS_CRASHES:
        return _WINDOWS_CRASHES[returncode]
    return None


def _is_native_crash(returncode: int | None) -> bool:
    """Died of a fault in native code, not of being stopped or of running out of memory."""
    if returncode is None:
        return False
    name = signal_name(returncode)
    return name is not None and name not in ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP")


def extra_buffers_may_be_to_blame(returncode: int | None) -> bool:
    """A crash the extra buffer types can cause (a bad memory access or an abort in a
    repacked matrix product), not an instruction the CPU lacks: loading without them
    would only crash again."""
    return _is_native_crash(returncode) and signal_name(returncode or 0) not in (
        "SIGILL",
        "an illegal instruction",
    )


def crash_sentence(
    returncode: int | None,
    *,
    model: str,
    runtime: str | None,
    stderr: str,
    extra_buffers: bool = False,
) -> str:
    """What a user reads when a model's host process died: what happened, what to try.

    ``stderr`` is the host's last words (llama.cpp's error lines), shown clipped;
    ``extra_buffers`` says the host had llama.cpp's extra buffer types on.
    """
    name = signal_name(returncode) if returncode is not None else None
    where = f"the local model process for {model!r}" + (f" ({runtime})" if runtime else "")
    if name in ("SIGILL", "an illegal instruction"):
        if runtime == "llama-cpp-python":
            fix = (
                "llama-cpp-python was compiled for another CPU; compile it again here: "
                "pip install --force-reinstall --no-cache-dir llama-cpp-python"
            )
        else:
            fix = (
                "cyllama's wheels need a CPU with AVX2; on an older CPU install "
                "llama-cpp-python, which compiles for the CPU it is installed on (pip "
                f"install llama-cpp-python), and set {RUNTIME_ENV}=llama-cpp-python"
            )
        what = f"{where} stopped on an instruction this CPU does not have ({name}): {fix}"
    elif name == "SIGKILL":
        what = (
            f"{where} was killed (SIGKILL), most often by the system's out-of-memory killer: "
            "free memory, or use a smaller model or n_ctx"
        )
    elif name is not None and _is_native_crash(returncode):
        tries = [f"{EXTRA_BUFFERS_ENV}=off"] if extra_buffers else []
        tries += ["n_gpu_layers: 0", "a smaller n_ctx"]
        other = {"cyllama": "llama-cpp-python", "llama-cpp-python": "cyllama"}.get(runtime or "")
        if other:
            tries.append(f"the other runtime ({RUNTIME_ENV}={other})")
        what = f"{where} crashed inside llama.cpp ({name}); try " + ", ".join(tries[:-1])
        what += f" or {tries[-1]}"
    elif name is not None:
        what = f"{where} was stopped ({name})"
    else:
        what = f"{where} exited unexpectedly (exit code {returncode})"
    tail = " | ".join(line for line in stderr.strip().splitlines()[-3:] if line.strip())
    if tail:
        what += f"; its last words: {tail[-300:]}"
    return what


# -- remembered crashes ------------------------------------------------------------


def crash_file() -> Path:
    return default_cache_dir() / "local-model-crashes.json"


def _crash_key(path: str) -> str:
    """The model file (by path, size and time) and the runtime (by version) that would
    run it now: a crash is remembered for that pair only."""
    from .runtimes import runtime_version

    try:
        stat = os.stat(path)
        identity = f"{path}|{stat.st_size}|{int(stat.st_mtime)}"
    except OSError:
        identity = path
    try:
        runtime = choose_runtime()
        version = runtime_version(runtime)
    except (MissingDependencyError, UsageError):
        runtime, version = "?", "?"
    digest = hashlib.sha256(identity.encode("utf-8", errors="replace")).hexdigest()[:16]
    return f"{runtime} {version} {digest}"


def _known_crashes() -> dict[str, Any]:
    try:
        known = json.loads(crash_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def crashed_before(path: str) -> bool:
    """Whether the extra buffers crashed ``path`` before on this machine, with the
    runtime that would run it now."""
    return _crash_key(path) in _known_crashes()


def remember_crash(path: str, what: str) -> None:
    known = _known_crashes()
    known[_crash_key(path)] = {
        "path": path,
        "crash": what,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    file = crash_file()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        # A model path may have come from the environment: masked like every writer's.
        tmp.write_text(masked_json(known, indent=1), encoding="utf-8")
        os.replace(tmp, file)
    except OSError as exc:  # a read-only cache: the fallback still holds for this run
        logger.debug("cannot remember the local model crash in %s: %s", file, exc)
