"""An OTLP/HTTP traces receiver for tests, on 127.0.0.1: it decodes each export request
with OpenTelemetry's own protobuf classes (opentelemetry-proto) and keeps the spans, or
answers with the status a test asks for."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OtlpReceiver", "ReceivedSpan"]


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` serves ``r.url`` (``POST /v1/traces``); ``status``
    other than 200 refuses every request with it."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.spans: list[ReceivedSpan] = []
        self.requests: list[dict[str, str]] = []
        #: Every export request's body as sent (decompressed): what a byte search reads.
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.requests.append({k.lower(): v for k, v in self.headers.items()})
                    receiver.bodies.append(body)
                if self.path != "/v1/traces" or receiver.status != 200:
                    status = 404 if self.path != "/v1/traces" else receiver.status
                    self.send_response(status)
                    self.send_header("content-length", "11")
                    self.end_headers()
                    self.wfile.write(b"not wanted!")
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                got = []
                for rs in request.resource_spans:
                    resource = _attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            got.append(
                                ReceivedSpan(
                                    name=s.name,
                                    trace_id=s.trace_id.hex(),
                                    span_id=s.span_id.hex(),
                                    parent_id=s.parent_span_id.hex() or None,
                                    kind=s.kind,
                                    start_ns=s.start_time_unix_nano,
                                    end_ns=s.end_time_unix_nano,
                                    attributes=_attrs(s.attributes),
                                    events=[(e.name, _attrs(e.attributes)) for e in s.events],
                                    links=[
                                        (link.span_id.hex(), _attrs(link.attributes))
                                        for link in s.links
                                    ],
                                    status_code=s.status.code,
                                    resource=resource,
                                )
                            )
                with receiver._lock:
                    receiver.spans.extend(got)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        out: dict[str, list[ReceivedSpan]] = {}
        with self._lock:
            for s in self.spans:
                out.setdefault(s.trace_id, []).append(s)
        return out

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
