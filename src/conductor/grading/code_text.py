"""The text side of the code grader, pure functions that run nothing: the code in a
model's reply (:func:`extract_code`, rules in :mod:`conductor.grading.code`),
whether outputs match as LiveCodeBench's checker decides (:func:`outputs_match`,
:func:`values_match`), the test methods of BigCodeBench test source
(:func:`bcb_test_names`), and program output fit to quote in a record, keys redacted
(:func:`quote_output`).
"""

from __future__ import annotations

import ast
import math
import os
import re
from decimal import Decimal
from typing import Any

_SHOW = 200  # characters of expected / got shown in a reason

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)
_LOOKS_LIKE_CODE = re.compile(
    r"^\s*(def \w+|class \w+|import \w|from [\w.]+ import |print\()", re.M
)
_PY_TAGS = {"python", "py", "python3", "py3"}


def extract_code(response: str | None) -> str | None:
    """The code in a model's reply, or None (rules in the module docstring)."""
    if not response or not response.strip():
        return None
    text = _THINK.sub("", response)
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for wanted in (_PY_TAGS, {""}):
        chosen = [body for tag, body in blocks if tag in wanted]
        if chosen and chosen[-1].strip():
            return chosen[-1].strip("\n") + "\n"
    if blocks:
        return None  # only blocks in other languages
    if _LOOKS_LIKE_CODE.search(text):
        return text.strip("\n") + "\n"
    return None


# --- comparison helpers: the parent compares what the sandbox returned (never inside it) ---
#
# By default both follow LiveCodeBench's own checker (lcb_runner/evaluation/testing_util.py,
# ``grade_stdio`` and ``grade_call_based``) verdict for verdict; ``float_tolerance`` is
# this project's deliberate extension for answers the problem accepts within an error
# bound, off unless a benchmark's ``grader_options`` turn it on.

_INTEGER = re.compile(r"[+-]?\d[\d_]*")  # a token Decimal reads as an integer


def _lines(text: str) -> list[str]:
    # The whole text is stripped first (so leading and trailing blank lines vanish), then
    # split at "\n" only; blank lines inside stay and must match.
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (ArithmeticError, ValueError):
        return None


def _close(got: Decimal, expected: Decimal, token: str, tolerance: float) -> bool:
    """Whether ``got`` is within ``tolerance`` (absolute, or relative to ``expected``) of
    an expected value that is not written as an integer; integers stay exact, so an
    off-by-one on a large count is never forgiven."""
    if _INTEGER.fullmatch(token) or not (got.is_finite() and expected.is_finite()):
        return False
    try:
        bound = Decimal(repr(tolerance)) * max(Decimal(1), abs(expected))
        return abs(got - expected) <= bound
    except ArithmeticError:
        return False


def _line_matches(got: str, expected: str, tolerance: float | None) -> bool:
    if got == expected:
        return True
    a, b = _decimals(got), _decimals(expected)
    if a is None or b is None or len(a) != len(b):
        return False
    try:
        if a == b:
            return True
    except ArithmeticError:  # a signalling NaN refuses to compare: the official run errs
        return False
    if tolerance is None:
        return False
    tokens = expected.split()
    try:
        return all(
            x == y or _close(x, y, t, tolerance) for x, y, t in zip(a, b, tokens, strict=True)
        )
    except ArithmeticError:
        return False


def outputs_match(got: str, expected: str, float_tolerance: float | None = None) -> bool:
    """Whether a program's stdout matches the expected output, as LiveCodeBench decides.

    Both texts are stripped and split into lines at ``"\n"``, each line stripped; the
    line counts must agree.  Two lines match when they are equal, or when both are
    whitespace-separated numbers (as :class:`decimal.Decimal` reads them) with equal
    values one by one: ``1.50`` matches ``1.5`` and ``1e3`` matches ``1000``, while
    ``15200000001`` never matches ``15200000000`` nor ``1.52e+10``, and a line mixing
    words and numbers must be equal as text.  With ``float_tolerance``, a number whose
    expected form is not an integer also matches within that absolute or relative error.
    """
    a, b = _lines(got), _lines(expected)
    if len(a) != len(b):
        return False
    return all(_line_matches(x, y, float_tolerance) for x, y in zip(a, b, strict=True))


def values_match(got: Any, expected: Any, float_tolerance: float | None = None) -> bool:
    """Whether a function's result (JSON data) equals the expected JSON value, as
    LiveCodeBench decides: Python's ``==``, so ``2.0`` matches ``2`` and ``true`` matches
    ``1``, and floats match only when equal.  With ``float_tolerance``, an expected float
    also matches a number within that absolute or relative error."""
    try:
        if got == expected:
            return True
    except RecursionError:
        return False
    if float_tolerance is None:
        return False
    if isinstance(expected, float) and isinstance(got, (int, float)):
        try:
            return math.isclose(got, expected, rel_tol=float_tolerance, abs_tol=float_tolerance)
        except OverflowError:
            return False
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(
            values_match(x, y, float_tolerance) for x, y in zip(got, expected, strict=True)
        )
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            values_match(got[k], expected[k], float_tolerance) for k in expected
        )
    return False


def bcb_test_names(source: str) -> tuple[list[str], list[str]]:
    """The test methods of ``TestCases`` in BigCodeBench test source, and its imports.

    Parsed here (never run): the parent decides which tests must report a pass, so a
    solution cannot make tests disappear.  Methods inherited from other classes of the
    same source count too; names are sorted as unittest's loader sorts them.
    """
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if "TestCases" not in classes:
        raise ValueError("the test source defines no TestCases class")
    names: set[str] = set()
    todo, seen = ["TestCases"], set()
    while todo:
        cls = classes.get(todo.pop())
        if cls is None or cls.name in seen:
            continue
        seen.add(cls.name)
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith(
                "test"
            ):
                names.add(item.name)
        todo.extend(b.id for b in cls.bases if isinstance(b, ast.Name))
    if not names:
        raise ValueError("TestCases has no test methods")
    imports: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports.append(node.module)
    return sorted(names), sorted(set(imports))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|AUTH|CREDENTIAL|PRIVATE|SESSION|COOKIE", re.I)


def _secrets() -> list[str]:
    """Values of this process's environment that may be keys, longest first: those of
    variables named like one, and any long token mixing letters and digits."""
    values = set()
    for name, value in os.environ.items():
        if len(value) < 8 or value.startswith("/") or any(c.isspace() for c in value):
            continue
        mixed = any(c.isalpha() for c in value) and any(c.isdigit() for c in value)
        if _SECRET_NAME.search(name) or (len(value) >= 16 and mixed):
            values.add(value)
    return sorted(values, key=len, reverse=True)


def quote_output(text: Any, limit: int = _SHOW) -> str:
    """``text`` (program output, an expected value; not a string: its ``repr``) fit to
    quote in a record: values of the environment that may be keys redacted, control
    characters escaped, clipped to ``limit`` characters."""
    s = text if isinstance(text, str) else repr(text)
    s = s[: limit * 4]
    for secret in _secrets():
        if secret in s:
            s = s.replace(secret, "[redacted]")
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", s)
    return s if len(s) <= limit else s[:limit] + "..."
