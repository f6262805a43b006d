"""The one entry point for model calls: cache, concurrency limit, retries, cost.

:class:`ModelCaller` wraps one :class:`ModelClient` for one target (a worker or the
Conductor).  :class:`CallerSet` hands out one caller per target, so that every call
to a target shares its client (and its connections) and its concurrency limit, and
every target of one provider key shares that key's adaptive limit
(:mod:`conductor.llm.limiter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import (
    BadResponseError,
    ConnectionRefusedByHostError,
    ModelCallError,
    RequestTimeoutError,
)
from .batcher import SendLive, batched
from .cache import cache_key
from .cost import SpendMeter, cost_usd, price_for
from .factory import capabilities_of, make_client
from .failures import mask_error
from .keys import KnownSecrets
from .limiter import AdaptiveLimiter, CallGate, LocalRate, ProviderLimits, RateSource, provider_key
from .replies import check_reply
from .retry import MAX_RETRY_AFTER_S, Deadline, RetryPolicy, send_with_retries
from .types import Completion, ModelRequest, RawCompletion, Retry

if TYPE_CHECKING:
    from ..targets import Price, Worker
    from .base import ModelClient
    from .batcher import Batcher
    from .cache import CallLease, ResponseCache

__all__ = ["REFUSED_AFTER_ANSWER_RETRIES", "CallerSet", "ModelCaller", "server_key"]

_UNSET: Any = object()


class ModelCaller:
    """Calls one target: cache first, then a limited number of concurrent tries.

    ``sleep`` is what retries wait with (tests pass a recorder).  Each attempt passes
    a :class:`~conductor.llm.limiter.CallGate`: at most ``target.max_concurrency`` of
    this target's attempts in flight, within ``limiter``, the adaptive limit of the
    target's provider key (a private one when none is given).  Slots are held per
    attempt, not across the sleep before a retry: the limiter, which shrinks and pauses
    on rate limits, is what keeps a rate-limited provider from being hit harder.

    With a ``batcher`` (a ``bench --batch`` run), a call of a target that ``batch``
    says is batched waits for its answer from a provider batch
    (:mod:`conductor.batches.waves`), outside the concurrency limit and the call's
    time-outs (a batch takes hours); it is made live when the batcher says so.  Every
    other call is made live, and the batcher told, so that a wave waits for it.  A
    ``meter`` is charged what each call that was not cached cost.
    """

    def __init__(
        self,
        target: Worker,
        client: ModelClient | None = None,
        *,
        cache: ResponseCache | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        limiter: AdaptiveLimiter | None = None,
        answered: set[str] | None = None,
        batcher: Batcher | None = None,
        batch: bool = False,
        meter: SpendMeter | None = None,
    ) -> None:
        self.target = target
        self.batcher = batcher
        self.batch = batch
        self.meter = meter
        # The servers that answered this run (shared by a CallerSet's callers): a refused
        # connection to one of them is a restart, worth a second retry.
        self._answered: set[str] = answered if answered is not None else set()
        self._server = server_key(target)
        # Where the target's keys come from, worked out once; read at each attempt.
        self._secrets = KnownSecrets(target)
        self.client: ModelClient = client if client is not None else make_client(target)
        self.cache = cache
        self.policy = RetryPolicy(max(0, target.max_retries))
        self._sleep = sleep
        if limiter is None:
            key = provider_key(target)
            if key is not None:
                limiter = AdaptiveLimiter(key, target.max_concurrency)
                if target.rpm is not None:
                    limiter.rate = LocalRate(key, target.rpm)
        self.gate = CallGate(target.max_concurrency, limiter)
        self._price: Price | None = _UNSET
        self._timeout_s = target.timeout_s
        # One full attempt always fits, whatever the two settings say.
        self._total_timeout_s = max(target.total_timeout_s, target.timeout_s)
        self._prepared = False
        self._preparing = asyncio.Lock()

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
        refused = self.meter.call_refusal() if self.meter is not None else None
        if refused is not None:
            # Checked before any provider is asked: a call whose spend cannot be counted
            # is not made (fail closed).
            raise self._final(ModelCallError(refused))
        batcher = self.batcher
        if batcher is not None and self.batch:
            try:
                answer = await batcher.call(
                    self.target,
                    request,
                    key if key is not None else cache_key(self.target, request),
                )
            except SendLive:
                pass  # made live below, as if it had never been batched
            except ModelCallError as exc:
                raise self._final(exc) from None
            else:
                # The batcher cached it: a resumed run finds it whatever happens next.
                return self._charged(
                    self._completion(
                        answer.raw,
                        cached=False,
                        attempts=1,
                        start=answer.sent_at,
                        end=time.perf_counter(),
                        queued=answer.sent_at - start,
                    )
                )
        lease: CallLease | None = None
        if cache is not None and key is not None:
            # Another process (or task) asking the same at once: one of them pays.
            claimed = await cache.claim(key)
            if isinstance(claimed, RawCompletion):
                return self._completion(claimed, cached=True, attempts=0, start=start)
            lease = claimed
        try:
            with batcher.live() if batcher is not None else contextlib.nullcontext():
                completion = await self._live(request, key)
        finally:
            if lease is not None:
                lease.release()  # after _live stored the answer, if it was one
        return self._charged(completion)

    def _charged(self, completion: Completion) -> Completion:
        if self.meter is not None:
            self.meter.charge(completion.cost_usd)
        return completion

    def _final(self, failed: ModelCallError) -> ModelCallError:
        """``failed`` as the call's final error: its target set, and nothing chained
        (the SDK's own exception holds the request, whose headers hold the API key)."""
        if failed.target != self.target.id:
            failed = failed.replace(target=self.target.id, described=True)
        failed.__context__ = failed.__cause__ = None
        return failed

    async def _live(self, request: ModelRequest, key: str | None) -> Completion:
        """Make the call: its tries within the concurrency limit and the time-outs."""
        cache = self.cache
        gate = self.gate
        failed: ModelCallError | None = None
        try:
            await self._prepare()
        except ModelCallError as exc:
            failed = exc
        # Latency and the call's total deadline count from when the first attempt got
        # its slot: time queued behind the concurrency limit is the call's queue time.
        queued_from = time.perf_counter()
        deadline = Deadline(self._total_timeout_s, started=False)
        admitted: list[float] = []
        retries: list[Retry] = []

        def send() -> Awaitable[RawCompletion]:
            if not admitted:
                admitted.append(time.perf_counter())
                deadline.begin()
            return self._attempt(request, deadline)

        if failed is None:
            try:
                raw, attempts = await send_with_retries(
                    lambda: gate.attempt(send),
                    self.policy,
                    sleep=self._sleep,
                    deadline=deadline,
                    on_retry=lambda n, exc, wait: retries.append(retry_note(n, exc, wait)),
                )
            except ModelCallError as exc:
                failed = exc
        # The answer is in: what follows (the cache write) is not the call's latency.
        answered = time.perf_counter()
        if failed is not None:
            # Raised outside the except clause, which would chain the old one again.
            raise self._final(failed.replace(retries=tuple(retries)) if retries else failed)
        if cache is not None and key is not None:
            cache.set(key, raw)  # only a complete answer is stored (see cache.storable)
        return self._completion(
            raw,
            cached=False,
            attempts=attempts,
            start=admitted[0],
            end=answered,
            queued=admitted[0] - queued_from,
            retries=tuple(retries),
        )

    async def _prepare(self) -> None:
        """The client's set-up, once, before the first call's clock starts (calls that
        come meanwhile wait for it), within the target's total time-out."""
        if self._prepared:
            return
        async with self._preparing:
            if self._prepared:
                return
            # A client written before prepare() existed has nothing to get ready.
            prepare = getattr(self.client, "prepare", None)
            try:
                if prepare is not None:
                    await asyncio.wait_for(prepare(), self._total_timeout_s)
            except asyncio.TimeoutError:
                raise RequestTimeoutError(
                    f"getting ready to call took longer than {self._total_timeout_s:g} s",
                    target=self.target.id,
                ) from None
            self._prepared = True

    async def _attempt(self, request: ModelRequest, deadline: Deadline) -> RawCompletion:
        """One try, within what remains of the call's deadline; an empty reply is a
        retryable error, and the target's keys are masked in replies and errors (a
        provider may echo the key it was sent, and litellm reads keys we never see)."""
        secrets = self._secrets.values()
        try:
            raw = await self.client.send(
                request, timeout_s=deadline.attempt_timeout_s(self._timeout_s)
            )
        except ModelCallError as exc:
            if exc.status is not None or isinstance(exc, BadResponseError):
                self._answered.add(self._server)  # an error reply is still an answer
            elif isinstance(exc, ConnectionRefusedByHostError) and self._server in self._answered:
                exc = exc.replace(max_retries=REFUSED_AFTER_ANSWER_RETRIES)
            raise mask_error(exc, secrets) from None
        self._answered.add(self._server)
        try:
            # An in-process model's seed is fixed by the request: a retry would
            # reproduce the same reply.
            deterministic = capabilities_of(self.target).in_process
            return check_reply(raw, self.target.id, secrets, deterministic=deterministic)
        except ModelCallError as exc:
            raise mask_error(exc, secrets) from None

    def _completion(
        self,
        raw: RawCompletion,
        *,
        cached: bool,
        attempts: int,
        start: float,
        end: float | None = None,
        queued: float = 0.0,
        retries: tuple[Retry, ...] = (),
    ) -> Completion:
        took = max(0.0, (time.perf_counter() if end is None else end) - start)
        # A local model answering other calls first: that wait is queue, not latency.
        waited = min(max(0.0, raw.queued_s), took)
        # What the server reported it cost (a nested serve's own calls) is the cost.
        reported = raw.reported_cost
        if reported is not None:
            cost = reported.usd
        else:
            cost = cost_usd(raw.usage, self.price, batch=raw.batch)
        return Completion(
            text=raw.text,
            usage=raw.usage,
            cost_usd=cost,
            cost_reported=reported is not None,
            batch=raw.batch,
            live_cost_usd=cost_usd(raw.usage, self.price) if raw.batch else None,
            latency_s=took - waited,
            queue_s=max(0.0, queued) + waited,
            cached=cached,
            attempts=attempts,
            raw=raw.raw,
            model=raw.model,
            finish_reason=raw.finish_reason,
            tool_calls=raw.tool_calls,
            retries=retries,
        )

    async def aclose(self) -> None:
        """Close the client."""
        await self.client.aclose()


def retry_note(attempt: int, error: ModelCallError, wait_s: float) -> Retry:
    """What a run record keeps of a failed attempt that is tried again."""
    return Retry(
        at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        attempt=attempt,
        error_kind=type(error).__name__,
        status=error.status,
        error=error.describe(),
        wait_s=round(wait_s, 3),
    )


#: Retries of a refused connection to a server that answered earlier in the run: a
#: restart or a full listen queue, which is over within seconds more often than not.
REFUSED_AFTER_ANSWER_RETRIES = 2


def server_key(target: Worker) -> str:
    """Which server ``target``'s calls go to: its api_base's host and port, or its
    client kind and provider for a provider's default endpoint."""
    from urllib.parse import urlsplit

    if target.api_base:
        try:
            parts = urlsplit(target.api_base)
            return f"{parts.scheme}://{parts.hostname}:{parts.port}"
        except ValueError:
            return target.api_base
    provider = target.model.split("/", 1)[0] if "/" in target.model else ""
    return f"{target.client or 'litellm'}:{provider}"


class CallerSet:
    """One :class:`ModelCaller` per target (by id and model), created on demand.

    ``limits`` holds one adaptive limiter per provider key, shared by every target of
    that key; ``start_limit`` caps where each key's limit starts (default: the sum of
    its targets' ``max_concurrency``).  ``limits.history()`` is what a bench records.
    ``rates`` makes each key's request rate (:class:`~conductor.llm.limiter.RateSource`;
    default: kept in this process; a state server's is shared by every process).
    ``meter`` is charged by every caller (a run's spend cap); :meth:`use_batches` sends
    the calls of batched targets through a :class:`~conductor.batches.waves.WaveBatcher`.
    """

    def __init__(
        self,
        cache: ResponseCache | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        start_limit: int | None = None,
        meter: SpendMeter | None = None,
        rates: RateSource | None = None,
    ) -> None:
        self.cache = cache
        self._sleep = sleep
        self._callers: dict[tuple[str, str], ModelCaller] = {}
        self._answered: set[str] = set()
        self.limits = ProviderLimits(start=start_limit, max_pause_s=MAX_RETRY_AFTER_S, rates=rates)
        self.meter = meter
        self._batcher: Batcher | None = None
        self._batch_flag = False

    def use_batches(self, batcher: Batcher | None, flag: bool) -> None:
        """Send the calls of batched targets (their ``batch:`` setting, else ``flag``,
        ``--batch``) through ``batcher`` from now on (``None``: none)."""
        self._batcher, self._batch_flag = batcher, flag
        for caller in self._callers.values():
            self._route(caller)

    def _route(self, caller: ModelCaller) -> None:
        caller.batcher = self._batcher
        caller.batch = self._batcher is not None and batched(caller.target, self._batch_flag)

    def declare(self, targets: Iterable[Worker]) -> None:
        """The targets a run may call, before its first call: each provider key's
        ``rpm:`` then holds from its first call, whichever target makes it."""
        self.limits.declare(targets)

    def get(self, target: Worker) -> ModelCaller:
        """The caller for ``target``, made on first use."""
        key = (target.id, target.model)
        caller = self._callers.get(key)
        if caller is None:
            caller = ModelCaller(
                target,
                cache=self.cache,
                sleep=self._sleep,
                limiter=self.limits.join(target),
                answered=self._answered,
                meter=self.meter,
            )
            self._route(caller)
            self._callers[key] = caller
        return caller

    async def aclose(self) -> None:
        """Close every caller's client."""
        callers, self._callers = list(self._callers.values()), {}
        for caller in callers:
            await caller.aclose()
