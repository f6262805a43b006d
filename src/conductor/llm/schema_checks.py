"""What a client's JSON Schema may hold, and the checks made with it: :data:`LIMITS`,
:func:`size_problem`, :func:`check_schema` and :func:`check_reply`.

A JSON Schema in a request (``response_format``, a strict tool's ``parameters``) is the
client's, and the reply checked against it is a worker's, which the client's question
steers: together they choose how much work a check is.  Three walls bound it.

1. **Size limits, checked when the request arrives** (:func:`size_problem`, one linear
   walk that stops at the first limit passed): nesting, values in all, object
   properties, enum values, the characters of names and enum and const values, patterns
   and their length, tools.  They are OpenAI's documented limits for structured outputs
   where it documents one (5,000 object properties, 1,000 enum values, 120,000
   characters of names and values, a string enum over 250 values within 15,000
   characters, 128 tools), and elsewhere well above what real clients send (a pydantic
   model's schema is a few hundred values).  They keep honest requests cheap to refuse
   early; they are not what bounds a check: a small schema can still ask for
   exponential work (``anyOf`` of ``$ref`` doubling at each level, catastrophic
   patterns).

2. **Linear keywords**: ``uniqueItems``, ``enum`` and ``const`` compare values through a
   canonical, hashable form of each (numbers by value, objects as sets of pairs), so
   they cost one pass over the reply instead of a comparison per pair (``uniqueItems``
   over 6,000 objects was 18 million comparisons; an enum of 10,000 values over 3,000
   items 30 million).  Patterns run on ``regex`` with a time-out per match, and
   ``$ref`` never leaves the schema (jsonschema would fetch a remote reference with
   ``urlopen``, blocking, from the server's network).

3. **A time budget, checked as the validator walks**: every keyword checks the deadline
   before it runs (and the canonical forms as they are built), so a check ends within
   one keyword's work of its budget with ``unchecked``.  That alone does not keep a
   server responsive (a check on the event loop holds it for the whole budget; in a
   thread it still takes the GIL in slices and cannot be killed), so ``conductor
   serve`` runs these functions in worker processes that it kills at the budget
   (:mod:`conductor.llm.check_workers`); the deadline here is what lets a worker
   answer in time and live on, and what bounds a check made inline.
"""

from __future__ import annotations

import contextvars
import json
import math
import reprlib
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import MissingDependencyError, install_hint

__all__ = [
    "LIMITS",
    "Problem",
    "SchemaLimits",
    "check_reply",
    "check_schema",
    "size_problem",
    "timed_out",
]


@dataclass(frozen=True)
class SchemaLimits:
    """The limits of one request's schemas and of a check (see the module docstring)."""

    #: Subschemas inside subschemas (OpenAI: 10 levels of objects; an object level
    #: with an array and a nullable ``anyOf`` is 3 levels here).
    depth: int = 32
    #: JSON values in one schema, every keyword and annotation counted.
    nodes: int = 50_000
    #: Object properties in one schema (OpenAI's limit).
    properties: int = 5_000
    #: Enum values in one schema, all enums together (OpenAI's limit).
    enum_values: int = 1_000
    #: Characters of property and definition names and enum and const values (OpenAI's).
    text_chars: int = 120_000
    #: A string enum of more than this many values ...
    large_enum: int = 250
    #: ... holds at most this many characters (OpenAI's).
    large_enum_chars: int = 15_000
    #: ``pattern`` and ``patternProperties`` patterns in one schema.
    patterns: int = 100
    #: Characters of one pattern.
    pattern_chars: int = 1_000
    #: Tools in one request (OpenAI's limit).
    tools: int = 128
    #: Characters of a reply (or a call's arguments) checked against a schema.
    reply_chars: int = 4 << 20
    #: Seconds all of one request's checks may take together (its schemas when it
    #: arrives, each reply of each of its runs).
    check_s: float = 5.0


#: The limits ``conductor serve`` applies (one place for all of them).
LIMITS = SchemaLimits()

ProblemKind = Literal["not_json", "not_object", "mismatch", "unchecked", "timeout"]


@dataclass(frozen=True)
class Problem:
    """How a reply failed its check: not JSON, JSON but not an object, not matching the
    schema, ``unchecked`` (the check could not be made: the reply was too large or too
    deep, the schema's ``$ref`` or a pattern unusable) or ``timeout`` (unchecked too:
    the check's budget ran out)."""

    kind: ProblemKind
    detail: str = ""


class CheckTimeout(Exception):
    """The check's deadline passed."""


def timed_out(budget_s: float) -> Problem:
    """The problem of a check that took over ``budget_s``."""
    return Problem("timeout", f"checking it took over the limit of {budget_s:g} s")


class _Unusable(Exception):
    """The schema cannot be used on this reply (an unresolvable ``$ref``, a pattern
    ``regex`` refuses): the reply is unchecked, not wrong."""


#: The most of a message quoted from a value or an error.
_QUOTE = 160

_shown = reprlib.Repr()
_shown.maxlist = _shown.maxdict = _shown.maxtuple = 6
_shown.maxstring = _shown.maxother = 60
_shown.maxlevel = 3


def short(text: str) -> str:
    """``text`` on one line, cut to :data:`_QUOTE` characters."""
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


# -- size limits, when a request arrives ------------------------------------------------

#: Keywords whose value is one subschema (``items`` may also be a list of them).
_ONE = frozenset(
    (
        "items",
        "additionalItems",
        "additionalProperties",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    )
)
#: Keywords whose value is a list of subschemas.
_LIST = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
#: Keywords whose value maps names to subschemas.
_MAP = frozenset(
    ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
)
_ONE_OR_LIST = _ONE | _LIST


class _Walk:
    """What :func:`size_problem` counts as it walks, and what is left to walk: values
    are counted as they are pushed, before they are pushed, so a list of a million is
    refused by its length alone.  :meth:`over` is the first limit passed, as the end of
    a sentence (``has N enum values in all, over the limit of M``), or ``None``."""

    def __init__(self, limits: SchemaLimits) -> None:
        self.limits = limits
        self.nodes = 0
        self.properties = 0
        self.enum_values = 0
        self.text_chars = 0
        self.patterns = 0
        #: (value, depth, whether it is a schema, or data such as an enum's values)
        self.stack: list[tuple[Any, int, bool]] = []

    def push(self, values: Collection[Any], depth: int, schemas: bool) -> str | None:
        self.nodes += len(values)
        over = self.over()
        if over is None:
            self.stack.extend((v, depth, schemas) for v in values)
        return over

    def over(self) -> str | None:
        lim = self.limits
        for count, limit, what in (
            (self.nodes, lim.nodes, "JSON values"),
            (self.properties, lim.properties, "object properties"),
            (self.enum_values, lim.enum_values, "enum values"),
            (self.text_chars, lim.text_chars, "characters of names, enum and const values"),
            (self.patterns, lim.patterns, "patterns"),
        ):
            if count > limit:
                return f"has {count:,} {what} in all, over the limit of {limit:,}"
        return None


def size_problem(schema: Any, limits: SchemaLimits = LIMITS) -> str | None:
    """How ``schema`` passes a size limit, as the end of a sentence naming the limit and
    the value (``has 10,000 enum values in all, over the limit of 1,000``), or ``None``.
    One walk, stopped at the first limit passed, so its cost is bounded by the limits
    and not by the schema (it runs on a server's event loop)."""
    walk = _Walk(limits)
    problem = walk.push((schema,), 1, True)
    while problem is None and walk.stack:
        node, depth, is_schema = walk.stack.pop()
        if not is_schema:
            if isinstance(node, dict):
                problem = walk.push(node.values(), depth, False)
            elif isinstance(node, list):
                problem = walk.push(node, depth, False)
        elif isinstance(node, dict):  # else true, false, or what the schema check refuses
            if depth > limits.depth:
                return f"nests subschemas {depth} deep, over the limit of {limits.depth}"
            problem = _keywords(node, depth, walk)
    return problem


def _keywords(node: dict[str, Any], depth: int, walk: _Walk) -> str | None:
    """Count one subschema's keywords, pushing what lies below them."""
    for key, value in node.items():
        if key in _ONE and isinstance(value, dict | bool):
            problem = walk.push((value,), depth + 1, True)
        elif key in _ONE_OR_LIST and isinstance(value, list):
            problem = walk.push(value, depth + 1, True)
        elif key in _MAP and isinstance(value, dict):
            if key == "properties":
                walk.properties += len(value)
            problem = walk.push(value.values(), depth + 1, True) or _names(key, value, walk)
        elif key == "pattern" and isinstance(value, str):
            problem = _pattern_problem(value, walk)
        elif key == "enum" and isinstance(value, list):
            walk.enum_values += len(value)
            problem = walk.over() or _enum_chars(value, walk)
            if problem is None:
                problem = walk.push((value,), depth, False)
        elif key == "const":
            walk.text_chars += _data_chars(value)
            problem = walk.push((value,), depth, False)
        else:  # an annotation (description, default, examples, ...) or unknown keyword
            problem = walk.push((value,), depth, False)
        if problem is not None:
            return problem
    return None


def _names(key: str, schemas: dict[str, Any], walk: _Walk) -> str | None:
    """Count the names of a keyword that maps names (or patterns) to subschemas."""
    if key != "patternProperties":
        walk.text_chars += sum(len(str(name)) for name in schemas)
        return walk.over()
    for pattern in schemas:
        problem = _pattern_problem(str(pattern), walk)
        if problem is not None:
            return problem
    return None


def _enum_chars(values: list[Any], walk: _Walk) -> str | None:
    """Count an enum's characters (its values are within the limit of their number)."""
    limits = walk.limits
    chars = sum(_data_chars(v) for v in values)
    walk.text_chars += chars
    large = len(values) > limits.large_enum and chars > limits.large_enum_chars
    if large and all(isinstance(v, str) for v in values):
        return (
            f"has a string enum of {len(values):,} values and {chars:,} characters, "
            f"over the limit of {limits.large_enum_chars:,} characters for an enum "
            f"of more than {limits.large_enum} values"
        )
    return walk.over()


def _pattern_problem(pattern: str, walk: _Walk) -> str | None:
    walk.patterns += 1
    if len(pattern) > walk.limits.pattern_chars:
        return (
            f"has a pattern of {len(pattern):,} characters, over the limit of "
            f"{walk.limits.pattern_chars:,}"
        )
    return walk.over()


def _data_chars(value: Any) -> int:
    """The characters a value adds to the text limit: a string's length, else the
    length of its JSON (bounded: the request's body was)."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value))
    except (ValueError, RecursionError):
        return 0


# -- the checks -------------------------------------------------------------------------


def _jsonschema() -> Any:
    try:
        import jsonschema
    except ImportError:
        raise MissingDependencyError(
            f"checking a reply against a JSON schema needs jsonschema: {install_hint('serve')}"
        ) from None
    return jsonschema


def check_schema(schema: dict[str, Any], budget_s: float = LIMITS.check_s) -> str | None:
    """Why ``schema`` is not a JSON Schema its validator can use, in a few words, or
    ``None``; raises :class:`CheckTimeout` when that takes over ``budget_s``."""
    jsonschema = _jsonschema()
    with _checking(budget_s):
        # What the validator's check_schema does (its metaschema's first error), with
        # the metaschema's keywords timed.
        cls = jsonschema.validators.validator_for(schema)
        meta = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
        timed = jsonschema.validators.extend(meta, _timed_keywords(meta.VALIDATORS))
        checker = timed(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER)
        try:
            error = next(iter(checker.iter_errors(schema)), None)
        except RecursionError:
            return "it is nested too deeply to check"
        if error is not None:
            return short(error.message)
    if {"unevaluatedProperties", "patternProperties"} <= _keywords_used(schema):
        # jsonschema matches patternProperties for unevaluatedProperties with Python's
        # re, outside the time-outs of the patterns here: the two together are refused.
        return "unevaluatedProperties beside patternProperties is not supported"
    return None


def _keywords_used(schema: Any) -> set[str]:
    """Every object key anywhere in ``schema`` (keywords, and property names, which only
    make the refusal above stricter).  Iterative: its depth was checked by the size
    limits, but a schema checked without them may be deeper."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def check_reply(
    text: str,
    schema: dict[str, Any] | None,
    *,
    need_object: bool,
    budget_s: float = LIMITS.check_s,
    limits: SchemaLimits = LIMITS,
) -> Problem | None:
    """How ``text`` fails: not JSON, not an object where ``need_object``, not valid
    against ``schema`` (when given), or ``unchecked``; ``None`` when it passes."""
    if len(text) > limits.reply_chars:
        return Problem(
            "unchecked",
            f"it is {len(text):,} characters, over the limit of {limits.reply_chars:,} "
            "for a reply checked against a schema",
        )
    try:
        with _checking(budget_s):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError) as exc:
                reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                return Problem("not_json", short(reason))
            if need_object and not isinstance(value, dict):
                return Problem("not_object")
            if schema is None:
                return None
            found = _invalid(value, schema)
            return Problem("mismatch", found) if found else None
    except CheckTimeout:
        return timed_out(budget_s)
    except RecursionError:
        return Problem("unchecked", "the check went too deep (a reply nested too deeply, "
                       "or a $ref that refers to itself)")  # fmt: skip
    except MemoryError:
        return Problem("unchecked", "checking it needed more memory than the checker has")
    except _Unusable as exc:
        return Problem("unchecked", str(exc))


def _invalid(value: Any, schema: dict[str, Any]) -> str | None:
    """The most telling way ``value`` breaks ``schema``, or ``None`` when it validates."""
    jsonschema = _jsonschema()
    from referencing import Registry
    from referencing.exceptions import Unresolvable

    cls = jsonschema.validators.validator_for(schema)
    keywords = {
        **_timed_keywords(cls.VALIDATORS),
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
        "enum": _enum,
        "const": _const,
    }
    # An empty registry: a $ref outside the schema is unresolvable, never fetched.
    validator = jsonschema.validators.extend(cls, keywords)(schema, registry=Registry())
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except Unresolvable as exc:
        raise _Unusable(
            f"the schema's reference {short(str(getattr(exc, 'ref', exc)))} is not in the "
            "schema (references to other documents are not fetched)"
        ) from None
    if error is None:
        return None
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return short(f"{where.lstrip('.') or 'the value'}: {error.message}")


# -- the deadline -----------------------------------------------------------------------


class _Check:
    """One check's deadline, and the canonical sets of its enums (by the id of the enum's
    list, which the check's schema keeps alive)."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.enums: dict[int, frozenset[Any]] = {}
        self.consts: dict[int, Any] = {}

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise CheckTimeout


_current: contextvars.ContextVar[_Check | None] = contextvars.ContextVar(
    "conductor_schema_check", default=None
)


class _checking:
    """The block of one check, under ``budget_s``."""

    def __init__(self, budget_s: float) -> None:
        self.check = _Check(budget_s)
        self.token: contextvars.Token[_Check | None] | None = None

    def __enter__(self) -> _Check:
        self.token = _current.set(self.check)
        return self.check

    def __exit__(self, *exc: object) -> None:
        assert self.token is not None
        _current.reset(self.token)


def _tick() -> _Check:
    check = _current.get()
    if check is None:  # a keyword used outside a check: no budget to keep
        check = _Check(math.inf)
    check.tick()
    return check


Keyword = Callable[[Any, Any, Any, Any], Any]


def _timed(keyword: Keyword) -> Keyword:
    """``keyword``, checking the deadline before it runs."""

    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        _tick()
        errors = keyword(validator, value, instance, schema)
        if errors is not None:
            yield from errors

    return timed


def _timed_keywords(keywords: dict[str, Keyword]) -> dict[str, Keyword]:
    return {name: _timed(fn) for name, fn in keywords.items()}


# -- canonical values: linear uniqueItems, enum and const -------------------------------


def canonical(value: Any) -> Any:
    """A hashable form of a JSON value that two values share exactly when JSON Schema
    calls them equal: numbers by value (1 and 1.0 alike, booleans apart from them),
    arrays in order, objects as sets of pairs.  Checks the deadline per container."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", value)  # equal numbers hash alike across int and float
    _tick()
    if isinstance(value, list):
        return ("array", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, canonical(v)) for k, v in value.items()))
    return ("other", repr(value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    _tick()
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = canonical(item)
        if key in seen:
            yield ValidationError(f"{_shown.repr(instance)} has non-unique elements")
            return
        seen.add(key)


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    check = _tick()
    if not isinstance(enums, list):
        return
    keys = check.enums.get(id(enums))
    if keys is None:
        keys = check.enums[id(enums)] = frozenset(canonical(v) for v in enums)
    if canonical(instance) not in keys:
        yield ValidationError(f"{_shown.repr(instance)} is not one of {_shown.repr(enums)}")


def _const(validator: Any, const: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    check = _tick()
    key = check.consts.get(id(schema))
    if key is None:
        key = check.consts[id(schema)] = canonical(const)
    if canonical(instance) != key:
        yield ValidationError(f"{_shown.repr(const)} was expected")


# -- patterns ---------------------------------------------------------------------------

#: How long one regular expression of a schema may take on one string.  The schema is
#: the client's and the string a worker's reply, which the client's question steers: a
#: catastrophic pattern (``^(a+)+$``) on Python's ``re`` holds the GIL for minutes, so
#: patterns run on ``regex`` with a time-out (the check's own budget bounds the sum).
PATTERN_TIMEOUT_S = 0.05


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``; a match that takes longer than
    :data:`PATTERN_TIMEOUT_S` counts as no match (the reply is then refused, never
    passed unchecked)."""
    import regex

    _tick()
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        return False
    except regex.error as exc:
        raise _Unusable(
            f"the schema's pattern {short(repr(pattern))} cannot be used ({exc})"
        ) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{short(repr(instance))} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    _tick()
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in known and not any(_search(p, k) for p in patterns)]
    if validator.is_type(allowed, "object"):
        for key in extras:
            yield from validator.descend(instance[key], allowed, path=key)
    elif allowed is False and extras:
        shown = ", ".join(repr(k) for k in sorted(extras, key=str)[:20])
        yield ValidationError(f"Additional properties are not allowed ({shown})")
