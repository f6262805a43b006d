"""Joining the shards of one bench run into one run directory (``bench merge``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import UsageError
from ..private import make_private_dir, open_private, write_private
from ..record import now_iso
from ..runs.config import BenchConfig, read_run_config
from ..runs.rundir import CONFIG, SAMPLES, SampleLines, record_line, sample_key
from .runconfig import check_same_run

__all__ = ["merge_runs", "merged_config"]


def merge_runs(run_dirs: list[Path], out_dir: Path) -> int:
    """Join the shards of one run into ``out_dir``; returns the number of records.

    The shards must agree on benchmark, strategy, epochs and seed; a (sample, epoch)
    pair found in several shards is kept once (the last one read).
    """
    if not run_dirs:
        raise UsageError("bench merge needs at least one run directory")
    configs = [read_run_config(d) for d in run_dirs]
    first = configs[0]
    for d, cfg in zip(run_dirs[1:], configs[1:], strict=True):
        check_same_run(first, cfg, d, shards=True)
    make_private_dir(out_dir)
    if (out_dir / SAMPLES).exists():
        raise UsageError(f"{out_dir} already holds samples; merge into an empty directory")
    # Two passes keep memory to the keys: find each pair's last source, then copy.
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for di, d in enumerate(run_dirs):
        for li, data in SampleLines(d / SAMPLES):
            last[sample_key(data)] = (di, li)
    written = 0
    with open_private(out_dir / SAMPLES, "w", encoding="utf-8") as out:
        for di, d in enumerate(run_dirs):
            for li, data in SampleLines(d / SAMPLES):
                if last.get(sample_key(data)) == (di, li):
                    out.write(record_line(data))
                    written += 1
    write_private(out_dir / CONFIG, merged_config(configs, run_dirs).to_json())
    return written


def merged_config(configs: list[BenchConfig], run_dirs: list[Path]) -> BenchConfig:
    """The config of the run that joins the shards ``run_dirs`` (whose configs are
    ``configs``, already found to be of one run): the first shard's, for no shard, with
    the trained-on samples of every shard counted (when each counted them)."""
    first = configs[0]
    merged = dataclasses.replace(
        first, shard=None, merged_from=tuple(str(d) for d in run_dirs), created_at=now_iso()
    )
    counts = [cfg.trained_on.samples if cfg.trained_on else None for cfg in configs]
    ints = [c for c in counts if isinstance(c, int)]
    if first.trained_on is not None and len(ints) == len(counts):
        merged = dataclasses.replace(
            merged, trained_on=dataclasses.replace(first.trained_on, samples=sum(ints))
        )
    return merged
