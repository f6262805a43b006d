"""Builders of runs for the ``conductor view`` tests: records written through
``conductor.record`` into bench directories, ``serve`` records directories and ``ask``
records, with the plans, verdicts and costs each test chooses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

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

WORKERS = ("gpt-small", "claude-mid", "gemini-big")


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


def make_record(
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
        call = CallRecord(
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
                worker_index=WORKERS.index(worker) if worker in WORKERS else 0,
                worker_id=worker,
                model=worker,
                subtask=subtask,
                access=list(sees),
                visible_steps=list(sees),
                call=call,
                answer=call.response,
                status=status,  # type: ignore[arg-type]
            )
        )
    conductor_calls = []
    workflow = None
    if with_conductor:
        reply = json.dumps(
            {
                "model_id": [WORKERS.index(w) if w in WORKERS else 0 for w, *_ in plan.steps],
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
    grade = None
    if verdict is not None:
        grade = {
            "status": verdict,
            "score": 1.0 if verdict == "correct" else 0.0,
            "reason": f"graded {verdict}",
            "extracted": answer,
            "detail": {},
        }
    return RunRecord(
        question=asked,
        pool={"name": "fake", "workers": [{"id": w} for w in WORKERS]},
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
        grade=grade,
        metadata={"question": question} if template is not None else {},
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
        "pool": {"name": "fake", "workers": [{"id": w} for w in WORKERS]},
        "epochs": 1,
    }
    (run_dir / CONFIG).write_text(json.dumps(config))
    with (run_dir / SAMPLES).open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(record_line(record_to_dict(r)))
    return run_dir


def write_serve(records_dir: Path, records: Sequence[RunRecord]) -> Path:
    """A ``serve`` records directory: ``samples.jsonl`` and no ``config.json``."""
    records_dir.mkdir(parents=True, exist_ok=True)
    with (records_dir / SAMPLES).open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(record_line(record_to_dict(r)))
    return records_dir


def write_ask(path: Path, record: RunRecord) -> Path:
    write_record(record, path)
    return path
