"""``conductor view``: an HTML page of runs, with its details in a directory beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import MissingDependencyError, install_hint
from ..text import printable
from ._common import echo

__all__ = ["view"]


def view(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Runs to show: ask records (run.json), bench run directories "
            "(a singles run is one run per worker) or serve records directories."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="The HTML file to write (its details go to a directory beside it, "
            "named after it: PAGE.details).",
            dir_okay=False,
        ),
    ] = Path("conductor-view.html"),
    open_: Annotated[
        bool, typer.Option("--open", help="Open the page in the default web browser.")
    ] = False,
) -> None:
    """Write one HTML page of runs (overview, samples, workflow graphs, comparison, charts)
    and, beside it, the samples' details (PAGE.details/, read as a sample is opened); it
    opens from disk and makes no network request."""
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            f"conductor view needs jinja2 and matplotlib ({exc.name} is missing): "
            f"{install_hint('view')}"
        ) from None
    from ..view.data import load_runs
    from ..view.page import write_view

    written = write_view(load_runs(runs), out)
    echo(printable(str(written)))
    if open_:
        import webbrowser

        webbrowser.open(written.resolve().as_uri())
