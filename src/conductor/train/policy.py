"""The policy a Conductor is trained from: loading the base model and its tokenizer
(:func:`load_policy`), and the prompts it is sampled with (:func:`policy_prompt`,
:func:`opens_with_prefill`), rendered as the checkpoint backend renders them so that
training and inference see identical prompts.

Heavy libraries (torch, transformers) are imported inside functions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError, UsageError, install_hint
from ..userfiles import is_regular

if TYPE_CHECKING:
    from .settings import TrainConfig

__all__ = [
    "INSTALL_HINT",
    "cuda_available",
    "is_main_process",
    "load_policy",
    "opens_with_prefill",
    "policy_prompt",
    "require_train_deps",
    "world_size",
]

#: What to install for training.
INSTALL_HINT = install_hint("train")
# A chat template for base models that have none: the same plain transcript that the
# checkpoint backend falls back to, so training and inference see identical prompts.
_PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def require_train_deps() -> None:
    """Raise :class:`MissingDependencyError` unless the training packages are installed."""
    missing = [
        name
        for name in ("torch", "transformers", "trl", "datasets")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise MissingDependencyError(
            f"training needs {', '.join(missing)}, which is not installed: {INSTALL_HINT}"
        )


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU."""
    import torch

    return bool(torch.cuda.is_available())


def world_size() -> int:
    """How many training processes this launch has (``accelerate launch`` sets
    ``WORLD_SIZE``; a plain run is one)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def is_main_process() -> bool:
    """Whether this is the launch's first process (``RANK`` 0, or a plain run): the one
    that writes the run's shared files."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def _gguf_file(spec: str) -> Path:
    """The GGUF file named by ``gguf:smollm2`` or ``gguf:PATH``."""
    from ..localmodel.models import EMBEDDED_MODEL, embedded_model_path

    name = spec[len("gguf:") :].strip()
    if not name:
        raise UsageError("base_model 'gguf:' needs a file path or 'smollm2'")
    if name == EMBEDDED_MODEL:
        return embedded_model_path()
    path = Path(name).expanduser()
    if not is_regular(path):
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
    the checkpoint backend also uses (after a BOS, where the tokenizer adds one).
    """
    require_train_deps()
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
                f"loading a GGUF base model needs the gguf package: {INSTALL_HINT}"
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
        cuda = cuda_available()
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
        tokenizer.chat_template = _plain_chat_template(tokenizer)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _plain_chat_template(tokenizer: Any) -> str:
    """The plain transcript as a chat template for ``tokenizer``, opening with BOS where
    the tokenizer puts BOS before a text (Llama and Mistral base models).

    A templated prompt gets no special tokens from the tokenizer (the template writes
    them), so without this a base model would be trained and run without the BOS it
    was pretrained with, unlike the untemplated transcript the checkpoint backend
    tokenizes with the tokenizer's own special tokens.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    with_special = tokenizer("x")["input_ids"]
    without = tokenizer("x", add_special_tokens=False)["input_ids"]
    adds_bos = bos is not None and with_special[:1] == [bos] and without[:1] != [bos]
    return ("{{ bos_token }}" if adds_bos else "") + _PLAIN_CHAT_TEMPLATE


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
    chat template (as the checkpoint backend renders it), the prompt is plain text, and
    the completion continues the prefill.  TRL tokenizes such text with the tokenizer's
    special tokens added (a second BOS after the template's own); the trainer of
    :func:`~conductor.train.grpo.grpo_trainer_class` gives it the backend's ids instead.
    """
    plain = [dict(m) for m in messages]
    if not render:
        return plain
    from ..llm.checkpoint_client import chat_prompt

    return chat_prompt(tokenizer, plain)
