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

TRL is imported inside the functions.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from typing import Any

from ..errors import MissingDependencyError
from .policy import INSTALL_HINT

__all__ = [
    "SUPPORTED_TRL",
    "check_trl_version",
    "grpo_trainer_class",
    "require_trl_version",
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
        """GRPO whose text prompts get the checkpoint backend's token ids."""

        def _tokenize_prompts(self, prompts: list[Any]) -> Any:
            if not prompts or not isinstance(prompts[0], str):
                return super()._tokenize_prompts(prompts)
            ids = [encode_prompt(self.processing_class, p) for p in prompts]
            return ids, None, {}

    return ConductorGRPOTrainer
