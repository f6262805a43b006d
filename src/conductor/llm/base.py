"""The one interface every model client implements.

A client makes *one attempt* at a request and either returns a
:class:`~conductor.llm.types.RawCompletion` or raises a
:class:`~conductor.errors.ModelCallError` subclass that says whether a retry may
help (rate limit, server error, time-out, lost connection, a reply that cannot be
read) or not (authentication, bad request).  Retries, caching, concurrency limits and
cost live one level up, in :class:`conductor.llm.caller.ModelCaller`, so that every
client gets them the same way.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .types import ModelRequest, RawCompletion

__all__ = ["ModelClient"]


@runtime_checkable
class ModelClient(Protocol):
    """One attempt at a chat completion against one model target."""

    async def prepare(self) -> None:
        """Get ready to send: import the SDK and build its client, load a local model.

        Called before the first call's clock starts, so what set-up takes is no call's
        latency; it may be called again, and then costs nothing.  Raise a
        ``ModelCallError`` subclass (or ``MissingDependencyError``) when it fails.
        """
        ...

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once.  Raise a ``ModelCallError`` subclass on failure."""
        ...

    async def aclose(self) -> None:
        """Release connections and other resources."""
        ...
