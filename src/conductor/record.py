"""Run records: everything that happened for one question, as JSON.

A record holds the schema version, ids, timestamps, the question, the resolved pool
and Conductor (no secrets), every round with the Conductor's raw output and parsed
workflow, every step (worker, messages sent, response, usage, cost, latency, cached
flag, error), the final answer and totals.  ``conductor trace`` reads these and nothing
else.  Records are plain dataclasses; :func:`record_to_dict` / :func:`record_from_dict`
convert them to and from JSON-ready dicts.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from .errors import RecordError
from .llm.types import Message

__all__ = [
    "SCHEMA_VERSION",
    "CallRecord",
    "RoundRecord",
    "RunRecord",
    "RunStatus",
    "StepRecord",
    "Totals",
    "new_run_id",
    "now_iso",
    "read_record",
    "record_from_dict",
    "record_to_dict",
    "write_record",
]

#: Bumped whenever a field changes meaning or is removed.
SCHEMA_VERSION = 1

RunStatus = Literal["ok", "partial", "failed"]


def now_iso() -> str:
    """The current UTC time, ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass
class CallRecord:
    """One call of a model (the Conductor, or a worker inside a step)."""

    messages: list[Message]
    response: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    latency_s: float = 0.0
    cached: bool = False
    attempts: int = 0
    error: str | None = None
    error_kind: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    raw: dict[str, Any] | None = None
    #: The provider's finish reason; ``truncated`` when it says the reply was cut off at
    #: the token limit (such a reply is kept as the answer but never cached).
    finish_reason: str | None = None
    truncated: bool = False


@dataclass
class StepRecord:
    """One executed (or failed, or skipped) workflow step."""

    index: int
    worker_index: int
    worker_id: str
    model: str
    subtask: str
    access: list[Any]
    visible_steps: list[int]
    call: CallRecord
    answer: str | None = None
    status: Literal["ok", "failed", "skipped"] = "ok"


@dataclass
class RoundRecord:
    """One Conductor round: its tries at writing a workflow, then the steps."""

    index: int
    conductor_calls: list[CallRecord] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    workflow: dict[str, Any] | None = None
    steps: list[StepRecord] = field(default_factory=list)
    final_answer: str | None = None
    stop_reason: str | None = None


@dataclass
class Totals:
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0
    unknown_cost_calls: int = 0
    wall_s: float = 0.0


@dataclass
class RunRecord:
    """The whole story of one question."""

    question: str
    pool: dict[str, Any]
    conductor: dict[str, Any]
    settings: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    run_id: str = field(default_factory=new_run_id)
    sample_id: str | None = None
    epoch: int | None = None
    started_at: str = field(default_factory=now_iso)
    finished_at: str | None = None
    rounds: list[RoundRecord] = field(default_factory=list)
    final_answer: str | None = None
    status: RunStatus = "ok"
    error: str | None = None
    totals: Totals = field(default_factory=Totals)
    gold: Any = None
    grade: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Set when a benchmark rerun reused this sample's record: the original run id and
    #: when it was reused.
    replayed_from: dict[str, Any] | None = None

    def all_calls(self) -> list[CallRecord]:
        """Every model call, in order: each round's Conductor calls, then its steps."""
        out: list[CallRecord] = []
        for rnd in self.rounds:
            out.extend(rnd.conductor_calls)
            out.extend(s.call for s in rnd.steps if s.status != "skipped")
        return out


def _plain(value: Any) -> Any:
    # dataclasses.asdict deep-copies every value, which dominated the cost of writing a
    # cached benchmark sample; records are serialised right away, so sharing the
    # (JSON-ready) dicts and strings is safe.
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def record_to_dict(record: RunRecord) -> dict[str, Any]:
    """A JSON-ready dict of ``record`` (it shares nested dicts with the record)."""
    data: dict[str, Any] = _plain(record)
    return data


def _build(cls: Any, data: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def record_from_dict(data: dict[str, Any]) -> RunRecord:
    """Rebuild a :class:`RunRecord`; raises :class:`RecordError` on a foreign schema."""
    if not isinstance(data, dict) or "schema_version" not in data or "rounds" not in data:
        raise RecordError("this is not a conductor run record (no schema_version or rounds)")
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"run record schema version {version} is not supported "
            f"(this conductor reads version {SCHEMA_VERSION})"
        )
    try:
        rounds = []
        for r in data["rounds"]:
            steps = [
                _build(StepRecord, {**s, "call": _build(CallRecord, s["call"])})
                for s in r.get("steps", [])
            ]
            calls = [_build(CallRecord, c) for c in r.get("conductor_calls", [])]
            rounds.append(_build(RoundRecord, {**r, "steps": steps, "conductor_calls": calls}))
        totals = _build(Totals, data.get("totals", {}))
        record: RunRecord = _build(RunRecord, {**data, "rounds": rounds, "totals": totals})
        return record
    except (KeyError, TypeError) as exc:
        raise RecordError(f"run record is malformed: {exc}") from exc


def write_record(record: RunRecord, path: str | Path) -> None:
    """Write ``record`` as indented JSON (atomically: a temp file, then a rename)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(record_to_dict(record), indent=2, ensure_ascii=False) + "\n")
    tmp.replace(target)


def read_record(path: str | Path) -> RunRecord:
    """Read one record written by :func:`write_record` (or by ``conductor ask --out``)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise RecordError(f"{p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    try:
        return record_from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{p}: {exc}") from None
