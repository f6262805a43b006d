"""A :class:`ModelClient` that runs a trained Conductor checkpoint in-process.

``target.model`` is a checkpoint directory or ``hf:ORG/NAME[@REVISION]``, found and
loaded by :mod:`conductor.llm.checkpoint_load`.  Two engines:

- **vLLM** (offline ``vllm.LLM``, bf16), used when ``vllm`` is importable and a CUDA GPU
  is present.  A request's ``grammar`` (GBNF) is passed to vLLM's guided / structured
  decoding when the installed vLLM accepts it; otherwise decoding is unconstrained.
- **transformers** (``AutoModelForCausalLM``), everywhere else: on the GPU in bf16, on
  the CPU in bf16 when the CPU has native bf16 instructions, else float32.  This engine
  **ignores** ``request.grammar``: the workflow parser and its re-ask loop then either
  get a valid workflow or fail with a clear parse error.

The model is loaded on the first :meth:`CheckpointClient.send`, off the event loop, and
kept in a process-wide registry so that every client naming the same directory (with the
same engine, dtype and device) shares one loaded copy; calls to one model run one at a
time under its lock.  The prompt is the tokenizer's chat template with the generation
prompt added, or, when the messages end with an assistant message (a prefill), with
that message left open for the model to continue (a plain ``User: ...`` /
``Assistant:`` transcript when the tokenizer has none), given to either engine as the
token ids :func:`prompt_token_ids` makes (training tokenizes its prompts the same
way); the reply is what the model wrote after the prefill.  Sampling follows
``request.params``: ``temperature`` (0 = greedy), ``top_p``, ``top_k``,
``repetition_penalty``, ``max_tokens`` (default 1024) and ``stop``; settings left
unset keep the checkpoint's ``generation_config`` defaults; the seed is
``params["seed"]`` (default 0) plus ``request.sample_index``, so a sample is
reproducible and repeated samples differ.  Load options may also be given in
``params``: ``dtype`` (``bfloat16``, ``float16``, ``float32``) and ``device``
(``cpu``, ``cuda``, ``cuda:1``); ``engine`` (``transformers`` or ``vllm``) forces one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BadRequestError, MissingDependencyError, RequestTimeoutError
from .capabilities import ClientCapabilities

# The registry's functions are re-exported: this module is where users look for them.
from .checkpoint_load import (
    INSTALL_HINT,
    LoadedCheckpoint,
    choose_engine,
    get_loaded_checkpoint,
    importable,
    loaded_checkpoints,
    require_torch_transformers,
    resolve_checkpoint_dir,
    unload_all,
)
from .types import ModelRequest, RawCompletion, Usage

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "CheckpointClient",
    "LoadedCheckpoint",
    "chat_prompt",
    "encode_prompt",
    "get_loaded_checkpoint",
    "loaded_checkpoints",
    "plain_prompt",
    "prompt_token_ids",
    "unload_all",
]

logger = logging.getLogger("conductor")

#: ``max_new_tokens`` when the request sets no ``max_tokens`` (the paper's setting).
DEFAULT_MAX_TOKENS = 1024
# Parameters read by this client; anything else in params is logged once and ignored.
_SAMPLING = frozenset(
    {"temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "stop", "seed"}
)
_LOAD_OPTIONS = frozenset({"dtype", "device", "engine"})


def plain_prompt(messages: list[dict[str, str]]) -> str:
    """A chat as a plain transcript, for tokenizers without a chat template.

    A final assistant message is a prefill: the transcript ends inside it, for the model
    to continue.
    """
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    if messages and messages[-1]["role"] == "assistant":
        return "\n".join(lines)
    return "\n".join(lines) + "\nAssistant:"


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text of ``messages`` for ``tokenizer`` (its token ids are
    :func:`encode_prompt`'s).

    With a chat template, a conversation ending in a user message gets the generation
    prompt; one ending in an assistant message (a prefill) is rendered open, so the
    model continues that message (``continue_final_message``).  Without a chat template
    it is :func:`plain_prompt`'s transcript.
    """
    if _has_chat_template(tokenizer):
        prefill = bool(messages) and messages[-1]["role"] == "assistant"
        text = tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=not prefill,
            continue_final_message=prefill,
            tokenize=False,
        )
        return str(text)
    return plain_prompt(messages)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """The token ids of ``text``, a prompt :func:`chat_prompt` rendered for ``tokenizer``.

    A chat template writes BOS and the like itself, so nothing is added to its text (as
    ``apply_chat_template(tokenize=True)`` does, and with it TRL's conversational
    prompts); letting the tokenizer add its own would give Llama, Gemma and Mistral two
    BOS.  The plain transcript gets the tokenizer's special tokens, as any text would.
    """
    special = not _has_chat_template(tokenizer)
    return [int(i) for i in tokenizer(text, add_special_tokens=special)["input_ids"]]


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids the checkpoint is prompted with for ``messages``."""
    return encode_prompt(tokenizer, chat_prompt(tokenizer, messages))


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _seed(params: dict[str, Any], sample_index: int) -> int:
    return (int(params.get("seed") or 0) + int(sample_index)) & 0xFFFFFFFF


def _stops(params: dict[str, Any]) -> list[str]:
    stop = params.get("stop")
    if not stop:
        return []
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


class CheckpointClient:
    """One attempt at a chat completion against an in-process Conductor checkpoint.

    ``target`` is the Conductor's target worker (``client="checkpoint"``), whose
    ``model`` is a checkpoint directory or ``hf:ORG/NAME[@REVISION]``.  Nothing is
    imported or loaded until the first :meth:`send`.
    """

    # The grammar constrains the vLLM engine only (transformers ignores it, see the
    # module docstring); response_format is ignored.
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        in_process=True, prefill="chat_template", grammar="decoder"
    )

    def __init__(self, target: Worker) -> None:
        for name in ("torch", "transformers"):
            if not importable(name):
                raise MissingDependencyError(
                    f"running a checkpoint Conductor needs torch and transformers: {INSTALL_HINT}"
                )
        self.target = target
        self._name: str = target.id or "conductor"
        self._dir: Path | None = None
        self._ignored: set[str] = set()

    # ------------------------------------------------------------------ loading

    def _entry(self, params: dict[str, Any]) -> LoadedCheckpoint:
        """Resolve, import and load (blocking; run off the event loop)."""
        torch, _ = require_torch_transformers()
        if self._dir is None:
            self._dir = resolve_checkpoint_dir(self.target.model)
        engine, dtype, device = choose_engine(params, torch)
        return get_loaded_checkpoint(self._dir, engine, dtype, device)

    def _messages(self, request: ModelRequest) -> list[dict[str, str]]:
        messages: list[dict[str, str]] = []
        if self.target.system_prompt:
            messages.append({"role": "system", "content": self.target.system_prompt})
        messages.extend({"role": m["role"], "content": m["content"]} for m in request.messages)
        return messages

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params = dict(request.params)
        if "max_tokens" not in params and "max_completion_tokens" in params:
            params["max_tokens"] = params.pop("max_completion_tokens")
        params.pop("max_completion_tokens", None)
        for name in params:
            if name not in _SAMPLING and name not in _LOAD_OPTIONS and name not in self._ignored:
                self._ignored.add(name)
                logger.debug("checkpoint conductor ignores parameter %r", name)
        return params

    # --------------------------------------------------------------- generation

    def _generate_transformers(
        self, entry: LoadedCheckpoint, request: ModelRequest, params: dict[str, Any]
    ) -> RawCompletion:
        import torch

        tokenizer, model = entry.tokenizer, entry.model
        ids = prompt_token_ids(tokenizer, self._messages(request))
        input_ids = torch.tensor([ids], dtype=torch.long, device=entry.device)
        attention = torch.ones_like(input_ids)
        max_new = int(params.get("max_tokens") or DEFAULT_MAX_TOKENS)
        gen: dict[str, Any] = {"max_new_tokens": max_new, "attention_mask": attention}
        temperature = params.get("temperature")
        if temperature is not None and float(temperature) <= 0.0:
            gen["do_sample"] = False
            # Keep the checkpoint's sampling defaults from triggering warnings in greedy mode.
            gen.update(temperature=None, top_p=None, top_k=None)
        else:
            gen["do_sample"] = True
            if temperature is not None:
                gen["temperature"] = float(temperature)
            if params.get("top_p") is not None:
                gen["top_p"] = float(params["top_p"])
            if params.get("top_k") is not None:
                gen["top_k"] = int(params["top_k"])
        if params.get("repetition_penalty") is not None:
            gen["repetition_penalty"] = float(params["repetition_penalty"])
        stops = _stops(params)
        if stops:
            gen["stop_strings"] = stops
            gen["tokenizer"] = tokenizer
        eos = tokenizer.eos_token_id
        if tokenizer.pad_token_id is None and eos is not None:
            gen["pad_token_id"] = eos

        torch.manual_seed(_seed(params, request.sample_index))
        with torch.inference_mode():
            out = model.generate(input_ids, **gen)
        new_ids = out[0, input_ids.shape[1] :].tolist()
        eos_ids = self._eos_ids(model, tokenizer)
        # generate pads finished rows; for one row, nothing follows the stop token.
        hit_eos = bool(new_ids) and new_ids[-1] in eos_ids
        reply = tokenizer.decode(new_ids, skip_special_tokens=True)
        finish = "length" if len(new_ids) >= max_new and not hit_eos else "stop"
        for s in stops:
            cut = reply.find(s)
            if cut >= 0:
                reply, finish = reply[:cut], "stop"
        return RawCompletion(
            text=reply,
            usage=Usage(input_tokens=int(input_ids.shape[1]), output_tokens=len(new_ids)),
            raw={
                "engine": "transformers",
                "model": str(entry.path),
                "dtype": entry.dtype,
                "device": entry.device,
                "seed": _seed(params, request.sample_index),
                "grammar_used": False,
            },
            model=self.target.model,
            finish_reason=finish,
        )

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
        ids: set[int] = set()
        cfg_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for value in (cfg_eos, tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    def _generate_vllm(
        self, entry: LoadedCheckpoint, request: ModelRequest, params: dict[str, Any]
    ) -> RawCompletion:
        from vllm import SamplingParams

        # Token ids, not text, so vLLM does not add a second BOS to a templated prompt.
        ids = prompt_token_ids(entry.tokenizer, self._messages(request))
        prompt = {"prompt_token_ids": ids}
        sp_kwargs: dict[str, Any] = {
            "max_tokens": int(params.get("max_tokens") or DEFAULT_MAX_TOKENS),
            "seed": _seed(params, request.sample_index),
        }
        for name in ("temperature", "top_p", "top_k", "repetition_penalty"):
            if params.get(name) is not None:
                sp_kwargs[name] = params[name]
        if _stops(params):
            sp_kwargs["stop"] = _stops(params)
        guided = _vllm_guided_kwargs(request.grammar) if request.grammar else {}
        grammar_used = False
        outputs = None
        if guided:
            try:
                outputs = entry.model.generate(
                    [prompt], SamplingParams(**sp_kwargs, **guided), use_tqdm=False
                )
                grammar_used = True
            except Exception as exc:  # vLLM versions differ in what they reject, and how
                logger.warning(
                    "vLLM rejected the workflow grammar (%s); decoding unconstrained", exc
                )
        if outputs is None:
            outputs = entry.model.generate([prompt], SamplingParams(**sp_kwargs), use_tqdm=False)
        result = outputs[0]
        choice = result.outputs[0]
        return RawCompletion(
            text=choice.text,
            usage=Usage(
                input_tokens=len(result.prompt_token_ids or ()),
                output_tokens=len(choice.token_ids or ()),
            ),
            raw={
                "engine": "vllm",
                "model": str(entry.path),
                "dtype": entry.dtype,
                "seed": sp_kwargs["seed"],
                "grammar_used": grammar_used,
            },
            model=self.target.model,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
        )

    def _run(
        self, request: ModelRequest, params: dict[str, Any], abandoned: threading.Event
    ) -> RawCompletion | None:
        entry = self._entry(params)
        with entry.lock:
            if abandoned.is_set():
                return None  # timed out while queued: do not spend minutes on a dropped call
            try:
                if entry.engine == "vllm":
                    return self._generate_vllm(entry, request, params)
                return self._generate_transformers(entry, request, params)
            except (RuntimeError, ValueError, TypeError) as exc:
                # Out-of-memory, a prompt longer than the context, bad sampling values.
                raise BadRequestError(
                    f"the checkpoint failed to generate: {exc}",
                    target=self._name,
                    provider_message=str(exc),
                ) from exc

    async def prepare(self) -> None:
        """Load the checkpoint (minutes for a large one) before the first call."""
        params = self._params(ModelRequest(messages=(), params=dict(self.target.params)))
        await asyncio.to_thread(self._entry, params)

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Generate a reply; loads the model on the first call.

        ``timeout_s`` counts from the call and includes loading and the wait for earlier
        calls.  A call still queued at its time-out never runs; one already generating
        cannot be interrupted, finishes in the background, and its result is dropped.
        """
        if request.response_format is not None:
            logger.debug("checkpoint conductor ignores response_format")
        params = self._params(request)
        abandoned = threading.Event()
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(self._run, request, params, abandoned), timeout_s
            )
        except asyncio.TimeoutError as exc:
            abandoned.set()
            raise RequestTimeoutError(
                f"the checkpoint did not answer within {timeout_s:g} s", target=self._name
            ) from exc
        if result is None:  # only an abandoned call returns None; cannot happen here
            raise RequestTimeoutError("the checkpoint call was abandoned", target=self._name)
        return result

    async def aclose(self) -> None:
        """Nothing to release: the loaded model is shared and stays in the registry."""


def _vllm_guided_kwargs(grammar: str) -> dict[str, Any]:
    """SamplingParams keyword arguments that constrain decoding to ``grammar``.

    vLLM 0.11 and later have ``StructuredOutputsParams`` (``SamplingParams(
    structured_outputs=...)``; 0.12 removed the rest); 0.10 and earlier only
    ``GuidedDecodingParams`` (``guided_decoding=``), which 0.11 keeps as a deprecated
    subclass (read from each version's ``vllm/sampling_params.py``).  Empty when
    neither exists.
    """
    try:
        from vllm.sampling_params import StructuredOutputsParams

        return {"structured_outputs": StructuredOutputsParams(grammar=grammar)}
    except Exception:  # ImportError, or a constructor that differs in this version
        pass
    try:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(grammar=grammar)}
    except Exception:
        logger.warning("this vLLM has no grammar-guided decoding; decoding unconstrained")
        return {}
