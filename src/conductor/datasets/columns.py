"""The columns a data file needs for a benchmark (``--data FILE``, or its own source).

:func:`data_columns` is the one statement of what each loader reads: the loaders check
rows against it, the missing-data error names it, and the README's table is made from
it (:func:`conductor.bench.spec.data_columns_table`, printed by ``python -m conductor.bench.spec
--readme-table``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..benchmark import INCORRECT_RE, BenchmarkSpec, loader_of

__all__ = ["DataColumns", "data_columns"]


@dataclass(frozen=True)
class DataColumns:
    """The columns a data file for one benchmark holds, named as its ``fields`` name
    them (a nested path such as ``prompt[role=user].content`` is one column here).

    ``required``: a row without one is refused (the question's column first);
    ``optional``: read when present (ids, metadata, tests...)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]

    def describe(self) -> str:
        """One clause for an error message: ``columns a, b (optional: c, d)``."""
        text = "columns " + ", ".join(self.required)
        if self.optional:
            text += f" (optional: {', '.join(self.optional)})"
        return text


#: The field keys whose filter makes the column required (a row is tested on it).
_FILTER_FIELDS: dict[str, str] = {
    "subjects": "subject",
    "levels": "level",
    "contest_date_from": "date",
    "contest_date_to": "date",
    "difficulties": "difficulty",
    "platforms": "platform",
}


def data_columns(spec: BenchmarkSpec) -> DataColumns:
    """The columns a ``--data`` file (or the benchmark's own source) needs for ``spec``.

    The one statement of what each loader reads: the loaders check rows against
    ``required``, the missing-data error names both lists, and the README's table is
    made from them (:func:`data_columns_table`)."""
    fields = spec.fields
    loader = loader_of(spec)
    if loader == "choice":
        if "choices" in fields:
            keys = ["question", "choices", "answer"]
        else:
            wrong = sorted((k for k in fields if INCORRECT_RE.match(k)), key=lambda k: int(k[10:]))
            keys = ["question", "correct", *wrong]
    elif loader == "math":
        keys = ["question", "answer" if "answer" in fields else "solution"]
    elif loader == "bigcodebench":
        keys = ["question", "test", "entry_point"]
    else:
        keys = ["question"]
    keys += [_FILTER_FIELDS[f] for f in spec.filters if f in _FILTER_FIELDS]
    required = list(dict.fromkeys(fields[k] for k in keys if k in fields))
    # Keys that name no column: the loader's name, LiveCodeBench's release, and (for
    # math) the unused one of answer / solution; the choice keys of the other layout.
    skip = {"loader", "release", *keys}
    if loader == "math":
        skip |= {"solution" if "answer" in fields else "answer", "metadata"}
    if loader == "choice":
        skip |= (
            {"correct", *(k for k in fields if INCORRECT_RE.match(k))}
            if "choices" in fields
            else {"choices", "answer"}
        )
    optional = [fields[k] for k in fields if k not in skip]
    if loader == "math":
        # math's metadata is a comma-separated list of columns copied into the sample.
        optional += [c.strip() for c in fields.get("metadata", "").split(",") if c.strip()]
    return DataColumns(
        required=tuple(required),
        optional=tuple(c for c in dict.fromkeys(optional) if c not in required),
    )
