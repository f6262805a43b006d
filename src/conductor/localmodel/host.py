"""A local model's host process: one GGUF model, loaded and run in a child process.

``client: local`` models never run in the process that runs the orchestration.  Each
loaded model lives in a child, ``python -m conductor.localmodel.host``, that the parent
(:mod:`conductor.localmodel.models`) starts and talks to over its stdin and stdout.  A
native crash inside llama.cpp (a segfault, an instruction the CPU lacks, the
out-of-memory killer) then ends the child, not the run: the parent sees the child go
and turns it into one sentence (:class:`~conductor.errors.LocalModelCrashedError`).
The parent can also stop a generation at once by ending the child (``Ctrl-C``), and
the event loop never shares a core with Python code that samples tokens.

This module owns the wire format, one JSON object per line.  From the parent::

    {"op": "generate", "id": 7, "messages": [...], "sampling": {...},
     "max_tokens": 256, "grammar": "root ::= ...", "stop": ["\\n\\n"]}
    {"op": "embed", "id": 8, "texts": ["What is 17 * 23?", ...]}
    {"op": "cancel", "id": 7}

From the host, first one of ``ready`` / ``load_failed``, then for each request a
``started`` and one ``done`` or ``failed``::

    {"event": "ready", "runtime": "cyllama", "version": "0.2.18", "n_ctx": 4096,
     "extra_buffers": false, "system_info": "...", "load_s": 0.3}
    {"event": "load_failed", "kind": "missing" | "bad_file" | "usage", "message": "..."}
    {"event": "started", "id": 7}
    {"event": "done", "id": 7, "text": "...", "prompt_tokens": 80, ...}
    {"event": "done", "id": 8, "vectors": [[0.12, ...], ...], "tokens": [9, ...], ...}
    {"event": "failed", "id": 7, "kind": "cancelled" | "context" | "grammar" |
     "template" | "bad_request" | "internal", "message": "..."}

Requests run one at a time, in the order they came; a cancelled request that has not
started is answered ``failed``/``cancelled`` without running.  The host leaves when its
stdin closes (the parent left or is done with it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

from .runtime import SamplerSettings

__all__ = [
    "HostOptions",
    "decode",
    "encode",
    "host_command",
    "main",
    "resolve_extra_buffers",
    "sampler_settings",
]

#: Prompts a model's prompt cache keeps: the Conductor's preamble and a few workers'.
CACHED_PROMPTS = 4


@dataclass(frozen=True)
class HostOptions:
    """What a host process loads, and how."""

    path: str
    n_ctx: int
    n_threads: int
    n_gpu_layers: int = 0
    #: ``auto``, ``on`` or ``off`` (``CONDUCTOR_LOCAL_EXTRA_BUFFERS``).
    extra_buffers: str = "auto"
    #: The extra buffers crashed this model before on this machine (``auto`` then
    #: loads without them).
    extra_buffers_crashed: bool = False

    def argv(self) -> list[str]:
        args = [
            "--path",
            self.path,
            "--n-ctx",
            str(self.n_ctx),
            "--n-threads",
            str(self.n_threads),
            "--n-gpu-layers",
            str(self.n_gpu_layers),
            "--extra-buffers",
            self.extra_buffers,
        ]
        if self.extra_buffers_crashed:
            args.append("--extra-buffers-crashed")
        return args


def host_command(options: HostOptions) -> list[str]:
    """The command line that starts a host process for ``options``."""
    return [sys.executable, "-m", "conductor.localmodel.host", *options.argv()]


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line on the wire."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One line from the wire as a message; ``ValueError`` for anything else."""
    message = json.loads(line.decode("utf-8"))
    if not isinstance(message, dict):
        raise ValueError(f"not a message: {line[:80]!r}")
    return message


def resolve_extra_buffers(mode: str, *, has_amx: bool, crashed: bool) -> bool:
    """Whether a model loads with llama.cpp's extra CPU buffer types.

    ``on`` and ``off`` say so; ``auto`` uses them (repacked weights make prompts faster
    on many CPUs) except where they are known to crash: a build with llama.cpp's AMX
    kernels, whose matrix product segfaults on some Xeons (llama.cpp #20824), or a model
    they crashed before on this machine.  The embedded SmolLM2 file (Q4_1) has no tensor
    they repack on x86 without AMX, so for it ``auto`` costs nothing either way.
    """
    if mode == "on":
        return True
    if mode == "off":
        return False
    return not (has_amx or crashed)


@functools.cache
def _sampling_fields() -> frozenset[str]:
    return frozenset(f.name for f in fields(SamplerSettings))


def sampler_settings(values: dict[str, Any]) -> SamplerSettings:
    """A :class:`~conductor.localmodel.runtime.SamplerSettings` from a request's
    ``sampling`` object (unknown keys are ignored, ``logit_bias`` keys become ints)."""
    kept = {k: v for k, v in values.items() if k in _sampling_fields()}
    if "logit_bias" in kept:
        kept["logit_bias"] = {int(k): float(v) for k, v in dict(kept["logit_bias"]).items()}
    return SamplerSettings(**kept)


class _Wire:
    """The host's end: messages out on the protocol stream, one writer at a time."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        with self._lock:
            self._out.write(data)
            self._out.flush()


def _protocol_stream() -> IO[bytes]:
    """The stream messages go out on.  Native code may print to standard output (fd 1);
    the protocol moves to a copy of it and fd 1 is pointed at stderr, so nothing but
    messages ever reaches the parent's pipe."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(out_fd, "wb", buffering=0)


def _read_requests(
    source: IO[bytes],
    jobs: queue.Queue[dict[str, Any] | None],
    cancelled: set[int],
    lock: threading.Lock,
) -> None:
    """The reader thread: requests to the queue, cancellations to the set."""
    try:
        for line in source:
            try:
                message = decode(line)
            except ValueError:
                continue
            if message.get("op") == "cancel":
                with lock:
                    cancelled.add(int(message.get("id", -1)))
            else:
                jobs.put(message)
    finally:
        jobs.put(None)


def _failure_kind(exc: BaseException) -> str:
    from .generate import ContextOverflow, GenerationCancelled, TemplateError
    from .runtime import GrammarError

    if isinstance(exc, GenerationCancelled):
        return "cancelled"
    if isinstance(exc, ContextOverflow):
        return "context"
    if isinstance(exc, GrammarError):
        return "grammar"
    if isinstance(exc, TemplateError):
        return "template"
    if isinstance(exc, (ValueError, TypeError, UnicodeError)):
        return "bad_request"
    return "internal"


def _serve(generator: Any, wire: _Wire, source: IO[bytes]) -> None:
    jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
    cancelled: set[int] = set()
    lock = threading.Lock()
    threading.Thread(
        target=_read_requests, args=(source, jobs, cancelled, lock), daemon=True
    ).start()
    while True:
        job = jobs.get()
        if job is None:
            return
        request_id = int(job.get("id", -1))

        def is_cancelled(rid: int = request_id) -> bool:
            with lock:
                return rid in cancelled

        if is_cancelled():
            wire.send({"event": "failed", "id": request_id, "kind": "cancelled", "message": ""})
            continue
        wire.send({"event": "started", "id": request_id})
        try:
            result = _run(generator, job, is_cancelled)
        except Exception as exc:
            kind = _failure_kind(exc)
            if kind == "internal":
                traceback.print_exc()
            wire.send({"event": "failed", "id": request_id, "kind": kind, "message": str(exc)})
        else:
            wire.send({"event": "done", "id": request_id, **asdict(result)})
        finally:
            with lock:
                cancelled.discard(request_id)


def _run(generator: Any, job: dict[str, Any], cancelled: Any) -> Any:
    """What the request ``job`` asks of the model (a dataclass of results)."""
    op = job.get("op", "generate")
    if op == "embed":
        texts = job.get("texts")
        if not isinstance(texts, list):
            raise ValueError("an embed request has a list of texts")
        return generator.embed(texts, cancelled=cancelled)
    if op != "generate":
        raise ValueError(f"no operation {op!r} (generate, embed, cancel)")
    return generator.generate(
        job.get("messages") or [],
        sampler_settings(job.get("sampling") or {}),
        max_tokens=job.get("max_tokens"),
        grammar=job.get("grammar"),
        stop=tuple(job.get("stop") or ()),
        cancelled=cancelled,
    )


def _arguments(argv: Sequence[str] | None) -> HostOptions:
    parser = argparse.ArgumentParser(prog="python -m conductor.localmodel.host")
    parser.add_argument("--path", required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--n-threads", type=int, required=True)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--extra-buffers", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--extra-buffers-crashed", action="store_true")
    args = parser.parse_args(argv)
    return HostOptions(
        path=args.path,
        n_ctx=args.n_ctx,
        n_threads=args.n_threads,
        n_gpu_layers=args.n_gpu_layers,
        extra_buffers=args.extra_buffers,
        extra_buffers_crashed=args.extra_buffers_crashed,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Load the model, say ``ready`` (or ``load_failed``), then serve until stdin ends."""
    options = _arguments(argv)
    wire = _Wire(_protocol_stream())
    from ..errors import MissingDependencyError, UsageError
    from .generate import Generator, TemplateError
    from .runtime import LoadSettings
    from .runtimes import choose_runtime, load_runtime

    started = time.perf_counter()
    try:
        runtime = load_runtime(choose_runtime())
    except (MissingDependencyError, ImportError) as exc:
        wire.send({"event": "load_failed", "kind": "missing", "message": str(exc)})
        return 0
    except UsageError as exc:
        wire.send({"event": "load_failed", "kind": "usage", "message": str(exc)})
        return 0
    extra = resolve_extra_buffers(
        options.extra_buffers,
        has_amx=runtime.info.has_amx,
        crashed=options.extra_buffers_crashed,
    )
    settings = LoadSettings(
        path=options.path,
        n_ctx=options.n_ctx,
        n_threads=options.n_threads,
        n_gpu_layers=options.n_gpu_layers,
        extra_buffers=extra,
    )
    try:
        model = runtime.load(settings)
        generator = Generator(model, cached=CACHED_PROMPTS)
    except (ValueError, RuntimeError, OSError, TemplateError) as exc:
        wire.send({"event": "load_failed", "kind": "bad_file", "message": str(exc)})
        return 0
    wire.send(
        {
            "event": "ready",
            "runtime": runtime.info.name,
            "version": runtime.info.version,
            "system_info": runtime.info.system_info,
            "n_ctx": model.n_ctx,
            "extra_buffers": extra,
            "load_s": round(time.perf_counter() - started, 4),
        }
    )
    _serve(generator, wire, sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
