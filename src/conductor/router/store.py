"""The router directory: the one writer and reader of its files.

::

    DIR/router.json   what the router is: its arms and their costs, the features, the
                      decision's settings, what it was fitted on (run directories, pool
                      hashes, the training questions' keys, so that a bench can count
                      them as it counts a checkpoint's), and how it did on held-out
                      questions
    DIR/head.npy      the head's weights and, as the last row, its biases:
                      ``(dim + 1, arms)`` float64 (numpy's format, read without pickle)

Both ``0600`` in a ``0700`` directory.  A router directory is read as a hostile author
may have written it: every field is checked for its type and range, the head file must
have the shape the features give and hold finite numbers, its SHA-256 must be the one
``router.json`` records, and it is refused past the size that shape needs.
"""

from __future__ import annotations

import errno
import hashlib
import io
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import UsageError
from ..private import make_private_dir, write_private
from ..record import now_iso
from ..redact import masked_json
from ..text import printable
from ..userfiles import UnreadableFileError, parse_json, read_regular
from .features import featurizer_from
from .head import LogisticHead
from .model import Router

if TYPE_CHECKING:
    from .fit import RouterFit

__all__ = [
    "HEAD_FILE",
    "ROUTER_FILE",
    "RouterDir",
    "RouterFileError",
    "load_router",
    "save_router",
]

ROUTER_FILE = "router.json"
HEAD_FILE = "head.npy"
FORMAT = "conductor-router"
FORMAT_VERSION = 1
#: The most a ``router.json`` may weigh (training keys of a million questions fit).
_MAX_JSON = 256 * 1024 * 1024
#: The most numbers a head may hold (128 MiB of float64): 2^20 hashed features for 15
#: arms, or the default 4,096 for 256.
_MAX_HEAD_CELLS = 1 << 24


class RouterFileError(UsageError):
    """A router directory that cannot be used: one sentence naming the file and field."""


@dataclass(frozen=True)
class RouterDir:
    """A router as read from its directory, with what it records beside the router."""

    path: Path
    router: Router
    #: The question keys it was fitted on, and how they were made.
    training_keys: frozenset[str]
    normalisation: str
    #: The SHA-256 of the head file, and of the pool files of the runs it was fitted on.
    head_sha256: str
    pool_sha256: tuple[str, ...]
    #: ``router.json`` as read (its evaluation, for a reader that shows it).
    info: Mapping[str, Any]


def _fit_dict(fit: RouterFit) -> dict[str, Any]:
    from ..datasets.questions import NORMALISATION

    router = fit.router
    data = fit.data
    keys = sorted(set(fit.training_keys))
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": now_iso(),
        "conductor_version": __version__,
        "arms": [
            {"strategy": a, "cost_usd": c, "train_accuracy": acc}
            for a, c, acc in zip(router.arms, router.costs, router.accuracies, strict=True)
        ],
        "features": {"name": router.featurizer.name, "settings": router.featurizer.settings()},
        "head": {"file": HEAD_FILE, "penalty": router.head.penalty},
        "decision": {
            "cost_weight": router.cost_weight,
            "margin": router.margin,
            "fallback": router.fallback,
            "threshold": router.threshold,
        },
        "training": {
            "runs": list(data.sources),
            "pool_sha256": list(data.pool_sha256),
            "benchmarks": sorted(set(data.benchmarks)),
            "questions": len(fit.train_rows),
            "heldout_questions": len(fit.heldout_rows),
            "holdout": fit.settings.holdout,
            "seed": fit.settings.seed,
            "unpriced_arms": list(data.unpriced),
        },
        "evaluation": fit.evaluation(),
        "training_questions": {"normalisation": NORMALISATION, "count": len(keys), "sha256": keys},
    }


def save_router(fit: RouterFit, directory: str | Path) -> Path:
    """Write ``fit``'s router into ``directory`` (created ``0700``); returns its
    ``router.json``.  The head is written first, so a ``router.json`` always names a
    complete head."""
    import numpy as np

    target = make_private_dir(Path(directory).expanduser())
    head = fit.router.head
    table = np.vstack([head.weights, head.bias[None, :]]).astype("<f8")
    buffer = io.BytesIO()
    np.save(buffer, table, allow_pickle=False)
    raw = buffer.getvalue()
    write_private(target / HEAD_FILE, raw)
    data = _fit_dict(fit)
    data["head"]["sha256"] = hashlib.sha256(raw).hexdigest()
    path = target / ROUTER_FILE
    write_private(path, masked_json(data, indent=1, ensure_ascii=False) + "\n")
    return path


class _Fields:
    """Typed reads of ``router.json``'s fields, each failure one sentence."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, why: str) -> RouterFileError:
        return RouterFileError(f"{printable(str(self.path))}: {field}: {why}")

    def obj(self, data: Any, field: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(field, f"expected an object, got {type(data).__name__}")
        return data

    def text(self, data: Mapping[str, Any], key: str, where: str, optional: bool = False) -> Any:
        value = data.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}.{key}", "expected a non-empty string")
        return value

    def number(
        self, data: Mapping[str, Any], key: str, where: str, *, optional: bool = False,
        low: float = 0.0, high: float = math.inf,
    ) -> Any:  # fmt: skip
        value = data.get(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"{where}.{key}", f"expected a number, got {value!r}")
        if not math.isfinite(value) or not low <= value <= high:
            raise self.fail(
                f"{where}.{key}", f"expected a number from {low} to {high}, got {value!r}"
            )
        return float(value)


def _read_regular(path: Path, limit: int, what: str) -> bytes:
    """``path``'s bytes: a regular file (a device such as ``/dev/zero`` never ends, a
    FIFO never opens) of at most ``limit`` bytes, read no further than that even if it
    grows meanwhile; ``FileNotFoundError`` when nothing is there."""
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    try:
        return read_regular(path, what, limit)
    except UnreadableFileError as exc:
        raise RouterFileError(str(exc)) from None


def _read_json(path: Path) -> Any:
    try:
        text = _read_regular(path, _MAX_JSON, "router file").decode("utf-8")
    except FileNotFoundError:
        raise RouterFileError(
            f"{printable(str(path.parent))}: no {ROUTER_FILE}; not a router directory "
            "(make one with: conductor fit-router RUN_DIR... --out DIR)"
        ) from None
    except UnicodeDecodeError as exc:
        raise RouterFileError(
            f"{printable(str(path))}: not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:
        raise RouterFileError(
            f"{printable(str(path))}: cannot be read ({exc.strerror or exc})"
        ) from None
    try:
        return parse_json(text, path)
    except UnreadableFileError as exc:
        raise RouterFileError(str(exc)) from None


def _read_head(directory: Path, f: _Fields, head: Mapping[str, Any], dim: int, arms: int) -> Any:
    import numpy as np

    name = f.text(head, "file", "head")
    if name != HEAD_FILE:
        raise f.fail("head.file", f"expected {HEAD_FILE!r}, got {name!r}")
    digest = f.text(head, "sha256", "head")
    path = directory / HEAD_FILE
    if (dim + 1) * arms > _MAX_HEAD_CELLS:
        # What router.json says fixes how much is read: a hostile one could ask for GiBs.
        raise f.fail(
            "features",
            f"a head of ({dim + 1}, {arms}) is more than {_MAX_HEAD_CELLS:,} numbers",
        )
    limit = 8 * (dim + 1) * arms + 4096  # the array and numpy's header
    try:
        raw = _read_regular(path, limit, f"head of ({dim + 1}, {arms})")
    except FileNotFoundError:
        raise RouterFileError(f"{printable(str(path))}: missing (router.json names it)") from None
    except OSError as exc:
        raise RouterFileError(
            f"{printable(str(path))}: cannot be read ({exc.strerror or exc})"
        ) from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise RouterFileError(
            f"{printable(str(path))}: its SHA-256 is not the one router.json records (changed "
            "since the router was fitted?)"
        )
    try:
        table = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise RouterFileError(f"{printable(str(path))}: not a numpy array file ({exc})") from None
    if table.shape != (dim + 1, arms) or table.dtype.kind != "f":
        raise RouterFileError(
            f"{printable(str(path))}: a {table.dtype} array of shape {table.shape}, "
            f"expected floats of shape ({dim + 1}, {arms})"
        )
    if not np.isfinite(table).all():
        raise RouterFileError(f"{printable(str(path))}: holds numbers that are not finite")
    return table.astype(float)


def load_router(directory: str | Path) -> RouterDir:
    """The router in ``directory`` (see the module for what is checked)."""
    path = Path(directory).expanduser()
    file = path / ROUTER_FILE
    f = _Fields(file)
    data = f.obj(_read_json(file), "(top level)")
    if data.get("format") != FORMAT:
        raise f.fail("format", f"expected {FORMAT!r}: not a router file")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise f.fail(
            "format_version",
            f"{version!r}, which this conductor does not read (it reads {FORMAT_VERSION}); "
            "upgrade conductor or fit the router again",
        )
    arms_raw = data.get("arms")
    if not isinstance(arms_raw, list) or len(arms_raw) < 2 or len(arms_raw) > 256:
        raise f.fail("arms", "expected a list of 2 to 256 arms")
    arms: list[str] = []
    costs: list[float] = []
    accuracies: list[float] = []
    for i, arm in enumerate(arms_raw):
        arm = f.obj(arm, f"arms[{i}]")
        name = f.text(arm, "strategy", f"arms[{i}]")
        if name in arms:
            raise f.fail(f"arms[{i}].strategy", f"{name!r} twice")
        arms.append(name)
        costs.append(f.number(arm, "cost_usd", f"arms[{i}]"))
        accuracies.append(f.number(arm, "train_accuracy", f"arms[{i}]", high=1.0))
    features = f.obj(data.get("features"), "features")
    settings = f.obj(features.get("settings", {}), "features.settings")
    try:
        featurizer = featurizer_from(f.text(features, "name", "features"), settings)
    except UsageError as exc:
        raise f.fail("features", str(exc)) from None
    decision = f.obj(data.get("decision"), "decision")
    fallback = f.text(decision, "fallback", "decision", optional=True)
    if fallback is not None and fallback not in arms:
        raise f.fail("decision.fallback", f"{fallback!r} is not one of the arms")
    head_info = f.obj(data.get("head"), "head")
    table = _read_head(path, f, head_info, featurizer.dim, len(arms))
    head = LogisticHead(
        weights=table[:-1],
        bias=table[-1],
        penalty=f.number(head_info, "penalty", "head"),
    )
    router = Router(
        arms=tuple(arms),
        costs=tuple(costs),
        featurizer=featurizer,
        head=head,
        accuracies=tuple(accuracies),
        cost_weight=f.number(decision, "cost_weight", "decision"),
        margin=f.number(decision, "margin", "decision", high=1.0),
        fallback=fallback,
        threshold=f.number(decision, "threshold", "decision", optional=True, high=1.0),
    )
    questions = f.obj(data.get("training_questions"), "training_questions")
    hashes = questions.get("sha256")
    if not isinstance(hashes, list) or not all(
        isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)
        for h in hashes
    ):
        raise f.fail("training_questions.sha256", "expected a list of SHA-256 hex digests")
    training = f.obj(data.get("training", {}), "training")
    pools = training.get("pool_sha256", [])
    if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
        raise f.fail("training.pool_sha256", "expected a list of strings")
    return RouterDir(
        path=path,
        router=router,
        training_keys=frozenset(hashes),
        normalisation=f.text(questions, "normalisation", "training_questions"),
        head_sha256=str(head_info["sha256"]),
        pool_sha256=tuple(pools),
        info=data,
    )
