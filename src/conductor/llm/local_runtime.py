"""The seam between the local-model code and the llama.cpp binding that runs it.

Two Python bindings of llama.cpp can run ``client: local`` models, each behind one small
adapter module with the same face (:class:`Runtime` -> :class:`NativeModel` ->
:class:`NativeSampler`):

- ``cyllama`` (:mod:`conductor.llm.local_runtime_cyllama`): binary wheels on PyPI for
  Linux x86-64, macOS on Apple silicon and Windows, installed in seconds.  Its CPU build
  is portable (``GGML_NATIVE=OFF``: AVX2, no AVX-512 or AMX code), which also keeps it
  clear of llama.cpp's AMX matrix kernels that crash on some Xeons (llama.cpp issue
  #20824).  The default where it is installed.
- ``llama-cpp-python`` (:mod:`conductor.llm.local_runtime_llama_cpp`): built from source
  for the machine it is installed on (minutes of compiling), so it runs where no
  cyllama wheel exists (Linux on Arm, CPUs without AVX2) and with GPU builds.

Only the low-level, llama.h-shaped part of each binding is used: load a model, tokenize,
evaluate a batch, sample from a chain.  Everything above that (chat templates, the
prompt cache, stop strings, usage) is written once, in
:mod:`conductor.llm.local_generate`, so both runtimes behave the same.

``CONDUCTOR_LOCAL_RUNTIME`` picks one by name when both are installed; the choice is
made in the model's host process (:mod:`conductor.llm.local_host`), never in the
process that runs the orchestration.
"""

from __future__ import annotations

import collections
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..errors import MissingDependencyError, UsageError, install_hint

__all__ = [
    "EMBED_TOKENS",
    "EXTRA_BUFFERS_ENV",
    "RUNTIMES",
    "RUNTIME_ENV",
    "ExtraBuffers",
    "GrammarError",
    "LoadSettings",
    "LogCatcher",
    "NativeModel",
    "NativeSampler",
    "Runtime",
    "RuntimeInfo",
    "SamplerLink",
    "SamplerSettings",
    "check_embeddable",
    "choose_runtime",
    "embedding_context_params",
    "extra_buffers_setting",
    "installed_runtimes",
    "load_runtime",
    "mean_rows",
    "runtime_version",
    "sampler_links",
    "usable_cores",
]

#: The most tokens one :meth:`NativeModel.embed` reads: the size of the embedding
#: context (a context of its own, so the generation's memory and prompt cache are left
#: as they were).
EMBED_TOKENS = 512

#: Names a runtime: ``cyllama`` or ``llama-cpp-python``.
RUNTIME_ENV = "CONDUCTOR_LOCAL_RUNTIME"
#: ``auto`` (the default), ``on`` or ``off``: llama.cpp's extra CPU buffer types.
EXTRA_BUFFERS_ENV = "CONDUCTOR_LOCAL_EXTRA_BUFFERS"


class GrammarError(ValueError):
    """llama.cpp could not parse a request's GBNF grammar."""


class LogCatcher:
    """llama.cpp's log, caught for a runtime adapter: error lines are written to stderr
    (a host's stderr reaches its parent, which quotes it when something fails) and the
    latest kept, for the adapter to tell a call that failed (a grammar llama.cpp could not
    parse, a model it could not load) from one that did not."""

    #: ggml's GGML_LOG_LEVEL_ERROR; the other levels are dropped.
    ERROR = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: collections.deque[str] = collections.deque(maxlen=16)

    def line(self, level: int, text: str) -> None:
        """One log line from llama.cpp (it may come from any thread)."""
        if level != self.ERROR or not text:
            return
        with self._lock:
            self._errors.append(text.strip())
        sys.stderr.write(text)

    def take(self) -> list[str]:
        """The error lines since the last call, oldest first."""
        with self._lock:
            taken = list(self._errors)
            self._errors.clear()
        return taken


@dataclass(frozen=True)
class LoadSettings:
    """How a model file is loaded.

    ``extra_buffers`` turns on llama.cpp's extra CPU buffer types (weights repacked for
    the CPU's matrix instructions, the AMX buffer on Xeons that have it); see
    :func:`conductor.llm.local_host.resolve_extra_buffers` for when they are used.
    """

    path: str
    n_ctx: int
    n_threads: int
    n_gpu_layers: int = 0
    extra_buffers: bool = False
    n_batch: int = 512
    #: Off, as llama-cpp-python's ``Llama`` has it, so that replies match it token for
    #: token (tests/test_local_runtimes.py); on SmolLM2 on a CPU neither setting was
    #: faster beyond the noise.  None lets llama.cpp decide.
    flash_attention: bool | None = False

    @property
    def flash_attention_type(self) -> int:
        """llama.h's ``llama_flash_attn_type``: -1 auto, 0 disabled, 1 enabled."""
        return -1 if self.flash_attention is None else int(self.flash_attention)


@dataclass(frozen=True)
class SamplerSettings:
    """The sampling settings of one generation, with llama-cpp-python's defaults for a
    chat completion (so a pool tuned for it samples the same way)."""

    temperature: float = 0.2
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = 0
    logit_bias: dict[int, float] = field(default_factory=dict)


#: One link of a sampler chain: its name and its arguments, in the order llama.cpp's
#: ``llama_sampler_init_*`` functions take them.
SamplerLink = tuple[str, tuple[object, ...]]


def sampler_links(settings: SamplerSettings, grammar: str | None) -> list[SamplerLink]:
    """The sampler chain for ``settings``, in order, for every runtime to build alike.

    The order is llama-cpp-python's for a chat completion: logit bias, penalties, the
    grammar (applied to every candidate, so the grammar has the last word before any
    cut), then greedy decoding at temperature 0, or top-k, typical, top-p, min-p,
    temperature and a seeded draw (or one of the mirostat samplers).
    """
    links: list[SamplerLink] = []
    if settings.logit_bias:
        links.append(("logit_bias", (dict(settings.logit_bias),)))
    if (
        settings.repeat_penalty != 1.0
        or settings.frequency_penalty != 0.0
        or settings.presence_penalty != 0.0
    ):
        links.append(
            (
                "penalties",
                (
                    settings.penalty_last_n,
                    settings.repeat_penalty,
                    settings.frequency_penalty,
                    settings.presence_penalty,
                ),
            )
        )
    if grammar is not None:
        links.append(("grammar", (grammar, "root")))
    seed = settings.seed & 0xFFFFFFFF
    if settings.temperature < 0:
        links.append(("dist", (seed,)))
    elif settings.temperature == 0:
        links.append(("greedy", ()))
    elif settings.mirostat_mode == 1:
        links.append(("temp", (settings.temperature,)))
        links.append(("mirostat", (seed, settings.mirostat_tau, settings.mirostat_eta, 100)))
    elif settings.mirostat_mode == 2:
        links.append(("temp", (settings.temperature,)))
        links.append(("mirostat_v2", (seed, settings.mirostat_tau, settings.mirostat_eta)))
    else:
        links.append(("top_k", (settings.top_k,)))
        links.append(("typical", (settings.typical_p, 1)))
        links.append(("top_p", (settings.top_p, 1)))
        links.append(("min_p", (settings.min_p, 1)))
        links.append(("temp", (settings.temperature,)))
        links.append(("dist", (seed,)))
    return links


class NativeSampler(Protocol):
    """A sampler chain bound to one model's context."""

    def sample(self) -> int:
        """Draw the next token from the last evaluated position and accept it."""
        ...

    def close(self) -> None: ...


class NativeModel(Protocol):
    """A loaded model with one context of a runtime: one sequence of up to ``n_ctx``
    positions, which can be saved and restored (the prompt cache keeps other prompts
    that way, :mod:`conductor.llm.local_generate`)."""

    @property
    def n_ctx(self) -> int: ...

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text (``tokenizer.chat_template``, ...), or None."""
        ...

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        """Tokens of ``text``, special tokens (``<|im_start|>``) parsed as such."""
        ...

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (special tokens left out), bytes split across
        tokens joined before decoding."""
        ...

    def token_text(self, token: int) -> str:
        """One token's text, special tokens included (``<s>``, ``</s>``)."""
        ...

    @property
    def bos_token(self) -> int:
        """The beginning-of-sequence token, or -1."""
        ...

    @property
    def eos_token(self) -> int:
        """The end-of-sequence token, or -1."""
        ...

    def is_end_of_generation(self, token: int) -> bool: ...

    def keep(self, n: int) -> bool:
        """Forget the positions from ``n`` on; False when the model's memory cannot be
        cut there (then the caller clears it)."""
        ...

    def clear(self) -> None:
        """Forget every position."""
        ...

    def evaluate(self, tokens: list[int], pos: int) -> None:
        """Evaluate ``tokens`` at positions ``pos``, ``pos + 1``, ...; the next
        :meth:`NativeSampler.sample` draws from the last one."""
        ...

    def save(self) -> bytes:
        """What the memory holds (every position's keys and values), for :meth:`restore`."""
        ...

    def restore(self, state: bytes) -> bool:
        """Make the (empty) memory hold what :meth:`save` returned; False when the
        runtime refuses it (then the memory is empty)."""
        ...

    def sampler(self, links: list[SamplerLink]) -> NativeSampler:
        """A new sampler chain; raises :class:`GrammarError` for a grammar llama.cpp
        cannot parse."""
        ...

    def embed(self, tokens: list[int]) -> list[float]:
        """The mean over ``tokens`` (1 to :data:`EMBED_TOKENS` of them, read from
        position 0) of the last layer's hidden state, after the output norm: what the
        model's head reads to choose the next token.  Runs in a context of its own."""
        ...

    def close(self) -> None: ...


def check_embeddable(tokens: list[int]) -> None:
    """A ``ValueError`` unless ``tokens`` fit the embedding batch: 1 to
    :data:`EMBED_TOKENS` of them (more would be written past the batch's end)."""
    if not 0 < len(tokens) <= EMBED_TOKENS:
        raise ValueError(f"embed reads 1 to {EMBED_TOKENS} tokens, not {len(tokens)}")


def embedding_context_params(params: Any, settings: LoadSettings) -> Any:
    """``params`` (either binding's context parameters: the same llama.h fields) set for
    the embedding context: :data:`EMBED_TOKENS` read in one batch, every token's hidden
    state kept (pooling none: :func:`mean_rows` pools them alike on every runtime)."""
    params.n_ctx = params.n_batch = params.n_ubatch = EMBED_TOKENS
    # Reading a text in one batch is bound by arithmetic, not memory bandwidth as token
    # generation is: every core this process may use halves the time on two cores (a
    # 47-token question: 234 ms on one thread, 118 ms on two).
    params.n_threads = params.n_threads_batch = max(settings.n_threads, usable_cores())
    params.flash_attn_type = settings.flash_attention_type
    params.n_seq_max = 1
    params.embeddings = True
    params.pooling_type = 0  # llama.h's LLAMA_POOLING_TYPE_NONE
    return params


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def mean_rows(rows: Sequence[Sequence[float]]) -> list[float]:
    """The mean of equal-length rows, summed in float64 in row order, so that every
    runtime pools the hidden states it reads alike."""
    if not rows:
        raise ValueError("no hidden states to pool")
    total = [0.0] * len(rows[0])
    for row in rows:
        for j, value in enumerate(row):
            total[j] += value
    n = float(len(rows))
    return [value / n for value in total]


@dataclass(frozen=True)
class RuntimeInfo:
    """What a runtime says about itself: its name, its version, and llama.cpp's
    system line (the instruction sets it was built for: ``AVX2 = 1 | AMX_INT8 = 1``)."""

    name: str
    version: str
    system_info: str

    @property
    def has_amx(self) -> bool:
        """llama.cpp was built with its AMX kernels (a native build on an AMX Xeon)."""
        return "AMX_INT8 = 1" in self.system_info


class Runtime(Protocol):
    """One binding of llama.cpp, imported."""

    info: RuntimeInfo

    def load(self, settings: LoadSettings) -> NativeModel:
        """Load a GGUF file; ``ValueError`` when llama.cpp cannot."""
        ...


@dataclass(frozen=True)
class _Entry:
    module: str  # this package's adapter module
    package: str  # the binding's import name, to see whether it is installed
    distribution: str  # its name on PyPI, for its version
    install: str  # the command that installs it


#: Each runtime by name, in order of preference.
RUNTIMES: dict[str, _Entry] = {
    "cyllama": _Entry(".local_runtime_cyllama", "cyllama", "cyllama", install_hint("local")),
    "llama-cpp-python": _Entry(
        ".local_runtime_llama_cpp",
        "llama_cpp",
        "llama-cpp-python",
        "pip install llama-cpp-python (a source build: a C/C++ compiler and CMake, minutes)",
    ),
}


def runtime_version(name: str) -> str:
    """The installed version of runtime ``name`` (no import), or ``?``."""
    try:
        return importlib.metadata.version(RUNTIMES[name].distribution)
    except (importlib.metadata.PackageNotFoundError, KeyError):
        return "?"


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def installed_runtimes() -> list[str]:
    """The runtimes whose binding is installed, in order of preference (no import)."""
    return [name for name, entry in RUNTIMES.items() if _installed(entry.package)]


def _requested(environ: dict[str, str] | os._Environ[str]) -> str | None:
    value = environ.get(RUNTIME_ENV, "").strip()
    if not value:
        return None
    if value not in RUNTIMES:
        raise UsageError(
            f"{RUNTIME_ENV}={value!r} names no local runtime "
            f"(expected {' or '.join(repr(name) for name in RUNTIMES)})"
        )
    return value


def choose_runtime(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The runtime a local model will use: ``CONDUCTOR_LOCAL_RUNTIME`` when set, else
    the first installed one; raises a one-sentence install hint when none is (or when
    the one asked for is not).  Imports nothing."""
    env = os.environ if environ is None else environ
    requested = _requested(env)
    if requested is not None:
        if not _installed(RUNTIMES[requested].package):
            raise MissingDependencyError(
                f"{RUNTIME_ENV} asks for {requested!r}, which is not installed: "
                f"{RUNTIMES[requested].install}"
            )
        return requested
    installed = installed_runtimes()
    if not installed:
        raise MissingDependencyError(
            f"the local extra is not installed (no llama.cpp runtime): {install_hint('local')}"
        )
    return installed[0]


def load_runtime(name: str) -> Runtime:
    """Import the adapter of runtime ``name`` (and with it the binding)."""
    entry = RUNTIMES[name]
    module = importlib.import_module(entry.module, __package__)
    factory: Callable[[], Runtime] = module.runtime
    return factory()


#: The values of ``CONDUCTOR_LOCAL_EXTRA_BUFFERS``.
ExtraBuffers = Literal["auto", "on", "off"]
_EXTRA_BUFFERS: tuple[ExtraBuffers, ...] = ("auto", "on", "off")


def extra_buffers_setting(
    environ: dict[str, str] | os._Environ[str] | None = None,
) -> ExtraBuffers:
    """``CONDUCTOR_LOCAL_EXTRA_BUFFERS``: ``auto`` (unset), ``on`` or ``off``."""
    env = os.environ if environ is None else environ
    value = env.get(EXTRA_BUFFERS_ENV, "").strip().lower() or "auto"
    for known in _EXTRA_BUFFERS:
        if value == known:
            return known
    raise UsageError(f"{EXTRA_BUFFERS_ENV}={value!r} is not one of {', '.join(_EXTRA_BUFFERS)}")
