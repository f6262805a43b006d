"""What a router learns from: bench runs of the same questions by several strategies.

A ``singles`` run (``bench --strategy singles``) is one run per worker; runs of fixed
workflows (``moa``, ``vote:K:W``, ``reflect:K:W``) and of the Conductor may stand beside
them.  Each run's strategy is an *arm*; each question answered by every arm is a row:
its prompt (what the strategy was given, so the router sees at routing time what it saw
in training), its key (:func:`conductor.datasets.questions.question_key` of the
benchmark's question, what a bench compares trained questions by), and per arm its
score on the question as :mod:`conductor.runs.oracle` defines it (the mean over the
question's epochs) and the mean cost of one run.

A run that failed scores 0 for its arm (a worker that cannot answer is a bad choice);
a question some arm never answered is left out, and counted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..runs.oracle import QuestionOracle, question_oracle, question_score, unit_score
from ..text import plural, printable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["RoutingData", "read_routing_data"]

log = logging.getLogger("conductor")


@dataclass(frozen=True)
class RoutingData:
    """Questions answered by every arm, with each arm's score and cost on each."""

    arms: tuple[str, ...]
    benchmarks: tuple[str, ...]
    sample_ids: tuple[str, ...]
    prompts: tuple[str, ...]
    keys: tuple[str, ...]
    #: ``(questions, arms)`` mean score in [0, 1] over the question's epochs.
    scores: np.ndarray
    #: ``(questions, arms)`` mean cost in USD of one run (0 where no price is known).
    costs: np.ndarray
    #: The arms whose cost is unknown for some run (counted as 0).
    unpriced: tuple[str, ...]
    #: The run directories read, and the pool files' SHA-256 they were run with.
    sources: tuple[str, ...]
    pool_sha256: tuple[str, ...]
    #: Questions left out because some arm has no record of them.
    dropped: int

    def __len__(self) -> int:
        return len(self.sample_ids)

    def take(self, rows: Sequence[int]) -> RoutingData:
        """The same arms on the questions ``rows`` only."""
        import dataclasses

        import numpy as np

        index = np.asarray(rows, dtype=int)
        return dataclasses.replace(
            self,
            sample_ids=tuple(self.sample_ids[i] for i in rows),
            prompts=tuple(self.prompts[i] for i in rows),
            keys=tuple(self.keys[i] for i in rows),
            benchmarks=tuple(self.benchmarks[i] for i in rows),
            scores=self.scores[index],
            costs=self.costs[index],
        )

    def oracle(self) -> QuestionOracle:
        """The per-question oracle of these arms on these questions
        (:func:`conductor.runs.oracle.question_oracle`)."""
        return question_oracle(self.arms, self.scores.tolist())


@dataclass
class _Cell:
    """What one arm did on one question, over its epochs."""

    prompt: str
    key: str
    scores: dict[int, float]
    costs: dict[int, float | None]
    #: Whether some call of the epoch's record had no known price.
    unpriced: dict[int, bool]


def _run_dirs(paths: Iterable[Path]) -> list[Path]:
    from ..runs.rundir import sample_dirs

    dirs: list[Path] = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"{printable(str(path))}: no such run directory")
        for found in sample_dirs(path):
            if found not in dirs:
                dirs.append(found)
    return dirs


def read_routing_data(paths: Sequence[str | Path]) -> RoutingData:
    """The routing data of the bench run directories ``paths`` (a ``singles`` run
    stands for its ``single-WORKER`` directories).

    Raises :class:`~conductor.errors.UsageError` when a directory is not a bench run,
    when fewer than two arms are given (there is nothing to choose between), or when no
    question was answered by every arm."""
    from ..datasets.questions import question_key
    from ..runs.config import read_run_config
    from ..runs.rundir import SAMPLES, iter_heads

    dirs = _run_dirs(Path(p).expanduser() for p in paths)
    cells: dict[str, dict[tuple[str, str], _Cell]] = defaultdict(dict)
    pools: list[str] = []
    for run in dirs:
        config = read_run_config(run)
        arm = config.strategy or "conductor"
        if arm.startswith("router:"):
            raise UsageError(
                f"{printable(str(run))}: a run of {printable(arm)} cannot be a router's arm "
                "(a router chooses among workers, fixed workflows and the Conductor)"
            )
        if config.pool_sha256 and config.pool_sha256 not in pools:
            pools.append(config.pool_sha256)
        # Heads only (no rounds, no calls): a router needs each record's question, grade
        # and totals, and `report` reads every single run this way.  A (sample, epoch)
        # recorded twice keeps its last record, as `latest` reading does.
        for record, _steps in iter_heads(run / SAMPLES):
            if record.sample_id is None:
                continue
            benchmark = record.benchmark or config.benchmark.name
            own = record.sample_question
            question = own if own is not None else record.question
            # Keyed as a bench keys its samples, choices and all, so that a bench with
            # the router counts the questions it was fitted on.
            choices = record.sample_choices if own is not None else None
            options = choices or None
            cell = cells[arm].get((benchmark, record.sample_id))
            if cell is None:
                key = question_key(question, options).full
                cell = _Cell(record.question, key, {}, {}, {})
                cells[arm][(benchmark, record.sample_id)] = cell
            epoch = record.epoch or 0
            score = (record.grade or {}).get("score")
            cell.scores[epoch] = unit_score(score)
            cost = record.totals.cost_usd
            cell.costs[epoch] = cost if isinstance(cost, (int, float)) and cost >= 0 else None
            cell.unpriced[epoch] = (
                bool(record.totals.unknown_cost_calls) or cell.costs[epoch] is None
            )
    arms = tuple(cells)
    if len(arms) < 2:
        shown = ", ".join(printable(str(p)) for p in paths)
        raise UsageError(
            f"a router chooses between strategies, and {shown} "
            f"{'holds' if len(paths) == 1 else 'hold'} runs of {plural(len(arms), 'strategy')}"
            f"{': ' + arms[0] if arms else ''}; give a singles run (bench --strategy singles) "
            "or runs of two or more strategies on the same questions"
        )
    if len(pools) > 1:
        log.warning(
            "the runs were made with %d different pool files: an arm's worker may not be "
            "the same model in every run",
            len(pools),
        )
    every = set.intersection(*(set(c) for c in cells.values()))
    union = set.union(*(set(c) for c in cells.values()))
    order = sorted(every)
    if not order:
        raise UsageError(
            "no question was answered by every strategy in the runs given: run each "
            "strategy on the same benchmark and questions"
        )
    # An arm is unpriced where the last record of some (sample, epoch) it ran was.
    unpriced = {
        a for a, mine in cells.items() if any(any(c.unpriced.values()) for c in mine.values())
    }
    return _table(arms, order, cells, unpriced, dirs, pools, len(union) - len(every))


def _table(
    arms: tuple[str, ...],
    order: list[tuple[str, str]],
    cells: dict[str, dict[tuple[str, str], _Cell]],
    unpriced: set[str],
    dirs: list[Path],
    pools: list[str],
    dropped: int,
) -> RoutingData:
    import numpy as np

    scores = np.zeros((len(order), len(arms)))
    costs = np.zeros((len(order), len(arms)))
    for i, where in enumerate(order):
        for j, arm in enumerate(arms):
            cell = cells[arm][where]
            scores[i, j] = question_score(cell.scores)
            known = [c for c in cell.costs.values() if c is not None]
            costs[i, j] = sum(known) / len(known) if known else 0.0
    first = cells[arms[0]]
    return RoutingData(
        arms=arms,
        benchmarks=tuple(b for b, _ in order),
        sample_ids=tuple(s for _, s in order),
        prompts=tuple(first[w].prompt for w in order),
        keys=tuple(first[w].key for w in order),
        scores=scores,
        costs=costs,
        unpriced=tuple(a for a in arms if a in unpriced),
        sources=tuple(str(d) for d in dirs),
        pool_sha256=tuple(pools),
        dropped=dropped,
    )
