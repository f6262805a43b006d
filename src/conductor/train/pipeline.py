"""Rollouts that do not wait on workers: GRPO as a one-step off-policy pipeline
(``grpo.async_rollouts``).

Synchronous GRPO (TRL's, and the paper's) samples a batch, waits until every
completion's workflow has run on the worker pool, then updates: the policy idles while
the workers answer, and the workers idle while the policy generates and trains.  With
``async_rollouts`` the trainer (:func:`async_trainer_class`) does, at optimizer step k:

1. take batch k, generated at an earlier step, whose worker calls have been running in
   the background since (:class:`PrestartedReward`);
2. generate the next batch with the current policy, record that policy's per-token
   log-probabilities of it as the batch's ``old_per_token_logps``, and start its
   rollouts in the background;
3. wait for batch k's rollouts (the only wait), score it with TRL's own advantage code
   and update on it.  TRL's PPO ratio ``pi_now / pi_old``, ``old`` being the policy that
   sampled the batch, corrects for the steps it waited, clipped at ``clip_epsilon``.

So the worker calls of batch k overlap the generation of batch k+1 and the update of
step k.  ``max_staleness`` d keeps d batches generated ahead: a batch is trained by a
policy at most d steps newer than the one that sampled it (every staleness is recorded
in ``metrics.jsonl``).  Step 0 generates batch 0 itself (staleness 0) and no batch is
generated for a step past the last, so every batch the data loader hands out is
trained once, in order.  Where the data loader has no next batch yet (the end of an
epoch) the next step generates its own (staleness 0).

The batches ahead are read from the data loader one step early
(``get_batch_samples``); each arrives at its step compared with the rows it was
generated from, and its tokens with the ones TRL pads for training, so a batch can
never be trained against another's rows or rewards: a mismatch stops the run.  A
rollout that fails in the background raises its error at the step that scores it.

One process only: on several, each process would generate ahead and call TRL's
collectives from a step that is not the trainer's (refused, as are vLLM generation,
whose weight sync and sampling correction assume the on-policy order, and recursion
training, whose revisions are sampled from the same step's first rounds).

It is built on TRL 1.16's own ``_generate``, ``_get_per_token_logps_and_entropies`` and
``_generate_and_score_completions`` (read in ``trl/trainer/grpo_trainer.py``), whose
loss already takes ``old_per_token_logps`` from its inputs.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .grpo import grpo_trainer_class

if TYPE_CHECKING:
    from .settings import TrainConfig

__all__ = [
    "PipelineEvent",
    "PipelineLog",
    "PrestartedReward",
    "async_trainer_class",
    "check_async_rollouts",
]

#: The dataset columns TRL hands a reward function besides the rows' own.
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")


def check_async_rollouts(config: TrainConfig, world: int) -> None:
    """Raise :class:`UsageError` where ``grpo.async_rollouts`` cannot run as asked."""
    g = config.grpo
    if not g.async_rollouts:
        return
    where = f"{config.path}: " if getattr(config, "path", None) else ""
    if config.recursion is not None:
        raise UsageError(
            f"{where}grpo.async_rollouts cannot be combined with recursion: a revision is "
            "sampled from its first round's record in the same step"
        )
    if world > 1:
        raise UsageError(
            f"{where}grpo.async_rollouts runs in one process; this launch has {world} "
            "(set async_rollouts: false, or launch one process)"
        )
    if g.use_vllm:
        raise UsageError(
            f"{where}grpo.async_rollouts generates with transformers; set use_vllm: false"
        )
    if config.credit != "outcome":
        # Per-step credit is mixed into the advantages by the synchronous trainer's
        # scoring; the pipeline scores a batch a step later and does not carry it yet.
        raise UsageError(
            f"{where}grpo.async_rollouts trains with the outcome credit only; this config "
            f"sets credit: {config.credit} (drop one of the two)"
        )


@dataclass(frozen=True)
class PipelineEvent:
    """One thing the pipeline did: ``what`` (``generate_start``, ``generate_end``,
    ``rollouts_start``, ``rollouts_end``, ``trained``) to batch ``batch`` (numbered in
    the order generated) at ``at`` (``time.monotonic()``), at optimizer ``step``."""

    what: str
    batch: int
    at: float
    step: int


class PipelineLog:
    """What the pipeline did, in order (thread-safe: rollouts end in the background).

    ``events`` keeps every event; ``staleness`` the steps each trained batch waited
    since it was generated, until :meth:`drain_staleness` hands them to a metrics line.
    ``on_event`` (optional) is called with each event as it happens.
    """

    def __init__(self, on_event: Callable[[PipelineEvent], None] | None = None) -> None:
        self.events: list[PipelineEvent] = []
        self._staleness: list[int] = []
        self._lock = threading.Lock()
        self._on_event = on_event

    def event(self, what: str, batch: int, step: int) -> None:
        item = PipelineEvent(what, batch, time.monotonic(), step)
        with self._lock:
            self.events.append(item)
        if self._on_event is not None:
            self._on_event(item)

    def trained(self, batch: int, generated_at: int, step: int) -> None:
        with self._lock:
            self._staleness.append(step - generated_at)
        self.event("trained", batch, step)

    def drain_staleness(self) -> list[int]:
        """The staleness of each batch trained since the last call."""
        with self._lock:
            out, self._staleness = self._staleness, []
        return out


class PrestartedReward:
    """A reward function whose batches can be started before TRL asks for them.

    :meth:`start` runs ``inner(prompts, completions, **columns)`` on one background
    thread (batches in the order started); when TRL later calls this object on the
    same completions it gets that batch's rewards, waiting only if they are not in
    yet, and an error the batch raised in the background is raised there.  A call with
    nothing started (evaluation) runs ``inner`` at once.  ``last_batch`` is the scored
    batch's ``inner.last_batch`` (the per-rollout results), read in the thread that
    ran it.
    """

    __name__ = "conductor_reward"

    def __init__(self, inner: Any, log: PipelineLog | None = None) -> None:
        self.inner = inner
        self.log = log or PipelineLog()
        self.last_batch: list[Any] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conductor-rollouts")
        self._started: deque[tuple[int, list[Any], Future[tuple[list[Any], list[Any]]]]] = deque()

    def _score(self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]) -> Any:
        rewards = self.inner(prompts, completions, **columns)
        return list(rewards), list(getattr(self.inner, "last_batch", []))

    def start(
        self,
        batch: int,
        step: int,
        prompts: list[Any],
        completions: list[Any],
        columns: dict[str, Any],
    ) -> None:
        """Start batch number ``batch``'s rollouts in the background."""

        def work() -> tuple[list[Any], list[Any]]:
            self.log.event("rollouts_start", batch, step)
            try:
                out: tuple[list[Any], list[Any]] = self._score(prompts, completions, columns)
                return out
            finally:
                self.log.event("rollouts_end", batch, step)

        self._started.append((batch, list(completions), self._executor.submit(work)))

    @property
    def in_flight(self) -> int:
        """Batches started and not yet scored."""
        return len(self._started)

    def __call__(
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[float | None]:
        if not self._started:
            rewards, self.last_batch = self._score(prompts, completions, columns)
            return rewards  # type: ignore[no-any-return]
        batch, started, future = self._started.popleft()
        if started != list(completions):
            raise RuntimeError(
                f"async rollouts: asked to score completions other than batch {batch}'s, "
                "the next one started; the pipeline lost its order"
            )
        rewards, self.last_batch = future.result()
        return rewards

    def close(self) -> None:
        """Cancel the batches not yet started and wait for the one running."""
        self._started.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)


class _ReadAhead:
    """The batches read ahead, then the epoch's iterator.  Not a generator delegating
    with ``yield from``: closing one (as its garbage collection does) closes the data
    loader's own iterator, which ends the epoch."""

    def __init__(self, ahead: deque[Any], rest: Iterator[Any]) -> None:
        self.ahead = ahead
        self.rest = rest

    def __iter__(self) -> _ReadAhead:
        return self

    def __next__(self) -> Any:
        if self.ahead:
            return self.ahead.popleft()
        return next(self.rest)


@dataclass
class _Ahead:
    """A batch generated ahead of its step, its rollouts running in the background."""

    batch: int
    step: int
    inputs: list[dict[str, Any]]
    generated: tuple[Any, ...]
    tokens: Any
    old_logps: Any


@functools.cache
def async_trainer_class() -> Any:
    """The :func:`~conductor.train.grpo.grpo_trainer_class` subclass that runs GRPO as
    the pipeline the module docstring describes.  It takes two more keyword
    arguments: ``rollouts``, the :class:`PrestartedReward` that TRL's one reward
    function calls (through any wrapper), and ``max_staleness``."""
    import torch
    from trl.models.utils import disable_gradient_checkpointing
    from trl.trainer.utils import pad

    base: Any = grpo_trainer_class()

    class AsyncRolloutGRPOTrainer(base):  # type: ignore[misc]
        """GRPO whose worker calls overlap the next generation and the update."""

        def __init__(
            self, *args: Any, rollouts: PrestartedReward, max_staleness: int = 1, **kwargs: Any
        ) -> None:
            super().__init__(*args, **kwargs)
            if max_staleness < 1:
                raise UsageError("grpo.max_staleness must be at least 1")
            self._rollouts = rollouts
            self._max_staleness = max_staleness
            self._ahead: deque[_Ahead] = deque()
            self._peeked: deque[Any] = deque()
            self._peeked_from: Any = None
            self._replay: tuple[Any, ...] | None = None
            self._generated = 0
            # What the split of TRL's step relies on: one generation per optimizer
            # step, used once, generated by transformers in this one process.
            problems = [
                what
                for what, bad in (
                    ("num_iterations > 1", self.num_iterations != 1),
                    (
                        "steps_per_generation other than gradient_accumulation_steps",
                        self.args.steps_per_generation != self.args.gradient_accumulation_steps,
                    ),
                    ("vLLM generation", self.use_vllm),
                    ("several processes", self.accelerator.num_processes > 1),
                    ("mask_truncated_completions", self.mask_truncated_completions),
                    ("tools or environments", bool(self.tools) or self.environments is not None),
                    ("several reward functions", len(self.reward_funcs) != 1),
                )
                if bad
            ]
            if problems:
                raise UsageError(f"async rollouts do not support {', '.join(problems)}")

        # -- reading the data loader ahead ---------------------------------------

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            if epoch_iterator is not self._peeked_from:
                # A new epoch: the last one's iterator ended before a batch was peeked.
                if self._peeked:
                    raise RuntimeError("async rollouts: batches read ahead were left behind")
                self._peeked_from = epoch_iterator

            out = super().get_batch_samples(
                _ReadAhead(self._peeked, epoch_iterator), num_batches, device
            )
            # The next steps' batches, for generating ahead (each is repeated for each
            # accumulation step of its optimizer step).
            while len(self._peeked) < self._max_staleness * num_batches:
                try:
                    self._peeked.append(next(epoch_iterator))
                except StopIteration:
                    break
            return out

        # -- the step ----------------------------------------------------------

        def _generate(self, prompts: list[Any]) -> Any:
            if self._replay is not None:
                replay, self._replay = self._replay, None
                return replay
            return super()._generate(prompts)

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> Any:
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            step = int(self.state.global_step)
            if self._ahead:
                current = self._ahead.popleft()
                if current.inputs != inputs:
                    raise RuntimeError(
                        f"async rollouts: step {step} got other rows than batch "
                        f"{current.batch} was generated from"
                    )
            else:
                current = self._start(inputs, step)
            # Generate ahead before waiting on this batch's workers: that is the overlap.
            per_step = self.args.gradient_accumulation_steps
            while len(self._ahead) < self._max_staleness:
                index = len(self._ahead) * per_step
                last = step + 1 + len(self._ahead) >= self.state.max_steps
                if last or index >= len(self._peeked):
                    break
                self._ahead.append(self._start(self._peeked[index], step))
            self._replay = current.generated
            out = super()._generate_and_score_completions(inputs)
            if self._replay is not None:
                raise RuntimeError("async rollouts: TRL scored a batch without _generate")
            tokens = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            if not torch.equal(tokens, current.tokens):
                raise RuntimeError(
                    "async rollouts: TRL padded the batch otherwise than the pipeline did; "
                    "its sampling log-probabilities would not match its tokens"
                )
            staleness = step - current.step
            if staleness > self._max_staleness:
                raise RuntimeError(
                    f"async rollouts: batch {current.batch} waited {staleness} steps "
                    f"(max_staleness {self._max_staleness})"
                )
            out["old_per_token_logps"] = current.old_logps
            self._rollouts.log.trained(current.batch, current.step, step)
            return out

        def _start(self, inputs: list[dict[str, Any]], step: int) -> _Ahead:
            """Generate ``inputs``' completions now, record the sampling policy's token
            log-probabilities, and start their rollouts."""
            batch = self._generated
            self._generated += 1
            log = self._rollouts.log
            prompts = [row["prompt"] for row in inputs]
            log.event("generate_start", batch, step)
            generated = tuple(super()._generate(prompts))
            log.event("generate_end", batch, step)
            prompt_ids, completion_ids, _tool_mask, completions = generated[:4]
            tokens, old_logps = self._sampling_logps(prompt_ids, completion_ids)
            columns = {k: [row[k] for row in inputs] for k in inputs[0] if k not in _NOT_COLUMNS}
            self._rollouts.start(batch, step, prompts, list(completions), columns)
            return _Ahead(batch, step, list(inputs), generated, tokens, old_logps)

        def _sampling_logps(self, prompt_ids: list[Any], completion_ids: list[Any]) -> Any:
            """The batch's tokens padded as TRL pads them for training, and the current
            policy's log-probability of each completion token."""
            device = self.accelerator.device
            pad_id = self._tokenizer.pad_token_id
            multiple = self.pad_to_multiple_of

            def padded(rows: list[Any], value: int, side: str, ones: bool) -> Any:
                tensors = [
                    torch.ones(len(ids), dtype=torch.long) if ones else torch.tensor(ids)
                    for ids in rows
                ]
                return pad(
                    tensors, padding_value=value, padding_side=side, pad_to_multiple_of=multiple
                ).to(device=device)

            completions = padded(completion_ids, pad_id, "right", False)
            tokens = torch.cat([padded(prompt_ids, pad_id, "left", False), completions], dim=1)
            mask = torch.cat(
                [padded(prompt_ids, 0, "left", True), padded(completion_ids, 0, "right", True)],
                dim=1,
            )
            width = completions.size(1)
            with (
                torch.no_grad(),
                disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            ):
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    tokens,
                    mask,
                    width,
                    batch_size=self.args.per_device_train_batch_size,
                )
            return tokens, logps

    return AsyncRolloutGRPOTrainer
