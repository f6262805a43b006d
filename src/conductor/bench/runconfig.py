"""What a bench run is: the options it is given (:class:`BenchOptions`), the
:class:`~conductor.runs.config.BenchConfig` built from them (:func:`build_config`; the
file's format and its one reader are :mod:`conductor.runs.config`'s), the invocation
that rebuilds the run (:func:`stored_invocation`), and whether a resume, or a merge of
shards, continues the same run (:func:`run_difference`, and :func:`check_same_run`,
which refuses one that does not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..benchmark import BenchmarkSpec
from ..datasets.samples import dataset_provenance
from ..errors import UsageError
from ..grading import Grader
from ..pool import RUNTIME_FIELDS
from ..record import now_iso
from ..redact import mask
from ..runs.config import BenchConfig, BenchmarkInfo, Invocation, TrainedOn
from ..strategies import Strategy

if TYPE_CHECKING:
    from ..state.url import StateURL
    from .trained import TrainedQuestions

__all__ = [
    "BenchOptions",
    "build_config",
    "check_same_run",
    "default_grader_concurrency",
    "run_difference",
    "stored_invocation",
]

#: The refusal's name for the data file's hash, which a run may not have recorded yet.
_FILE_SHA = "data file contents (SHA-256)"


# Grading mostly waits (a code grade is a sandboxed process the grader thread waits
# for), so slots run well above the cores: on 2 cores 500 LiveCodeBench samples took
# 29 s on 2 slots and 18 s on 64 (benchmarks/perf/grading.py).
_GRADER_SLOTS_PER_CORE = 32
_GRADER_SLOTS_MAX = 256


def default_grader_concurrency() -> int:
    """The grader slots a bench run gets unless told otherwise: 32 a core, 4 to 256."""
    return max(4, min(_GRADER_SLOTS_MAX, _GRADER_SLOTS_PER_CORE * (os.cpu_count() or 2)))


@dataclass(frozen=True)
class BenchOptions:
    """How to run: which data, how much, how fast, where to write."""

    out_dir: Path
    data_file: Path | None = None
    limit: int | None = None
    epochs: int | None = None
    seed: int = 0
    concurrency: int = 16
    grader_concurrency: int = field(default_factory=default_grader_concurrency)
    resume: bool = False
    retry_errors: bool = False
    shard: tuple[int, int] | None = None
    #: What rebuilds this run from its directory alone (benchmark, pool path, strategy,
    #: Conductor, budgets...): the CLI's options, kept in ``config.json``.
    invocation: Invocation | None = None
    #: The SHA-256 of the pool file's text, kept in ``config.json``.
    pool_sha256: str | None = None
    #: The questions the Conductor checkpoint was trained on: how many of this run's
    #: samples are among them goes into ``config.json`` (``trained_on``) ...
    trained_on: TrainedQuestions | None = None
    #: ... and with this set, those samples are not run at all.
    exclude_trained: bool = False
    #: Delete the run already in ``out_dir`` (the files bench wrote) before starting.
    overwrite: bool = False
    #: Run at most this many of the (sample, epoch) pairs left, the first in the run's
    #: order (``bench --pilot N``); the rest are left for ``--resume``.  Not part of
    #: the run (``config.json`` does not keep it).
    max_pairs: int | None = None
    #: The state server the run's processes share their claims and spend on
    #: (``--state``; :mod:`conductor.bench.shared`); ``None``: this process runs alone.
    state: StateURL | None = None


def build_config(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: Mapping[str, Any],
    options: BenchOptions,
    epochs: int,
    trained: int | None = None,
) -> BenchConfig:
    """The config of the run ``options`` start: ``trained`` is how many of its samples
    the Conductor checkpoint was trained on (when its questions are known)."""
    trained_on = options.trained_on
    return BenchConfig(
        benchmark=BenchmarkInfo(
            name=spec.name,
            paper_key=spec.paper_key,
            paper_set=spec.paper_set,
            grader=grader.name,
            grader_version=grader.version,
            grader_options=spec.grader_options,
            grader_extraction=getattr(grader, "extraction", None),
            provenance=dataset_provenance(spec, options.data_file),
        ),
        strategy=strategy.name,
        strategy_detail=strategy.describe(),
        pool=pool_dict,
        concurrency=options.concurrency,
        epochs=epochs,
        seed=options.seed,
        limit=options.limit,
        shard=options.shard,
        pool_sha256=options.pool_sha256,
        invocation=options.invocation,
        trained_on=(
            TrainedOn(
                checkpoint=trained_on.source,
                questions=len(trained_on.hashes),
                samples=trained,
                unchecked_holdout=tuple(trained_on.unchecked),
            )
            if trained_on is not None
            else None
        ),
        # Null unless set, so that runs from before the option resume as they were.
        exclude_trained=options.exclude_trained or None,
        created_at=now_iso(),
        conductor_version=__version__,
    )


def stored_invocation(config: BenchConfig) -> Invocation:
    """The options that rebuild the run ``config`` describes, for ``--resume DIR``.

    Schema 2 keeps them as given.  For a schema 1 config they are read back from what it
    recorded (benchmark file, pool path, strategy, data file, limits, Conductor
    settings); the ``--conductor`` option was not recorded, so the pool's own Conductor
    is assumed, and a run started with another one is refused (naming the difference)
    until ``--conductor`` is given again."""
    if config.invocation is not None:
        return config.invocation
    bench = config.benchmark
    prov = bench.provenance
    found = (config.strategy_detail or {}).get("settings")
    settings: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    shard = config.shard
    return Invocation(
        benchmark=prov.get("benchmark_file") or bench.name,
        pool=(config.pool or {}).get("path"),
        conductor=None,
        strategy=config.strategy,
        data=prov.get("file") if prov.get("source_kind") == "file" else None,
        limit=config.limit,
        epochs=config.epochs,
        seed=config.seed or 0,
        shard=f"{shard[0]}/{shard[1]}" if shard is not None else None,
        max_steps=settings.get("max_steps"),
        rounds=settings.get("rounds"),
        budget_usd=settings.get("budget_usd"),
        max_calls=settings.get("max_calls"),
        concurrency=config.concurrency,
    )


# What must match for a resume (or a merge) to continue the same run, with the name a
# refusal uses.  Paths are not compared (a moved pool or data file with the same
# contents is the same run); contents and hashes are.
_SAME_RUN: tuple[tuple[str, Callable[[BenchConfig], Any]], ...] = (
    ("benchmark", lambda c: c.benchmark.name),
    ("grader", lambda c: c.benchmark.grader),
    ("grader version", lambda c: c.benchmark.grader_version),
    ("grader options", lambda c: c.benchmark.grader_options),
    ("grader extraction", lambda c: c.benchmark.grader_extraction),
    ("prompt template", lambda c: c.benchmark.provenance.get("template_sha256")),
    (_FILE_SHA, lambda c: c.benchmark.provenance.get("file_sha256")),
    ("dataset revision", lambda c: c.benchmark.provenance.get("revision")),
    ("dataset filters", lambda c: c.benchmark.provenance.get("filters")),
    ("strategy", lambda c: c.strategy),
    ("epochs", lambda c: c.epochs),
    ("seed", lambda c: c.seed),
    ("limit", lambda c: c.limit),
    ("--exclude-trained setting", lambda c: c.exclude_trained),
)
# Compared field by field, so a refusal names e.g. ``settings.max_steps``.
_SAME_RUN_TREES: tuple[tuple[str, Callable[[BenchConfig], Mapping[str, Any] | None]], ...] = (
    ("strategy settings", lambda c: c.strategy_detail),
    ("pool", lambda c: c.pool),
)
# Descriptions derived from fields compared anyway (the Conductor's ``sampling`` is in its
# target's params, ``template_form`` follows the template's hash): skipping them keeps
# runs recorded before they existed resumable.
_DERIVED_KEYS = frozenset({"sampling", "template_form"})
# How a model is reached, paced and paid for (RUNTIME_FIELDS) may change in a resume too:
# a moved pool file, a longer time-out, a new price or key variable.
_UNCOMPARED_KEYS = RUNTIME_FIELDS | _DERIVED_KEYS


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """Where two JSON values first differ (``workers[1].temperature: 0.2 -> 0.7``)."""
    stack: list[tuple[Any, Any, str]] = [(old, new, where)]
    while stack:
        a, b, at = stack.pop()
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = [k for k in {**a, **b} if k not in _UNCOMPARED_KEYS]
            stack.extend(
                (a.get(k), b.get(k), f"{at}.{k}" if at else str(k)) for k in reversed(keys)
            )
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            stack.extend((a[i], b[i], f"{at}[{i}]") for i in range(len(a) - 1, -1, -1))
        elif a != b:
            return f"{at or 'value'} was {_short(a)}, now {_short(b)}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def run_difference(old: BenchConfig, new: BenchConfig, *, shards: bool = False) -> str | None:
    """The first way the run ``new`` differs from the run ``old`` in what decides its
    samples (``the seed was 0, now 5``), or ``None`` when it continues that run.

    ``shards`` compares the shards of one run, which differ in ``shard`` (and may reach
    their models at other addresses).

    Both sides are compared masked (:func:`conductor.redact.mask`): ``config.json`` is
    written with the process's secret values masked, the config of the run now in
    memory holds them, and a value taken from the environment must not make a resume
    look like another run.  (So a resume whose secret changed is not told apart.)"""
    for name, value_of in _SAME_RUN:
        was, now = mask(value_of(old)), mask(value_of(new))
        if name == _FILE_SHA and was is None:
            continue  # a downloaded file not yet fetched when the run started
        if was != now:
            return f"the {name} was {_short(was)}, now {_short(now)}"
    if not shards and old.shard != new.shard:
        return f"--shard was {_shard_text(old)}, now {_shard_text(new)}"
    # Shards may reach the same models at other addresses, so merging compares only the
    # fields above.
    for name, tree_of in () if shards else _SAME_RUN_TREES:
        was_tree = tree_of(old)
        if was_tree is None:
            continue  # not recorded by the run that wrote the config
        diff = _first_difference(mask(was_tree), mask(tree_of(new)))
        if diff is not None:
            return f"the {name} changed ({diff})"
    return None


def _shard_text(config: BenchConfig) -> str:
    # As the file writes it: ``[0, 2]``, or None.
    return str(list(config.shard)) if config.shard is not None else "None"


def check_same_run(
    old: BenchConfig, new: BenchConfig, where: Path, *, shards: bool = False
) -> None:
    """Refuse, naming the first difference, unless ``new`` continues the run ``old``
    (a resume in ``where``, or with ``shards`` a shard ``where`` merged with ``old``'s)."""
    diff = run_difference(old, new, shards=shards)
    if diff is None:
        return
    verb, advice = (
        ("merge", "merge only shards of one run")
        if shards
        else ("resume", "run it in a new --out directory")
    )
    raise UsageError(f"{where}: cannot {verb}: {diff}; {advice}")
