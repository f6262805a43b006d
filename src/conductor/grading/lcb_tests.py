"""LiveCodeBench test cases as its dataset stores them: the one decoder.

Public tests are a JSON list; private tests are either JSON or base64 of zlib-compressed
pickle of that JSON text.  A bare ``pickle.loads`` would run whatever a tampered data
file asks for (a pickle may name any callable), so the pickle reader here refuses to
build any object: only strings, bytes, lists, dicts and numbers load.  The dataset
loader and the code grader both decode through :func:`decode_lcb_tests`.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from typing import Any

__all__ = ["decode_lcb_tests"]


class _TextOnlyUnpickler(pickle.Unpickler):
    """Refuses every class: LiveCodeBench's pickles hold a plain string, and anything
    else in a downloaded pickle could run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """The test cases of a column value, as the dicts stored (each with ``input`` and
    ``output``; other keys such as ``testtype`` kept as they are).

    ``None`` and ``""`` are no tests; a list is taken as already decoded.  Raises
    :class:`ValueError` naming what is wrong when the value cannot be read.
    """
    if value is None or value == "":
        return []
    decoded: Any = value
    if isinstance(value, (bytes, str)):
        text = value.decode("utf-8") if isinstance(value, bytes) else value
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            try:
                raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=False))
                decoded = _TextOnlyUnpickler(io.BytesIO(raw)).load()
                if isinstance(decoded, (bytes, str)):
                    decoded = json.loads(decoded)
            except Exception as exc:  # corrupt base64, zlib or pickle data
                raise ValueError(
                    f"cannot decode LiveCodeBench tests: {type(exc).__name__}: {exc}"
                ) from None
    if not isinstance(decoded, list):
        raise ValueError("LiveCodeBench tests must decode to a list")
    for item in decoded:
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise ValueError("each LiveCodeBench test must have input and output")
    return [dict(item) for item in decoded]
