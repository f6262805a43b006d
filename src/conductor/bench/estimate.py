"""What a bench run will cost before it runs: ``conductor bench --estimate``, and the
figure for the rest of a run that ``--pilot N`` ends with.

:func:`estimate_run` takes the :class:`~conductor.bench.session.BenchRequest` a run
would be given and makes no model call and writes nothing: it refuses what the run
would refuse (another run's records in the directory, a resume that does not continue
the run), lists the (sample, epoch) pairs the run has left, looks each one up in the
sample cache (read only: a pair the cache would replay costs nothing and is counted
apart), and expects calls, tokens and dollars for the others, role by role (the
Conductor's calls; each worker's steps).

The figures come from the best source at hand:

1. **Measured**: records of this run, which are of this benchmark, pool and strategy:
   those of the run being resumed (a pilot's among them) and those the sample cache
   holds for pairs left.  For each role, calls and output tokens a question are their
   means; input tokens a question are a fixed part plus a part per token of the
   question's prompt, fitted by least squares where the records allow it (at least
   three, questions of different sizes, and a slope clearly above its noise), else
   their ratio to the prompt's tokens.  Dollars are tokens at the pool's prices now.
   A record none of whose calls was answered (a provider down, a model refused) is
   left out, and said to be: it would have the rest cost nothing.
2. **Assumed**, where nothing of the run has been measured: the calls are those the
   strategy plans for each question
   (:meth:`~conductor.strategies.Strategy.planned_calls`: the benchmark's prompt, the
   Conductor's requests from its template, a worker's step from its context settings,
   each built as the run would build it; the estimate never asks which class a
   strategy is, and refuses one that cannot say what it will call rather than price it
   at nothing), counted by :class:`Assumptions`, which holds every assumption in one
   place: how many characters make a token, how many steps a workflow has (the paper's
   average) and how long a subtask is.  A reply is taken to be as long as the target's
   ``max_tokens`` allows, so an assumed figure is a ceiling rather than a guess.

Prices are :func:`~conductor.llm.cost.price_for`'s; a target whose price is unknown is
named and its dollars left unknown, never counted as free.  Each role's batch price
(:meth:`~conductor.targets.Price.for_batch`) is given beside the live one for the
targets ``--batch`` would batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..datasets.samples import render_prompt
from ..errors import UsageError
from ..llm.types import Message
from ..record import CallRecord, RunRecord
from ..strategies.base import CONDUCTOR_ROLE, PlannedShare
from ..targets import Worker
from ..text import plural, printable

if TYPE_CHECKING:
    from ..execute import RunSettings
    from ..llm.cache import ResponseCache
    from ..strategies import Strategy
    from .runconfig import BenchOptions
    from .session import BenchRequest

__all__ = [
    "ASSUMED",
    "Assumptions",
    "RoleEstimate",
    "RunEstimate",
    "estimate_run",
    "message_chars",
    "without_pilot",
]


@dataclass(frozen=True)
class Assumptions:
    """What an estimate assumes where nothing of the run has been measured.

    ``chars_per_token`` turns text into tokens: OpenAI's rule of thumb for English
    (about four characters a token); measured records recalibrate it.
    ``workflow_steps`` is how many steps a Conductor's workflow has: the paper's
    average over its four training tasks (Table 6: about three; one or two on MMLU,
    three or four on LiveCodeBench), each step given to any worker alike and seeing the
    steps before it.  ``subtask_tokens`` is how long an instruction the Conductor writes
    for a step is (its default cap is 300 characters).  ``unbounded_output_tokens`` is
    the reply of a target whose pool sets no ``max_tokens``: 4096, what the Anthropic
    client sends where none is set (its API requires one) and the paper's workers'
    limit.
    """

    chars_per_token: float = 4.0
    workflow_steps: int = 3
    subtask_tokens: int = 50
    unbounded_output_tokens: int = 4096


#: The assumptions every estimate makes unless given others.
ASSUMED = Assumptions()


@dataclass(frozen=True)
class RoleEstimate:
    """What one role's calls are expected to take over the pairs left: the Conductor's
    (:data:`CONDUCTOR_ROLE`) or one worker's steps (its id).

    ``usd`` is at the live price and ``batch_usd`` at the batch price where ``--batch``
    would batch the target's calls (else live); both are ``None`` when the target's
    price is unknown.  ``batched`` says whether the run, as asked, batches them.
    ``basis`` says how the figures were reached, in words.
    """

    role: str
    model: str
    calls: float
    input_tokens: float
    output_tokens: float
    usd: float | None
    batch_usd: float | None
    batched: bool
    basis: str


@dataclass(frozen=True)
class RunEstimate:
    """The expected spend of one bench run (one strategy on one benchmark).

    ``total`` is the run's (sample, epoch) pairs in all (this shard's); ``recorded`` of
    them are in its directory already (a resume), ``replayed`` of those left the sample
    cache would replay at no cost, and ``pairs`` are left to run and pay for.
    ``measured`` is how many records the figures were measured on (``0``: assumed),
    ``source`` where they came from and ``assumptions`` what was assumed instead, both
    in words; ``chars_per_token`` is the rule text was counted by (``calibrated`` on
    measured calls, or assumed).  ``batch`` is whether the run was asked for ``--batch``
    and ``max_usd`` its cap, which ``spent_usd`` (the recorded pairs' cost) counts
    against.
    """

    benchmark: str
    strategy: str
    run_dir: Path
    total: int
    recorded: int
    replayed: int
    pairs: int
    roles: tuple[RoleEstimate, ...]
    measured: int
    source: str
    chars_per_token: float
    calibrated: bool
    assumptions: tuple[str, ...] = ()
    batch: bool = False
    max_usd: float | None = None
    #: What the pairs recorded already cost (a resume's ``--max-usd`` counts it).
    spent_usd: float = 0.0

    @property
    def calls(self) -> float:
        return sum(r.calls for r in self.roles)

    @property
    def input_tokens(self) -> float:
        return sum(r.input_tokens for r in self.roles)

    @property
    def output_tokens(self) -> float:
        return sum(r.output_tokens for r in self.roles)

    @property
    def unpriced(self) -> tuple[str, ...]:
        """The roles expected to make calls whose price is unknown."""
        return tuple(r.role for r in self.roles if r.calls > 0 and r.usd is None)

    @property
    def usd(self) -> float | None:
        """Every call at the live price; ``None`` when a price is unknown."""
        return _total(r.usd for r in self.roles if r.calls > 0)

    @property
    def batch_usd(self) -> float | None:
        """Every call ``--batch`` would batch at the batch price, the rest live."""
        return _total(r.batch_usd for r in self.roles if r.calls > 0)

    @property
    def run_usd(self) -> float | None:
        """What the run as asked pays: its batched calls at the batch price."""
        return _total(r.batch_usd if r.batched else r.usd for r in self.roles if r.calls > 0)


def _total(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def message_chars(messages: Sequence[Message], target: Worker) -> int:
    """The characters of text ``target`` is sent with ``messages``: every message's
    content and the target's ``system_prompt``, which its client adds."""
    chars = len(target.system_prompt or "")
    for message in messages:
        content: Any = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(str(p.get("text") or "")) for p in content if isinstance(p, dict))
    return chars


def _output_bound(target: Worker, assumed: Assumptions) -> tuple[int, bool]:
    """The most output tokens a call of ``target`` may write (its ``max_tokens``), and
    whether it is assumed (no ``max_tokens`` set)."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = target.params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, False
    return assumed.unbounded_output_tokens, True


# -- the pairs left ----------------------------------------------------------------------


@dataclass
class _Pairs:
    """The pairs of the run as the estimate sees them: how many in all, recorded
    already and replayed by the sample cache, and the prompts of those to run (one
    string per pair, shared by a sample's epochs)."""

    total: int = 0
    recorded: int = 0
    replayed: int = 0
    pending: list[str] = field(default_factory=list)


def _open_cache(request: BenchRequest) -> ResponseCache | None:
    """The call cache, to be read only, or ``None``: ``--no-cache``, or no cache made
    yet (nothing could be replayed, and an estimate creates nothing)."""
    if request.no_cache:
        return None
    if request.state is not None:
        from ..state import open_shared_cache

        return open_shared_cache(request.state)
    from ..llm.cache import DB_FILE, ResponseCache
    from ..private import default_cache_dir

    directory = default_cache_dir()
    if not (directory / DB_FILE).is_file():
        return None
    return ResponseCache(directory, write_behind=False)


def _pairs_left(
    request: BenchRequest, strategy: Strategy, options: BenchOptions, found: _Measurements
) -> _Pairs:
    """Refuse what the run would refuse, then list its pairs left (read only); the
    records the sample cache would replay go to ``found``."""
    from ..pool import pool_to_public_dict
    from . import samplecache
    from .claim import (
        check_claim,
        check_overwritable,
        recorded_keys,
        remaining_work,
        trained_count,
    )
    from .runconfig import build_config
    from .session import bench_grader

    spec = request.spec
    epochs = options.epochs or spec.epochs
    grader = bench_grader(request)
    trained = trained_count(spec, options)
    pool_dict = pool_to_public_dict(request.pool)
    config = build_config(spec, strategy, grader, pool_dict, options, epochs, trained)
    out = options.out_dir
    if options.overwrite:
        check_overwritable(out)
    pairs = _Pairs(total=check_claim(spec, options, config, epochs))
    done: set[tuple[str, int]] = set()
    if options.resume and not options.overwrite:
        done = recorded_keys(out, drop_errors=options.retry_errors)
    pairs.recorded = len(done)
    run_key = samplecache.run_key(config)
    prompts: dict[str, str] = {}
    cache = _open_cache(request)
    try:
        for sample, epoch in remaining_work(spec, options, epochs, done):
            prompt = prompts.get(sample.id)
            if prompt is None:
                prompt = prompts[sample.id] = render_prompt(spec, sample)
            if cache is not None:
                key = samplecache.sample_key(run_key, sample, prompt, epoch)
                kept = samplecache.replayed_record(samplecache.cache_get(cache, key))
                if kept is not None:
                    pairs.replayed += 1
                    found.add(kept[1])
                    continue
            pairs.pending.append(prompt)
    finally:
        if cache is not None:
            cache.close()
    return pairs


def _run_records(request: BenchRequest) -> Iterator[RunRecord]:
    """The records of the run being resumed (the last of each pair), if any."""
    from ..runs.rundir import SAMPLES, iter_records

    path = request.run_dir / SAMPLES
    if request.resume and not request.overwrite and path.is_file():
        yield from iter_records(path, latest=True)


# -- measured ----------------------------------------------------------------------------


@dataclass
class _Measure:
    """One measured record: its prompt's length and each role's calls and tokens."""

    prompt_chars: int
    usage: dict[str, tuple[int, int, int]]


class _Measurements:
    """What measured records say, folded one at a time (a resumed run's records are
    never held whole): each record's usage by role, and the text and tokens of every
    call that counted input, which calibrate the characters a token.  A record none of
    whose calls was answered is left out (counted in ``unanswered``)."""

    def __init__(self, targets: dict[str, Worker]) -> None:
        self.targets = targets
        self.records: list[_Measure] = []
        self.chars = 0
        self.tokens = 0
        #: Records left out: every call of theirs failed, none was answered.
        self.unanswered = 0

    def add(self, record: RunRecord) -> None:
        usage: dict[str, tuple[int, int, int]] = {}

        def count(role: str, call: CallRecord) -> None:
            calls, inp, out = usage.get(role, (0, 0, 0))
            usage[role] = (calls + 1, inp + call.input_tokens, out + call.output_tokens)
            target = self.targets.get(role)
            if call.input_tokens > 0 and target is not None:
                self.chars += message_chars(call.messages, target)
                self.tokens += call.input_tokens

        for rnd in record.rounds:
            for call in rnd.conductor_calls:
                count(CONDUCTOR_ROLE, call)
            for step in rnd.steps:
                for call in step.rejected:
                    count(step.worker_id, call)
                if step.status != "skipped":
                    count(step.worker_id, step.call)
        if not usage:
            return  # a run that failed before its first call says nothing of the calls
        if not any(inp or out for _calls, inp, out in usage.values()):
            # Every call failed (a provider down, a model refused): nothing was paid for,
            # and a figure measured on it would say the rest costs nothing.
            self.unanswered += 1
            return
        self.records.append(_Measure(len(record.question), usage))

    def chars_per_token(self, assumed: Assumptions) -> tuple[float, bool]:
        if self.tokens > 0 and self.chars > 0:
            return self.chars / self.tokens, True
        return assumed.chars_per_token, False


@dataclass(frozen=True)
class _Fit:
    """Input tokens a question: ``fixed`` plus ``per_token`` a token of its prompt."""

    fixed: float
    per_token: float
    fitted: bool

    def describe(self) -> str:
        if self.fitted:
            return f"input {self.fixed:,.0f} + {self.per_token:.2f} a prompt token (fitted)"
        return f"input {self.per_token:.2f} x the prompt's tokens (a ratio)"


#: How many standard errors the fitted slope must stand above zero to be used: a slope
#: within its noise would extrapolate the noise.
_SLOPE_ERRORS = 2.0


def _fit(points: Sequence[tuple[float, float]]) -> _Fit:
    """Least squares of input tokens on prompt tokens, where the points allow it (three
    or more, prompts of different sizes, neither part negative, a slope clear of its
    noise); else their ratio."""
    n = len(points)
    sum_q = sum(q for q, _ in points)
    sum_y = sum(y for _, y in points)
    if n >= 3:
        mean_q, mean_y = sum_q / n, sum_y / n
        sxx = sum((q - mean_q) ** 2 for q, _ in points)
        sxy = sum((q - mean_q) * (y - mean_y) for q, y in points)
        if sxx > 0:
            slope = sxy / sxx
            fixed = mean_y - slope * mean_q
            residual = sum((y - fixed - slope * q) ** 2 for q, y in points)
            error = math.sqrt(residual / (n - 2) / sxx)
            if fixed >= 0 and slope > 0 and slope >= _SLOPE_ERRORS * error:
                return _Fit(fixed, slope, True)
    return _Fit(0.0, sum_y / sum_q if sum_q > 0 else 0.0, False)


def _measured_roles(
    found: _Measurements, pending: Sequence[str], chars_per_token: float, roles: Sequence[str]
) -> dict[str, tuple[float, float, float, str]]:
    """Each role's expected (calls, input, output) over the ``pending`` prompts, and how
    they were reached, from the measured records."""
    records = found.records
    n = len(records)
    pending_tokens = sum(len(p) for p in pending) / chars_per_token
    sizes = [r.prompt_chars / chars_per_token for r in records]
    out: dict[str, tuple[float, float, float, str]] = {}
    for role in roles:
        usage = [r.usage.get(role, (0, 0, 0)) for r in records]
        calls = sum(u[0] for u in usage) / n
        output = sum(u[2] for u in usage) / n
        fit = _fit([(q, u[1]) for q, u in zip(sizes, usage, strict=True)])
        inp = fit.fixed * len(pending) + fit.per_token * pending_tokens
        basis = (
            f"measured: {_a_question(calls)}; {fit.describe()}; "
            f"output {output:,.0f} tokens a question"
            if calls > 0
            else "measured: never called"
        )
        out[role] = (calls * len(pending), inp, output * len(pending), basis)
    return out


# -- assumed -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Share:
    """A role's share of one call a question is assumed to make: its weight (a step
    the Conductor may give any worker is shared among them) and the call's tokens."""

    role: str
    weight: float
    input_tokens: float
    output_tokens: float


class _Assumed:
    """The calls a question is assumed to make, in order: the calls the strategy plans
    (:meth:`~conductor.strategies.Strategy.planned_calls`), counted by
    :class:`Assumptions`."""

    def __init__(self, strategy: Strategy, settings: RunSettings, assumed: Assumptions) -> None:
        self.strategy = strategy
        self.settings = settings
        self.assumed = assumed
        self.cpt = assumed.chars_per_token
        self.notes: dict[str, str] = {}
        #: How each role's calls are known, in words (``{calls}`` left to fill in).
        self.bases: dict[str, str] = {}

    def tokens(self, messages: Sequence[Message], target: Worker) -> float:
        return message_chars(messages, target) / self.cpt

    def output(self, role: str, target: Worker) -> float:
        bound, unset = _output_bound(target, self.assumed)
        how = (
            f"no max_tokens: {bound:,} assumed"
            if unset
            else f"its max_tokens, {bound:,} (a ceiling)"
        )
        self.notes.setdefault(role, f"output {how}")
        return float(bound)

    def calls(self, prompt: str) -> list[list[_Share]]:
        """The calls one question makes, each as the roles that share it; at most
        ``--max-calls`` of them.  Refuses a strategy that cannot say what it will call:
        an estimate of nothing would read as a run that costs nothing."""
        strategy = self.strategy
        plan = strategy.planned_calls(prompt, workflow_steps=self.assumed.workflow_steps)
        if plan is None:
            raise UsageError(
                f"--estimate: --strategy {printable(strategy.name)} cannot say before it "
                "runs which calls it will make, so there is nothing to assume its cost "
                "from; run a pilot (--pilot N), whose records the rest is measured on"
            )
        calls = [[self._share(share) for share in call.shares] for call in plan.calls]
        cap = self.settings.max_calls
        return calls[:cap] if cap is not None else calls

    def _share(self, share: PlannedShare) -> _Share:
        """A planned share in tokens: its request as built, the subtasks the Conductor
        writes for it and the earlier replies it sees, each as long as its writer's
        ``max_tokens`` allows (the mean over the workers that may write it)."""
        self.bases.setdefault(share.role, share.basis)
        output = self.output(share.role, share.target)
        inp = self.tokens(share.messages, share.target)
        inp += share.subtasks * self.assumed.subtask_tokens
        for seen in share.replies:
            lengths = [self.output(w.id, w) for w in seen.writers]
            inp += seen.count * (sum(lengths) / len(lengths))
        return _Share(share.role, share.weight, inp, output)

    def roles(self, pending: Sequence[str]) -> dict[str, tuple[float, float, float, str]]:
        """Each role's expected (calls, input, output) over the ``pending`` prompts."""
        totals: dict[str, list[float]] = {}
        made: dict[str, list[list[_Share]]] = {}
        for prompt in pending:
            calls = made.get(prompt)
            if calls is None:
                calls = made[prompt] = self.calls(prompt)
            for shares in calls:
                for share in shares:
                    t = totals.setdefault(share.role, [0.0, 0.0, 0.0])
                    t[0] += share.weight
                    t[1] += share.weight * share.input_tokens
                    t[2] += share.weight * share.output_tokens
        n = max(1, len(pending))
        out = {}
        for role, (count, inp, output) in totals.items():
            how = self.bases[role].replace("{calls}", _a_question(count / n))
            out[role] = (count, inp, output, f"{how}; {self.notes.get(role, '')}".rstrip("; "))
        return out


def _a_question(calls: float) -> str:
    """``1 call a question``, ``1.5 calls a question``."""
    shown = f"{calls:.0f}" if abs(calls - round(calls)) < 0.005 else f"{calls:.2f}"
    return f"{shown} {'call' if shown == '1' else 'calls'} a question"


def _assumption_lines(
    assumed: Assumptions, conductor: bool, settings: RunSettings
) -> tuple[str, ...]:
    """The assumptions an assumed estimate rests on, in words."""
    rounds = settings.rounds
    lines = [
        f"text: {assumed.chars_per_token:g} characters a token (OpenAI's rule of thumb)",
        "replies: as long as max_tokens allows (a ceiling: most replies are shorter)",
    ]
    if conductor:
        lines += [
            f"workflows: {assumed.workflow_steps} steps (the paper's average), any worker "
            "alike, each step seeing the ones before it",
            f"subtasks: {assumed.subtask_tokens} tokens each",
        ]
        if rounds > 1:
            lines.append(
                f"rounds: each of the {rounds} runs a workflow (a ceiling: a revision "
                "round may keep the answer)"
            )
    if settings.budget_usd is not None:
        lines.append(
            f"--budget-usd {settings.budget_usd:g} a question is not applied: a question "
            "that reaches it stops sooner than the figure has it"
        )
    return tuple(lines)


# -- the estimate -----------------------------------------------------------------------


def estimate_run(request: BenchRequest, assumed: Assumptions = ASSUMED) -> RunEstimate:
    """The expected spend of the run ``request`` asks for, without calling a model or
    writing anything (see the module's docstring).

    Raises :class:`~conductor.errors.UsageError` where the run itself would refuse to
    start: another run's records in its directory, or a resume that does not continue
    the run there.
    """
    from ..llm.batcher import batched
    from ..llm.caller import CallerSet
    from ..llm.cost import cost_usd, price_for
    from ..llm.types import Usage
    from .session import bench_options, build_strategy

    strategy, options = build_strategy(request, CallerSet(None), bench_options(request))
    # Each role's target, in the order a table lists them.
    targets = dict(strategy.call_roles)
    found = _Measurements(targets)
    pairs = _pairs_left(request, strategy, options, found)
    from_cache = len(found.records)
    spent = 0.0
    for record in _run_records(request):
        found.add(record)
        spent += record.totals.cost_usd or 0.0
    cpt, calibrated = found.chars_per_token(assumed)
    measured = len(found.records)
    conductor = CONDUCTOR_ROLE in targets
    if measured:
        figures = _measured_roles(found, pairs.pending, cpt, list(targets))
        source = _measured_source(measured - from_cache, from_cache)
        assumptions: tuple[str, ...] = ()
    else:
        figures = _Assumed(strategy, request.settings, assumed).roles(pairs.pending)
        source = "assumed: nothing of this run has been measured yet"
        assumptions = _assumption_lines(assumed, conductor, request.settings)
    if found.unanswered:
        source += (
            f" ({plural(found.unanswered, 'record')} of this run left out: none of "
            "its calls was answered)"
        )
    flag = bool(request.invocation.batch)
    roles = []
    for role, target in targets.items():
        if role not in figures:
            continue
        calls, inp, out, basis = figures[role]
        usage = Usage(input_tokens=round(inp), output_tokens=round(out))
        price = price_for(target)
        live = cost_usd(usage, price)
        can_batch = batched(target, True)
        roles.append(
            RoleEstimate(
                role=role,
                model=target.model,
                calls=calls,
                input_tokens=inp,
                output_tokens=out,
                usd=live,
                batch_usd=cost_usd(usage, price, batch=True) if can_batch else live,
                batched=batched(target, flag),
                basis=basis,
            )
        )
    return RunEstimate(
        benchmark=request.spec.name,
        strategy=request.strategy,
        run_dir=request.run_dir,
        total=pairs.total,
        recorded=pairs.recorded,
        replayed=pairs.replayed,
        pairs=len(pairs.pending),
        roles=tuple(roles),
        measured=measured,
        source=source,
        chars_per_token=cpt,
        calibrated=calibrated,
        assumptions=assumptions,
        batch=flag,
        max_usd=request.invocation.max_usd,
        spent_usd=spent,
    )


def _measured_source(from_run: int, from_cache: int) -> str:
    parts = []
    if from_run:
        parts.append(f"{from_run} in the run being continued")
    if from_cache:
        parts.append(f"{from_cache} the sample cache holds")
    total = plural(from_run + from_cache, "record")
    return f"measured on {total} of this run ({', '.join(parts)})"


def without_pilot(request: BenchRequest) -> BenchRequest:
    """``request`` as its continuation after a pilot: a resume of the same directory,
    every pair left (what ``conductor bench --resume DIR`` runs)."""
    return dataclasses.replace(
        request, resume=True, overwrite=False, retry_errors=False, max_pairs=None
    )
