"""``conductor bench`` and ``conductor report``: run a benchmark (the session is
:mod:`conductor.bench.session`'s), show its progress, and show the scores of runs."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..bounds import CONCURRENCY, EPOCHS, SAMPLES, SEED
from ..errors import UsageError
from ..text import plural, printable
from ._ci import CiOutputs, FailUnderOption, JunitOption, MarkdownOption
from ._common import EXIT_FAILED, interrupted, print_path, stderr, stdout
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
    from rich.console import Console

    from ..bench.runner import BenchProgress
    from ..bench.session import BenchRequest
    from ..otel import RecordSink
    from ..runs.oracle import QuestionOracle
    from ..runs.summary import RunSummary

__all__ = ["bench", "report"]


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
    pool: PoolOption = None,
    conductor: ConductorOption = None,
    strategy: StrategyOption = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="Run on a local file in the same schema.")
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=SAMPLES.low, max=SAMPLES.high, help="First N samples."),
    ] = None,
    epochs: Annotated[
        int | None,
        typer.Option("--epochs", min=EPOCHS.low, max=EPOCHS.high, help="Repeats per sample."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", min=SEED.low, max=SEED.high, help="Seed for choice shuffling (default 0)."
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=CONCURRENCY.low,
            max=CONCURRENCY.high,
            help="Samples in flight at once (default: as many as the pool's models serve "
            "at once, at most 16).",
        ),
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
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Delete the run already in --out (only the files bench wrote) and start it "
            "again from nothing; the call cache still answers the calls it holds (add "
            "--no-cache to call the models again).",
        ),
    ] = False,
    shard: Annotated[
        str | None, typer.Option("--shard", help="Run shard I of N (I/N, from 0).")
    ] = None,
    max_steps: MaxStepsOption = None,
    cost_weight: CostWeightOption = None,
    rounds: RoundsOption = None,
    budget_usd: BudgetUsdOption = None,
    max_calls: MaxCallsOption = None,
    no_cache: NoCacheOption = False,
    state: StateOption = None,
    batch: Annotated[
        bool | None,
        typer.Option(
            "--batch/--no-batch",
            help="Send the calls of models with a provider batch API (OpenAI, Anthropic, "
            "Gemini) as batches, in waves: half the price, answered within hours; "
            "--resume keeps the run's choice unless told.",
        ),
    ] = None,
    max_usd: Annotated[
        float | None,
        typer.Option(
            "--max-usd",
            min=0.0,
            help="The whole run's spend cap: no sample (batched: no wave) is started once "
            "the run has spent this much; continue with --resume and a higher cap.",
        ),
    ] = None,
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate",
            help="Print what the run would cost (calls, tokens, USD live and with --batch) "
            "and stop: no model is called and nothing is written.  Measured on the run's "
            "own records where there are any (--resume DIR, the sample cache), else "
            "from the stated assumptions.",
        ),
    ] = False,
    pilot: Annotated[
        int | None,
        typer.Option(
            "--pilot",
            metavar="N",
            help="A paid pilot: run the first N (sample, epoch) pairs into the run "
            "directory, print the estimate of the rest measured on them, and stop; "
            "continue the run with --resume DIR.",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the samples as tasks on the Ray cluster at ADDRESS (host:port, or "
            "auto), each node calling the providers; code is graded on the nodes that "
            "declare the resource 'sandbox'.  This process writes the run directory.  "
            "Needs the ray extra.",
        ),
    ] = None,
    confirm_run_unsafe_code: Annotated[
        bool,
        typer.Option(
            "--confirm-run-unsafe-code",
            help=(
                "Grade model-written code in a sandbox weaker than bubblewrap where "
                "bubblewrap is missing (or CONDUCTOR_SANDBOX_ISOLATION asks for one)."
            ),
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
    fail_under: FailUnderOption = None,
    junit: JunitOption = None,
    markdown: MarkdownOption = None,
    otel: OtelOption = None,
    otel_content: OtelContentOption = False,
    no_otel: NoOtelOption = False,
) -> None:
    """Run a benchmark with the Conductor or a baseline strategy, graded and resumable.

    Exit codes: 0 done, 1 every sample failed (or the run was stopped), 2 bad usage
    or input, 3 an accuracy below --fail-under, 130 interrupted.
    """
    if estimate or pilot is not None:
        _check_estimate_options(
            estimate, benchmark == "merge", fail_under=fail_under, junit=junit, markdown=markdown
        )
    ci = CiOutputs.of(fail_under, junit, markdown)
    if benchmark == "merge":
        _bench_merge(dirs or [], out, ci)
        return
    if dirs:
        raise UsageError(f"unexpected arguments after the benchmark name: {dirs}")
    from ..bench.session import BenchArgs, plan_bench

    requests = plan_bench(
        BenchArgs(
            benchmark=benchmark,
            pool=pool,
            conductor=conductor,
            strategy=strategy,
            data=data,
            limit=limit,
            epochs=epochs,
            seed=seed,
            concurrency=concurrency,
            out=out,
            resume=resume,
            retry_errors=retry_errors,
            overwrite=overwrite,
            shard=shard,
            max_steps=max_steps,
            cost_weight=cost_weight,
            rounds=rounds,
            budget_usd=budget_usd,
            max_calls=max_calls,
            no_cache=no_cache,
            state=state,
            unsafe_code=confirm_run_unsafe_code,
            exclude_trained=exclude_trained,
            batch=batch,
            max_usd=max_usd,
            estimate=estimate,
            pilot=pilot,
            ray=ray,
        )
    )
    if estimate:
        _print_estimates(requests)
        return
    if pilot is not None:
        _run_pilots(requests)
        return
    run_dirs = []
    failed = False
    with tracing(otel_from_options(otel, otel_content, no_otel)) as tracer:
        for request in requests:
            progress = _bench_one(request, tracer)
            failed = failed or (progress.done > 0 and progress.errors == progress.done)
            run_dirs.append(request.run_dir)
    summaries = _print_report(_written_summaries(run_dirs))
    dirs_written = plural(len(run_dirs), "run directory", "run directories")
    print_path(stdout(), f"{dirs_written} (for conductor report and trace):", *run_dirs)
    ci.finish(summaries, failed=failed)


def _check_estimate_options(
    estimate: bool,
    merge: bool,
    *,
    fail_under: str | None,
    junit: Path | None,
    markdown: Path | None,
) -> None:
    """Refuse what ``--estimate`` or ``--pilot`` cannot go with, in one sentence: a
    merge, and the CI outputs of a whole run's scores (an estimate has none; a pilot's
    few samples would pass for the run's)."""
    option = "--estimate" if estimate else "--pilot"
    if merge:
        raise UsageError(f"{option} applies to a run, not to bench merge")
    given = [
        name
        for name, value in (
            ("--fail-under", fail_under),
            ("--junit", junit),
            ("--markdown", markdown),
        )
        if value is not None
    ]
    if given:
        what = "scores nothing" if estimate else "scores only its first samples"
        raise UsageError(
            f"{option} {what}: leave out {' and '.join(given)} (give them to the run itself)"
        )


def _print_estimates(requests: list[BenchRequest]) -> None:
    """``--estimate``: each run's estimate, computed and printed in turn."""
    from ..bench.estimate import estimate_run
    from ..render.estimate import estimate_view

    console = stdout()
    for request in requests:
        console.print(estimate_view(estimate_run(request)))
    console.print(
        "estimate only: no model was called and nothing was written; run the same "
        "command without --estimate to start it",
        highlight=False,
    )


def _run_pilots(requests: list[BenchRequest]) -> None:
    """``--pilot N``: each run's first N pairs, then the estimate of its rest, measured
    on what the pilot recorded, and how to continue.  Exit 1, as a run's, when every
    pair a pilot ran failed: its estimate is not what the rest will cost."""
    from ..bench.estimate import estimate_run, without_pilot
    from ..render.estimate import estimate_view
    from ..render.format import format_usd

    console = stdout()
    failed = False
    for request in requests:
        progress = _bench_one(request)
        failed = failed or (progress.done > 0 and progress.errors == progress.done)
        console.print(
            f"pilot: {plural(progress.done, 'pair')} run for {format_usd(progress.cost_usd)}",
            highlight=False,
        )
        console.print(estimate_view(estimate_run(without_pilot(request))))
    first = requests[0]
    singles = first.invocation.strategy == "singles"
    run_dir = first.run_dir.parent if singles else first.run_dir
    console.print(
        printable(f"pilot done: continue the run with `conductor bench --resume {run_dir}`"),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if failed:
        stderr().print(
            "every pair of the pilot failed (see `conductor report` and `conductor trace` "
            "of its directory): fix what failed before paying for the rest",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_FAILED)


def _bench_one(request: BenchRequest, tracer: RecordSink | None = None) -> BenchProgress:
    """Run one request under a progress bar on stderr when stdout is a terminal, or
    with plain progress lines on stdout when it is not (a pipe, a CI log)."""
    from ..bench.session import BenchSession

    session = BenchSession(request)
    console = stderr()
    label = f"{request.spec.name} · {request.strategy}"

    def on_warning(text: str) -> None:
        console.print(f"[yellow]warning:[/] {text}", highlight=False)

    lines = None if stdout().is_terminal else _PlainProgress(label)
    # Never both: a bar redrawn on a terminal that also shows the lines (through
    # `| tee`) would tear them apart.
    bar = _Bar(console, label) if lines is None and console.is_terminal else None
    with bar or contextlib.nullcontext(), lines or contextlib.nullcontext():

        def on_progress(p: BenchProgress) -> None:
            if lines is not None:
                lines.update(p)
            elif bar is not None:
                bar.update(p)

        try:
            progress = session.run(on_progress=on_progress, on_warning=on_warning, tracer=tracer)
        except KeyboardInterrupt:
            run_dir = request.run_dir
            interrupted(f"finished samples are kept in {run_dir} (--resume {run_dir})")
    if request.resume and progress.nothing_to_run:
        # One unwrapped line: the path in it stays whole for copying.
        done = plural(progress.total, "sample")
        console.print(
            printable(
                f"nothing to resume: the run in {request.run_dir} is complete ({done} "
                f"recorded); `conductor report {request.run_dir}` shows its scores"
            ),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return progress


class _Bar:
    """The progress bar on a terminal's stderr; rich's progress module is imported only
    when one is shown (a run in a pipe or a log has no use for it)."""

    def __init__(self, console: Console, label: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._bar.add_task(label, total=None, stats="")

    def update(self, p: BenchProgress) -> None:
        from ..render.format import format_usd

        acc = f"{p.accuracy:.1f}%" if p.accuracy is not None else "-"
        stats = f"acc {acc} · {format_usd(p.cost_usd)} · errors {p.errors}"
        if p.batches is not None:
            from ..render.bench_progress import format_board

            stats += f" · {format_board(p.batches)}"
        self._bar.update(self._task, total=p.total, completed=p.skipped + p.done, stats=stats)

    def __enter__(self) -> _Bar:
        self._bar.start()
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        self._bar.stop()


class _PlainProgress:
    """:class:`~conductor.render.bench_progress.ProgressLines` printed to stdout, with
    a timer thread for the lines no finished sample brings (a slow run's heartbeat).
    A context manager: the timer runs inside the block, the last line is printed when
    the run ends (not when it fails or is interrupted: the error says what happened)."""

    def __init__(self, label: str) -> None:
        from ..render.bench_progress import ProgressLines

        self._lines = ProgressLines(label, start=time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._run, name="conductor-progress", daemon=True)
        self._console = stdout()

    def _print(self, line: str | None) -> None:
        if line is None:
            return
        from rich.text import Text

        # One line whatever its length; flushed, so a log shows it at once.
        self._console.print(Text(printable(line)), soft_wrap=True, highlight=False)
        self._console.file.flush()

    def update(self, progress: BenchProgress) -> None:
        with self._lock:
            self._print(self._lines.update(progress, time.monotonic()))

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._print(self._lines.tick(time.monotonic()))

    def __enter__(self) -> _PlainProgress:
        self._timer.start()
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        self._stop.set()
        self._timer.join()
        if kind is None:
            with self._lock:
                self._print(self._lines.final(time.monotonic()))


def _bench_merge(dirs: list[Path], out: Path | None, ci: CiOutputs) -> None:
    from ..bench.session import merge_bench

    if out is None:
        raise UsageError("bench merge needs --out DIR")
    n = merge_bench(dirs, out)
    records, runs = plural(n, "record"), plural(len(dirs), "run")
    print_path(stdout(), f"merged {records} from {runs} into", out)
    ci.finish(_print_report(_written_summaries([out])), failed=False)


def _written_summaries(run_dirs: list[Path]) -> list[RunSummary]:
    """The summaries ``bench`` has just written to ``run_dirs`` (``summary.json``, read
    when it is newer than every file it is made from): reading the records again would
    cost as much as the summary did."""
    from ..runs.summary import current_summary

    return [current_summary(d) for d in run_dirs]


def _question_oracles(summaries: list[RunSummary]) -> dict[str, QuestionOracle]:
    """The per-question oracle of each benchmark with two or more ``single:*`` runs
    (read from their records; a benchmark whose singles share no question has none)."""
    from ..errors import ConductorError
    from ..router import read_routing_data

    by_bench: dict[str, list[str]] = {}
    for s in summaries:
        if s.strategy.startswith("single:") and s.n_records:
            by_bench.setdefault(s.benchmark, []).append(s.run_dir)
    out: dict[str, QuestionOracle] = {}
    for bench, dirs in by_bench.items():
        if len(set(dirs)) < 2:
            continue
        try:
            out[bench] = read_routing_data(dirs).oracle()
        except (ConductorError, ImportError):
            continue  # no shared question, or numpy missing: the line is left out
    return out


def _print_report(
    summaries: list[RunSummary], oracles: dict[str, QuestionOracle] | None = None
) -> list[RunSummary]:
    """Print the report of ``summaries`` (with the per-question oracles, worked out
    here unless given); return them."""
    from ..render.report import report_views

    console = stdout()
    known = oracles if oracles is not None else _question_oracles(summaries)
    for renderable in report_views(summaries, known):
        console.print(renderable)
    return summaries


def report(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Bench run directories, side by side (a singles run stands for its "
            "single-WORKER directories)."
        ),
    ],
    fail_under: FailUnderOption = None,
    junit: JunitOption = None,
    markdown: MarkdownOption = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE",
            help="Also draw accuracy against cost per question (95% intervals, the Pareto "
            "frontier) to FILE, a .png or .svg.",
        ),
    ] = None,
) -> None:
    """Scores, cost and usage of saved bench runs, with the paper's figures for reference.

    Exit codes: 0 shown, 2 bad usage or a run directory that cannot be read, 3 an
    accuracy below --fail-under.
    """
    from ..runs.rundir import run_dirs

    ci = CiOutputs.of(fail_under, junit, markdown)
    if plot is not None:
        from ..view.plots import PLOT_SUFFIXES, require_matplotlib

        if plot.suffix.lower() not in PLOT_SUFFIXES:
            raise UsageError(f"--plot {plot}: give a file ending in .png or .svg")
        require_matplotlib()  # before the tables, not after them
    # A `singles` run stands for its single-WORKER directories.
    from ..runs.summary import current_summary

    dirs = [d for r in runs for d in (run_dirs(r) or [r])]
    # summary.json only where it was written after every file it is made from: a run
    # may have grown since (current_summary reads the records then).
    summaries = [current_summary(d) for d in dirs]
    oracles = _question_oracles(summaries)
    _print_report(summaries, oracles)
    if plot is not None:
        # The per-question oracle is a line across the chart where one benchmark is drawn.
        benches = {s.benchmark for s in summaries}
        drawn = oracles.get(benches.pop()) if len(benches) == 1 else None
        _write_plot(dirs, plot, drawn.accuracy if drawn is not None else None)
    ci.finish(summaries, failed=False)


def _write_plot(dirs: list[Path], plot: Path, ceiling: float | None = None) -> None:
    from ..text import printable
    from ..view.plots import accuracy_cost_plot, bench_run_points

    points, left_out = bench_run_points(dirs)
    for run_dir, why in left_out:
        stderr().print(
            f"warning: {printable(str(run_dir))} is not on the chart: {why}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if not points:
        raise UsageError(f"--plot {plot}: none of the runs has an accuracy and a cost to draw")
    accuracy_cost_plot(points, plot, ceiling=ceiling)
    print_path(stdout(), f"chart of {plural(len(points), 'run')} written to", plot)
