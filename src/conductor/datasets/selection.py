"""A source's seeded selection (:class:`~conductor.benchmark.Selection`): which row
positions, out of ``n`` rows, a benchmark reads.

The two shuffles are the ones the paper authors' code ran, called the same way, so
that the same rows come out:

* ``python``: ``random.Random(seed).shuffle(list(range(n)))``; the authors' splits of
  MATH-500, RLPR and LiveCodeBench (``guf.utils.get_or_create_indices``).
* ``numpy``: ``numpy.random.default_rng(seed).permutation(n)``, which is what
  ``datasets.Dataset.shuffle(seed=seed)`` computes; the authors' MMLU subset.

The shuffled positions are then cut, in the order the rule lists its parts, each part
``int(n * fraction)`` (the authors' rounding: down) or a count; ``rest`` is what is
left after the last.  A rule's ``take`` keeps the first so many positions of its part in
the shuffled order: the authors' evaluation read the first ``eval_max_samples`` rows of
the shuffled test part (their ``custom_data/dataset.py``), not the first in dataset order.
"""

from __future__ import annotations

import random

from ..benchmark import Selection
from ..errors import MissingDependencyError

__all__ = ["REST", "part_sizes", "selected_positions"]

#: The part after every cut one.
REST = "rest"


def part_sizes(select: Selection, n: int) -> dict[str, int]:
    """How many of ``n`` rows each part of ``select`` holds, ``rest`` last.

    A fraction takes ``int(n * fraction)`` rows, a count that many (fewer when the
    rows run out), so the parts always add up to ``n``.
    """
    sizes: dict[str, int] = {}
    left = n
    for name, size in select.cut:
        # bool is an int; the reader never lets one through, so an int is a count here.
        take = size if isinstance(size, int) else int(n * size)
        take = min(take, left)
        sizes[name] = take
        left -= take
    sizes[REST] = left
    return sizes


def _shuffled(select: Selection, n: int) -> list[int]:
    if select.shuffle == "python":
        ids = list(range(n))
        random.Random(select.seed).shuffle(ids)
        return ids
    try:
        import numpy as np
    except ImportError:
        raise MissingDependencyError(
            "a numpy-shuffled selection needs numpy: pip install 'datasets>=3,<5'"
        ) from None
    return [int(i) for i in np.random.default_rng(select.seed).permutation(n)]


def selected_positions(select: Selection, n: int) -> list[int]:
    """The positions (0-based, among ``n`` rows) of part ``select.part``, in the
    shuffled order the rule cuts them from; with ``select.take``, the first that many."""
    order = _shuffled(select, n)
    start = 0
    for name, size in part_sizes(select, n).items():
        if name == select.part:
            # The part is cut first and only then shortened, so a take never moves a
            # row across parts: the training part stays the same with or without it.
            if select.take is not None:
                size = min(size, select.take)
            return order[start : start + size]
        start += size
    raise ValueError(f"the selection has no part {select.part!r}")
