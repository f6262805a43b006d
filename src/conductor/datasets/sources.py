"""Where a benchmark's rows come from: local files (JSONL, JSON, CSV, Parquet, streamed),
the Hugging Face Hub (a pinned dataset, or LiveCodeBench's release files), and URLs
downloaded once into the cache folder; the errors a data source raises; and the hint
every "cannot load" message ends with (:func:`local_copy_hint`).

Each source yields located rows (:data:`LocatedRow`): ``(where, row)``, ``where`` being
``FILE:LINE`` or ``DATASET (split) row N`` for error messages.  :func:`source_rows` reads
a :class:`~conductor.benchmark.DataSource` of any kind, :func:`file_rows` a local file,
and :func:`url_cache_path` says where a URL's download is kept.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import importlib
import logging
import os
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

from ..benchmark import DATA_FORMATS, BenchmarkSpec, DataSource, lcb_release_files, loader_of
from ..errors import ConductorError, MissingDependencyError, UsageError
from ..private import open_private, own_dir
from ..text import printable
from ..userfiles import (
    UnreadableFileError,
    bounded_lines,
    check_regular,
    describe_size,
    open_regular,
    parse_json,
    read_regular,
    utf8_text,
)
from .columns import data_columns

__all__ = [
    "HUB_PROBE_TIMEOUT_S",
    "MAX_JSON_BYTES",
    "MAX_LINE_BYTES",
    "DataFileError",
    "DatasetError",
    "LocatedRow",
    "Row",
    "file_rows",
    "local_copy_hint",
    "source_rows",
    "url_cache_path",
]

#: One dataset row: column name -> value.
Row: TypeAlias = dict[str, Any]
#: A row and where it is (``FILE:LINE``, ``DATASET (split) row N``), for error messages.
LocatedRow: TypeAlias = tuple[str, Row]


class DatasetError(ConductorError):
    """A benchmark's data cannot be read (not downloadable, bad file, missing column)."""


class DataFileError(DatasetError, UsageError):
    """The data is there but not usable as given (a missing column, text that is not
    UTF-8, a row or question over the size limits): bad input, CLI exit code 2."""


def local_copy_hint(spec: BenchmarkSpec) -> str:
    """How to run ``spec`` without its source: ``--data FILE``, with the columns and the
    formats such a file needs (the end of every "cannot load" message)."""
    formats = ", ".join(DATA_FORMATS[:-1]) + f" or {DATA_FORMATS[-1]}"
    return (
        f"pass --data FILE with a local copy: a {formats} file with {data_columns(spec).describe()}"
    )


def source_rows(
    spec: BenchmarkSpec, source: DataSource, max_line: int | None
) -> Iterator[LocatedRow]:
    """The rows of ``source`` (a file, a URL downloaded once, LiveCodeBench's release
    files or a Hugging Face dataset) for benchmark ``spec``, one at a time; a line of a
    JSONL file longer than ``max_line`` bytes (None: no limit) is refused."""
    if source.kind == "file":
        assert source.path is not None
        return file_rows(Path(source.path), max_line)
    if source.kind == "url":
        assert source.url is not None
        return file_rows(_download(spec, source.url), max_line)
    if loader_of(spec) == "livecodebench":
        return _lcb_hub_rows(spec, source)
    return _hf_rows(spec, source)


#: The longest line read where the benchmark sets no row limit (LiveCodeBench's rows
#: carry their large, encoded tests): a longer line is refused after this much of it.
MAX_LINE_BYTES = 1 << 30
#: The most a ``.json`` data file may hold: it is parsed whole (JSONL is streamed).
MAX_JSON_BYTES = 256 << 20


def file_rows(path: Path, max_line: int | None) -> Iterator[LocatedRow]:
    """The rows of a local ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file, by its
    suffix; JSONL, CSV and Parquet are streamed.  A JSONL line (or CSV line) longer than
    ``max_line`` bytes (None: :data:`MAX_LINE_BYTES`) is refused without being read
    whole; a path that is not a regular file (a FIFO, a device, a directory) is refused
    before anything is read."""
    _check_data_file(path)
    suffix = path.suffix.lower()
    limit = MAX_LINE_BYTES if max_line is None else max_line
    if suffix == ".jsonl":
        return _jsonl_rows(path, limit)
    if suffix == ".json":
        return _json_rows(path)
    if suffix == ".csv":
        return _csv_rows(path, limit)
    if suffix == ".parquet":
        return _parquet_rows(path)
    raise UsageError(f"{path}: data files must be .jsonl, .json, .csv or .parquet")


def _check_data_file(path: Path) -> None:
    try:
        check_regular(path, "data file")
    except UnreadableFileError as exc:
        raise DataFileError(str(exc)) from None


def _open_data(path: Path) -> BinaryIO:
    try:
        return open_regular(path, "data file")
    except UnreadableFileError as exc:
        raise DataFileError(str(exc)) from None


def _not_utf8(where: str, exc: UnicodeDecodeError) -> DataFileError:
    return DataFileError(
        f"{where}: is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
        f"{exc.start}); save the data file as UTF-8"
    )


def _too_long(path: Path, lineno: int, limit: int) -> DataFileError:
    return DataFileError(
        f"{path}:{lineno}: the line is longer than {describe_size(limit)}; "
        "a data row must be smaller (split long texts into several rows)"
    )


def _text_lines(path: Path, fh: BinaryIO, limit: int) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line of ``fh``, none held past ``limit`` bytes."""
    for lineno, raw in bounded_lines(fh, limit):
        if raw is None:
            raise _too_long(path, lineno, limit)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(f"{path}:{lineno}", exc) from None
        # A byte-order mark some editors (Excel) write first is not part of the data.
        yield lineno, text.removeprefix("\ufeff") if lineno == 1 else text


def _jsonl_rows(path: Path, max_line: int = MAX_LINE_BYTES) -> Iterator[LocatedRow]:
    # Bytes, line by line, with a cap: a huge line is refused after reading at most
    # ``max_line`` bytes of it instead of being held (and copied) whole.
    with _open_data(path) as fh:
        for lineno, line in _text_lines(path, fh, max_line):
            if not line.strip():
                continue
            try:
                row = parse_json(line, path, lineno)
            except UnreadableFileError as exc:
                raise DataFileError(str(exc)) from None
            del line
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{lineno}: each line must be a JSON object")
            yield f"{path}:{lineno}", row


def _json_rows(path: Path) -> Iterator[LocatedRow]:
    # A JSON array has to be parsed whole (so it is bounded); use JSONL for large sets.
    try:
        raw = read_regular(path, "data file", MAX_JSON_BYTES)
        data = parse_json(utf8_text(raw, path, "data file").removeprefix("\ufeff"), path)
    except UnreadableFileError as exc:
        more = "; larger sets go in a .jsonl file" if exc.kind == "too_big" else ""
        raise DataFileError(f"{exc}{more}") from None
    del raw
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataFileError(f"{path}: a .json data file must hold a list of objects")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataFileError(f"{path}: item {i} is not a JSON object")
        yield f"{path}: item {i}", row


def _csv_rows(path: Path, max_line: int = MAX_LINE_BYTES) -> Iterator[LocatedRow]:
    # Some benchmark cells are long (whole problem statements with code), but a line
    # over the row limit is refused as soon as the reader sees it is too long, and a
    # cell (which may span lines) as soon as the csv module does.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1, max_line))
    with _open_data(path) as fh:
        lines = (text for _n, text in _text_lines(path, fh, max_line))
        # strict: a quote left open to the end of the file, or text after a closing
        # quote, is a damaged file, not one last cell holding the rest of it.
        reader = csv.DictReader(lines, strict=True)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                # The csv module counts a record's lines once it has read it whole: the
                # one it failed on starts on the line after those counted.
                start = reader.line_num + 1
                raise DataFileError(f"{path}:{start}: not valid CSV ({exc})") from None
            yield f"{path}:{reader.line_num}", row


_PARQUET_MAGIC = b"PAR1"


def _parquet_rows(path: Path) -> Iterator[LocatedRow]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError(
            "reading .parquet data needs pyarrow: pip install 'datasets>=3,<5'"
        ) from None
    # What pyarrow raises for a damaged file: its own errors (ArrowInvalid is also a
    # ValueError, ArrowIOError an OSError: a thrift error in the footer is one), and
    # the builtin ones its readers let through.  Caught around pyarrow's calls only,
    # never around the ``yield``: a consumer's error is its own.
    damaged = (
        pa.ArrowException,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        NotImplementedError,
        EOFError,
        MemoryError,
        OverflowError,
    )
    with _open_data(path) as fh:
        # pyarrow reads a file from its end and never looks at its first four bytes.
        if fh.read(4) != _PARQUET_MAGIC:
            raise _corrupt_parquet(path, ValueError("it does not begin with PAR1"))
        try:
            # Pages written with a checksum are checked: a damaged page is named as such
            # rather than read as other values.
            parquet = pq.ParquetFile(fh, page_checksum_verification=True)
            stated = parquet.metadata.num_rows
            batches = parquet.iter_batches(batch_size=64)
        except damaged as exc:
            raise _corrupt_parquet(path, exc) from None
        n = 0
        while True:
            try:
                rows = next(batches).to_pylist()
            except StopIteration:
                if n != stated:
                    # A damaged row-group entry: fewer (or more) rows than the footer says.
                    why = ValueError(f"{n:,} rows read where its footer says {stated:,}")
                    raise _corrupt_parquet(path, why, n) from None
                return
            except damaged as exc:
                raise _corrupt_parquet(path, exc, n) from None
            for row in rows:
                yield f"{path}: row {n}", row
                n += 1


def _corrupt_parquet(path: Path, exc: BaseException, row: int | None = None) -> DataFileError:
    why = " ".join(str(exc).split())[:200] or type(exc).__name__
    at = f" at row {row}" if row else ""
    return DataFileError(
        f"{path}: is not a readable Parquet file (corrupt or truncated{at}: {printable(why)}); "
        "write it again or use a .jsonl copy"
    )


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


def _revision_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the Hub has no such revision of the repository.

    The hub library raises ``RevisionNotFoundError``; the datasets library wraps it
    (``DatasetNotFoundError`` raised *from* it), so the causes are followed too.
    """
    try:
        from huggingface_hub.errors import RevisionNotFoundError
    except ImportError:
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, RevisionNotFoundError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _revision_error(spec: BenchmarkSpec, source: DataSource) -> DatasetError:
    """The one error for a pinned revision the Hub does not have (a commit of another
    repository, a typo, a branch since deleted): it names the dataset, the revision
    and the way out."""
    key = "train_source" if source is spec.train_source and source is not spec.source else "source"
    return DatasetError(
        f"cannot load {source.id}: the Hugging Face Hub has no revision {source.revision!r} "
        f"of this dataset; set {key}.revision in the benchmark file ({spec.name}) to a "
        "commit listed on the dataset's history page on the Hub (or to a branch such as "
        f"main, unpinned), or {local_copy_hint(spec)}"
    )


def _hf_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[LocatedRow]:
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
        if _revision_missing(exc):
            raise _revision_error(spec, source) from None
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


def _lcb_hub_rows(spec: BenchmarkSpec, source: DataSource) -> Iterator[LocatedRow]:
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
            if _revision_missing(exc):
                raise _revision_error(spec, source) from None
            why = (
                f"the Hugging Face Hub is out of reach ({offline}) and no copy is cached"
                if offline
                else f"{type(exc).__name__}: {exc}"
            )
            raise DatasetError(
                f"cannot download {name} of {source.id} (revision {source.revision}): "
                f"{why}; {local_copy_hint(spec)}"
            ) from None
        yield from _jsonl_rows(Path(local))  # bounded by MAX_LINE_BYTES


def url_cache_path(url: str) -> Path:
    """Where the download of ``url`` is kept: ``$CONDUCTOR_DATA_DIR``, else the user
    cache folder's ``conductor/data``, as a digest of the URL and its file name."""
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
    target = url_cache_path(url)
    # Downloaded data holds the hidden tests: private, an older version's copies too.
    own_dir(target.parent, "the downloaded data", (f"{'[0-9a-f]' * 16}-*",))
    if target.is_file():
        return target
    # Only a download needs urllib.request (and the http and email packages it loads).
    import urllib.request

    if urllib.parse.urlsplit(url).scheme == "file":
        # A local file copied into the cache: it must be a regular file (a copy of
        # /dev/zero or of a FIFO would never end).
        _check_data_file(Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)))

    partial = target.with_name(target.name + f".part{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open_private(partial, "xb") as out:
            while block := resp.read(1 << 20):
                out.write(block)
        partial.replace(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DatasetError(f"cannot download {url}: {exc}; {local_copy_hint(spec)}") from None
    return target
