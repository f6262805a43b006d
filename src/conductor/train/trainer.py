"""GRPO training of a Conductor with TRL's ``GRPOTrainer``.

:func:`train` turns a :class:`~conductor.train.config.TrainConfig` into a run:

1. refuse training questions that are held out (:mod:`.contamination`), then load
   the pool and the base policy (:func:`load_policy`);
2. build the prompt rows (:func:`conductor.train.dataset.build_rows`); with
   ``warm_start``, teach the policy the reply format first (:mod:`.warmstart`); for recursion
   fine-tuning, mark ``recursion.fraction`` of the questions for a forced second round;
3. run ``GRPOTrainer`` (:mod:`.grpo`'s subclass, on a supported TRL) with
   :class:`~conductor.train.reward.WorkflowReward` as the
   reward: every sampled completion is parsed, executed on the pool and graded.  For
   recursion fine-tuning a subclass of it also samples, in the same step, each marked
   group's revisions from the policy being trained (:mod:`.grpo_recursion`);
4. log one metrics line per logging step (``OUTPUT_DIR/metrics.jsonl``, and handed to
   the caller's ``on_metrics``, which the CLI renders) and save ``OUTPUT_DIR/checkpoint``
   with ``conductor.json`` (template, pool order, step limit, base model,
   training-question hashes), which ``--conductor PATH`` loads.

One optimizer step consumes ``questions_per_step x group_size`` completions (one
generation batch); GRPO's advantages are normalised within each question's group.
On several processes (``accelerate launch``) each process scores its share of the
completions; the metrics line is written by the main process from its share plus TRL's
globally gathered reward mean.

Loading the policy and rendering its prompts is :mod:`.policy`'s; which TRL versions
are supported, and the prompt token ids GRPO trains on, :mod:`.grpo`'s.  Heavy libraries
(torch, transformers, trl, datasets) are imported inside functions.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..private import make_private_dir, tighten, write_private
from ..redact import masked_json
from ..text import plural
from .grpo import grpo_trainer_class, require_trl_version
from .grpo_recursion import recursion_trainer
from .pipeline import PipelineLog, PrestartedReward, async_trainer_class, check_async_rollouts
from .policy import (
    cuda_available,
    is_main_process,
    load_policy,
    opens_with_prefill,
    policy_prompt,
    require_train_deps,
    world_size,
)
from .warmstart import WarmStartReport, format_warm_start

if TYPE_CHECKING:
    from ..pool import Pool
    from .contamination import GuardResult
    from .metrics import MetricsLine, MetricsLog
    from .settings import TrainConfig

__all__ = [
    "CHECKPOINT_DIR",
    "METRICS_FILE",
    "WARM_START_FILE",
    "batch_layout",
    "build_grpo_config",
    "check_recursion_layout",
    "train",
]

log = logging.getLogger("conductor")

#: The final checkpoint's folder inside ``output_dir``.
CHECKPOINT_DIR = "checkpoint"
#: The metrics file inside ``output_dir``.
METRICS_FILE = "metrics.jsonl"
#: What the format warm start did (``warm_start`` in the config), inside ``output_dir``.
WARM_START_FILE = "warm_start.json"

# Keyword arguments TRL passes to reward functions besides the dataset columns.
_TRL_REWARD_EXTRAS = frozenset(
    {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


# -- configuration --------------------------------------------------------------------


def _vllm_importable() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def build_grpo_config(config: TrainConfig, *, output_dir: Path) -> Any:
    """The ``trl.GRPOConfig`` for ``config`` (see the module docstring for the batch)."""
    import torch
    from trl import GRPOConfig  # type: ignore[attr-defined]

    g = config.grpo
    world = world_size()
    completions = g.questions_per_step * g.group_size
    per_device, accumulation = batch_layout(config, world)
    cuda = cuda_available()
    bf16 = g.bf16
    if bf16 is None:
        bf16 = cuda and torch.cuda.is_bf16_supported()
    use_vllm = bool(g.use_vllm)
    if use_vllm and not (cuda and _vllm_importable()):
        log.warning(
            "grpo.use_vllm is set but %s; generating with transformers instead",
            "vllm is not installed" if cuda else "there is no CUDA GPU",
        )
        use_vllm = False
    values: dict[str, Any] = {
        "output_dir": str(output_dir),
        "num_generations": g.group_size,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        "generation_batch_size": completions,
        "max_steps": g.steps,
        "learning_rate": g.learning_rate,
        "lr_scheduler_type": g.lr_scheduler,
        "beta": g.kl_beta,
        "epsilon": g.clip_epsilon,
        "temperature": g.temperature,
        "max_completion_length": g.max_completion_tokens,
        "bf16": bool(bf16),
        "fp16": False,
        "use_vllm": use_vllm,
        "vllm_mode": g.vllm_mode,
        "logging_steps": g.logging_steps,
        "save_strategy": "steps" if g.save_steps else "no",
        "seed": config.seed,
        "data_seed": config.seed,
        "report_to": "none",
        # Gradient checkpointing saves GPU memory at the price of a second forward
        # pass; on a CPU the small models trained there fit anyway.
        "gradient_checkpointing": cuda,
        "remove_unused_columns": False,
        "disable_tqdm": True,
        "log_completions": False,
        "dataloader_num_workers": 0,
        "use_cpu": not cuda,
    }
    if g.save_steps:
        values["save_steps"] = g.save_steps
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for key, value in (
        ("loss_type", g.loss_type),
        ("vllm_gpu_memory_utilization", g.vllm_gpu_memory_utilization),
    ):
        if value is None:
            continue
        if key not in fields:
            raise UsageError(
                f"{_where(config)}grpo.{key} is set but the installed TRL has no such "
                "setting; upgrade trl or remove the key"
            )
        values[key] = value
    # transformers 5 folded warmup_ratio into warmup_steps (a float below 1 is a ratio).
    if "warmup_ratio" in fields:
        values["warmup_ratio"] = g.warmup_ratio
    elif 0 < g.warmup_ratio < 1:
        values["warmup_steps"] = g.warmup_ratio
    return GRPOConfig(**{k: v for k, v in values.items() if k in fields})


def batch_layout(config: TrainConfig, world: int) -> tuple[int, int]:
    """``(per_device_batch_size, gradient_accumulation_steps)`` for ``config`` on
    ``world`` processes (the rule is :class:`~conductor.train.settings.GRPOSettings`');
    a layout that does not split the step's completions evenly raises UsageError."""
    from .settings import DEFAULT_MICRO_BATCH

    g = config.grpo
    completions = g.questions_per_step * g.group_size
    share, rest = divmod(completions, world)
    if rest or share < 1:
        raise UsageError(
            f"{_where(config)}grpo: questions_per_step x group_size = {completions} "
            f"completions per step must split evenly over {world} process(es)"
        )
    if g.gradient_accumulation_steps is None and g.per_device_batch_size is None:
        micro = max(d for d in range(1, min(share, DEFAULT_MICRO_BATCH) + 1) if share % d == 0)
        return micro, share // micro
    if g.gradient_accumulation_steps is None:
        assert g.per_device_batch_size is not None
        steps, rest = divmod(share, g.per_device_batch_size)
        if rest or steps < 1:
            raise UsageError(
                f"{_where(config)}grpo.per_device_batch_size {g.per_device_batch_size} does "
                f"not divide the {plural(share, 'completion')} each of "
                f"{plural(world, 'process', 'processes')} scores per step"
            )
        return g.per_device_batch_size, steps
    per_device, rest = divmod(share, g.gradient_accumulation_steps)
    if rest or per_device < 1:
        raise UsageError(
            f"{_where(config)}grpo: questions_per_step x group_size = {completions} "
            f"completions per step must split evenly over {world} process(es) x "
            f"{g.gradient_accumulation_steps} gradient accumulation step(s)"
        )
    if g.per_device_batch_size is not None and g.per_device_batch_size != per_device:
        raise UsageError(
            f"{_where(config)}grpo.per_device_batch_size is {g.per_device_batch_size}, but "
            f"{plural(completions, 'completion')} per step over "
            f"{plural(world, 'process', 'processes')} x "
            f"{plural(g.gradient_accumulation_steps, 'accumulation step')} give {per_device}; "
            "change gradient_accumulation_steps or the number of processes"
        )
    return per_device, g.gradient_accumulation_steps


def _where(config: TrainConfig) -> str:
    return f"{config.path}: " if getattr(config, "path", None) else ""


def check_recursion_layout(config: TrainConfig) -> None:
    """Raise :class:`UsageError` unless recursion training can pair its rollouts.

    Each marked group is split into (round-1, revision) pairs of neighbouring rows, and
    a process must hold whole pairs: ``group_size`` and each process's share of a
    step's completions must be even.
    """
    if config.recursion is None:
        return
    g = config.grpo
    world = world_size()
    share = g.questions_per_step * g.group_size // world
    if g.group_size % 2 or share % 2:
        raise UsageError(
            f"{_where(config)}recursion pairs each round-1 rollout with its revision in the "
            f"same group, so grpo.group_size ({g.group_size}) and each of the {world} "
            f"process(es)' {share} completions per step must be even"
        )


# -- the run ----------------------------------------------------------------------------


class _RecordingReward:
    """Wraps the reward so that every rollout's result is kept until the next log line
    (TRL may score several generation batches between two logging steps)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.__name__ = getattr(inner, "__name__", "conductor_reward")
        self.pending: list[Any] = []

    def __call__(
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[float | None]:
        kept = {k: v for k, v in columns.items() if k not in _TRL_REWARD_EXTRAS}
        rewards: list[float | None] = self.inner(prompts, completions, **kept)
        self.pending.extend(self.inner.last_batch)
        return rewards

    def drain(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out


def _make_callback(
    reward: _RecordingReward,
    metrics: MetricsLog,
    started: float,
    on_metrics: Callable[[MetricsLine], None] | None,
    pipeline: PipelineLog | None = None,
) -> Any:
    from transformers import TrainerCallback

    from .metrics import summarise_rollouts

    class MetricsCallback(TrainerCallback):
        """Writes a metrics line each time the trainer logs."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logs = dict(logs or {})
            if "train_runtime" in logs or not state.is_world_process_zero:
                return  # the end-of-training summary, or not the process that writes
            row: dict[str, Any] = {"step": state.global_step}
            row.update(summarise_rollouts(reward.drain()))
            if row.get("reward_mean") is None:
                row["reward_mean"] = logs.get("reward")
                row["reward_std"] = logs.get("reward_std")
            row["loss"] = logs.get("loss")
            row["grad_norm"] = logs.get("grad_norm")
            row["learning_rate"] = logs.get("learning_rate")
            row["completion_length"] = logs.get("completions/mean_length")
            row["kl"] = logs.get("kl")
            row["credit_token_share"] = logs.get("credit/token_share")
            # Synchronous GRPO trains each batch with the policy that sampled it.
            waited = pipeline.drain_staleness() if pipeline is not None else []
            row["staleness"] = max(waited, default=0)
            row["elapsed_s"] = round(time.monotonic() - started, 2)
            written = metrics.append(row)
            if on_metrics is not None:
                on_metrics(written)

    return MetricsCallback()


def _quiet_trainer(trainer: Any) -> None:
    """Remove transformers' own printing callbacks: only the CLI prints."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)


def _save_checkpoint(
    trainer: Any, tokenizer: Any, config: TrainConfig, pool: Pool, directory: Path
) -> None:
    from ..conductors.checkpoint import CheckpointMeta, stored_template, write_checkpoint_meta

    trainer.save_model(str(directory))
    if not trainer.is_world_process_zero():
        return
    tokenizer.save_pretrained(str(directory))
    extra: dict[str, Any] = {"trained_with": "conductor train (GRPO)"}
    if config.randomise_pool is not None:
        extra["randomised_pool"] = {
            "k_min": config.randomise_pool.k_min,
            "k_max": config.randomise_pool.k_max,
        }
    if config.recursion is not None:
        extra["recursion"] = {
            "fraction": config.recursion.fraction,
            "discount": config.recursion.discount,
        }
    write_checkpoint_meta(
        directory,
        CheckpointMeta(
            format_version=1,
            **stored_template(directory, config.template),
            pool_order=tuple(w.id for w in pool.workers),
            max_steps=config.max_steps,
            base_model=config.base_model,
            cost_weights=config.reward.cost_weights or None,
            extra=extra,
        ),
    )


def _record_training_questions(checkpoint: Path, guard: GuardResult) -> None:
    """Keep the training questions' hashes in the checkpoint, for ``bench`` to count,
    with what the held-out guard compared them with."""
    from ..conductors.checkpoint import write_training_questions
    from ..datasets.questions import NORMALISATION

    write_training_questions(
        checkpoint, guard.training_hashes, normalisation=NORMALISATION, guard=guard.record()
    )


def train(
    config: TrainConfig,
    *,
    on_metrics: Callable[[MetricsLine], None] | None = None,
    on_warm_start: Callable[[WarmStartReport], None] | None = None,
) -> Path:
    """Train a Conductor with GRPO as ``config`` says; return the checkpoint directory.

    ``on_metrics`` is called with each metrics line after it is written to
    ``OUTPUT_DIR/metrics.jsonl``, ``on_warm_start`` with the format warm start's report
    (``OUTPUT_DIR/warm_start.json``) when the config asks for one; training prints
    nothing, showing progress is the caller's.  Bad settings raise
    :class:`~conductor.errors.UsageError`; a missing training package raises
    :class:`~conductor.errors.MissingDependencyError`.
    """
    require_train_deps()
    require_trl_version(recursion=config.recursion is not None)
    check_recursion_layout(config)
    check_async_rollouts(config, world_size())
    from .contamination import check_training_data

    # Before any model is loaded: training on held-out questions stops the run here.
    guard = check_training_data(config)
    from datasets import Dataset

    from ..llm.cache import ResponseCache
    from .dataset import build_rows
    from .metrics import MetricsLog
    from .pools import load_train_pool, training_conductor
    from .recursion import RecursionReward, mark_recursion_rows
    from .reward import WorkflowReward

    output_dir = Path(config.output_dir).expanduser()
    make_private_dir(output_dir)
    pool = load_train_pool(config)
    conductor = training_conductor(config, pool)
    args = build_grpo_config(config, output_dir=output_dir)
    model, tokenizer = load_policy(config.base_model)

    cache = ResponseCache()
    inner: Any = None
    rollouts: PrestartedReward | None = None
    metrics: MetricsLog | None = None
    try:
        rows = build_rows(config, pool, conductor, rng_seed=config.seed)
        if config.warm_start is not None:
            warm = format_warm_start(
                model,
                tokenizer,
                rows,
                config.warm_start,
                max_steps=conductor.max_steps,
                seed=config.seed,
                # GRPO's micro-batch: one setting bounds the activations of both phases.
                micro_batch=batch_layout(config, world_size())[0],
            )
            # Every process holds the same report (losses summed over the processes).
            if is_main_process():
                write_private(
                    output_dir / WARM_START_FILE, masked_json(warm.to_dict(), indent=2) + "\n"
                )
                if on_warm_start is not None:
                    on_warm_start(warm)
        render = opens_with_prefill(config)
        if render:
            for row in rows:
                row["prompt"] = policy_prompt(tokenizer, row["prompt"], render=True)
        if config.recursion is not None:
            mark_recursion_rows(rows, config.recursion.fraction, seed=config.seed)
        dataset = Dataset.from_list(rows)
        inner = WorkflowReward.from_config(config, pool, conductor, cache=cache)
        # With recursion, rollouts are executed while the batch is generated (round 2
        # needs round 1's record), and the reward only hands their scores to TRL.
        if config.grpo.async_rollouts:
            # The worker calls of each batch run in the background (see .pipeline).
            rollouts = PrestartedReward(inner, PipelineLog())
        reward = _RecordingReward(
            rollouts or (inner if config.recursion is None else RecursionReward())
        )
        metrics = MetricsLog(output_dir / METRICS_FILE)
        started = time.monotonic()
        pipeline = rollouts.log if rollouts is not None else None
        trainer_kwargs: dict[str, Any] = {
            "model": model,
            "reward_funcs": [reward],
            "args": args,
            "train_dataset": dataset,
            "processing_class": tokenizer,
            "callbacks": [_make_callback(reward, metrics, started, on_metrics, pipeline)],
        }
        if rollouts is not None:
            trainer = async_trainer_class()(
                rollouts=rollouts, max_staleness=config.grpo.max_staleness, **trainer_kwargs
            )
        elif config.recursion is None:
            trainer = grpo_trainer_class()(**trainer_kwargs)
            if config.credit != "outcome":
                # The config refuses credit with recursion: only plain GRPO mixes it.
                trainer.credit_source = inner
                trainer.credit_weight = config.credit_weight
        else:
            trainer = recursion_trainer(
                config.recursion.discount, inner, render_prompts=render, **trainer_kwargs
            )
        _quiet_trainer(trainer)
        trainer.train()
        checkpoint = output_dir / CHECKPOINT_DIR
        _save_checkpoint(trainer, tokenizer, config, pool, checkpoint)
        if trainer.is_world_process_zero():
            _record_training_questions(checkpoint, guard)
    finally:
        if metrics is not None:
            metrics.close()
        if rollouts is not None:
            rollouts.close()  # before the reward whose loop its batches run on
        if inner is not None:
            inner.close()
        cache.close()
    write_private(
        output_dir / "train_config.json",
        masked_json(_config_dict(config), indent=2, default=str) + "\n",
    )
    # The trainer and the tokenizer save with the process umask: the checkpoint holds
    # what the Conductor learnt from the training data, private like the rest.
    tighten(checkpoint, walk=True)
    return checkpoint


def _config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready data, recorded beside the checkpoint."""
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return {"config": str(config)}
