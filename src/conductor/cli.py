"""The ``conductor`` command line: parse options, call the library, render the result.

This is the only module that prints.  Errors the library raises on purpose become one
sentence on stderr and an exit code (2 for bad input, 1 for a failed run); a traceback
is shown only with ``--debug``.  Heavy libraries are imported inside the commands that
need them so that ``conductor --help`` and ``conductor trace`` start instantly.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, Literal, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from typer.core import TyperGroup

from . import __version__
from .errors import ConductorError, UsageError
from .text import plural, printable

if TYPE_CHECKING:
    from .cache import ResponseCache
    from .pool import Pool, Worker
    from .record import RunRecord

__all__ = ["TraceFormat", "app", "main"]


class TraceFormat(str, Enum):
    """How ``conductor trace`` shows a run."""

    table = "table"
    tree = "tree"
    mermaid = "mermaid"
    json = "json"


EXIT_FAILED = 1
EXIT_USAGE = 2
#: 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C.
EXIT_INTERRUPTED = 130


def _interrupted(kept: str | None = None) -> NoReturn:
    """Say that the command was interrupted, and what it kept; exit 130."""
    message = f"interrupted: {kept}" if kept else "interrupted"
    _err().print(printable(message), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_INTERRUPTED)


class _Commands(TyperGroup):
    """The command group; a ``Ctrl-C`` that no command handled ends here.

    Typer would turn it into a silent exit 130; this says so.  Commands that keep
    something (``ask``'s record, ``bench``'s samples) catch it first and say what.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _interrupted()


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
pools_app = typer.Typer(help="List, show and check pool files.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect or clear the on-disk call cache.", no_args_is_help=True)
app.add_typer(pools_app, name="pools")
app.add_typer(cache_app, name="cache")

_state: dict[str, bool] = {"debug": False}


def _out() -> Console:
    """Standard output.  Piped, rich lays it out for 80 columns unless COLUMNS says
    otherwise: an unbounded width would set free text on one endless line.  Every view
    keeps ids and paths whole at any width, so a pipe into grep still finds them."""
    return Console(soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True)


def _print_path(console: Console, label: str, *paths: Path | str) -> None:
    """``label``, then each path on a line of its own that is never wrapped or cropped
    (a terminal may fold it on screen; copied, it is one piece)."""
    console.print(label, highlight=False, markup=False)
    for path in paths:
        console.print(Text(printable(str(path))), soft_wrap=True, highlight=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"conductor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and debug logs on stderr.")
    ] = False,
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    """Conductor: learned orchestration of LLM teams."""
    _state["debug"] = debug
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger = logging.getLogger("conductor")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    logger.propagate = False


def _load_pool(name_or_path: str | None) -> Pool:
    from .pool import load_pool, resolve_pool_path

    return load_pool(resolve_pool_path(name_or_path or "local"))


# -- ask ------------------------------------------------------------------------------


@app.command()
def ask(
    question: Annotated[
        str | None,
        typer.Argument(help="The question to answer; - reads it from standard input."),
    ] = None,
    question_file: Annotated[
        Path | None,
        typer.Option("--file", help="Read the question from this file (UTF-8 text)."),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            "--pool",
            "-p",
            help="Pool file, or the name of a shipped pool. Default: the embedded offline "
            "pool (local).",
        ),
    ] = None,
    conductor: Annotated[
        str | None,
        typer.Option(
            "--conductor",
            "-c",
            help="Who writes the workflow: http(s)://HOST/v1[#MODEL], prompted:WORKER_ID, "
            "prompted:LITELLM_MODEL, local, hf:ORG/NAME or a checkpoint directory. "
            "Default: the pool's conductor.",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the run record (JSON) here.")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Most steps per workflow.")
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds", min=1, help="Most Conductor rounds; above 1 the Conductor may revise."
        ),
    ] = 1,
    budget_usd: Annotated[
        float | None,
        typer.Option("--budget-usd", min=0.0, help="Stop starting calls past this spend."),
    ] = None,
    max_calls: Annotated[
        int | None,
        typer.Option("--max-calls", min=1, help="Most model calls, the Conductor's included."),
    ] = None,
    template: Annotated[
        str | None,
        typer.Option("--template", help="Conductor prompt template: a built-in name or a file."),
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the call cache.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the run record as JSON on stdout.")
    ] = False,
) -> None:
    """Answer one question with an orchestrated workflow and show how it was made."""
    from .conductors.spec import resolve_conductor
    from .execute import RunSettings
    from .llm.factory import require_keys
    from .record import check_record_path, write_record
    from .render import answer_panel, step_table, to_json, topology
    from .text import check_question

    text = _question_text(question, question_file)
    check_question(text)
    if out is not None:
        check_record_path(out)
    pool_obj = _load_pool(pool)
    cond = resolve_conductor(pool_obj, conductor, max_steps=max_steps, template=template)
    require_keys([*pool_obj.workers, cond.target])  # every missing key at once, up front
    settings = RunSettings(
        max_steps=max_steps, rounds=rounds, budget_usd=budget_usd, max_calls=max_calls
    )
    started: list[RunRecord] = []
    try:
        record = _run_with_progress(
            lambda events: _ask_async(
                text, pool_obj, cond, settings, no_cache, events, started.append
            ),
            show=not as_json,
        )
    except KeyboardInterrupt:
        _interrupted(_keep_interrupted(started[0] if started else None, out, no_cache))
    if out is not None:
        write_record(record, out)
    if as_json:
        typer.echo(to_json(record))
    else:
        console = _out()
        console.print(topology(record))
        console.print(step_table(record))
        console.print(answer_panel(record))
        if out is not None:
            _print_path(console, "record written to (replay it with: conductor trace PATH)", out)
    if record.status == "failed":
        # One plain sentence on stderr as well, for scripts and narrow terminals.
        _print_error(f"the run failed: {record.error or ''}")
        raise typer.Exit(EXIT_FAILED)


async def _ask_async(
    question: str,
    pool: Any,
    cond: Any,
    settings: Any,
    no_cache: bool,
    events: Any,
    on_record: Any = None,
) -> Any:
    from .execute import ask as run_ask

    with _cache_unless(no_cache) as cache:
        return await run_ask(
            question, pool, cond, settings, cache=cache, events=events, on_record=on_record
        )


def _keep_interrupted(record: RunRecord | None, out: Path | None, no_cache: bool) -> str:
    """Write what an interrupted ``ask`` did (to ``--out``), and say what was kept."""
    from .record import write_record

    finished = 0
    if record is not None and record.finished_at is None:
        # A second Ctrl-C can stop the run before it finished its own record.
        from datetime import datetime, timezone

        from .execute import finish_interrupted

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
        try:
            with path.open("rb") as stream:
                return _read_question(stream, str(path))
        except OSError as exc:
            raise UsageError(
                f"cannot read the question file {path}: {exc.strerror or exc}"
            ) from None
    if question == "-":
        if sys.stdin is None:
            raise UsageError("there is no standard input to read the question from")
        if sys.stdin.isatty():
            _err().print("reading the question from standard input; end it with Ctrl-D")
        return _read_question(sys.stdin.buffer, "standard input")
    if question is None:
        raise UsageError(
            'give a question: conductor ask "QUESTION", conductor ask - (read from '
            "standard input) or conductor ask --file PATH"
        )
    return question


def _read_question(stream: BinaryIO, where: str) -> str:
    from .text import question_limit

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


def _open_cache() -> ResponseCache:
    from .cache import ResponseCache

    return ResponseCache()


def _cache_unless(no_cache: bool) -> contextlib.AbstractContextManager[ResponseCache | None]:
    """The call cache, closed when the block ends; nothing with ``--no-cache``."""
    return contextlib.nullcontext() if no_cache else _open_cache()


def _run_with_progress(make: Any, *, show: bool) -> Any:
    """Run a coroutine factory, showing a live progress view on stderr when useful."""
    err = _err()
    if not show or not err.is_terminal:
        return asyncio.run(make(None))
    from rich.live import Live

    from .render import ProgressView

    view = ProgressView()
    with Live(view, console=err, refresh_per_second=8, transient=True):
        return asyncio.run(make(view))


# -- bench ----------------------------------------------------------------------------


def _parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise UsageError(f"--shard {text!r} must be I/N with 0 <= I < N, e.g. 0/4")
    return int(m.group(1)), int(m.group(2))


@app.command()
def bench(
    benchmark: Annotated[
        str | None,
        typer.Argument(
            help="A shipped benchmark (gpqa-diamond, math500, aime24, aime25, mmlu, "
            "livecodebench, bigcodebench-hard) or a benchmark YAML file; `merge` joins "
            "shard directories.  With --resume DIR it may be left out."
        ),
    ] = None,
    dirs: Annotated[
        list[Path] | None, typer.Argument(help="With `merge`: the shard directories.")
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", "-p", help="Pool file or shipped pool name.")
    ] = None,
    conductor: Annotated[
        str | None,
        typer.Option("--conductor", "-c", help="Conductor SPEC (as for ask)."),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            "--strategy",
            help="conductor, single:WORKER, vote:K:WORKER, moa, moa:AGGREGATOR, "
            "reflect:K:WORKER, or singles (every worker alone).  Default: conductor.",
        ),
    ] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="Run on a local file in the same schema.")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="First N samples.")] = None,
    epochs: Annotated[
        int | None, typer.Option("--epochs", min=1, help="Repeats per sample.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed for choice shuffling (default 0).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Samples in flight at once (default 16)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Run directory (default: runs/...).")
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue the run in this directory, with the settings it was started "
            "with; options given beside it must agree with them.",
        ),
    ] = None,
    retry_errors: Annotated[
        bool, typer.Option("--retry-errors", help="With --resume: run failed samples again.")
    ] = False,
    shard: Annotated[
        str | None, typer.Option("--shard", help="Run shard I of N (I/N, from 0).")
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1)] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1)] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=0.0)] = None,
    max_calls: Annotated[int | None, typer.Option("--max-calls", min=1)] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Do not use the call cache.")
    ] = False,
    confirm_run_unsafe_code: Annotated[
        bool,
        typer.Option(
            "--confirm-run-unsafe-code",
            help="Run model-written code even where no OS sandbox is possible.",
        ),
    ] = False,
    exclude_trained: Annotated[
        bool,
        typer.Option(
            "--exclude-trained",
            help="Skip the samples the Conductor checkpoint was trained on (it records "
            "them); without it they run and are counted in the summary.",
        ),
    ] = False,
) -> None:
    """Run a benchmark with the Conductor or a baseline strategy, graded and resumable."""
    if benchmark == "merge":
        _bench_merge(dirs or [], out)
        return
    if dirs:
        raise UsageError(f"unexpected arguments after the benchmark name: {dirs}")
    from .bench.spec import load_benchmark

    if retry_errors and resume is None:
        raise UsageError("--retry-errors needs --resume DIR")
    if resume is not None:
        if out is not None and out != resume:
            raise UsageError("give either --out or --resume, not both")
        out = resume
    # What was not given again is taken from the run being resumed.
    stored = _stored_invocation(resume) if resume is not None else {}
    benchmark = benchmark if benchmark is not None else stored.get("benchmark")
    if benchmark is None:
        raise UsageError("name a benchmark, or give --resume DIR to continue a run")
    pool = pool if pool is not None else stored.get("pool")
    conductor = conductor if conductor is not None else stored.get("conductor")
    strategy = strategy or stored.get("strategy") or "conductor"
    data = data if data is not None else _opt_path(stored.get("data"))
    limit = limit if limit is not None else stored.get("limit")
    epochs = epochs if epochs is not None else stored.get("epochs")
    seed = seed if seed is not None else stored.get("seed", 0)
    concurrency = concurrency or stored.get("concurrency") or 16
    shard = shard if shard is not None else stored.get("shard")
    max_steps = max_steps if max_steps is not None else stored.get("max_steps")
    rounds = rounds or stored.get("rounds") or 1
    budget_usd = budget_usd if budget_usd is not None else stored.get("budget_usd")
    max_calls = max_calls if max_calls is not None else stored.get("max_calls")
    exclude_trained = exclude_trained or bool(stored.get("exclude_trained"))

    spec = load_benchmark(benchmark)
    if spec.training_only and data is None:
        raise UsageError(
            f"benchmark {spec.name} is for training only (it has no evaluation source); "
            "pass --data FILE to evaluate on other questions in its schema"
        )
    pool_obj = _load_pool(pool)
    shard_t = _parse_shard(shard)
    invocation = {
        # Files by absolute path, shipped names as names (they move with the package).
        "benchmark": _as_given(benchmark),
        "pool": _as_given(pool),
        "conductor": conductor,
        "strategy": strategy,
        "data": str(data.resolve()) if data is not None else None,
        "limit": limit,
        "epochs": epochs,
        "seed": seed,
        "shard": shard,
        "max_steps": max_steps,
        "rounds": rounds,
        "budget_usd": budget_usd,
        "max_calls": max_calls,
        "concurrency": concurrency,
        "exclude_trained": exclude_trained,
    }
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        label = strategy.replace(":", "-")
        out = Path("runs") / f"{spec.name}-{label}-{stamp}"
    strategies = (
        [f"single:{w.id}" for w in pool_obj.workers] if strategy == "singles" else [strategy]
    )
    run_dirs = []
    failed = False
    if strategy == "singles":
        from .llm.factory import require_keys

        require_keys(pool_obj.workers)  # every worker's key, before the first single runs
    for strat in strategies:
        run_dir = out / f"single-{strat.split(':', 1)[1]}" if strategy == "singles" else out
        progress = _bench_one(
            spec,
            pool_obj,
            strat,
            conductor,
            run_dir,
            data=data,
            limit=limit,
            epochs=epochs,
            seed=seed,
            concurrency=concurrency,
            resume=resume is not None,
            retry_errors=retry_errors,
            shard=shard_t,
            settings=(max_steps, rounds, budget_usd, max_calls),
            no_cache=no_cache,
            invocation=invocation,
            unsafe_code=confirm_run_unsafe_code,
            exclude_trained=exclude_trained,
        )
        failed = failed or (progress.done > 0 and progress.errors == progress.done)
        run_dirs.append(run_dir)
    _print_report(run_dirs)
    dirs_written = plural(len(run_dirs), "run directory", "run directories")
    _print_path(_out(), f"{dirs_written} (for conductor report and trace):", *run_dirs)
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _bench_one(
    spec: Any,
    pool_obj: Pool,
    strategy: str,
    conductor_spec: str | None,
    run_dir: Path,
    *,
    data: Path | None,
    limit: int | None,
    epochs: int | None,
    seed: int,
    concurrency: int,
    resume: bool,
    retry_errors: bool,
    shard: tuple[int, int] | None,
    settings: tuple[int | None, int, float | None, int | None],
    no_cache: bool,
    invocation: dict[str, Any] | None = None,
    unsafe_code: bool = False,
    exclude_trained: bool = False,
) -> Any:
    from .bench.graders import get_grader
    from .bench.graders.code import with_unsafe_opt_in
    from .bench.report import record_rate_limits, write_summary
    from .bench.runner import BenchOptions, BenchStopped, run_benchmark
    from .bench.strategies import (
        ConductorStrategy,
        answer_key_for,
        concurrency_warning,
        parse_strategy,
    )
    from .conductors.spec import resolve_conductor
    from .execute import RunSettings
    from .llm.caller import CallerSet
    from .llm.factory import require_keys
    from .pool import pool_to_public_dict

    grader = get_grader(
        spec.grader, with_unsafe_opt_in(spec.grader, spec.grader_options, unsafe_code)
    )
    max_steps, rounds, budget_usd, max_calls = settings
    options = BenchOptions(
        out_dir=run_dir,
        data_file=data,
        limit=limit,
        epochs=epochs,
        seed=seed,
        concurrency=concurrency,
        resume=resume,
        retry_errors=retry_errors,
        shard=shard,
        invocation=invocation,
        pool_sha256=_file_sha256(pool_obj.path),
    )
    console = _err()

    async def go(progress_cb: Any) -> Any:
        nonlocal options
        with _cache_unless(no_cache) as cache:
            callers = CallerSet(cache)
            strat: Any
            if strategy == "conductor":
                cond = resolve_conductor(pool_obj, conductor_spec, max_steps=max_steps)
                options = _with_trained_questions(options, cond, exclude_trained)
                run_settings = RunSettings(
                    max_steps=max_steps, rounds=rounds, budget_usd=budget_usd, max_calls=max_calls
                )
                strat = ConductorStrategy(pool_obj, cond, run_settings, callers)
            else:
                if conductor_spec is not None:
                    raise UsageError("--conductor applies to --strategy conductor only")
                if exclude_trained:
                    raise UsageError("--exclude-trained applies to --strategy conductor only")
                strat = parse_strategy(
                    strategy, pool_obj, callers, vote_key=answer_key_for(spec.grader)
                )
            # Every missing key at once, before the first sample (and before the run
            # directory holds anything).
            require_keys(
                [*pool_obj.workers, strat.orchestrator.conductor.target]
                if isinstance(strat, ConductorStrategy)
                else [pool_obj.workers[step.worker] for step in strat.plan]
            )
            warning = concurrency_warning(strat, concurrency)
            if warning:
                console.print(f"[yellow]warning:[/] {warning}", highlight=False)
            try:
                return await run_benchmark(
                    spec,
                    strat,
                    grader,
                    pool_to_public_dict(pool_obj),
                    options,
                    cache=cache,
                    on_progress=progress_cb,
                )
            finally:
                record_rate_limits(run_dir, callers.limits.history())

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(f"{spec.name} · {strategy}", total=None, stats="")

        def on_progress(p: Any) -> None:
            acc = f"{p.accuracy:.1f}%" if p.accuracy is not None else "-"
            stats = f"acc {acc} · ${p.cost_usd:.4f} · errors {p.errors}"
            bar.update(task, total=p.total, completed=p.skipped + p.done, stats=stats)

        try:
            progress = asyncio.run(go(on_progress))
        except BenchStopped:
            # What was written is summarised if the directory still takes a write.
            with contextlib.suppress(Exception):
                write_summary(run_dir)
            raise
        except KeyboardInterrupt:
            write_summary(run_dir)
            _interrupted(f"finished samples are kept in {run_dir} (--resume {run_dir})")
    write_summary(run_dir)
    return progress


def _with_trained_questions(options: Any, conductor: Any, exclude: bool) -> Any:
    """``options`` with the questions ``conductor``'s checkpoint was trained on (counted
    by the run, or skipped with ``exclude``)."""
    import dataclasses

    from .train.contamination import trained_questions_of

    trained = trained_questions_of(conductor)
    return dataclasses.replace(options, trained_on=trained, exclude_trained=exclude)


def _stored_invocation(run_dir: Path) -> dict[str, Any]:
    """The options a bench run in ``run_dir`` was started with (for ``--resume DIR``).

    A ``singles`` run keeps one directory per worker below ``run_dir``; the first one
    speaks for all."""
    from .bench.rundir import run_dirs
    from .bench.runner import read_run_config, stored_invocation

    dirs = run_dirs(run_dir)
    if dirs and dirs[0] != run_dir:
        return {**stored_invocation(read_run_config(dirs[0])), "strategy": "singles"}
    return stored_invocation(read_run_config(run_dir))


def _as_given(name_or_path: str | None) -> str | None:
    """A file's absolute path, or the name of a shipped file unchanged."""
    if name_or_path is None:
        return None
    path = Path(name_or_path).expanduser()
    return str(path.resolve()) if path.is_file() else name_or_path


def _opt_path(value: Any) -> Path | None:
    return Path(value) if isinstance(value, str) and value else None


def _file_sha256(path: Path | None) -> str | None:
    import hashlib

    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _bench_merge(dirs: list[Path], out: Path | None) -> None:
    from .bench.report import write_summary
    from .bench.runner import merge_runs

    if out is None:
        raise UsageError("bench merge needs --out DIR")
    n = merge_runs(dirs, out)
    write_summary(out)
    records, runs = plural(n, "record"), plural(len(dirs), "run")
    _print_path(_out(), f"merged {records} from {runs} into", out)
    _print_report([out])


def _print_report(run_dirs: list[Path]) -> None:
    from .bench.report import report_renderables

    console = _out()
    for renderable in report_renderables(run_dirs):
        console.print(renderable)


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Bench run directories, side by side.")],
) -> None:
    """Scores, cost and usage of saved bench runs, with the paper's figures for reference."""
    _print_report(runs)


# -- trace ----------------------------------------------------------------------------


def _bench_run_dirs(path: Path) -> list[Path]:
    """The bench run directories ``path`` holds: itself, or for a ``singles`` run the
    ``single-WORKER`` directory of each worker."""
    from .bench.rundir import SAMPLES, run_dirs

    dirs = run_dirs(path, holding=SAMPLES)
    if not dirs:
        raise UsageError(f"{path}: no {SAMPLES} in this run directory")
    return dirs


def _unknown_sample(run: Path, sample: str, ids: set[str]) -> UsageError:
    import difflib

    listing = f"conductor trace {run} lists them"
    if not ids:
        return UsageError(f"{run}: no sample {sample!r}; this run holds no samples yet")
    # Part of an id (``3.json`` for ``math500/test/3.json``) is the likely slip; a
    # misspelling of a whole id the next.
    close = sorted(i for i in ids if sample in i)
    if not 1 <= len(close) <= 3:
        close = difflib.get_close_matches(sample, sorted(ids), n=3, cutoff=0.6)
    guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    count = f"{len(ids)} sample" + ("" if len(ids) == 1 else "s")
    return UsageError(f"{run}: no sample {sample!r} among its {count}{guess} ({listing})")


@app.command()
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
        int | None, typer.Option("--limit", min=1, help="List at most N samples.")
    ] = None,
) -> None:
    """Replay a recorded run step by step, or list the samples of a bench run."""
    from rich.rule import Rule
    from rich.text import Text

    from .bench.rundir import SAMPLES, iter_records
    from .record import read_record
    from .render import SampleListing, to_json, to_mermaid, trace_renderable

    if run.name == SAMPLES and run.is_file():
        run = run.parent  # the file of a run directory: read as the directory
    listing = run.is_dir() and sample is None
    if not listing and (verdict is not None or limit is not None):
        raise UsageError(
            "--verdict and --limit apply to the list of a bench run's samples "
            "(a run directory without --sample)"
        )
    console = _out()
    if listing:
        if fmt in ("mermaid", "json"):
            raise UsageError(
                f"--format {fmt.value} shows one sample; give --sample ID "
                f"(conductor trace {run} lists them)"
            )
        if verdict is not None:
            _check_verdict(verdict)
        dirs = _bench_run_dirs(run)
        any_rows = False
        for d in dirs:
            if d != run:
                console.print(Rule(Text(printable(d.name), style="bold")))
            listed = SampleListing(iter_records(d / SAMPLES), verdict=verdict, limit=limit)
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
    shown: list[tuple[Path | None, Any]] = []
    if run.is_dir():
        dirs = _bench_run_dirs(run)
        ids: set[str] = set()
        for d in dirs:
            for record in iter_records(d / SAMPLES):
                if record.sample_id is not None:
                    ids.add(record.sample_id)
                if sample in (record.sample_id, record.run_id):
                    shown.append((d if d != run else None, record))
        if not shown:
            raise _unknown_sample(run, str(sample), ids)
        # Records are written as samples finish; a sample's epochs are shown in order.
        shown.sort(key=lambda item: (dirs.index(item[0] or run), item[1].epoch or 0))
    else:
        record = read_record(run)
        if sample is not None and sample not in (record.sample_id, record.run_id):
            raise UsageError(f"{run}: no sample with id {sample!r}")
        shown.append((None, record))
    for sub_run, record in shown:
        if fmt == "json":
            typer.echo(to_json(record))
        elif fmt == "mermaid":
            typer.echo(to_mermaid(record))
        else:
            if sub_run is not None:
                console.print(Rule(Text(printable(sub_run.name), style="bold")))
            style: Literal["table", "tree"] = "tree" if fmt is TraceFormat.tree else "table"
            console.print(trace_renderable(record, style), crop=False)


def _check_verdict(verdict: str) -> None:
    import difflib

    from .bench.report import STATUSES

    if verdict not in STATUSES:
        close = difflib.get_close_matches(verdict, STATUSES, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"--verdict {verdict!r} is not a verdict; {guess}(one of {', '.join(STATUSES)})"
        )


# -- train ----------------------------------------------------------------------------


@app.command()
def train(
    config_file: Annotated[
        Path, typer.Argument(metavar="CONFIG.yaml", help="Training config (configs/train/*.yaml).")
    ],
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=1, help="Override grpo.steps (optimizer steps)."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Override output_dir (checkpoint and metrics)."),
    ] = None,
    no_live: Annotated[
        bool,
        typer.Option("--no-live", help="No live table; print one line per step instead."),
    ] = False,
) -> None:
    """Train a Conductor with GRPO on verifiable rewards (needs the train extra).

    Every sampled workflow is executed on the config's pool and graded; the reward is
    0 unparsed, 0.5 parsed but wrong, 1 correct (configurable).  Writes
    OUTPUT_DIR/metrics.jsonl and OUTPUT_DIR/checkpoint, which --conductor PATH loads.
    For several GPUs start it with accelerate launch (see the README).
    """
    import dataclasses

    from .train.config import load_train_config

    config = load_train_config(config_file)
    if steps is not None:
        config = dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, steps=steps))
    if output is not None:
        config = dataclasses.replace(config, output_dir=str(output))
    err = _err()
    live = not no_live and err.is_terminal

    def line(row: dict[str, Any]) -> None:
        def num(key: str, digits: int = 3) -> str:
            value = row.get(key)
            return "-" if value is None else f"{value:.{digits}f}"

        err.print(
            f"step {row.get('step')}: reward {num('reward_mean')} ± {num('reward_std')}  "
            f"parsed {num('parse_rate', 2)}  correct {num('correct_rate', 2)}  "
            f"steps/workflow {num('steps_per_workflow', 2)}  loss {num('loss', 4)}  "
            f"{num('elapsed_s', 0)}s",
            highlight=False,
        )

    from .train.trainer import METRICS_FILE
    from .train.trainer import train as run_training

    checkpoint = run_training(config, live=live, on_metrics=None if live else line)
    # Plain echo: paths must not be wrapped or highlighted, scripts copy them.
    typer.echo(f"checkpoint written to {checkpoint}  (use: --conductor {checkpoint})")
    typer.echo(f"metrics written to {Path(config.output_dir).expanduser() / METRICS_FILE}")


# -- pools ----------------------------------------------------------------------------


@pools_app.command("list")
def pools_list() -> None:
    """List the pools shipped with conductor."""
    from rich.table import Table

    from .pool import builtin_pools_dir, list_builtin_pools, load_pool

    table = Table(title="shipped pools")
    # Names are what --pool takes: never wrapped.  Descriptions and errors wrap.
    table.add_column("name", no_wrap=True)
    table.add_column("workers", justify="right", no_wrap=True)
    table.add_column("conductor", no_wrap=True)
    table.add_column("description")
    for path in list_builtin_pools():
        try:
            p = load_pool(path)
        except ConductorError as exc:
            table.add_row(path.stem, "-", "-", Text(printable(str(exc)), style="red"))
            continue
        backend = p.conductor.backend if p.conductor else "-"
        table.add_row(p.name, str(len(p.workers)), backend, Text(printable(p.description or "")))
    console = _out()
    console.print(table)
    _print_path(console, "files (NAME.yaml, to copy and edit) in:", builtin_pools_dir())


@pools_app.command("show")
def pools_show(
    pool: Annotated[str, typer.Argument(help="Pool file or shipped pool name.")],
) -> None:
    """Show a pool's workers in the order the Conductor sees them."""
    from rich.table import Table

    from .render import Fitted

    p = _load_pool(pool)
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
        params = printable(", ".join(f"{k}={v}" for k, v in w.params.items()))
        endpoint = printable(w.api_base or "-")
        cells = (w.id, w.model, w.client, endpoint, params)  # Text: never read as markup
        wide.add_row(f"Model {i}", *map(Text, cells), str(w.max_concurrency))
        block = Text(w.id, style="bold")
        block.append(f"\nmodel {w.model}\nclient {w.client}, concurrency {w.max_concurrency}")
        block.append(f"\nendpoint {endpoint}" + (f"\nparams {params}" if params else ""))
        stacked.add_row(f"Model {i}", block)
        keep += [w.id, w.model, endpoint]
    console = _out()
    console.print(Fitted([wide, stacked], keep))
    if p.conductor is not None:
        c = p.conductor
        where = f" at {c.api_base}" if c.api_base else ""
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
    """Validate a pool and send one tiny request to each worker (and the Conductor)."""
    from rich.table import Table

    p = _load_pool(pool)
    results = asyncio.run(_ping_all(p, timeout_s))
    table = Table(title=f"pool {p.name}: one tiny request per model")
    for col in ("model", "id", "result", "latency (s)", "reply"):
        table.add_column(col)
    failed = 0
    for label, wid, err, latency, reply in results:
        if err is None:
            shown = escape(printable(reply[:40]))
            table.add_row(label, wid, "[green]ok[/green]", f"{latency:.2f}", shown)
        else:
            failed += 1
            table.add_row(label, wid, f"[red]{escape(printable(err))}[/red]", "-", "")
    _out().print(table)
    if failed:
        raise typer.Exit(EXIT_FAILED)


async def _ping_all(p: Pool, timeout_s: float) -> list[tuple[str, str, str | None, float, str]]:
    from dataclasses import replace

    from .conductors.spec import resolve_conductor
    from .errors import ModelCallError
    from .llm.caller import CallerSet
    from .llm.types import ModelRequest

    targets: list[tuple[str, Worker]] = [(f"Model {i}", w) for i, w in enumerate(p.workers)]
    # A Conductor that cannot even be set up is a failed row of its own, not a silence.
    unusable: list[tuple[str, str, str | None, float, str]] = []
    if p.conductor is not None:
        try:
            cond = resolve_conductor(p)
            if cond.target.model not in {w.model for w in p.workers}:
                targets.append(("Conductor", cond.target))
        except ConductorError as exc:
            unusable.append(("Conductor", "conductor", str(exc), 0.0, ""))
    callers = CallerSet(None)

    async def ping(label: str, w: Worker) -> tuple[str, str, str | None, float, str]:
        target = replace(w, max_retries=0, timeout_s=min(w.timeout_s, timeout_s))
        request = ModelRequest(
            messages=({"role": "user", "content": "Reply with the single word: ready"},),
            params={**w.params, "max_tokens": 8},
        )
        t0 = time.perf_counter()
        try:
            done = await callers.get(target).complete(request)
        except ModelCallError as exc:
            return label, w.id, exc.describe(), 0.0, ""
        except ConductorError as exc:
            return label, w.id, str(exc), 0.0, ""
        return label, w.id, None, time.perf_counter() - t0, done.text.strip()

    try:
        return [*await asyncio.gather(*(ping(label, w) for label, w in targets)), *unusable]
    finally:
        await callers.aclose()


# -- cache ----------------------------------------------------------------------------


def _parse_age(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise UsageError(f"--older-than {text!r} is not an age like 30m, 12h, 7d or 2w")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    return float(m.group(1)) * unit


@cache_app.command("stats")
def cache_stats() -> None:
    """Show where the cache is and how much it holds."""
    from datetime import datetime

    with _open_cache() as cache:
        s = cache.stats()

    def when(t: float | None) -> str:
        return datetime.fromtimestamp(t).isoformat(timespec="seconds") if t else "-"

    console = _out()
    _print_path(console, "directory:", s.directory)
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
) -> None:
    """Delete cached calls (all, or those older than an age)."""
    age = _parse_age(older_than) if older_than else None
    with _open_cache() as cache:
        removed = cache.clear(age)
    _out().print(f"removed {plural(removed, 'cached call')}")


# -- entry point ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and turn errors into exit codes."""
    try:
        app(args=argv, standalone_mode=True)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            _abandon_local_work()
        raise
    except UsageError as exc:
        if _state["debug"]:
            raise
        _print_error(str(exc))
        sys.exit(EXIT_USAGE)
    except ConductorError as exc:
        if _state["debug"]:
            raise
        _print_error(str(exc))
        sys.exit(EXIT_FAILED)
    except OSError as exc:
        # A file or directory the command was pointed at (an --out under a read-only
        # directory, a path through a regular file): one line, not a traceback.
        if _state["debug"]:
            raise
        _print_error(_describe_os_error(exc))
        sys.exit(EXIT_USAGE if exc.errno in _USER_PATH_ERRNOS else EXIT_FAILED)
    except KeyboardInterrupt:
        _err().print("interrupted")
        _abandon_local_work()
        sys.exit(EXIT_INTERRUPTED)


def _abandon_local_work() -> None:
    """Leave now, after ``Ctrl-C``, even while a local model thread is busy.

    An interrupted command has already cancelled its calls, run its ``finally``
    blocks (records written, cache closed) and said what it kept.  Generations still
    running are told to stop at their next token.  What cannot stop (a model load, a
    prompt batch inside llama.cpp, seconds long on a slow CPU) would hold the process
    at exit, which joins every worker thread; so after a short wait the process leaves
    with ``os._exit``, skipping only the exit handlers, after flushing its output.
    Daemon threads would not do: the interpreter frees the model at shutdown while
    llama.cpp may still be using it.
    """
    local = sys.modules.get("conductor.local_model")
    if local is None:
        return
    try:
        if local.stop_generations(wait_s=0.3):
            return
    except KeyboardInterrupt:  # pressed again: do not wait at all
        pass
    logging.getLogger("conductor").debug("a local model is still busy; leaving without it")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


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


def _print_error(message: str) -> None:
    # One line whatever the width (scripts read it); no emoji codes such as ":x:".
    _err().print(
        f"[red]error:[/red] {escape(printable(message))}",
        markup=True,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )


if __name__ == "__main__":
    main()
