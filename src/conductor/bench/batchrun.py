"""What a bench run needs to send its calls through the providers' batch APIs
(``bench --batch``, or a worker's ``batch: true``): :class:`BatchSetup`, made by the
session before the run directory is taken, and opened by the runner once it holds it
(the journal of batches in flight is the directory's, read under its lock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..batches.waves import BatchBoard, WaveBatcher, check_batch_targets
from ..errors import UsageError
from ..llm.batcher import batched

if TYPE_CHECKING:
    from ..llm.cache import ResponseCache
    from ..llm.caller import CallerSet
    from ..targets import Worker

__all__ = ["BATCH_CONCURRENCY", "BatchSetup", "batch_setup"]

#: Samples in flight at once in a batched run when ``--concurrency`` is not given: a
#: wave holds the calls of every sample in flight, so this is what keeps the number of
#: rounds at the depth of the workflows (OpenAI's limit of one batch, 50,000 requests).
BATCH_CONCURRENCY = 50_000


@dataclass(frozen=True)
class BatchSetup:
    """The run's batching: ``flag`` is ``--batch`` (a worker's ``batch:`` setting wins
    over it), ``callers`` the strategy's, whose batched targets are routed through the
    batcher :meth:`open` makes."""

    flag: bool
    callers: CallerSet
    targets: tuple[Worker, ...]
    cache: ResponseCache | None

    def open(
        self,
        run_dir: Path,
        *,
        on_board: Callable[[BatchBoard], None],
        gate: Callable[[], str | None] | None,
        on_stop: Callable[[str], None],
    ) -> WaveBatcher:
        """The run's batcher over ``run_dir``'s journal, its callers routed through it
        (:meth:`WaveBatcher.start` takes up the batches an earlier run left)."""
        from ..runs.batches import BatchJournal

        batcher = WaveBatcher(
            self.targets,
            BatchJournal(run_dir),
            self.cache,
            on_board=on_board,
            gate=gate,
            on_stop=on_stop,
        )
        self.callers.use_batches(batcher, self.flag)
        return batcher


def batch_setup(
    flag: bool,
    targets: Sequence[Worker],
    callers: CallerSet,
    cache: ResponseCache | None,
) -> BatchSetup | None:
    """The batching of a run calling ``targets``, or ``None`` when none of their calls
    would be batched.  Refuses ``batch: true`` on a worker without a batch API, and a
    batched run without the call cache (a resumed run finds a batch's answers there:
    without it they would be paid for again)."""
    check_batch_targets(targets)
    if not any(batched(t, flag) for t in targets):
        return None
    if cache is None:
        raise UsageError(
            "batched calls need the call cache (a resumed run finds a batch's answers "
            "there); leave out --no-cache, or run without --batch"
        )
    return BatchSetup(flag, callers, tuple(targets), cache)
