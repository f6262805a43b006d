"""The tracing options ``ask``, ``bench`` and ``serve`` share (``--otel``,
``--otel-content``, ``--no-otel``), and the tracer a command holds while it runs.

``conductor.otel`` is imported only when a command runs, and OpenTelemetry's SDK only
when it traces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from ._common import stderr

if TYPE_CHECKING:
    from ..otel import OtelSettings, ProcessTracer

__all__ = ["NoOtelOption", "OtelContentOption", "OtelOption", "otel_from_options", "tracing"]

OtelOption = Annotated[
    str | None,
    typer.Option(
        "--otel",
        metavar="URL",
        help="Send each run as OpenTelemetry GenAI spans to the OTLP/HTTP receiver at URL "
        "(/v1/traces is added). Default: OTEL_EXPORTER_OTLP_ENDPOINT, when set.",
    ),
]
OtelContentOption = Annotated[
    bool,
    typer.Option(
        "--otel-content",
        help="Put message contents on the spans (questions, prompts, replies, subtasks); "
        "off by default, as the GenAI conventions ask. Also "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true.",
    ),
]
NoOtelOption = Annotated[
    bool,
    typer.Option("--no-otel", help="Send no spans, even with OTEL_EXPORTER_OTLP_ENDPOINT set."),
]


def otel_from_options(url: str | None, content: bool, off: bool) -> OtelSettings | None:
    """Where this command's spans go (``None``: it does not trace); a setting it
    cannot use, or a missing SDK, is refused now, before anything runs."""
    import os

    from ..errors import UsageError

    if url is None and not any(name.startswith("OTEL_") for name in os.environ):
        return None  # nothing asks for traces: conductor.otel is not even imported
    from ..otel import check_installed, otel_settings

    if off and url is not None:
        raise UsageError("--otel and --no-otel contradict each other: give one")
    settings = otel_settings(url, content=content, disabled=off)
    if settings is not None:
        check_installed(settings)
    return settings


@contextlib.contextmanager
def tracing(settings: OtelSettings | None) -> Iterator[ProcessTracer | None]:
    """The command's tracer while the block runs (``None`` when it does not trace);
    at the end, what is queued is sent and a line on stderr says how that went."""
    if settings is None:
        yield None
        return
    from ..otel import describe_report, open_tracer

    tracer = open_tracer(settings)
    try:
        yield tracer
    finally:
        report = tracer.close()
        problem = report.problem()
        console = stderr()
        if problem is not None:
            console.print(f"[yellow]warning:[/] traces: {problem}", highlight=False, soft_wrap=True)
        else:
            console.print(
                f"traces: {describe_report(report)}", highlight=False, markup=False, soft_wrap=True
            )
