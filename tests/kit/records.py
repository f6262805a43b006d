"""The one builder of run records for tests: calls, steps, rounds and whole records, and
the run directories, ``serve`` records directories and ``ask`` records that hold them.

Three shapes of record, for three kinds of test, built from the same call, step and
verdict builders:

* :func:`make_record` (with :func:`step`, :func:`make_round`, :func:`judge_record`):
  one question's run on :data:`POOL`, as the trace views show it;
* :func:`record` (with :func:`round_of`, :func:`write_run`, :func:`single_dir`): a
  bench sample on :data:`TRIO_POOL`, with its epoch, verdict and wall time, for
  summaries and report tables;
* :func:`planned_record` (with :class:`Plan`, :func:`chain`, :func:`fan`,
  :func:`write_bench`, :func:`write_serve`, :func:`write_ask`): a finished run that
  carried out a plan over :data:`VIEW_WORKERS`, as ``conductor view`` reads it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.record import (
    CallRecord,
    RoundRecord,
    RunRecord,
    StepRecord,
    Totals,
    record_to_dict,
    write_record,
)
from conductor.runs.rundir import CONFIG, SAMPLES, record_line

# --------------------------------------------------------------------------- shared


def call(
    response: str | None = "ok",
    *,
    tin: int = 10,
    tout: int = 5,
    cost: float | None = 0.001,
    latency: float = 1.0,
    cached: bool = False,
    attempts: int = 1,
    error: str | None = None,
    error_kind: str | None = None,
    prompt: str = "prompt",
) -> CallRecord:
    """One model call that asked ``prompt`` and got ``response``."""
    return CallRecord(
        messages=[{"role": "user", "content": prompt}],
        response=response,
        input_tokens=tin,
        output_tokens=tout,
        cost_usd=cost,
        latency_s=latency,
        cached=cached,
        attempts=attempts,
        error=error,
        error_kind=error_kind,
    )


def grade_of(status: str, reason: str, extracted: str | None = None) -> dict[str, Any]:
    """A grader's verdict as a record keeps it: full marks only when ``correct``."""
    return {
        "status": status,
        "score": 1.0 if status == "correct" else 0.0,
        "reason": reason,
        "extracted": extracted,
        "detail": {},
    }


# --------------------------------------------------------------------------- traces

POOL: dict[str, Any] = {
    "name": "test",
    "workers": [{"id": "alpha"}, {"id": "beta"}, {"id": "gamma"}, {"id": "judge-x"}],
}


def step(
    index: int,
    worker: int,
    subtask: str,
    access: list[Any],
    visible: list[int],
    c: CallRecord | None = None,
    status: str = "ok",
) -> StepRecord:
    """Step ``index``, run by :data:`POOL`'s worker ``worker``."""
    c = c or call(f"answer from step {index}")
    return StepRecord(
        index=index,
        worker_index=worker,
        worker_id=POOL["workers"][worker]["id"],
        model=f"openai/{POOL['workers'][worker]['id']}",
        subtask=subtask,
        access=access,
        visible_steps=visible,
        call=c,
        answer=c.response if status == "ok" else None,
        status=status,  # type: ignore[arg-type]
    )


def workflow_of(steps: list[StepRecord]) -> dict[str, Any]:
    return {
        "model_id": [s.worker_index for s in steps],
        "subtasks": [s.subtask for s in steps],
        "access_list": [s.access for s in steps],
    }


def make_round(
    index: int, steps: list[StepRecord], conductor: list[CallRecord] | None = None
) -> RoundRecord:
    return RoundRecord(
        index=index,
        conductor_calls=conductor or [call("model_id = [...]", cost=0.0005)],
        workflow=workflow_of(steps),
        steps=steps,
        final_answer=steps[-1].answer if steps else None,
    )


def totals_of(record: RunRecord) -> Totals:
    """The totals of ``record``'s calls, as a run adds them up."""
    calls = record.all_calls()
    known = [c.cost_usd for c in calls if c.cost_usd is not None]
    unknown = sum(1 for c in calls if c.cost_usd is None)
    return Totals(
        calls=len(calls),
        cached_calls=sum(c.cached for c in calls),
        failed_calls=sum(c.error is not None for c in calls),
        input_tokens=sum(c.input_tokens for c in calls),
        output_tokens=sum(c.output_tokens for c in calls),
        cost_usd=sum(known) if not unknown or known else None,
        unknown_cost_calls=unknown,
        wall_s=4.5,
    )


def make_record(rounds: list[RoundRecord], **kw: Any) -> RunRecord:
    """A run of ``rounds`` on :data:`POOL`; its answer is the last step's, its totals
    its calls'.  ``kw``: any other :class:`RunRecord` field."""
    rec = RunRecord(
        question=kw.pop("question", "What is 2+2?"),
        pool=POOL,
        conductor={"backend": "endpoint"},
        settings={},
        rounds=rounds,
        run_id="run123",
        **kw,
    )
    with_steps = [r for r in rounds if r.steps]
    if rec.final_answer is None and with_steps:
        rec.final_answer = with_steps[-1].steps[-1].answer
    rec.totals = totals_of(rec)
    return rec


def judge_record(**kw: Any) -> RunRecord:
    """Three independent attempts, then a judge that sees them all."""
    steps = [
        step(0, 0, "Solve the problem directly", [], [], call("4", cached=True, cost=0.0)),
        step(1, 1, "Solve it another way", [], []),
        step(2, 2, "Solve it a third way", [], []),
        step(3, 3, "Judge the attempts and give the final answer", ["all"], [0, 1, 2]),
    ]
    return make_record([make_round(0, steps)], **kw)


# --------------------------------------------------------------------------- bench runs

TRIO = ["gemini", "claude", "gpt"]
TRIO_POOL: dict[str, Any] = {
    "name": "trio",
    "workers": [{"id": w, "model": f"x/{w}"} for w in TRIO],
}
ALL = ["all"]
SINGLE_G = [(0, [])]
JUDGE = [(0, []), (1, []), (2, ALL)]
CHAIN3 = [(0, []), (1, ALL), (2, ALL)]


def _bench_call(error: str | None = None, cached: bool = False) -> CallRecord:
    return call(
        None if error else "ok", tin=100, tout=10, latency=0.0, attempts=0,
        cached=cached, error=error, prompt="q",
    )  # fmt: skip


def round_of(
    index: int,
    plan: list[tuple[int, list[Any]]] | None,
    tries: int = 1,
    parse_errors: int = 0,
    cached: int = 0,
    conductor_error: bool = False,
) -> RoundRecord:
    """``plan``: (:data:`TRIO` worker index, access) per step; ``None``: no workflow was
    produced.  ``tries`` Conductor calls, the first ``cached`` steps from the cache."""
    steps = []
    for i, (w, access) in enumerate(plan or []):
        visible = list(range(i)) if "all" in access else []
        steps.append(
            StepRecord(
                index=i,
                worker_index=w,
                worker_id=TRIO[w],
                model=f"x/{TRIO[w]}",
                subtask=f"subtask {i}",
                access=access,
                visible_steps=visible,
                call=_bench_call(cached=i < cached),
                answer="ok",
            )
        )
    workflow = None
    if plan is not None:
        workflow = {
            "model_id": [w for w, _ in plan],
            "subtasks": [f"subtask {i}" for i in range(len(plan))],
            "access_list": [a for _, a in plan],
        }
    return RoundRecord(
        index=index,
        conductor_calls=[_bench_call("boom" if conductor_error else None) for _ in range(tries)],
        parse_errors=[f"bad list {k}" for k in range(parse_errors)],
        workflow=workflow,
        steps=steps,
    )


def kept_round(index: int = 1) -> RoundRecord:
    """A round whose Conductor wrote an empty workflow: the previous answer stands."""
    return RoundRecord(
        index=index,
        conductor_calls=[_bench_call()],
        workflow={"model_id": [], "subtasks": [], "access_list": []},
    )


def record(
    sample: str,
    epoch: int,
    status: str | None,
    rounds: list[RoundRecord],
    *,
    wall: float,
    cost: float | None = 0.01,
    unknown_calls: int = 0,
    cached: int = 0,
) -> RunRecord:
    """Epoch ``epoch`` of bench sample ``sample``, graded ``status`` (``None``: the run
    failed before a verdict)."""
    n_calls = sum(len(r.conductor_calls) + len(r.steps) for r in rounds)
    return RunRecord(
        question=f"question {sample}",
        pool=TRIO_POOL,
        conductor={"backend": "endpoint"},
        settings={},
        sample_id=sample,
        epoch=epoch,
        rounds=rounds,
        status="failed" if status is None else "ok",
        grade=None if status is None else grade_of(status, status),
        totals=Totals(
            calls=n_calls,
            cached_calls=cached,
            input_tokens=100 * n_calls,
            output_tokens=10 * n_calls,
            cost_usd=cost,
            unknown_cost_calls=unknown_calls,
            wall_s=wall,
        ),
    )


def write_run(
    path: Path,
    strategy: str,
    records: list[RunRecord],
    *,
    paper_key: str | None = "GPQA-D",
    epochs: int = 1,
    tail: str = "",
    pool: dict[str, Any] | None = None,
) -> Path:
    """A gpqa-diamond run directory of ``strategy`` holding ``records``, then ``tail``
    (a cut-off line, say) at the end of its samples."""
    path.mkdir(parents=True)
    config = {
        "schema_version": 1,
        "benchmark": {
            "name": "gpqa-diamond",
            "paper_key": paper_key,
            "grader": "choice",
            "grader_version": "1",
            "provenance": {},
        },
        "strategy": strategy,
        "pool": pool or TRIO_POOL,
        "conductor": None,
        "settings": {},
        "epochs": epochs,
        "seed": 0,
        "limit": None,
        "shard": None,
        "created_at": "2025-01-01T00:00:00Z",
        "conductor_version": "0.1.0",
    }
    (path / "config.json").write_text(json.dumps(config))
    with (path / "samples.jsonl").open("w") as fh:
        for r in records:
            fh.write(json.dumps(record_to_dict(r)) + "\n")
        fh.write(tail)
    return path


def single_dir(tmp_path: Path, worker: int, correct: int) -> Path:
    """A five-sample ``single:`` run of :data:`TRIO` worker ``worker``, the first
    ``correct`` samples right."""
    recs = [
        record(
            f"s{i}",
            0,
            "correct" if i < correct else "incorrect",
            [round_of(0, [(worker, [])], tries=0)],
            wall=1.0,
            cost=0.001 * (worker + 1),
        )
        for i in range(5)
    ]
    return write_run(tmp_path / f"single-{TRIO[worker]}", f"single:{TRIO[worker]}", recs)


# --------------------------------------------------------------------------- planned runs

VIEW_WORKERS = ("gpt-small", "claude-mid", "gemini-big")


@dataclass
class Plan:
    """One sample's workflow: (worker, subtask, steps it sees, status) per step."""

    steps: list[tuple[str, str, list[int], str]] = field(default_factory=list)


def chain(*workers: str) -> Plan:
    return Plan(
        [(w, f"step {i} for {w}", [i - 1] if i else [], "ok") for i, w in enumerate(workers)]
    )


def fan(*workers: str) -> Plan:
    *attempts, judge = workers
    steps = [(w, f"attempt {i} by {w}", [], "ok") for i, w in enumerate(attempts)]
    steps.append((judge, "judge the attempts", list(range(len(attempts))), "ok"))
    return Plan(steps)


def planned_record(
    sample_id: str | None,
    question: str,
    plan: Plan,
    *,
    verdict: str | None = "correct",
    answer: str = "42",
    gold: str = "42",
    cost: float | None = 0.001,
    epoch: int = 0,
    with_conductor: bool = True,
    wall_s: float = 1.0,
    template: str | None = None,
) -> RunRecord:
    """A finished run of ``question`` that carried out ``plan``.  With ``template`` (a
    benchmark's prompt, ``{q}`` where the question goes) the record is asked the filled
    template and keeps the question apart in its metadata, as a bench record does."""
    asked = template.replace("{q}", question) if template is not None else question
    steps = []
    for i, (worker, subtask, sees, status) in enumerate(plan.steps):
        c = CallRecord(
            messages=[
                {"role": "system", "content": "You are a careful worker."},
                {"role": "user", "content": f"{asked}\n\nSubtask: {subtask}"},
            ],
            response=None if status != "ok" else f"{worker} says {answer}",
            error="boom" if status == "failed" else None,
            error_kind="server" if status == "failed" else None,
            input_tokens=100,
            output_tokens=20,
            cost_usd=cost / max(1, len(plan.steps)) if cost is not None else None,
        )
        steps.append(
            StepRecord(
                index=i,
                worker_index=VIEW_WORKERS.index(worker) if worker in VIEW_WORKERS else 0,
                worker_id=worker,
                model=worker,
                subtask=subtask,
                access=list(sees),
                visible_steps=list(sees),
                call=c,
                answer=c.response,
                status=status,  # type: ignore[arg-type]
            )
        )
    conductor_calls = []
    workflow = None
    if with_conductor:
        reply = json.dumps(
            {
                "model_id": [
                    VIEW_WORKERS.index(w) if w in VIEW_WORKERS else 0 for w, *_ in plan.steps
                ],
                "subtasks": [s for _, s, *_ in plan.steps],
                "access_list": [sees for _, _, sees, _ in plan.steps],
            }
        )
        conductor_calls.append(
            CallRecord(messages=[{"role": "user", "content": asked}], response=reply)
        )
        workflow = json.loads(reply)
    rnd = RoundRecord(
        index=0,  # a record's rounds are numbered from 0 (shown from 1)
        conductor_calls=conductor_calls,
        workflow=workflow,
        steps=steps,
        final_answer=answer,
    )
    return RunRecord(
        question=asked,
        pool={"name": "fake", "workers": [{"id": w} for w in VIEW_WORKERS]},
        conductor={"backend": "endpoint", "target": {"id": "conductor", "model": "conductor-7b"}},
        settings={},
        sample_id=sample_id,
        epoch=epoch,
        rounds=[rnd],
        final_answer=answer,
        totals=Totals(
            calls=len(steps) + len(conductor_calls),
            input_tokens=100 * len(steps),
            output_tokens=20 * len(steps),
            cost_usd=cost,
            wall_s=wall_s,
        ),
        gold=gold,
        grade=None if verdict is None else grade_of(verdict, f"graded {verdict}", answer),
        sample_question=question if template is not None else None,
    )


def write_bench(
    run_dir: Path,
    records: Sequence[RunRecord],
    *,
    benchmark: str = "math500",
    strategy: str = "conductor",
) -> Path:
    """A bench run directory holding ``records``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "benchmark": {"name": benchmark},
        "strategy": strategy,
        "pool": {"name": "fake", "workers": [{"id": w} for w in VIEW_WORKERS]},
        "epochs": 1,
    }
    (run_dir / CONFIG).write_text(json.dumps(config))
    _write_samples(run_dir, records)
    return run_dir


def write_serve(records_dir: Path, records: Sequence[RunRecord]) -> Path:
    """A ``serve`` records directory: ``samples.jsonl`` and no ``config.json``."""
    records_dir.mkdir(parents=True, exist_ok=True)
    _write_samples(records_dir, records)
    return records_dir


def _write_samples(directory: Path, records: Sequence[RunRecord]) -> None:
    with (directory / SAMPLES).open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(record_line(record_to_dict(r)))


def write_ask(path: Path, record: RunRecord) -> Path:
    write_record(record, path)
    return path
