"""What a ``conductor serve`` server is set up with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..pool import Pool
from ._keys import ApiKey

__all__ = ["ServeSettings"]


@dataclass
class ServeSettings:
    """A server's pool and limits.

    ``conductor`` is a ``--conductor`` spec (``None``: the pool's own).  ``records_dir``
    receives every run's record in ``samples.jsonl``; ``api_key`` is the bearer token
    requests must carry (``None``: none needed).  ``max_concurrency`` requests run at
    once and ``max_queue`` more wait for a slot; beyond that a request gets 429.
    ``grace_s`` is how long a stopping server lets requests in flight finish.
    ``keys`` are the tokens of a keys file (:func:`~conductor.serve.load_keys`), each
    with the workers it may use; beside ``api_key`` (a key with every worker), or
    instead of it.
    ``cors_origins`` are the origins a browser may call the server from (``*``: any;
    none: no CORS headers at all).
    """

    pool: Pool
    conductor: str | None = None
    records_dir: Path | None = None
    api_key: str | None = None
    max_concurrency: int = 16
    max_queue: int = 64
    max_body_bytes: int = 1 << 20
    grace_s: float = 30.0
    use_cache: bool = True
    keys: tuple[ApiKey, ...] = ()
    cors_origins: tuple[str, ...] = ()
