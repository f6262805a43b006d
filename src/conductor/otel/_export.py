"""Records into OpenTelemetry spans, sent by one background thread.

:class:`RecordTracer` turns each finished record into SDK spans at the times the record
gives (:func:`~conductor.otel._spans.record_spans`) and queues them whole; a thread
sends them in batches of up to :data:`BATCH_SPANS`.  The run never waits for the
receiver: a full queue drops spans (counted), a receiver that is down fails its batches
(counted, with its last error), and :meth:`RecordTracer.close` waits a bounded time
and says what was not sent.  This is the only module that imports the SDK.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ._config import OtelSettings
from ._report import TraceReport
from ._spans import record_spans

if TYPE_CHECKING:
    from ..record import RunRecord

__all__ = [
    "BATCH_SPANS",
    "MAX_QUEUED_SPANS",
    "RecordTracer",
    "TraceReport",
    "exporter_class",
    "exporter_for",
]

#: Spans per request to the receiver (the SDK's own default batch size).
BATCH_SPANS = 512
#: Spans waiting to be sent beyond which new records' spans are dropped: a receiver
#: slower than the run must not grow the process without bound.
MAX_QUEUED_SPANS = 200_000
#: How long :meth:`RecordTracer.close` waits for the queue to drain, by default.
CLOSE_TIMEOUT_S = 30.0
#: How long spans wait for more to fill a batch (``OTEL_BSP_SCHEDULE_DELAY``, in
#: milliseconds, as the SDK's batch processor reads it, changes it).
FLUSH_DELAY_S = 2.0


def _flush_delay_s() -> float:
    try:
        return max(0.0, float(os.environ["OTEL_BSP_SCHEDULE_DELAY"]) / 1000)
    except (KeyError, ValueError):
        return FLUSH_DELAY_S


_EXPORTER_LOGGER = "opentelemetry.exporter"


class _LastWords(logging.Handler):
    """Keeps the SDK exporter's last complaint, instead of a log line per failed batch."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.last = record.getMessage().strip().splitlines()[0][:300]
        except Exception:  # noqa: BLE001 - a log message that cannot be formatted
            self.last = record.msg if isinstance(record.msg, str) else None


def exporter_class(settings: OtelSettings) -> type[SpanExporter]:
    """The SDK exporter class ``settings`` need (imported: a missing package is found
    before a run starts)."""
    if settings.protocol == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter
    if settings.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            from ..errors import MissingDependencyError

            raise MissingDependencyError(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc "
                "(pip install opentelemetry-exporter-otlp-proto-grpc), or use http/protobuf"
            ) from None
        return GrpcExporter  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter


def exporter_for(settings: OtelSettings) -> SpanExporter:
    """The SDK exporter ``settings`` name (headers, compression and time-outs come from
    the ``OTEL_EXPORTER_OTLP_*`` variables, as the SDK reads them)."""
    cls = exporter_class(settings)
    if settings.protocol == "console":
        return cls(out=sys.stdout)  # type: ignore[call-arg]
    return cls(endpoint=settings.endpoint)  # type: ignore[call-arg]


def _resource() -> Resource:
    """``service.name`` is ``conductor`` unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` name it."""
    detected = Resource.create({"service.version": __version__})
    name = str(detected.attributes.get("service.name", ""))
    if not name or name.startswith("unknown_service"):
        return detected.merge(Resource({"service.name": "conductor"}))
    return detected


class RecordTracer:
    """Emits each record given to :meth:`emit` as one trace (see the module doc)."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        content: bool = False,
        where: str = "the receiver",
        resource: Resource | None = None,
    ) -> None:
        self.content = content
        self._exporter = exporter
        self._provider = TracerProvider(resource=resource or _resource())
        self._tracer = self._provider.get_tracer("conductor", __version__)
        self.report = TraceReport(where)
        self._queue: deque[list[ReadableSpan]] = deque()
        self._queued = 0
        self._delay_s = _flush_delay_s()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._words = _LastWords()
        self._logger = logging.getLogger(_EXPORTER_LOGGER)
        self._logger.addHandler(self._words)
        self._propagate = self._logger.propagate
        self._logger.propagate = False

    @classmethod
    def from_settings(cls, settings: OtelSettings) -> RecordTracer:
        return cls(exporter_for(settings), content=settings.content, where=settings.describe())

    # -- making spans -------------------------------------------------------------------

    def emit(
        self,
        record: RunRecord,
        *,
        source: str | None = None,
        traceparent: str | None = None,
        line: str | None = None,
    ) -> None:
        """Queue ``record``'s spans; ``traceparent`` (a W3C trace context, from a client
        of ``conductor serve``) makes its root a child of the caller's span.  (``line``,
        the record's JSON, is for :class:`~conductor.otel._process.ProcessTracer`.)"""
        try:
            spans = self.spans(record, source=source, traceparent=traceparent)
        except Exception as exc:  # noqa: BLE001 - a record the planner chokes on must not end the run
            with self._cond:
                self.report.records += 1
                self.report.unplanned += 1
                self.report.reason = (
                    f"a record could not be made into spans ({type(exc).__name__}: {exc})"[:300]
                )
            return
        with self._cond:
            self.report.records += 1
            self.report.spans += len(spans)
            if self._closing or self._queued + len(spans) > MAX_QUEUED_SPANS:
                self.report.dropped += len(spans)
                return
            self._queue.append(spans)
            self._queued += len(spans)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name="conductor-otel", daemon=True
                )
                self._thread.start()
            if self._queued >= BATCH_SPANS or len(self._queue) == 1:
                self._cond.notify()

    def spans(
        self, record: RunRecord, *, source: str | None = None, traceparent: str | None = None
    ) -> list[ReadableSpan]:
        """``record`` as ended SDK spans (the sampled ones), not sent."""
        plans = record_spans(record, content=self.content, source=source)
        root_context = Context()  # a trace of its own, whatever span is current
        if traceparent:
            root_context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        made: list[trace.Span] = []
        for plan in plans:
            context = (
                root_context
                if plan.parent is None
                else trace.set_span_in_context(made[plan.parent])
            )
            span = self._tracer.start_span(
                plan.name,
                context=context,
                kind=SpanKind.CLIENT if plan.kind == "client" else SpanKind.INTERNAL,
                attributes=plan.attributes,
                links=[
                    Link(made[link.target].get_span_context(), link.attributes)
                    for link in plan.links
                ],
                start_time=plan.start_ns,
            )
            for event in plan.events:
                span.add_event(event.name, event.attributes, timestamp=event.time_ns)
            if plan.error:
                span.set_status(Status(StatusCode.ERROR, plan.error))
            made.append(span)
        for span, plan in zip(made, plans, strict=True):
            span.end(end_time=plan.end_ns)
        return [
            s
            for s in made
            if isinstance(s, ReadableSpan) and s.get_span_context().trace_flags.sampled
        ]

    # -- sending ------------------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                # A request per record would cost more than the spans themselves: wait
                # for a full batch, the flush delay, or the end.
                due = time.monotonic() + self._delay_s
                while (
                    self._queued < BATCH_SPANS
                    and not self._closing
                    and (left := due - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                if not self._queue:
                    return
                batch: list[ReadableSpan] = []
                while self._queue and len(batch) + len(self._queue[0]) <= BATCH_SPANS:
                    batch.extend(self._queue.popleft())
                if not batch:  # one record with more spans than a batch holds
                    batch = self._queue.popleft()
                self._queued -= len(batch)
            self._send(batch)

    def _send(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception as exc:  # noqa: BLE001 - an exporter's fault must not end the run
            result = SpanExportResult.FAILURE
            self._words.last = f"{type(exc).__name__}: {exc}"[:300]
        with self._cond:
            if result is SpanExportResult.SUCCESS:
                self.report.sent += len(batch)
            else:
                self.report.failed += len(batch)
                self.report.reason = self._words.last

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> TraceReport:
        """Send what is queued (waiting at most ``timeout_s``), close the exporter and
        return what was done; spans still queued then are counted as dropped."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        with self._cond:
            if self._queued:
                self.report.dropped += self._queued
                self.report.reason = self.report.reason or (
                    f"the receiver took longer than {timeout_s:g} s"
                )
                self._queue.clear()
                self._queued = 0
        if thread is None or not thread.is_alive():
            with contextlib.suppress(Exception):  # nothing more to send
                self._exporter.shutdown()
        self._provider.shutdown()
        self._logger.removeHandler(self._words)
        self._logger.propagate = self._propagate
        return self.report
