"""Benchmark data: read a benchmark's items as :class:`Sample` objects, one at a time.

Where the rows come from (``spec.source``, or ``data_file`` when ``--data FILE`` is
given): a Hugging Face dataset at a pinned revision (read with ``datasets``; the Arrow
file is memory-mapped and walked row by row), LiveCodeBench's release JSONL files
(fetched with ``huggingface_hub`` and read line by line), a URL (downloaded once into
the cache folder) or a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file with the
same column names as the Hugging Face schema.  JSONL, CSV and Parquet are streamed, so
a 10,000-item run never holds every item in memory.

Each loader (see :mod:`conductor.bench.spec`) turns a row into a Sample:

* ``choice``: input ``{question, choices, choices_text}`` with the options shuffled per
  (seed, sample id); gold is the correct letter; ``metadata["permutation"]`` records
  the shuffle (``shuffled[i] == original[permutation[i]]``, original index 0 = correct
  for per-option columns).
* ``math``: input ``{question}``; gold is the answer text.
* ``livecodebench``: input ``{question, title, starter_code, starter_code_block}``;
  gold None; ``metadata["tests"]`` (public then private, decoded) and ``["fn_name"]``.
* ``bigcodebench``: input ``{question, code_prompt}``; gold None; metadata ``test``,
  ``entry_point``, ``libs``.

A run record keeps a sample's metadata without its hidden tests
(:func:`recorded_metadata`): their count, SHA-256 and the dataset they are read again
from (``hidden_tests``), for :func:`reload_sample` to regrade with.

Sample ids are ``NAME/ID`` with the dataset's id column, else ``NAME/`` plus the first
16 hex digits of the question's SHA-256 (a repeated id gets ``-2``, ``-3``, ...).

Here: the public API and the row pipeline (source, unwrapping, checks, filters).  Where
rows come from is :mod:`conductor.datasets.sources`; how a row becomes a Sample, one maker
per loader, is :mod:`conductor.datasets.loaders`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..benchmark import BenchmarkSpec, DataSource, is_pinned, lcb_release_files, loader_of
from ..errors import UsageError
from ..grading.types import Sample
from ..text import check_question
from ..userfiles import is_regular, open_regular
from .columns import data_columns
from .loaders import MAKERS, cell_text, column_value, hidden_tests_sha256, math_gold, split_hidden
from .selection import selected_positions
from .sources import DataFileError, DatasetError, LocatedRow, Row, source_rows, url_cache_path

__all__ = [
    "MAX_ROW_BYTES",
    "count_samples",
    "dataset_provenance",
    "balanced_indices",
    "iter_samples",
    "recorded_metadata",
    "reload_sample",
    "render_prompt",
    "sample_subset",
    "sha256_file",
]

#: Longest line of a JSONL data file read for the question-only loaders (choice, math,
#: bigcodebench); a longer line is refused after reading this much of it, never whole.
#: LiveCodeBench rows carry their (large, encoded) test cases and have no line limit.
MAX_ROW_BYTES = 32 * 1024 * 1024


# --------------------------------------------------------------------------- public API


def iter_samples(
    spec: BenchmarkSpec,
    *,
    data_file: str | Path | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> Iterator[Sample]:
    """Yield the benchmark's samples in dataset order, lazily.

    ``data_file`` replaces ``spec.source`` with a local file in the same schema;
    ``seed`` drives the per-sample choice shuffle; ``limit`` stops after that many
    samples (after filters).
    """
    loader = loader_of(spec)
    make = MAKERS[loader]
    seen: dict[str, int] = {}
    for n, (where, row) in enumerate(_filtered_rows(spec, data_file)):
        if limit is not None and n >= limit:
            return
        with _located(where):
            sample = make(spec, row, seed, seen)
        yield sample


def count_samples(
    spec: BenchmarkSpec,
    *,
    data_file: str | Path | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> int:
    """How many samples :func:`iter_samples` would yield (rows are read, not decoded).

    Every counted row is also checked (its columns, its size, its text), so a bad row
    anywhere in the data is refused here, before a benchmark starts any call.
    """
    del seed  # the count does not depend on the shuffle
    count = 0
    for _row in _filtered_rows(spec, data_file):
        if limit is not None and count >= limit:
            break
        count += 1
    return count


def sample_subset(
    spec: BenchmarkSpec,
    *,
    data_file: str | Path | None = None,
    seed: int = 0,
    limit: int | None = None,
    balance: tuple[str, ...] | None = None,
) -> list[Sample]:
    """A seeded sample of at most ``limit`` of the benchmark's samples, in dataset order.

    Unlike ``iter_samples(limit=N)`` (the first N rows), the rows are drawn at random
    with ``random.Random(seed)`` and spread as evenly as the data allows over the groups
    formed by the ``balance`` fields (default: the source's ``balance``), e.g. MATH's
    subject and level; see :func:`balanced_indices`.  Without ``limit`` every sample is
    returned.  The data is read twice (once for the groups, once for the chosen rows),
    so that only the chosen rows are ever decoded.
    """
    keys_of = spec.source.balance if balance is None else balance
    if limit is None:
        return list(iter_samples(spec, data_file=data_file, seed=seed))
    columns = [spec.fields[k] for k in keys_of if k in spec.fields]
    groups: list[tuple[str, ...]] = []
    for _where, row in _filtered_rows(spec, data_file):
        groups.append(tuple(cell_text(column_value(spec, row, c, required=False)) for c in columns))
    chosen = set(balanced_indices(groups, limit, seed))
    loader = loader_of(spec)
    make = MAKERS[loader]
    seen: dict[str, int] = {}
    out: list[Sample] = []
    for n, (where, row) in enumerate(_filtered_rows(spec, data_file)):
        if n in chosen:
            with _located(where):
                out.append(make(spec, row, seed, seen))
    return out


def balanced_indices(groups: list[tuple[str, ...]], limit: int, seed: int) -> list[int]:
    """Positions of at most ``limit`` items, spread evenly over their groups, sorted.

    ``groups[i]`` is item i's group.  Each group gets an equal share; a group with fewer
    items than its share gives all it has and the rest is shared among the others
    (so the result has ``min(limit, len(groups))`` items).  The groups that receive
    the remainder, and the items within each group, are drawn with
    ``random.Random(seed)``: the same inputs always give the same positions.
    """
    rng = random.Random(seed)
    members: dict[tuple[str, ...], list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    order = sorted(members)
    quota = dict.fromkeys(order, 0)
    left = min(limit, len(groups))
    open_groups = list(order)
    while left > 0 and open_groups:
        share, extra = divmod(left, len(open_groups))
        lucky = set(rng.sample(open_groups, extra)) if extra else set()
        for key in open_groups:
            quota[key] += share + (1 if key in lucky else 0)
        # Give back what a small group cannot use, and share it again.
        left = 0
        for key in open_groups:
            surplus = quota[key] - len(members[key])
            if surplus > 0:
                quota[key] -= surplus
                left += surplus
        open_groups = [k for k in open_groups if quota[k] < len(members[k])]
    picked: list[int] = []
    for key in order:
        picked.extend(rng.sample(members[key], quota[key]))
    return sorted(picked)


def render_prompt(spec: BenchmarkSpec, sample: Sample) -> str:
    """The benchmark's prompt template filled with ``sample.input``.

    Only the template is parsed: the values are inserted as they are, so ``$``, ``{}``
    or ``${x}`` inside a question stay literal text.
    """
    values = {key: _prompt_text(value) for key, value in sample.input.items()}
    try:
        return string.Template(spec.prompt).substitute(values)
    except KeyError as exc:
        raise UsageError(
            f"benchmark {spec.name}: the prompt uses ${{{exc.args[0]}}} but sample "
            f"{sample.id} has no such input (it has: {', '.join(sorted(values))})"
        ) from None
    except ValueError as exc:
        raise UsageError(f"benchmark {spec.name}: bad prompt template: {exc}") from None


def _prompt_text(value: Any) -> str:
    """A sample input as the prompt shows it: lists and mappings as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def dataset_provenance(spec: BenchmarkSpec, data_file: str | Path | None = None) -> dict[str, Any]:
    """What a run record should say about where its questions came from.

    Dataset id, revision (and whether it is a pinned commit), config, split, the
    LiveCodeBench release, a local file's path and SHA-256, the prompt template's
    SHA-256, the benchmark file's SHA-256 and the filters.
    """
    source = _effective_source(spec, data_file)
    out: dict[str, Any] = {
        "benchmark": spec.name,
        "benchmark_file": str(spec.path) if spec.path is not None else None,
        "benchmark_file_sha256": (
            sha256_file(spec.path) if spec.path is not None and is_regular(spec.path) else None
        ),
        "loader": loader_of(spec),
        "source_kind": source.kind,
        "dataset_id": source.id,
        "revision": source.revision,
        "pinned": is_pinned(source),
        "config": source.config,
        "split": source.split,
        "url": source.url,
        "file": None,
        "file_sha256": None,
        "template_sha256": hashlib.sha256(spec.prompt.encode("utf-8")).hexdigest(),
        "filters": dict(spec.filters),
        "select": source.select.to_dict() if source.select is not None else None,
    }
    if loader_of(spec) == "livecodebench" and source.kind == "hf":
        out["release"] = spec.fields.get("release")
        out["release_files"] = list(lcb_release_files(spec.fields.get("release", "")) or ())
    if source.kind == "file" and source.path is not None:
        path = Path(source.path)
        out["file"] = str(path.resolve())
        out["file_sha256"] = sha256_file(path) if is_regular(path) else None
    elif source.kind == "url" and source.url is not None:
        cached = url_cache_path(source.url)
        if cached.is_file():
            out["file"] = str(cached)
            out["file_sha256"] = sha256_file(cached)
    return out


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a regular file, read in 1 MiB blocks (anything else is refused as
    :func:`~conductor.userfiles.open_regular` refuses it)."""
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- rows


def recorded_metadata(
    spec: BenchmarkSpec, sample: Sample, data_file: str | Path | None = None
) -> dict[str, Any]:
    """What a run record keeps of ``sample.metadata``: all of it but the hidden tests
    (:func:`~conductor.datasets.loaders.split_hidden`), which are replaced by
    ``hidden_tests``: their count, SHA-256 and where they are read again from (the
    dataset id, revision, config and split, or the file; and the sample id)."""
    kept, hidden = split_hidden(loader_of(spec), sample.metadata)
    if hidden is None:
        return kept
    source = _effective_source(spec, data_file)
    kept["hidden_tests"] = {
        "count": len(hidden) if isinstance(hidden, list) else None,
        "sha256": hidden_tests_sha256(hidden),
        "source": {
            "kind": source.kind,
            "dataset_id": source.id,
            "revision": source.revision,
            "config": source.config,
            "split": source.split,
            "url": source.url,
            "file": str(Path(source.path).resolve()) if source.path else None,
            "sample_id": sample.id,
        },
    }
    return kept


def _named_source(ref: dict[str, Any]) -> str:
    if ref.get("file"):
        return str(ref["file"])
    if ref.get("url"):
        return str(ref["url"])
    revision = f"@{ref['revision']}" if ref.get("revision") else ""
    return f"{ref.get('dataset_id')}{revision} (split {ref.get('split')})"


def reload_sample(
    spec: BenchmarkSpec, hidden_tests: dict[str, Any], *, data_file: str | Path | None = None
) -> Sample:
    """The sample a record's ``hidden_tests`` (see :func:`recorded_metadata`) names, read
    again from its dataset (or ``data_file``, a local copy), with the hidden tests the
    record was graded with: what regrading a record needs.

    Raises :class:`DatasetError` saying where the tests are read from and what to do
    when that data cannot be read, holds no such sample, or holds other tests than the
    record's SHA-256 (the data changed since).
    """
    ref = hidden_tests.get("source") if isinstance(hidden_tests, dict) else None
    if not isinstance(ref, dict) or not isinstance(ref.get("sample_id"), str):
        raise DatasetError("the record names no dataset to read its hidden tests from")
    sample_id = ref["sample_id"]
    where = str(Path(data_file).expanduser()) if data_file is not None else _named_source(ref)
    if data_file is None and ref.get("kind") == "file" and ref.get("file"):
        data_file = ref["file"]
    try:
        found = next(
            (s for s in iter_samples(spec, data_file=data_file) if s.id == sample_id), None
        )
    except (DatasetError, OSError, UsageError) as exc:
        raise DatasetError(
            f"the hidden tests of {sample_id} are not kept in run records and are read "
            f"from {where}, which cannot be read ({exc}); pass --data FILE with a copy of "
            "the data, or download it"
        ) from None
    if found is None:
        raise DatasetError(f"{where} holds no sample {sample_id}: its hidden tests cannot be read")
    _kept, hidden = split_hidden(loader_of(spec), found.metadata)
    if hidden_tests_sha256(hidden) != hidden_tests.get("sha256"):
        raise DatasetError(
            f"{where}: the hidden tests of {sample_id} differ from those its record was "
            "graded with (SHA-256); the data changed since the run"
        )
    return found


def _effective_source(spec: BenchmarkSpec, data_file: str | Path | None) -> DataSource:
    if data_file is None:
        return spec.source
    # A local copy of the dataset holds all of its rows: the same part is selected.
    return DataSource(
        kind="file",
        path=str(Path(data_file).expanduser()),
        split="local",
        select=spec.source.select,
    )


@contextlib.contextmanager
def _located(where: str) -> Iterator[None]:
    """Say which row a data error is about (``FILE:LINE: ...``), and make it exit 2."""
    try:
        yield
    except DataFileError as exc:
        raise DataFileError(f"{where}: {exc}") from None
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None


def _filtered_rows(spec: BenchmarkSpec, data_file: str | Path | None) -> Iterator[LocatedRow]:
    """The rows that pass the filters, and of them the selected part, in dataset order."""
    source = _effective_source(spec, data_file)
    if source.select is None:
        yield from _kept_rows(spec, source)
        return
    # The selection's positions are among the filtered rows (the authors filtered
    # first), so they are counted in a first pass; only positions are held, no rows.
    n = sum(1 for _ in _kept_rows(spec, source))
    chosen = set(selected_positions(source.select, n))
    for i, located in enumerate(_kept_rows(spec, source)):
        if i in chosen:
            yield located


def _kept_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[LocatedRow]:
    keep = _row_filter(spec)
    required = _required_columns(spec)
    for where, row in _rows(spec, source):
        with _located(where):
            _check_row(spec, row, required)
            wanted = keep(row)
        if wanted:
            yield where, row


def _required_columns(spec: BenchmarkSpec) -> list[str]:
    """The columns every row must have for its loader, the question's first."""
    return list(data_columns(spec).required)


def _check_row(spec: BenchmarkSpec, row: Row, required: list[str]) -> None:
    """Refuse a row without a required column, or whose question cannot be sent."""
    for column in required:
        column_value(spec, row, column)
    question = column_value(spec, row, required[0])
    if isinstance(question, str):
        try:
            check_question(question)
        except UsageError as exc:
            raise DataFileError(str(exc)) from None


def _rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[LocatedRow]:
    rows = _source_rows(spec, source)
    if source.row is None:
        return rows
    return _unwrapped(rows, source.row)


def _unwrapped(rows: Iterator[LocatedRow], column: str) -> Iterator[LocatedRow]:
    # e.g. cais/mmlu's auxiliary_train config holds each row under a "train" column.
    for where, row in rows:
        inner = row.get(column)
        if not isinstance(inner, dict):
            raise DataFileError(
                f"{where}: the source says each row is under column {column!r}, but "
                f"that column is {'missing' if inner is None else 'not a mapping'}"
            )
        yield where, inner


def _source_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[LocatedRow]:
    # Read here, at call time: a test may lower the limit.
    max_line = None if loader_of(spec) == "livecodebench" else MAX_ROW_BYTES
    return source_rows(spec, source, max_line)


# --------------------------------------------------------------------------- filters


def _row_filter(spec: BenchmarkSpec) -> Any:
    f = spec.filters
    fields = spec.fields
    checks: list[Any] = []
    if "subjects" in f:
        wanted = {str(s) for s in f["subjects"]}
        col = fields["subject"]
        checks.append(lambda row: str(column_value(spec, row, col)) in wanted)
    if "levels" in f:
        levels = {str(v) for v in f["levels"]}
        col = fields["level"]
        checks.append(lambda row: str(column_value(spec, row, col)) in levels)
    if loader_of(spec) == "math" and "answer" not in fields:
        # A worked solution without a boxed answer cannot be graded: leave the row out.
        from ..grading.extract import last_boxed

        col = fields["solution"]
        checks.append(lambda row: last_boxed(cell_text(column_value(spec, row, col))) is not None)
    if "max_answer_chars" in f:
        most = int(f["max_answer_chars"])
        checks.append(lambda row: len(_answer_as_given(spec, row)) <= most)
    lo, hi = f.get("contest_date_from"), f.get("contest_date_to")
    if lo or hi:
        col = fields["date"]

        def in_window(row: Row) -> bool:
            day = str(column_value(spec, row, col))[:10]
            return (not lo or day >= lo) and (not hi or day <= hi)

        checks.append(in_window)
    if "difficulties" in f:
        difficulties = {str(v).lower() for v in f["difficulties"]}
        col = fields["difficulty"]
        checks.append(lambda row: str(column_value(spec, row, col)).lower() in difficulties)
    if "platforms" in f:
        platforms = {str(v).lower() for v in f["platforms"]}
        col = fields["platform"]
        checks.append(lambda row: str(column_value(spec, row, col)).lower() in platforms)
    return lambda row: all(check(row) for check in checks)


def _answer_as_given(spec: BenchmarkSpec, row: Row) -> str:
    """The answer the ``max_answer_chars`` filter measures: an answer column's text as
    the dataset holds it, spaces included (as the RLPR loader of the paper's authors
    measured it, so that the same rows pass), else the solution's boxed answer."""
    if "answer" in spec.fields:
        return cell_text(column_value(spec, row, spec.fields["answer"]))
    return math_gold(spec, row)
