"""Running a benchmark: samples -> strategy -> grader -> ``samples.jsonl``.

The run directory holds ``config.json`` (what was run), ``samples.jsonl`` (one run
record per sample and epoch, appended and flushed as each finishes, so a killed run
loses nothing already finished) and ``summary.json``.  Samples are streamed from the
dataset and records are written, not kept, so memory stays flat however long the run.

Resuming reads which (sample, epoch) pairs are already in ``samples.jsonl`` and skips
them; a torn last line left by a killed process is cut off first.  ``retry_errors``
removes the records of failed runs (and grader errors) before resuming, so they run
again and no pair is ever recorded twice.  Sharding takes every N-th sample of the
dataset order; ``merge_runs`` joins the shards of one run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..cache import ResponseCache
from ..errors import UsageError
from ..record import RunRecord, new_run_id, now_iso, record_to_dict
from .data import count_samples, dataset_provenance, iter_samples, render_prompt
from .graders import Grader
from .strategies import Strategy
from .types import BenchmarkSpec, Sample

__all__ = [
    "BenchOptions",
    "BenchProgress",
    "completed_keys",
    "merge_runs",
    "run_benchmark",
]

CONFIG = "config.json"
SAMPLES = "samples.jsonl"
CONFIG_SCHEMA = 1


@dataclass(frozen=True)
class BenchOptions:
    """How to run: which data, how much, how fast, where to write."""

    out_dir: Path
    data_file: Path | None = None
    limit: int | None = None
    epochs: int | None = None
    seed: int = 0
    concurrency: int = 16
    grader_concurrency: int = max(1, (os.cpu_count() or 2))
    resume: bool = False
    retry_errors: bool = False
    shard: tuple[int, int] | None = None


@dataclass
class BenchProgress:
    """Running totals, updated as each sample finishes (for progress displays)."""

    total: int = 0
    skipped: int = 0
    done: int = 0
    correct: int = 0
    errors: int = 0
    cost_usd: float = 0.0
    verdicts: dict[str, int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        return 100.0 * self.correct / self.done if self.done else None


# -- the samples file ----------------------------------------------------------------


def _key(sample_id: str, epoch: int) -> str:
    return f"{epoch}\x00{sample_id}"


def _repair_tail(path: Path) -> None:
    """Cut a torn last line (a process killed mid-write) so appends stay line-aligned."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return
        # Walk back to the last newline and truncate after it.
        size = fh.seek(0, os.SEEK_END)
        chunk = 1 << 16
        pos = size
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step)
            idx = data.rfind(b"\n")
            if idx != -1:
                fh.truncate(pos + idx + 1)
                return
        fh.truncate(0)


def _iter_lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                return  # a torn last line
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _is_error(data: dict[str, Any]) -> bool:
    grade = data.get("grade") or {}
    return data.get("status") == "failed" or grade.get("status") == "grader_error"


def completed_keys(out_dir: Path, *, drop_errors: bool = False) -> set[str]:
    """The (sample, epoch) keys recorded in ``out_dir``; with ``drop_errors`` the records
    of failed runs are first removed from the file (atomically) so they can run again."""
    path = out_dir / SAMPLES
    _repair_tail(path)
    if drop_errors and path.exists():
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for data in _iter_lines(path):
                if not _is_error(data):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
        tmp.replace(path)
    return {_key(d.get("sample_id") or "", int(d.get("epoch") or 0)) for d in _iter_lines(path)}


# -- config ---------------------------------------------------------------------------


def _config(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    epochs: int,
) -> dict[str, Any]:
    return {
        "schema_version": CONFIG_SCHEMA,
        "benchmark": {
            "name": spec.name,
            "paper_key": spec.paper_key,
            "grader": grader.name,
            "grader_version": grader.version,
            "grader_options": spec.grader_options,
            "provenance": dataset_provenance(spec, options.data_file),
        },
        "strategy": strategy.name,
        "strategy_detail": strategy.describe(),
        "pool": pool_dict,
        "settings": {"concurrency": options.concurrency},
        "epochs": epochs,
        "seed": options.seed,
        "limit": options.limit,
        "shard": list(options.shard) if options.shard else None,
        "created_at": now_iso(),
        "conductor_version": __version__,
    }


# What must match for a resume (or a merge) to continue the same run.
_IDENTITY = ("strategy", "epochs", "seed")


def _check_same_run(old: dict[str, Any], new: dict[str, Any], where: Path) -> None:
    for key in _IDENTITY:
        if old.get(key) != new.get(key):
            raise UsageError(
                f"{where}: cannot resume: {key} was {old.get(key)!r}, now {new.get(key)!r}"
            )
    old_b, new_b = old.get("benchmark", {}), new.get("benchmark", {})
    for key in ("name", "grader", "grader_version"):
        if old_b.get(key) != new_b.get(key):
            raise UsageError(
                f"{where}: cannot resume: benchmark {key} was {old_b.get(key)!r}, "
                f"now {new_b.get(key)!r}"
            )
    old_prov, new_prov = old_b.get("provenance", {}), new_b.get("provenance", {})
    if old_prov.get("template_sha256") != new_prov.get("template_sha256"):
        raise UsageError(f"{where}: cannot resume: the prompt template changed")


# -- running --------------------------------------------------------------------------


def _work(
    spec: BenchmarkSpec, options: BenchOptions, epochs: int, done: set[str]
) -> Iterator[tuple[Sample, int]]:
    """(sample, epoch) pairs still to run, streamed in dataset order."""
    shard_i, shard_n = options.shard or (0, 1)
    samples = iter_samples(
        spec, data_file=options.data_file, seed=options.seed, limit=options.limit
    )
    for position, sample in enumerate(samples):
        if position % shard_n != shard_i:
            continue
        for epoch in range(epochs):
            if _key(sample.id, epoch) not in done:
                yield sample, epoch


async def run_benchmark(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    *,
    cache: ResponseCache | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
) -> BenchProgress:
    """Run every remaining (sample, epoch) of ``spec`` and append its record.

    With ``cache``, each graded sample is also kept under a key that covers everything
    that decides it (benchmark, prompt, grader, strategy, pool, Conductor settings and
    template, seed, epoch, conductor version), so an identical rerun replays it without
    re-running the workflow.  A replayed record is the original one with a new run id
    and ``replayed_from`` (the original run id and the time of the replay).  Failed runs
    and grader errors are never kept.

    Cancelling (Ctrl-C) stops new work, abandons what is in flight and keeps everything
    already written.  Returns the running totals of this invocation.
    """
    out = options.out_dir
    epochs = options.epochs or spec.epochs
    config = _config(spec, strategy, grader, pool_dict, options, epochs)
    config_path = out / CONFIG
    if config_path.exists():
        if not options.resume:
            raise UsageError(
                f"{out} already holds a run; pass --resume {out} to continue it, or choose "
                "another --out"
            )
        _check_same_run(json.loads(config_path.read_text()), config, out)
    else:
        out.mkdir(parents=True, exist_ok=True)
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    done = completed_keys(out, drop_errors=options.retry_errors)

    progress = BenchProgress(skipped=len(done))
    notify = on_progress or (lambda _p: None)
    grading = asyncio.Semaphore(max(1, options.grader_concurrency))
    slots = asyncio.Semaphore(max(1, options.concurrency))
    lock = asyncio.Lock()
    fh = (out / SAMPLES).open("a", encoding="utf-8")

    run_key = _run_key(config)

    async def one(sample: Sample, epoch: int) -> None:
        try:
            question = render_prompt(spec, sample)
            key = _sample_key(run_key, sample, question, epoch) if cache is not None else None
            kept = cache.get_value(key) if cache is not None and key is not None else None
            if isinstance(kept, dict) and "line" in kept:
                line = _replayed_line(kept)
                status, cost = kept["status"], kept["cost"]
            else:
                record: RunRecord = await strategy.run(
                    question, sample_index=epoch, sample_id=sample.id, epoch=epoch
                )
                record.gold = sample.gold
                record.metadata.update(
                    {"benchmark": spec.name, "strategy": strategy.name, "sample": sample.metadata}
                )
                if record.status != "failed":
                    async with grading:
                        verdict = await asyncio.to_thread(grader.grade, record.final_answer, sample)
                    record.grade = verdict.to_dict()
                data = record_to_dict(record)
                line = json.dumps(data, ensure_ascii=False) + "\n"
                status = (record.grade or {}).get("status", "run_failed")
                cost = record.totals.cost_usd or 0.0
                if cache is not None and key is not None and not _is_error(data):
                    cache.set_value(
                        key, {"line": line, "run_id": record.run_id, "status": status, "cost": cost}
                    )
            async with lock:
                fh.write(line)
                fh.flush()
            progress.done += 1
            progress.verdicts[status] = progress.verdicts.get(status, 0) + 1
            progress.correct += int(status == "correct")
            progress.errors += int(status in ("run_failed", "grader_error"))
            progress.cost_usd += cost
            notify(progress)
        finally:
            slots.release()

    tasks: set[asyncio.Task[None]] = set()
    try:
        # Rows are counted, not decoded, so the count costs little.
        n = count_samples(spec, data_file=options.data_file, limit=options.limit)
        shard_i, shard_n = options.shard or (0, 1)
        progress.total = len(range(shard_i, n, shard_n)) * epochs
        notify(progress)
        for sample, epoch in _work(spec, options, epochs, done):
            await slots.acquire()
            task = asyncio.create_task(one(sample, epoch))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
    except BaseException:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
        raise
    finally:
        fh.close()
        await strategy.aclose()
    return progress


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


# -- merging shards -------------------------------------------------------------------


def merge_runs(run_dirs: list[Path], out_dir: Path) -> int:
    """Join the shards of one run into ``out_dir``; returns the number of records.

    The shards must agree on benchmark, strategy, epochs and seed; a (sample, epoch)
    pair found in several shards is kept once (the last one read).
    """
    if not run_dirs:
        raise UsageError("bench merge needs at least one run directory")
    configs = []
    for d in run_dirs:
        path = d / CONFIG
        if not path.is_file():
            raise UsageError(f"{d}: no {CONFIG}; not a bench run directory")
        configs.append(json.loads(path.read_text()))
    first = configs[0]
    for d, cfg in zip(run_dirs[1:], configs[1:], strict=True):
        _check_same_run(first, cfg, d)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / SAMPLES).exists():
        raise UsageError(f"{out_dir} already holds samples; merge into an empty directory")
    # Two passes keep memory to the keys: find each pair's last source, then copy.
    last: dict[str, tuple[int, int]] = {}
    for di, d in enumerate(run_dirs):
        for li, data in enumerate(_iter_lines(d / SAMPLES)):
            last[_key(data.get("sample_id") or "", int(data.get("epoch") or 0))] = (di, li)
    written = 0
    with (out_dir / SAMPLES).open("w", encoding="utf-8") as out:
        for di, d in enumerate(run_dirs):
            for li, data in enumerate(_iter_lines(d / SAMPLES)):
                k = _key(data.get("sample_id") or "", int(data.get("epoch") or 0))
                if last.get(k) == (di, li):
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
                    written += 1
    merged = {**first, "shard": None, "merged_from": [str(d) for d in run_dirs]}
    merged["created_at"] = now_iso()
    (out_dir / CONFIG).write_text(json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
    return written
