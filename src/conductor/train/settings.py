"""What a training run is told: the in-memory form of a training config.

:mod:`conductor.train.config` reads these from ``configs/train/*.yaml`` (its docstring
is the file format) and re-exports them; the defaults here are the file's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "CREDIT_ESTIMATORS",
    "DEFAULT_MICRO_BATCH",
    "LOSS_TYPES",
    "LR_SCHEDULERS",
    "VLLM_MODES",
    "DataMix",
    "GRPOSettings",
    "HoldoutSet",
    "NgramSettings",
    "PoolSampling",
    "RecursionSettings",
    "RewardSettings",
    "TrainConfig",
    "WarmStartSettings",
]

#: Learning-rate schedules understood by transformers' ``get_scheduler``.
LR_SCHEDULERS: tuple[str, ...] = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)
#: TRL's ways of using vLLM for rollouts: inside the training process, or a server.
VLLM_MODES: tuple[str, ...] = ("colocate", "server")
#: Per-step credit estimators (:mod:`conductor.train.credit`); ``outcome``, one reward
#: for every token of a plan, is the paper's.
CREDIT_ESTIMATORS: tuple[str, ...] = ("outcome", "structure", "descendant", "counterfactual")
#: GRPO loss aggregations named by TRL's ``GRPOConfig.loss_type`` (older TRL releases
#: know fewer; TRL itself refuses one it lacks).  The paper's authors used ``bnpo``:
#: token losses averaged over the active tokens of the local batch.
LOSS_TYPES: tuple[str, ...] = (
    "grpo",
    "bnpo",
    "dr_grpo",
    "dapo",
    "cispo",
    "sapo",
    "luspo",
    "vespo",
)


@dataclass(frozen=True)
class DataMix:
    """One benchmark in the training mix.

    ``split="train"`` reads the benchmark's ``train_source`` (a benchmark without one
    needs ``file``); ``file`` replaces either source with a local file in the
    benchmark's schema; ``limit`` draws a seeded sample of N questions, spread evenly
    over the groups the source balances (e.g. MATH's subjects and levels), not the
    first N rows.
    """

    benchmark: str
    split: Literal["train", "test"] = "train"
    file: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class RewardSettings:
    """How one rollout is scored.

    * ``unparsed``: the reply's three lists could not be parsed (paper: 0).
    * ``parsed_wrong`` / ``correct``: the workflow ran and its answer was graded wrong /
      right (paper: 0.5 / 1).
    * ``format_bonus``: added to every parsed-and-graded reward.  The released code's
      0 / 0.5 / 1.5 is ``parsed_wrong: 0``, ``correct: 1``, ``format_bonus: 0.5``.
    * ``cost_penalty_per_usd`` / ``cost_penalty_per_call``: subtracted per USD spent and
      per worker call made (the Conductor's own reply is not a call); paper: none.
    * ``cost_weights``: train ONE checkpoint for every cost.  Each question (so all
      completions of its group) draws one of these weights, seeded by the question
      (:func:`conductor.train.dataset.draw_cost_weight`); its prompt states the weight
      (:func:`conductor.conductors.prompt.cost_weight_line`) and its reward subtracts
      weight x USD in place of ``cost_penalty_per_usd``.  At inference
      ``--cost-weight W`` states W the same way.  Empty: no weight in any prompt.
    * ``failed_run``: the whole reward when the workflow parsed but produced no answer
      at all (every step failed or was skipped); the paper gives 0 when "the workflow
      fails".  No bonus or penalty is applied to it, so that failing is never scored
      below not parsing just because calls were spent.
    """

    unparsed: float = 0.0
    parsed_wrong: float = 0.5
    correct: float = 1.0
    format_bonus: float = 0.0
    cost_penalty_per_usd: float = 0.0
    cost_penalty_per_call: float = 0.0
    failed_run: float = 0.0
    cost_weights: tuple[float, ...] = ()


#: The largest micro-batch (completions per forward and backward pass) chosen when a
#: config gives neither ``gradient_accumulation_steps`` nor ``per_device_batch_size``.
DEFAULT_MICRO_BATCH = 4


@dataclass(frozen=True)
class GRPOSettings:
    """GRPO hyper-parameters (named after, and passed on to, TRL's ``GRPOConfig``).

    ``group_size`` completions per question, ``questions_per_step`` questions per
    optimiser step; ``bf16=None`` picks bf16 when the hardware supports it.

    The batch layout: one step's ``questions_per_step x group_size`` completions are
    split over the training processes and ``gradient_accumulation_steps`` micro-steps
    of ``per_device_batch_size`` completions each.  Give either and the other follows;
    give both and a launch on another number of processes is refused instead of
    silently changing the per-GPU memory; give neither and the micro-batch is the
    largest share of a process's completions of at most :data:`DEFAULT_MICRO_BATCH`.
    Why a small micro-batch by default: the memory of a step is the activations of one
    micro-batch kept for the backward pass (a 135M model over 32 completions of ~400
    tokens holds ~14 GB of them), while with TRL's default ``dapo`` loss (token losses
    normalised by the step's active tokens) the accumulated gradient is one large
    batch's; ``bnpo`` normalises per micro-batch, so there the layout is part of the
    recipe.  ``loss_type`` (None: TRL's default) and
    ``vllm_gpu_memory_utilization`` (the GPU share vLLM reserves when colocated; None:
    TRL's default) are passed to TRL as they are.

    ``async_rollouts`` (default off: the paper's synchronous GRPO) runs each batch's
    worker calls in the background while the policy generates the next batch and takes
    its update; a batch is then trained by a policy up to ``max_staleness`` optimizer
    steps newer than the one that sampled it, the PPO ratio against the sampling
    policy's token log-probabilities correcting for it (:mod:`conductor.train.pipeline`).
    """

    group_size: int = 8
    questions_per_step: int = 4
    learning_rate: float = 1e-6
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.03
    kl_beta: float = 0.0
    clip_epsilon: float = 0.2
    temperature: float = 1.0
    max_completion_tokens: int = 1024
    steps: int = 200
    gradient_accumulation_steps: int | None = None
    per_device_batch_size: int | None = None
    loss_type: str | None = None
    bf16: bool | None = None
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float | None = None
    logging_steps: int = 1
    save_steps: int | None = None
    async_rollouts: bool = False
    max_staleness: int = 1


@dataclass(frozen=True)
class PoolSampling:
    """Randomised pools: each question lists a random subset of ``k_min``..``k_max``
    workers (in random order, renumbered from Model 0)."""

    k_min: int
    k_max: int


@dataclass(frozen=True)
class RecursionSettings:
    """Recursion fine-tuning: ``fraction`` of the questions are marked for a forced
    second round, sampled on-policy in the same step.  A marked question's group of
    rollouts is split into (round-1 plan, revision of that plan) pairs, so half of the
    group are first plans and half their revisions; ``fraction`` 1.0 (the default)
    marks every question, the layout of the paper's authors, whose trainer revises
    every question with the second half of its group.  Each round-1 rollout of a
    marked question earns ``(1 - discount) * round1 + discount * round2`` from its own
    revision (the paper: discount 0.2), each revision its own round's reward."""

    fraction: float = 1.0
    discount: float = 0.2


@dataclass(frozen=True)
class WarmStartSettings:
    """The format warm start before GRPO (:mod:`conductor.train.warmstart`): each
    training question ``passes`` times with a random-worker workflow as its reply,
    AdamW at ``learning_rate``, ``batch_size`` replies per step.  It teaches the reply's
    format, never whom to ask; for a base model that does not yet write the three lists,
    without which every reward is equal and GRPO learns nothing."""

    passes: int = 3
    learning_rate: float = 1e-4
    batch_size: int = 8


@dataclass(frozen=True)
class HoldoutSet:
    """Questions training must not include (see :mod:`conductor.train.contamination`):
    a benchmark's evaluation split, that benchmark's schema read from ``file``, or with
    no ``benchmark`` a plain data file of questions."""

    benchmark: str | None = None
    file: str | None = None


@dataclass(frozen=True)
class NgramSettings:
    """The held-out guard's n-gram comparison (``holdout_ngram``): a training question
    sharing at least ``threshold`` of its word ``n``-grams with a held-out question (of
    the shorter one's; a question shorter than ``n`` words is one n-gram) is reported
    as an overlap.  13 words is the GPT-3 / lm-eval decontamination length."""

    n: int = 13
    threshold: float = 0.5


@dataclass(frozen=True)
class TrainConfig:
    """A validated training config (see the module docstring for the file format)."""

    base_model: str
    pool: str
    data: tuple[DataMix, ...]
    output_dir: str
    reward: RewardSettings = field(default_factory=RewardSettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    randomise_pool: PoolSampling | None = None
    recursion: RecursionSettings | None = None
    warm_start: WarmStartSettings | None = None
    max_steps: int = 5
    template: str = "default"
    seed: int = 0
    worker_max_tokens: int | None = None
    confirm_run_unsafe_code: bool = False
    holdout: tuple[HoldoutSet, ...] = ()
    allow_holdout_overlap: bool = False
    accept_unchecked_holdout: bool = False
    holdout_ngram: NgramSettings | None = None
    #: One of :data:`CREDIT_ESTIMATORS`; a step's credit times ``credit_weight`` is added
    #: to the advantage of that step's tokens (:mod:`conductor.train.credit`).
    credit: str = "outcome"
    credit_weight: float = 1.0
    path: Path | None = None
