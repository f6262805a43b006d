"""What ``conductor view`` reads: runs, turned into compact, typed view data.

A RUN is one of:

- an ``ask`` record (``run.json``): one run of one question;
- a bench run directory (``config.json`` + ``samples.jsonl``), or a ``singles`` run,
  whose ``single-WORKER`` directories are one run each (:func:`conductor.runs.rundir.run_dirs`);
- a ``serve`` records directory (a ``samples.jsonl`` without ``config.json``), one run
  per served model (``conductor``, ``single:W``, ``moa``, ...: the strategy each record
  names), since one server answers for all of them in one records file.

A bench run's overview numbers come from :mod:`conductor.runs.summary`
(:func:`~conductor.runs.summary.current_summary`: its ``summary.json`` when fresh), the
one place scores are computed; this module adds the intervals (``runs.stats``) and
the per-sample rows the page lists.  Records without a bench directory (``ask`` and
``serve``) carry no ``config.json`` to summarise: their few numbers (cost, tokens,
calls, latency) are added up here from the records' own totals.

Records are streamed (a bench run's file is read at most twice: once for which line
holds each (sample, epoch) and the prompts' common text, where the run's summary.json
does not already say no line is replaced and the records keep their questions apart,
then for the samples, each record built once for its row, its details and, without a
fresh summary.json, the run's scores, :func:`~conductor.runs.summary.summarize_run`
folding in the records of the same pass); each sample keeps a
short row for the page's list (:class:`ViewSample`) while its details
(:class:`SampleDetail`: workflow, calls, texts, clipped; ``conductor trace`` shows a
record whole) go straight to the runs' :class:`~conductor.view.companion.DetailSpool`, so
a run of 100,000 samples holds 100,000 rows, not 100,000 records.

A bench record's question is its prompt: the benchmark's template filled in.  The list
shows the question itself, which the bench runner keeps in ``sample_question``;
for records written before it did, the text every prompt of the run starts and ends with
(the template's, cut at line breaks) is taken off instead (:class:`_Boilerplate`).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RecordError, UsageError
from ..record import MAX_RECORD_BYTES, RunRecord, raw_field, read_record
from ..runs.oracle import unit_score
from ..runs.rundir import (
    CONFIG,
    SAMPLES,
    SampleLines,
    iter_records,
    numbered_records,
    run_dirs,
    sample_key,
)
from ..shapes import topology_kind
from ..userfiles import bounded_lines, is_regular, open_regular
from .companion import DetailSpool

if TYPE_CHECKING:
    from ..runs.summary import RunSummary

__all__ = [
    "MAX_TEXT",
    "PREVIEW",
    "Comparison",
    "RunOverview",
    "SampleDetail",
    "StepView",
    "ViewRun",
    "ViewSample",
    "compare_runs",
    "load_runs",
    "own_question",
    "strategy_of",
]

#: The longest text (a message, a response, a reply) the page holds; the rest is cut.
MAX_TEXT = 4000
#: The longest question or answer a row of the list holds (the details hold the rest).
PREVIEW = 200


def clip(text: str | None, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… ({len(text) - limit} more characters; conductor trace shows all)"


@dataclass
class StepView:
    """One step of a sample's workflow, as the page shows it."""

    #: The round's position from 1, as ``conductor trace`` and the graph number rounds
    #: (a record's own round index starts at 0).
    round: int
    #: The step's number in its round's lists, from 0, as everywhere else.
    index: int
    worker: str
    subtask: str
    status: str
    sees: list[int]
    messages: list[tuple[str, str]]
    response: str
    error: str | None


@dataclass
class ViewSample:
    """One record of a run: a row of the sample list (its details are spooled apart)."""

    key: str
    sample_id: str
    epoch: int
    #: The question itself (a bench record's own question, not the prompt around it),
    #: cut to :data:`PREVIEW` characters.
    question: str
    verdict: str
    #: The answer, cut to :data:`PREVIEW` characters.
    answer: str
    workers: list[str]
    steps: int
    kind: str
    cost: float | None
    disagree: bool = False
    #: The grade's score as the per-question oracle counts it
    #: (:func:`conductor.runs.oracle.unit_score`).
    score: float = 0.0

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"


@dataclass
class SampleDetail:
    """What a sample's page shows besides its row: read when the sample is opened."""

    #: The question itself, clipped at :data:`MAX_TEXT`.
    question: str
    answer: str
    gold: str
    why: str
    subtasks: list[str]
    svg: str
    #: The Conductor's last reply of each round that had one: (the round's position
    #: from 1, the reply).
    replies: list[tuple[int, str]]
    parse_errors: list[str]
    step_views: list[StepView]
    #: The prompt the run was given, where it is more than ``question`` (a benchmark's
    #: template filled in); ``""`` where the question was the prompt.
    prompt: str = ""
    error: str | None = None

    def search_text(self) -> str:
        """What the list's search looks in: the question, subtasks and answer."""
        return "\n".join([self.question, *self.subtasks, self.answer])


@dataclass
class RunOverview:
    """A run's row in the overview (accuracy and rates are fractions in [0, 1])."""

    samples: int
    accuracy: float | None
    acc_lo: float | None
    acc_hi: float | None
    cost: float | None
    cost_lo: float | None
    cost_hi: float | None
    cost_is_lower_bound: bool
    tokens: float | None
    calls: float | None
    latency_p50: float | None
    latency_p95: float | None
    queue_p50: float | None
    parse_failure_rate: float | None
    worker_usage: dict[str, dict[int, int]]
    worker_order: list[str]
    topology_counts: dict[str, int]


@dataclass
class ViewRun:
    """One run given to ``conductor view``."""

    label: str
    kind: str  # "ask", "bench" or "serve"
    path: str
    benchmark: str
    strategy: str
    pool: str
    conductor: str
    overview: RunOverview
    samples: list[ViewSample] = field(default_factory=list)
    #: Where the samples' details went, in page order (shared by the runs of one page).
    details: DetailSpool = field(default_factory=DetailSpool)

    @property
    def is_single(self) -> bool:
        return self.strategy.startswith("single:")


@dataclass
class Comparison:
    """Two runs on the questions both hold (a question: a (sample id, epoch))."""

    a: int
    b: int
    n: int
    both_right: int
    only_a: int
    only_b: int
    both_wrong: int
    p_value: float
    diff: float
    diff_lo: float
    diff_hi: float


# --------------------------------------------------------------------------- one record


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _message_text(content: Any) -> str:
    """A chat message's content as text (a list of parts is joined)."""
    if isinstance(content, list):
        return "\n".join(_text(p.get("text")) if isinstance(p, dict) else _text(p) for p in content)
    return _text(content)


def own_question(record: RunRecord) -> str | None:
    """The question a bench record was asked, apart from the benchmark's prompt
    template (``None``: the record does not keep it, and its question is its prompt)."""
    return _own_question(record.sample_question)


def _own_question(question: Any) -> str | None:
    return question if isinstance(question, str) and question.strip() else None


def strategy_of(record: RunRecord) -> str:
    """The strategy that answered ``record``: the one it names (bench and ``serve``
    records), else a baseline's own (``conductor ask --strategy``, and serve records
    written before they named it), else the Conductor."""
    for named in (record.strategy, record.conductor.get("strategy")):
        if isinstance(named, str) and named:
            return named
    return "conductor"


def sample_of(record: RunRecord, number: int) -> tuple[ViewSample, SampleDetail]:
    """The view of one run record, its row and its details (``number``: its place, the
    key of a record with no sample id)."""
    from .graph import workflow_svg

    steps: list[StepView] = []
    workers: list[str] = []
    subtasks: list[str] = []
    replies: list[tuple[int, str]] = []
    parse_errors: list[str] = []
    for pos, rnd in enumerate(record.rounds, 1):
        if rnd.conductor_calls:
            replies.append((pos, clip(rnd.conductor_calls[-1].response)))
        parse_errors.extend(clip(e, 500) for e in rnd.parse_errors)
        for st in rnd.steps:
            if st.worker_id not in workers:
                workers.append(st.worker_id)
            subtasks.append(clip(st.subtask, 1000))
            messages = [
                (_text(m.get("role")), clip(_message_text(m.get("content"))))
                for m in st.call.messages
                if isinstance(m, dict)
            ]
            steps.append(
                StepView(
                    round=pos,
                    index=st.index,
                    worker=st.worker_id,
                    subtask=clip(st.subtask, 1000),
                    status=st.status,
                    sees=list(st.visible_steps),
                    messages=messages,
                    response=clip(st.call.response),
                    error=st.call.error,
                )
            )
    grade = record.grade or {}
    sample_id = record.sample_id if record.sample_id is not None else record.run_id
    epoch = record.epoch or 0
    key = f"{sample_id}#{epoch}" if record.sample_id is not None else f"run {record.run_id}"
    extracted = grade.get("extracted")
    answer = clip(_text(extracted if extracted is not None else record.final_answer), 1000)
    question = own_question(record)
    detail = SampleDetail(
        question=clip(question if question is not None else record.question),
        prompt=clip(record.question) if question not in (None, record.question) else "",
        answer=answer,
        gold=clip(_text(record.gold), 1000),
        why=clip(_text(grade.get("reason")), 1000),
        subtasks=subtasks,
        svg=workflow_svg(record),
        replies=replies,
        parse_errors=parse_errors,
        step_views=steps,
        error=clip(record.error, 1000) if record.error else None,
    )
    row = ViewSample(
        key=key,
        sample_id=sample_id,
        epoch=epoch,
        question=detail.question[:PREVIEW],
        verdict=record.verdict,
        answer=answer[:PREVIEW],
        workers=workers,
        steps=sum(1 for s in steps if s.status != "skipped"),
        kind=topology_kind(record.rounds[0]) if record.rounds else "no rounds",
        cost=record.totals.cost_usd,
        score=unit_score(grade.get("score")),
    )
    return row, detail


class _Boilerplate:
    """The text every prompt of a run starts and ends with: the benchmark's template
    around the question, for records that do not keep the question apart.

    The common start is cut back to a line break and the common end forward to one,
    so a question is never cut inside a line: with the template's last line before
    the question (``Question: ${question}``) kept, two questions that begin alike
    ("What is ...") keep their words.  Fewer than two different prompts give nothing
    to take off.
    """

    def __init__(self) -> None:
        self._head: str | None = None
        self._tail = ""
        self._different = False

    def add(self, prompt: str) -> None:
        if self._head is None:
            self._head = self._tail = prompt
            return
        self._different = self._different or prompt != self._head
        self._head = os.path.commonprefix([self._head, prompt])
        self._tail = os.path.commonprefix([self._tail[::-1], prompt[::-1]])[::-1]

    def strip(self, prompt: str) -> str:
        """``prompt`` without the run's boilerplate (itself where there is none)."""
        if not self._different or self._head is None:
            return prompt
        head = self._head[: self._head.rfind("\n") + 1]
        tail = self._tail[self._tail.find("\n") :] if "\n" in self._tail else ""
        if not prompt.startswith(head):
            return prompt
        # A clipped prompt has lost the template's end: only its start comes off.
        end = len(prompt) - len(tail) if prompt.endswith(tail) else len(prompt)
        return prompt[len(head) : end].strip() or prompt


# --------------------------------------------------------------------------- one run


def _interval_of_costs(samples: Sequence[ViewSample]) -> tuple[float | None, float | None]:
    from ..runs.stats import mean_interval

    costs = [s.cost for s in samples if s.cost is not None]
    if not costs:
        return None, None
    _mean, lo, hi = mean_interval(costs)
    return lo, hi


def _accuracy_interval(samples: Sequence[ViewSample]) -> tuple[float | None, float | None]:
    from ..runs.stats import wilson_interval

    graded = [s for s in samples if s.verdict != "ungraded"]
    if not graded:
        return None, None
    return wilson_interval(sum(s.correct for s in graded), len(graded))


def _first_pass(lines: SampleLines) -> tuple[set[int], _Boilerplate]:
    """The lines holding the last record of each (sample, epoch), as
    :func:`~conductor.runs.rundir.latest_lines` finds them, and the boilerplate of the
    prompts of records that do not keep their question apart: both known before the
    samples are read, so that each one's details are final when it is spooled."""
    last: dict[tuple[str, int], int] = {}
    boilerplate = _Boilerplate()
    for number, data in lines:
        last[sample_key(data, number)] = number
        prompt = data.get("question")
        if _own_question(raw_field(data, "sample_question")) is None and isinstance(prompt, str):
            boilerplate.add(prompt)
    return set(last.values()), boilerplate


def _each_line_distinct(lines: SampleLines, summary: RunSummary) -> bool:
    """Whether no line of the run's file is replaced by a later one (every (sample,
    epoch) recorded once), read from its summary's counts: then every line is read and
    the pass that finds the last line of each pair (a second parse of a file that may
    hold a gigabyte) is not needed."""
    with open_regular(lines.path, "samples file") as fh:
        # A line over the bound counts: the reader skips it, and the summary counted it.
        written = sum(
            1 for _n, raw in bounded_lines(fh, MAX_RECORD_BYTES) if raw is None or raw.strip()
        )
    return written == summary.n_records + summary.skipped_lines


def _bench_run(run_dir: Path, spool: DetailSpool) -> ViewRun:
    from ..runs.summary import saved_summary, summarize_run

    summary = saved_summary(run_dir)
    samples: list[ViewSample] = []
    lines = SampleLines(run_dir / SAMPLES)
    if not os.path.lexists(lines.path):
        raise RecordError(f"{lines.path}: no such file")
    keep: set[int] | None = None
    boilerplate: _Boilerplate | None = None
    if summary is None or not _each_line_distinct(lines, summary):
        keep, boilerplate = _first_pass(lines)

    def read() -> Iterator[tuple[int, RunRecord]]:
        """Each record kept, in file order, made a row and spooled as it is read (and
        handed on: without a fresh summary.json, the same pass is summarised)."""
        nonlocal boilerplate
        for i, (number, record) in enumerate(numbered_records(lines, keep)):
            row, detail = sample_of(record, i)
            if own_question(record) is None:
                if boilerplate is None:
                    # Records that do not keep their question apart (older ones): the
                    # template around it is what every prompt of the run shares.
                    _keep, boilerplate = _first_pass(SampleLines(lines.path))
                question = boilerplate.strip(detail.question)
                if question != detail.question:
                    detail.prompt, detail.question = detail.question, question
                    row.question = question[:PREVIEW]
            spool.add(detail)
            samples.append(row)
            yield number, record

    if summary is None:
        # Read once for both: building each record is most of the time either takes.
        summary = summarize_run(run_dir, records=read(), lines=lines)
    else:
        for _ in read():
            pass
    lo, hi = _accuracy_interval(samples)
    cost_lo, cost_hi = _interval_of_costs(samples)
    overview = RunOverview(
        samples=summary.n_records,
        accuracy=summary.accuracy / 100.0 if summary.accuracy is not None else None,
        acc_lo=lo,
        acc_hi=hi,
        cost=summary.cost_per_question,
        cost_lo=cost_lo if summary.cost_per_question is not None else None,
        cost_hi=cost_hi if summary.cost_per_question is not None else None,
        cost_is_lower_bound=summary.cost_is_lower_bound,
        tokens=_add(summary.input_tokens_per_question, summary.output_tokens_per_question),
        calls=summary.calls_per_question,
        latency_p50=summary.latency_p50,
        latency_p95=summary.latency_p95,
        queue_p50=summary.queue_p50,
        parse_failure_rate=summary.parse_failure_rate,
        worker_usage=summary.worker_usage,
        worker_order=summary.worker_order,
        topology_counts=summary.topology_counts,
    )
    conductor = _conductor_name(next(iter(_first_records(run_dir)), None))
    return ViewRun(
        label=summary.label,
        kind="bench",
        path=str(run_dir),
        benchmark=summary.benchmark,
        strategy=summary.strategy,
        pool=summary.pool_name,
        conductor=conductor,
        overview=overview,
        samples=samples,
        details=spool,
    )


def _first_records(run_dir: Path) -> Iterable[RunRecord]:
    for record in iter_records(run_dir / SAMPLES):
        yield record
        return


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _conductor_name(record: RunRecord | None) -> str:
    if record is None or not record.rounds or not any(r.conductor_calls for r in record.rounds):
        return "—"
    target = record.conductor.get("target") or {}
    return _text(target.get("model") or target.get("id") or record.conductor.get("backend"))


def _records_run(records: list[RunRecord], kind: str, path: Path, spool: DetailSpool) -> ViewRun:
    """A run of records without a bench directory (``ask``, or one served model's
    records of a ``serve`` directory)."""
    from ..runs.stats import percentile

    samples: list[ViewSample] = []
    for i, r in enumerate(records):
        row, detail = sample_of(r, i)
        spool.add(detail)
        samples.append(row)
    graded = [s for s in samples if s.verdict != "ungraded"]
    n = len(records)
    known = [r.totals.cost_usd for r in records if r.totals.cost_usd is not None]
    tries = sum(len(rnd.conductor_calls) for r in records for rnd in r.rounds)
    bad = sum(len(rnd.parse_errors) for r in records for rnd in r.rounds)
    walls = [float(r.totals.answer_s) for r in records]
    queues = [float(r.totals.queue_s) for r in records]
    usage: dict[str, dict[int, int]] = {}
    shapes: dict[str, int] = {}
    for r, s in zip(records, samples, strict=True):
        for rnd in r.rounds:
            for st in rnd.steps:
                per = usage.setdefault(st.worker_id, {})
                per[st.index] = per.get(st.index, 0) + 1
        shapes[s.kind] = shapes.get(s.kind, 0) + 1
    lo, hi = _accuracy_interval(samples)
    cost_lo, cost_hi = _interval_of_costs(samples)
    first = records[0] if records else None
    pool = _text((first.pool or {}).get("name")) if first else "?"
    overview = RunOverview(
        samples=n,
        accuracy=sum(s.correct for s in graded) / len(graded) if graded else None,
        acc_lo=lo,
        acc_hi=hi,
        cost=sum(known) / len(known) if known else None,
        cost_lo=cost_lo,
        cost_hi=cost_hi,
        cost_is_lower_bound=any(
            r.totals.cost_usd is None or r.totals.unknown_cost_calls for r in records
        ),
        tokens=sum(r.totals.input_tokens + r.totals.output_tokens for r in records) / n
        if n
        else None,
        calls=sum(r.totals.calls for r in records) / n if n else None,
        latency_p50=percentile(walls, 0.5) if walls else None,
        latency_p95=percentile(walls, 0.95) if walls else None,
        queue_p50=percentile(queues, 0.5) if queues else None,
        parse_failure_rate=bad / tries if tries else None,
        worker_usage=usage,
        worker_order=sorted(usage),
        topology_counts=dict(sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0]))),
    )
    strategy = strategy_of(first) if first else "—"
    if kind == "serve":
        label = f"serve · {path.name}" + (f" · {strategy}" if first else "")
    else:
        label = f"{kind} · {first.run_id if first else path.name}"
    return ViewRun(
        label=label,
        kind=kind,
        path=str(path),
        benchmark="—",
        strategy=strategy,
        pool=pool or "?",
        conductor=_conductor_name(first),
        overview=overview,
        samples=samples,
        details=spool,
    )


def _served_runs(path: Path, spool: DetailSpool) -> list[ViewRun]:
    """A ``serve`` records directory: one run per served model, the Conductor's first,
    then the others by name (whatever order the requests came in)."""
    by_model: dict[str, list[RunRecord]] = {}
    for record in iter_records(path / SAMPLES, latest=True):
        by_model.setdefault(strategy_of(record), []).append(record)
    if not by_model:  # an empty records file is still the server's one (empty) run
        return [_records_run([], "serve", path, spool)]
    order = sorted(by_model, key=lambda name: (name != "conductor", name))
    return [_records_run(by_model[name], "serve", path, spool) for name in order]


def load_run(path: Path, spool: DetailSpool | None = None) -> list[ViewRun]:
    """The runs ``path`` stands for (a ``singles`` directory is one run per worker),
    their samples' details spooled to ``spool`` (a new one when not given)."""
    path = Path(path)
    spool = spool if spool is not None else DetailSpool()
    if path.name == SAMPLES and is_regular(path):
        path = path.parent
    if not path.is_dir():
        if not os.path.lexists(path):
            raise UsageError(
                f"{path}: no such file or directory; give a run.json or a run directory"
            )
        # Anything else is read as a record, whose reader refuses what is not a file.
        return [_records_run([read_record(path)], "ask", path, spool)]
    dirs = run_dirs(path, holding=CONFIG)
    if dirs:
        return [_bench_run(d, spool) for d in dirs]
    if (path / SAMPLES).is_file():
        return _served_runs(path, spool)
    raise UsageError(
        f"{path}: not a run (no {CONFIG} or {SAMPLES}); give an ask record, "
        "a bench run directory or a serve records directory"
    )


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while runs are read: each record read is a
    tree of fresh objects (no cycles) freed by reference counting as the next is read,
    so the collector's passes, over ever more rows kept (100,000 of them), cost time
    and find nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_runs(paths: Sequence[Path]) -> list[ViewRun]:
    """Every run ``paths`` stand for, in order, with each sample's ``disagree`` set
    (runs holding the same (sample, epoch) graded it differently)."""
    spool = DetailSpool()  # one for the page: its samples are numbered across the runs
    with _no_cycle_collection():
        runs = [run for p in paths for run in load_run(p, spool)]
    verdicts: dict[str, set[bool]] = {}
    for run in runs:
        for s in run.samples:
            if s.verdict != "ungraded":
                verdicts.setdefault(s.key, set()).add(s.correct)
    for run in runs:
        for s in run.samples:
            s.disagree = len(verdicts.get(s.key, ())) > 1
    return runs


# --------------------------------------------------------------------------- comparison


def compare_runs(runs: Sequence[ViewRun], a: int, b: int) -> Comparison | None:
    """Runs ``a`` and ``b`` on the graded questions both hold (None: no shared one)."""
    from ..runs.stats import mcnemar_exact, paired_bootstrap_diff

    right_b = {s.key: s.correct for s in runs[b].samples if s.verdict != "ungraded"}
    pairs = [
        (s.correct, right_b[s.key])
        for s in runs[a].samples
        if s.verdict != "ungraded" and s.key in right_b
    ]
    if not pairs:
        return None
    xs = [x for x, _ in pairs]
    ys = [y for _, y in pairs]
    only_a = sum(1 for x, y in pairs if x and not y)
    only_b = sum(1 for x, y in pairs if y and not x)
    diff, lo, hi = paired_bootstrap_diff(xs, ys)
    return Comparison(
        a=a,
        b=b,
        n=len(pairs),
        both_right=sum(1 for x, y in pairs if x and y),
        only_a=only_a,
        only_b=only_b,
        both_wrong=sum(1 for x, y in pairs if not x and not y),
        p_value=mcnemar_exact(only_a, only_b),
        diff=diff,
        diff_lo=lo,
        diff_hi=hi,
    )
