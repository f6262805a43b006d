"""Retries with capped exponential back-off, and the error helpers every client shares.

A client makes one attempt and raises a :class:`~conductor.errors.ModelCallError`
subclass; :func:`send_with_retries` decides whether to try again and how long to wait.
The helpers below (:func:`parse_retry_after`, :func:`error_for_status`,
:func:`make_error`) turn an HTTP status, the provider's message and the response
headers into the right error class, the same way for every client.
"""

from __future__ import annotations

import asyncio
import errno
import json
import random
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ConnectionFailedError,
    ConnectionRefusedByHostError,
    ConnectTimeoutError,
    HostNotFoundError,
    HostUnreachableError,
    ModelCallError,
    RateLimitError,
    RequestTimeoutError,
    ServerError,
    host_port,
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
    "network_error",
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
            if not exc.retryable or attempt > retries_for(exc, policy):
                exc.attempts = attempt
                if isinstance(exc, ConnectionFailedError):
                    exc.args = (exc.describe(),)  # its message counts the attempts
                raise
            delay = policy.delay_s(attempt, rng, exc.retry_after_s)
            if deadline is not None and not deadline.allows_wait(delay):
                exc.attempts = attempt
                exc.provider_message = (
                    f"{exc.provider_message} (gave up after {attempt} attempt"
                    f"{'s' if attempt > 1 else ''}: the call's total_timeout_s of "
                    f"{deadline.total_s:g} s ran out)"
                )
                exc.args = (exc.describe(),)
                raise
            await sleep(delay)


def retries_for(exc: ModelCallError, policy: RetryPolicy) -> int:
    """How many retries ``exc``'s kind of failure gets: the target's ``max_retries``,
    capped by the error's own ``max_retries`` (a host that is not found or refuses the
    connection is not worth a pool's full patience, which is meant for rate limits and
    overloaded servers)."""
    cap = exc.max_retries
    return policy.max_retries if cap is None else min(policy.max_retries, cap)


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
    **extra: Any,
) -> E:
    """Build ``cls`` with a one-sentence message naming the target, status and message
    (``extra``: the class's own fields, such as a connection error's ``host``)."""
    err = cls(
        provider_message or "no message",
        target=target,
        status=status,
        provider_message=provider_message or "no message",
        retry_after_s=retry_after_s,
        **extra,
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


def connection_error(
    target: str | None, detail: str | None, url: str | None = None
) -> ConnectionFailedError:
    """A connection failure (lost on the way, or of a kind not known), naming ``url``'s
    host and port when given."""
    host, port = _dialled([], url)
    return make_error(
        ConnectionFailedError,
        target=target,
        provider_message=detail or "could not reach the server",
        host=host,
        port=port,
    )


# Errors below which a connection was never made: the network has no route.
_UNREACHABLE_ERRNOS = frozenset(
    {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, getattr(errno, "EHOSTDOWN", -1)}
)
# A connect that timed out (httpx's, and aiohttp's when a connect time-out is set); a read
# time-out is a plain time-out.
_CONNECT_TIMEOUT_NAMES = frozenset({"ConnectTimeout", "ConnectionTimeoutError"})
_DEFAULT_PORTS = {"https": 443, "http": 80}


def network_error(
    exc: BaseException,
    *,
    target: str | None,
    timeout_s: float,
    url: str | None = None,
    key: str | None = None,
) -> ModelCallError | None:
    """Our error for a connection that could not be made, from any client's exception.

    The SDKs, httpx, aiohttp and litellm each wrap the operating system's error in
    their own classes ("Connection error.", a made-up HTTP 500); the chain of causes
    still holds it, so this walks the chain: a failed name lookup is
    :class:`HostNotFoundError`, a refused connection
    :class:`ConnectionRefusedByHostError`, no route :class:`HostUnreachableError` and a
    connect time-out :class:`ConnectTimeoutError`.  The address is the one the
    exception names (what was really dialled), else ``url``'s.  None when ``exc`` is not
    one of these (a connection lost mid-reply stays the client's to classify)."""
    links = _chain(exc)
    host, port = _dialled(links, url)
    # The operating system's own words, from the error deepest in the chain.
    root = next((x for x in reversed(links) if isinstance(x, OSError) and str(x)), links[-1])
    detail = scrub(" ".join(str(root).split())[:200], key) or type(root).__name__
    for link in links:
        name = type(link).__name__
        if name in _CONNECT_TIMEOUT_NAMES:
            where = host_port(host, port) or "the server"
            return make_error(
                ConnectTimeoutError,
                target=target,
                provider_message=(
                    f"could not connect to {where} within {round(timeout_s, 2):g} s; check "
                    "that the host is up and reachable (network, VPN, firewall) and the "
                    "address in api_base"
                ),
                host=host,
                port=port,
            )
        cls: type[ConnectionFailedError] | None = None
        code = getattr(link, "errno", None)
        if isinstance(link, socket.gaierror) or name == "ClientConnectorDNSError":
            cls = HostNotFoundError
        elif isinstance(link, ConnectionRefusedError) or code == errno.ECONNREFUSED:
            cls = ConnectionRefusedByHostError
        elif isinstance(link, OSError) and code in _UNREACHABLE_ERRNOS:
            cls = HostUnreachableError
        if cls is not None:
            return make_error(cls, target=target, provider_message=detail, host=host, port=port)
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (causes, contexts, aiohttp's ``os_error``), outermost first."""
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(out) < 24:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        out.append(current)
        inner = getattr(current, "os_error", None)
        for nxt in (current.__cause__, current.__context__, inner):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return out


def _dialled(links: list[BaseException], url: str | None) -> tuple[str | None, int | None]:
    """The host and port a failed connection was for: aiohttp's error names them; else
    the request of the deepest exception that carries one (litellm's own exceptions
    carry a stand-in request, the SDK's below them the real one); else ``url``'s."""
    from urllib.parse import urlsplit

    for link in links:
        host = getattr(link, "host", None)
        if isinstance(host, str) and host:
            port = getattr(link, "port", None)
            return host, port if isinstance(port, int) else None
    for link in reversed(links):
        try:
            request = getattr(link, "request", None)
        except RuntimeError:  # httpx raises it for an exception without a request
            request = None
        request_url = getattr(request, "url", None)
        if request_url is not None:
            url = str(request_url)
            break
    if not url:
        return None, None
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None, None
    return parts.hostname, port


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
    url: str | None = None,
) -> BaseException:
    """Our error for an exception of the ``openai`` or ``anthropic`` SDK (both raise
    ``APITimeoutError``, ``APIConnectionError`` and ``APIStatusError``, and a
    ``ValueError`` such as ``JSONDecodeError`` for a body they cannot read); anything
    else is returned unchanged, to be re-raised as the bug it is.  ``url`` is the
    server's, for a connection that could not be made."""
    if isinstance(exc, (sdk.APITimeoutError, sdk.APIConnectionError)):
        failed = network_error(exc, target=target, timeout_s=timeout_s, url=url, key=key)
        if failed is not None:
            return failed
    if isinstance(exc, (sdk.APITimeoutError, asyncio.TimeoutError)):
        return timeout_error(target, timeout_s)
    if isinstance(exc, sdk.APIConnectionError):
        return connection_error(target, scrub(str(exc.message), key), url)
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
