"""The text side of the code grader, pure functions that run nothing: the code in a
model's reply (:func:`extract_code`, rules in :mod:`conductor.bench.graders.code`),
whether outputs match (:func:`outputs_match`, :func:`values_match`), the test methods
of BigCodeBench test source (:func:`bcb_test_names`), and program output fit to quote
in a record, keys redacted (``_clip``).
"""

from __future__ import annotations

import ast
import math
import os
import re
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


def _as_float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def outputs_match(got: str, expected: str) -> bool:
    """Whether a program's stdout matches the expected output, whitespace-tolerantly.

    Lines are stripped, trailing blank lines dropped; unequal lines are compared token by
    token, and two tokens that both parse as numbers match within 1e-6 (abs or rel).
    """

    def lines(text: str) -> list[str]:
        out = [line.strip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    a, b = lines(got), lines(expected)
    if len(a) != len(b):
        return False
    for la, lb in zip(a, b, strict=True):
        if la == lb:
            continue
        ta, tb = la.split(), lb.split()
        if len(ta) != len(tb):
            return False
        for x, y in zip(ta, tb, strict=True):
            if x == y:
                continue
            fx, fy = _as_float(x), _as_float(y)
            if fx is None or fy is None or not math.isclose(fx, fy, rel_tol=1e-6, abs_tol=1e-6):
                return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """JSON-style equality of a function's result and the expected value (floats 1e-6)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected or (type(got) is type(expected) and got == expected)
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(got, int) and isinstance(expected, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(got) != len(expected):
            return False
        return all(values_match(x, y) for x, y in zip(got, expected, strict=True))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return bool(got == expected)


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


def _clip(text: Any, limit: int = _SHOW) -> str:
    """``text`` fit to quote in a record: secrets redacted, control characters escaped,
    clipped to ``limit`` characters."""
    s = text if isinstance(text, str) else repr(text)
    s = s[: limit * 4]
    for secret in _secrets():
        if secret in s:
            s = s.replace(secret, "[redacted]")
    s = _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", s)
    return s if len(s) <= limit else s[:limit] + "..."
