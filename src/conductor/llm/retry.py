"""Retries with capped exponential back-off, and the error helpers every client shares.

A client makes one attempt and raises a :class:`~conductor.errors.ModelCallError`
subclass; :func:`send_with_retries` decides whether to try again and how long to wait.
The helpers below (:func:`parse_retry_after`, :func:`error_for_status`,
:func:`make_error`) turn an HTTP status, the provider's message and the response
headers into the right error class, the same way for every client.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ConnectionFailedError,
    ModelCallError,
    RateLimitError,
    RequestTimeoutError,
    ServerError,
)
from .limiter import reset_wait_s
from .replies import bad_response
from .types import RawCompletion

__all__ = [
    "MAX_RETRY_AFTER_S",
    "RetryPolicy",
    "error_for_status",
    "make_error",
    "message_from_body",
    "parse_retry_after",
    "scrub",
    "send_with_retries",
    "connection_error",
    "timeout_error",
    "with_backstop",
    "Deadline",
    "mask_error",
]

#: Extra seconds the asyncio backstop allows beyond the SDK's own time-out, so that the
#: SDK's (better-described) time-out error normally fires first.
BACKSTOP_GRACE_S = 1.0

T = TypeVar("T")

#: The longest a server's Retry-After is honoured; beyond it we would rather fail.
MAX_RETRY_AFTER_S = 120.0

#: The shortest attempt worth starting when a call's total deadline is near.
MIN_ATTEMPT_S = 0.05

E = TypeVar("E", bound=ModelCallError)


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
) -> tuple[RawCompletion, int]:
    """Call ``send`` until it succeeds; return the completion and the attempt count.

    Errors that are not retryable (authentication, bad request) are raised after the
    first attempt.  When every attempt fails, or ``deadline`` leaves no time for the
    next one after its wait, the last error is raised with an ``attempts`` attribute.
    Exceptions that are not ``ModelCallError`` are bugs and propagate at once.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await send(), attempt
        except ModelCallError as exc:
            if not exc.retryable or attempt > policy.max_retries:
                exc.attempts = attempt  # type: ignore[attr-defined]
                raise
            delay = policy.delay_s(attempt, rng, exc.retry_after_s)
            if deadline is not None and not deadline.allows_wait(delay):
                exc.attempts = attempt  # type: ignore[attr-defined]
                exc.provider_message = (
                    f"{exc.provider_message} (gave up after {attempt} attempt"
                    f"{'s' if attempt > 1 else ''}: the call's total_timeout_s of "
                    f"{deadline.total_s:g} s ran out)"
                )
                exc.args = (exc.describe(),)
                raise
            await sleep(delay)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP-date)."""
    if not headers:
        return None
    if isinstance(headers, dict):
        # A plain dict is case-sensitive, unlike httpx's and aiohttp's header types.
        headers = {str(k).lower(): v for k, v in headers.items()}
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def message_from_body(body: Any) -> str | None:
    """The provider's own message from an error body (OpenAI, Anthropic, Gemini shapes)."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        text = body.strip()
        if text.startswith(("{", "[")):
            try:
                body = json.loads(text)
            except ValueError:
                return text or None
        else:
            return text or None
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message")
            if msg:
                return str(msg)
        elif isinstance(err, str) and err:
            return err
        msg = body.get("message") or body.get("detail")
        if msg:
            return str(msg)
    return None


def scrub(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` masked, so that a key never reaches a message or log."""
    if secret and len(secret) >= 4 and secret in text:
        return text.replace(secret, "***")
    return text


def mask_error(exc: ModelCallError, secrets: tuple[str, ...]) -> ModelCallError:
    """``exc`` with every secret masked in its provider message and its text."""
    if not secrets:
        return exc
    message = exc.provider_message
    args_text = " ".join(str(a) for a in exc.args)
    if any(secret in message or secret in args_text for secret in secrets):
        for secret in secrets:
            message = message.replace(secret, "***")
        exc.provider_message = message
        exc.args = (exc.describe(),)
    return exc


def make_error(
    cls: type[E],
    *,
    target: str | None,
    status: int | None = None,
    provider_message: str | None = None,
    retry_after_s: float | None = None,
) -> E:
    """Build ``cls`` with a one-sentence message naming the target, status and message."""
    err = cls(
        provider_message or "no message",
        target=target,
        status=status,
        provider_message=provider_message or "no message",
        retry_after_s=retry_after_s,
    )
    err.args = (err.describe(),)
    return err


def error_for_status(
    status: int | None,
    provider_message: str | None,
    *,
    target: str | None,
    headers: Mapping[str, str] | None = None,
) -> ModelCallError:
    """The error class for an HTTP ``status`` (429, 5xx/529, 401/403, other 4xx)."""
    cls: type[ModelCallError]
    if status == 429:
        cls = RateLimitError
    elif status == 408:
        cls = RequestTimeoutError
    elif status is not None and (status >= 500 or status == 529):
        cls = ServerError
    elif status in (401, 403):
        cls = AuthenticationError
    elif status is not None and 400 <= status < 500:
        cls = BadRequestError
    else:
        cls = ServerError
    wait_s = parse_retry_after(headers)
    if wait_s is None and cls is RateLimitError:
        wait_s = reset_wait_s(headers)  # OpenAI's / Anthropic's rate-limit reset headers
    return make_error(
        cls,
        target=target,
        status=status,
        provider_message=provider_message,
        retry_after_s=wait_s,
    )


def timeout_error(target: str | None, timeout_s: float) -> RequestTimeoutError:
    """A time-out after ``timeout_s`` seconds."""
    return make_error(
        RequestTimeoutError,
        target=target,
        provider_message=f"no reply within {round(timeout_s, 2):g} s",
    )


def connection_error(target: str | None, detail: str | None) -> ConnectionFailedError:
    """A connection failure."""
    return make_error(
        ConnectionFailedError,
        target=target,
        provider_message=detail or "could not reach the server",
    )


async def with_backstop(awaitable: Awaitable[T], timeout_s: float) -> T:
    """Await ``awaitable`` but give up a little after ``timeout_s`` (raises TimeoutError).

    SDK time-outs apply per read, so a slow trickle of bytes could outlive them; this
    bounds the whole call.
    """
    limit = timeout_s + BACKSTOP_GRACE_S
    if _HAS_TIMEOUT_CM:
        async with asyncio.timeout(limit):  # type: ignore[attr-defined]
            return await awaitable
    return await asyncio.wait_for(awaitable, limit)


# asyncio.timeout (3.11+) avoids wrapping the call in an extra task.
_HAS_TIMEOUT_CM = hasattr(asyncio, "timeout")


def keyword_names(func: Any, fallback: frozenset[str]) -> frozenset[str]:
    """The keyword parameter names of an SDK method (``fallback`` if unknowable), so that
    settings the installed SDK version does not take go in ``extra_body`` instead."""
    import inspect

    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return fallback
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def classify_sdk_error(
    exc: Exception,
    sdk: Any,
    *,
    target: str,
    timeout_s: float,
    key: str | None,
) -> BaseException:
    """Our error for an exception of the ``openai`` or ``anthropic`` SDK (both raise
    ``APITimeoutError``, ``APIConnectionError`` and ``APIStatusError``, and a
    ``ValueError`` such as ``JSONDecodeError`` for a body they cannot read); anything
    else is returned unchanged, to be re-raised as the bug it is."""
    if isinstance(exc, (sdk.APITimeoutError, asyncio.TimeoutError)):
        return timeout_error(target, timeout_s)
    if isinstance(exc, sdk.APIConnectionError):
        return connection_error(target, scrub(str(exc.message), key))
    if isinstance(exc, sdk.APIStatusError):
        msg = getattr(exc, "api_message", None) or message_from_body(exc.body) or exc.message
        return error_for_status(
            exc.status_code, scrub(str(msg), key), target=target, headers=exc.response.headers
        )
    return unreadable_body_error(exc, target=target, key=key)


def unreadable_body_error(exc: Exception, *, target: str, key: str | None) -> BaseException:
    """A :class:`BadResponseError` for an SDK's failure to read a reply body: a body that
    is not JSON (``JSONDecodeError``), not UTF-8, or (for SDKs that validate) of the
    wrong shape (pydantic's ``ValidationError``) all raise ``ValueError`` subclasses.
    Anything else is returned unchanged, to be re-raised as the bug it is."""
    if isinstance(exc, ValueError):
        detail = " ".join(str(exc).split())[:300]
        return bad_response(
            target, scrub(f"the reply could not be read ({type(exc).__name__}: {detail})", key)
        )
    return exc
