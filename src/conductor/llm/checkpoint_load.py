"""Where a Conductor checkpoint is, and loading it once per process.

``resolve_checkpoint_dir`` turns a checkpoint directory or ``hf:ORG/NAME[@REVISION]``
into a local directory; :func:`get_loaded_checkpoint` loads it with vLLM or
transformers (see :mod:`conductor.llm.checkpoint_client` for which and why) into a
process-wide registry, so that every client naming the same directory (with the same
engine, dtype and device) shares one loaded copy.  torch, transformers, vLLM and
huggingface_hub are imported only when a checkpoint is first resolved or loaded.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadRequestError, MissingDependencyError, UsageError, install_hint

__all__ = [
    "INSTALL_HINT",
    "LoadedCheckpoint",
    "choose_engine",
    "get_loaded_checkpoint",
    "importable",
    "loaded_checkpoints",
    "require_torch_transformers",
    "resolve_checkpoint_dir",
    "unload_all",
]

INSTALL_HINT = install_hint("checkpoint")
_DTYPES = ("bfloat16", "float16", "float32")
# ORG/NAME as the Hub allows it, plus an optional @REVISION (branch, tag or commit).
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class LoadedCheckpoint:
    """One loaded model, shared by every client on the same directory and settings."""

    path: Path
    engine: str  # "transformers" | "vllm"
    dtype: str
    device: str
    model: Any  # transformers model or vllm.LLM
    tokenizer: Any
    lock: threading.Lock = field(default_factory=threading.Lock)


_REGISTRY: dict[tuple[str, str, str, str], LoadedCheckpoint] = {}
_REGISTRY_LOCK = threading.Lock()
# One lock per registry key, so two clients asking for one model load it once while
# loads of different models do not wait on each other.
_LOAD_LOCKS: dict[tuple[str, str, str, str], threading.Lock] = {}


def require_torch_transformers() -> tuple[Any, Any]:
    """Import torch and transformers, or raise a one-sentence install hint."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            f"running a checkpoint Conductor needs torch and transformers: {INSTALL_HINT}"
        ) from exc
    return torch, transformers


def importable(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (torch takes seconds)."""
    # sys.modules[name] = None marks a module as disabled; find_spec would raise on it.
    if name in sys.modules:
        return sys.modules[name] is not None
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _vllm_available() -> bool:
    return importable("vllm")


def _cpu_has_bf16() -> bool:
    """Whether the CPU has native bf16 arithmetic (AVX512-BF16 or AMX), Linux only."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def choose_engine(params: dict[str, Any], torch: Any) -> tuple[str, str, str]:
    """(engine, dtype, device) for a request's load options and this machine."""
    cuda = bool(torch.cuda.is_available())
    device = str(params.get("device") or ("cuda" if cuda else "cpu"))
    engine = str(params.get("engine") or "")
    if engine not in ("", "transformers", "vllm"):
        raise BadRequestError(
            f"unknown checkpoint engine {engine!r} (expected transformers or vllm)",
            target="conductor",
        )
    if not engine:
        engine = (
            "vllm" if cuda and device.startswith("cuda") and _vllm_available() else "transformers"
        )
    dtype = str(params.get("dtype") or "")
    if dtype and dtype not in _DTYPES:
        raise BadRequestError(
            f"unknown dtype {dtype!r} (expected one of {', '.join(_DTYPES)})",
            target="conductor",
        )
    if not dtype:
        if device.startswith("cuda"):
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = "bfloat16" if _cpu_has_bf16() else "float32"
    return engine, dtype, device


def _dtype_kwarg(transformers: Any) -> str:
    # transformers renamed from_pretrained's torch_dtype to dtype in 4.56.
    match = re.match(r"(\d+)\.(\d+)", transformers.__version__)
    major, minor = (int(match.group(1)), int(match.group(2))) if match else (5, 0)
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def _load(path: Path, engine: str, dtype: str, device: str) -> LoadedCheckpoint:
    if engine == "vllm":
        try:
            from vllm import LLM
        except ImportError as exc:
            raise MissingDependencyError(
                "engine vllm was requested but vLLM is not installed: pip install vllm"
            ) from exc
        llm = LLM(model=str(path), dtype=dtype)
        return LoadedCheckpoint(path, engine, dtype, device, llm, llm.get_tokenizer())

    torch, transformers = require_torch_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_logging = transformers.utils.logging
    # Nothing below the CLI prints: silence the weight-loading progress bar.
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(str(path))
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(path), **{_dtype_kwarg(transformers): getattr(torch, dtype)}
        )
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"checkpoint {path} cannot be loaded by transformers: {first}") from exc
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    model.to(device)
    model.eval()
    return LoadedCheckpoint(path, engine, dtype, device, model, tokenizer)


def get_loaded_checkpoint(path: Path, engine: str, dtype: str, device: str) -> LoadedCheckpoint:
    """The shared loaded model for these settings, loading it on first use (blocking)."""
    key = (str(Path(path).resolve()), engine, dtype, device)
    with _REGISTRY_LOCK:
        entry = _REGISTRY.get(key)
        if entry is not None:
            return entry
        load_lock = _LOAD_LOCKS.setdefault(key, threading.Lock())
    with load_lock:
        with _REGISTRY_LOCK:
            entry = _REGISTRY.get(key)
        if entry is None:
            entry = _load(Path(key[0]), engine, dtype, device)
            with _REGISTRY_LOCK:
                _REGISTRY[key] = entry
        return entry


def loaded_checkpoints() -> list[LoadedCheckpoint]:
    """The models loaded in this process."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def unload_all() -> None:
    """Forget every loaded model (they are freed once no client holds them)."""
    with _REGISTRY_LOCK:
        _REGISTRY.clear()
        _LOAD_LOCKS.clear()


def resolve_checkpoint_dir(spec: str) -> Path:
    """The local directory of checkpoint ``spec``: a directory, or ``hf:ORG/NAME[@REV]``.

    A Hub id is fetched with ``huggingface_hub.snapshot_download`` (imported only here),
    which reads the local Hugging Face cache only when ``HF_HUB_OFFLINE=1``.  Failures
    raise :class:`~conductor.errors.UsageError` naming the id.
    """
    spec = spec.strip()
    if not spec.startswith("hf:"):
        path = Path(spec).expanduser()
        if not path.is_dir():
            raise UsageError(f"checkpoint directory {spec!r} does not exist")
        return path.resolve()

    ident = spec[3:].strip()
    repo_id, _, revision = ident.partition("@")
    if not _HF_ID.match(repo_id) or (revision == "" and "@" in ident):
        raise UsageError(
            f"checkpoint {spec!r} is not a Hugging Face id: use hf:ORG/NAME or hf:ORG/NAME@REVISION"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise MissingDependencyError(
            f"loading hf: checkpoints needs huggingface_hub: {INSTALL_HINT}"
        ) from exc
    try:
        local = snapshot_download(repo_id=repo_id, revision=revision or None)
    except Exception as exc:  # the Hub raises many error types; all mean "not available"
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes"}
        why = (
            "it is not in the local Hugging Face cache and HF_HUB_OFFLINE is set "
            "(unset it to download, or run `hf download "
            f"{repo_id}` where there is network)"
            if offline
            else "it is not in the local Hugging Face cache and cannot be downloaded"
        )
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"checkpoint hf:{ident}: {why} ({detail})") from exc
    return Path(local)
