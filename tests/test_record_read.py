"""Reading run records that were edited, truncated or forged, and rendering hostile text.

Every malformed shape must be a :class:`RecordError` naming the field's place (the CLI
turns it into one line and exit code 2), never a ``TypeError`` or ``KeyError`` from
deep inside a renderer.  Text from models, providers and files must reach the terminal
with its control characters shown, not acted on.
"""

from __future__ import annotations

import copy
import io
import json
import random
from typing import Any

import pytest
from kit.records import POOL, call, judge_record, make_record, make_round, step
from rich.console import Console

from conductor.errors import RecordError, UsageError
from conductor.events import Event
from conductor.record import record_from_dict, record_to_dict
from conductor.render import (
    ProgressView,
    answer_panel,
    step_table,
    to_json,
    to_mermaid,
    topology,
    trace_renderable,
)
from conductor.text import printable

HOSTILE = "\x1b[2J\x1b]0;pwned\x07"


def render_all(record: Any) -> str:
    """Every view of ``record``, as a terminal would receive them."""
    buffer = io.StringIO()
    console = Console(width=120, file=buffer, force_terminal=False, color_system=None)
    for view in (
        topology(record),
        step_table(record),
        answer_panel(record),
        trace_renderable(record, "table"),
        trace_renderable(record, "tree"),
    ):
        console.print(view)
    return buffer.getvalue() + to_mermaid(record) + to_json(record)


def good_dict() -> dict[str, Any]:
    record = judge_record()
    record.rounds[0].parse_errors = ["no lists"]
    return json.loads(json.dumps(record_to_dict(record)))


# --------------------------------------------------------------------------- shapes

SHAPES: dict[str, tuple[Any, str]] = {}


def _shape(name: str, where: str):  # type: ignore[no-untyped-def]
    def register(fn):  # type: ignore[no-untyped-def]
        data = good_dict()
        SHAPES[name] = (fn(data), where)
        return fn

    return register


@_shape("a list", "not a conductor run record")
def _a_list(d: dict[str, Any]) -> Any:
    return [d]


@_shape("rounds a number", "record.rounds must be a list")
def _rounds_number(d: dict[str, Any]) -> Any:
    return {**d, "rounds": 5}


@_shape("a round a string", "rounds[0] must be an object")
def _round_string(d: dict[str, Any]) -> Any:
    return {**d, "rounds": ["x"]}


@_shape("steps not objects", "rounds[0].steps[0] must be an object")
def _steps_ints(d: dict[str, Any]) -> Any:
    d["rounds"][0]["steps"] = [1, 2]
    return d


@_shape("a step without its call", "rounds[0].steps[1] has no 'call'")
def _no_call(d: dict[str, Any]) -> Any:
    del d["rounds"][0]["steps"][1]["call"]
    return d


@_shape("a step without its worker", "rounds[0].steps[0] has no 'worker_id'")
def _no_worker(d: dict[str, Any]) -> Any:
    del d["rounds"][0]["steps"][0]["worker_id"]
    return d


@_shape("no question", "record has no 'question'")
def _no_question(d: dict[str, Any]) -> Any:
    del d["question"]
    return d


@_shape("latency as a string", 'conductor_calls[0].latency_s must be a number, not "1.0"')
def _latency_string(d: dict[str, Any]) -> Any:
    d["rounds"][0]["conductor_calls"][0]["latency_s"] = "1.0"
    return d


@_shape("tokens as a string", 'totals.input_tokens must be a whole number, not "12"')
def _tokens_string(d: dict[str, Any]) -> Any:
    d["totals"]["input_tokens"] = "12"
    return d


@_shape("tokens as true", "steps[2].call.output_tokens must be a whole number, not true")
def _tokens_bool(d: dict[str, Any]) -> Any:
    d["rounds"][0]["steps"][2]["call"]["output_tokens"] = True
    return d


@_shape("cost as a string", 'totals.cost_usd must be a number or null, not "0.1"')
def _cost_string(d: dict[str, Any]) -> Any:
    d["totals"]["cost_usd"] = "0.1"
    return d


@_shape("an unknown status", 'record.status must be "ok" or "partial" or "failed"')
def _status(d: dict[str, Any]) -> Any:
    d["status"] = "great"
    return d


@_shape("messages not objects", "conductor_calls[0].messages[0] must be an object")
def _messages(d: dict[str, Any]) -> Any:
    d["rounds"][0]["conductor_calls"][0]["messages"] = ["hi"]
    return d


@_shape("message content a list", "messages[0].content must be a string")
def _content(d: dict[str, Any]) -> Any:
    d["rounds"][0]["steps"][0]["call"]["messages"][0]["content"] = [1]
    return d


@_shape("workflow model_id a number", "rounds[0].workflow.model_id must be a list")
def _model_id(d: dict[str, Any]) -> Any:
    d["rounds"][0]["workflow"]["model_id"] = 3
    return d


@_shape("access lists of objects", "workflow.access_list[0] must be a list")
def _access(d: dict[str, Any]) -> Any:
    d["rounds"][0]["workflow"]["access_list"] = [{"a": 1}]
    return d


@_shape("totals a list", "totals must be an object, not list")
def _totals(d: dict[str, Any]) -> Any:
    d["totals"] = [1]
    return d


@_shape("visible steps of strings", "steps[3].visible_steps[0] must be a whole number")
def _visible(d: dict[str, Any]) -> Any:
    d["rounds"][0]["steps"][3]["visible_steps"] = ["0"]
    return d


# A list of whole numbers is checked at once by exact type, and read element by element
# only when that fails: the element at fault is still the one named.
@_shape("visible steps holding true", "steps[3].visible_steps[1] must be a whole number, not true")
def _visible_bool(d: dict[str, Any]) -> Any:
    d["rounds"][0]["steps"][3]["visible_steps"] = [0, True]
    return d


@_shape("a sample id a number", "record.sample_id must be a string or null, not 3")
def _sample_number(d: dict[str, Any]) -> Any:
    return {**d, "sample_id": 3}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_malformed_shapes_are_record_errors_naming_the_field(name: str) -> None:
    data, where = SHAPES[name]
    with pytest.raises(RecordError) as info:
        record_from_dict(data)
    assert isinstance(info.value, UsageError)  # exit code 2
    assert where in str(info.value)


def _mutations(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON tree."""
    places = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            places += _mutations(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            places += _mutations(item, (*path, i))
    return places


REPLACEMENTS: list[Any] = [None, "7", 7, -3, 2.5, True, [], [1, "x"], {}, {"k": [None]}, "all"]


@pytest.mark.long
def test_any_value_anywhere_loads_and_renders_or_is_a_record_error() -> None:
    """Each place of a good record replaced by each wrong-typed value: the reader
    refuses it or every view renders it; nothing else escapes."""
    base = good_dict()
    places = _mutations(base)
    rng = random.Random(8)
    tried = refused = 0
    for path in places:
        if not path:
            continue
        for replacement in rng.sample(REPLACEMENTS, 4):
            data = copy.deepcopy(base)
            holder = data
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = copy.deepcopy(replacement)
            tried += 1
            try:
                record = record_from_dict(data)
            except RecordError:
                refused += 1
                continue
            render_all(record)
    assert tried > 500
    assert 0 < refused < tried


# --------------------------------------------------------------------------- terminal


def test_printable_escapes_control_characters_visibly() -> None:
    assert printable("plain\ttext\nline") == "plain\ttext\nline"
    assert printable(HOSTILE) == "\\x1b[2J\\x1b]0;pwned\\x07"
    assert printable("a\r\nb\rc") == "a\nb\\x0dc"
    assert printable("\x9b31m \u202eevil") == "\\x9b31m \\u202eevil"


def hostile_record() -> Any:
    bad_call = call(f"answer {HOSTILE}", error=None)
    steps = [
        step(0, 0, f"subtask {HOSTILE}", [], [], bad_call),
        step(1, 1, "second", ["all"], [0], call(None, error=f"server said {HOSTILE}"), "failed"),
    ]
    steps[0].worker_id = f"alpha{HOSTILE}"
    record = make_record(
        [make_round(0, steps, [call(f"model_id = [0]{HOSTILE}", error=None)])],
        question=f"What? {HOSTILE}",
        status="partial",
        error=f"step 1 failed: {HOSTILE}\x9b2J",
    )
    record.final_answer = f"The answer {HOSTILE} is 4"
    record.rounds[0].parse_errors = [f"parse {HOSTILE}"]
    return record


@pytest.mark.parametrize("status", ["partial", "failed"])
def test_no_view_passes_terminal_controls_through(status: str) -> None:
    record = hostile_record()
    record.status = status
    out = render_all(record)
    for control in ("\x1b", "\x07", "\x9b"):
        assert control not in out
    assert "\\x1b[2J" in out  # shown, not acted on
    # The record itself keeps the text as it came.
    assert record.final_answer is not None and HOSTILE in record.final_answer
    assert json.loads(to_json(record))["final_answer"] == record.final_answer


def test_progress_view_escapes_event_text() -> None:
    view = ProgressView()
    view(Event("step_started", 0, step=0, worker_id=f"w{HOSTILE}"))
    view(Event("step_finished", 0, step=0, worker_id=f"w{HOSTILE}", failed=True, detail=HOSTILE))
    view(Event("run_finished", 0, failed=True, detail=HOSTILE))
    buffer = io.StringIO()
    Console(width=120, file=buffer, force_terminal=False, color_system=None).print(view)
    assert "\x1b" not in buffer.getvalue() and "\x07" not in buffer.getvalue()
    assert "\\x1b" in buffer.getvalue()


def test_pool_key_in_views_is_unchanged() -> None:
    # The escaped copy leaves ordinary records exactly as they were.
    record = judge_record()
    before = record_to_dict(copy.deepcopy(record))
    render_all(record)
    assert record_to_dict(record) == before
    assert record.pool == POOL
