"""Whether a command traces, where to, and with message contents or without: decided
from its options and the environment variables OpenTelemetry defines, before anything
runs and without importing OpenTelemetry."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import UsageError

__all__ = ["CONTENT_ENV", "OtelSettings", "otel_settings"]

#: The conventions' opt-in for message contents, as OpenTelemetry's Python GenAI
#: instrumentations read it: ``true`` (or ``span_only``, ``span_and_event``) records
#: them on spans.
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_CONTENT_ON = frozenset({"true", "1", "yes", "on", "span_only", "span_and_event"})
_CONTENT_OFF = frozenset({"", "false", "0", "no", "off", "no_content", "event_only"})

Protocol = Literal["http/protobuf", "grpc", "console"]


@dataclass(frozen=True)
class OtelSettings:
    """Where spans go: ``endpoint`` is the traces URL (``None`` for ``console``, which
    writes them to standard output); ``content`` records message contents."""

    protocol: Protocol
    endpoint: str | None
    content: bool

    def describe(self) -> str:
        return self.endpoint or "standard output"


def _env(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def otel_settings(
    endpoint: str | None,
    *,
    content: bool = False,
    disabled: bool = False,
    env: Mapping[str, str] | None = None,
) -> OtelSettings | None:
    """The tracing of a command given ``--otel ENDPOINT`` (``endpoint``),
    ``--otel-content`` and ``--no-otel`` (``disabled``); ``None`` when it does not
    trace.  Without ``--otel``, it traces when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, or ``OTEL_TRACES_EXPORTER`` is
    ``otlp`` or ``console``; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
    turns it off.  Raises :class:`UsageError` for an endpoint or a setting it cannot use."""
    env = os.environ if env is None else env
    if disabled:
        return None
    exporter = _env(env, "OTEL_TRACES_EXPORTER").lower()
    if endpoint is None:
        if _env(env, "OTEL_SDK_DISABLED").lower() == "true" or exporter == "none":
            return None
        if exporter not in ("", "otlp", "console"):
            raise UsageError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: conductor sends spans with otlp "
                "(the default) or console, or none"
            )
    wants_content = content or _content_env(env)
    if endpoint is None and exporter == "console":
        return OtelSettings("console", None, wants_content)
    protocol = (
        _env(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or _env(env, "OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).lower()
    if protocol not in ("http/protobuf", "grpc"):
        raise UsageError(
            f"OTLP protocol {protocol!r}: conductor sends http/protobuf (the default) or grpc"
        )
    traces_url = _env(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base_url = _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint is not None:
        url = _traces_url(endpoint.strip(), "--otel", protocol)
    elif traces_url:
        url = _checked(traces_url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    elif base_url:
        url = _traces_url(base_url, "OTEL_EXPORTER_OTLP_ENDPOINT", protocol)
    elif exporter == "otlp":
        # OpenTelemetry's default collector address.
        url = "http://localhost:4317" if protocol == "grpc" else "http://localhost:4318/v1/traces"
    else:
        return None
    return OtelSettings(protocol, url, wants_content)  # type: ignore[arg-type]


def _content_env(env: Mapping[str, str]) -> bool:
    value = _env(env, CONTENT_ENV).lower()
    if value in _CONTENT_ON:
        return True
    if value in _CONTENT_OFF:
        return False
    raise UsageError(
        f"{CONTENT_ENV}={value!r}: give true or false (or span_only, span_and_event, "
        "event_only, no_content)"
    )


def _checked(url: str, where: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"{where} {url!r} is not an http(s) URL of an OTLP receiver "
            "(for example http://localhost:4318)"
        )
    return url


def _traces_url(base: str, where: str, protocol: str) -> str:
    """The traces URL of the receiver at ``base``: OTLP/HTTP's ``/v1/traces`` below it,
    as OpenTelemetry does with ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a URL already ending
    in it is kept); gRPC takes the address as it is."""
    url = _checked(base, where)
    if protocol == "grpc" or url.rstrip("/").endswith("/v1/traces"):
        return url
    return url.rstrip("/") + "/v1/traces"
