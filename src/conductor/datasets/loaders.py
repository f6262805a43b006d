"""How a dataset row becomes a :class:`~conductor.grading.types.Sample`: reading a column
(paths such as ``messages[role=user].content``), sample ids, and one maker per loader
(``choice``, ``math``, ``livecodebench``, ``bigcodebench``) in :data:`MAKERS`.

The row pipeline of :mod:`conductor.datasets.samples` reads columns here too
(:func:`column_value`, :func:`cell_text`, :func:`math_gold`) to check and filter rows.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any, TypeAlias

from ..benchmark import BenchmarkSpec
from ..grading.types import Sample
from .columns import data_columns
from .sources import DataFileError, DatasetError, Row

__all__ = [
    "MAKERS",
    "SampleMaker",
    "cell_text",
    "column_value",
    "decode_lcb_tests",
    "hidden_tests_sha256",
    "math_gold",
    "split_hidden",
]

#: Makes a loader's Sample of a row: ``(spec, row, seed, seen)``, ``seen`` counting the
#: sample ids made so far (a repeated id gets ``-2``, ``-3``, ...).
SampleMaker: TypeAlias = Callable[[BenchmarkSpec, Row, int, dict[str, int]], Sample]

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# --------------------------------------------------------------------------- loaders


#: One step of a column path: ``.key``, ``[3]`` / ``[-1]`` or ``[role=user]``.
_PATH_STEP = re.compile(r"\.?([^.\[\]]+)|\[(-?\d+)\]|\[([^=\]]+)=([^\]]*)\]")


def _path_value(row: Row, column: str) -> tuple[bool, Any]:
    """(found, value) of a nested column such as ``reward_model.ground_truth`` or
    ``prompt[role=user].content`` (the first list item whose ``role`` is ``user``)."""
    value: Any = row
    pos = 0
    while pos < len(column):
        match = _PATH_STEP.match(column, pos)
        if match is None:
            return False, None
        pos = match.end()
        key, index, attr, wanted = match.groups()
        if key is not None:
            if not isinstance(value, dict) or key not in value:
                return False, None
            value = value[key]
        elif index is not None:
            if not isinstance(value, (list, tuple)) or not -len(value) <= int(index) < len(value):
                return False, None
            value = value[int(index)]
        else:
            if not isinstance(value, (list, tuple)):
                return False, None
            hits = [v for v in value if isinstance(v, dict) and str(v.get(attr)) == wanted]
            if not hits:
                return False, None
            value = hits[0]
    return True, value


def column_value(spec: BenchmarkSpec, row: Row, column: str, *, required: bool = True) -> Any:
    """The value of ``column`` in ``row``: a column name, else a path such as
    ``messages[role=user].content``.  A missing column is None when not ``required``,
    else a :class:`DataFileError` naming the columns the row has and those ``spec`` reads."""
    if column in row:
        return row[column]
    if "." in column or "[" in column:
        found, value = _path_value(row, column)
        if found:
            return value
    if not required:
        return None
    raise DataFileError(
        f"benchmark {spec.name}: a row has no column {column!r} (it has: "
        f"{', '.join(sorted(map(str, row)))}); fix fields in the benchmark file or the data: "
        f"{spec.name} reads {data_columns(spec).describe()}"
    )


def _question_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _sample_id(spec: BenchmarkSpec, row: Row, question: str, seen: dict[str, int]) -> str:
    col = spec.fields.get("id")
    raw = column_value(spec, row, col, required=False) if col else None
    local = str(raw).strip() if raw is not None and str(raw).strip() else _question_hash(question)
    sid = f"{spec.name}/{local}"
    # A repeated id (duplicated questions, say) keeps runs resumable by its position.
    count = seen.get(sid, 0) + 1
    seen[sid] = count
    return sid if count == 1 else f"{sid}-{count}"


def cell_text(value: Any) -> str:
    """A cell as text: ``""`` for a missing (None) value, else ``str(value)``."""
    return "" if value is None else str(value)


def _maybe_json_list(value: Any) -> Any:
    # CSV cells hold lists as JSON text.
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # not JSON after all: a 5,000-digit number too
            return value
    return value


def _choice_sample(spec: BenchmarkSpec, row: Row, seed: int, seen: dict[str, int]) -> Sample:
    from ..grading import choice as choice_grader

    fields = spec.fields
    question = cell_text(column_value(spec, row, fields["question"]))
    if "choices" in fields:
        options = _maybe_json_list(column_value(spec, row, fields["choices"]))
        if not isinstance(options, (list, tuple)) or len(options) < 2:
            raise DatasetError(
                f"benchmark {spec.name}: column {fields['choices']!r} must hold a list of "
                f"at least two options, got {options!r:.80}"
            )
        options = [cell_text(o) for o in options]
        correct = _answer_index(spec, column_value(spec, row, fields["answer"]), len(options))
    else:
        wrong_keys = sorted(
            (k for k in fields if k.startswith("incorrect_")), key=lambda k: int(k[10:])
        )
        options = [cell_text(column_value(spec, row, fields["correct"]))]
        options += [cell_text(column_value(spec, row, fields[k])) for k in wrong_keys]
        correct = 0
    sid = _sample_id(spec, row, question, seen)
    shuffled, gold, permutation = choice_grader.shuffle_choices(options, correct, seed, sid)
    metadata: dict[str, Any] = {
        "permutation": list(permutation),
        "correct_text": options[correct],
        "seed": seed,
    }
    if fields.get("subject"):
        metadata["subject"] = column_value(spec, row, fields["subject"], required=False)
    return Sample(
        id=sid,
        input={
            "question": question,
            "choices": list(shuffled),
            "choices_text": choice_grader.format_choices(list(shuffled)),
        },
        gold=gold,
        metadata=metadata,
    )


def _answer_index(spec: BenchmarkSpec, value: Any, n: int) -> int:
    index: int | None = None
    if isinstance(value, bool):
        index = None
    elif isinstance(value, int):
        index = value
    elif isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            index = int(text)
        elif len(text) == 1 and text.upper() in _LETTERS:
            index = _LETTERS.index(text.upper())
    if index is None or not 0 <= index < n:
        raise DatasetError(
            f"benchmark {spec.name}: answer {value!r} is not an option index (0..{n - 1}) or letter"
        )
    return index


def _math_sample(spec: BenchmarkSpec, row: Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = cell_text(column_value(spec, row, fields["question"]))
    metadata: dict[str, Any] = {}
    for key in ("subject", "level"):
        if fields.get(key):
            metadata[key] = column_value(spec, row, fields[key], required=False)
    for col in (c.strip() for c in fields.get("metadata", "").split(",")):
        if col:
            metadata[col] = column_value(spec, row, col, required=False)
    return Sample(
        id=_sample_id(spec, row, question, seen),
        input={"question": question},
        gold=math_gold(spec, row),
        metadata=metadata,
    )


def math_gold(spec: BenchmarkSpec, row: Row) -> str:
    """The answer column's text, else the last ``\\boxed{}`` of the solution column."""
    fields = spec.fields
    if "answer" in fields:
        return cell_text(column_value(spec, row, fields["answer"])).strip()
    from ..grading.extract import last_boxed

    solution = cell_text(column_value(spec, row, fields["solution"]))
    boxed = last_boxed(solution)
    if boxed is None:
        raise DataFileError(
            f"benchmark {spec.name}: the solution in column {fields['solution']!r} has no "
            "\\boxed{...} answer"
        )
    return boxed


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases from a column value, decoded safely (see
    :mod:`conductor.grading.lcb_tests`): ``[{"input", "output", "testtype"}, ...]``, the
    test type ``stdin`` where the row gives none.  Raises :class:`DatasetError` when the
    value is unreadable.
    """
    # Only LiveCodeBench rows hold tests (its pickle reader is loaded for them alone).
    from ..grading import lcb_tests

    try:
        stored = lcb_tests.decode_lcb_tests(value)
    except ValueError as exc:
        raise DatasetError(str(exc)) from None
    return [
        {"input": t["input"], "output": t["output"], "testtype": t.get("testtype", "stdin")}
        for t in stored
    ]


def _lcb_sample(spec: BenchmarkSpec, row: Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = cell_text(column_value(spec, row, fields["question"]))
    starter = cell_text(column_value(spec, row, fields["starter_code"], required=False))
    title = cell_text(column_value(spec, row, fields["title"], required=False))
    raw_meta = column_value(spec, row, fields["metadata"], required=False)
    meta: Any = raw_meta
    if isinstance(raw_meta, str):
        try:
            meta = json.loads(raw_meta) if raw_meta.strip() else {}
        except (ValueError, RecursionError):
            meta = {}
    fn_name = meta.get("func_name") if isinstance(meta, dict) else None
    public = decode_lcb_tests(column_value(spec, row, fields["public_tests"], required=False))
    private = decode_lcb_tests(column_value(spec, row, fields["private_tests"], required=False))
    if starter.strip():
        block = (
            "Complete the following starter code (keep the given signature):\n"
            f"```python\n{starter.rstrip()}\n```"
        )
    else:
        block = "Read the input from standard input and write the answer to standard output."
    metadata: dict[str, Any] = {
        "tests": public + private,
        "fn_name": fn_name or None,
        "num_public_tests": len(public),
    }
    for key in ("date", "difficulty", "platform", "contest_id"):
        if fields.get(key):
            metadata[key] = column_value(spec, row, fields[key], required=False)
    return Sample(
        id=_sample_id(spec, row, question, seen),
        input={
            "question": question,
            "title": title,
            "starter_code": starter,
            "starter_code_block": block,
        },
        gold=None,
        metadata=metadata,
    )


def _bcb_sample(spec: BenchmarkSpec, row: Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = cell_text(column_value(spec, row, fields["question"]))
    libs: Any = (
        column_value(spec, row, fields["libs"], required=False) if fields.get("libs") else None
    )
    if isinstance(libs, str):
        # The column holds a Python list literal such as "['math', 're']".
        with contextlib.suppress(ValueError, SyntaxError):
            libs = ast.literal_eval(libs)
    return Sample(
        id=_sample_id(spec, row, question, seen),
        input={
            "question": question,
            "code_prompt": cell_text(
                column_value(spec, row, fields["code_prompt"], required=False)
            ),
        },
        gold=None,
        metadata={
            "test": cell_text(column_value(spec, row, fields["test"])),
            "entry_point": cell_text(column_value(spec, row, fields["entry_point"])),
            "libs": libs,
        },
    )


#: The Sample maker of each loader, by the loader's name.
MAKERS: dict[str, SampleMaker] = {
    "choice": _choice_sample,
    "math": _math_sample,
    "livecodebench": _lcb_sample,
    "bigcodebench": _bcb_sample,
}


# ------------------------------------------------------------- what a record keeps


def hidden_tests_sha256(value: Any) -> str:
    """The SHA-256 of hidden test data (canonical JSON), kept in a record in its place."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def split_hidden(loader: str, metadata: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """A sample's ``metadata`` without its hidden tests, and the hidden tests (None when
    the loader has none).

    A graded program runs on the machine that keeps the records, so a record that held
    the expected outputs would hand them to the next program graded.  LiveCodeBench
    keeps its public tests (the examples of the problem statement, which the model reads
    in the prompt anyway, and what a reader of the record wants to see) and loses the
    private ones; BigCodebench's unittest source is never shown to the model and is
    dropped whole.
    """
    if loader == "livecodebench" and isinstance(metadata.get("tests"), list):
        tests = metadata["tests"]
        public = metadata.get("num_public_tests")
        shown = public if type(public) is int and 0 <= public <= len(tests) else 0
        return {**metadata, "tests": tests[:shown]}, tests[shown:]
    if loader == "bigcodebench" and "test" in metadata:
        kept = {k: v for k, v in metadata.items() if k != "test"}
        return kept, metadata["test"]
    return dict(metadata), None
