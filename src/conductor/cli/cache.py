"""``conductor cache stats|clear``: inspect or clear the call cache (this host's files,
or the ``--state`` server's entries)."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from ..errors import CacheError, UsageError
from ..text import plural
from ._common import Group, open_cache, print_path, stdout
from ._options import StateOption

__all__ = ["cache_app"]

cache_app = typer.Typer(
    cls=Group, help="Inspect or clear the on-disk call cache.", no_args_is_help=True
)


def _parse_age(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r} is not an age like 30m, 12h, 7d or 2w")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    return float(m.group(1)) * unit


@cache_app.command("stats")
def cache_stats(state: StateOption = None) -> None:
    """Show where the cache is and how much it holds."""
    from datetime import datetime

    from ..state import state_url_from

    with open_cache(state_url_from(state)) as cache:
        s = cache.stats()

    def when(t: float | None) -> str:
        return datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "-"

    console = stdout()
    print_path(console, f"{s.kind}:", s.where)
    console.print(f"entries:   {s.entries}")
    console.print(f"size:      {s.size_bytes / 1e6:.2f} MB")
    console.print(f"oldest:    {when(s.oldest)}")
    console.print(f"newest:    {when(s.newest)}")


@cache_app.command("clear")
def cache_clear(
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", help="Only entries older than this age (e.g. 7d, 12h)."),
    ] = None,
    state: StateOption = None,
) -> None:
    """Delete cached calls (all, or those older than an age).  A damaged cache database
    cannot be read to be cleared: it is deleted and made again empty."""
    from ..llm.cache import discard_cache
    from ..state import state_url_from

    age = _parse_age(older_than) if older_than else None
    try:
        with open_cache(state_url_from(state)) as cache:
            removed = cache.clear(age)
    except CacheError as exc:
        if not exc.corrupt:
            raise
        if age is not None:
            raise UsageError(
                f"{exc}; its entries cannot be told apart by age, so --older-than cannot "
                "be used: run `conductor cache clear` without it"
            ) from None
        discard_cache(exc.path)
        open_cache().close()  # recreated, empty and private
        stdout().print(
            f"the cache database in {exc.path} was damaged: deleted it and made it again, empty"
        )
        return
    stdout().print(f"removed {plural(removed, 'cached call')}")
