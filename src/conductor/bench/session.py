"""A bench session: what ``conductor bench`` does between reading its options and
showing the scores.

:func:`plan_bench` turns the options as given (:class:`BenchArgs`; what was not given
again is taken from the :class:`~conductor.runs.config.Invocation` of the run being
resumed; the result is the new run's invocation) into one :class:`BenchRequest` per run
directory (a ``singles`` run has one per worker).  :class:`BenchSession` runs one
request: it opens the call cache, builds the callers and the strategy, checks every
key it will need, runs :func:`~conductor.bench.runner.run_benchmark`, keeps the
providers' rate limits and writes the summary.  :func:`merge_bench` joins shard
directories.  Nothing here prints: progress and warnings go to the callbacks given.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..benchmark import BenchmarkSpec
from ..bounds import SAMPLES, SHARDS, Bound, parse_count, shown_number
from ..errors import UsageError
from ..execute import RunSettings
from ..pool import Pool
from ..runs.config import Invocation, read_run_config
from ..runs.summary import RunSummary, SummaryBuilder, write_summary
from ..state import StateURL, open_call_cache, open_rates, state_url_from
from ..strategies import DEFAULT_CONCURRENCY
from ..userfiles import check_regular, is_regular
from .faults import BenchStopped
from .runconfig import BenchOptions
from .runner import BenchProgress

if TYPE_CHECKING:
    from ..conductors.spec import Conductor
    from ..grading import Grader
    from ..llm.caller import CallerSet
    from ..llm.cost import SpendMeter
    from ..otel import RecordSink
    from ..state.spend import RunSpend
    from ..strategies import Strategy
    from ..targets import Worker

__all__ = [
    "BenchArgs",
    "BenchRequest",
    "BenchSession",
    "bench_grader",
    "bench_options",
    "build_strategy",
    "merge_bench",
    "plan_bench",
]


@dataclass(frozen=True)
class BenchArgs:
    """The options of one ``conductor bench`` run, as given.

    ``None`` is "not given": with ``resume`` the value the run was started with is
    used, else the default (for ``concurrency``: as many samples as the pool's models
    serve at once, at most 16).  ``shard`` is the text ``I/N``; ``overwrite`` deletes
    the run already in ``out`` first.
    """

    benchmark: str | None = None
    pool: str | None = None
    conductor: str | None = None
    strategy: str | None = None
    data: Path | None = None
    limit: int | None = None
    epochs: int | None = None
    seed: int | None = None
    concurrency: int | None = None
    out: Path | None = None
    resume: Path | None = None
    retry_errors: bool = False
    shard: str | None = None
    max_steps: int | None = None
    rounds: int | None = None
    budget_usd: float | None = None
    max_calls: int | None = None
    no_cache: bool = False
    #: ``--state`` as given (``None``: ``$CONDUCTOR_STATE_URL``, else local files).
    state: str | None = None
    unsafe_code: bool = False
    exclude_trained: bool = False
    overwrite: bool = False
    #: ``--batch`` / ``--no-batch`` (``None``: as the resumed run, else live) and
    #: ``--max-usd``, the whole run's cap.
    batch: bool | None = None
    max_usd: float | None = None
    #: ``--estimate`` (the runs are planned, not run: no key is needed) and ``--pilot
    #: N`` (each run stops after its first N pairs left).
    estimate: bool = False
    pilot: int | None = None
    #: ``--ray ADDRESS`` (or ``auto``): samples and code grading run as tasks on that
    #: Ray cluster; ``None``: in this process.
    ray: str | None = None
    #: ``--cost-weight``: the weight a cost-conditioned Conductor's prompt states.
    cost_weight: float | None = None


@dataclass(frozen=True)
class BenchRequest:
    """One strategy on one benchmark, written to ``run_dir``.

    ``invocation`` is the run's options as ``config.json`` keeps them (what ``--resume``
    reads back): the Conductor SPEC (``--strategy conductor`` only), limits, seed,
    ``concurrency`` (``None`` is as many samples as the pool's models serve at once, at
    most :data:`~conductor.strategies.DEFAULT_CONCURRENCY`), ``exclude_trained`` (skip
    the questions the Conductor's checkpoint was trained on).  ``data`` is the data file
    as given; ``shard`` and ``settings`` (the per-question limits) are the invocation's,
    parsed; ``unsafe_code`` lets the code graders use a sandbox weaker than bubblewrap;
    ``overwrite`` deletes the run already in ``run_dir`` before this one starts.
    """

    spec: BenchmarkSpec
    pool: Pool
    strategy: str
    run_dir: Path
    invocation: Invocation = field(default_factory=Invocation)
    data: Path | None = None
    resume: bool = False
    retry_errors: bool = False
    shard: tuple[int, int] | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    no_cache: bool = False
    #: Where the call cache is kept (``None``: this machine's cache directory).
    state: StateURL | None = None
    unsafe_code: bool = False
    overwrite: bool = False
    #: Stop after this many of the pairs left (``--pilot N``); ``None``: run them all.
    max_pairs: int | None = None
    #: The Ray cluster the samples and code grades run on (``--ray``); ``None``: here.
    #: Where a sample runs does not decide it: the run's config does not record it.
    ray: str | None = None


def plan_bench(args: BenchArgs) -> list[BenchRequest]:
    """The runs ``args`` asks for, one per run directory, in the order to run them.

    Raises :class:`UsageError` for options that do not fit together, and before
    anything runs for a ``singles`` run that lacks a worker's key.
    """
    from ..pool import open_pool
    from .spec import load_benchmark

    if args.retry_errors and args.resume is None:
        raise UsageError("--retry-errors needs --resume DIR")
    _check_pilot(args)
    if args.overwrite and args.resume is not None:
        raise UsageError(
            "give either --resume DIR (to continue the run there) or --overwrite (to start "
            "it again from nothing), not both"
        )
    out = args.out
    if args.resume is not None:
        if out is not None and out != args.resume:
            raise UsageError("give either --out or --resume, not both")
        out = args.resume
    # What was not given again is taken from the run being resumed.
    stored = _stored_invocation(args.resume) if args.resume is not None else Invocation()
    benchmark = args.benchmark if args.benchmark is not None else stored.benchmark
    if benchmark is None:
        raise UsageError("name a benchmark, or give --resume DIR to continue a run")
    data = args.data if args.data is not None else _opt_path(stored.data)
    if data is not None:
        # Checked before its path is resolved (a looping link) or recorded.
        check_regular(data, "data file")
    invocation = _resolve(args, stored, data)
    state = state_url_from(args.state)
    _check_ray(args, invocation, state)
    spec = load_benchmark(benchmark)
    if spec.training_only and data is None:
        raise UsageError(
            f"benchmark {spec.name} is for training only (it has no evaluation source); "
            "pass --data FILE to evaluate on other questions in its schema"
        )
    pool_obj = open_pool(args.pool if args.pool is not None else stored.pool)
    shard_t = _parse_shard(invocation.shard)
    strategy = invocation.strategy or "conductor"
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        label = re.sub(r"[^A-Za-z0-9._-]+", "-", strategy).strip("-.")
        out = Path("runs") / f"{spec.name}-{label}-{stamp}"
    singles = strategy == "singles"
    strategies = [f"single:{w.id}" for w in pool_obj.workers] if singles else [strategy]
    if singles and not args.estimate:
        from ..llm.keys import require_keys

        require_keys(pool_obj.workers)  # every worker's key, before the first single runs
    settings = RunSettings(
        max_steps=invocation.max_steps,
        rounds=invocation.rounds or 1,
        budget_usd=invocation.budget_usd,
        max_calls=invocation.max_calls,
    )
    return [
        BenchRequest(
            spec=spec,
            pool=pool_obj,
            strategy=strat,
            run_dir=out / f"single-{strat.split(':', 1)[1]}" if singles else out,
            invocation=invocation,
            data=data,
            resume=args.resume is not None,
            retry_errors=args.retry_errors,
            shard=shard_t,
            settings=settings,
            no_cache=args.no_cache,
            state=state,
            unsafe_code=args.unsafe_code,
            overwrite=args.overwrite,
            max_pairs=args.pilot,
            ray=args.ray,
        )
        for strat in strategies
    ]


def _check_ray(args: BenchArgs, invocation: Invocation, state: StateURL | None) -> None:
    """``--ray`` with what needs the calls counted or made in this process: provider
    batches are sent from here, and the spend cap counts the nodes' calls only on a
    state server (the nodes charge the run's counter there).  Checked on
    ``invocation``: a resumed run keeps its ``--batch`` and ``--max-usd``."""
    if args.ray is None or args.estimate:
        return
    if invocation.batch:
        raise UsageError(
            "--ray runs the samples' calls on the cluster's nodes; --batch needs them made "
            "in this process: leave one of the two out"
        )
    if invocation.max_usd is not None and state is None:
        raise UsageError(
            "--ray runs the samples' calls on the cluster's nodes; --max-usd counts their "
            "spend on a state server the nodes reach: add --state redis://HOST:PORT/DB"
        )


def _check_pilot(args: BenchArgs) -> None:
    """Refuse a ``--pilot`` that cannot mean anything, in one sentence (the CLI
    refuses it and ``--estimate`` with a merge and with the CI outputs)."""
    if args.pilot is None:
        return
    if args.estimate:
        raise UsageError(
            "give either --estimate (a figure, no model called) or --pilot N (a paid run "
            "of the first N pairs, then the figure for the rest), not both"
        )
    if args.pilot < 1:
        raise UsageError(
            "--pilot N runs the first N (sample, epoch) pairs: N must be 1 or more, "
            f"got {args.pilot}"
        )
    if args.pilot not in SAMPLES:
        raise UsageError(
            f"--pilot N runs the first N (sample, epoch) pairs: N must be {SAMPLES.describe()}, "
            f"got {shown_number(args.pilot)}"
        )


def bench_grader(request: BenchRequest) -> Grader:
    """The grader of ``request``'s benchmark, not warmed yet: the runner warms it when a
    sample is not replayed from the cache (a rerun that replays every sample starts no
    grading process, and a spend estimate none at all)."""
    from ..grading import get_grader
    from ..grading.code import with_unsafe_opt_in

    spec = request.spec
    return get_grader(
        spec.grader,
        with_unsafe_opt_in(spec.grader, spec.grader_options, request.unsafe_code),
        warm=False,
    )


def node_strategy(request: BenchRequest, spend: RunSpend | None = None) -> Strategy:
    """The strategy of ``request`` as a Ray node builds it to run samples (``bench
    --ray``): the same builder as here, its calls through the node's callers and the
    call cache ``request`` names (``--state``: the one shared server), each call paid
    for charged to the run's spend counter ``spend`` (``--max-usd``).  The cache stays
    open as long as the node's worker process."""
    from ..llm.caller import CallerSet
    from ..state.spend import NodeSpendMeter

    meter: NodeSpendMeter | None = None
    if request.invocation.max_usd is not None:
        if spend is None:
            # Never spend what no one counts: a capped run's node needs the counter.
            raise RuntimeError("a run with --max-usd sent a sample without its spend counter")
        meter = NodeSpendMeter(spend)
        _NODE_CACHES.callback(meter.close)
    cache = None if request.no_cache else _NODE_CACHES.enter_context(open_call_cache(request.state))
    # The node's calls count against the same rate as the driver's (the server's, with
    # --state), each key's stated rate known before the first call.
    callers = CallerSet(cache, meter=meter, rates=open_rates(request.state))
    strategy, _options = build_strategy(request, callers, bench_options(request))
    callers.declare(strategy.targets)
    return strategy


# What the node's strategies hold open for the worker process's life (their call caches
# and spend counters).
_NODE_CACHES = contextlib.ExitStack()


class _NodeFactory:
    """:func:`node_strategy` for ``request``, as the Ray tasks carry it.  It is pickled
    each time a sample is sent, and the run's session on the state server is known by
    then (the runner attaches it before the first sample): the node gets the run's
    spend counter (:class:`~conductor.state.spend.RunSpend`), never a connection."""

    def __init__(self, request: BenchRequest, meter: SpendMeter | None) -> None:
        self.request = request
        self.meter = meter

    def spend(self) -> RunSpend | None:
        from ..state.spend import SharedSpendMeter

        if not isinstance(self.meter, SharedSpendMeter):
            return None
        return self.meter.remote()

    def __call__(self) -> Strategy:
        return node_strategy(self.request, self.spend())

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (node_strategy, self.request, self.spend())


def bench_options(request: BenchRequest) -> BenchOptions:
    """The runner's options for ``request`` (before its strategy is known: see
    :func:`build_strategy`)."""
    return BenchOptions(
        out_dir=request.run_dir,
        data_file=request.data,
        limit=request.invocation.limit,
        epochs=request.invocation.epochs,
        seed=request.invocation.seed,
        concurrency=request.invocation.concurrency or DEFAULT_CONCURRENCY,
        resume=request.resume,
        retry_errors=request.retry_errors,
        shard=request.shard,
        invocation=request.invocation,
        pool_sha256=_file_sha256(request.pool.path),
        overwrite=request.overwrite,
        max_pairs=request.max_pairs,
        state=request.state,
    )


def build_strategy(
    request: BenchRequest, callers: CallerSet, options: BenchOptions
) -> tuple[Strategy, BenchOptions]:
    """The strategy ``request`` runs, its calls made through ``callers``, and
    ``options`` with the questions its Conductor's checkpoint was trained on (counted
    by the run, or skipped with ``--exclude-trained``).  Builds nothing that calls a
    model: a spend estimate builds it too."""
    from ..conductors.spec import resolve_conductor
    from ..strategies import ConductorStrategy, answer_key_for, parse_strategy
    from ..strategies.router import is_router_strategy

    given = request.invocation
    if request.strategy == "conductor":
        cond = resolve_conductor(
            request.pool,
            given.conductor,
            max_steps=request.settings.max_steps,
            cost_weight=given.cost_weight,
        )
        options = _with_trained_questions(options, cond, given.exclude_trained)
        return ConductorStrategy(request.pool, cond, request.settings, callers), options
    if is_router_strategy(request.strategy):
        return _router(request, callers, options)
    if given.conductor is not None:
        raise UsageError("--conductor applies to --strategy conductor only")
    if given.cost_weight is not None:
        raise UsageError("--cost-weight applies to --strategy conductor only")
    if given.exclude_trained:
        raise UsageError("--exclude-trained applies to --strategy conductor only")
    strategy = parse_strategy(
        request.strategy,
        request.pool,
        callers,
        vote_key=answer_key_for(request.spec.grader),
        settings=request.settings,
    )
    return strategy, options


class BenchSession:
    """One :class:`BenchRequest`: its grader is built at once (a bad grader option is
    refused before anything runs), the rest when :meth:`run` is called."""

    def __init__(self, request: BenchRequest) -> None:
        self.request = request
        #: The run's records as they are written, folded into its scores (so the
        #: summary after the run reads nothing back).
        self.summary = SummaryBuilder(request.run_dir)
        self._grader = bench_grader(request)
        self._options = bench_options(request)
        if request.ray is not None:
            self._grader, self._options = _on_ray(request, self._grader, self._options)

    def run(
        self,
        *,
        on_progress: Callable[[BenchProgress], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        tracer: RecordSink | None = None,
    ) -> BenchProgress:
        """Run the request to the end and write the run's summary; with ``tracer``,
        each record written becomes a trace.

        The summary is written too when the run is stopped (by a full disk, a
        rejected key, or ``Ctrl-C``, which is raised again as ``KeyboardInterrupt``).
        """
        try:
            progress = asyncio.run(self._run(on_progress, on_warning, tracer))
        except BenchStopped:
            # What was written is summarised if the directory still takes a write.
            with contextlib.suppress(Exception):
                self.write_summary()
            raise
        except KeyboardInterrupt:
            self.write_summary()
            raise
        self.write_summary()
        return progress

    def write_summary(self) -> RunSummary:
        """Write the run's ``summary.json``: from the records folded in as they were
        written when the builder saw the whole file, else by reading the file (a run
        stopped before it claimed its directory)."""
        if self.summary.covers_file:
            return self.summary.write()
        # A shared run's builder never covers the file: every process scores it whole.
        return write_summary(self.request.run_dir)

    async def _run(
        self,
        on_progress: Callable[[BenchProgress], None] | None,
        on_warning: Callable[[str], None] | None,
        tracer: RecordSink | None = None,
    ) -> BenchProgress:
        from ..llm.caller import CallerSet
        from ..llm.cost import SpendMeter
        from ..llm.keys import require_keys
        from ..pool import pool_to_public_dict
        from ..runs.summary import record_rate_limits
        from ..state.spend import SharedSpendMeter
        from ..strategies import capped_warning, concurrency_warning, default_concurrency
        from .batchrun import BATCH_CONCURRENCY, batch_setup
        from .runner import run_benchmark

        r = self.request
        given = r.invocation
        options = self._options
        opened = contextlib.nullcontext() if r.no_cache else open_call_cache(r.state)
        with opened as cache:
            meter: SpendMeter | None = None
            if given.max_usd is not None:
                # With --state the cap is the run's, all its processes together.
                meter = (
                    SpendMeter(given.max_usd)
                    if r.state is None
                    else SharedSpendMeter(given.max_usd)
                )
            callers = CallerSet(cache, meter=meter, rates=open_rates(r.state))
            strat, options = build_strategy(r, callers, options)
            callers.declare(strat.targets)
            if r.ray is not None:
                from ..placement.raycluster import RayStrategy

                # Each sample runs on a node, the same builder making its strategy there;
                # records come back here, the only writer of the run directory.
                strat = RayStrategy(strat, _NodeFactory(r, meter))
            # Every missing key at once, before the first sample (and before the run
            # directory holds anything).
            require_keys(strat.targets)
            if meter is not None:
                _check_priced(strat.targets)
            batching = batch_setup(given.batch, strat.targets, callers, cache)
            if given.batch and batching is None and on_warning is not None:
                on_warning(
                    "--batch: none of the run's models has a provider batch API (client "
                    "openai, anthropic or google, or a litellm model named openai/, "
                    "anthropic/ or gemini/); every call is made live"
                )
            if batching is not None:
                # A wave holds the calls of every sample in flight: all of them, unless
                # --concurrency says otherwise (what the models serve at once is moot).
                concurrency = given.concurrency or BATCH_CONCURRENCY
                options = dataclasses.replace(options, concurrency=concurrency)
            elif given.concurrency is None:
                options = dataclasses.replace(options, concurrency=default_concurrency(strat))
            else:
                # One sentence at most: above what the models serve together, or above
                # what one of them serves alone.
                warning = concurrency_warning(strat, given.concurrency) or capped_warning(
                    strat, given.concurrency
                )
                if warning and on_warning is not None:
                    on_warning(warning)
            try:
                return await run_benchmark(
                    r.spec,
                    strat,
                    self._grader,
                    pool_to_public_dict(r.pool),
                    options,
                    cache=cache,
                    on_progress=on_progress,
                    summary=self.summary,
                    batching=batching,
                    meter=meter,
                    tracer=tracer,
                )
            finally:
                record_rate_limits(r.run_dir, callers.limits.history())


def _on_ray(
    request: BenchRequest, grader: Grader, options: BenchOptions
) -> tuple[Grader, BenchOptions]:
    """Join ``request``'s Ray cluster; a grader that runs code grades there, as many
    at once as the cluster's nodes declare sandbox units for.  Other graders (a number
    or a letter compared) stay in this process."""
    from ..grading.code import with_unsafe_opt_in
    from ..placement.raycluster import RayGrader, connect, sandbox_slots

    assert request.ray is not None
    connect(request.ray)
    spec = request.spec
    if spec.grader != "code":
        return grader, options
    slots = sandbox_slots()
    grader_options = with_unsafe_opt_in(spec.grader, spec.grader_options, request.unsafe_code)
    ray_grader = RayGrader(spec.grader, grader_options)
    return ray_grader, dataclasses.replace(options, grader_concurrency=slots)


def _check_priced(targets: tuple[Worker, ...] | list[Worker]) -> None:
    """Refuse ``--max-usd`` when a target's price is unknown: its spend could not be
    seen, and the cap would not hold."""
    from ..llm.cost import price_for

    unknown = [t.id for t in targets if price_for(t) is None]
    if unknown:
        raise UsageError(
            f"--max-usd cannot see what {', '.join(repr(u) for u in unknown)} cost: no "
            "price is known for its model; give it a price: {input_per_mtok, "
            "output_per_mtok} in the pool file, or run without --max-usd"
        )


def merge_bench(dirs: list[Path], out: Path) -> int:
    """Join the shard directories ``dirs`` into ``out`` and summarise it; return the
    number of records merged."""
    from .merge import merge_runs

    n = merge_runs(dirs, out)
    write_summary(out)
    return n


def _parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    index, _slash, count = text.partition("/")
    try:
        # Each number read within its range before int() sees it: any length of text
        # is one sentence.
        n = parse_count(count, SHARDS, "N")
        return parse_count(index, Bound(0, n - 1), "I"), n
    except UsageError:
        shown = repr(text) if len(text) <= 40 else f"of {len(text):,} characters"
        raise UsageError(
            f"--shard {shown} must be I/N with 0 <= I < N and N at most {SHARDS.high:,}, e.g. 0/4"
        ) from None


def _router(
    request: BenchRequest, callers: CallerSet, options: BenchOptions
) -> tuple[Strategy, BenchOptions]:
    """``router:DIR``'s strategy (a ``conductor`` arm is the Conductor ``--conductor``
    names, or the pool's), with the questions the router was fitted on (counted by the
    run, or skipped with ``--exclude-trained``)."""
    from ..conductors.spec import resolve_conductor
    from ..strategies import ConductorStrategy, answer_key_for
    from ..strategies.router import router_strategy
    from .trained import trained_questions_of_router

    given = request.invocation

    def conductor_arm() -> Strategy:
        cond = resolve_conductor(
            request.pool,
            given.conductor,
            max_steps=request.settings.max_steps,
            cost_weight=given.cost_weight,
        )
        return ConductorStrategy(request.pool, cond, request.settings, callers)

    strategy = router_strategy(
        request.strategy,
        request.pool,
        callers,
        conductor=conductor_arm,
        vote_key=answer_key_for(request.spec.grader),
        settings=request.settings,
        pool_sha256=options.pool_sha256,
    )
    if given.cost_weight is not None and "conductor" not in strategy.arms:
        raise UsageError(
            f"--cost-weight: router {request.strategy} has no conductor arm to give it to"
        )
    if given.conductor is not None and "conductor" not in strategy.arms:
        raise UsageError(
            f"--conductor: router {request.strategy} has no conductor arm to give it to"
        )
    trained = trained_questions_of_router(strategy.routed)
    return strategy, dataclasses.replace(
        options, trained_on=trained, exclude_trained=given.exclude_trained
    )


def _with_trained_questions(
    options: BenchOptions, conductor: Conductor, exclude: bool
) -> BenchOptions:
    """``options`` with the questions ``conductor``'s checkpoint was trained on (counted
    by the run, or skipped with ``exclude``)."""
    from .trained import trained_questions_of

    trained = trained_questions_of(conductor)
    return dataclasses.replace(options, trained_on=trained, exclude_trained=exclude)


def _resolve(args: BenchArgs, stored: Invocation, data: Path | None) -> Invocation:
    """The invocation of the run ``args`` asks for: each option as given, else as the run
    being resumed (``stored``) was started.  Files by absolute path, shipped names as
    names (they move with the package); ``data`` is the data file so chosen."""

    def given(name: str) -> Any:
        value = getattr(args, name)
        return value if value is not None else getattr(stored, name)

    return Invocation(
        benchmark=_as_given(given("benchmark")),
        pool=_as_given(given("pool")),
        conductor=given("conductor"),
        strategy=args.strategy or stored.strategy or "conductor",
        data=str(data.resolve()) if data is not None else None,
        limit=given("limit"),
        epochs=given("epochs"),
        seed=given("seed"),
        shard=given("shard"),
        max_steps=given("max_steps"),
        rounds=args.rounds or stored.rounds or 1,
        budget_usd=given("budget_usd"),
        max_calls=given("max_calls"),
        # Kept as given: not given, it follows the pool's models when the run resumes too.
        concurrency=args.concurrency or stored.concurrency,
        exclude_trained=args.exclude_trained or stored.exclude_trained,
        batch=args.batch if args.batch is not None else stored.batch,
        max_usd=given("max_usd"),
        cost_weight=given("cost_weight"),
    )


def _stored_invocation(run_dir: Path) -> Invocation:
    """The options a bench run in ``run_dir`` was started with (for ``--resume DIR``).

    A ``singles`` run keeps one directory per worker below ``run_dir``; the first one
    speaks for all."""
    from ..runs.rundir import run_dirs
    from .runconfig import stored_invocation

    dirs = run_dirs(run_dir)
    if dirs and dirs[0] != run_dir:
        return dataclasses.replace(stored_invocation(read_run_config(dirs[0])), strategy="singles")
    return stored_invocation(read_run_config(run_dir))


def _as_given(name_or_path: str | None) -> str | None:
    """A file's absolute path, or the name of a shipped file unchanged."""
    if name_or_path is None:
        return None
    path = Path(name_or_path).expanduser()
    return str(path.resolve()) if is_regular(path) else name_or_path


def _opt_path(value: Any) -> Path | None:
    return Path(value) if isinstance(value, str) and value else None


def _file_sha256(path: Path | None) -> str | None:
    if path is None:
        return None
    from ..datasets.samples import sha256_file

    try:
        return sha256_file(path)  # in blocks, a regular file only
    except (OSError, UsageError):
        return None
