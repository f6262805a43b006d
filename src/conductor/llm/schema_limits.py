"""What a client's JSON Schema may hold: :data:`LIMITS`, and :func:`size_problem`, the
walk that finds the first limit a schema passes.

The limits are OpenAI's documented limits for structured outputs where it documents one
(5,000 object properties, 1,000 enum values, 120,000 characters of names and enum and
const values, a string enum over 250 values within 15,000 characters, 128 tools), and
elsewhere well above what real clients send (a pydantic model's schema is a few hundred
values, a few levels deep).  ``conductor serve`` checks them when a request arrives, on
its event loop, so the walk's cost is bounded by the limits and not by the schema: values
are counted before they are pushed, and the walk stops at the first limit passed.  They
keep honest requests cheap to refuse early; they are not what bounds a check (a small
schema can still ask for exponential work): the checks' own budget is
(:mod:`conductor.llm.schema_checks`), and it is here too, :attr:`SchemaLimits.check_s`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["LIMITS", "SchemaLimits", "size_problem"]


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
