"""Pool files: the workers a Conductor may use, and an optional default Conductor.

The types here are the in-memory form of ``pools/*.yaml`` (see DESIGN.md).  The
order of ``Pool.workers`` is the order the Conductor sees ("Model 0", "Model 1", ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CLIENT_KINDS",
    "CONDUCTOR_BACKENDS",
    "ClientKind",
    "ConductorBackend",
    "ConductorConfig",
    "Pool",
    "Price",
    "Worker",
]

ClientKind = Literal["litellm", "openai", "anthropic", "google", "local"]
CLIENT_KINDS: tuple[str, ...] = ("litellm", "openai", "anthropic", "google", "local")
ConductorBackend = Literal["endpoint", "checkpoint", "prompted", "local"]
CONDUCTOR_BACKENDS: tuple[str, ...] = ("endpoint", "checkpoint", "prompted", "local")


@dataclass(frozen=True)
class Price:
    """USD per million tokens; overrides litellm's price table for one worker."""

    input_per_mtok: float
    output_per_mtok: float


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
    timeout_s: float = 600.0
    max_retries: int = 6
    description: str | None = None
    system_prompt: str | None = None
    # client: local only (llama.cpp).
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None


@dataclass(frozen=True)
class ConductorConfig:
    """Where workflows come from.

    ``backend``: ``endpoint`` (an OpenAI-compatible server, e.g. vLLM serving a trained
    checkpoint), ``prompted`` (a pool worker id or a litellm model acting as Conductor),
    ``local`` (the embedded llama.cpp model) or ``checkpoint`` (a model directory or
    ``hf:ORG/NAME`` loaded in-process).  ``template`` is a built-in template name or a
    path to a text file.  ``constrained`` asks for grammar / guided decoding where the
    backend supports it.
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
    timeout_s: float = 600.0
    max_retries: int = 6
    price: Price | None = None
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None


@dataclass(frozen=True)
class Pool:
    """A validated pool file."""

    name: str
    workers: tuple[Worker, ...]
    description: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    conductor: ConductorConfig | None = None
    path: Path | None = None

    def worker(self, worker_id: str) -> Worker:
        """The worker named ``worker_id``; raises ``KeyError`` if there is none."""
        for w in self.workers:
            if w.id == worker_id:
                return w
        raise KeyError(worker_id)
