"""A :class:`ModelClient` that runs a GGUF model in-process with llama.cpp (``client: local``).

Every worker naming the same GGUF file shares one loaded model (see
:mod:`conductor.llm.local_model`).  Calls to one model run one at a time on that model's
own worker thread, so generation never blocks the event loop: other workers' HTTP
calls, progress bars and time-outs keep going while the CPU generates.

Sampling parameters llama.cpp knows (``temperature``, ``max_tokens``, ``top_p``,
``top_k``, ``min_p``, ``repeat_penalty``, ``stop``, ...) are passed on; provider
pass-through parameters meant for hosted models (``reasoning_effort``, ...) are
ignored.  The seed is derived from ``params["seed"]`` (default 0) plus the request's
``sample_index``, so a sample is reproducible and repeated samples differ.  A
request's ``grammar`` (GBNF) constrains decoding.  Local calls cost nothing; cost is
accounted one level up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..errors import BadRequestError, ModelCallError, RequestTimeoutError
from .local_model import (
    LoadedModel,
    check_grammar,
    load_model,
    require_llama_cpp,
    resolve_model_path,
)
from .types import ModelRequest, RawCompletion, Usage

if TYPE_CHECKING:
    from ..targets import ConductorConfig, Worker

__all__ = ["LLAMA_KWARGS", "LocalClient", "seed_for"]

logger = logging.getLogger("conductor")

#: Request parameters passed to ``Llama.create_chat_completion`` (``seed`` is derived).
LLAMA_KWARGS = frozenset(
    {
        "temperature",
        "max_tokens",
        "top_p",
        "top_k",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "stop",
        "logit_bias",
        "mirostat_mode",
        "mirostat_tau",
        "mirostat_eta",
    }
)
# Accepted and handled here rather than passed on.
_HANDLED = frozenset({"seed", "max_completion_tokens"})

# Parsed grammars by (model file, grammar text).  A Conductor sends the same grammar
# for every question, so it is compiled and checked once.
_GRAMMARS: OrderedDict[tuple[str, str], Any] = OrderedDict()
_GRAMMARS_LOCK = threading.Lock()
_GRAMMARS_MAX = 64


def seed_for(params: dict[str, Any], sample_index: int) -> int:
    """The llama.cpp seed of a request: ``params["seed"]`` (default 0) + ``sample_index``."""
    base = params.get("seed")
    return (int(base or 0) + int(sample_index)) & 0xFFFFFFFF


def _grammar(entry: LoadedModel, text: str) -> Any:
    """The ``LlamaGrammar`` for ``text``, checked against ``entry``'s vocabulary once."""
    key = (str(entry.path), text)
    with _GRAMMARS_LOCK:
        cached = _GRAMMARS.get(key)
        if cached is not None:
            _GRAMMARS.move_to_end(key)
            return cached
    llama_cpp = require_llama_cpp()
    check_grammar(entry.llama, text)
    grammar = llama_cpp.LlamaGrammar.from_string(text, verbose=False)
    with _GRAMMARS_LOCK:
        _GRAMMARS[key] = grammar
        while len(_GRAMMARS) > _GRAMMARS_MAX:
            _GRAMMARS.popitem(last=False)
    return grammar


class LocalClient:
    """One attempt at a chat completion against an in-process GGUF model.

    ``target`` is a ``client: local`` worker, or the Conductor's settings for the
    ``local`` backend (both carry ``model``, ``model_path``, ``n_ctx``, ``n_threads``
    and ``n_gpu_layers``).  Constructing the client checks that llama-cpp-python and
    the model file are installed (raising
    :class:`~conductor.errors.MissingDependencyError`); the model itself is loaded on
    the first :meth:`send`.
    """

    def __init__(self, target: Worker | ConductorConfig) -> None:
        require_llama_cpp()
        self.target = target
        self.path = resolve_model_path(target)
        self._name: str = getattr(target, "id", None) or "conductor"
        self._entry: LoadedModel | None = None
        self._ignored: set[str] = set()

    async def _loaded(self) -> LoadedModel:
        if self._entry is None:
            self._entry = await load_model(
                self.path,
                n_ctx=self.target.n_ctx,
                n_threads=self.target.n_threads,
                n_gpu_layers=self.target.n_gpu_layers,
            )
        return self._entry

    def _kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """``create_chat_completion`` keyword arguments for ``request`` (no grammar)."""
        messages: list[dict[str, str]] = []
        system_prompt = getattr(self.target, "system_prompt", None)
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.extend({"role": m["role"], "content": m["content"]} for m in request.messages)
        kwargs: dict[str, Any] = {"messages": messages}
        params = dict(request.params)
        if "max_tokens" not in params and "max_completion_tokens" in params:
            params["max_tokens"] = params["max_completion_tokens"]
        for name, value in params.items():
            if name in LLAMA_KWARGS:
                kwargs[name] = value
            elif name not in _HANDLED and name not in self._ignored:
                self._ignored.add(name)
                logger.debug("local worker %r ignores parameter %r", self._name, name)
        kwargs["seed"] = seed_for(params, request.sample_index)
        return kwargs

    def _generate(
        self,
        entry: LoadedModel,
        kwargs: dict[str, Any],
        grammar_text: str | None,
        stop: threading.Event,
    ) -> dict[str, Any]:
        """Run one completion on the model's thread, under its lock, until done or
        ``stop`` is set."""
        try:
            if grammar_text is not None:
                kwargs = {**kwargs, "grammar": _grammar(entry, grammar_text)}
            # What a --debug run shows when a generation starts (and what a test waits for).
            logger.debug("local model %s: generating for %r", entry.path.name, self._name)
            response = entry.generate(stop, lambda llama: llama.create_chat_completion(**kwargs))
            # Not streaming, so the response is one OpenAI-style dict.
            return dict(response)  # type: ignore[arg-type]
        except ModelCallError:
            raise
        except ValueError as exc:
            raise self._bad_request(exc, entry) from exc
        except RuntimeError as exc:
            raise BadRequestError(
                f"llama.cpp failed: {exc}", target=self._name, provider_message=str(exc)
            ) from exc

    def _bad_request(self, exc: ValueError, entry: LoadedModel) -> BadRequestError:
        text = str(exc)
        if "exceed context window" in text:
            message = (
                f"the prompt is longer than the context window of the local model "
                f"({entry.n_ctx} tokens); raise n_ctx in the pool file or shorten the "
                f"input ({text})"
            )
        elif "grammar" in text:
            message = f"the request's grammar is invalid: {text}"
        else:
            message = text
        return BadRequestError(message, target=self._name, provider_message=message)

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Generate a reply; raise a ``ModelCallError`` subclass on failure.

        ``timeout_s`` counts from the call, including the wait for earlier calls to the
        same model.  A call still queued when it times out (or is cancelled) never runs;
        a generation already running is told to stop and ends at its next token (or
        prompt batch), so the next call to that model waits at most that long.
        """
        if request.response_format is not None:
            logger.debug("local worker %r ignores response_format; use grammar", self._name)
        kwargs = self._kwargs(request)
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        async def run() -> dict[str, Any]:
            entry = await self._loaded()
            call = functools.partial(self._generate, entry, kwargs, request.grammar, stop)
            # The model's own one-thread executor queues calls in order and keeps the
            # default executor free for everything else.
            return await loop.run_in_executor(entry.executor, call)

        try:
            response = await asyncio.wait_for(run(), timeout_s)
        except asyncio.TimeoutError as exc:
            stop.set()
            raise RequestTimeoutError(
                f"the local model did not answer within {timeout_s:g} s",
                target=self._name,
            ) from exc
        except asyncio.CancelledError:
            stop.set()  # nobody will read the reply (Ctrl-C, a cancelled sample)
            raise
        return self._completion(response)

    def _completion(self, response: dict[str, Any]) -> RawCompletion:
        choice = (response.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        usage = response.get("usage") or {}
        return RawCompletion(
            text=message.get("content") or "",
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            ),
            raw=response,
            model=self.target.model or self.path.name,
            finish_reason=choice.get("finish_reason"),
        )

    async def aclose(self) -> None:
        """Nothing to release: the loaded model is shared and stays in the registry."""
        self._entry = None
