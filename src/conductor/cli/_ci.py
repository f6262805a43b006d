"""What ``bench`` and ``report`` share for CI: ``--fail-under`` (a threshold on
accuracy, exit 3 below it), ``--junit FILE`` and ``--markdown FILE`` (summaries for CI
systems, written by :mod:`conductor.render.junit` and :mod:`conductor.render.markdown`).

Everything is checked before a bench run is paid for; the files are written and the
threshold applied once the report has been printed.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError
from ..text import printable
from ..userfiles import resolved
from ._common import EXIT_BELOW, EXIT_FAILED, print_path, stderr, stdout

if TYPE_CHECKING:
    from ..runs.summary import RunSummary

__all__ = ["CiOutputs", "FailUnderOption", "JunitOption", "MarkdownOption", "parse_fail_under"]

#: The options ``bench`` and ``report`` share for CI: a threshold and two summaries.
FailUnderOption = Annotated[
    str | None,
    typer.Option(
        "--fail-under",
        metavar="PCT",
        help="Exit 3 (after the summary) when a run's accuracy is below PCT percent: "
        "0 to 100, such as 80 or 62.5% (a value from 0 to 1 without % is refused as "
        "ambiguous: write 80, not 0.8).",
    ),
]
JunitOption = Annotated[
    Path | None,
    typer.Option(
        "--junit",
        metavar="FILE",
        help="Also write a JUnit XML report for CI: a testsuite per run (accuracy, its "
        "95% interval and the cost as properties), a testcase per sample and epoch.",
    ),
]
MarkdownOption = Annotated[
    Path | None,
    typer.Option(
        "--markdown",
        metavar="FILE",
        help="Also write the scores as a GitHub-flavoured Markdown table (for "
        "$GITHUB_STEP_SUMMARY, which it replaces).",
    ),
]


def parse_fail_under(text: str) -> float:
    """``--fail-under``'s value as a percentage; a :class:`UsageError` (exit 2) for
    text that is not one, or for a bare value from 0 to 1 (80% or 0.8%?)."""
    raw = text.strip()
    number = raw.removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(
            f"--fail-under {text!r}: give the accuracy to reach in percent, such as 80 or 62.5%"
        )
    if not 0 <= value <= 100:
        raise UsageError(f"--fail-under {text}: an accuracy in percent is from 0 to 100")
    if 0 < value <= 1 and not raw.endswith("%"):
        raise UsageError(
            f"--fail-under {text} is ambiguous: accuracy is in percent, so write "
            f"{100 * value:g} for {100 * value:g}% (or {number}% for {number} percent)"
        )
    return value


def _check_writable(option: str, path: Path) -> None:
    """Refuse, before a run is paid for, a path its file could never be written to."""
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give the path of a file to write")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"{option} {path}: {parent} is not a writable directory; choose another path"
        )


def _write_file(option: str, what: str, path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename),
    every secret value of this process masked."""
    from ..redact import mask_text

    text = mask_text(text)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(
            f"{option} {path}: cannot be written ({exc.strerror or exc}); choose another path"
        ) from None
    print_path(stdout(), f"{what} ({option}) written to", path)


@dataclass(frozen=True)
class CiOutputs:
    """What ``--fail-under``, ``--junit`` and ``--markdown`` ask for, checked before
    anything runs and carried out once the summaries are printed."""

    fail_under: float | None
    junit: Path | None
    markdown: Path | None

    @classmethod
    def of(cls, fail_under: str | None, junit: Path | None, markdown: Path | None) -> CiOutputs:
        threshold = None if fail_under is None else parse_fail_under(fail_under)
        if junit is not None and markdown is not None and resolved(junit) == resolved(markdown):
            raise UsageError(f"--junit and --markdown both name {junit}; give two files")
        for option, path in (("--junit", junit), ("--markdown", markdown)):
            if path is not None:
                _check_writable(option, path)
        return cls(threshold, junit, markdown)

    def finish(self, summaries: list[RunSummary], *, failed: bool) -> None:
        """Write the files, say which runs fall short, and exit with the code due:
        1 when the runs failed, else 3 when one falls short."""
        from ..runs.summary import falls_short

        if self.junit is not None:
            from ..render.junit import junit_xml

            _write_file(
                "--junit", "JUnit report", self.junit, junit_xml(summaries, self.fail_under)
            )
        if self.markdown is not None:
            from ..render.markdown import markdown_summary

            _write_file(
                "--markdown",
                "Markdown summary",
                self.markdown,
                markdown_summary(summaries, self.fail_under),
            )
        threshold = self.fail_under
        short = [] if threshold is None else [s for s in summaries if falls_short(s, threshold)]
        for s in short:
            assert threshold is not None
            acc = "no graded records"
            if s.accuracy is not None:
                acc = f"accuracy {_exact(s.accuracy, threshold)}%"
            stderr().print(
                printable(
                    f"{s.run_dir} ({s.label}): {acc}, below --fail-under {threshold:g}% "
                    f"(exit {EXIT_BELOW})"
                ),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        if failed:
            raise typer.Exit(EXIT_FAILED)
        if short:
            raise typer.Exit(EXIT_BELOW)


def _exact(accuracy: float, threshold: float) -> str:
    """The accuracy with as many decimals as it takes to show it below the threshold
    (49.996 is not "50.00" when the threshold is 50)."""
    for digits in range(2, 8):
        text = f"{accuracy:.{digits}f}"
        if float(text) < threshold:
            return text
    return repr(accuracy)
