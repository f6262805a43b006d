"""``conductor ask``: answer one question and show how the answer was made."""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, TypeVar

import typer

from ..errors import UsageError
from ._common import (
    EXIT_FAILED,
    cache_unless,
    echo,
    interrupted,
    load_pool,
    print_error,
    print_path,
    stderr,
    stdout,
)
from ._options import (
    BudgetUsdOption,
    ConductorOption,
    CostWeightOption,
    MaxCallsOption,
    MaxStepsOption,
    NoCacheOption,
    PoolOption,
    RoundsOption,
    StateOption,
    StrategyOption,
)
from ._tracing import NoOtelOption, OtelContentOption, OtelOption, otel_from_options, tracing

if TYPE_CHECKING:
    from ..conductors.spec import Conductor
    from ..events import EventSink
    from ..execute import RunSettings
    from ..llm.caller import CallerSet
    from ..pool import Pool
    from ..record import RunRecord
    from ..state import StateURL
    from ..strategies import Strategy

__all__ = ["ask"]

_T = TypeVar("_T")


def ask(
    question: Annotated[
        str | None,
        typer.Argument(help="The question to answer; - reads it from standard input."),
    ] = None,
    question_file: Annotated[
        Path | None,
        typer.Option("--file", help="Read the question from this file (UTF-8 text)."),
    ] = None,
    pool: PoolOption = None,
    conductor: ConductorOption = None,
    strategy: StrategyOption = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the run record (JSON) here.")
    ] = None,
    max_steps: MaxStepsOption = None,
    cost_weight: CostWeightOption = None,
    rounds: RoundsOption = None,
    budget_usd: BudgetUsdOption = None,
    max_calls: MaxCallsOption = None,
    template: Annotated[
        str | None,
        typer.Option("--template", help="Conductor prompt template: a built-in name or a file."),
    ] = None,
    no_cache: NoCacheOption = False,
    state: StateOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run record as JSON on stdout.")
    ] = False,
    otel: OtelOption = None,
    otel_content: OtelContentOption = False,
    no_otel: NoOtelOption = False,
) -> None:
    """Answer one question with an orchestrated workflow and show how it was made."""
    from ..conductors.spec import resolve_conductor
    from ..execute import RunSettings
    from ..llm.caller import CallerSet
    from ..llm.keys import require_keys
    from ..record import check_record_path, write_record
    from ..render import answer_panel, step_table, to_json, topology
    from ..state import state_url_from
    from ..text import check_question

    text = _question_text(question, question_file)
    check_question(text)
    state_url = state_url_from(state)  # a bad --state is said before anything runs
    if out is not None:
        check_record_path(out)
    pool_obj = load_pool(pool)
    settings = RunSettings(
        max_steps=max_steps,
        rounds=rounds if rounds is not None else 1,
        budget_usd=budget_usd,
        max_calls=max_calls,
    )
    plan: Conductor | str
    if strategy is None or strategy.strip() == "conductor":
        plan = resolve_conductor(
            pool_obj, conductor, max_steps=max_steps, template=template, cost_weight=cost_weight
        )
    else:
        plan = strategy
        _check_baseline_options(strategy, conductor, template, max_steps, rounds, cost_weight)
    # A baseline's spelling checked, and every missing key at once, before any call.
    require_keys(_strategy(plan, pool_obj, settings, CallerSet(None)).targets)
    traced = otel_from_options(otel, otel_content, no_otel)
    started: list[RunRecord] = []
    with tracing(traced) as tracer:
        try:
            record = _run_with_progress(
                lambda events: _ask_async(
                    text, pool_obj, plan, settings, no_cache, state_url, events, started.append
                ),
                show=not as_json,
            )
        except KeyboardInterrupt:
            interrupted(_keep_interrupted(started[0] if started else None, out, no_cache))
        if out is not None:
            write_record(record, out)
        if tracer is not None:
            tracer.emit(record, source=str(out) if out is not None else None)
    if as_json:
        echo(to_json(record))
    else:
        console = stdout()
        console.print(topology(record))
        console.print(step_table(record))
        console.print(answer_panel(record))
        if out is not None:
            print_path(console, "record written to (replay it with: conductor trace PATH)", out)
    if record.status == "failed":
        # One plain sentence on stderr as well, for scripts and narrow terminals.
        print_error(f"the run failed: {record.error or ''}")
        raise typer.Exit(EXIT_FAILED)


def _check_baseline_options(
    strategy: str,
    conductor: str | None,
    template: str | None,
    max_steps: int | None,
    rounds: int | None,
    cost_weight: float | None = None,
) -> None:
    """Refuse what only the Conductor uses beside a baseline, and ``singles``."""
    if strategy.strip() == "singles":
        raise UsageError(
            "--strategy singles runs every worker as a run of its own, which is bench's; "
            "ask one worker with --strategy single:WORKER"
        )
    given = [
        name
        for name, value in (
            ("--conductor", conductor),
            ("--template", template),
            ("--max-steps", max_steps),
            ("--cost-weight", cost_weight),
            # ``--rounds 1`` is every run's, a baseline's too.
            ("--rounds", None if rounds == 1 else rounds),
        )
        if value is not None
    ]
    if given:
        raise UsageError(f"{given[0]} applies to --strategy conductor only")


async def _ask_async(
    question: str,
    pool: Pool,
    plan: Conductor | str,
    settings: RunSettings,
    no_cache: bool,
    state: StateURL | None,
    events: EventSink | None,
    on_record: Callable[[RunRecord], None] | None = None,
) -> RunRecord:
    """One question, by the Conductor ``plan`` or the baseline it names."""
    from ..llm.caller import CallerSet
    from ..state import open_rates

    with cache_unless(no_cache, state) as cache:
        callers = CallerSet(cache, rates=open_rates(state))
        callers.declare(pool.workers)
        chosen = _strategy(plan, pool, settings, callers)
        try:
            return await chosen.run(question, sample_index=0, events=events, on_record=on_record)
        finally:
            await chosen.aclose()


def _strategy(
    plan: Conductor | str, pool: Pool, settings: RunSettings, callers: CallerSet
) -> Strategy:
    """The Conductor ``plan``, or the baseline it names (votes read short answers)."""
    from ..strategies import ConductorStrategy, parse_strategy, short_answer_key
    from ..strategies.router import is_router_strategy, router_strategy

    if isinstance(plan, str) and is_router_strategy(plan):

        def conductor_arm() -> Strategy:
            from ..conductors.spec import resolve_conductor

            chosen = resolve_conductor(pool, None, max_steps=settings.max_steps)
            return ConductorStrategy(pool, chosen, settings, callers)

        return router_strategy(
            plan,
            pool,
            callers,
            conductor=conductor_arm,
            vote_key=short_answer_key,
            settings=settings,
        )
    if isinstance(plan, str):
        return parse_strategy(plan, pool, callers, vote_key=short_answer_key, settings=settings)
    return ConductorStrategy(pool, plan, settings, callers)


def _keep_interrupted(record: RunRecord | None, out: Path | None, no_cache: bool) -> str:
    """Write what an interrupted ``ask`` did (to ``--out``), and say what was kept."""
    from ..record import write_record

    finished = 0
    if record is not None and record.finished_at is None:
        # A second Ctrl-C can stop the run before it finished its own record.
        from datetime import datetime, timezone

        from ..steps import finish_interrupted

        started = datetime.fromisoformat(record.started_at)
        finish_interrupted(record, (datetime.now(timezone.utc) - started).total_seconds())
    if record is not None:
        finished = sum(1 for c in record.all_calls() if c.response is not None and not c.error)
    calls = f"{finished} finished call{'' if finished == 1 else 's'}"
    if out is not None and record is not None:
        try:
            write_record(record, out)
        except OSError as exc:  # still exit 130: the interrupt is what happened
            return f"the record could not be written to {out} ({exc.strerror or exc})"
        return f"the record of the steps done so far ({calls}) is in {out} (conductor trace {out})"
    kept = "nothing was recorded"
    if out is None:
        kept += " (--out FILE keeps the record of the steps done)"
    if finished and not no_cache:
        kept += f"; the {calls} are in the call cache, and asking again reuses them"
    return kept


def _question_text(question: str | None, path: Path | None) -> str:
    """The question: the argument, standard input (``-``) or the ``--file``.

    Text read from a file or standard input loses its surrounding whitespace (the
    final newline, mostly).  At most one character over the question limit is read,
    so a runaway input is refused without being held in memory.
    """
    if question is not None and path is not None:
        raise UsageError("give the question either as an argument or with --file, not both")
    if path is not None:
        from ..userfiles import UnreadableFileError, open_regular

        try:
            # A regular file only: a pipe is read with `conductor ask -`.
            stream = open_regular(path, "question file")
        except UnreadableFileError as exc:
            if exc.kind != "not_regular":
                raise
            raise UsageError(f"{exc} (a question from a pipe: conductor ask -)") from None
        with stream:
            return _read_question(stream, str(path))
    if question == "-":
        if sys.stdin is None:
            raise UsageError("there is no standard input to read the question from")
        if sys.stdin.isatty():
            stderr().print("reading the question from standard input; end it with Ctrl-D")
        return _read_question(sys.stdin.buffer, "standard input")
    if question is None:
        raise UsageError(
            'give a question: conductor ask "QUESTION", conductor ask - (read from '
            "standard input) or conductor ask --file PATH"
        )
    return question


def _read_question(stream: BinaryIO, where: str) -> str:
    from ..text import question_limit

    limit = question_limit()
    # A character is at most 4 bytes of UTF-8: more bytes than this is over the limit.
    cap = 4 * limit + 4
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise UsageError(
            f"the question in {where} is over the limit of {limit:,} characters "
            "(set CONDUCTOR_MAX_QUESTION_CHARS to change it)"
        )
    try:
        return data.decode("utf-8-sig").strip()
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the question in {where} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None


def _run_with_progress(
    make: Callable[[EventSink | None], Coroutine[Any, Any, _T]], *, show: bool
) -> _T:
    """Run a coroutine factory, showing a live progress view on stderr when useful."""
    import asyncio  # here, not above: ``conductor ask --help`` runs no event loop

    console = stderr()
    if not show or not console.is_terminal:
        return asyncio.run(make(None))
    from rich.live import Live

    from ..render import ProgressView

    view = ProgressView()
    with Live(view, console=console, refresh_per_second=8, transient=True):
        return asyncio.run(make(view))
