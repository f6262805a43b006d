"""``conductor export otel RUN...``: replay recorded runs as OpenTelemetry traces."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError
from ..text import plural, printable
from ..userfiles import check_regular
from ._common import EXIT_FAILED, Group, stderr
from ._tracing import OtelContentOption, OtelOption, otel_from_options, tracing

if TYPE_CHECKING:
    from ..record import RunRecord

__all__ = ["export_app"]

export_app = typer.Typer(cls=Group, help="Send recorded runs to other tools.", no_args_is_help=True)


@export_app.command("otel")
def export_otel(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run records: an ask record (--out FILE), a bench run directory, a serve "
            "--records directory, or a samples.jsonl.",
        ),
    ],
    otel: OtelOption = None,
    otel_content: OtelContentOption = False,
    sample: Annotated[
        str | None,
        typer.Option("--sample", "-s", help="Only the records of this sample id (or run id)."),
    ] = None,
) -> None:
    """Send recorded runs as OpenTelemetry GenAI spans, with the times they were recorded
    at: the spans a run emits live with --otel.

    Exits 1 when a record could not be read or a span could not be sent.
    """
    settings = otel_from_options(otel, otel_content, False)
    if settings is None:
        raise UsageError(
            "say where to send the spans: --otel URL (an OTLP/HTTP receiver, e.g. "
            "http://localhost:4318) or OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    sources = [_sources(run) for run in runs]  # every path checked before any is sent
    console = stderr()
    unread = 0
    exported = 0
    with tracing(settings) as held:
        assert held is not None
        tracer = held
        for found in sources:
            for where, record in found:
                if record is None:
                    unread += 1
                    continue
                if sample is not None and sample not in (record.sample_id, record.run_id):
                    continue
                tracer.emit(record, source=where)
                exported += 1
    report = tracer.report
    assert report is not None  # closed by the block
    if unread:
        verb = "was" if unread == 1 else "were"
        console.print(
            f"[yellow]warning:[/] {plural(unread, 'record')} could not be read and {verb} "
            "left out (the lines are named above)",
            highlight=False,
        )
    if sample is not None and not exported:
        raise UsageError(f"no record with sample id or run id {sample!r} in {printable(str(runs))}")
    if unread or report.failed or report.dropped:
        raise typer.Exit(EXIT_FAILED)


def _sources(run: Path) -> Iterator[tuple[str, RunRecord | None]]:
    """The records ``run`` holds, each with where it is kept (``None`` for a line that
    is not a record: it is named in a warning, and the rest are still sent)."""
    from ..record import read_record
    from ..runs.rundir import SAMPLES, sample_dirs

    if not os.path.lexists(run):
        raise UsageError(f"{run}: no such file or directory")
    if run.is_dir():
        files = [d / SAMPLES for d in sample_dirs(run)]
    elif run.name == SAMPLES or run.suffix == ".jsonl":
        files = [run]
    else:
        record = read_record(run)  # an ask record: one error for the one record
        return iter([(str(run), record)])
    for path in files:
        check_regular(path, "samples file")  # a FIFO or a device refused before sending
    return _lines(files)


def _lines(files: list[Path]) -> Iterator[tuple[str, RunRecord | None]]:
    from ..errors import RecordError
    from ..runs.rundir import SampleLines, record_of

    console = stderr()
    for path in files:
        lines = SampleLines(path)
        for number, data in lines:
            try:
                yield str(path), record_of(path, number, data)
            except RecordError as exc:
                console.print(f"[yellow]warning:[/] {printable(str(exc))}", highlight=False)
                yield str(path), None
        if lines.skipped:
            for _ in range(lines.skipped):
                yield str(path), None
