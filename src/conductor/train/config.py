"""Training configuration files (``configs/train/*.yaml``): schema, loading, validation.

A training config says which model to train, on which pool and data, how rollouts are
rewarded and how GRPO is run.  Schema (``base_model``, ``pool``, ``data`` and
``output_dir`` are required; everything else has the default shown)::

    base_model: Qwen/Qwen2.5-7B-Instruct   # a local dir, hf:ORG/NAME, ORG/NAME or
                                           # gguf:PATH (or gguf:smollm2, the embedded model)
    pool: paper                    # a pool file (relative to this file, or to the current
                                   # directory) or a shipped pool name
    data:                          # one or more benchmarks, mixed
      - benchmark: math500         # shipped name or benchmark YAML (relative to this file)
        split: train               # train (the benchmark's train_source) | test
        file: data/mine.jsonl      # optional local file in the benchmark's schema
        limit: 320                 # optional: a seeded sample of this many questions,
                                   # balanced over the source's subjects / levels
      - mmlu                       # shorthand for {benchmark: mmlu}
    output_dir: runs/train/paper   # relative to the current directory
    max_steps: 5                   # most workflow steps the Conductor may write
    template: default              # the Conductor prompt template (name or file)
    seed: 0
    worker_max_tokens: 4096        # optional: override every worker's max_tokens
    confirm_run_unsafe_code: false # true: grade code rewards in a sandbox weaker than
                                   # bubblewrap (as bench --confirm-run-unsafe-code)
    reward: {unparsed: 0.0, parsed_wrong: 0.5, correct: 1.0, format_bonus: 0.0,
             cost_penalty_per_usd: 0.0, cost_penalty_per_call: 0.0, failed_run: 0.0,
             cost_weights: [0, 100, 200, 400]}   # optional: one checkpoint for every
                                   # cost: each question draws a weight (per USD), stated
                                   # in its prompt and used in place of cost_penalty_per_usd
    grpo: {group_size: 8, questions_per_step: 4, learning_rate: 1.0e-6, ...}
    randomise_pool: {k_min: 2, k_max: 4}   # optional: a random k-of-n pool per question
    recursion: {fraction: 1.0, discount: 0.2}    # optional: forced second rounds (1.0:
                                   # every question, half its group revisions)
    warm_start: {passes: 3, learning_rate: 1.0e-4, batch_size: 8}   # optional: teach
                                   # the reply format (random workers) before GRPO
    holdout:                       # questions training must not include (besides the
      - gpqa-diamond               # evaluation split of each benchmark in data): a
      - {benchmark: mmlu, file: data/mmlu-test.jsonl}   # benchmark, one in a file,
      - data/private.jsonl         # or a plain file of questions
    allow_holdout_overlap: false   # true: an overlap is a warning, not an error
    accept_unchecked_holdout: false  # true: a held-out set not on this machine (not
                                   # cached, offline) is a warning, not an error; the
                                   # checkpoint records which sets were not compared
    holdout_ngram: {n: 13, threshold: 0.5}   # optional: also stop on training questions
                                   # sharing >= threshold of their word n-grams with a
                                   # held-out question ({} for these defaults)
    credit: outcome                # per-step credit: outcome (the paper's: one reward for
                                   # every token) | structure | descendant | counterfactual
    credit_weight: 1.0             # a step's credit times this is added to the advantage
                                   # of its tokens (not with recursion)

Every mistake raises :class:`TrainConfigError` (a :class:`~conductor.errors.ConfigFileError`)
whose message starts ``FILE:LINE:`` and names the field, with a did-you-mean hint for a
misspelt key.  ``${VAR}`` / ``${VAR:-default}`` are expanded as in pool files.  The
types it returns live in :mod:`conductor.train.settings` and are importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from ..bounds import (
    BATCH,
    EPOCHS,
    GROUP_SIZE,
    NGRAM,
    POOL_SIZE,
    SAMPLES,
    SEED,
    STALENESS,
    STEPS,
    TOKENS,
    TRAIN_STEPS,
)
from ..configfile import ConfigReader, compose_yaml, read_config_file, show_number, show_value
from ..errors import ConfigFileError, TrainConfigError
from ..shipped import ShippedKind, resolve_shipped
from ..userfiles import is_regular
from .settings import (
    CREDIT_ESTIMATORS,
    LOSS_TYPES,
    LR_SCHEDULERS,
    VLLM_MODES,
    DataMix,
    GRPOSettings,
    HoldoutSet,
    NgramSettings,
    PoolSampling,
    RecursionSettings,
    RewardSettings,
    TrainConfig,
    WarmStartSettings,
)

__all__ = ["load_train_config", "load_train_config_text"]


_TOP_KEYS = (
    "base_model",
    "pool",
    "data",
    "output_dir",
    "reward",
    "grpo",
    "randomise_pool",
    "recursion",
    "warm_start",
    "max_steps",
    "template",
    "seed",
    "worker_max_tokens",
    "confirm_run_unsafe_code",
    "holdout",
    "allow_holdout_overlap",
    "accept_unchecked_holdout",
    "holdout_ngram",
    "credit",
    "credit_weight",
)
_MIX_KEYS = tuple(f.name for f in fields(DataMix))
_REWARD_KEYS = tuple(f.name for f in fields(RewardSettings))
_GRPO_KEYS = tuple(f.name for f in fields(GRPOSettings))
#: The range of each count of the grpo section (:mod:`conductor.bounds`).
_GRPO_COUNTS = {
    "group_size": GROUP_SIZE,
    "questions_per_step": BATCH,
    "max_completion_tokens": TOKENS,
    "steps": TRAIN_STEPS,
    "gradient_accumulation_steps": BATCH,
    "per_device_batch_size": BATCH,
    "logging_steps": TRAIN_STEPS,
    "save_steps": TRAIN_STEPS,
    "max_staleness": STALENESS,
}
_SAMPLING_KEYS = ("k_min", "k_max")
_RECURSION_KEYS = tuple(f.name for f in fields(RecursionSettings))
_WARM_START_KEYS = tuple(f.name for f in fields(WarmStartSettings))
_SPLITS = ("train", "test")


class _TrainReader(ConfigReader):
    """The line-aware reader with the sections of a training config."""

    def __init__(self, source: str, environ: Mapping[str, str], base: Path | None) -> None:
        super().__init__(source, environ)
        self.base = base

    error_class = TrainConfigError
    what = "training config"

    # ---------------------------------------------------------------- values

    def real(
        self,
        node: yaml.Node,
        field: str,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
    ) -> float | None:
        """A number (negative allowed unless ``low`` says otherwise), or None."""
        value = self.value(node, field)
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        # Finite (NaN compares false with everything; an integer too large for a float
        # cannot become one): a setting beyond 1e15 is a mistake whatever it is.
        ok = ok and abs(value) <= 1e15
        if ok and low is not None and (value <= low if low_open else value < low):
            ok = False
        if ok and high is not None and value > high:
            ok = False
        if not ok:
            if low is not None and high is not None:
                kind = f"a number between {low:g} and {high:g}"
            elif low is not None:
                kind = f"a number > {low:g}" if low_open else f"a number >= {low:g}"
            else:
                kind = "a number"
            shown = show_number(value)
            raise self.error(f"{field} must be {kind}, got {shown}", node, field)
        return float(value)

    def local_path(self, text: str) -> Path:
        """``text`` as a path: absolute, or relative to the config file's folder."""
        path = Path(text).expanduser()
        if not path.is_absolute() and self.base is not None:
            path = self.base / path
        return path

    # ---------------------------------------------------------------- sections

    def shipped_ref(self, kind: ShippedKind, node: yaml.Node, field: str) -> tuple[str, Path]:
        """``field``'s text and the file it names: a file beside this config (the text is
        then that file's absolute path), else an existing path or a shipped name."""
        text = self.required_string(node, field).strip()
        beside = self.local_path(text)
        if is_regular(beside):
            return str(beside.resolve()), beside.resolve()
        try:
            return text, resolve_shipped(kind, text)
        except ConfigFileError as exc:
            raise self.error(f"{field}: {exc.reason}", node, field) from None

    def pool_ref(self, node: yaml.Node) -> str:
        return str(self.shipped_ref("pool", node, "pool")[1])

    def benchmark_ref(self, node: yaml.Node, field: str) -> str:
        return self.shipped_ref("benchmark", node, field)[0]

    def mix(self, node: yaml.Node, index: int) -> DataMix:
        field = f"data[{index}]"
        if isinstance(node, yaml.ScalarNode):
            benchmark = self.benchmark_ref(node, field)
            self._check_train_source(benchmark, node, field)
            return DataMix(benchmark=benchmark)
        keys = self.mapping(node, field, _MIX_KEYS, "a benchmark name or a mapping")
        get = {k: vn for k, (_kn, vn) in keys.items()}
        if "benchmark" not in get:
            raise self.error(
                f'{field} is missing required key "benchmark"', node, f"{field}.benchmark"
            )
        benchmark = self.benchmark_ref(get["benchmark"], f"{field}.benchmark")
        split = "train"
        if "split" in get:
            split = self.choice(get["split"], f"{field}.split", _SPLITS) or "train"
        if split == "train" and "file" not in get:
            self._check_train_source(benchmark, get.get("split", node), field)
        file = None
        if "file" in get:
            raw = self.string(get["file"], f"{field}.file")
            if raw is not None:
                path = self.regular_file(self.local_path(raw.strip()), get["file"], f"{field}.file")
                file = str(path.resolve())
        limit = self.integer(get["limit"], f"{field}.limit", SAMPLES) if "limit" in get else None
        return DataMix(benchmark=benchmark, split=split, file=file, limit=limit)  # type: ignore[arg-type]

    def _check_train_source(self, benchmark: str, node: yaml.Node, field: str) -> None:
        """Refuse ``split: train`` on a benchmark that has no train_source: it would
        train on the very questions the benchmark evaluates."""
        from ..bench.spec import load_benchmark

        try:
            spec = load_benchmark(benchmark)
        except ConfigFileError as exc:
            raise self.error(f"{field}.benchmark: {exc}", node, f"{field}.benchmark") from None
        if spec.train_source is None:
            raise self.error(
                f"{field}: benchmark {spec.name} has no train_source, so split: train would "
                "train on its evaluation questions; give file: (training questions in its "
                "schema) or split: test",
                node,
                f"{field}.split",
            )

    def data(self, node: yaml.Node) -> tuple[DataMix, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            shown = self.value(node, "data")
            if isinstance(node, yaml.SequenceNode) or shown is None:
                raise self.error("data must list at least one benchmark", node, "data")
            raise self.error(
                f"data must be a list of benchmarks, got {show_value(shown)}", node, "data"
            )
        return tuple(self.mix(item, i) for i, item in enumerate(node.value))

    def reward(self, node: yaml.Node) -> RewardSettings:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "reward") is None:
            return RewardSettings()
        keys = self.mapping(node, "reward", _REWARD_KEYS)
        kwargs: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            sub = f"reward.{key}"
            if key == "cost_weights":
                kwargs[key] = self.cost_weights(vn, sub)
                continue
            low = 0.0 if key.startswith("cost_penalty") else None
            value = self.real(vn, sub, low=low)
            if value is not None:
                kwargs[key] = value
        if kwargs.get("cost_weights") and kwargs.get("cost_penalty_per_usd"):
            # Two answers to "what does a dollar cost": refused rather than one winning.
            raise self.error(
                "reward.cost_weights replaces reward.cost_penalty_per_usd (each question's "
                "weight is its penalty per USD); give one of the two",
                keys["cost_weights"][0],
                "reward.cost_weights",
            )
        return RewardSettings(**kwargs)

    def cost_weights(self, node: yaml.Node, field: str) -> tuple[float, ...]:
        """A non-empty list of weights per USD (numbers >= 0), in the order given."""
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(
                f"{field} must be a list of numbers >= 0 (per US dollar), e.g. [0, 100, 200]",
                node,
                field,
            )
        weights = []
        for i, item in enumerate(node.value):
            value = self.real(item, f"{field}[{i}]", low=0.0)
            if value is None:
                raise self.error(f"{field}[{i}] must be a number >= 0", item, field)
            weights.append(value)
        return tuple(weights)

    def grpo(self, node: yaml.Node) -> GRPOSettings:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "grpo") is None:
            return GRPOSettings()
        keys = self.mapping(node, "grpo", _GRPO_KEYS)
        kwargs: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            sub = f"grpo.{key}"
            value: Any
            if key in _GRPO_COUNTS:
                value = self.integer(vn, sub, _GRPO_COUNTS[key])
            elif key == "loss_type":
                value = self.choice(vn, sub, LOSS_TYPES)
            elif key == "vllm_gpu_memory_utilization":
                value = self.real(vn, sub, low=0.0, high=1.0, low_open=True)
            elif key in ("learning_rate", "temperature", "clip_epsilon"):
                value = self.real(vn, sub, low=0.0, low_open=True)
            elif key == "warmup_ratio":
                value = self.real(vn, sub, low=0.0, high=1.0)
            elif key == "kl_beta":
                value = self.real(vn, sub, low=0.0)
            elif key == "lr_scheduler":
                value = self.choice(vn, sub, LR_SCHEDULERS)
            elif key == "vllm_mode":
                value = self.choice(vn, sub, VLLM_MODES)
            elif key in ("bf16", "use_vllm", "async_rollouts"):
                value = self.boolean(vn, sub)
            else:  # pragma: no cover - _GRPO_KEYS and this chain agree
                raise AssertionError(key)
            if value is not None or key in ("bf16", "save_steps"):
                kwargs[key] = value
        return GRPOSettings(**kwargs)

    def sampling(self, node: yaml.Node) -> PoolSampling | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "randomise_pool") is None:
            return None
        keys = self.mapping(node, "randomise_pool", _SAMPLING_KEYS, "a mapping with k_min, k_max")
        values: dict[str, int] = {}
        for key in _SAMPLING_KEYS:
            sub = f"randomise_pool.{key}"
            if key not in keys:
                raise self.error(f'randomise_pool is missing required key "{key}"', node, sub)
            value = self.integer(keys[key][1], sub, POOL_SIZE)
            if value is None:
                raise self.error(f"{sub} must be {POOL_SIZE.describe()}", keys[key][1], sub)
            values[key] = value
        if values["k_min"] > values["k_max"]:
            raise self.error(
                f"randomise_pool.k_min ({values['k_min']}) is larger than "
                f"randomise_pool.k_max ({values['k_max']})",
                node,
                "randomise_pool.k_min",
            )
        return PoolSampling(**values)

    def recursion(self, node: yaml.Node) -> RecursionSettings | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "recursion") is None:
            return None
        keys = self.mapping(node, "recursion", _RECURSION_KEYS)
        kwargs: dict[str, float] = {}
        for key, (_kn, vn) in keys.items():
            value = self.real(vn, f"recursion.{key}", low=0.0, high=1.0)
            if value is not None:
                kwargs[key] = value
        return RecursionSettings(**kwargs)

    def warm_start(self, node: yaml.Node) -> WarmStartSettings | None:
        if isinstance(node, yaml.ScalarNode):
            flag = self.value(node, "warm_start")
            if flag is None or isinstance(flag, bool):
                return WarmStartSettings() if flag else None
            raise self.error(
                "warm_start must be true, false or a mapping with "
                f"{', '.join(_WARM_START_KEYS)}, got {show_value(flag)}",
                node,
                "warm_start",
            )
        keys = self.mapping(node, "warm_start", _WARM_START_KEYS)
        kwargs: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            sub = f"warm_start.{key}"
            if key == "learning_rate":
                value: Any = self.real(vn, sub, low=0.0, low_open=True)
            else:
                value = self.integer(vn, sub, EPOCHS if key == "passes" else BATCH)
            if value is not None:
                kwargs[key] = value
        return WarmStartSettings(**kwargs)

    def holdout(self, node: yaml.Node) -> tuple[HoldoutSet, ...]:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "holdout") is None:
            return ()
        if not isinstance(node, yaml.SequenceNode):
            shown = show_value(self.value(node, "holdout"))
            raise self.error(
                f"holdout must be a list of benchmarks or files, got {shown}", node, "holdout"
            )
        return tuple(self.holdout_set(item, f"holdout[{i}]") for i, item in enumerate(node.value))

    def holdout_set(self, node: yaml.Node, field: str) -> HoldoutSet:
        if isinstance(node, yaml.ScalarNode):
            text = self.required_string(node, field).strip()
            beside = self.local_path(text)
            if beside.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet"):
                return HoldoutSet(file=str(self.regular_file(beside, node, field).resolve()))
            return HoldoutSet(benchmark=self.benchmark_ref(node, field))
        keys = self.mapping(node, field, ("benchmark", "file"), "a benchmark, a file or a mapping")
        get = {k: vn for k, (_kn, vn) in keys.items()}
        benchmark = (
            self.benchmark_ref(get["benchmark"], f"{field}.benchmark")
            if "benchmark" in get
            else None
        )
        file = None
        if "file" in get:
            path = self.local_path(self.required_string(get["file"], f"{field}.file").strip())
            file = str(self.regular_file(path, get["file"], f"{field}.file").resolve())
        if benchmark is None and file is None:
            raise self.error(f"{field} needs a benchmark or a file", node, field)
        return HoldoutSet(benchmark=benchmark, file=file)

    def ngram(self, node: yaml.Node) -> NgramSettings | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "holdout_ngram") is None:
            return None
        keys = self.mapping(node, "holdout_ngram", ("n", "threshold"))
        kwargs: dict[str, Any] = {}
        if "n" in keys:
            kwargs["n"] = self.integer(keys["n"][1], "holdout_ngram.n", NGRAM)
        if "threshold" in keys:
            kwargs["threshold"] = self.real(
                keys["threshold"][1], "holdout_ngram.threshold", low=0.0, high=1.0, low_open=True
            )
        return NgramSettings(**{k: v for k, v in kwargs.items() if v is not None})

    def config(self, root: yaml.Node | None, path: Path | None) -> TrainConfig:
        get = self.document(
            root,
            _TOP_KEYS,
            empty="the training config is empty; it needs base_model, pool, data and output_dir",
            required=("base_model", "pool", "data", "output_dir"),
        )
        base_model = self.required_string(get["base_model"], "base_model").strip()
        if base_model in ("gguf:", "hf:") or (
            base_model.startswith("hf:") and base_model[3:].count("/") != 1
        ):
            raise self.error(
                "base_model must be a local directory, hf:ORG/NAME, ORG/NAME or "
                f"gguf:PATH (gguf:smollm2 for the embedded model), got {show_value(base_model)}",
                get["base_model"],
                "base_model",
            )
        kwargs: dict[str, Any] = {
            "base_model": base_model,
            "pool": self.pool_ref(get["pool"]),
            "data": self.data(get["data"]),
            "output_dir": self.required_string(get["output_dir"], "output_dir").strip(),
            "path": path,
        }
        if "reward" in get:
            kwargs["reward"] = self.reward(get["reward"])
        if "grpo" in get:
            kwargs["grpo"] = self.grpo(get["grpo"])
        if "randomise_pool" in get:
            kwargs["randomise_pool"] = self.sampling(get["randomise_pool"])
        if "recursion" in get:
            kwargs["recursion"] = self.recursion(get["recursion"])
        if "warm_start" in get:
            kwargs["warm_start"] = self.warm_start(get["warm_start"])
        if "max_steps" in get:
            value = self.integer(get["max_steps"], "max_steps", STEPS)
            if value is not None:
                kwargs["max_steps"] = value
        if "template" in get:
            template = self.string(get["template"], "template")
            if template is not None:
                template = template.strip()
                beside = self.local_path(template)
                # A template file next to the config wins over a built-in name.
                kwargs["template"] = str(beside.resolve()) if is_regular(beside) else template
        if "seed" in get:
            value = self.integer(get["seed"], "seed", SEED)
            if value is not None:
                kwargs["seed"] = value
        if "worker_max_tokens" in get:
            kwargs["worker_max_tokens"] = self.integer(
                get["worker_max_tokens"], "worker_max_tokens", TOKENS
            )
        if "confirm_run_unsafe_code" in get:
            flag = self.boolean(get["confirm_run_unsafe_code"], "confirm_run_unsafe_code")
            kwargs["confirm_run_unsafe_code"] = bool(flag)
        if "holdout" in get:
            kwargs["holdout"] = self.holdout(get["holdout"])
        if "allow_holdout_overlap" in get:
            flag = self.boolean(get["allow_holdout_overlap"], "allow_holdout_overlap")
            kwargs["allow_holdout_overlap"] = bool(flag)
        if "accept_unchecked_holdout" in get:
            flag = self.boolean(get["accept_unchecked_holdout"], "accept_unchecked_holdout")
            kwargs["accept_unchecked_holdout"] = bool(flag)
        if "holdout_ngram" in get:
            kwargs["holdout_ngram"] = self.ngram(get["holdout_ngram"])
        if "credit" in get:
            credit = self.choice(get["credit"], "credit", CREDIT_ESTIMATORS)
            if credit is not None:
                kwargs["credit"] = credit
            if credit not in (None, "outcome") and kwargs.get("recursion") is not None:
                # The recursion trainer scores its two rounds its own way; per-step
                # credit is mixed into plain GRPO's advantages only.
                raise self.error(
                    "credit other than outcome cannot be combined with recursion",
                    get["credit"],
                    "credit",
                )
        if "credit_weight" in get:
            weight = self.real(get["credit_weight"], "credit_weight", low=0.0, high=100.0)
            if weight is not None:
                kwargs["credit_weight"] = weight
        reward = kwargs.get("reward")
        if reward is not None and reward.cost_weights and kwargs.get("recursion") is not None:
            # A revision round's prompt is built from the first round's record, which
            # does not carry the row's weight: refused rather than trained unstated.
            raise self.error(
                "reward.cost_weights cannot be combined with recursion yet (a revision "
                "prompt would not state the question's weight); drop one of the two",
                get["recursion"],
                "recursion",
            )
        return TrainConfig(**kwargs)


def load_train_config_text(
    text: str,
    *,
    source: str = "<string>",
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrainConfig:
    """Parse and validate a training config held in a string.

    ``source`` is the name errors start with; ``path`` (the file, when there is one)
    anchors relative ``pool``, ``benchmark``, ``file`` and ``template`` values.
    """
    root = compose_yaml(text, source, TrainConfigError)
    env = os.environ if environ is None else environ
    base = path.parent if path is not None else None
    reader = _TrainReader(source, env, base)
    try:
        return reader.config(root, path)
    finally:
        reader.close()


def load_train_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> TrainConfig:
    """Read and validate the training config at ``path``.

    Raises :class:`TrainConfigError` naming the file, line and field on any mistake.
    """
    file = Path(path)
    text = read_config_file(file, "training config file", TrainConfigError)
    return load_train_config_text(text, source=str(path), path=file.resolve(), environ=environ)
