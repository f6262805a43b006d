"""The checks of a client's JSON Schema and of a reply against it, below serve: the size
limits a schema is refused by when it arrives, the linear keywords (``uniqueItems``,
``enum``, ``const`` by canonical values, with JSON Schema's equality), the deadline a
check keeps as it walks, and that a ``$ref`` never leaves the schema."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from conductor.llm import schema_checks
from conductor.llm.check_workers import InlineRunner, Job, RequestChecks
from conductor.llm.schema_checks import Problem, canonical, check_reply, check_schema
from conductor.llm.schema_limits import LIMITS, size_problem

jsonschema = pytest.importorskip("jsonschema")


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = obj(a=schema)
    return schema


# -- size limits ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (
            obj(v={"enum": list(range(10_000))}),
            "10,000 enum values in all, over the limit of 1,000",
        ),
        (  # enums add up across the schema
            obj(a={"enum": list(range(600))}, b={"items": {"enum": list(range(600))}}),
            "1,200 enum values in all, over the limit of 1,000",
        ),
        (obj(**{f"p{i}": {"type": "string"} for i in range(5_001)}), "5,001 object properties"),
        (nested(33), "nests subschemas 33 deep, over the limit of 32"),
        (obj(v={"description": "x", "default": list(range(60_000))}), "over the limit of 50,000"),
        (
            obj(v={"enum": ["x" * 60 for _ in range(300)]}),
            "string enum of 300 values and 18,000 characters, over the limit of 15,000",
        ),
        (obj(v={"const": "c" * 120_001}), "characters of names, enum and const values"),
        (
            {"type": "object", "patternProperties": {f"^p{i}$": {} for i in range(101)}},
            "101 patterns in all, over the limit of 100",
        ),
        (obj(v={"pattern": "a" * 1_001}), "a pattern of 1,001 characters, over the limit of 1,000"),
        (  # subschemas under every keyword that holds them count
            {"$defs": {"d": {"anyOf": [{"not": {"items": [nested(31)]}}]}}},
            "deep, over the limit of 32",
        ),
    ],
)
def test_a_schema_over_a_limit_is_named(schema: dict[str, Any], words: str) -> None:
    found = size_problem(schema)
    assert found is not None and words in found, found


@pytest.mark.parametrize(
    "schema",
    [
        obj(v={"enum": list(range(1_000))}),  # each limit exactly reached is allowed
        obj(**{f"p{i}": {"type": "string"} for i in range(5_000)}),
        nested(32),
        obj(v={"enum": ["x" * 60 for _ in range(250)]}),  # 250 values: no character limit
        {"type": "object", "patternProperties": {f"^p{i}$": {} for i in range(100)}},
        # A property named like a keyword is a name, not the keyword.
        obj(enum={"type": "string"}, pattern={"type": "integer"}, const={"type": "null"}),
    ],
)
def test_a_schema_within_the_limits_passes(schema: dict[str, Any]) -> None:
    assert size_problem(schema) is None


def test_the_size_walk_stops_at_the_limit() -> None:
    """A list of a million values is refused by its length, never walked: the walk runs
    on a server's event loop, so its cost must be the limits', not the body's."""

    class Unwalkable(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise AssertionError("the walk went through a list over the limit")

    for schema in (
        {"default": Unwalkable(range(1_000_000))},
        {"anyOf": Unwalkable([{}] * 60_000)},
        {"enum": Unwalkable(range(2_000))},
        {"$defs": dict.fromkeys(map(str, range(60_000)), Unwalkable())},
    ):
        assert "over the limit of" in (size_problem(schema) or "")


# -- canonical values -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (False, 0, False),
        (None, False, False),
        ({"a": 1, "b": [1, 2]}, {"b": [1.0, 2], "a": 1}, True),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1, "b": 1}, False),
        ("1", 1, False),
        ([[]], [[]], True),
        ({"a": {"b": True}}, {"a": {"b": 1}}, False),
    ],
)
def test_canonical_values_follow_json_schema_equality(a: Any, b: Any, equal: bool) -> None:
    assert (canonical(a) == canonical(b)) is equal
    # ... as jsonschema's own comparison says.
    from jsonschema._utils import equal as jsonschema_equal

    assert jsonschema_equal(a, b) is equal


@pytest.mark.parametrize(
    ("schema", "value", "valid"),
    [
        ({"uniqueItems": True}, [1, 1.0], False),
        ({"uniqueItems": True}, [1, True], True),
        ({"uniqueItems": True}, [{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
        ({"uniqueItems": False}, [1, 1], True),
        ({"enum": [1, "x", {"a": [1]}]}, 1.0, True),
        ({"enum": [1, "x", {"a": [1]}]}, True, False),
        ({"enum": [1, "x", {"a": [1]}]}, {"a": [1.0]}, True),
        ({"const": {"a": [1, 2]}}, {"a": [1, 2.0]}, True),
        ({"const": {"a": [1, 2]}}, {"a": [2, 1]}, False),
        ({"const": False}, 0, False),
    ],
)
def test_the_linear_keywords_agree_with_jsonschema(schema: Any, value: Any, valid: bool) -> None:
    found = check_reply(json.dumps(value), schema, need_object=False)
    assert (found is None) is valid, found
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is valid


def test_unique_items_and_enum_compare_no_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check compares through canonical values, never value against value: the
    stock keywords' pairwise comparisons (the positive control) are what made
    uniqueItems over 6,000 objects 18 million comparisons."""
    import jsonschema._keywords
    import jsonschema._utils

    calls = 0
    stock = jsonschema._utils.equal

    def counting(one: Any, two: Any) -> bool:
        nonlocal calls
        calls += 1
        return bool(stock(one, two))

    monkeypatch.setattr(jsonschema._utils, "equal", counting)
    monkeypatch.setattr(jsonschema._keywords, "equal", counting)
    n = 300
    schema = {
        "type": "object",
        "properties": {
            "u": {"uniqueItems": True},
            "e": {"items": {"enum": list(range(n))}},
        },
    }
    value = {"u": [{"i": i} for i in range(n)], "e": [n - 1] * n}
    assert check_reply(json.dumps(value), schema, need_object=True) is None
    assert calls == 0
    assert jsonschema.Draft202012Validator(schema).is_valid(value)  # the old path
    assert calls >= n * (n - 1) // 2 + n * n // 2


# -- the deadline -----------------------------------------------------------------------


def fan_out(levels: int, combinator: str = "anyOf") -> dict[str, Any]:
    """A small schema whose check doubles at each level: a first branch that fails
    after following a $ref the second branch follows again."""
    defs: dict[str, Any] = {f"l{levels}": {"type": "string"}}
    for level in range(levels - 1, -1, -1):
        ref = {"$ref": f"#/$defs/l{level + 1}"}
        defs[f"l{level}"] = {combinator: [{**ref, "minLength": 99}, ref]}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


@pytest.mark.parametrize(
    ("schema", "reply"),
    [
        (fan_out(40), '"x"'),
        (fan_out(40, "oneOf"), '"x"'),
        (
            {"patternProperties": {f"^(a|aa)+{c}$": {} for c in "bcdefgh"}},
            json.dumps({f"{'a' * 30}{k}!": k for k in range(200)}),
        ),  # fmt: skip
        (
            {
                **fan_out(30),
                "$ref": None,
                "type": "array",
                "contains": {"$ref": "#/$defs/l0"},
                "minContains": 50,
            },
            json.dumps(["x"] * 50),
        ),  # fmt: skip
    ],
)
def test_a_check_ends_at_its_deadline(schema: dict[str, Any], reply: str) -> None:
    """Exponential work (each schema is well within the size limits) ends as
    ``unchecked`` at the budget, which a check keeps as it walks."""
    assert size_problem(schema) is None
    schema = {k: v for k, v in schema.items() if v is not None}
    found = check_reply(reply, schema, need_object=False, budget_s=0.5)
    assert found == Problem("timeout", "checking it took over the limit of 0.5 s")


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},  # a $ref cycle
        {
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a",
        },  # fmt: skip
    ],
)
def test_a_ref_cycle_is_unchecked(schema: dict[str, Any]) -> None:
    found = check_reply('{"a": 1}', schema, need_object=False)
    assert found is not None and found.kind == "unchecked" and "too deep" in found.detail


def test_a_file_ref_is_never_read(tmp_path: Path) -> None:
    """A ``file:`` $ref is not read either: jsonschema's urlopen reads local files (the
    positive control: the old path validates against the file's schema), and
    ``file:///dev/zero`` would read without end."""
    local = tmp_path / "schema.json"
    local.write_text('{"type": "string"}')
    schema = {"$ref": local.as_uri()}
    found = check_reply("1", schema, need_object=False)
    assert found is not None and found.kind == "unchecked" and "not fetched" in found.detail
    with pytest.warns(DeprecationWarning):
        assert not jsonschema.Draft202012Validator(schema).is_valid(1)  # it read the file
    zero = check_reply("1", {"$ref": "file:///dev/zero"}, need_object=False, budget_s=1)
    assert zero is not None and zero.kind == "unchecked" and "not fetched" in zero.detail


def test_a_remote_ref_is_never_fetched() -> None:
    """A $ref outside the schema is unresolvable here; jsonschema itself (the positive
    control) fetches it with urlopen, a blocking request from the server's network to
    wherever the client points."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(5)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
    schema = {"type": "object", "properties": {"v": {"$ref": url}}}
    found = check_reply('{"v": 1}', schema, need_object=True)
    assert found is not None and found.kind == "unchecked"
    assert "not in the schema" in found.detail and "not fetched" in found.detail
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    listener.settimeout(10)

    def old_path() -> None:
        with pytest.raises(Exception):  # noqa: B017  (the socket is closed without a reply)
            jsonschema.Draft202012Validator(schema).is_valid({"v": 1})

    thread = threading.Thread(target=old_path, daemon=True)
    thread.start()
    conn, _ = listener.accept()  # the old path connected
    conn.close()
    listener.close()
    thread.join(10)


@pytest.mark.parametrize(
    ("schema", "reply"),
    [
        ({"multipleOf": int("9" * 4000)}, "1.5"),  # jsonschema raises OverflowError
        ({"multipleOf": 1e308}, str(int("9" * 4000))),
    ],
)
def test_a_validator_that_fails_leaves_the_reply_unchecked(schema: Any, reply: str) -> None:
    """Never passed, never an exception out of the check (a 500, or a dead worker)."""
    found = check_reply(reply, schema, need_object=False)
    assert found is not None and found.kind == "unchecked"
    assert "the validator failed on it (OverflowError" in found.detail


def test_check_schema_keeps_the_validators_verdicts() -> None:
    assert check_schema(obj(a={"type": "string"})) is None
    assert "is not valid" in (check_schema({"type": 3}) or "")
    assert "not supported" in (
        check_schema({"patternProperties": {"^x": {}}, "unevaluatedProperties": False}) or ""
    )


def test_a_reply_over_the_size_limit_is_unchecked() -> None:
    text = json.dumps(["x" * 1000] * (LIMITS.reply_chars // 1000))
    found = check_reply(text, {"type": "array"}, need_object=False)
    assert found is not None and found.kind == "unchecked" and "over the limit" in found.detail


async def test_one_request_s_checks_share_one_budget() -> None:
    """Once a request's budget is spent, every further check is unchecked at once and the
    refusal says why (so no more calls are made whose replies could not be checked)."""
    checks = RequestChecks(InlineRunner(), budget_s=0.3)
    assert checks.refusal() is None
    first = await checks.reply('"x"', fan_out(40), need_object=False)
    assert first is not None and first.kind == "unchecked"
    assert "request's limit of 0.3 s" in first.detail
    assert checks.refusal() == "the request's checks took their limit of 0.3 s"
    again = await checks.reply('{"a": 1}', {"type": "object"}, need_object=True)
    assert again == Problem("unchecked", "the request's checks took their limit of 0.3 s")


def test_run_job_is_what_a_worker_runs() -> None:
    from conductor.llm.check_workers import run_job

    assert run_job(Job("schema", {"type": 3}), 1.0) is not None
    assert run_job(Job("reply", {"type": "integer"}, "1"), 1.0) is None
    assert schema_checks.PATTERN_TIMEOUT_S > 0
