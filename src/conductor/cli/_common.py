"""What every command shares: the two consoles, exit codes, the error line, the
interrupt message, and the pool and cache a command opens.

Only typer is imported here; rich (for the consoles), the pool loader and the call
cache are imported when a command asks for them, so that ``--help`` (plain click text)
loads none of them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from typer.core import TyperGroup

from ..text import printable

if TYPE_CHECKING:
    from rich.console import Console

    from ..llm.cache import ResponseCache
    from ..pool import Pool
    from ..state import StateURL

__all__ = [
    "EXIT_BELOW",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "Group",
    "cache_unless",
    "echo",
    "interrupted",
    "load_pool",
    "open_cache",
    "print_error",
    "print_path",
    "state",
    "stderr",
    "stdout",
]

EXIT_FAILED = 1
EXIT_USAGE = 2
#: ``bench`` / ``report --fail-under``: a run's accuracy is below the threshold (the
#: run itself went through; CI tells the two apart).
EXIT_BELOW = 3
#: 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130


class Group(TyperGroup):
    """A command group (the root, ``pools``, ``cache``) whose ``--help``, when not
    given, imports nothing.

    Typer coerces an option's value with pydantic unless it is already a ``bool``; a
    help flag's default is ``None``, so each group above a command loaded pydantic
    for ``conductor bench --help`` and every other subcommand's help.
    """

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option


#: Set by the root callback: ``--debug`` lets errors through as tracebacks.
state: dict[str, bool] = {"debug": False}


@functools.cache
def _masking_console_class() -> type[Console]:
    """A rich console that masks every secret value of this process
    (:data:`conductor.redact.SECRETS`) in all it prints: each text is masked before it
    is laid out, so a secret wrapped or cropped at a line's end cannot slip through in
    pieces, and each piece of output a view makes itself (a segment) as it goes out.
    Made on first use: rich is not imported for ``--help``."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.text import Text

    from ..redact import SECRETS

    class MaskingConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(SECRETS.masker().text(text), **kwargs)

        def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
            masker = SECRETS.masker()
            if masker and isinstance(renderable, str):
                renderable = masker.text(renderable)
            elif masker and isinstance(renderable, Text):
                shown = masker.text(renderable.plain)
                if shown != renderable.plain:
                    # The styles of parts of the text are dropped with what they styled.
                    renderable = Text(
                        shown,
                        style=renderable.style,
                        justify=renderable.justify,
                        overflow=renderable.overflow,
                        no_wrap=renderable.no_wrap,
                        end=renderable.end,
                        tab_size=renderable.tab_size,
                    )
            for segment in super().render(renderable, options):
                if masker and segment.text and not segment.control:
                    shown = masker.text(segment.text)
                    if shown != segment.text:
                        segment = Segment(shown, segment.style, segment.control)
                yield segment

    return MaskingConsole


def stdout() -> Console:
    """Standard output.  Piped, rich lays it out for 80 columns unless COLUMNS says
    otherwise: an unbounded width would set free text on one endless line.  Every view
    keeps ids and paths whole at any width, so a pipe into grep still finds them.
    Every secret value of this process is masked (:func:`_masking_console_class`)."""
    return _masking_console_class()(soft_wrap=False)


def stderr() -> Console:
    """Standard error, every secret value of this process masked."""
    return _masking_console_class()(stderr=True)


def echo(text: str) -> None:
    """Print ``text`` as it is (JSON, Mermaid, SVG: no layout), every secret value of
    this process masked: the one way a command writes to standard output besides the
    consoles."""
    from ..redact import mask_text

    typer.echo(mask_text(text))


def print_path(console: Console, label: str, *paths: Path | str) -> None:
    """``label``, then each path on a line of its own that is never wrapped or cropped
    (a terminal may fold it on screen; copied, it is one piece)."""
    from rich.text import Text

    console.print(label, highlight=False, markup=False)
    for path in paths:
        console.print(Text(printable(str(path))), soft_wrap=True, highlight=False)


def print_error(message: str) -> None:
    from rich.markup import escape

    # One line whatever the width (scripts read it); no emoji codes such as ":x:".
    stderr().print(
        f"[red]error:[/red] {escape(printable(message))}",
        markup=True,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )


def interrupted(kept: str | None = None) -> NoReturn:
    """Say that the command was interrupted, and what it kept; exit 130."""
    message = f"interrupted: {kept}" if kept else "interrupted"
    stderr().print(printable(message), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_INTERRUPTED)


def load_pool(name_or_path: str | None) -> Pool:
    """The pool a command was pointed at: a file, a shipped name, or ``local``."""
    from ..pool import open_pool

    return open_pool(name_or_path)


def open_cache(state: StateURL | None = None) -> ResponseCache:
    """The call cache: on the state server ``--state`` (or ``$CONDUCTOR_STATE_URL``)
    names, else in this machine's cache directory."""
    from ..state import open_call_cache

    return open_call_cache(state)


def cache_unless(
    no_cache: bool, state: StateURL | None = None
) -> contextlib.AbstractContextManager[ResponseCache | None]:
    """The call cache, closed when the block ends; nothing with ``--no-cache``."""
    return contextlib.nullcontext() if no_cache else open_cache(state)
