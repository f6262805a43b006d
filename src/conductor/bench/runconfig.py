"""What a bench run is: the options it is given (:class:`BenchOptions`), the
``config.json`` built from them, that file read back (:func:`read_run_config`), the
invocation that rebuilds the run (:func:`stored_invocation`), and whether a resume, or
a merge of shards, continues the same run (:func:`run_difference`, and
``_check_same_run``, which refuses one that does not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..benchmark import BenchmarkSpec
from ..datasets.samples import dataset_provenance
from ..errors import UsageError
from ..grading import Grader
from ..record import now_iso
from ..runs.rundir import CONFIG
from ..strategies import Strategy

if TYPE_CHECKING:
    from .trained import TrainedQuestions


#: 2 added ``invocation`` (what rebuilds the run for ``--resume DIR`` alone) and the
#: pool file's SHA-256; schema 1 directories are still read and resumed.
CONFIG_SCHEMA = 2


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
    #: What rebuilds this run from its directory alone (benchmark, pool path, strategy,
    #: Conductor, budgets...): the CLI's options, kept in ``config.json``.
    invocation: Mapping[str, Any] | None = None
    #: The SHA-256 of the pool file's text, kept in ``config.json``.
    pool_sha256: str | None = None
    #: The questions the Conductor checkpoint was trained on: how many of this run's
    #: samples are among them goes into ``config.json`` (``trained_on``) ...
    trained_on: TrainedQuestions | None = None
    #: ... and with this set, those samples are not run at all.
    exclude_trained: bool = False
    #: Delete the run already in ``out_dir`` (the files bench wrote) before starting.
    overwrite: bool = False


def _config(
    spec: BenchmarkSpec,
    strategy: Strategy,
    grader: Grader,
    pool_dict: dict[str, Any],
    options: BenchOptions,
    epochs: int,
    trained: int | None = None,
) -> dict[str, Any]:
    trained_on = options.trained_on
    return {
        "schema_version": CONFIG_SCHEMA,
        "benchmark": {
            "name": spec.name,
            "paper_key": spec.paper_key,
            "grader": grader.name,
            "grader_version": grader.version,
            "grader_options": spec.grader_options,
            # How the grader reads answers (math, choice: "official" as the reference
            # harness, or "conductor"), recorded even when the file leaves the default.
            "grader_extraction": getattr(grader, "extraction", None),
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
        "pool_sha256": options.pool_sha256,
        "invocation": dict(options.invocation) if options.invocation is not None else None,
        "trained_on": (
            {
                "checkpoint": trained_on.source,
                "questions": len(trained_on.hashes),
                "samples": trained,
                # The held-out sets its training did not compare with (only when some).
                **(
                    {"unchecked_holdout": list(trained_on.unchecked)}
                    if trained_on.unchecked
                    else {}
                ),
            }
            if trained_on is not None
            else None
        ),
        # Null unless set, so that runs from before the option resume as they were.
        "exclude_trained": options.exclude_trained or None,
        "created_at": now_iso(),
        "conductor_version": __version__,
    }


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The ``config.json`` of a bench run directory; one sentence when there is none or
    it cannot be read."""
    path = run_dir / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: no {CONFIG}; not a bench run directory") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{path}: cannot be read as a run config ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmark"), dict):
        raise UsageError(f"{path}: not a bench run config")
    return data


def stored_invocation(config: Mapping[str, Any]) -> dict[str, Any]:
    """The options that rebuild the run ``config`` describes, for ``--resume DIR``.

    Schema 2 keeps them as given.  For a schema 1 config they are read back from what it
    recorded (benchmark file, pool path, strategy, data file, limits, Conductor
    settings); the ``--conductor`` option was not recorded, so the pool's own Conductor
    is assumed, and a run started with another one is refused (naming the difference)
    until ``--conductor`` is given again."""
    kept = config.get("invocation")
    if isinstance(kept, Mapping):
        return dict(kept)
    bench = config.get("benchmark") or {}
    prov = bench.get("provenance") or {}
    detail = config.get("strategy_detail") or {}
    found = detail.get("settings")
    settings: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    shard = config.get("shard")
    return {
        "benchmark": prov.get("benchmark_file") or bench.get("name"),
        "pool": (config.get("pool") or {}).get("path"),
        "conductor": None,
        "strategy": config.get("strategy"),
        "data": prov.get("file") if prov.get("source_kind") == "file" else None,
        "limit": config.get("limit"),
        "epochs": config.get("epochs"),
        "seed": config.get("seed", 0),
        "shard": f"{shard[0]}/{shard[1]}" if isinstance(shard, list) and len(shard) == 2 else None,
        "max_steps": settings.get("max_steps"),
        "rounds": settings.get("rounds"),
        "budget_usd": settings.get("budget_usd"),
        "max_calls": settings.get("max_calls"),
        "concurrency": (config.get("settings") or {}).get("concurrency"),
    }


# What must match for a resume (or a merge) to continue the same run, with the name a
# refusal uses.  Paths are not compared (a moved pool or data file with the same
# contents is the same run); contents and hashes are.
_SAME_RUN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("benchmark", ("benchmark", "name")),
    ("grader", ("benchmark", "grader")),
    ("grader version", ("benchmark", "grader_version")),
    ("grader options", ("benchmark", "grader_options")),
    ("grader extraction", ("benchmark", "grader_extraction")),
    ("prompt template", ("benchmark", "provenance", "template_sha256")),
    ("data file contents (SHA-256)", ("benchmark", "provenance", "file_sha256")),
    ("dataset revision", ("benchmark", "provenance", "revision")),
    ("dataset filters", ("benchmark", "provenance", "filters")),
    ("strategy", ("strategy",)),
    ("epochs", ("epochs",)),
    ("seed", ("seed",)),
    ("limit", ("limit",)),
    ("--exclude-trained setting", ("exclude_trained",)),
)
# Compared field by field, so a refusal names e.g. ``settings.max_steps``.
_SAME_RUN_TREES = (("strategy settings", "strategy_detail"), ("pool", "pool"))
# How a model is reached, paced and paid for does not decide its answers: a resume may
# change these (a moved pool file, a longer time-out, a new price or key variable).
_RUNTIME_KEYS = frozenset(
    {
        "path",
        "api_key_env",
        "max_concurrency",
        "timeout_s",
        "total_timeout_s",
        "max_retries",
        "price",
        "n_threads",
        "n_gpu_layers",
    }
)


# Descriptions derived from fields compared anyway (the Conductor's ``sampling`` is in its
# target's params, ``template_form`` follows the template's hash): skipping them keeps
# runs recorded before they existed resumable.
_DERIVED_KEYS = frozenset({"sampling", "template_form"})
_UNCOMPARED_KEYS = _RUNTIME_KEYS | _DERIVED_KEYS


def _get(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


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


def run_difference(
    old: Mapping[str, Any], new: Mapping[str, Any], *, shards: bool = False
) -> str | None:
    """The first way the run ``new`` differs from the run ``old`` in what decides its
    samples (``the seed was 0, now 5``), or ``None`` when it continues that run.

    ``shards`` compares the shards of one run, which differ in ``shard`` (and may reach
    their models at other addresses)."""
    for name, path in _SAME_RUN:
        if path[-1] == "file_sha256" and _get(old, path) is None:
            continue  # a downloaded file not yet fetched when the run started
        if _get(old, path) != _get(new, path):
            return f"the {name} was {_short(_get(old, path))}, now {_short(_get(new, path))}"
    if not shards and old.get("shard") != new.get("shard"):
        return f"--shard was {old.get('shard')}, now {new.get('shard')}"
    for name, key in () if shards else _SAME_RUN_TREES:
        # Shards may reach the same models at other addresses, so merging compares
        # only the fields above.
        if key not in old:
            continue  # not recorded by the run that wrote the config
        diff = _first_difference(old.get(key), new.get(key))
        if diff is not None:
            return f"the {name} changed ({diff})"
    return None


def _check_same_run(
    old: dict[str, Any], new: dict[str, Any], where: Path, *, shards: bool = False
) -> None:
    """Refuse, naming the first difference, unless ``new`` continues the run ``old``."""
    diff = run_difference(old, new, shards=shards)
    if diff is None:
        return
    verb, advice = (
        ("merge", "merge only shards of one run")
        if shards
        else ("resume", "run it in a new --out directory")
    )
    raise UsageError(f"{where}: cannot {verb}: {diff}; {advice}")
