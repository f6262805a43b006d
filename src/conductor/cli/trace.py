"""``conductor trace``: replay a recorded run, or list the samples of a bench run."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from ..bounds import SAMPLES
from ..errors import UsageError
from ..text import printable
from ..userfiles import is_regular
from ._common import echo, stdout

if TYPE_CHECKING:
    from ..record import RunRecord

__all__ = ["TraceFormat", "trace"]


class TraceFormat(str, Enum):
    """How ``conductor trace`` shows a run."""

    table = "table"
    tree = "tree"
    mermaid = "mermaid"
    svg = "svg"
    json = "json"


def trace(
    run: Annotated[Path, typer.Argument(help="A run record (run.json) or a bench run directory.")],
    sample: Annotated[
        str | None,
        typer.Option(
            "--sample",
            "-s",
            help="Sample id to show, for a run directory (without it, the samples are listed).",
        ),
    ] = None,
    fmt: Annotated[
        TraceFormat,
        typer.Option("--format", "-f", help="How to show a run.", case_sensitive=False),
    ] = TraceFormat.table,
    verdict: Annotated[
        str | None,
        typer.Option("--verdict", help="List only the samples with this verdict (e.g. incorrect)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=SAMPLES.low, max=SAMPLES.high, help="List at most N samples."),
    ] = None,
) -> None:
    """Replay a recorded run step by step, or list the samples of a bench run."""
    from rich.rule import Rule
    from rich.text import Text

    from ..record import read_record
    from ..render import SampleListing, to_json, to_mermaid, trace_renderable
    from ..runs.rundir import SAMPLES, find_sample, iter_heads, sample_dirs

    if run.name == SAMPLES and is_regular(run):
        run = run.parent  # the file of a run directory: read as the directory
    listing = run.is_dir() and sample is None
    if not listing and (verdict is not None or limit is not None):
        raise UsageError(
            "--verdict and --limit apply to the list of a bench run's samples "
            "(a run directory without --sample)"
        )
    console = stdout()
    if listing:
        if fmt in ("mermaid", "svg", "json"):
            raise UsageError(
                f"--format {fmt.value} shows one sample; give --sample ID "
                f"(conductor trace {run} lists them)"
            )
        if verdict is not None:
            _check_verdict(verdict)
        dirs = sample_dirs(run)
        any_rows = False
        for d in dirs:
            if d != run:
                console.print(Rule(Text(printable(d.name), style="bold")))
            # The list reads each record without its rounds' calls: building every call
            # of 100,000 records took most of the 20 s the list took.
            listed = SampleListing(iter_heads(d / SAMPLES), verdict=verdict, limit=limit)
            any_rows = any_rows or bool(listed.rows)
            # Not cropped: an id wider than the terminal is printed whole and left to wrap.
            console.print(listed, crop=False)
        if any_rows:
            where = printable(str(dirs[0] if len(dirs) == 1 else run))
            console.print(
                f"one sample's trace: conductor trace {where} --sample ID",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
        return
    shown: list[tuple[Path | None, RunRecord]] = []
    if run.is_dir():
        shown = [(d if d != run else None, r) for d, r in find_sample(run, str(sample))]
    else:
        record = read_record(run)
        if sample is not None and sample not in (record.sample_id, record.run_id):
            raise UsageError(f"{run}: no sample with id {sample!r}")
        shown.append((None, record))
    for sub_run, record in shown:
        if fmt == "json":
            echo(to_json(record))
        elif fmt == "mermaid":
            echo(to_mermaid(record))
        elif fmt == "svg":
            from ..view.graph import workflow_svg

            echo(workflow_svg(record))
        else:
            if sub_run is not None:
                console.print(Rule(Text(printable(sub_run.name), style="bold")))
            style: Literal["table", "tree"] = "tree" if fmt is TraceFormat.tree else "table"
            console.print(trace_renderable(record, style), crop=False)


def _check_verdict(verdict: str) -> None:
    import difflib

    from ..runs.summary import STATUSES

    known = (*STATUSES, "ungraded")  # ungraded: ask and serve records
    if verdict not in known:
        close = difflib.get_close_matches(verdict, known, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"--verdict {verdict!r} is not a verdict; {guess}(one of {', '.join(known)})"
        )
