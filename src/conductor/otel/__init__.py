"""OpenTelemetry traces of runs: each question as GenAI spans (``invoke_workflow``,
``plan``, ``invoke_agent``, ``chat``), live from ``ask``, ``bench`` and ``serve`` or
replayed from records by ``conductor export otel``.

The public names are here.  :mod:`._spans` plans a record's spans in plain data;
:mod:`._config` decides from options and ``OTEL_*`` variables whether and where to send
them; :mod:`._export` (the only module that imports the SDK, from the ``otel`` extra)
makes and sends them; :mod:`._process` runs that in a child process, the tracer a
command holds.  Nothing here is imported by a command that does not trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..errors import MissingDependencyError, install_hint
from ._config import CONTENT_ENV, OtelSettings, otel_settings
from ._process import ProcessTracer
from ._report import TraceReport
from ._spans import AttributeValue, PlannedEvent, PlannedLink, PlannedSpan, record_spans

if TYPE_CHECKING:
    from ..record import RunRecord
    from ._export import RecordTracer
else:

    def __getattr__(name: str) -> object:
        # The SDK's side, imported only when asked for by name.
        if name == "RecordTracer":
            from ._export import RecordTracer

            return RecordTracer
        raise AttributeError(name)


__all__ = [
    "CONTENT_ENV",
    "AttributeValue",
    "OtelSettings",
    "PlannedEvent",
    "PlannedLink",
    "PlannedSpan",
    "ProcessTracer",
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
    """Where finished records go to become traces (:class:`ProcessTracer`, or
    :class:`RecordTracer` in this process).  ``line`` is the record's JSON when the
    caller has it already (a bench's ``samples.jsonl`` line)."""

    def emit(
        self,
        record: RunRecord,
        *,
        source: str | None = None,
        traceparent: str | None = None,
        line: str | None = None,
    ) -> None: ...


#: The packages each protocol needs, with the one to name when it is missing.
_NEEDED = {
    "http/protobuf": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    "grpc": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.grpc"),
    "console": ("opentelemetry.sdk",),
}


def check_installed(settings: OtelSettings) -> None:
    """Raise :class:`MissingDependencyError` unless OpenTelemetry's SDK and the exporter
    ``settings`` need are installed (the ``otel`` extra; gRPC's exporter on its own),
    before anything runs, without importing them."""
    import importlib.util

    for name in _NEEDED[settings.protocol]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            continue
        if name.endswith(".grpc"):
            hint = "pip install opentelemetry-exporter-otlp-proto-grpc, or use http/protobuf"
        else:
            hint = install_hint("otel")
        raise MissingDependencyError(
            f"tracing to {settings.describe()} needs {name.replace('.', '-')} "
            f"(it is not installed): {hint}"
        )


def open_tracer(settings: OtelSettings) -> ProcessTracer:
    """A tracer sending to where ``settings`` say, from a child process (see
    :mod:`._process`); :func:`check_installed` first."""
    check_installed(settings)
    return ProcessTracer(settings)


def describe_report(report: TraceReport) -> str:
    """One line on what a tracer sent."""
    return (
        f"{report.sent} of {report.spans} spans ({report.records} records) sent to {report.where}"
    )
