"""What a ``conductor serve`` server is set up with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..otel import OtelSettings
from ..pool import Pool
from ..state import StateURL
from ._keys import ApiKey

__all__ = ["ServeSettings"]


@dataclass
class ServeSettings:
    """A server's pool and limits.

    ``conductor`` is a ``--conductor`` spec (``None``: the pool's own), ``cost_weight``
    its ``--cost-weight`` (one server is one point of a cost-conditioned Conductor's
    front).  ``records_dir``
    receives every run's record in ``samples.jsonl``; ``api_key`` is the bearer token
    requests must carry (``None``: none needed).  ``max_concurrency`` requests run at
    once and ``max_queue`` more wait for a slot; beyond that a request gets 429.
    ``grace_s`` is how long a stopping server lets requests in flight finish.
    ``keys`` are the tokens of a keys file (:func:`~conductor.serve.load_keys`), each
    with the workers it may use; beside ``api_key`` (a key with every worker), or
    instead of it.
    ``cors_origins`` are the origins a browser may call the server from (``*``: any;
    none: no CORS headers at all).
    ``otel`` says where each run's record goes as an OpenTelemetry trace (``None``:
    nowhere).  ``router`` is a router directory (``conductor fit-router --out``) served
    as the model ``router`` (``None``: no such model).

    Limits a client cannot exceed: ``max_k`` bounds K of ``vote:K:W`` and
    ``reflect:K:W``; ``max_calls_per_request`` and ``max_usd_per_request`` are the
    ceilings of a request's budget (all its runs together; ``None``: no ceiling), a
    smaller budget asked in the body's ``conductor`` object applying instead.  A
    connection must send a request's headers within ``header_timeout_s`` of opening
    (or of that request's first byte) and its body within ``body_timeout_s`` of the
    headers; an idle keep-alive connection is closed after ``keep_alive_s``.  At most
    ``max_connections`` are open (see :mod:`._guard`).
    """

    pool: Pool
    conductor: str | None = None
    #: ``--cost-weight``: the weight the (cost-conditioned) Conductor's prompt states
    #: in every request this server runs (``None``: no weight line).
    cost_weight: float | None = None
    records_dir: Path | None = None
    otel: OtelSettings | None = None
    router: Path | None = None
    api_key: str | None = None
    max_concurrency: int = 16
    max_queue: int = 64
    max_body_bytes: int = 1 << 20
    grace_s: float = 30.0
    use_cache: bool = True
    #: Where the call cache is kept: a state server every replica shares, or ``None``
    #: (this machine's cache directory).
    state: StateURL | None = None
    #: How long a stored Responses conversation is kept for a follow-up, a retrieve or
    #: a list of its input items (``--keep-responses``, seconds; OpenAI keeps 30 days).
    keep_responses_s: float = 30 * 24 * 3600.0
    #: Start the keys' budgets from zero on a ``state`` server that holds no record of
    #: them (its first use, or after it lost its data); without it such a server refuses
    #: the keys with a budget (``--new-budgets``, see :mod:`conductor.state.budgets`).
    new_budgets: bool = False
    keys: tuple[ApiKey, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_k: int = 16
    max_calls_per_request: int | None = 64
    max_usd_per_request: float | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    max_connections: int = 512

    def check_limits(self) -> None:
        """A :class:`~conductor.errors.UsageError` naming the option of a limit that is
        out of range (0 or less, or past what the process can hold)."""
        for name in ("max_k", "max_connections", "max_calls_per_request"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "max_usd_per_request",
            "keep_responses_s",
        ):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise UsageError(f"--{name.replace('_', '-')} must be a number above 0")
