"""The one entry point for model calls: cache, concurrency limit, retries, cost.

:class:`ModelCaller` wraps one :class:`ModelClient` for one target (a worker or the
Conductor).  :class:`CallerSet` hands out one caller per target, so that every call
to a target shares its client (and its connections) and its concurrency limit, and
every target of one provider key shares that key's adaptive limit
(:mod:`conductor.llm.limiter`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..cache import cache_key
from ..errors import ModelCallError
from .cost import cost_usd, price_for
from .factory import make_client
from .limiter import AdaptiveLimiter, CallGate, ProviderLimits, provider_key
from .retry import MAX_RETRY_AFTER_S, RetryPolicy, send_with_retries
from .types import Completion, ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..cache import ResponseCache
    from ..pool import Price, Worker
    from .base import ModelClient

__all__ = ["CallerSet", "ModelCaller"]

_UNSET: Any = object()


class ModelCaller:
    """Calls one target: cache first, then a limited number of concurrent tries.

    ``sleep`` is what retries wait with (tests pass a recorder).  Each attempt passes
    a :class:`~conductor.llm.limiter.CallGate`: at most ``target.max_concurrency`` of
    this target's attempts in flight, within ``limiter``, the adaptive limit of the
    target's provider key (a private one when none is given).  Slots are held per
    attempt, not across the sleep before a retry: the limiter, which shrinks and pauses
    on rate limits, is what keeps a rate-limited provider from being hit harder.
    """

    def __init__(
        self,
        target: Worker,
        client: ModelClient | None = None,
        *,
        cache: ResponseCache | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        limiter: AdaptiveLimiter | None = None,
    ) -> None:
        self.target = target
        self.client: ModelClient = client if client is not None else make_client(target)
        self.cache = cache
        self.policy = RetryPolicy(max(0, target.max_retries))
        self._sleep = sleep
        if limiter is None:
            key = provider_key(target)
            limiter = AdaptiveLimiter(key, target.max_concurrency) if key is not None else None
        self.gate = CallGate(target.max_concurrency, limiter)
        self._price: Price | None = _UNSET
        self._timeout_s = target.timeout_s

    @property
    def price(self) -> Price | None:
        """The target's price (looked up once, on first use)."""
        if self._price is _UNSET:
            self._price = price_for(self.target)
        return self._price

    async def complete(self, request: ModelRequest) -> Completion:
        """Answer ``request`` from the cache or the model.

        Raises the final :class:`~conductor.errors.ModelCallError` (with ``target``
        and ``attempts`` set) when every try failed.  Errors are never cached.
        """
        start = time.perf_counter()
        cache = self.cache
        key: str | None = None
        if cache is not None:
            key = cache_key(self.target, request)
            hit = cache.get(key)
            if hit is not None:
                return self._completion(hit, cached=True, attempts=0, start=start)
        client = self.client
        timeout_s = self._timeout_s
        gate = self.gate
        # Latency counts from when the first attempt got its slot, as it always has:
        # time queued behind the concurrency limit is not the call's.
        admitted: list[float] = []

        def send() -> Awaitable[RawCompletion]:
            if not admitted:
                admitted.append(time.perf_counter())
            return client.send(request, timeout_s=timeout_s)

        try:
            raw, attempts = await send_with_retries(
                lambda: gate.attempt(send), self.policy, sleep=self._sleep
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
            cache.set(key, raw)
        return self._completion(raw, cached=False, attempts=attempts, start=admitted[0])

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
    """One :class:`ModelCaller` per target (by id and model), created on demand.

    ``limits`` holds one adaptive limiter per provider key, shared by every target of
    that key; ``start_limit`` caps where each key's limit starts (default: the sum of
    its targets' ``max_concurrency``).  ``limits.history()`` is what a bench records.
    """

    def __init__(
        self,
        cache: ResponseCache | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        start_limit: int | None = None,
    ) -> None:
        self.cache = cache
        self._sleep = sleep
        self._callers: dict[tuple[str, str], ModelCaller] = {}
        self.limits = ProviderLimits(start=start_limit, max_pause_s=MAX_RETRY_AFTER_S)

    def get(self, target: Worker) -> ModelCaller:
        """The caller for ``target``, made on first use."""
        key = (target.id, target.model)
        caller = self._callers.get(key)
        if caller is None:
            caller = ModelCaller(
                target, cache=self.cache, sleep=self._sleep, limiter=self.limits.join(target)
            )
            self._callers[key] = caller
        return caller

    async def aclose(self) -> None:
        """Close every caller's client."""
        callers, self._callers = list(self._callers.values()), {}
        for caller in callers:
            await caller.aclose()
