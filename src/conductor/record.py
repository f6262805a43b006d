"""Run records: everything that happened for one question, as JSON.

A record holds the schema version, ids, timestamps, the question, the resolved pool
and Conductor (no secrets), every round with the Conductor's raw output and parsed
workflow, every step (worker, messages sent, response, usage, cost, latency, cached
flag, error), the final answer and totals.  ``conductor trace`` reads these and nothing
else.  Records are plain dataclasses; :func:`record_to_dict` / :func:`record_from_dict`
convert them to and from JSON-ready dicts.

What the packages that run a question add to its record are typed fields of it, each
written by one owner: the benchmark, the strategy and the sample's own question,
choices and metadata (the bench runner; ``serve`` names the strategy too), the answer
form asked for (the strategies), a vote's tally (the baselines), a router's route
(``router:DIR``), and a served request's allowed workers and budget (``serve``).
Schema version 1 kept them untyped in one ``metadata`` object; such records are read
into the same fields (:data:`METADATA_FIELDS`), and records are written in version 2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from .errors import RecordError, UsageError
from .llm.types import Message
from .private import write_private
from .redact import masked_json
from .userfiles import UnreadableFileError, parse_json, read_regular, utf8_text
from .workflow import RECORD_FIELDS

__all__ = [
    "MAX_RECORD_BYTES",
    "METADATA_FIELDS",
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "BudgetRecord",
    "CallRecord",
    "RoundRecord",
    "RouteRecord",
    "RunRecord",
    "RunStatus",
    "StepRecord",
    "Totals",
    "check_record_path",
    "new_run_id",
    "now_iso",
    "raw_field",
    "read_record",
    "record_from_dict",
    "record_to_dict",
    "write_record",
]

#: Bumped whenever a field changes meaning or is removed (2: ``metadata``'s keys became
#: fields of their own).
SCHEMA_VERSION = 2
#: The versions :func:`record_from_dict` reads.
READABLE_VERSIONS = (1, 2)
#: The most one run record (a record file, a line of ``samples.jsonl``) is read up to:
#: a question is at most 4 MB of UTF-8 and a record holds it in a few prompts, so a
#: record past this is damage, refused without being held whole.
MAX_RECORD_BYTES = 256 << 20

RunStatus = Literal["ok", "partial", "failed"]

log = logging.getLogger("conductor")


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
    #: ``cost_usd`` is what the server reported (a nested ``conductor serve``,
    #: ``usage.cost``), not tokens times a price.
    cost_reported: bool = False
    #: Answered through the provider's batch API, and priced at its batch rate (a cached
    #: call keeps the flag of the call that answered it); ``live_cost_usd`` is then what
    #: the same call would have cost live (``None`` for a live call).
    batch: bool = False
    live_cost_usd: float | None = None
    #: The time the call was being answered (retries included), and before that the
    #: time it waited for a concurrency slot or for a model busy with other calls.
    latency_s: float = 0.0
    queue_s: float = 0.0
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
    #: The text the reply was made to begin with (the last of ``messages``, an assistant
    #: message the model continued), or ``None``.  ``response`` is what the model wrote
    #: after it; :attr:`reply` is the two together, which is what the parser read.
    prefill: str | None = None
    #: The functions the reply called, each ``{"id", "name", "arguments"}`` (the
    #: arguments as the JSON text the model wrote); ``None`` when it called none.
    tool_calls: list[dict[str, Any]] | None = None
    #: The attempts that failed and were tried again, each ``{"at", "attempt",
    #: "error_kind", "status", "error", "wait_s"}`` (:class:`conductor.llm.types.Retry`).
    retries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reply(self) -> str | None:
        """The whole reply: ``prefill`` followed by ``response`` (``None`` without one)."""
        if self.response is None:
            return None
        return (self.prefill or "") + self.response


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
    #: Earlier tries of this step whose replies broke the requested answer format
    #: (:mod:`conductor.answer_format`), each with the violation as its ``error``.
    rejected: list[CallRecord] = field(default_factory=list)


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
    #: The tool calls the round's answer is (see :attr:`RunRecord.final_tool_calls`).
    final_tool_calls: list[dict[str, Any]] | None = None


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
    #: The part of ``wall_s`` in which a call of this run waited and none was being
    #: answered (``queue_s`` of the calls, overlaps counted once): what a busy model or
    #: a full concurrency limit added, not what the question took to answer.
    queue_s: float = 0.0
    #: Calls answered through a provider's batch API, and what the run would have cost
    #: had every call been live (``None`` without batch calls, or with a price unknown).
    batch_calls: int = 0
    live_cost_usd: float | None = None

    @property
    def answer_s(self) -> float:
        """``wall_s`` less what it waited (``queue_s``): the time taken to answer."""
        return max(0.0, self.wall_s - self.queue_s)


@dataclass
class RouteRecord:
    """Where ``router:DIR`` sent a question: the arm, every arm's chance of a right
    answer as the router put it, and whether a cascade fell back."""

    arm: str
    chances: dict[str, float] = field(default_factory=dict)
    fell_back: bool = False


@dataclass
class BudgetRecord:
    """A served request's budget (all its runs together): its ceilings (``None``: none),
    what its runs had drawn on it when this one was recorded, and its first refusal."""

    max_calls: int | None = None
    max_usd: float | None = None
    calls: int = 0
    usd: float = 0.0
    stopped: str | None = None


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
    #: The benchmark a bench record is a sample of (its name).
    benchmark: str | None = None
    #: The strategy that answered, as ``--strategy`` and ``serve``'s model ids spell it
    #: (bench and serve records: one ``serve`` records file holds every model's runs).
    strategy: str | None = None
    #: A bench sample's own question (``question`` is the prompt: the benchmark's
    #: template filled in), its choices, and its dataset metadata less the hidden tests
    #: (:func:`conductor.datasets.samples.recorded_metadata`).
    sample_question: str | None = None
    sample_choices: list[Any] | dict[str, Any] | None = None
    sample_metadata: dict[str, Any] | None = None
    #: The form the answer was asked in (tools, a JSON schema), when not plain text.
    answer_format: dict[str, Any] | None = None
    #: ``vote:K:W``: how many replies gave each answer key.
    votes: dict[str, int] | None = None
    #: ``router:DIR``: the arm the question went to.
    route: RouteRecord | None = None
    #: ``serve``: the workers the request could use, and its budget.
    allowed_workers: list[str] | None = None
    budget: BudgetRecord | None = None
    #: Set when a benchmark rerun reused this sample's record: the original run id and
    #: when it was reused.
    replayed_from: dict[str, Any] | None = None
    #: The answer as tool calls, each ``{"id", "name", "arguments"}``, when the answering
    #: step called tools (``final_answer`` then holds any text it wrote beside them);
    #: ``None`` for an answer in text.
    final_tool_calls: list[dict[str, Any]] | None = None

    @property
    def answered(self) -> bool:
        """Whether the run gave an answer: a text, or tool calls."""
        return self.final_answer is not None or bool(self.final_tool_calls)

    @property
    def verdict(self) -> str:
        """A bench sample's grade status; for a record with no grade, ``run_failed`` when
        the run failed (a bench grades every run that did not), else ``ungraded`` (an
        ``ask`` or ``serve`` record, which has no gold answer to grade against)."""
        if self.grade is None:
            return "run_failed" if self.status == "failed" else "ungraded"
        return str(self.grade.get("status") or "grader_error")

    def all_calls(self) -> list[CallRecord]:
        """Every model call, in order: each round's Conductor calls, then its steps."""
        out: list[CallRecord] = []
        for rnd in self.rounds:
            out.extend(rnd.conductor_calls)
            for s in rnd.steps:
                out.extend(s.rejected)
                if s.status != "skipped":
                    out.append(s.call)
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


def _kind(expected: Any) -> str:
    """How a field's type is named in an error message."""
    if expected is float:
        return "a number"
    if expected is int:
        return "a whole number"
    if expected is str:
        return "a string"
    if expected is bool:
        return "true or false"
    origin = typing.get_origin(expected)
    if origin is list:
        return "a list"
    if origin is dict or expected is dict:
        return "an object"
    if origin is Literal:
        return " or ".join(json.dumps(v) for v in typing.get_args(expected))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(expected)
        named = [_kind(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if isinstance(expected, type) and issubclass(expected, dict):  # a TypedDict
        return "an object"
    return str(expected)


#: Where a value sits in a record (``record.rounds[0].steps[1]``): a text, or a place
#: and the key or list index below it, spelt out only when an error names it (building
#: the text for every value read was a third of the time taken to read a record).
Where = str | tuple[Any, str | int]


def _place(where: Where) -> str:
    if isinstance(where, str):
        return where
    parent, part = where
    return f"{_place(parent)}[{part}]" if isinstance(part, int) else f"{_place(parent)}.{part}"


#: Tells whether a value is of a field's kind; a part of it that is not (a list's
#: element) raises :class:`RecordError` naming its place.
_Fits = typing.Callable[[Any, Where], bool]


def _always(value: Any, where: Where) -> bool:
    return True


def _is_none(value: Any, where: Where) -> bool:
    return value is None


def _is_number(value: Any, where: Where) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any, where: Where) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_dict(value: Any, where: Where) -> bool:
    return isinstance(value, dict)


@functools.cache
def _fits_for(expected: Any) -> _Fits:
    """The test of a value against the field type ``expected``, built once per type: the
    type's shape (``typing.get_origin``) worked out for every value read was a third of
    the time taken to read a record."""
    if expected is Any:
        return _always
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(expected)
        if len(args) == 2 and type(None) in args:
            # ``T | None``, most of a record's fields: null settled before any call.
            (other,) = [_fits_for(a) for a in args if a is not type(None)]

            def optional(value: Any, where: Where) -> bool:
                if value is None:
                    return True
                try:
                    return other(value, where)
                except RecordError:
                    return False

            return optional
        options = [_fits_for(a) for a in args]

        # The options are tried without raising: a ``None`` in a ``str | None`` field is
        # the common case, and building an error for it cost more than the check.
        def union(value: Any, where: Where) -> bool:
            for fits in options:
                try:
                    if fits(value, where):
                        return True
                except RecordError:
                    continue
            return False

        return union
    if expected is type(None):
        return _is_none
    if expected is float:
        return _is_number
    if expected is int:
        return _is_int
    if expected in (str, bool):
        return lambda value, where: isinstance(value, expected)
    if origin is Literal:
        allowed = typing.get_args(expected)
        return lambda value, where: value in allowed
    if origin is list:
        (item,) = typing.get_args(expected) or (Any,)
        fits_item = _fits_for(item)

        # A list of whole numbers or of texts (access lists, steps seen) is checked at
        # once by exact type; one that is not is read element by element, which names
        # the element at fault (or finds an int or str subclass, which fits).
        exact = item if item in (int, str) else None

        def each(value: Any, where: Where) -> bool:
            if not isinstance(value, list):
                return False
            if exact is not None and all(type(element) is exact for element in value):
                return True
            if fits_item is not _always:
                for i, element in enumerate(value):
                    if not fits_item(element, (where, i)):
                        _refuse(element, item, (where, i))
            return True

        return each
    if origin is dict or expected is dict:
        return _is_dict
    if isinstance(expected, type) and issubclass(expected, dict):  # a message
        keys = [(key, hint, _fits_for(hint)) for key, hint in _hints(expected).items()]

        def message(value: Any, where: Where) -> bool:
            if not isinstance(value, dict):
                return False
            for key, hint, fits in keys:
                if key in value and not fits(value[key], (where, key)):
                    _refuse(value[key], hint, (where, key))
            return True

        return message
    return _always  # a kind of field this reader does not check


def _check(value: Any, expected: Any, where: Where) -> Any:
    """``value`` if it has the type a record field declares; else a :class:`RecordError`.

    Renderers format these values (``f"{latency:.2f}"``, ``len(...)``), so a number held
    as a string or a list where text belongs must be refused here, with its place.
    """
    if _fits_for(expected)(value, where):
        return value
    _refuse(value, expected, where)


def _refuse(value: Any, expected: Any, where: Where) -> typing.NoReturn:
    shown = json.dumps(value, ensure_ascii=True, default=str)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    raise RecordError(f"{_place(where)} must be {_kind(expected)}, not {shown}")


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    # Resolving the annotations was most of the time taken to read a record; the
    # classes never change, so each is resolved once.
    return typing.get_type_hints(cls)


@functools.cache
def _fields_of(cls: Any) -> tuple[tuple[str, Any, _Fits, bool], ...]:
    """Each field of the record dataclass ``cls``: its name, type, the type's test and
    whether a record must hold it (it has no default)."""
    hints = _hints(cls)
    return tuple(
        (
            f.name,
            hints[f.name],
            _fits_for(hints[f.name]),
            f.default is MISSING and f.default_factory is MISSING,
        )
        for f in fields(cls)
    )


def _build(cls: Any, data: Any, where: str, nested: dict[str, Any] | None = None) -> Any:
    """An instance of the record dataclass ``cls`` from ``data``, every field checked.

    ``nested`` holds fields already built (lists of sub-records).  Unknown keys are
    ignored so that records from newer minor versions still load.
    """
    if not isinstance(data, dict):
        raise RecordError(f"{where} must be an object, not {type(data).__name__}")
    values: dict[str, Any] = {}
    for name, hint, fits, required in _fields_of(cls):
        if nested is not None and name in nested:
            values[name] = nested[name]
        elif name in data:
            value = values[name] = data[name]
            if not fits(value, (where, name)):
                _refuse(value, hint, (where, name))
        elif required:
            raise RecordError(f"{where} has no {name!r}")
    return cls(**values)


def _list_of(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise RecordError(f"{where}.{key} must be a list, not {type(value).__name__}")
    return value


def _build_round(r: Any, where: str) -> RoundRecord:
    if not isinstance(r, dict):
        raise RecordError(f"{where} must be an object, not {type(r).__name__}")
    steps = []
    for j, s in enumerate(_list_of(r, "steps", where)):
        at = f"{where}.steps[{j}]"
        if not isinstance(s, dict):
            raise RecordError(f"{at} must be an object, not {type(s).__name__}")
        if "call" not in s:
            raise RecordError(f"{at} has no 'call'")
        call = _build(CallRecord, s["call"], f"{at}.call")
        rejected = [
            _build(CallRecord, c, f"{at}.rejected[{k}]")
            for k, c in enumerate(_list_of(s, "rejected", at))
        ]
        steps.append(_build(StepRecord, s, at, {"call": call, "rejected": rejected}))
    calls = [
        _build(CallRecord, c, f"{where}.conductor_calls[{k}]")
        for k, c in enumerate(_list_of(r, "conductor_calls", where))
    ]
    rnd: RoundRecord = _build(RoundRecord, r, where, {"steps": steps, "conductor_calls": calls})
    if rnd.workflow is not None:
        _check_workflow(rnd.workflow, f"{where}.workflow")
    return rnd


def _check_workflow(wf: dict[str, Any], where: str) -> None:
    """A recorded workflow: three lists (worker numbers, subtasks, access lists)."""
    for key, item in RECORD_FIELDS:
        if key in wf:
            _check(wf[key], list[item], f"{where}.{key}")  # type: ignore[valid-type]


#: Where version 1's ``metadata`` keys are read into: the field each became (no other
#: key was written there).
METADATA_FIELDS: dict[str, str] = {
    "benchmark": "benchmark",
    "strategy": "strategy",
    "question": "sample_question",
    "choices": "sample_choices",
    "sample": "sample_metadata",
    "answer_format": "answer_format",
    "votes": "votes",
    "route": "route",
    "allowed_workers": "allowed_workers",
    "budget": "budget",
}
#: The fields that are records of their own.
_NESTED: dict[str, Any] = {"route": RouteRecord, "budget": BudgetRecord}


def _from_metadata(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 record's ``data`` with its ``metadata`` keys as the fields they became.

    Leniently: version 1 held any value there and its readers passed over one of the
    wrong kind (a question that was not a string), so such a value is left out here
    rather than making the whole record unreadable."""
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        return data
    out = dict(data)
    types = {name: hint for name, hint, _fits, _required in _fields_of(RunRecord)}
    for key, name in METADATA_FIELDS.items():
        value = metadata.get(key)
        if value is None or name in data:
            continue
        try:
            if name in _NESTED:
                _build(_NESTED[name], value, f"record.metadata.{key}")
            else:
                _check(value, types[name], f"record.metadata.{key}")
        except RecordError:
            continue
        out[name] = value
    return out


def raw_field(data: Mapping[str, Any], name: str) -> Any:
    """The field ``name`` of a record as read from JSON, of either version, unchecked
    (``None`` when it has none): for a reader that looks at one field of many lines
    without building each record."""
    if name in data:
        return data[name]
    metadata = data.get("metadata") if data.get("schema_version") == 1 else None
    if isinstance(metadata, Mapping):
        for key, became in METADATA_FIELDS.items():
            if became == name:
                return metadata.get(key)
    return None


def record_from_dict(data: dict[str, Any]) -> RunRecord:
    """Rebuild a :class:`RunRecord`; raises :class:`RecordError` on a foreign schema or
    on any field of the wrong shape (the message names the field's place).  A record of
    an earlier version readable here is returned in this version's form."""
    if not isinstance(data, dict) or "schema_version" not in data or "rounds" not in data:
        raise RecordError("this is not a conductor run record (no schema_version or rounds)")
    version = data["schema_version"]
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise RecordError(
            f"run record schema version {version} is not supported "
            f"(this conductor reads versions {READABLE_VERSIONS[0]} to {SCHEMA_VERSION})"
        )
    if version == 1:
        data = _from_metadata(data)
    rounds = [
        _build_round(r, f"rounds[{i}]") for i, r in enumerate(_list_of(data, "rounds", "record"))
    ]
    totals = _build(Totals, data.get("totals", {}), "totals")
    nested: dict[str, Any] = {"rounds": rounds, "totals": totals}
    for name, cls in _NESTED.items():
        value = data.get(name)
        if value is not None:
            nested[name] = _build(cls, value, f"record.{name}")
    record: RunRecord = _build(RunRecord, data, "record", nested)
    record.schema_version = SCHEMA_VERSION
    return record


def write_record(record: RunRecord, path: str | Path) -> None:
    """Write ``record`` as indented JSON (atomically: a temp file, then a rename)."""
    text = masked_json(record_to_dict(record), indent=2, ensure_ascii=False) + "\n"
    _write_atomically(Path(path), text)


def check_record_path(path: str | Path) -> None:
    """Raise the error :func:`write_record` would raise for ``path``, before a run is
    paid for (by writing and removing its temporary file)."""
    _write_atomically(Path(path), None)


def _write_atomically(target: Path, text: str | None) -> None:
    if target.is_dir():
        raise UsageError(f"{target}: is a directory; give a file path for the run record")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        write_private(tmp, text or "", atomic=False)
        if text is None:
            tmp.unlink()
        else:
            tmp.replace(target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(
            f"{target}: cannot write the run record ({exc.strerror or exc}); "
            "choose a writable --out path"
        ) from None


def read_record(path: str | Path) -> RunRecord:
    """Read one record written by :func:`write_record` (or by ``conductor ask --out``):
    a regular file of at most :data:`MAX_RECORD_BYTES`."""
    p = Path(path)
    try:
        text = utf8_text(read_regular(p, "run record", MAX_RECORD_BYTES), p, "run record")
        data = parse_json(text, p)
    except UnreadableFileError as exc:
        raise RecordError(str(exc)) from None
    try:
        return record_from_dict(data)
    except RecordError as exc:
        raise RecordError(f"{p}: {exc}") from None
