"""Turning what went wrong into our errors, the same way for every client.

A client makes one attempt; when it fails, these helpers name the failure: an HTTP
status, the provider's message and the response headers become the right
:class:`~conductor.errors.ModelCallError` subclass (:func:`error_for_status`,
:func:`make_error`); a connection that could not be made becomes one naming the host
and what to do (:func:`network_error`); an SDK's own exception is classified by
:func:`classify_sdk_error`.  Secrets are masked on the way (:func:`scrub`,
:func:`mask_error`).  How long a rate limit asks to wait is read from the response's
headers (:func:`parse_retry_after`, :func:`reset_wait_s`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import socket
import time
from collections.abc import Mapping
from datetime import datetime, timezone
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
from ..redact import SECRETS
from .replies import bad_response

__all__ = [
    "classify_sdk_error",
    "connection_error",
    "error_for_status",
    "make_error",
    "mask_error",
    "message_from_body",
    "network_error",
    "parse_duration_s",
    "parse_retry_after",
    "reset_wait_s",
    "scrub",
    "timeout_error",
    "unreadable_body_error",
]

E = TypeVar("E", bound=ModelCallError)


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
    # Only an HTTP date needs the email package: most waits are plain seconds.
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration_s(text: str) -> float | None:
    """Seconds in a Go-style duration as OpenAI sends it (``1s``, ``6m0s``, ``20ms``,
    ``1h2m3.5s``); a bare number is seconds.  ``None`` if it is neither."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


def _seconds_until(text: str, now: float) -> float | None:
    """Seconds from ``now`` (epoch) to an RFC 3339 time (Anthropic's reset headers)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"  # fromisoformat takes "Z" only from 3.11
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


# (remaining header, reset header, whether the reset is a duration or a time)
_RESET_HEADERS: tuple[tuple[str, str, bool], ...] = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests", True),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", True),
    *(
        (f"anthropic-ratelimit-{what}-remaining", f"anthropic-ratelimit-{what}-reset", False)
        for what in ("requests", "tokens", "input-tokens", "output-tokens")
    ),
)


def reset_wait_s(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds until the exhausted limit resets, from the providers' reset headers.

    Reads OpenAI's ``x-ratelimit-reset-{requests,tokens}`` (durations such as ``6m0s``)
    and Anthropic's ``anthropic-ratelimit-*-reset`` (RFC 3339 times).  A limit whose
    ``remaining`` header says calls are left is not what refused the call and is
    skipped; of the rest, the latest reset is what must pass.  ``None`` when no header
    applies.  (``Retry-After`` is read by :func:`parse_retry_after`;
    it wins when present.)
    """
    if not headers:
        return None
    if isinstance(headers, dict):
        # A plain dict is case-sensitive, unlike httpx's and aiohttp's header types.
        headers = {str(k).lower(): str(v) for k, v in headers.items()}
    clock = time.time() if now is None else now
    waits: list[float] = []
    for remaining_name, reset_name, is_duration in _RESET_HEADERS:
        reset = headers.get(reset_name)
        if reset is None:
            continue
        remaining = headers.get(remaining_name)
        if remaining is not None:
            try:
                if float(remaining) > 0:
                    continue
            except ValueError:
                pass
        wait = parse_duration_s(reset) if is_duration else _seconds_until(reset, clock)
        if wait is not None:
            waits.append(wait)
    return max(waits) if waits else None


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


#: How much of a long text is scrubbed before it is clipped to a few hundred characters:
#: far more than is kept, so no secret straddles the cut that is kept.
_SCRUB_CHARS = 8192


def scrub(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (a client's key) and every secret value of this process
    (:data:`conductor.redact.SECRETS`: a key in a URL's path, a project id echoed in a
    provider's error body) masked, so that none reaches a message or a log.  A text is
    scrubbed before it is clipped: clipping first could leave part of a secret."""
    if secret and len(secret) >= 4 and secret in text:
        text = text.replace(secret, "***")
    return SECRETS.masker((secret,) if secret else ()).text(text)


def mask_error(exc: ModelCallError, secrets: tuple[str, ...]) -> ModelCallError:
    """``exc`` with ``secrets`` and every secret value of this process masked in its
    provider message and its text."""
    masker = SECRETS.masker(secrets)
    if not masker:
        return exc
    message = exc.provider_message
    args_text = " ".join(str(a) for a in exc.args)
    if masker.text(message) != message or masker.text(args_text) != args_text:
        return exc.replace(provider_message=masker.text(message), described=True)
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
    # Cut to a length any secret fits well inside, scrubbed, then clipped.
    detail = scrub(" ".join(str(root)[:_SCRUB_CHARS].split()), key)[:200] or type(root).__name__
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
        detail = scrub(" ".join(str(exc)[:_SCRUB_CHARS].split()), key)[:300]
        return bad_response(target, f"the reply could not be read ({type(exc).__name__}: {detail})")
    return exc
