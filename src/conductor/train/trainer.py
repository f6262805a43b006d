"""GRPO training of a Conductor with TRL's ``GRPOTrainer``.

:func:`train` turns a :class:`~conductor.train.config.TrainConfig` into a run:

1. refuse training questions that are held out (:mod:`.contamination`), then load
   the pool and the base policy (:func:`load_policy`);
2. build the prompt rows (:func:`conductor.train.dataset.build_rows`); for recursion
   fine-tuning, mark ``recursion.fraction`` of the questions for a forced second round;
3. run ``GRPOTrainer`` with :class:`~conductor.train.reward.WorkflowReward` as the
   reward: every sampled completion is parsed, executed on the pool and graded.  For
   recursion fine-tuning a subclass of it also samples, in the same step, each marked
   group's revisions from the policy being trained (see :func:`_recursion_trainer`);
4. log one metrics line per logging step (``OUTPUT_DIR/metrics.jsonl``, plus an optional
   rich live table) and save ``OUTPUT_DIR/checkpoint`` with ``conductor.json`` (template,
   pool order, step limit, base model, training-question hashes), which
   ``--conductor PATH`` loads.

One optimizer step consumes ``questions_per_step x group_size`` completions (one
generation batch); GRPO's advantages are normalised within each question's group.
On several processes (``accelerate launch``) each process scores its share of the
completions; the metrics line is written by the main process from its share plus TRL's
globally gathered reward mean.

Heavy libraries (torch, transformers, trl, datasets) are imported inside functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError, UsageError
from ..text import plural

if TYPE_CHECKING:
    from ..pool import Pool
    from .config import TrainConfig

__all__ = [
    "CHECKPOINT_DIR",
    "METRICS_FILE",
    "build_grpo_config",
    "check_recursion_layout",
    "opens_with_prefill",
    "policy_prompt",
    "load_policy",
    "train",
]

log = logging.getLogger("conductor")

#: The final checkpoint's folder inside ``output_dir``.
CHECKPOINT_DIR = "checkpoint"
#: The metrics file inside ``output_dir``.
METRICS_FILE = "metrics.jsonl"

_INSTALL_HINT = "pip install 'conductor-orchestrate[train]'"
# A chat template for base models that have none: the same plain transcript that the
# checkpoint backend falls back to, so training and inference see identical prompts.
_PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
# Keyword arguments TRL passes to reward functions besides the dataset columns.
_TRL_REWARD_EXTRAS = frozenset(
    {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


def _require_train_deps() -> None:
    missing = [
        name
        for name in ("torch", "transformers", "trl", "datasets")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise MissingDependencyError(
            f"training needs {', '.join(missing)}, which is not installed: {_INSTALL_HINT}"
        )


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# -- the policy -----------------------------------------------------------------------


def _gguf_file(spec: str) -> Path:
    """The GGUF file named by ``gguf:smollm2`` or ``gguf:PATH``."""
    from ..local_model import EMBEDDED_MODEL, embedded_model_path

    name = spec[len("gguf:") :].strip()
    if not name:
        raise UsageError("base_model 'gguf:' needs a file path or 'smollm2'")
    if name == EMBEDDED_MODEL:
        return embedded_model_path()
    path = Path(name).expanduser()
    if not path.is_file():
        raise UsageError(f"base_model {spec!r}: GGUF file {str(path)!r} does not exist")
    return path.resolve()


def load_policy(base_model: str) -> tuple[Any, Any]:
    """Load the policy to train and its tokenizer from ``base_model``.

    ``base_model`` is a local model directory, ``ORG/NAME`` or ``hf:ORG/NAME`` (Hugging
    Face; offline when ``HF_HUB_OFFLINE=1``), or ``gguf:PATH`` / ``gguf:smollm2`` (a GGUF
    file, e.g. the embedded SmolLM2-135M-Instruct, dequantised to float32 by
    transformers; needs the ``gguf`` package).  On a GPU with bf16 a Hub / directory
    model loads in bf16, else float32.  The tokenizer gets a pad token (its EOS) and,
    if it has no chat template, the plain ``User: ...`` / ``Assistant:`` transcript
    the checkpoint backend also uses.
    """
    _require_train_deps()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = base_model.strip()
    if not spec:
        raise UsageError("base_model is empty")
    kwargs: dict[str, Any] = {}
    model_kwargs: dict[str, Any] = {}
    if spec.startswith("gguf:"):
        if importlib.util.find_spec("gguf") is None:
            raise MissingDependencyError(
                f"loading a GGUF base model needs the gguf package: {_INSTALL_HINT}"
            )
        file = _gguf_file(spec)
        source, kwargs = str(file.parent), {"gguf_file": file.name}
        import transformers

        # Older transformers always dequantise GGUF weights; newer ones need asking.
        gguf_config = getattr(transformers, "GgufConfig", None)
        if gguf_config is not None:
            # Dense float weights: packed GGUF blocks can be neither trained nor saved.
            model_kwargs["quantization_config"] = gguf_config(dequantize=True)
        dtype = torch.float32  # dequantised weights; bf16 would lose what is left
    else:
        source = spec[3:].strip() if spec.startswith("hf:") else spec
        local = Path(source).expanduser()
        if local.is_dir():
            source = str(local.resolve())
        elif source.count("/") != 1 or source.startswith(("/", ".", "~")):
            raise UsageError(
                f"base_model {spec!r} is neither an existing directory nor a Hugging Face "
                "id (ORG/NAME or hf:ORG/NAME) nor gguf:PATH / gguf:smollm2"
            )
        cuda = _cuda()
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **model_kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"base_model {spec!r} cannot be loaded by transformers: {first}") from exc
    if spec.startswith("gguf:"):
        _forget_gguf_quantizer(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = _PLAIN_CHAT_TEMPLATE
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _forget_gguf_quantizer(model: Any) -> None:
    """Make a dequantised GGUF model an ordinary one.

    transformers marks a model loaded from a GGUF file as quantized with "gguf" even
    when every weight was unpacked into a dense tensor, and then refuses to train it or
    to save it.  The weights are plain float tensors, so the mark is dropped.
    """
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if getattr(model, "is_quantized", False):
        # A read-only property (derived from hf_quantizer) on some versions.
        with contextlib.suppress(AttributeError):
            model.is_quantized = False


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
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    completions = g.questions_per_step * g.group_size
    per_device, rest = divmod(completions, world * g.gradient_accumulation_steps)
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
    cuda = _cuda()
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
        "gradient_accumulation_steps": g.gradient_accumulation_steps,
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


def _where(config: TrainConfig) -> str:
    return f"{config.path}: " if getattr(config, "path", None) else ""


# -- on-policy recursion -----------------------------------------------------------------

# The GRPOTrainer methods the recursion trainer builds on (TRL 1.x).
_TRL_HOOKS = ("_generate_and_score_completions", "_generate", "_tokenize_prompts")
_TRL_GENERATE = "_generate_single_turn"


def opens_with_prefill(config: TrainConfig) -> bool:
    """Whether ``config``'s template begins the Conductor's reply with a prefill."""
    from ..conductors.prompt import load_conductor_template

    chat = load_conductor_template(config.template).chat
    return chat is not None and chat.has_prefill


def policy_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, render: bool) -> Any:
    """The prompt TRL gets for ``messages``: the conversation itself, or with ``render``
    its text with a trailing prefill left open.

    TRL's GRPO renders a conversational prompt with a generation prompt, which closes a
    trailing assistant message as a finished turn and opens a new one; the policy would
    then learn to answer after its prefill instead of continuing it, unlike the way
    ``ask`` and ``bench`` prompt the checkpoint.  Rendered here through the tokenizer's
    chat template (as the checkpoint backend renders it), the prompt is plain text that
    TRL tokenizes as it is, and the completion continues the prefill.
    """
    plain = [dict(m) for m in messages]
    if not render:
        return plain
    from ..llm.checkpoint_client import chat_prompt

    return chat_prompt(tokenizer, plain)[0]


def check_recursion_layout(config: TrainConfig) -> None:
    """Raise :class:`UsageError` unless recursion training can pair its rollouts.

    Each marked group is split into (round-1, revision) pairs of neighbouring rows, and
    a process must hold whole pairs: ``group_size`` and each process's share of a
    step's completions must be even.
    """
    if config.recursion is None:
        return
    g = config.grpo
    world = max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    share = g.questions_per_step * g.group_size // world
    if g.group_size % 2 or share % 2:
        raise UsageError(
            f"{_where(config)}recursion pairs each round-1 rollout with its revision in the "
            f"same group, so grpo.group_size ({g.group_size}) and each of the {world} "
            f"process(es)' {share} completions per step must be even"
        )


def _recursion_trainer(
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
    TRL's completion-length metrics still describe the round-1 samples.
    """
    import torch
    import trl
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    from .recursion import ROLLOUT_COLUMN, recursion_rollouts
    from .reward import completion_text

    missing = [h for h in (*_TRL_HOOKS, _TRL_GENERATE) if not hasattr(GRPOTrainer, h)]
    if missing:
        raise MissingDependencyError(
            f"recursion training builds on GRPOTrainer.{', '.join(missing)}, which trl "
            f"{getattr(trl, '__version__', '?')} lacks: install trl 1.x ({_INSTALL_HINT})"
        )

    # Typed as Any: trl's own annotations differ between versions (and are absent where
    # trl is not installed when type-checking).
    base: Any = GRPOTrainer

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
                    "shape; recursion training supports TRL 1.x"
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


def _live_view(live: bool) -> Any:
    """A started rich Live on stderr when asked for and stderr is a terminal, else None."""
    if not live or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.live import Live

    view = Live(console=Console(stderr=True), refresh_per_second=2, transient=False)
    view.start()
    return view


def _make_callback(
    reward: _RecordingReward,
    metrics: Any,
    started: float,
    on_metrics: Callable[[dict[str, Any]], None] | None,
    view: Any,
) -> Any:
    from transformers import TrainerCallback

    from .metrics import metrics_table, summarise_rollouts

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
            row["learning_rate"] = logs.get("learning_rate")
            row["completion_length"] = logs.get("completions/mean_length")
            row["kl"] = logs.get("kl")
            row["elapsed_s"] = round(time.monotonic() - started, 2)
            written = metrics.append(row)
            if view is not None:
                view.update(metrics_table(metrics.rows))
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
    from ..checkpoint_meta import CheckpointMeta, stored_template, write_checkpoint_meta

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
            extra=extra,
        ),
    )


def _record_training_questions(checkpoint: Path, hashes: frozenset[str]) -> None:
    """Keep the training questions' hashes in the checkpoint, for ``bench`` to count."""
    from ..checkpoint_meta import write_training_questions
    from .contamination import NORMALISATION

    write_training_questions(checkpoint, hashes, normalisation=NORMALISATION)


def train(
    config: TrainConfig,
    *,
    live: bool = True,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Train a Conductor with GRPO as ``config`` says; return the checkpoint directory.

    ``live`` shows a rich table of the last steps on stderr when stderr is a terminal.
    ``on_metrics`` is called with each metrics line (a dict) after it is written to
    ``OUTPUT_DIR/metrics.jsonl``.  Bad settings raise
    :class:`~conductor.errors.UsageError`; a missing training package raises
    :class:`~conductor.errors.MissingDependencyError`.
    """
    _require_train_deps()
    check_recursion_layout(config)
    from .contamination import check_training_data

    # Before any model is loaded: training on held-out questions stops the run here.
    guard = check_training_data(config)
    from datasets import Dataset
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    from ..cache import ResponseCache
    from .dataset import build_rows
    from .metrics import MetricsLog
    from .pools import load_train_pool, training_conductor
    from .recursion import RecursionReward, mark_recursion_rows
    from .reward import WorkflowReward

    output_dir = Path(config.output_dir).expanduser()
    output_dir.mkdir(parents=True, exist_ok=True)
    pool = load_train_pool(config)
    conductor = training_conductor(config, pool)
    args = build_grpo_config(config, output_dir=output_dir)
    model, tokenizer = load_policy(config.base_model)

    cache = ResponseCache()
    inner: Any = None
    metrics: Any = None
    view: Any = None
    try:
        rows = build_rows(config, pool, conductor, rng_seed=config.seed)
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
        reward = _RecordingReward(inner if config.recursion is None else RecursionReward())
        metrics = MetricsLog(output_dir / METRICS_FILE)
        started = time.monotonic()
        view = _live_view(live)
        trainer_kwargs: dict[str, Any] = {
            "model": model,
            "reward_funcs": [reward],
            "args": args,
            "train_dataset": dataset,
            "processing_class": tokenizer,
            "callbacks": [_make_callback(reward, metrics, started, on_metrics, view)],
        }
        if config.recursion is None:
            trainer = GRPOTrainer(**trainer_kwargs)
        else:
            trainer = _recursion_trainer(
                config.recursion.discount, inner, render_prompts=render, **trainer_kwargs
            )
        _quiet_trainer(trainer)
        trainer.train()
        checkpoint = output_dir / CHECKPOINT_DIR
        _save_checkpoint(trainer, tokenizer, config, pool, checkpoint)
        if trainer.is_world_process_zero():
            _record_training_questions(checkpoint, guard.training_hashes)
    finally:
        if view is not None:
            view.stop()
        if metrics is not None:
            metrics.close()
        if inner is not None:
            inner.close()
        cache.close()
    (output_dir / "train_config.json").write_text(
        json.dumps(_config_dict(config), indent=2, default=str) + "\n", encoding="utf-8"
    )
    return checkpoint


def _config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready data, recorded beside the checkpoint."""
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    return {"config": str(config)}
