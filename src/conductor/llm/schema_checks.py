"""The checks made with a client's JSON Schema: :func:`check_schema` (is it a schema its
validator can use) and :func:`check_reply` (does a reply keep to it).

A JSON Schema in a request (``response_format``, a strict tool's ``parameters``) is the
client's, and the reply checked against it is a worker's, which the client's question
steers: together they choose how much work a check is.  Three walls bound it.

1. **Size limits, checked when the request arrives**
   (:func:`~conductor.llm.schema_limits.size_problem`): they keep honest requests cheap
   to refuse early, but a small schema can still ask for exponential work (``anyOf`` of
   ``$ref`` doubling at each level, catastrophic patterns).

2. **Linear keywords**: ``uniqueItems``, ``enum`` and ``const`` compare values through a
   canonical, hashable form of each (numbers by value, objects as sets of pairs), so
   they cost one pass over the reply instead of a comparison per pair (``uniqueItems``
   over 6,000 objects was 18 million comparisons; an enum of 10,000 values over 3,000
   items 30 million).  Patterns run on ``regex`` with a time-out per match, and
   ``$ref`` never leaves the schema (jsonschema would fetch a remote reference with
   ``urlopen``, blocking, from the server's network).

3. **A time budget, checked as the validator walks**: every keyword checks the deadline
   before it runs (and the canonical forms as they are built), so a check ends within
   one keyword's work of its budget as a ``timeout``.  That alone does not keep a
   server responsive (a check on the event loop holds it for the whole budget; in a
   thread it still takes the GIL in slices and cannot be killed; one C call, such as
   compiling a pattern, checks no deadline at all), so ``conductor serve`` runs these
   functions in worker processes that it kills at the budget
   (:mod:`conductor.llm.check_workers`); the deadline here is what lets a worker
   answer in time and live on, and what bounds a check made inline.
"""

from __future__ import annotations

import contextvars
import json
import math
import reprlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import MissingDependencyError, install_hint
from .schema_limits import LIMITS, SchemaLimits

__all__ = [
    "CheckTimeout",
    "Problem",
    "canonical",
    "check_reply",
    "check_schema",
    "timed_out",
]

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
        except (CheckTimeout, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001  (the metaschema's check failed on it)
            return _failed(exc)
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
    except Exception as exc:  # noqa: BLE001
        # The validator itself failed on this value (jsonschema's multipleOf raises
        # OverflowError for a float against an integer past a float's range): the reply
        # could not be checked, so it is not passed.
        return Problem("unchecked", _failed(exc))


def _failed(exc: Exception) -> str:
    return f"the validator failed on it ({type(exc).__name__}: {short(str(exc))})"


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
