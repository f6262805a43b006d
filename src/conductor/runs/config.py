"""A bench run's ``config.json``: what was run, typed (:class:`BenchConfig`), the text
written (:meth:`BenchConfig.to_json`) and the one reader (:func:`read_run_config`).

Every command that reads the file (``bench --resume``, ``bench --overwrite``, ``bench
merge``, ``report``, ``view``, ``trace``'s scores) reads it here, so a damaged file is
told the same way everywhere: one sentence naming the file, a
:class:`RunConfigError` (a :class:`~conductor.errors.UsageError`, exit code 2), for a
file that is missing, not UTF-8, not JSON (a truncated one), of the wrong shape (a
field of the wrong type), or of a schema newer than this version reads.

A field a run of an older version did not record reads as ``None`` (``schema_version``
missing reads as 1), so those directories are still reported, resumed and merged.  The
open-ended descriptions (the dataset's provenance, the strategy's and the pool's public
description, the grader's options) stay JSON objects: their fields belong to their
owners.  Fields of the file this version does not know are not kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UsageError
from ..redact import masked_json
from ..userfiles import MAX_CONFIG_BYTES, UnreadableFileError, parse_json, read_regular
from .rundir import CONFIG

__all__ = [
    "CONFIG_SCHEMA",
    "BenchConfig",
    "BenchmarkInfo",
    "Invocation",
    "RunConfigError",
    "TrainedOn",
    "read_run_config",
]

#: 2 added ``invocation`` (what rebuilds the run for ``--resume DIR`` alone) and the
#: pool file's SHA-256; schema 1 directories are still read and resumed.
CONFIG_SCHEMA = 2

_T = TypeVar("_T")


class RunConfigError(UsageError):
    """A run directory's ``config.json`` is missing or cannot be read; ``path`` names it."""

    def __init__(self, message: str, path: Path) -> None:
        self.path = path
        super().__init__(message)


@dataclass(frozen=True)
class Invocation:
    """The options that rebuild a run from its directory alone (``--resume DIR``): the
    CLI's options as the run was started, files by absolute path, shipped names as
    names.  ``None`` is "not given" (the default applies)."""

    benchmark: str | None = None
    pool: str | None = None
    conductor: str | None = None
    strategy: str | None = None
    data: str | None = None
    limit: int | None = None
    epochs: int | None = None
    seed: int = 0
    shard: str | None = None
    max_steps: int | None = None
    rounds: int | None = None
    budget_usd: float | None = None
    max_calls: int | None = None
    concurrency: int | None = None
    exclude_trained: bool = False
    #: ``--batch``: calls through the providers' batch APIs; ``--max-usd``: the run's cap.
    batch: bool = False
    max_usd: float | None = None
    #: ``--cost-weight``: the weight a cost-conditioned Conductor's prompt states.
    cost_weight: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``config.json`` keeps (its fields in declaration order)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BenchmarkInfo:
    """The benchmark a run ran, the grader that graded it, and where its data came from."""

    name: str
    paper_key: str | None = None
    #: The benchmark says its questions are the set the paper's ``paper_key`` column
    #: was measured on (records from before this was kept read as False).
    paper_set: bool = False
    grader: str | None = None
    grader_version: str | int | None = None
    grader_options: Mapping[str, Any] | None = None
    #: How the grader reads answers (math, choice: ``official`` as the reference
    #: harness, or ``conductor``), recorded even when the file leaves the default.
    grader_extraction: str | None = None
    #: :func:`~conductor.datasets.samples.dataset_provenance`: source, revision, file and
    #: template hashes, filters.
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paper_key": self.paper_key,
            "paper_set": self.paper_set,
            "grader": self.grader,
            "grader_version": self.grader_version,
            "grader_options": _plain(self.grader_options),
            "grader_extraction": self.grader_extraction,
            "provenance": _plain(self.provenance),
        }


@dataclass(frozen=True)
class TrainedOn:
    """The Conductor checkpoint's training questions, as far as the run counted them."""

    checkpoint: str | None = None
    #: How many questions the checkpoint records it was trained on.
    questions: int | None = None
    #: How many of this run's samples are among them.
    samples: int | None = None
    #: The held-out sets its training did not compare with.
    unchecked_holdout: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "checkpoint": self.checkpoint,
            "questions": self.questions,
            "samples": self.samples,
        }
        if self.unchecked_holdout:  # only when some, as the run writes it
            data["unchecked_holdout"] = list(self.unchecked_holdout)
        return data


@dataclass(frozen=True)
class BenchConfig:
    """What a bench run is: everything that decides its samples, and what rebuilds it."""

    benchmark: BenchmarkInfo
    strategy: str | None = None
    #: The strategy's own description (:meth:`~conductor.strategies.Strategy.describe`);
    #: ``None`` where the run did not record one.
    strategy_detail: Mapping[str, Any] | None = None
    #: The pool's public description (keys never included); ``None`` where not recorded.
    pool: Mapping[str, Any] | None = None
    #: Samples in flight at once (``settings.concurrency`` in the file).
    concurrency: int | None = None
    epochs: int | None = None
    seed: int | None = None
    limit: int | None = None
    shard: tuple[int, int] | None = None
    #: The SHA-256 of the pool file's text.
    pool_sha256: str | None = None
    invocation: Invocation | None = None
    trained_on: TrainedOn | None = None
    #: ``True`` or ``None`` (never ``False``: runs from before the option read the same).
    exclude_trained: bool | None = None
    created_at: str | None = None
    conductor_version: str | None = None
    #: The shard directories ``bench merge`` joined into this one (merged runs only).
    merged_from: tuple[str, ...] | None = None
    schema_version: int = CONFIG_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``config.json``, its fields in the order the file has."""
        data: dict[str, Any] = {
            "schema_version": self.schema_version,
            "benchmark": self.benchmark.to_dict(),
            "strategy": self.strategy,
            "strategy_detail": _plain(self.strategy_detail),
            "pool": _plain(self.pool),
            "settings": {"concurrency": self.concurrency},
            "epochs": self.epochs,
            "seed": self.seed,
            "limit": self.limit,
            "shard": list(self.shard) if self.shard else None,
            "pool_sha256": self.pool_sha256,
            "invocation": self.invocation.to_dict() if self.invocation is not None else None,
            "trained_on": self.trained_on.to_dict() if self.trained_on is not None else None,
            "exclude_trained": self.exclude_trained,
            "created_at": self.created_at,
            "conductor_version": self.conductor_version,
        }
        if self.merged_from is not None:
            data["merged_from"] = list(self.merged_from)
        return data

    def to_json(self) -> str:
        """The text of ``config.json``, every secret value of this process masked (the
        config in memory keeps them: the sample cache's key is made from it, so that
        two secrets never share an entry)."""
        return masked_json(self.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _plain(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(value) if value is not None else None


# -- reading ---------------------------------------------------------------------------


def read_run_config(run_dir: Path) -> BenchConfig:
    """The ``config.json`` of the bench run in ``run_dir``.

    Raises :class:`RunConfigError`, one sentence naming the file, when it is missing,
    cannot be read, is not UTF-8, is not JSON, has a field of the wrong type, or was
    written by a newer version (a schema this one does not know)."""
    path = run_dir / CONFIG
    if not os.path.lexists(path):
        raise RunConfigError(f"{run_dir}: no {CONFIG}; not a bench run directory", path)
    try:
        raw = read_regular(path, "run config", MAX_CONFIG_BYTES)
    except UnreadableFileError as exc:
        raise RunConfigError(str(exc), path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); not a readable run config", path
        ) from None
    try:
        data = parse_json(text, path)
    except UnreadableFileError as exc:
        raise RunConfigError(str(exc), path) from None
    return _Reader(path).config(data)


class _Reader:
    """Builds a :class:`BenchConfig` from the JSON of ``path``, naming the first field
    of the wrong type."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, what: str) -> RunConfigError:
        return RunConfigError(f"{self.path}: not a bench run config ({what})", self.path)

    def get(self, data: Mapping[str, Any], key: str, kind: type[_T], where: str) -> _T | None:
        """``data[key]``, ``None`` when missing or null, else of ``kind`` (a bool is no
        number here, an int is a float)."""
        value = data.get(key)
        if value is None:
            return None
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            name = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
            wanted = name.get(kind, "a JSON object" if kind is dict else "a list")
            shown = json.dumps(value, ensure_ascii=False)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise self.fail(f"{where}{key} must be {wanted}, not {shown}")
        return value  # type: ignore[return-value]  # checked just above

    def config(self, data: Any) -> BenchConfig:
        if not isinstance(data, dict):
            raise self.fail(f"a JSON object was expected, not {type(data).__name__}")
        schema = self.get(data, "schema_version", int, "")
        schema = 1 if schema is None else schema
        if not 1 <= schema <= CONFIG_SCHEMA:
            raise RunConfigError(
                f"{self.path}: config schema {schema} is not one this version of conductor "
                f"reads (1 to {CONFIG_SCHEMA}); a newer conductor wrote it",
                self.path,
            )
        bench = self.get(data, "benchmark", dict, "")
        if bench is None:
            raise self.fail("it names no benchmark")
        settings = self.get(data, "settings", dict, "") or {}
        shard = self.get(data, "shard", list, "")
        if shard is not None and not (
            len(shard) == 2 and all(type(i) is int for i in shard)  # noqa: E721 - no bools
        ):
            raise self.fail(f"shard must be [I, N], not {json.dumps(shard)}")
        merged = self.get(data, "merged_from", list, "")
        invocation = self.get(data, "invocation", dict, "")
        trained = self.get(data, "trained_on", dict, "")
        return BenchConfig(
            schema_version=schema,
            benchmark=self.benchmark(bench),
            strategy=self.get(data, "strategy", str, ""),
            strategy_detail=self.get(data, "strategy_detail", dict, ""),
            pool=self.get(data, "pool", dict, ""),
            concurrency=self.get(settings, "concurrency", int, "settings."),
            epochs=self.get(data, "epochs", int, ""),
            seed=self.get(data, "seed", int, ""),
            limit=self.get(data, "limit", int, ""),
            shard=(shard[0], shard[1]) if shard is not None else None,
            pool_sha256=self.get(data, "pool_sha256", str, ""),
            invocation=self.invocation(invocation) if invocation is not None else None,
            trained_on=self.trained_on(trained) if trained is not None else None,
            exclude_trained=self.get(data, "exclude_trained", bool, ""),
            created_at=self.get(data, "created_at", str, ""),
            conductor_version=self.get(data, "conductor_version", str, ""),
            merged_from=tuple(str(d) for d in merged) if merged is not None else None,
        )

    def benchmark(self, bench: Mapping[str, Any]) -> BenchmarkInfo:
        name = self.get(bench, "name", str, "benchmark.")
        if name is None:
            raise self.fail("benchmark.name is missing")
        version = bench.get("grader_version")
        if isinstance(version, bool) or not isinstance(version, str | int | None):
            shown = json.dumps(version, ensure_ascii=False)[:40]
            raise self.fail(f"benchmark.grader_version must be a string, not {shown}")
        return BenchmarkInfo(
            name=name,
            paper_key=self.get(bench, "paper_key", str, "benchmark."),
            paper_set=bool(self.get(bench, "paper_set", bool, "benchmark.")),
            grader=self.get(bench, "grader", str, "benchmark."),
            grader_version=version,
            grader_options=self.get(bench, "grader_options", dict, "benchmark."),
            grader_extraction=self.get(bench, "grader_extraction", str, "benchmark."),
            provenance=self.get(bench, "provenance", dict, "benchmark.") or {},
        )

    def invocation(self, inv: Mapping[str, Any]) -> Invocation:
        w = "invocation."
        return Invocation(
            benchmark=self.get(inv, "benchmark", str, w),
            pool=self.get(inv, "pool", str, w),
            conductor=self.get(inv, "conductor", str, w),
            strategy=self.get(inv, "strategy", str, w),
            data=self.get(inv, "data", str, w),
            limit=self.get(inv, "limit", int, w),
            epochs=self.get(inv, "epochs", int, w),
            seed=self.get(inv, "seed", int, w) or 0,
            shard=self.get(inv, "shard", str, w),
            max_steps=self.get(inv, "max_steps", int, w),
            rounds=self.get(inv, "rounds", int, w),
            budget_usd=self.get(inv, "budget_usd", float, w),
            max_calls=self.get(inv, "max_calls", int, w),
            concurrency=self.get(inv, "concurrency", int, w),
            exclude_trained=bool(self.get(inv, "exclude_trained", bool, w)),
            batch=bool(self.get(inv, "batch", bool, w)),
            max_usd=self.get(inv, "max_usd", float, w),
            cost_weight=self.get(inv, "cost_weight", float, w),
        )

    def trained_on(self, trained: Mapping[str, Any]) -> TrainedOn:
        w = "trained_on."
        unchecked = self.get(trained, "unchecked_holdout", list, w) or []
        return TrainedOn(
            checkpoint=self.get(trained, "checkpoint", str, w),
            questions=self.get(trained, "questions", int, w),
            samples=self.get(trained, "samples", int, w),
            unchecked_holdout=tuple(str(u) for u in unchecked),
        )
