"""``conductor pools list|show|check``: the shipped pools, one pool's workers, and one
tiny request to each of its models (sent by :mod:`conductor.pool_check`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import ConductorError
from ..redact import redact_params, redact_url
from ..text import plural, printable
from ._common import EXIT_FAILED, Group, load_pool, print_path, stdout

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..pool_check import PingResult

__all__ = ["pools_app"]

pools_app = typer.Typer(cls=Group, help="List, show and check pool files.", no_args_is_help=True)


@pools_app.command("list")
def pools_list() -> None:
    """List the pools shipped with conductor."""
    from rich.table import Table
    from rich.text import Text

    from ..pool import builtin_pools_dir, list_builtin_pools
    from ..pool import load_pool as load_pool_file

    table = Table(title="shipped pools")
    # Names are what --pool takes: never wrapped.  Descriptions and errors wrap.
    table.add_column("name", no_wrap=True)
    table.add_column("workers", justify="right", no_wrap=True)
    table.add_column("conductor", no_wrap=True)
    table.add_column("description")
    for path in list_builtin_pools():
        try:
            p = load_pool_file(path)
        except ConductorError as exc:
            table.add_row(path.stem, "-", "-", Text(printable(str(exc)), style="red"))
            continue
        backend = p.conductor.backend if p.conductor else "-"
        table.add_row(p.name, str(len(p.workers)), backend, Text(printable(p.description or "")))
    console = stdout()
    console.print(table)
    print_path(console, "files (NAME.yaml, to copy and edit) in:", builtin_pools_dir())


@pools_app.command("show")
def pools_show(
    pool: Annotated[str, typer.Argument(help="Pool file or shipped pool name.")],
) -> None:
    """Show a pool's workers in the order the Conductor sees them."""
    from rich.table import Table
    from rich.text import Text

    from ..render import Fitted

    p = load_pool(pool)
    title = Text(printable(f"pool {p.name}" + (f": {p.description}" if p.description else "")))
    wide = Table(title=title)
    for col in ("Conductor sees", "id", "model", "client", "endpoint"):
        wide.add_column(col, no_wrap=True)
    wide.add_column("params")
    wide.add_column("conc.", justify="right", no_wrap=True)
    # Narrower than the table: one worker per block, each id and URL on a line.
    stacked = Table(title=title, box=None, show_header=False, padding=(0, 1))
    stacked.add_column("sees", no_wrap=True)
    stacked.add_column("worker")
    keep: list[str] = []
    for i, w in enumerate(p.workers):
        shown = redact_params(w.params)
        params = printable(", ".join(f"{k}={v}" for k, v in shown.items()))
        endpoint = printable(redact_url(w.api_base) if w.api_base else "-")
        cells = (w.id, w.model, w.client, endpoint, params)  # Text: never read as markup
        wide.add_row(f"Model {i}", *map(Text, cells), str(w.max_concurrency))
        block = Text(w.id, style="bold")
        block.append(f"\nmodel {w.model}\nclient {w.client}, concurrency {w.max_concurrency}")
        block.append(f"\nendpoint {endpoint}" + (f"\nparams {params}" if params else ""))
        stacked.add_row(f"Model {i}", block)
        keep += [w.id, w.model, endpoint]
    console = stdout()
    console.print(Fitted([wide, stacked], keep))
    if p.conductor is not None:
        c = p.conductor
        where = f" at {redact_url(c.api_base)}" if c.api_base else ""
        console.print(
            f"conductor: {c.backend} {c.model or ''}{where} (template {c.template}, "
            f"max {plural(c.max_steps, 'step')}{', constrained' if c.constrained else ''})",
            highlight=False,
        )
    else:
        console.print("conductor: none (pass --conductor)")


@pools_app.command("check")
def pools_check(
    pool: Annotated[str, typer.Argument(help="Pool file or shipped pool name.")],
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for each worker.")
    ] = 60.0,
) -> None:
    """Validate a pool and send one tiny request to each worker (and the Conductor),
    after checking that every API key they need is set."""
    from ..pool_check import check_keys, check_pool, plan_pings

    p = load_pool(pool)
    plan = plan_pings(p)
    check_keys(plan)  # before any row is shown: a missing key is one sentence, as for ask
    console = stdout()
    if console.is_terminal:
        from rich.live import Live

        rows = _CheckRows(f"pool {p.name}: one tiny request per model", plan.rows)
        with Live(rows, console=console, refresh_per_second=8, transient=False) as live:

            def show(result: PingResult) -> None:
                rows.add(result)
                live.refresh()

            results = check_pool(p, timeout_s, plan=plan, on_result=show)
    else:
        # Piped: one plain line per model as it answers, for a log or grep.
        results = check_pool(p, timeout_s, plan=plan, on_result=lambda r: _print_line(console, r))
    failed = sum(1 for r in results if not r.ok)
    answered = plural(len(results), "model", shown=f"{len(results) - failed} of {len(results)}")
    console.print(f"{answered} answered", highlight=False)
    if failed:
        raise typer.Exit(EXIT_FAILED)


class _CheckRows:
    """The check's table, one row per model, each filled in when its result comes."""

    def __init__(self, title: str, rows: list[tuple[str, str]]) -> None:
        self.title = title
        self.rows = rows
        self.results: dict[tuple[str, str], PingResult] = {}

    def add(self, result: PingResult) -> None:
        self.results[(result.label, result.worker_id)] = result

    def __rich__(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title)
        for col in ("model", "id", "result", "latency (s)", "reply"):
            table.add_column(col)
        for label, wid in self.rows:
            r = self.results.get((label, wid))
            model, who = Text(label), Text(printable(wid))  # never read as markup
            if r is None:
                table.add_row(model, who, Text("waiting", style="dim"), "", "")
            elif r.error is None:
                reply = Text(printable(r.reply[:40]))
                table.add_row(model, who, Text("ok", style="green"), f"{r.latency_s:.2f}", reply)
            else:
                table.add_row(model, who, Text(printable(r.error), style="red"), "-", "")
        return table


def _print_line(console: Console, r: PingResult) -> None:
    """One model's result as one unwrapped line."""
    if r.error is None:
        line = f"{r.label}  {r.worker_id}  ok  {r.latency_s:.2f} s  {r.reply[:40]!r}"
    else:
        line = f"{r.label}  {r.worker_id}  failed: {r.error}"
    console.print(printable(line), markup=False, highlight=False, soft_wrap=True)
