"""The ``conductor`` application: the command tree, the root options, and
:func:`main`, which turns the errors the library raises on purpose into one sentence
on stderr and an exit code (2 for bad input, 1 for a failed run, 130 for ``Ctrl-C``);
a traceback is shown only with ``--debug`` (or for a bug), and like everything a command
prints, with every secret value of the process masked (:mod:`conductor.redact`).

Each command lives in a module of its own and imports the heavy libraries it needs
when it runs, so that ``conductor --help`` and ``conductor trace`` start instantly.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from typing import Annotated, Any, NoReturn

import typer

from .. import __version__
from ..errors import ConductorError, UsageError
from ._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Group,
    interrupted,
    print_error,
    state,
    stderr,
)
from .ask import ask
from .bench import bench, report
from .cache import cache_app
from .export import export_app
from .fit_router import fit_router
from .pools import pools_app
from .serve import serve
from .trace import trace
from .train import train
from .view import view

__all__ = ["app", "main"]


class _Commands(Group):
    """The command group; a ``Ctrl-C`` that no command handled ends here.

    Typer would turn it into a silent exit 130; this says so.  Commands that keep
    something (``ask``'s record, ``bench``'s samples) catch it first and say what.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()


app = typer.Typer(
    cls=_Commands,
    name="conductor",
    help=(
        "Run and evaluate Conductor orchestrations: a Conductor model writes a workflow "
        "for each question and a pool of worker LLMs carries it out."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(pools_app, name="pools")
app.add_typer(cache_app, name="cache")
app.add_typer(export_app, name="export")
for command in (ask, serve, bench, report, trace, view, train, fit_router):
    app.command()(command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"conductor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and debug logs on stderr.")
    ] = False,
    # Plain ``bool`` (not ``bool | None``): typer coerces a flag of any other type with
    # pydantic, which every subcommand's --help would then import.
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Conductor: learned orchestration of LLM teams."""
    from ..redact import MaskingFilter

    state["debug"] = debug
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    # Every log line, tracebacks included, has the process's secret values masked.
    handler.addFilter(MaskingFilter())
    logger = logging.getLogger("conductor")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn errors into exit codes."""
    try:
        app(args=argv, standalone_mode=True)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            _abandon_local_work()
        raise
    except UsageError as exc:
        if state["debug"]:
            _traceback_exit(EXIT_USAGE)
        print_error(str(exc))
        sys.exit(EXIT_USAGE)
    except ConductorError as exc:
        if state["debug"]:
            _traceback_exit(EXIT_FAILED)
        print_error(str(exc))
        sys.exit(EXIT_FAILED)
    except OSError as exc:
        # A file or directory the command was pointed at (an --out under a read-only
        # directory, a path through a regular file): one line, not a traceback.
        if state["debug"]:
            _traceback_exit(EXIT_USAGE if exc.errno in _USER_PATH_ERRNOS else EXIT_FAILED)
        print_error(_describe_os_error(exc))
        sys.exit(EXIT_USAGE if exc.errno in _USER_PATH_ERRNOS else EXIT_FAILED)
    except KeyboardInterrupt:
        stderr().print("interrupted")
        _abandon_local_work()
        sys.exit(EXIT_INTERRUPTED)
    except Exception:  # noqa: BLE001 - a bug: its traceback, masked, as Python would print it
        _traceback_exit(EXIT_FAILED)


def _traceback_exit(code: int) -> NoReturn:
    """Print the exception being handled as Python would (``--debug``, or a bug), every
    secret value of the process masked (a message may quote a URL), and exit ``code``.
    Written here rather than left to ``sys.excepthook``: typer replaces the hook with
    its own when the app is called."""
    import traceback

    from ..redact import mask_text

    sys.stderr.write(mask_text(traceback.format_exc()))
    sys.stderr.flush()
    sys.exit(code)


def _abandon_local_work() -> None:
    """Leave now, after ``Ctrl-C``, even while a local model is busy.

    An interrupted command has already cancelled its calls, run its ``finally``
    blocks (records written, cache closed) and said what it kept.  Local models run in
    host processes of their own: ending them stops whatever they were doing (a load, a
    long prompt) at once, so the process can exit without waiting for any of it.
    """
    local = sys.modules.get("conductor.localmodel.models")
    if local is None:
        return
    with contextlib.suppress(Exception):
        local.stop_all(kill=True)


# OS errors that mean "that path cannot be used as given", which the user can fix.
_USER_PATH_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENOENT,
        errno.EEXIST,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


def _describe_os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename is not None else ""
    what = exc.strerror or str(exc)
    return f"{where}{what}; check the path and its permissions"
