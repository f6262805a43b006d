"""Joining the shards of one bench run into one run directory (``bench merge``)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError
from ..private import make_private_dir, open_private, write_private
from ..record import now_iso
from ..runs.rundir import CONFIG, SAMPLES, SampleLines, sample_key
from .runconfig import _check_same_run


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
        _check_same_run(first, cfg, d, shards=True)
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
                    out.write(json.dumps(data, ensure_ascii=False) + "\n")
                    written += 1
    merged = {**first, "shard": None, "merged_from": [str(d) for d in run_dirs]}
    counts = [(cfg.get("trained_on") or {}).get("samples") for cfg in configs]
    if all(isinstance(c, int) for c in counts):
        merged["trained_on"] = {**first["trained_on"], "samples": sum(counts)}
    merged["created_at"] = now_iso()
    write_private(out_dir / CONFIG, json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
    return written
