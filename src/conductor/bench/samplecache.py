"""Replaying graded samples: the cache key that covers everything deciding a
sample, reading and writing it, and the replayed record's line.

A fault of the cache itself (:class:`~conductor.errors.CacheError`: disk full,
read-only, damaged) is raised, for the run to stop on as it stops on a full run
directory; an entry that cannot be decoded is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from ..errors import CacheError, RecordError
from ..grading.types import Sample
from ..llm.cache import ResponseCache
from ..record import (
    SCHEMA_VERSION,
    RunRecord,
    new_run_id,
    now_iso,
    record_from_dict,
    record_to_dict,
)
from ..runs.config import BenchConfig
from ..runs.rundir import record_line

__all__ = ["cache_get", "cache_set", "replayed_line", "replayed_record", "run_key", "sample_key"]

log = logging.getLogger(__name__)


def cache_get(cache: ResponseCache | None, key: str | None) -> Any:
    """The value kept under ``key``, or ``None`` (no cache, no key, a miss, or an entry
    that cannot be decoded); a fault of the cache itself raises ``CacheError``."""
    if cache is None or key is None:
        return None
    try:
        return cache.get_value(key)
    except CacheError:
        raise
    except Exception as exc:  # noqa: BLE001 - an undecodable entry costs a replay, never a sample
        log.warning("the sample cache could not be read (%s); running the sample", exc)
        return None


def cache_set(cache: ResponseCache | None, key: str, value: dict[str, Any]) -> None:
    """Keep ``value`` under ``key`` (nothing without a cache); a value that cannot be
    kept is left out with a warning, a fault of the cache itself raises ``CacheError``."""
    if cache is None:
        return
    try:
        cache.set_value(key, value)
    except CacheError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a value that cannot be pickled
        log.warning("the sample cache could not be written (%s)", exc)


def run_key(config: BenchConfig) -> str:
    """What every sample of the run ``config`` shares in its cache key: the version,
    benchmark, grader, prompt template, strategy, pool and seed."""
    bench = config.benchmark
    identity = {
        "v": 1,
        "conductor_version": config.conductor_version,
        "benchmark": [bench.name, bench.grader, bench.grader_version],
        "grader_options": _plain(bench.grader_options),
        "template_sha256": bench.provenance.get("template_sha256"),
        "strategy": _plain(config.strategy_detail),
        "pool": _plain(config.pool),
        "seed": config.seed,
    }
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _plain(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    # A plain dict, as the key has always been built from (json.dumps takes no Mapping).
    return dict(value) if value is not None else None


def sample_key(run: str, sample: Sample, question: str, epoch: int) -> str:
    """The cache key of one (sample, epoch) of the run whose :func:`run_key` is ``run``,
    asked as ``question``."""
    blob = json.dumps([run, sample.id, epoch, question, sample.gold], default=str)
    return "sample:" + hashlib.sha256(blob.encode()).hexdigest()


def replayed_record(kept: Any) -> tuple[str, RunRecord] | None:
    """The line a kept sample's replay writes (:func:`replayed_line`) and the record it
    holds, or ``None``: not a kept sample, or one this version cannot read (the sample
    then runs again)."""
    if not isinstance(kept, dict) or not isinstance(kept.get("line"), str):
        return None
    line = replayed_line(kept)
    try:
        data = json.loads(line)
        record = record_from_dict(data)
    except (ValueError, RecordError):
        return None
    if data.get("schema_version") != SCHEMA_VERSION:
        # Kept by an earlier version: the run's file gets this version's form.
        line = record_line(record_to_dict(record))
    return line, record


def replayed_line(kept: dict[str, Any]) -> str:
    """A kept sample's line for this run: a new run id and a ``replayed_from`` note.

    The rest is the original record as it was written (its latencies, costs and cached
    flags describe the execution that produced it), so replaying costs no parsing.
    """
    old_id, new_id = kept["run_id"], new_run_id()
    line: str = kept["line"].replace(f'"run_id": "{old_id}"', f'"run_id": "{new_id}"', 1)
    note = json.dumps({"run_id": old_id, "at": now_iso()})
    # ``replayed_from`` is the record's last field, written as null the first time.
    head, sep, tail = line.rpartition('"replayed_from": null')
    if not sep:
        return line
    return f'{head}"replayed_from": {note}{tail}'
