"""The process :class:`~conductor.otel._process.ProcessTracer` starts:
``python -m conductor.otel._child SETTINGS REPORT TIMEOUT``.

It reads records from stdin, one per line (``[source, traceparent]``, a tab, the
record's JSON), sends each as a trace, and at the end of input (the run closed the
pipe, or ended) writes what was done to ``REPORT`` as JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from ..record import record_from_dict
    from ..redact import masked_json
    from ._config import OtelSettings
    from ._export import RecordTracer

    settings = OtelSettings(**json.loads(argv[0]))
    report_path = Path(argv[1])
    timeout_s = float(argv[2])
    # Ctrl-C reaches the whole process group: the run closes the pipe, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Sending spans can wait; the run cannot: where CPUs are few, the run goes first.
    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)
    tracer = RecordTracer.from_settings(settings)
    for raw in sys.stdin.buffer:
        head, _, line = raw.partition(b"\t")
        try:
            source, traceparent = json.loads(head)
            record = record_from_dict(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - one bad record must not stop the rest
            tracer.report.records += 1
            tracer.report.unplanned += 1
            tracer.report.reason = f"a record could not be read ({type(exc).__name__}: {exc})"[:300]
            continue
        tracer.emit(record, source=source, traceparent=traceparent)
    report = tracer.close(timeout_s)
    partial = report_path.with_suffix(".partial")
    partial.write_text(masked_json(dataclasses.asdict(report)), encoding="utf-8")
    os.replace(partial, report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
