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
from typing import Any

from ..errors import CacheError
from ..grading.types import Sample
from ..llm.cache import ResponseCache
from ..record import new_run_id, now_iso

log = logging.getLogger(__name__)


def _cache_get(cache: ResponseCache | None, key: str | None) -> Any:
    if cache is None or key is None:
        return None
    try:
        return cache.get_value(key)
    except CacheError:
        raise
    except Exception as exc:  # noqa: BLE001 - an undecodable entry costs a replay, never a sample
        log.warning("the sample cache could not be read (%s); running the sample", exc)
        return None


def _cache_set(cache: ResponseCache | None, key: str, value: dict[str, Any]) -> None:
    if cache is None:
        return
    try:
        cache.set_value(key, value)
    except CacheError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a value that cannot be pickled
        log.warning("the sample cache could not be written (%s)", exc)


def _run_key(config: dict[str, Any]) -> str:
    bench = config["benchmark"]
    identity = {
        "v": 1,
        "conductor_version": config["conductor_version"],
        "benchmark": [bench["name"], bench["grader"], bench["grader_version"]],
        "grader_options": bench.get("grader_options"),
        "template_sha256": bench["provenance"].get("template_sha256"),
        "strategy": config["strategy_detail"],
        "pool": config["pool"],
        "seed": config["seed"],
    }
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sample_key(run_key: str, sample: Sample, question: str, epoch: int) -> str:
    blob = json.dumps([run_key, sample.id, epoch, question, sample.gold], default=str)
    return "sample:" + hashlib.sha256(blob.encode()).hexdigest()


def _replayed_line(kept: dict[str, Any]) -> str:
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
