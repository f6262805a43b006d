"""OpenTelemetry traces of runs: each question as GenAI spans (``invoke_workflow``,
``plan``, ``invoke_agent``, ``chat``), live from ``ask``, ``bench`` and ``serve`` or
replayed from records by ``conductor export otel``.

The public names are here; :mod:`._spans` plans a record's spans in plain data,
:mod:`._config` decides from options and ``OTEL_*`` variables whether and where to send
them, and :mod:`._export` (the only module that imports the SDK, from the ``otel``
extra) makes and sends them.  Nothing here is imported by a command that does not trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..errors import MissingDependencyError, install_hint
from ._config import CONTENT_ENV, OtelSettings, otel_settings
from ._spans import AttributeValue, PlannedEvent, PlannedLink, PlannedSpan, record_spans

if TYPE_CHECKING:
    from ..record import RunRecord
    from ._export import RecordTracer, TraceReport
else:

    def __getattr__(name: str) -> object:
        # The SDK's classes, imported only when asked for by name.
        if name in ("RecordTracer", "TraceReport"):
            from . import _export

            return getattr(_export, name)
        raise AttributeError(name)


__all__ = [
    "CONTENT_ENV",
    "AttributeValue",
    "OtelSettings",
    "PlannedEvent",
    "PlannedLink",
    "PlannedSpan",
    "RecordSink",
    "RecordTracer",
    "TraceReport",
    "check_installed",
    "describe_report",
    "open_tracer",
    "otel_settings",
    "record_spans",
]


class RecordSink(Protocol):
    """Where finished records go to become traces (a :class:`RecordTracer`)."""

    def emit(
        self, record: RunRecord, *, source: str | None = None, traceparent: str | None = None
    ) -> None: ...


def check_installed(settings: OtelSettings) -> None:
    """Raise :class:`MissingDependencyError` unless OpenTelemetry's SDK and the exporter
    ``settings`` need are installed (the ``otel`` extra), before anything runs."""
    try:
        from ._export import exporter_class
    except ImportError as exc:
        raise MissingDependencyError(
            f"tracing to {settings.describe()} needs OpenTelemetry's SDK ({exc.name} is "
            f"missing): {install_hint('otel')}"
        ) from None
    exporter_class(settings)


def open_tracer(settings: OtelSettings) -> RecordTracer:
    """A tracer sending to where ``settings`` say (see :func:`check_installed`)."""
    check_installed(settings)
    from ._export import RecordTracer

    return RecordTracer.from_settings(settings)


def describe_report(report: TraceReport) -> str:
    """One line on what a tracer sent."""
    return (
        f"{report.sent} of {report.spans} spans ({report.records} records) sent to {report.where}"
    )
