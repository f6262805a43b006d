"""What a model call is aimed at: a worker (:class:`Worker`, its :class:`Price` and
:class:`WorkerContext`), the Conductor's own settings (:class:`ConductorConfig`), and
the client kinds that carry the calls.

These are plain frozen dataclasses with no file reading, so that the model-call layer
(:mod:`conductor.llm`) can use them without the pool loader (:mod:`conductor.pool`
reads them from pool files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "CLIENT_KINDS",
    "CONDUCTOR_BACKENDS",
    "CONDUCTOR_ONLY_CLIENT_KINDS",
    "MESSAGE_FORMS",
    "POOL_CLIENT_KINDS",
    "REASONING_MODES",
    "STRUCTURED_OUTPUTS",
    "ClientKind",
    "ConductorBackend",
    "ConductorConfig",
    "MessageForm",
    "Price",
    "ReasoningMode",
    "StructuredOutputs",
    "Worker",
    "WorkerContext",
]

#: How a target is called; each kind has one client class in :mod:`conductor.llm`
#: (registered in ``conductor.llm.factory.CLIENTS``, which also says what the kind can
#: do: the class's ``capabilities``).  The names live here, below the model-call layer,
#: because the pool loader checks a ``client:`` against them.
ClientKind = Literal["litellm", "openai", "http", "anthropic", "google", "local", "checkpoint"]
CLIENT_KINDS: tuple[ClientKind, ...] = get_args(ClientKind)
#: Kinds only the Conductor's backend makes: ``checkpoint`` (a trained model loaded
#: in-process) comes from ``conductor.backend: checkpoint``, never from ``client:``.
CONDUCTOR_ONLY_CLIENT_KINDS: frozenset[ClientKind] = frozenset({"checkpoint"})
#: The kinds a pool file's ``client:`` may name, in the order messages list them.
POOL_CLIENT_KINDS: tuple[ClientKind, ...] = tuple(
    k for k in CLIENT_KINDS if k not in CONDUCTOR_ONLY_CLIENT_KINDS
)
ConductorBackend = Literal["endpoint", "checkpoint", "prompted", "local"]
CONDUCTOR_BACKENDS: tuple[ConductorBackend, ...] = get_args(ConductorBackend)
ReasoningMode = Literal["strip", "keep"]
REASONING_MODES: tuple[ReasoningMode, ...] = get_args(ReasoningMode)
MessageForm = Literal["full", "brief"]
MESSAGE_FORMS: tuple[MessageForm, ...] = get_args(MessageForm)
#: Which body field carries a grammar to an OpenAI-compatible server (``api_base``):
#: ``vllm`` (vLLM 0.11 and later: ``structured_outputs: {"grammar": ...}``),
#: ``vllm-legacy`` (vLLM 0.10 and earlier: ``guided_grammar``), ``sglang`` (``ebnf``),
#: ``llama.cpp`` (llama-server: ``grammar``), ``none`` (send none), or ``auto`` (the
#: default: ask the server once which it is; see ``conductor.llm.structured``).
StructuredOutputs = Literal["auto", "vllm", "vllm-legacy", "sglang", "llama.cpp", "none"]
STRUCTURED_OUTPUTS: tuple[StructuredOutputs, ...] = get_args(StructuredOutputs)


@dataclass(frozen=True)
class Price:
    """USD per million tokens; overrides litellm's price table for one worker.

    ``batch_input_per_mtok`` and ``batch_output_per_mtok`` are the prices of a call
    made through the provider's batch API; ``None``: :data:`BATCH_PRICE_FACTOR` of the
    live price, which is what OpenAI, Anthropic and Google charge for batches.
    """

    input_per_mtok: float
    output_per_mtok: float
    batch_input_per_mtok: float | None = None
    batch_output_per_mtok: float | None = None

    def for_batch(self) -> Price:
        """The price of a batch call."""
        return Price(
            self.input_per_mtok * BATCH_PRICE_FACTOR
            if self.batch_input_per_mtok is None
            else self.batch_input_per_mtok,
            self.output_per_mtok * BATCH_PRICE_FACTOR
            if self.batch_output_per_mtok is None
            else self.batch_output_per_mtok,
        )


#: What a batch call costs, as a share of the live call's price, where the price says
#: no batch price of its own.
BATCH_PRICE_FACTOR = 0.5


@dataclass(frozen=True)
class WorkerContext:
    """What a worker's request carries besides the task and its subtask (``context:``).

    ``prefill`` is text the worker's reply begins with: sent as a final assistant
    message for the model to continue, where the provider can (see
    :mod:`conductor.llm.prefill`), and left out with a warning where it cannot.
    ``reasoning`` says whether the earlier answers this worker sees keep their reasoning
    blocks (``keep``) or have them removed (``strip``, the default).  ``message`` is the
    form of the request: ``full`` (the paper's: a preamble about the team, the task, the
    earlier steps in tags, the subtask) or ``brief`` (the task, the earlier answers it
    may see, one line with the subtask: for small models, which echo a long preamble
    instead of answering).
    """

    prefill: str | None = None
    reasoning: ReasoningMode = "strip"
    message: MessageForm = "full"


@dataclass(frozen=True)
class Worker:
    """One model the Conductor can assign steps to (or the Conductor's own model).

    ``params`` is everything sent to the provider as sampling or pass-through
    parameters: the pool defaults' ``temperature`` and ``max_tokens`` merged with the
    worker's own ``params`` (the worker wins).  ``api_key_env`` names the environment
    variable holding the key; the key itself is read only when a call is made and is
    never stored in a record, the cache or a log.
    """

    id: str
    model: str
    client: ClientKind = "litellm"
    api_base: str | None = None
    api_key_env: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    price: Price | None = None
    max_concurrency: int = 16
    #: The most requests a minute the target's provider key may be sent, by every
    #: process sharing the state (the smallest of its targets' wins); None: no rate.
    rpm: float | None = None
    timeout_s: float = 600.0
    max_retries: int = 6
    # The most one call may take across its attempts and back-off waits (never less
    # than one timeout_s): a silent server fails the call in minutes, not an hour.
    total_timeout_s: float = 900.0
    description: str | None = None
    system_prompt: str | None = None
    # How a grammar is sent to an api_base server (see StructuredOutputs).
    structured_outputs: StructuredOutputs = "auto"
    # client: local only (llama.cpp).
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    # The pool's context: section with this worker's own context: keys over it.
    context: WorkerContext = field(default_factory=WorkerContext)
    #: Whether a bench sends this worker's calls through its provider's batch API:
    #: ``None`` as ``bench --batch`` says, ``True`` even without it, ``False`` never.
    batch: bool | None = None


@dataclass(frozen=True)
class ConductorConfig:
    """Where workflows come from.

    ``backend``: ``endpoint`` (an OpenAI-compatible server, e.g. vLLM serving a trained
    checkpoint), ``prompted`` (a pool worker id or a litellm model acting as Conductor),
    ``local`` (the embedded llama.cpp model) or ``checkpoint`` (a model directory or
    ``hf:ORG/NAME`` loaded in-process).  ``template`` is a built-in template name or a
    path to a template file (``.txt``: one user message; ``.yaml``: a conversation with
    an optional reply prefill).  ``constrained`` asks for grammar / guided decoding where
    the backend supports it; ``structured_outputs`` says which body field carries the
    grammar to an OpenAI-compatible server (``None``: a prompted pool worker's own
    setting, else ``auto``).  ``temperature``, ``max_tokens`` and ``top_p`` are the
    Conductor's sampling settings (``None``: the server's default, or a checkpoint's
    ``conductor.json``); a key of the same name in ``params`` wins.
    """

    backend: ConductorBackend = "prompted"
    model: str | None = None
    client: ClientKind = "openai"
    api_base: str | None = None
    api_key_env: str | None = None
    template: str = "default"
    params: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 5
    parse_retries: int = 5
    show_descriptions: bool = False
    constrained: bool = False
    structured_outputs: StructuredOutputs | None = None
    max_concurrency: int = 64
    max_reasoning_chars: int = 600
    min_subtask_chars: int = 1
    max_subtask_chars: int = 300
    subtasks: tuple[str, ...] = ()
    timeout_s: float = 600.0
    total_timeout_s: float = 900.0
    max_retries: int = 6
    price: Price | None = None
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
