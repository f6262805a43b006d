"""TRL's ``GRPOTrainer`` as every Conductor trains with it: the TRL versions it supports
(:data:`SUPPORTED_TRL`, checked at training start by :func:`require_trl_version`) and
the subclass whose text prompts get the checkpoint backend's token ids
(:func:`grpo_trainer_class`; recursion builds on it in :mod:`.grpo_recursion`).

Why a version range narrower than TRL 1.x: the recursion trainer wraps private
``GRPOTrainer`` methods (``_generate_and_score_completions``, ``_generate``,
``_tokenize_prompts``, ``_generate_single_turn``), whose shapes changed within 1.x.
TRL 1.0-1.8's ``_generate`` returns nine values, not eight; 1.9's
``_generate_single_turn`` takes no number of generations; 1.10-1.14.0's takes
``has_tool_images`` in that place and samples ``num_generations`` replies per prompt,
which vLLM's server mode serves from every ``num_generations``-th prompt only (the
revisions would be sampled from other rows' prompts, with no error).  From 1.14.1 on
(read up to 1.16.0) it takes ``num_generations``, and the four methods keep the
semantics the recursion trainer relies on.  Plain GRPO overrides ``_tokenize_prompts``
only, whose text branch and return value are alike in every 1.x release: outside the
range it runs, with a warning.

Sampling is a function of the row, not of the launch: with transformers generation
(not vLLM), each completion's tokens are drawn by the Gumbel-max rule from noise seeded
by (seed, optimizer step, generation call, the row's place in the step's generation
batch, token position) (:class:`RowSeededSampling`).  TRL's own sampling draws from each
process's random stream (seeded ``seed + process index``) over whatever rows that
process holds, so one process and two would sample different completions from the same
prompts and no run on several processes could be checked against one process.  The
distribution sampled is unchanged: Gumbel-max over the tempered logits is a draw from
their softmax.

With a per-step credit (:mod:`conductor.train.credit`) the trainer's ``credit_source``
(the reward, whose ``last_batch`` holds this process's rollouts in the order of its
completions) gives each completion's step credits and step spans, and
:func:`credit_advantages` turns TRL's one advantage per completion into one per token,
which TRL 1.16's ``_compute_loss`` accepts as a (batch, tokens) tensor.

TRL is imported inside the functions.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import MissingDependencyError
from .policy import INSTALL_HINT

__all__ = [
    "SUPPORTED_TRL",
    "RowSeededSampling",
    "check_trl_version",
    "credit_advantages",
    "token_ends",
    "grpo_trainer_class",
    "require_trl_version",
    "row_seed",
]

logger = logging.getLogger("conductor")

#: The TRL releases training is written against (pyproject.toml's ``train`` extra pins
#: the same range): the oldest whose private GRPO methods have the semantics the
#: recursion trainer relies on, up to the newest read.
SUPPORTED_TRL = ">=1.14.1,<1.17"


def check_trl_version(version: str, *, recursion: bool) -> None:
    """Check TRL ``version`` against :data:`SUPPORTED_TRL`.

    Outside it, recursion training raises :class:`MissingDependencyError` (naming both),
    and plain GRPO logs a warning: its one hook is alike in every TRL 1.x.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        supported = SpecifierSet(SUPPORTED_TRL).contains(Version(version), prereleases=True)
    except InvalidVersion:
        supported = False
    if supported:
        return
    what = f"trl {version} is installed; conductor train supports trl{SUPPORTED_TRL}"
    if recursion:
        raise MissingDependencyError(
            f"{what}: recursion training wraps GRPOTrainer methods that differ outside "
            f"it ({INSTALL_HINT})"
        )
    logger.warning("%s; GRPO training continues, untested with this version", what)


def require_trl_version(*, recursion: bool) -> None:
    """:func:`check_trl_version` for the installed TRL."""
    try:
        version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError as exc:
        raise MissingDependencyError(f"training needs trl: {INSTALL_HINT}") from exc
    check_trl_version(version, recursion=recursion)


# A large prime: folds the parts of a seed into one integer with few collisions.
_MIX = 1_000_003
_SEED_RANGE = 1 << 63


def row_seed(seed: int, step: int, call: int, row: int) -> int:
    """The seed of one row's sampling noise: the run's ``seed``, the optimizer ``step``,
    the ``call`` to the generator within that step, and the ``row``'s index in the
    step's whole generation batch (over every process)."""
    value = seed
    for part in (step, call, row):
        value = (value * _MIX + part) % _SEED_RANGE
    return value


class RowSeededSampling:
    """A transformers logits processor that samples each row from its own seeded noise.

    Given the (tempered) scores of a batch, it keeps for row ``i`` only the token that
    maximises ``scores / temperature + Gumbel noise``, the noise drawn from a generator
    seeded by ``seeds[i]`` and the token position: the pick is a draw from
    ``softmax(scores / temperature)`` that depends on the row's seed alone, not on the
    other rows of the batch, their padding, or any random state of the process.
    transformers then "samples" the single remaining token.  It must be the last
    processor: ``temperature`` is applied here (the generation config's own is set to
    1), and top-k / top-p / min-p filtering is not supported.
    """

    def __init__(self, seeds: Sequence[int], temperature: float) -> None:
        self.seeds = list(seeds)
        self.temperature = temperature
        self._prompt_width: int | None = None
        #: Tokens picked so far (per row): 0 after a generate call that bypassed it.
        self.tokens = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        self.tokens += 1
        if self._prompt_width is None:
            self._prompt_width = int(input_ids.shape[1])
        # The position in the completion, not in the padded batch: the padding width
        # depends on which rows share the batch.
        position = int(input_ids.shape[1]) - self._prompt_width
        vocab = scores.shape[-1]
        # The noise is drawn where the scores are (a GPU's generator on a GPU): moving a
        # batch x vocabulary tensor per token would cost more than the drawing.
        device = scores.device
        noise = torch.empty((len(self.seeds), vocab), dtype=torch.float32, device=device)
        for i, seed in enumerate(self.seeds):
            generator = torch.Generator(device=device)
            generator.manual_seed((seed * _MIX + position) % _SEED_RANGE)
            noise[i] = torch.rand(vocab, generator=generator, dtype=torch.float32, device=device)
        tiny = torch.finfo(torch.float32).tiny
        gumbel = -torch.log(-torch.log(noise.clamp(min=tiny, max=1.0 - 1e-7)))
        tempered = scores.float() / self.temperature
        picks = (tempered + gumbel).argmax(dim=-1, keepdim=True)
        kept = torch.full_like(scores, float("-inf"))
        return kept.scatter(1, picks, 0.0)


def token_ends(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """For each token of ``ids``, the length of the text the tokens up to it decode to
    (special tokens skipped, as TRL decodes completions): token ``t`` wrote the
    characters ``ends[t-1]:ends[t]`` of the completion's text.  Decoding prefixes, not
    single tokens, keeps multi-token characters and merged spaces in their place; a
    prefix that ends inside a character decodes longer than its share, so the ends are
    held non-decreasing."""
    ends: list[int] = []
    last = 0
    for t in range(len(ids)):
        last = max(last, len(tokenizer.decode(list(ids[: t + 1]), skip_special_tokens=True)))
        ends.append(last)
    return ends


def credit_advantages(
    advantages: Any,
    completion_ids: Any,
    completion_mask: Any,
    results: Sequence[Any],
    tokenizer: Any,
    weight: float,
) -> Any:
    """Per-token advantages (batch x tokens) from TRL's per-completion ``advantages``.

    Row ``i``'s tokens get ``advantages[i]``, plus ``weight`` times the credit of the
    step whose entries they write (:func:`conductor.train.credit.token_advantages`)
    when ``results[i]`` (a :class:`~conductor.train.reward.RolloutResult`) has step
    credits and spans; padding positions keep the row's advantage (the mask drops
    them from the loss).
    """
    import torch

    from .credit import token_advantages

    rows = completion_ids.shape[0]
    if len(results) != rows:
        raise RuntimeError(
            f"per-step credit: {len(results)} rollout results for {rows} completions"
        )
    out = advantages.reshape(rows, 1).expand(rows, completion_ids.shape[1]).clone()
    for i, result in enumerate(results):
        credits, spans = getattr(result, "credits", None), getattr(result, "spans", None)
        if not credits or not spans:
            continue
        length = int(completion_mask[i].sum().item())
        ids = completion_ids[i, :length].tolist()
        values = token_advantages(
            float(advantages[i]), token_ends(tokenizer, ids), spans, credits, weight
        )
        out[i, :length] = torch.tensor(values, dtype=out.dtype, device=out.device)
    return out


@contextmanager
def _row_seeded_generate(model: Any, sampling: RowSeededSampling) -> Iterator[None]:
    """Within the block, ``model.generate`` samples with ``sampling`` (TRL's call site
    takes no logits processor, so the instance's ``generate`` is wrapped for the one
    call; nothing else is changed and the class's method is back afterwards)."""
    from transformers import LogitsProcessorList

    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        if config is not None and getattr(config, "do_sample", False):
            config = copy.deepcopy(config)
            config.temperature = 1.0  # applied by ``sampling``, after every other processor
            kwargs["generation_config"] = config
        kwargs["logits_processor"] = LogitsProcessorList([sampling])
        return original(*args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        del model.generate


@functools.cache
def grpo_trainer_class() -> Any:
    """A ``GRPOTrainer`` subclass whose text prompts are tokenized as the checkpoint
    backend tokenizes them.

    A prompt is text when :func:`~conductor.train.policy.policy_prompt` rendered it to
    leave a prefill open: the chat template has written BOS and the like into it
    already, and TRL's own ``_tokenize_prompts`` would let the tokenizer add its special
    tokens again (two BOS for Llama, Gemma and Mistral).  The ids come from
    :func:`~conductor.llm.checkpoint_client.encode_prompt`, which both inference engines
    use; conversational prompts stay TRL's (its ``apply_chat_template`` adds no special
    tokens either).  Every prompt GRPO samples from and trains on, the recursion
    trainer's round-2 prompts included, passes through this method.
    """
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    from ..llm.checkpoint_client import encode_prompt

    # Typed as Any: trl's own annotations differ between versions (and are absent where
    # trl is not installed when type-checking).
    base: Any = GRPOTrainer

    class ConductorGRPOTrainer(base):  # type: ignore[misc]
        """GRPO whose text prompts get the checkpoint backend's token ids and whose
        transformers sampling is row-seeded."""

        _sampling_step = -1
        _sampling_calls = 0
        #: Set by the training run for a per-step credit: the reward whose
        #: ``last_batch`` holds the rollouts of this process's completions.
        credit_source: Any = None
        credit_weight = 1.0

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            output = super()._generate_and_score_completions(inputs)
            if self.credit_source is not None and self.credit_weight:
                before = output["advantages"]
                mask = output["completion_mask"].bool()
                after = credit_advantages(
                    before,
                    output["completion_ids"],
                    mask,
                    self.credit_source.last_batch,
                    self.processing_class,
                    self.credit_weight,
                )
                output["advantages"] = after
                # The share of this batch's completion tokens a step credit moved: what
                # shows in the metrics that the credit reached the loss at all.
                moved = ((after != before.reshape(-1, 1)) & mask).sum()
                mode = "train" if self.model.training else "eval"
                self._metrics[mode]["credit/token_share"].append(
                    float(moved) / max(1, int(mask.sum()))
                )
            return output

        def _generate_single_turn(self, prompt_ids: list[Any], *args: Any, **kwargs: Any) -> Any:
            # vLLM and continuous batching sample elsewhere; this covers transformers'
            # generate (see the module docstring).
            if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
                return super()._generate_single_turn(prompt_ids, *args, **kwargs)
            unsupported = [
                name
                for name, neutral in (
                    ("top_k", (0, None)),
                    ("top_p", (1.0, None)),
                    ("min_p", (None,)),
                )
                if getattr(self.generation_config, name, None) not in neutral
            ]
            if unsupported:
                raise ValueError(f"row-seeded sampling supports no {', '.join(unsupported)}")
            step = self.state.global_step
            if step != self._sampling_step:
                self._sampling_step, self._sampling_calls = step, 0
            call = self._sampling_calls
            self._sampling_calls += 1
            # Each process holds an equal, consecutive share of the generation batch.
            first = self.accelerator.process_index * len(prompt_ids)
            seeds = [
                row_seed(self.args.seed, step, call, first + i) for i in range(len(prompt_ids))
            ]
            sampling = RowSeededSampling(seeds, self.temperature)
            with _row_seeded_generate(self.accelerator.unwrap_model(self.model_wrapped), sampling):
                out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            if prompt_ids and not sampling.tokens:
                # TRL generated through another object than the one wrapped: the
                # completions came from the process's random stream, and a run on
                # several processes would no longer match one process.  Stop, not drift.
                raise RuntimeError(
                    "row-seeded sampling was bypassed: this TRL generates through another "
                    f"model object (conductor train supports trl{SUPPORTED_TRL})"
                )
            return out

        def _tokenize_prompts(self, prompts: list[Any]) -> Any:
            if not prompts or not isinstance(prompts[0], str):
                return super()._tokenize_prompts(prompts)
            ids = [encode_prompt(self.processing_class, p) for p in prompts]
            return ids, None, {}

    return ConductorGRPOTrainer
