"""The one entry point for model calls: cache, concurrency limit, retries, cost.

:class:`ModelCaller` wraps one :class:`ModelClient` for one target (a worker or the
Conductor).  :class:`CallerSet` hands out one caller per target, so that every call
to a target shares its client (and its connections) and its concurrency limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..cache import cache_key
from ..errors import ModelCallError
from .cost import cost_usd, price_for
from .factory import known_secrets, make_client
from .replies import check_reply
from .retry import Deadline, RetryPolicy, mask_error, send_with_retries
from .types import Completion, ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..cache import ResponseCache
    from ..pool import Price, Worker
    from .base import ModelClient

__all__ = ["CallerSet", "ModelCaller"]

_UNSET: Any = object()
# Clients that run the model in this process with a seed fixed by the request: a retry
# would reproduce the same reply.
_IN_PROCESS = frozenset({"local", "checkpoint"})


class ModelCaller:
    """Calls one target: cache first, then a limited number of concurrent tries.

    ``sleep`` is what retries wait with (tests pass a recorder).  The concurrency limit
    is ``target.max_concurrency`` calls in flight, held across a call's retries so that
    a rate-limited target is not hit harder while it recovers.
    """

    def __init__(
        self,
        target: Worker,
        client: ModelClient | None = None,
        *,
        cache: ResponseCache | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.target = target
        self.client: ModelClient = client if client is not None else make_client(target)
        self.cache = cache
        self.policy = RetryPolicy(max(0, target.max_retries))
        self._sleep = sleep
        self._semaphore = asyncio.Semaphore(max(1, target.max_concurrency))
        self._price: Price | None = _UNSET
        self._timeout_s = target.timeout_s
        # One full attempt always fits, whatever the two settings say.
        self._total_timeout_s = max(target.total_timeout_s, target.timeout_s)

    @property
    def price(self) -> Price | None:
        """The target's price (looked up once, on first use)."""
        if self._price is _UNSET:
            self._price = price_for(self.target)
        return self._price

    async def complete(self, request: ModelRequest) -> Completion:
        """Answer ``request`` from the cache or the model.

        Raises the final :class:`~conductor.errors.ModelCallError` (with ``target``
        and ``attempts`` set) when every try failed, or when the target's
        ``total_timeout_s`` ran out.  Errors, empty replies and truncated replies
        (cut off at the token limit) are never cached: a rerun asks again.
        """
        start = time.perf_counter()
        cache = self.cache
        key: str | None = None
        if cache is not None:
            key = cache_key(self.target, request)
            hit = cache.get(key)
            if hit is not None:
                return self._completion(hit, cached=True, attempts=0, start=start)
        async with self._semaphore:
            start = time.perf_counter()
            deadline = Deadline(self._total_timeout_s)
            try:
                raw, attempts = await send_with_retries(
                    lambda: self._attempt(request, deadline),
                    self.policy,
                    sleep=self._sleep,
                    deadline=deadline,
                )
            except ModelCallError as exc:
                if exc.target != self.target.id:
                    exc.target = self.target.id
                    exc.args = (exc.describe(),)
                # The SDK's own exception holds the request, whose headers hold the API
                # key: drop it so no traceback or log of this error can show the key.
                exc.__context__ = exc.__cause__ = None
                raise
        if cache is not None and key is not None:
            cache.set(key, raw)  # only a complete answer is stored (see cache.storable)
        return self._completion(raw, cached=False, attempts=attempts, start=start)

    async def _attempt(self, request: ModelRequest, deadline: Deadline) -> RawCompletion:
        """One try, within what remains of the call's deadline; an empty reply is a
        retryable error, and the target's keys are masked in replies and errors (a
        provider may echo the key it was sent, and litellm reads keys we never see)."""
        secrets = known_secrets(self.target)
        try:
            raw = await self.client.send(
                request, timeout_s=deadline.attempt_timeout_s(self._timeout_s)
            )
        except ModelCallError as exc:
            raise mask_error(exc, secrets) from None
        try:
            return check_reply(
                raw, self.target.id, secrets, deterministic=self.target.client in _IN_PROCESS
            )
        except ModelCallError as exc:
            raise mask_error(exc, secrets) from None

    def _completion(
        self, raw: RawCompletion, *, cached: bool, attempts: int, start: float
    ) -> Completion:
        return Completion(
            text=raw.text,
            usage=raw.usage,
            cost_usd=cost_usd(raw.usage, self.price),
            latency_s=time.perf_counter() - start,
            cached=cached,
            attempts=attempts,
            raw=raw.raw,
            model=raw.model,
            finish_reason=raw.finish_reason,
        )

    async def aclose(self) -> None:
        """Close the client."""
        await self.client.aclose()


class CallerSet:
    """One :class:`ModelCaller` per target (by id and model), created on demand."""

    def __init__(
        self,
        cache: ResponseCache | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.cache = cache
        self._sleep = sleep
        self._callers: dict[tuple[str, str], ModelCaller] = {}

    def get(self, target: Worker) -> ModelCaller:
        """The caller for ``target``, made on first use."""
        key = (target.id, target.model)
        caller = self._callers.get(key)
        if caller is None:
            caller = ModelCaller(target, cache=self.cache, sleep=self._sleep)
            self._callers[key] = caller
        return caller

    async def aclose(self) -> None:
        """Close every caller's client."""
        callers, self._callers = list(self._callers.values()), {}
        for caller in callers:
            await caller.aclose()
