"""Adaptive concurrency per provider key: shrink on rate limits, grow back on success.

Every remote target belongs to a *provider key*, the quota a provider counts its calls
against.  Its identity (see :func:`provider_key`) is:

- with an ``api_base``: that endpoint plus the name of the key variable
  (``api_key_env``), whatever the client kind, because one server behind one key is
  one quota however it is reached;
- without one: the provider, as the client class declares it (its capabilities'
  ``quota`` and ``routes_by_model``: ``openai`` for the ``openai`` and ``http``
  clients, which both default to OpenAI's API and ``OPENAI_API_KEY``; ``anthropic``;
  ``google``; ``litellm/<prefix>`` for litellm models, by their provider prefix) plus
  the key variable's name.

Only variable *names* enter the identity, never a key's value, so the identity can be
logged and written to a run's summary.  In-process clients (``local``,
``checkpoint``) have no provider and get no shared limiter.

All the targets of one key share one :class:`AdaptiveLimiter`: a limit on attempts in
flight that starts at the sum of their ``max_concurrency`` (or a lower configured
start) and never exceeds that sum.  A rate-limit error cuts the limit by a factor
(multiplicative decrease; once per "generation", so that a burst of 429s from calls
that were all sent under the old limit counts as one signal); every ``limit``
successes since the last change add one slot (additive increase).  When the 429 says
how long to wait (``Retry-After``, ``retry-after-ms``, or the providers' reset headers,
read by :func:`conductor.llm.failures.reset_wait_s`), the key is paused until then: new
attempts queue instead of hammering the provider.  Each target's own
``max_concurrency`` stays a hard cap on its own attempts (:class:`CallGate`).

Slots are held per *attempt*, not per call: a call that failed and sleeps before its
retry holds no slot, so the capacity it would idle goes to other calls, and its retry
queues like any new attempt (behind the pause, if one is pending).

A key may also have a request *rate* (a worker's ``rpm:``; the smallest its targets
state): a :class:`RateMeter` admits each attempt, once it holds its slot, no sooner
than the rate allows (GCRA: each admission moves a theoretical arrival time one
interval on).  The rate is AIMD too: a rate-limit reply halves it, once per generation
(attempts admitted under an older rate do not cut again), its ``Retry-After`` holds
every admission back until then, and each success adds one request a minute until the
stated rate is back.  :class:`LocalRate` keeps it in this process; a state server
keeps one for every process sharing it (:mod:`conductor.state.redis_limiter`, the same
rules in a script the server runs, on the server's clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import RateLimitError
from ..redact import redact_url
from .factory import capabilities_of

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "AdaptiveLimiter",
    "CallGate",
    "MIN_RPM",
    "LimitEvent",
    "LocalRate",
    "ProviderLimits",
    "RateMeter",
    "RateSource",
    "SampleCapacity",
    "SampleShare",
    "provider_key",
    "sample_capacity",
]

T = TypeVar("T")

#: How many limit changes each key keeps (the newest); older ones are counted only.
HISTORY_SIZE = 200


# --------------------------------------------------------------------------- identity


def provider_key(target: Worker) -> str | None:
    """The provider key ``target`` counts against, as a loggable label (no secrets).

    ``None`` for in-process clients.  See the module docstring for the rules.
    """
    kind = target.client or "litellm"
    caps = capabilities_of(target)
    if caps.in_process:  # no provider quota to share
        return None
    key_var = f"${target.api_key_env}" if target.api_key_env else "default key"
    if target.api_base:
        # A key in the URL (a query value, user-info) is kept out of the label, which a
        # bench writes to rate_limits.json; endpoints that differ only there share one.
        return f"{redact_url(target.api_base).rstrip('/')} · {key_var}"
    if caps.routes_by_model:
        prefix, sep, _ = target.model.partition("/")
        provider = f"{kind}/{prefix}" if sep else kind
    else:
        provider = caps.quota or kind
    return f"{provider} · {key_var}"


# --------------------------------------------------------------------------- rate

#: The lowest a rate is cut to (requests a minute): one every ten seconds still finds
#: out when the provider serves again.
MIN_RPM = 6.0


class RateMeter(Protocol):
    """The request rate of one provider key (see the module doc): ``admit`` before each
    attempt, ``feedback`` with what the attempt found."""

    key: str

    def lower(self, rpm: float) -> None:
        """Another target of the key states ``rpm``: the smallest stated rate wins."""
        ...

    async def admit(self) -> int:
        """Wait until one more request may be sent; the rate's generation it went under."""
        ...

    def feedback(self, generation: int, *, rate_limited: bool, wait_s: float | None) -> None:
        """A rate-limit reply (cut the rate once per generation; hold admissions back
        ``wait_s``) or a success (grow the rate back one request a minute)."""
        ...


class RateSource(Protocol):
    """Makes the :class:`RateMeter` of a key stating ``rpm``: :class:`LocalRate`, or
    one on a state server."""

    def __call__(self, key: str, rpm: float) -> RateMeter: ...


class LocalRate:
    """A :class:`RateMeter` kept in this process (no state server named).

    ``clock`` and ``sleep`` are the monotonic clock and the wait (tests pass their own).
    Waiters are admitted one at a time, in arrival order.
    """

    def __init__(
        self,
        key: str,
        rpm: float,
        *,
        decrease: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.key = key
        self.ceiling = max(MIN_RPM, rpm)
        self.rpm = self.ceiling
        self.decrease = decrease
        self.generation = 0
        self.cuts = 0
        self._tat = 0.0  # the theoretical arrival time of the next request
        self._clock = clock
        self._sleep = sleep
        self._turn = asyncio.Lock()

    def lower(self, rpm: float) -> None:
        self.ceiling = min(self.ceiling, max(MIN_RPM, rpm))
        self.rpm = min(self.rpm, self.ceiling)

    def _wait_s(self) -> float:
        """0 and the request admitted, or how long until it may be."""
        now = self._clock()
        if self._tat > now:
            return self._tat - now
        interval = 60.0 / self.rpm
        # From the schedule, not from now: a waiter woken late does not push every later
        # request back (the rate would drift down by the wake-up delay).  After a lull
        # the schedule restarts one interval back, so at most two go at once.
        self._tat = max(self._tat, now - interval) + interval
        return 0.0

    async def admit(self) -> int:
        async with self._turn:
            while (wait := self._wait_s()) > 0:
                await self._sleep(wait)
            return self.generation

    def feedback(self, generation: int, *, rate_limited: bool, wait_s: float | None) -> None:
        if rate_limited:
            if generation == self.generation:
                self.generation += 1
                self.cuts += 1
                self.rpm = max(MIN_RPM, self.rpm * self.decrease)
            if wait_s is not None and wait_s > 0:
                self._tat = max(self._tat, self._clock() + wait_s)
        elif self.rpm < self.ceiling:
            self.rpm = min(self.ceiling, self.rpm + 1.0)


# --------------------------------------------------------------------------- limiter


@dataclass(frozen=True)
class LimitEvent:
    """One change of a key's limit: seconds since the limits were created, the new
    limit, and why (``start``, ``rate limited``, ``recovered``, ``paused N s``...)."""

    t_s: float
    limit: int
    reason: str

    def to_list(self) -> list[Any]:
        return [round(self.t_s, 3), self.limit, self.reason]


class AdaptiveLimiter:
    """An AIMD limit on attempts in flight for one provider key (see the module doc).

    ``ceiling`` is the most the limit may reach; ``start`` (default: the ceiling) where
    it begins.  ``decrease`` is the factor a rate limit multiplies the limit by (the cut
    is at least one slot; the limit never drops below one).  ``max_pause_s`` bounds how
    long one rate limit may pause the key.  Waiters are served in arrival order.

    Halving is the default because the start (the sum of the targets' caps) is often
    far above what the provider serves, and every cut costs one round of refused
    attempts: measured against a server serving 4 at once from a start of 32
    (benchmarks/perf/limiter_speed.py), halving drew about a third fewer 429s than a
    factor of 0.75 at the same wall time.
    """

    def __init__(
        self,
        key: str,
        ceiling: int,
        *,
        start: int | None = None,
        decrease: float = 0.5,
        max_pause_s: float = 120.0,
        history_size: int = HISTORY_SIZE,
        t0: float | None = None,
    ) -> None:
        if not 0.0 < decrease < 1.0:
            raise ValueError(f"decrease must be between 0 and 1, got {decrease}")
        self.key = key
        self.ceiling = max(1, ceiling)
        self._start_cap = start
        self.limit = self._initial()
        self.decrease = decrease
        self.max_pause_s = max_pause_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.rate_limits = 0
        self.successes = 0
        self.min_limit = self.limit
        self.paused_s = 0.0
        self._generation = 0
        self._streak = 0
        self._paused_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._t0 = time.monotonic() if t0 is None else t0
        self._events: deque[LimitEvent] = deque(maxlen=max(1, history_size))
        self.events_dropped = 0
        #: The key's request rate, if one of its targets states one (set by whoever
        #: made the limiter; read at each attempt, so a target that joins later with a
        #: rate limits the targets that joined before it too).
        self.rate: RateMeter | None = None
        self._record("start")

    def _initial(self) -> int:
        start = self._start_cap
        return self.ceiling if start is None else max(1, min(start, self.ceiling))

    # -- bookkeeping -------------------------------------------------------------------

    def _record(self, reason: str) -> None:
        if len(self._events) == self._events.maxlen:
            self.events_dropped += 1
        self._events.append(LimitEvent(time.monotonic() - self._t0, self.limit, reason))

    @property
    def events(self) -> list[LimitEvent]:
        """The kept limit changes, oldest first."""
        return list(self._events)

    @property
    def paused(self) -> bool:
        """Whether a reset is pending (new attempts wait)."""
        return time.monotonic() < self._paused_until

    def add_capacity(self, n: int) -> None:
        """Raise the ceiling by ``n`` (another target joined the key).  Before any rate
        limit the limit rises with it; after one, the learned limit stays."""
        self.ceiling += max(1, n)
        if self.rate_limits == 0:
            old, self.limit = self.limit, self._initial()
            self.min_limit = min(self.min_limit, self.limit)
            if self.limit != old:
                self._record("target joined")
                self._wake()

    def to_dict(self) -> dict[str, Any]:
        """The key's history, JSON-ready (what a bench writes to its summary)."""
        return {
            "ceiling": self.ceiling,
            "limit": self.limit,
            "min_limit": self.min_limit,
            "max_in_flight": self.max_in_flight,
            "rate_limits": self.rate_limits,
            "successes": self.successes,
            "paused_s": round(self.paused_s, 3),
            "events": [e.to_list() for e in self._events],
            "events_dropped": self.events_dropped,
        }

    # -- slots -------------------------------------------------------------------------

    def _take(self) -> int:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self._generation

    def _wake(self) -> None:
        """Hand free slots to waiters in order, or wake them when the pause ends."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        delay = self._paused_until - time.monotonic()
        if delay > 0:
            if self._waiters:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(delay, self._wake)
            return
        while self._waiters and self.in_flight < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self._take()
                fut.set_result(None)

    async def acquire(self) -> int:
        """Wait for a slot; returns the generation it was granted under (for release)."""
        if not self._waiters and self.in_flight < self.limit and not self.paused:
            return self._take()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._wake()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.in_flight -= 1  # the slot was handed over as we were cancelled
                self._wake()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise
        return self._generation

    def release(
        self, generation: int, *, ok: bool, rate_limited: bool = False, wait_s: float | None = None
    ) -> None:
        """Give the slot back, with what the attempt found.

        ``ok``: it succeeded (counts towards growth).  ``rate_limited``: the provider
        refused it (shrinks the limit, once per generation); ``wait_s``: how long the
        provider asked to wait (pauses the key).  Neither: another failure, neutral.
        """
        self.in_flight = max(0, self.in_flight - 1)
        if rate_limited:
            self._on_rate_limit(generation, wait_s)
        elif ok:
            self._on_success()
        self._wake()

    def _on_success(self) -> None:
        self.successes += 1
        self._streak += 1
        if self.limit < self.ceiling and self._streak >= self.limit:
            self.limit += 1
            self._streak = 0
            self._record("recovered")

    def _on_rate_limit(self, generation: int, wait_s: float | None) -> None:
        self.rate_limits += 1
        self._streak = 0
        reasons: list[str] = []
        if generation == self._generation:
            # The first 429 of calls sent under this limit; later ones of the same
            # generation are the same overload and do not cut again.
            self._generation += 1
            new = min(self.limit - 1, math.floor(self.limit * self.decrease))
            if max(1, new) != self.limit:
                self.limit = max(1, new)
                self.min_limit = min(self.min_limit, self.limit)
                reasons.append("rate limited")
        if wait_s is not None and wait_s > 0:
            now = time.monotonic()
            until = now + min(wait_s, self.max_pause_s)
            if until > self._paused_until + 0.05:
                # Count the pause time this extension adds, not overlapping time twice.
                self.paused_s += until - max(now, self._paused_until)
                self._paused_until = until
                reasons.append(f"paused {until - now:.3g} s")
        if reasons:
            self._record(", ".join(reasons))


class CallGate:
    """How one target's attempts get in: its own hard cap, then its key's limiter."""

    def __init__(self, max_concurrency: int, shared: AdaptiveLimiter | None) -> None:
        self.cap = max(1, max_concurrency)
        self.shared = shared
        self._own = asyncio.Semaphore(self.cap)

    async def attempt(self, send: Callable[[], Awaitable[T]]) -> T:
        """Run one attempt within both limits and the key's rate, and report its
        outcome to the limiter and the rate."""
        async with self._own:
            shared = self.shared
            if shared is None:
                return await send()
            generation = await shared.acquire()
            try:
                rate = shared.rate
                # Admitted last, once the slot is held: the request goes right away.
                rate_generation = await rate.admit() if rate is not None else 0
                try:
                    result = await send()
                except RateLimitError as exc:
                    if rate is not None:
                        rate.feedback(rate_generation, rate_limited=True, wait_s=exc.retry_after_s)
                    raise
                if rate is not None:
                    rate.feedback(rate_generation, rate_limited=False, wait_s=None)
            except RateLimitError as exc:
                shared.release(generation, ok=False, rate_limited=True, wait_s=exc.retry_after_s)
                raise
            except BaseException:
                shared.release(generation, ok=False)
                raise
            shared.release(generation, ok=True)
            return result


class ProviderLimits:
    """The limiters of one run, one per provider key, made as targets join.

    ``start`` caps every key's starting limit (default: start at the sum of the
    targets' ``max_concurrency``).  ``rates`` makes the rate of a key whose target
    states ``rpm`` (default: :class:`LocalRate`, this process only).
    """

    def __init__(
        self,
        *,
        start: int | None = None,
        decrease: float = 0.5,
        max_pause_s: float = 120.0,
        rates: RateSource | None = None,
    ) -> None:
        self.rates: RateSource = rates if rates is not None else LocalRate
        self.start = start
        self.decrease = decrease
        self.max_pause_s = max_pause_s
        self._t0 = time.monotonic()
        self._limiters: dict[str, AdaptiveLimiter] = {}
        self._members: dict[str, list[str]] = {}
        #: The smallest rate each key's targets state, as declared before any calls.
        self._stated: dict[str, float] = {}

    def declare(self, targets: Iterable[Worker]) -> None:
        """Note the rates ``targets`` state before any of them calls, so that a key's
        rate holds from its first call whichever of its targets makes it (a Conductor
        sharing a worker's key calls first; with no declaration its calls went
        unrated until the worker's first call)."""
        for target in targets:
            key = provider_key(target)
            if key is not None and target.rpm is not None:
                self._stated[key] = min(target.rpm, self._stated.get(key, target.rpm))

    def join(self, target: Worker) -> AdaptiveLimiter | None:
        """The limiter ``target`` shares (its capacity added), or ``None`` in-process."""
        key = provider_key(target)
        if key is None:
            return None
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = AdaptiveLimiter(
                key,
                target.max_concurrency,
                start=self.start,
                decrease=self.decrease,
                max_pause_s=self.max_pause_s,
                t0=self._t0,
            )
            self._limiters[key] = limiter
            self._members[key] = [target.id]
        else:
            limiter.add_capacity(target.max_concurrency)
            self._members[key].append(target.id)
        stated = [r for r in (target.rpm, self._stated.get(key)) if r is not None]
        if stated:
            if limiter.rate is None:
                limiter.rate = self.rates(key, min(stated))
            else:
                limiter.rate.lower(min(stated))
        return limiter

    def get(self, key: str) -> AdaptiveLimiter | None:
        """The limiter of ``key``, if a target joined it."""
        return self._limiters.get(key)

    def history(self) -> dict[str, dict[str, Any]]:
        """Each key's limit history and counters, JSON-ready, with its targets' ids."""
        return {
            key: {"targets": list(self._members[key]), **limiter.to_dict()}
            for key, limiter in self._limiters.items()
        }


# --------------------------------------------------------------------------- capacity


@dataclass(frozen=True)
class SampleShare:
    """What one model serves of a run's samples: ``ids`` are the targets calling it (one,
    or every target sharing one in-process model), ``model`` its name, ``samples`` how
    many samples it can serve calls at once, ``max_concurrency`` its limit (1
    in-process) and ``per_sample`` the most calls one sample makes to it at once."""

    ids: tuple[str, ...]
    model: str
    samples: int
    max_concurrency: int
    per_sample: int
    in_process: bool


@dataclass(frozen=True)
class SampleCapacity:
    """How many samples the models of a run can all be calling at once: the sum of
    each model's share.  More samples in flight than this only wait for a slot."""

    samples: int
    shares: tuple[SampleShare, ...]


def _served_by(target: Worker) -> tuple[str, ...]:
    """Which model answers ``target``'s calls: in-process targets naming one model file
    share one loaded copy (one call at a time); any other target is its own."""
    if capabilities_of(target).in_process:
        return (target.client or "litellm", target.model_path or target.model)
    return ("target", target.id)


def sample_capacity(demand: list[tuple[Worker, int]]) -> SampleCapacity:
    """How many samples can all be calling a model at once, given each target a sample
    may call and the most calls one sample makes to it at once.

    A remote target with ``max_concurrency`` ``m``, called ``c`` times at once by a
    sample, serves ``max(1, m // c)`` samples; a loaded in-process model serves one,
    whoever calls it.  A run is not slowed by fewer samples in flight than the sum
    (the steps of each sample take turns between the models, so while one sample waits
    for a worker another can be planning); above it, the extra samples only queue.
    """
    groups: dict[tuple[str, ...], list[tuple[Worker, int]]] = {}
    for target, calls in demand:
        groups.setdefault(_served_by(target), []).append((target, max(1, calls)))
    shares: list[SampleShare] = []
    for key, members in groups.items():
        ids = tuple(dict.fromkeys(t.id for t, _ in members))
        model = members[0][0].model
        per_sample = max(c for _, c in members)
        if key[0] == "target":
            cap = members[0][0].max_concurrency
            served = max(1, cap // per_sample)
            shares.append(SampleShare(ids, model, served, cap, per_sample, False))
        else:
            shares.append(SampleShare(ids, model, 1, 1, per_sample, True))
    return SampleCapacity(sum(s.samples for s in shares), tuple(shares))
