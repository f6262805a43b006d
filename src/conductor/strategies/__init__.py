"""Ways to answer a benchmark question: the Conductor, and the baselines it is compared to.

- ``conductor``: the Conductor writes a workflow per question (the executor runs it);
  :mod:`.conductor`.
- ``single:WORKER``, ``vote:K:WORKER``, ``moa`` / ``moa:AGGREGATOR`` and
  ``reflect:K:WORKER``: plans fixed in advance, :mod:`.baselines`
  (:func:`parse_strategy` reads their names).

Each is a :class:`Strategy` (:mod:`.base`), the only face ``bench``, ``ask`` and
``serve`` see of it, and returns a :class:`~conductor.record.RunRecord` of the same
shape, so ``trace`` and ``report`` treat baselines and Conductor runs alike.  How votes
read answers is :mod:`.answers`; how many samples to run at once, :mod:`.capacity`.
"""

from __future__ import annotations

from .answers import AnswerKey, answer_key_for, short_answer_key
from .base import (
    CONDUCTOR_ROLE,
    CallPlan,
    EarlierReplies,
    PlannedCall,
    PlannedShare,
    Strategy,
)
from .baselines import MOA_INSTRUCTION, REFLECT_INSTRUCTION, FixedStrategy, parse_strategy
from .capacity import (
    DEFAULT_CONCURRENCY,
    capped_warning,
    concurrency_warning,
    default_concurrency,
    sample_capacity_of,
)
from .conductor import ConductorStrategy

__all__ = [
    "CONDUCTOR_ROLE",
    "DEFAULT_CONCURRENCY",
    "MOA_INSTRUCTION",
    "REFLECT_INSTRUCTION",
    "AnswerKey",
    "CallPlan",
    "ConductorStrategy",
    "EarlierReplies",
    "FixedStrategy",
    "PlannedCall",
    "PlannedShare",
    "Strategy",
    "answer_key_for",
    "capped_warning",
    "concurrency_warning",
    "default_concurrency",
    "parse_strategy",
    "sample_capacity_of",
    "short_answer_key",
]
