"""Scores of bench runs: :class:`RunSummary`, computed from a run directory and kept in
``summary.json``; the rate-limit history in ``rate_limits.json``.

:func:`summarize_run` reads ``DIR/samples.jsonl`` as a stream: it never holds the run's
records, only running sums, one score per sample and one latency per record, so a
10,000-sample run stays small in memory.  A (sample, epoch) recorded twice counts once,
its *last* line (merged shards, or a record appended by hand): the file is read
once where no pair is recorded twice (most runs), and where one is, read again to fold in
only the lines that hold each pair's last record.  A bench builds the same summary as it
writes the records (:class:`SummaryBuilder`), without reading them back.
A line that is not JSON (a run killed mid-write leaves a truncated last line) is skipped
with a warning and counted.

Units: ``accuracy``, ``stderr`` and the per-epoch accuracies are percentages; every
``*_rate`` and ``*_share`` is a fraction in [0, 1]; latencies are seconds; costs USD.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import RecordError, UsageError
from ..private import write_private
from ..record import RunRecord, now_iso
from ..redact import masked_json
from ..shapes import topology_kind
from ..userfiles import (
    MAX_CONFIG_BYTES,
    UnreadableFileError,
    file_kind,
    parse_json,
    read_regular,
    utf8_text,
)
from .config import BenchmarkInfo, read_run_config
from .rundir import (
    CONFIG,
    RATE_LIMITS,
    SAMPLES,
    SUMMARY,
    SampleLines,
    numbered_records,
    record_of,
    sample_key,
)

log = logging.getLogger("conductor")

#: Verdict statuses, then ``run_failed`` for records that never reached the grader.
STATUSES: tuple[str, ...] = (
    "correct",
    "incorrect",
    "no_answer",
    "grader_error",
    "time_limit",
    "run_failed",
)

#: How many invocations (a run and its resumes) ``rate_limits.json`` keeps, newest last.
MAX_LIMIT_INVOCATIONS = 10


@dataclass
class RunSummary:
    """The scores and costs of one bench run (what ``summary.json`` holds)."""

    run_dir: str
    benchmark: str
    paper_key: str | None
    strategy: str
    pool_name: str
    label: str
    #: The run's benchmark is the set the paper measured ``paper_key`` on (see
    #: :func:`conductor.bench.paper.paper_reference`); False in older summaries.
    paper_set: bool = False
    n_samples: int = 0
    n_records: int = 0
    epochs: int = 0
    accuracy: float | None = None
    stderr: float | None = None
    epoch_accuracy: dict[int, float] = field(default_factory=dict)
    epoch_min: float | None = None
    epoch_max: float | None = None
    epoch_sd: float | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    no_answer_rate: float | None = None
    conductor_tries: int = 0
    conductor_parse_errors: int = 0
    parse_failure_rate: float | None = None
    no_workflow_records: int = 0
    no_workflow_rate: float | None = None
    cost_per_question: float | None = None
    unknown_cost_calls: int = 0
    unknown_cost_records: int = 0
    cost_is_lower_bound: bool = False
    #: The run's whole recorded cost; with calls answered through a provider's batch
    #: API (``batch_calls``), what the same records would have cost had every call been
    #: live (``None`` without batch calls, or with a price unknown).
    cost_usd: float | None = None
    batch_calls: int = 0
    live_cost_usd: float | None = None
    input_tokens_per_question: float | None = None
    output_tokens_per_question: float | None = None
    calls_per_question: float | None = None
    steps_per_question: float | None = None
    rounds_per_question: float | None = None
    #: Seconds per question, what it took to answer (its wall time less the time its
    #: calls waited for a concurrency slot or a busy model), and that waiting.
    latency_p50: float | None = None
    latency_p95: float | None = None
    queue_p50: float | None = None
    queue_p95: float | None = None
    cached_share: float | None = None
    #: Calls whose reply was cut off at the token limit (finish_reason length).
    truncated_calls: int = 0
    worker_usage: dict[str, dict[int, int]] = field(default_factory=dict)
    worker_order: list[str] = field(default_factory=list)
    topology_counts: dict[str, int] = field(default_factory=dict)
    skipped_lines: int = 0
    seed: int | None = None
    limit: int | None = None
    shard: list[int] | None = None
    created_at: str | None = None
    conductor_version: str | None = None
    rate_limits: list[dict[str, Any]] = field(default_factory=list)
    #: How many of the benchmark's samples (of this shard, within ``limit``) the
    #: Conductor checkpoint was trained on; None when it records no training questions.
    trained_on_samples: int | None = None
    #: Whether those samples were left out of the run (``--exclude-trained``).
    trained_excluded: bool = False
    #: Whether training did not compare its questions with some held-out set
    #: (``accept_unchecked_holdout``): the trained-on count may then be too low.
    trained_unchecked: bool = False
    #: The grader and the options the benchmark gave it (``grader_options``), as the run
    #: recorded them: a grader told to depart from the official checker (a tolerance,
    #: say) says so here and in ``conductor report``.
    grader: str | None = None
    grader_options: dict[str, Any] = field(default_factory=dict)
    #: Records graded by running code, per sandbox engine that ran it (``bubblewrap``,
    #: ``namespaces``, ``none``; see :mod:`conductor.sandbox`).
    sandbox_engines: dict[str, int] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        """Records that failed to run, plus grader failures."""
        return self.status_counts.get("run_failed", 0) + self.status_counts.get("grader_error", 0)


# --------------------------------------------------------------------------- reading


def _check_dir(run_dir: Path) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "no such directory"
        with contextlib.suppress(OSError, ValueError):
            if os.path.lexists(run_dir) and not os.path.exists(run_dir):
                what = "a symbolic link that loops or leads nowhere"
            else:
                what = f"{file_kind(os.stat(run_dir).st_mode)}, not a directory"
        raise UsageError(f"{run_dir}: not a bench run directory ({what})")
    config, samples = run_dir / CONFIG, run_dir / SAMPLES
    for p in (config, samples):
        if not os.path.lexists(p):  # what is there, its reader checks and names
            raise UsageError(f"{run_dir}: not a bench run directory (no {p.name})")
    return config, samples


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of already sorted values by linear interpolation between
    closest ranks (numpy's default method); None for no values."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _sample_sd(values: list[float]) -> float | None:
    """The sample standard deviation (n - 1); ``None`` below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def ratio(num: float, den: float) -> float | None:
    """``num / den``, or ``None`` (not a made-up 0) when there is nothing to divide by."""
    return num / den if den else None


@dataclass
class _Acc:
    """Running sums over the records of one run."""

    n: int = 0
    score: float = 0.0
    per_sample: dict[str, list[float]] = field(default_factory=dict)
    per_epoch: dict[int, list[float]] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    tries: int = 0
    parse_errors: int = 0
    no_workflow: int = 0
    cost: float = 0.0
    cost_known: int = 0
    unknown_cost_calls: int = 0
    unknown_cost_records: int = 0
    batch_calls: int = 0
    live_cost: float | None = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    calls: int = 0
    cached: int = 0
    truncated: int = 0
    steps: int = 0
    rounds: int = 0
    walls: list[float] = field(default_factory=list)
    queues: list[float] = field(default_factory=list)
    usage: dict[str, dict[int, int]] = field(default_factory=dict)
    topologies: dict[str, int] = field(default_factory=dict)
    engines: dict[str, int] = field(default_factory=dict)

    def add(self, rec: RunRecord, number: int) -> None:
        self.n += 1
        grade = rec.grade
        status = rec.verdict
        score = 0.0 if grade is None else float(grade.get("score") or 0.0)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.score += score
        sample = rec.sample_id if rec.sample_id is not None else f"line {number}"
        s = self.per_sample.setdefault(sample, [0.0, 0.0])
        s[0] += score
        s[1] += 1
        e = self.per_epoch.setdefault(rec.epoch or 0, [0.0, 0.0])
        e[0] += score
        e[1] += 1
        detail = grade.get("detail") if isinstance(grade, dict) else None
        engine = detail.get("sandbox") if isinstance(detail, dict) else None
        if isinstance(engine, str):
            self.engines[engine[:40]] = self.engines.get(engine[:40], 0) + 1

        produced = False
        for rnd in rec.rounds:
            self.tries += len(rnd.conductor_calls)
            self.parse_errors += len(rnd.parse_errors)
            produced = produced or rnd.workflow is not None
            for st in rnd.steps:
                if st.status != "skipped":
                    self.steps += 1
                per_pos = self.usage.setdefault(st.worker_id, {})
                per_pos[st.index] = per_pos.get(st.index, 0) + 1
        if not produced:
            self.no_workflow += 1
        self.rounds += len(rec.rounds)
        kind = topology_kind(rec.rounds[0]) if rec.rounds else "no rounds"
        self.topologies[kind] = self.topologies.get(kind, 0) + 1

        t = rec.totals
        if t.cost_usd is None:
            self.unknown_cost_records += 1
        else:
            self.cost += t.cost_usd
            self.cost_known += 1
        self.unknown_cost_calls += t.unknown_cost_calls
        self.batch_calls += t.batch_calls
        live = t.live_cost_usd if t.batch_calls else t.cost_usd
        self.live_cost = None if self.live_cost is None or live is None else self.live_cost + live
        self.tokens_in += t.input_tokens
        self.tokens_out += t.output_tokens
        self.calls += t.calls
        self.cached += t.cached_calls
        self.truncated += sum(1 for call in rec.all_calls() if call.truncated)
        self.walls.append(float(t.answer_s))
        self.queues.append(float(t.queue_s))


def _worker_order(pool: Mapping[str, Any], usage: dict[str, dict[int, int]]) -> list[str]:
    """Pool order first (the order the Conductor sees), then any other worker seen."""
    ids = [str(w.get("id")) for w in pool.get("workers") or [] if isinstance(w, dict)]
    return [i for i in ids if i in usage] + sorted(set(usage) - set(ids))


def _label(benchmark: str, strategy: str, pool_name: str) -> str:
    return f"{benchmark} · {strategy} · {pool_name}"


def _fold_lines(lines: SampleLines) -> _Acc:
    """The sums over the last record of each (sample, epoch) of ``lines``.

    One pass folds every line in while no pair has come twice; a pair that does (rare:
    merged shards, a record appended by hand) makes the sums start again in a
    second pass over only the lines holding each pair's last record (the first pass has
    found them).  A line that is JSON but not a run record is an error only where it is
    its pair's last (as when only those lines are read): the pass goes on to see whether
    a later line replaces it.
    """
    acc = _Acc()
    last: dict[tuple[str, int], int] = {}
    replaced = False
    failed: RecordError | None = None
    for number, data in lines:
        key = sample_key(data, number)
        replaced = replaced or key in last
        last[key] = number
        if replaced or failed is not None:
            continue  # the sums are read again (or the run refused): only the keys matter
        try:
            rec = record_of(lines.path, number, data)
        except RecordError as exc:
            failed = exc
            continue
        acc.add(rec, number)
    if not replaced:
        if failed is not None:
            raise failed
        return acc
    acc = _Acc()
    for number, rec in numbered_records(lines, set(last.values())):
        acc.add(rec, number)
    return acc


def summarize_run(
    run_dir: Path,
    *,
    records: Iterable[tuple[int, RunRecord]] | None = None,
    lines: SampleLines | None = None,
) -> RunSummary:
    """Summarise the bench run in ``run_dir`` by streaming its ``samples.jsonl``.

    ``records`` (with the ``lines`` they are read from): the run's records already being
    read by a caller that needs them too (``conductor view`` reads each record once for
    its page and its scores), ``(line number, record)`` of the last record of each
    (sample, epoch) in file order; ``lines.skipped`` is read once they are exhausted.

    Raises :class:`~conductor.errors.UsageError` when the directory lacks
    ``config.json`` or ``samples.jsonl``, and :class:`~conductor.errors.RecordError`
    (naming the file and line) for a line that is JSON but not a run record.
    """
    run_dir = Path(run_dir)
    _config_path, samples_path = _check_dir(run_dir)
    if records is None or lines is None:
        if records is not None or lines is not None:
            raise ValueError("summarize_run: give records and lines together, or neither")
        lines = SampleLines(samples_path)
        acc = _fold_lines(lines)
    else:
        acc = _Acc()
        for number, rec in records:
            acc.add(rec, number)
    return _summary(run_dir, acc, lines.skipped)


class SummaryBuilder:
    """A run's summary kept as its records are written, so that a bench that has just
    written 100,000 records need not read them back to score them.

    :meth:`read_existing` folds in what ``samples.jsonl`` already holds (the last line
    of each (sample, epoch), as :func:`summarize_run` reads it); every record appended
    after it is given to :meth:`add`.  The file must then hold no other line: the
    runner appends only pairs it did not find there (``--retry-errors`` first removes
    the records it runs again), so no record added replaces an earlier one.
    :attr:`covers_file` says whether the builder was started that way; one that was not
    (a run stopped before it read the file) is no summary of it.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.covers_file = False
        self._acc = _Acc()
        self._skipped = 0
        self._lines = 0

    def read_existing(self) -> None:
        """Fold in the records ``samples.jsonl`` holds now (none if it is missing)."""
        lines = SampleLines(self.run_dir / SAMPLES)
        self._acc = _fold_lines(lines)
        self._skipped = lines.skipped
        self._lines = lines.last_line
        self.covers_file = True

    def add(self, record: RunRecord) -> None:
        """Fold in ``record``, just appended to ``samples.jsonl`` as its next line."""
        self._lines += 1
        self._acc.add(record, self._lines)

    @property
    def cost_usd(self) -> float:
        """What the records folded in cost (a record of unknown cost counts nothing)."""
        return self._acc.cost

    def summary(self) -> RunSummary:
        """The run's summary: the records folded in, with its ``config.json`` and
        ``rate_limits.json`` as they are now."""
        return _summary(self.run_dir, self._acc, self._skipped)

    def write(self) -> RunSummary:
        """Write :meth:`summary` to ``summary.json`` (atomically) and return it."""
        summary = self.summary()
        _write_summary_file(self.run_dir, summary)
        return summary


def _summary(run_dir: Path, acc: _Acc, skipped: int) -> RunSummary:
    """The :class:`RunSummary` of the records folded into ``acc``."""
    config = read_run_config(run_dir)
    bench = config.benchmark
    pool = config.pool or {}
    benchmark = bench.name or run_dir.name
    strategy = config.strategy or "conductor"
    pool_name = str(pool.get("name") or "?")
    n = acc.n

    sample_means = [s / k for s, k in acc.per_sample.values()]
    sd = _sample_sd(sample_means)
    epoch_acc = {e: 100.0 * s / k for e, (s, k) in sorted(acc.per_epoch.items())}
    epoch_values = list(epoch_acc.values())
    walls = sorted(acc.walls)
    queues = sorted(acc.queues)
    no_conductor = acc.tries == 0
    trained = config.trained_on

    return RunSummary(
        run_dir=str(run_dir),
        benchmark=benchmark,
        paper_key=bench.paper_key,
        paper_set=bench.paper_set,
        strategy=strategy,
        pool_name=pool_name,
        label=_label(benchmark, strategy, pool_name),
        n_samples=len(acc.per_sample),
        n_records=n,
        epochs=config.epochs or len(acc.per_epoch),
        accuracy=ratio(100.0 * acc.score, n),
        stderr=100.0 * sd / math.sqrt(len(sample_means)) if sd is not None else None,
        epoch_accuracy=epoch_acc,
        epoch_min=min(epoch_values) if epoch_values else None,
        epoch_max=max(epoch_values) if epoch_values else None,
        epoch_sd=_sample_sd(epoch_values),
        status_counts=acc.statuses,
        no_answer_rate=ratio(acc.statuses["no_answer"], n),
        conductor_tries=acc.tries,
        conductor_parse_errors=acc.parse_errors,
        parse_failure_rate=ratio(acc.parse_errors, acc.tries),
        # Without any Conductor call (fixed strategies) "no workflow" means nothing.
        no_workflow_records=0 if no_conductor else acc.no_workflow,
        no_workflow_rate=None if no_conductor else ratio(acc.no_workflow, n),
        cost_per_question=ratio(acc.cost, n) if acc.cost_known else None,
        unknown_cost_calls=acc.unknown_cost_calls,
        unknown_cost_records=acc.unknown_cost_records,
        cost_is_lower_bound=bool(acc.unknown_cost_calls or acc.unknown_cost_records),
        cost_usd=round(acc.cost, 8) if acc.cost_known else None,
        batch_calls=acc.batch_calls,
        live_cost_usd=(
            round(acc.live_cost, 8) if acc.batch_calls and acc.live_cost is not None else None
        ),
        input_tokens_per_question=ratio(acc.tokens_in, n),
        output_tokens_per_question=ratio(acc.tokens_out, n),
        calls_per_question=ratio(acc.calls, n),
        steps_per_question=ratio(acc.steps, n),
        rounds_per_question=ratio(acc.rounds, n),
        latency_p50=percentile(walls, 0.5),
        latency_p95=percentile(walls, 0.95),
        queue_p50=percentile(queues, 0.5),
        queue_p95=percentile(queues, 0.95),
        cached_share=ratio(acc.cached, acc.calls),
        truncated_calls=acc.truncated,
        worker_usage={w: dict(sorted(p.items())) for w, p in acc.usage.items()},
        worker_order=_worker_order(pool, acc.usage),
        topology_counts=dict(sorted(acc.topologies.items(), key=lambda kv: (-kv[1], kv[0]))),
        skipped_lines=skipped,
        seed=config.seed,
        limit=config.limit,
        shard=list(config.shard) if config.shard is not None else None,
        created_at=config.created_at,
        conductor_version=config.conductor_version,
        rate_limits=_read_rate_limits(run_dir / RATE_LIMITS),
        trained_on_samples=trained.samples if trained is not None else None,
        trained_excluded=bool(config.exclude_trained),
        trained_unchecked=bool(trained is not None and trained.unchecked_holdout),
        grader=_grader_name(bench),
        grader_options=_grader_options(bench),
        sandbox_engines=dict(sorted(acc.engines.items())),
    )


def _grader_options(bench: BenchmarkInfo) -> dict[str, Any]:
    """The options the grader ran with where they depart from the official checker: the
    benchmark's ``grader_options`` and how it read answers (``grader_extraction``, which
    a run records even where the file left the default) unless that is ``official``."""
    found = dict(bench.grader_options or {})
    extraction = bench.grader_extraction
    # The reference harness's reading is the default, shown only where a run departs.
    if extraction and extraction != "official" and "extraction" not in found:
        found["extraction"] = extraction
    return found


def _grader_name(bench: BenchmarkInfo) -> str | None:
    """``code v3``: the grader and its version as the run's config names them."""
    name, version = bench.grader, bench.grader_version
    if not name:
        return None
    return f"{name} v{version}" if version is not None else str(name)


# --------------------------------------------------------------------------- summary.json


def summary_to_dict(summary: RunSummary) -> dict[str, Any]:
    """A JSON-ready dict of ``summary`` (integer keys become strings)."""
    data = asdict(summary)
    data["epoch_accuracy"] = {str(k): v for k, v in summary.epoch_accuracy.items()}
    data["worker_usage"] = {
        w: {str(k): v for k, v in pos.items()} for w, pos in summary.worker_usage.items()
    }
    return data


def summary_from_dict(data: dict[str, Any]) -> RunSummary:
    """Rebuild a :class:`RunSummary` from :func:`summary_to_dict`'s output."""
    names = {f.name for f in fields(RunSummary)}
    kw = {k: v for k, v in data.items() if k in names}
    try:
        kw["epoch_accuracy"] = {int(k): v for k, v in kw.get("epoch_accuracy", {}).items()}
        kw["worker_usage"] = {
            w: {int(k): v for k, v in pos.items()} for w, pos in kw.get("worker_usage", {}).items()
        }
        return RunSummary(**kw)
    except (TypeError, ValueError, AttributeError) as exc:
        raise RecordError(f"summary is malformed: {exc}") from None


def write_summary(run_dir: Path) -> RunSummary:
    """Summarise ``run_dir`` and write ``run_dir/summary.json`` (atomically: other
    processes of the run, ``bench --state``, may write it at the same moment, each
    through a temporary file of its own, so the file left is one whole summary)."""
    summary = summarize_run(run_dir)
    _write_summary_file(run_dir, summary)
    return summary


def _write_summary_file(run_dir: Path, summary: RunSummary) -> None:
    target = Path(run_dir) / SUMMARY
    write_private(
        target, masked_json(summary_to_dict(summary), indent=2, ensure_ascii=False) + "\n"
    )


def _read_rate_limits(path: Path) -> list[dict[str, Any]]:
    """The invocations kept in ``rate_limits.json`` (none if absent or unreadable)."""
    if not os.path.lexists(path):
        return []
    try:
        text = utf8_text(read_regular(path, "limits file", MAX_CONFIG_BYTES), path, "limits file")
        data = parse_json(text, path)
    except UnreadableFileError as exc:
        log.warning("%s: ignored (%s)", path, exc)
        return []
    runs = data.get("invocations") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        log.warning("%s: ignored (no invocations list)", path)
        return []
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("providers"), dict)]


def record_rate_limits(run_dir: Path, providers: dict[str, dict[str, Any]]) -> bool:
    """Add one invocation's limit history per provider key to ``rate_limits.json``.

    ``providers`` is :meth:`conductor.llm.limiter.ProviderLimits.history`.  The file
    keeps the newest :data:`MAX_LIMIT_INVOCATIONS` invocations and is replaced
    atomically.  The history is a diagnostic: a directory that cannot be written is
    logged and skipped (returns ``False``) rather than hiding the run's own outcome.
    """
    if not providers:
        return False
    path = Path(run_dir) / RATE_LIMITS
    runs = _read_rate_limits(path)
    runs.append({"recorded_at": now_iso(), "providers": providers})
    data = {"schema_version": 1, "invocations": runs[-MAX_LIMIT_INVOCATIONS:]}
    try:
        # A provider's label is its redacted URL: a secret in its path is masked here.
        write_private(path, masked_json(data, indent=1, ensure_ascii=False) + "\n")
    except OSError as exc:
        log.warning("%s: rate-limit history not written (%s)", path, exc)
        return False
    return True


def saved_summary(run_dir: Path) -> RunSummary | None:
    """The run's ``summary.json`` when written after every file it is made from (a
    finished run leaves one); ``None`` when it is missing, unreadable or stale."""
    run_dir = Path(run_dir)
    saved = run_dir / SUMMARY
    try:
        made_at = saved.stat().st_mtime
        sources = [run_dir / SAMPLES, run_dir / CONFIG, run_dir / RATE_LIMITS]
        if all(not p.exists() or p.stat().st_mtime <= made_at for p in sources):
            return read_summary(saved)
    except (OSError, UsageError, RecordError):
        pass  # missing, unreadable or stale: summarise again
    return None


def current_summary(run_dir: Path) -> RunSummary:
    """The run's scores: :func:`saved_summary` (reading it takes milliseconds where
    summarising 100,000 records takes seconds), else :func:`summarize_run`."""
    saved = saved_summary(run_dir)
    return saved if saved is not None else summarize_run(run_dir)


def read_summary(path: Path) -> RunSummary:
    """Read ``summary.json`` (``path`` is the file or the run directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / SUMMARY
    try:
        text = utf8_text(read_regular(p, "summary", MAX_CONFIG_BYTES), p, "summary")
        data = parse_json(text, p)
    except UnreadableFileError as exc:
        raise RecordError(str(exc)) from None
    if not isinstance(data, dict):
        raise RecordError(f"{p}: not a run summary")
    try:
        return summary_from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{p}: {exc}") from None


# --------------------------------------------------------------------------- choosing


def falls_short(summary: RunSummary, fail_under: float) -> bool:
    """Whether the run's accuracy (in percent) is below ``fail_under`` percent; a run
    with no records has no accuracy, and falls short (a CI gate must not pass on a
    run that graded nothing)."""
    return summary.accuracy is None or summary.accuracy < fail_under


def best_single(summaries: list[RunSummary]) -> RunSummary | None:
    """The most accurate ``single:*`` run (ties: the cheaper, then the first given).

    This is the report-only ``oracle-best`` strategy: pass the runs of one benchmark.
    """
    singles = [s for s in summaries if s.strategy.startswith("single:") and s.accuracy is not None]
    if not singles:
        return None

    def key(item: tuple[int, RunSummary]) -> tuple[float, float, int]:
        i, s = item
        cost = s.cost_per_question if s.cost_per_question is not None else math.inf
        return (-(s.accuracy or 0.0), cost, i)

    return min(enumerate(singles), key=key)[1]
