"""Retries with capped exponential back-off, within a call's total deadline.

A client makes one attempt and raises a :class:`~conductor.errors.ModelCallError`
subclass (named by :mod:`conductor.llm.failures`); :func:`send_with_retries` decides
whether to try again and how long to wait.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConnectionFailedError, ModelCallError
from .types import RawCompletion

__all__ = [
    "MAX_RETRY_AFTER_S",
    "MIN_ATTEMPT_S",
    "Deadline",
    "RetryPolicy",
    "retries_for",
    "send_with_retries",
]

#: The longest a server's Retry-After is honoured; beyond it we would rather fail.
MAX_RETRY_AFTER_S = 120.0

#: The shortest attempt worth starting when a call's total deadline is near.
MIN_ATTEMPT_S = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a failed call.

    ``max_retries`` counts retries, not attempts (0 = a single attempt).  The wait
    before retry ``n`` (1-based) is ``min(max_delay_s, base_delay_s * 2**(n-1))``,
    scaled by a random factor in ``[1 - jitter, 1 + jitter]``, and never shorter than
    the server's Retry-After (capped at :data:`MAX_RETRY_AFTER_S`).
    """

    max_retries: int
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    jitter: float = 0.25

    def delay_s(self, retry: int, rng: Callable[[], float], retry_after_s: float | None) -> float:
        """The wait before retry number ``retry`` (1-based)."""
        delay: float = min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry - 1))
        if self.jitter:
            delay *= 1.0 + self.jitter * (2.0 * rng() - 1.0)
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(retry_after_s, MAX_RETRY_AFTER_S))
        return max(0.0, delay)


class Deadline:
    """The total time one call may take across all its attempts and waits.

    ``total_s`` None means no limit.  Each attempt's time-out is the worker's per-attempt
    ``timeout_s`` cut to what remains, so that a silent server fails the call once the
    total is spent instead of after ``(max_retries + 1) * timeout_s``.
    """

    def __init__(
        self,
        total_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        started: bool = True,
    ) -> None:
        self.total_s = total_s
        self._clock = clock
        self._end: float | None = None
        if started:
            self.begin()

    def begin(self) -> None:
        """Start the clock (once): a caller starts it when the first attempt is admitted,
        so that time queued behind a concurrency limit is not taken from the call."""
        if self._end is None and self.total_s is not None:
            self._end = self._clock() + self.total_s

    def remaining_s(self) -> float | None:
        """Seconds left (may be negative), or None without a limit."""
        if self._end is None:
            return self.total_s
        return self._end - self._clock()

    def attempt_timeout_s(self, timeout_s: float) -> float:
        """The time-out of the next attempt: ``timeout_s`` cut to what remains."""
        left = self.remaining_s()
        return timeout_s if left is None else max(MIN_ATTEMPT_S, min(timeout_s, left))

    def allows_wait(self, delay_s: float) -> bool:
        """Whether an attempt is still worth making after waiting ``delay_s``."""
        left = self.remaining_s()
        return left is None or left - delay_s >= MIN_ATTEMPT_S


async def send_with_retries(
    send: Callable[[], Awaitable[RawCompletion]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    rng: Callable[[], float] = random.random,
    deadline: Deadline | None = None,
    on_retry: Callable[[int, ModelCallError, float], None] | None = None,
) -> tuple[RawCompletion, int]:
    """Call ``send`` until it succeeds; return the completion and the attempt count.

    Errors that are not retryable (authentication, bad request) are raised after the
    first attempt.  When every attempt fails, or ``deadline`` leaves no time for the
    next one after its wait, the last error is passed on with its ``attempts`` (as a
    new error of the same class: the one caught is not changed).
    ``on_retry`` hears of each failed attempt that is tried again (its number, its
    error and the wait before the next), as the wait begins.
    Exceptions that are not ``ModelCallError`` are bugs and propagate at once.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await send(), attempt
        except ModelCallError as exc:
            if not exc.retryable or attempt > retries_for(exc, policy):
                # A connection error's message counts the attempts.
                raise exc.replace(
                    attempts=attempt, described=isinstance(exc, ConnectionFailedError)
                ) from exc.__cause__
            delay = policy.delay_s(attempt, rng, exc.retry_after_s)
            if deadline is not None and not deadline.allows_wait(delay):
                gave_up = (
                    f"{exc.provider_message} (gave up after {attempt} attempt"
                    f"{'s' if attempt > 1 else ''}: the call's total_timeout_s of "
                    f"{deadline.total_s:g} s ran out)"
                )
                raise exc.replace(
                    attempts=attempt, provider_message=gave_up, described=True
                ) from exc.__cause__
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            await sleep(delay)


def retries_for(exc: ModelCallError, policy: RetryPolicy) -> int:
    """How many retries ``exc``'s kind of failure gets: the target's ``max_retries``,
    capped by the error's own ``max_retries`` (a host that is not found or refuses the
    connection is not worth a pool's full patience, which is meant for rate limits and
    overloaded servers)."""
    cap = exc.max_retries
    return policy.max_retries if cap is None else min(policy.max_retries, cap)
