"""On-policy recursion training: a ``GRPOTrainer`` that samples, within one step,
each marked group's revisions from the policy being trained (see
:func:`recursion_trainer`; the rollouts themselves are :mod:`.recursion`'s).

torch and TRL are imported inside the function.
"""

from __future__ import annotations

from typing import Any

from .grpo import SUPPORTED_TRL, grpo_trainer_class
from .policy import policy_prompt

__all__ = ["recursion_trainer"]


def recursion_trainer(
    discount: float, reward: Any, *, render_prompts: bool = False, **kwargs: Any
) -> Any:
    """A ``GRPOTrainer`` that samples recursion rounds on-policy, built with ``kwargs``.

    Why a subclass that wraps ``_generate``: it is the one place in TRL's step where
    (a) round 1 has just been sampled by TRL's own backend (transformers, or vLLM
    colocated / server with the weights synced to the current policy), (b) the prompt
    and completion token ids each row trains on can still be replaced, and (c) values
    per row can be handed to the reward functions (``extra_fields``).  Everything after
    it (the batch layout, GRPO's group-normalised advantages, the loss, the gathers
    across processes) stays TRL's own code.  TRL's ``rollout_func`` would mean writing
    generation again outside TRL's backends and is marked experimental; a reward
    function that calls the policy could neither use vLLM nor train the revisions.

    Per generation batch (see :func:`conductor.train.recursion.recursion_rollouts`):
    TRL samples a reply for every row; the rows are executed as round 1 (except each
    pair's second row, whose round-1 sample is discarded); the policy samples each
    pair's revision from the round-2 prompt built from its partner's record, through
    the same tokenizer path and backend; the second row's prompt and completion become
    that round-2 prompt and revision, so GRPO trains both rounds in one group; the
    scored rollouts travel to :class:`~conductor.train.recursion.RecursionReward`.
    TRL's completion-length metrics still describe the round-1 samples.  The TRL
    versions whose methods behave so are :data:`~conductor.train.grpo.SUPPORTED_TRL`
    (checked at training start).
    """
    import torch
    import trl

    from .recursion import ROLLOUT_COLUMN, recursion_rollouts
    from .reward import completion_text

    base: Any = grpo_trainer_class()

    class RecursionGRPOTrainer(base):  # type: ignore[misc]
        """GRPO with each marked group's revisions sampled from the current policy."""

        _conductor_rows: list[dict[str, Any]] | None = None
        _round2: tuple[list[Any], list[Any], list[Any] | None, list[str]] | None = None

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            self._conductor_rows = inputs  # the rows of the prompts _generate is given
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self._conductor_rows = None

        def _generate(self, prompts: list[Any]) -> Any:
            out = super()._generate(prompts)
            rows = self._conductor_rows
            if rows is None or len(out) != 8 or len(rows) != len(prompts):
                raise RuntimeError(
                    f"trl {getattr(trl, '__version__', '?')}: GRPOTrainer._generate changed "
                    f"shape; recursion training supports trl{SUPPORTED_TRL}"
                )
            prompt_ids, completion_ids, tool_mask, completions, logprobs, extra = out[:6]
            columns = {key: [row.get(key) for row in rows] for key in rows[0]}
            texts = [completion_text(c) for c in completions]
            self._round2 = None
            batch = recursion_rollouts(
                reward, columns, texts, discount=discount, generate=self._revise
            )
            prompt_ids, completion_ids = list(prompt_ids), list(completion_ids)
            completions = list(completions)
            logprobs = list(logprobs) if logprobs is not None else None
            if batch.revised:
                assert self._round2 is not None
                ids2, completion_ids2, logprobs2, texts2 = self._round2
                for k, j in enumerate(batch.revised):
                    prompt_ids[j], completion_ids[j] = ids2[k], completion_ids2[k]
                    if logprobs is not None:
                        if logprobs2 is None:
                            raise RuntimeError("round 2 was sampled without log-probabilities")
                        logprobs[j] = logprobs2[k]
                    completions[j] = (
                        [{"role": "assistant", "content": texts2[k]}]
                        if isinstance(completions[j], list)
                        else texts2[k]
                    )
            extra = {**extra, ROLLOUT_COLUMN: batch.results}
            return (prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, *out[6:])

        def _revise(self, prompts: list[list[Any]]) -> list[str]:
            """Sample one revision per round-2 prompt with the current policy.

            Every process samples the same number of prompts (the most any process
            has, padded with a copy of a prompt whose reply is dropped): the backends'
            collectives (vLLM server, DeepSpeed ZeRO-3 generation) need all to take part
            alike.
            """
            n = len(prompts)
            count = torch.tensor([n], device=self.accelerator.device)
            most = int(self.accelerator.gather(count).max().item())
            if most == 0:
                return []
            rows = self._conductor_rows or []
            tokenizer = self.processing_class
            batch = [policy_prompt(tokenizer, p, render=render_prompts) for p in prompts]
            filler = batch[0] if batch else rows[0]["prompt"]
            batch += [filler] * (most - n)
            prompt_ids, _images, fields = self._tokenize_prompts(batch)
            completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, fields, 1)
            prompt_ids, completion_ids = list(prompt_ids)[:n], list(completion_ids)[:n]
            logprobs = list(logprobs)[:n] if logprobs is not None else None
            texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            self._round2 = (prompt_ids, completion_ids, logprobs, list(texts))
            return list(texts)

    return RecursionGRPOTrainer(**kwargs)
