"""What a trained Conductor was trained on, as ``conductor bench`` reads it: the
training-question keys a checkpoint records (:class:`TrainedQuestions`), which bench
counts or, with ``--exclude-trained``, skips.  The keys are made by
:mod:`conductor.datasets.questions`; the checkpoint writes them when ``conductor
train`` runs its guard (:mod:`conductor.train.contamination`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from types import ModuleType

    from ..conductors.spec import Conductor
    from ..grading.types import Sample
    from ..router import RouterDir

__all__ = ["TrainedQuestions", "trained_questions_of", "trained_questions_of_router"]

log = logging.getLogger("conductor")


@dataclass(frozen=True)
class TrainedQuestions:
    """The training-question keys a checkpoint records, where they were read, how they
    were made, and the held-out sets training could not compare them with."""

    source: str
    hashes: frozenset[str]
    normalisation: str = field(default_factory=lambda: _questions().NORMALISATION)
    unchecked: tuple[str, ...] = ()

    def contains(self, sample: Sample) -> bool:
        """Whether ``sample`` is one of the questions the checkpoint was trained on."""
        return _questions().SAMPLE_KEYS[self.normalisation](sample) in self.hashes


def _questions() -> ModuleType:
    # The question keys (their patterns are compiled on import, milliseconds) are
    # loaded only where a checkpoint records training questions; every other bench
    # asks and gets None.
    from ..datasets import questions

    return questions


def trained_questions_of(conductor: Conductor) -> TrainedQuestions | None:
    """The training questions recorded by ``conductor``'s checkpoint, if it is a
    checkpoint that records them (``conductor.json`` ``training_questions``).

    A record made with ``conductor-question-v1`` is compared with v1 keys.  Raises
    :class:`~conductor.errors.UsageError` when the record was made with a
    normalisation this version does not know (the hashes would not be comparable).
    Warns when the checkpoint was trained without comparing its questions with some
    held-out set (``accept_unchecked_holdout``).
    """
    if conductor.backend != "checkpoint":
        return None
    from ..conductors.checkpoint import read_training_guard, read_training_questions

    directory = Path(conductor.target.model)
    found = read_training_questions(directory)
    if found is None:
        return None
    normalisation, hashes = found
    _check_normalisation(directory, normalisation)
    guard = read_training_guard(directory) or {}
    listed = guard.get("unchecked")
    unchecked = tuple(str(u) for u in listed) if isinstance(listed, list) else ()
    if unchecked:
        log.warning(
            "%s was trained without comparing its training questions with %s "
            "(accept_unchecked_holdout: true); scores on those may include trained questions",
            directory,
            "; ".join(unchecked),
        )
    return TrainedQuestions(
        source=str(directory), hashes=hashes, normalisation=normalisation, unchecked=unchecked
    )


def _check_normalisation(source: Path, normalisation: str) -> None:
    known = _questions().SAMPLE_KEYS
    if normalisation not in known:
        raise UsageError(
            f"{source}: its training questions were hashed with {normalisation!r}, "
            f"which this conductor does not know (it knows {', '.join(map(repr, known))}); "
            "upgrade conductor to compare them"
        )


def trained_questions_of_router(routed: RouterDir) -> TrainedQuestions:
    """The questions a router was fitted on (its held-out questions are not among them),
    compared as a checkpoint's are."""
    _check_normalisation(routed.path, routed.normalisation)
    return TrainedQuestions(
        source=str(routed.path), hashes=routed.training_keys, normalisation=routed.normalisation
    )
