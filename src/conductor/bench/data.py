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

Sample ids are ``NAME/ID`` with the dataset's id column, else ``NAME/`` plus the first
16 hex digits of the question's SHA-256 (a repeated id gets ``-2``, ``-3``, ...).
"""

from __future__ import annotations

import ast
import contextlib
import csv
import functools
import hashlib
import importlib
import json
import logging
import os
import random
import re
import socket
import string
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConductorError, MissingDependencyError, UsageError
from ..text import check_question
from . import lcb_tests
from .spec import DATA_FORMATS, data_columns, is_pinned, lcb_release_files, loader_of
from .types import BenchmarkSpec, DataSource, Sample

__all__ = [
    "MAX_ROW_BYTES",
    "DataFileError",
    "DatasetError",
    "count_samples",
    "dataset_provenance",
    "decode_lcb_tests",
    "balanced_indices",
    "iter_samples",
    "render_prompt",
    "sample_subset",
    "sha256_file",
]

# One dataset row: column name -> value.
_Row = dict[str, Any]
# A row and where it is ("FILE:LINE", "DATASET (split) row N"), for error messages.
_LocatedRow = tuple[str, _Row]

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class DatasetError(ConductorError):
    """A benchmark's data cannot be read (not downloadable, bad file, missing column)."""


class DataFileError(DatasetError, UsageError):
    """The data is there but not usable as given (a missing column, text that is not
    UTF-8, a row or question over the size limits): bad input, CLI exit code 2."""


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
    make = _MAKERS[loader]
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
        groups.append(tuple(_text(_get(spec, row, c, required=False)) for c in columns))
    chosen = set(balanced_indices(groups, limit, seed))
    loader = loader_of(spec)
    make = _MAKERS[loader]
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
    values = {key: _as_text(value) for key, value in sample.input.items()}
    try:
        return string.Template(spec.prompt).substitute(values)
    except KeyError as exc:
        raise UsageError(
            f"benchmark {spec.name}: the prompt uses ${{{exc.args[0]}}} but sample "
            f"{sample.id} has no such input (it has: {', '.join(sorted(values))})"
        ) from None
    except ValueError as exc:
        raise UsageError(f"benchmark {spec.name}: bad prompt template: {exc}") from None


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
            sha256_file(spec.path) if spec.path is not None and spec.path.is_file() else None
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
    }
    if loader_of(spec) == "livecodebench" and source.kind == "hf":
        out["release"] = spec.fields.get("release")
        out["release_files"] = list(lcb_release_files(spec.fields.get("release", "")) or ())
    if source.kind == "file" and source.path is not None:
        path = Path(source.path)
        out["file"] = str(path.resolve())
        out["file_sha256"] = sha256_file(path) if path.is_file() else None
    elif source.kind == "url" and source.url is not None:
        cached = _url_cache_path(source.url)
        if cached.is_file():
            out["file"] = str(cached)
            out["file_sha256"] = sha256_file(cached)
    return out


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- rows


def _effective_source(spec: BenchmarkSpec, data_file: str | Path | None) -> DataSource:
    if data_file is None:
        return spec.source
    return DataSource(kind="file", path=str(Path(data_file).expanduser()), split="local")


@contextlib.contextmanager
def _located(where: str) -> Iterator[None]:
    """Say which row a data error is about (``FILE:LINE: ...``), and make it exit 2."""
    try:
        yield
    except DataFileError as exc:
        raise DataFileError(f"{where}: {exc}") from None
    except DatasetError as exc:
        raise DatasetError(f"{where}: {exc}") from None


def _filtered_rows(spec: BenchmarkSpec, data_file: str | Path | None) -> Iterator[_LocatedRow]:
    keep = _row_filter(spec)
    required = _required_columns(spec)
    for where, row in _rows(spec, _effective_source(spec, data_file)):
        with _located(where):
            _check_row(spec, row, required)
            wanted = keep(row)
        if wanted:
            yield where, row


def _required_columns(spec: BenchmarkSpec) -> list[str]:
    """The columns every row must have for its loader, the question's first."""
    return list(data_columns(spec).required)


def local_copy_hint(spec: BenchmarkSpec) -> str:
    """How to run ``spec`` without its source: ``--data FILE``, with the columns and the
    formats such a file needs (the end of every "cannot load" message)."""
    formats = ", ".join(DATA_FORMATS[:-1]) + f" or {DATA_FORMATS[-1]}"
    return (
        f"pass --data FILE with a local copy: a {formats} file with {data_columns(spec).describe()}"
    )


def _check_row(spec: BenchmarkSpec, row: _Row, required: list[str]) -> None:
    """Refuse a row without a required column, or whose question cannot be sent."""
    for column in required:
        _get(spec, row, column)
    question = _get(spec, row, required[0])
    if isinstance(question, str):
        try:
            check_question(question)
        except UsageError as exc:
            raise DataFileError(str(exc)) from None


def _rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[_LocatedRow]:
    rows = _source_rows(spec, source)
    if source.row is None:
        return rows
    return _unwrapped(rows, source.row)


def _unwrapped(rows: Iterator[_LocatedRow], column: str) -> Iterator[_LocatedRow]:
    # e.g. cais/mmlu's auxiliary_train config holds each row under a "train" column.
    for where, row in rows:
        inner = row.get(column)
        if not isinstance(inner, dict):
            raise DataFileError(
                f"{where}: the source says each row is under column {column!r}, but "
                f"that column is {'missing' if inner is None else 'not a mapping'}"
            )
        yield where, inner


def _source_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[_LocatedRow]:
    max_line = None if loader_of(spec) == "livecodebench" else MAX_ROW_BYTES
    if source.kind == "file":
        assert source.path is not None
        return _file_rows(Path(source.path), max_line)
    if source.kind == "url":
        assert source.url is not None
        return _file_rows(_download(spec, source.url), max_line)
    if loader_of(spec) == "livecodebench":
        return _lcb_hub_rows(spec, source)
    return _hf_rows(spec, source)


def _file_rows(path: Path, max_line: int | None) -> Iterator[_LocatedRow]:
    if not path.is_file():
        raise UsageError(f"{path}: no such data file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_rows(path, max_line)
    if suffix == ".json":
        return _json_rows(path)
    if suffix == ".csv":
        return _csv_rows(path, max_line)
    if suffix == ".parquet":
        return _parquet_rows(path)
    raise UsageError(f"{path}: data files must be .jsonl, .json, .csv or .parquet")


def _not_utf8(where: str, exc: UnicodeDecodeError) -> DataFileError:
    return DataFileError(
        f"{where}: is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
        f"{exc.start}); save the data file as UTF-8"
    )


def _jsonl_rows(path: Path, max_line: int | None = None) -> Iterator[_LocatedRow]:
    # Bytes, line by line, with a cap: a huge line is refused after reading at most
    # ``max_line`` bytes of it instead of being held (and copied) whole.
    with open(path, "rb") as fh:
        lineno = 0
        while True:
            raw = fh.readline(max_line + 1) if max_line is not None else fh.readline()
            if not raw:
                return
            lineno += 1
            if max_line is not None and len(raw) > max_line and not raw.endswith(b"\n"):
                raise DataFileError(
                    f"{path}:{lineno}: the line is longer than {max_line:,} bytes; "
                    "a data row must be smaller (split long texts into several rows)"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(f"{path}:{lineno}", exc) from None
            del raw
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise DataFileError(f"{path}:{lineno}: JSON nested too deeply") from None
            del line
            if not isinstance(row, dict):
                raise UsageError(f"{path}:{lineno}: each line must be a JSON object")
            yield f"{path}:{lineno}", row


def _json_rows(path: Path) -> Iterator[_LocatedRow]:
    # A JSON array has to be parsed whole; use JSONL for large sets.
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise _not_utf8(str(path), exc) from None
    except RecursionError:
        raise DataFileError(f"{path}: JSON nested too deeply") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise UsageError(f"{path}: a .json data file must hold a list of objects")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise UsageError(f"{path}: item {i} is not a JSON object")
        yield f"{path}: item {i}", row


def _csv_rows(path: Path, max_field: int | None = None) -> Iterator[_LocatedRow]:
    # Some benchmark cells are long (whole problem statements with code), but a cell
    # over the row limit is refused as soon as the reader sees it is too long.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1, max_field or sys.maxsize))
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:
                raise _not_utf8(f"{path}:{reader.line_num + 1}", exc) from None
            except csv.Error as exc:
                raise UsageError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
            yield f"{path}:{reader.line_num}", row


def _parquet_rows(path: Path) -> Iterator[_LocatedRow]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError(
            "reading .parquet data needs pyarrow: pip install 'datasets>=3,<5'"
        ) from None
    parquet = pq.ParquetFile(path)
    n = 0
    for batch in parquet.iter_batches(batch_size=64):
        for row in batch.to_pylist():
            yield f"{path}: row {n}", row
            n += 1


#: How long the reachability check waits for the Hub to accept a connection.
HUB_PROBE_TIMEOUT_S = 5.0
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _hub_unreachable() -> str | None:
    """Why the Hugging Face Hub cannot be reached (offline mode is set, its host does
    not resolve, refuses or does not answer), or None when it may be.

    Without this, a load with no network spends ~25 s in the hub library's own retries
    (six log lines) before failing.  One TCP connection to the endpoint answers the
    question in a fraction of that; behind a proxy the endpoint is not reached directly,
    so nothing is concluded and the load goes ahead as it is.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or _datasets_offline():
        return "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return None
    return _probe(constants.ENDPOINT)


def _datasets_offline() -> bool:
    try:
        from datasets import config
    except ImportError:
        return False
    return bool(config.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=8)
def _probe(endpoint: str) -> str | None:
    # Cached: a run reads its data more than once (count, then samples), and the answer
    # does not change within one command.
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except socket.gaierror:
        return f"cannot resolve {host}"
    except ConnectionRefusedError:
        return f"{host}:{port} refused the connection"
    except TimeoutError:
        return f"{host}:{port} did not answer within {HUB_PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"cannot reach {host}:{port} ({exc.strerror or exc})"


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """The hub libraries in offline mode (cached copies only, no request, no retry) and
    quiet (their warnings would repeat our one error), for a load known to have no
    network.  Both read these flags at call time; they are restored afterwards."""
    from huggingface_hub import constants

    config: Any = None
    with contextlib.suppress(ImportError):  # LiveCodeBench needs huggingface_hub alone
        config = importlib.import_module("datasets.config")
    saved = (constants.HF_HUB_OFFLINE, config.HF_HUB_OFFLINE if config else None)
    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [lg.level for lg in loggers]
    constants.HF_HUB_OFFLINE = True
    if config is not None:
        config.HF_HUB_OFFLINE = True
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved[0]
        if config is not None:
            config.HF_HUB_OFFLINE = saved[1]
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _hf_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[_LocatedRow]:
    try:
        import datasets
    except ImportError:
        raise MissingDependencyError(
            f"loading {source.id} needs the datasets library: pip install 'datasets>=3,<5' "
            f"(or {local_copy_hint(spec)})"
        ) from None
    config = f"config {source.config}, " if source.config else ""
    where = f"{source.id} ({config}split {source.split}, revision {source.revision})"
    offline = _hub_unreachable()
    try:
        with _hub_offline() if offline else contextlib.nullcontext():
            ds = datasets.load_dataset(
                source.id, source.config, split=source.split, revision=source.revision
            )
    except Exception as exc:  # datasets raises many kinds; all mean "cannot load"
        if offline:
            raise DatasetError(
                f"cannot load {where}: the Hugging Face Hub is out of reach ({offline}) and "
                f"no copy is cached; {local_copy_hint(spec)}"
            ) from None
        raise DatasetError(
            f"cannot load {where}: {type(exc).__name__}: {exc}; {local_copy_hint(spec)}"
        ) from None
    # Row by row over the memory-mapped Arrow table: nothing is copied up front.
    for n, row in enumerate(ds):
        yield f"{source.id} ({source.split}) row {n}", dict(row)


def _lcb_hub_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[_LocatedRow]:
    # code_generation_lite is a script dataset, which datasets 4 no longer runs, so its
    # release files are fetched directly and read as JSONL.
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise MissingDependencyError(
            "loading LiveCodeBench needs huggingface_hub: pip install 'datasets>=3,<5' "
            f"(or {local_copy_hint(spec)})"
        ) from None
    files = lcb_release_files(spec.fields.get("release", "release_v6")) or ()
    offline = _hub_unreachable()
    for name in files:
        try:
            with _hub_offline() if offline else contextlib.nullcontext():
                local = hf_hub_download(
                    source.id or "", name, repo_type="dataset", revision=source.revision
                )
        except Exception as exc:  # offline, missing file, auth: all mean "cannot load"
            why = (
                f"the Hugging Face Hub is out of reach ({offline}) and no copy is cached"
                if offline
                else f"{type(exc).__name__}: {exc}"
            )
            raise DatasetError(
                f"cannot download {name} of {source.id} (revision {source.revision}): "
                f"{why}; {local_copy_hint(spec)}"
            ) from None
        yield from _jsonl_rows(Path(local))


def _url_cache_path(url: str) -> Path:
    base = os.environ.get("CONDUCTOR_DATA_DIR")
    if base:
        folder = Path(base)
    else:
        from platformdirs import user_cache_dir

        folder = Path(user_cache_dir("conductor")) / "data"
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    return folder / f"{digest}-{name}"


def _download(spec: BenchmarkSpec, url: str) -> Path:
    target = _url_cache_path(url)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".part{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(partial, "wb") as out:
            while block := resp.read(1 << 20):
                out.write(block)
        partial.replace(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DatasetError(f"cannot download {url}: {exc}; {local_copy_hint(spec)}") from None
    return target


# --------------------------------------------------------------------------- filters


def _row_filter(spec: BenchmarkSpec) -> Any:
    f = spec.filters
    fields = spec.fields
    checks: list[Any] = []
    if "subjects" in f:
        wanted = {str(s) for s in f["subjects"]}
        col = fields["subject"]
        checks.append(lambda row: str(_get(spec, row, col)) in wanted)
    if "levels" in f:
        levels = {str(v) for v in f["levels"]}
        col = fields["level"]
        checks.append(lambda row: str(_get(spec, row, col)) in levels)
    if loader_of(spec) == "math" and "answer" not in fields:
        # A worked solution without a boxed answer cannot be graded: leave the row out.
        from .graders.extract import last_boxed

        col = fields["solution"]
        checks.append(lambda row: last_boxed(_text(_get(spec, row, col))) is not None)
    if "max_answer_chars" in f:
        most = int(f["max_answer_chars"])
        checks.append(lambda row: len(_math_gold(spec, row)) <= most)
    lo, hi = f.get("contest_date_from"), f.get("contest_date_to")
    if lo or hi:
        col = fields["date"]

        def in_window(row: _Row) -> bool:
            day = str(_get(spec, row, col))[:10]
            return (not lo or day >= lo) and (not hi or day <= hi)

        checks.append(in_window)
    if "difficulties" in f:
        difficulties = {str(v).lower() for v in f["difficulties"]}
        col = fields["difficulty"]
        checks.append(lambda row: str(_get(spec, row, col)).lower() in difficulties)
    if "platforms" in f:
        platforms = {str(v).lower() for v in f["platforms"]}
        col = fields["platform"]
        checks.append(lambda row: str(_get(spec, row, col)).lower() in platforms)
    return lambda row: all(check(row) for check in checks)


# --------------------------------------------------------------------------- loaders


#: One step of a column path: ``.key``, ``[3]`` / ``[-1]`` or ``[role=user]``.
_PATH_STEP = re.compile(r"\.?([^.\[\]]+)|\[(-?\d+)\]|\[([^=\]]+)=([^\]]*)\]")


def _path_value(row: _Row, column: str) -> tuple[bool, Any]:
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


def _get(spec: BenchmarkSpec, row: _Row, column: str, *, required: bool = True) -> Any:
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


def _sample_id(spec: BenchmarkSpec, row: _Row, question: str, seen: dict[str, int]) -> str:
    col = spec.fields.get("id")
    raw = _get(spec, row, col, required=False) if col else None
    local = str(raw).strip() if raw is not None and str(raw).strip() else _question_hash(question)
    sid = f"{spec.name}/{local}"
    # A repeated id (duplicated questions, say) keeps runs resumable by its position.
    count = seen.get(sid, 0) + 1
    seen[sid] = count
    return sid if count == 1 else f"{sid}-{count}"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _maybe_json_list(value: Any) -> Any:
    # CSV cells hold lists as JSON text.
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _choice_sample(spec: BenchmarkSpec, row: _Row, seed: int, seen: dict[str, int]) -> Sample:
    from .graders import choice as choice_grader

    fields = spec.fields
    question = _text(_get(spec, row, fields["question"]))
    if "choices" in fields:
        options = _maybe_json_list(_get(spec, row, fields["choices"]))
        if not isinstance(options, (list, tuple)) or len(options) < 2:
            raise DatasetError(
                f"benchmark {spec.name}: column {fields['choices']!r} must hold a list of "
                f"at least two options, got {options!r:.80}"
            )
        options = [_text(o) for o in options]
        correct = _answer_index(spec, _get(spec, row, fields["answer"]), len(options))
    else:
        wrong_keys = sorted(
            (k for k in fields if k.startswith("incorrect_")), key=lambda k: int(k[10:])
        )
        options = [_text(_get(spec, row, fields["correct"]))]
        options += [_text(_get(spec, row, fields[k])) for k in wrong_keys]
        correct = 0
    sid = _sample_id(spec, row, question, seen)
    shuffled, gold, permutation = choice_grader.shuffle_choices(options, correct, seed, sid)
    metadata: dict[str, Any] = {
        "permutation": list(permutation),
        "correct_text": options[correct],
        "seed": seed,
    }
    if fields.get("subject"):
        metadata["subject"] = _get(spec, row, fields["subject"], required=False)
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


def _math_sample(spec: BenchmarkSpec, row: _Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = _text(_get(spec, row, fields["question"]))
    metadata: dict[str, Any] = {}
    for key in ("subject", "level"):
        if fields.get(key):
            metadata[key] = _get(spec, row, fields[key], required=False)
    for col in (c.strip() for c in fields.get("metadata", "").split(",")):
        if col:
            metadata[col] = _get(spec, row, col, required=False)
    return Sample(
        id=_sample_id(spec, row, question, seen),
        input={"question": question},
        gold=_math_gold(spec, row),
        metadata=metadata,
    )


def _math_gold(spec: BenchmarkSpec, row: _Row) -> str:
    """The answer column's text, else the last ``\\boxed{}`` of the solution column."""
    fields = spec.fields
    if "answer" in fields:
        return _text(_get(spec, row, fields["answer"])).strip()
    from .graders.extract import last_boxed

    solution = _text(_get(spec, row, fields["solution"]))
    boxed = last_boxed(solution)
    if boxed is None:
        raise DataFileError(
            f"benchmark {spec.name}: the solution in column {fields['solution']!r} has no "
            "\\boxed{...} answer"
        )
    return boxed


def decode_lcb_tests(value: Any) -> list[dict[str, Any]]:
    """LiveCodeBench test cases from a column value, decoded safely (see
    :mod:`conductor.bench.lcb_tests`): ``[{"input", "output", "testtype"}, ...]``, the
    test type ``stdin`` where the row gives none.  Raises :class:`DatasetError` when the
    value is unreadable.
    """
    try:
        stored = lcb_tests.decode_lcb_tests(value)
    except ValueError as exc:
        raise DatasetError(str(exc)) from None
    return [
        {"input": t["input"], "output": t["output"], "testtype": t.get("testtype", "stdin")}
        for t in stored
    ]


def _lcb_sample(spec: BenchmarkSpec, row: _Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = _text(_get(spec, row, fields["question"]))
    starter = _text(_get(spec, row, fields["starter_code"], required=False))
    title = _text(_get(spec, row, fields["title"], required=False))
    raw_meta = _get(spec, row, fields["metadata"], required=False)
    meta: Any = raw_meta
    if isinstance(raw_meta, str):
        try:
            meta = json.loads(raw_meta) if raw_meta.strip() else {}
        except json.JSONDecodeError:
            meta = {}
    fn_name = meta.get("func_name") if isinstance(meta, dict) else None
    public = decode_lcb_tests(_get(spec, row, fields["public_tests"], required=False))
    private = decode_lcb_tests(_get(spec, row, fields["private_tests"], required=False))
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
            metadata[key] = _get(spec, row, fields[key], required=False)
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


def _bcb_sample(spec: BenchmarkSpec, row: _Row, seed: int, seen: dict[str, int]) -> Sample:
    fields = spec.fields
    question = _text(_get(spec, row, fields["question"]))
    libs: Any = _get(spec, row, fields["libs"], required=False) if fields.get("libs") else None
    if isinstance(libs, str):
        # The column holds a Python list literal such as "['math', 're']".
        with contextlib.suppress(ValueError, SyntaxError):
            libs = ast.literal_eval(libs)
    return Sample(
        id=_sample_id(spec, row, question, seen),
        input={
            "question": question,
            "code_prompt": _text(_get(spec, row, fields["code_prompt"], required=False)),
        },
        gold=None,
        metadata={
            "test": _text(_get(spec, row, fields["test"])),
            "entry_point": _text(_get(spec, row, fields["entry_point"])),
            "libs": libs,
        },
    )


_MAKERS = {
    "choice": _choice_sample,
    "math": _math_sample,
    "livecodebench": _lcb_sample,
    "bigcodebench": _bcb_sample,
}
