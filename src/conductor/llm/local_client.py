"""A :class:`ModelClient` for a GGUF model run by llama.cpp (``client: local``).

Every worker naming the same GGUF file shares one model host process (see
:mod:`conductor.localmodel.models`).  Calls to one model run one at a time, in the order
they came, in that process, so generation never blocks the event loop: other workers'
HTTP calls, progress bars and time-outs keep going while the CPU generates.

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
import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import BadRequestError, ModelCallError, RequestTimeoutError
from ..localmodel.models import (
    HostFailure,
    ModelHost,
    load_host,
    require_local_runtime,
    resolve_model_path,
)
from .capabilities import ClientCapabilities
from .types import ModelRequest, RawCompletion, Usage

if TYPE_CHECKING:
    from ..targets import ConductorConfig, Worker

__all__ = ["SAMPLING_PARAMS", "LocalClient", "seed_for"]

logger = logging.getLogger("conductor")

#: Request parameters that set how tokens are sampled (``seed`` is derived).
SAMPLING_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "mirostat_mode",
        "mirostat_tau",
        "mirostat_eta",
    }
)
# Accepted and handled here rather than passed on.
_HANDLED = frozenset({"seed", "max_tokens", "max_completion_tokens", "stop"})


def seed_for(params: dict[str, Any], sample_index: int) -> int:
    """The llama.cpp seed of a request: ``params["seed"]`` (default 0) + ``sample_index``."""
    base = params.get("seed")
    return (int(base or 0) + int(sample_index)) & 0xFFFFFFFF


class LocalClient:
    """One attempt at a chat completion against a GGUF model in its host process.

    ``target`` is a ``client: local`` worker, or the Conductor's settings for the
    ``local`` backend (both carry ``model``, ``model_path``, ``n_ctx``, ``n_threads``
    and ``n_gpu_layers``).  Constructing the client checks that a llama.cpp runtime
    and the model file are installed (raising
    :class:`~conductor.errors.MissingDependencyError`); the model itself is loaded on
    the first :meth:`send`.
    """

    # response_format is ignored (the grammar is how a local reply is constrained).
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        in_process=True,
        no_prefill="llama.cpp's chat handler builds the prompt itself, so there is none to extend",
        grammar="decoder",
    )

    def __init__(self, target: Worker | ConductorConfig) -> None:
        require_local_runtime()
        self.target = target
        self.path = resolve_model_path(target)
        self._name: str = getattr(target, "id", None) or "conductor"
        self._host: ModelHost | None = None
        self._ignored: set[str] = set()

    async def _loaded(self) -> ModelHost:
        if self._host is None:
            self._host = await load_host(
                self.path,
                n_ctx=self.target.n_ctx,
                n_threads=self.target.n_threads,
                n_gpu_layers=self.target.n_gpu_layers,
            )
        return self._host

    def _payload(self, request: ModelRequest) -> dict[str, Any]:
        """The host's ``generate`` request for ``request``."""
        messages: list[dict[str, str]] = []
        system_prompt = getattr(self.target, "system_prompt", None)
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.extend({"role": m["role"], "content": m["content"]} for m in request.messages)
        params = dict(request.params)
        sampling: dict[str, Any] = {}
        for name, value in params.items():
            if name in SAMPLING_PARAMS:
                sampling[name] = value
            elif name not in _HANDLED and name not in self._ignored:
                self._ignored.add(name)
                logger.debug("local worker %r ignores parameter %r", self._name, name)
        sampling["seed"] = seed_for(params, request.sample_index)
        max_tokens = params.get("max_tokens", params.get("max_completion_tokens"))
        stop = params.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        return {
            "messages": messages,
            "sampling": sampling,
            "max_tokens": int(max_tokens) if max_tokens is not None else None,
            "grammar": request.grammar,
            "stop": [s for s in (stop or []) if isinstance(s, str) and s],
        }

    def _failure(self, failure: HostFailure, host: ModelHost) -> ModelCallError:
        """The host's ``failed`` message as our error."""
        if failure.kind == "context":
            message = (
                f"the prompt is longer than the context window of the local model "
                f"({host.n_ctx} tokens); raise n_ctx in the pool file or shorten the "
                f"input ({failure.text})"
            )
        elif failure.kind == "grammar":
            message = f"the request's grammar is invalid: {failure.text}"
        elif failure.kind == "template":
            message = f"the chat template of {host.name} failed: {failure.text}"
        elif failure.kind == "internal":
            message = f"llama.cpp failed: {failure.text}"
        else:
            message = failure.text or failure.kind
        return BadRequestError(message, target=self._name, provider_message=message)

    async def prepare(self) -> None:
        """Start the model's host process and wait for it to load the model."""
        await self._loaded()

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Generate a reply; raise a ``ModelCallError`` subclass on failure.

        ``timeout_s`` counts from the call, including the wait for earlier calls to the
        same model.  A call still queued when it times out (or is cancelled) never runs;
        a generation already running is told to stop and ends at its next token (or
        prompt piece), so the next call to that model waits at most that long.
        """
        if request.response_format is not None:
            logger.debug("local worker %r ignores response_format; use grammar", self._name)
        payload = self._payload(request)
        pending: list[concurrent.futures.Future[dict[str, Any]]] = []

        async def run() -> tuple[ModelHost, dict[str, Any]]:
            host = await self._loaded()
            future = host.submit(payload, label=self._name)
            pending.append(future)
            return host, await asyncio.wrap_future(future)

        try:
            host, reply = await asyncio.wait_for(run(), timeout_s)
        except asyncio.TimeoutError as exc:
            self._cancel(pending)
            raise RequestTimeoutError(
                f"the local model did not answer within {timeout_s:g} s",
                target=self._name,
            ) from exc
        except asyncio.CancelledError:
            self._cancel(pending)  # nobody will read the reply (Ctrl-C, a cancelled sample)
            raise
        except HostFailure as failure:
            assert self._host is not None
            raise self._failure(failure, self._host) from None
        except ModelCallError as exc:
            raise exc.with_target(self._name) from None
        return self._completion(reply, host)

    def _cancel(self, pending: list[concurrent.futures.Future[dict[str, Any]]]) -> None:
        if self._host is not None:
            for future in pending:
                self._host.cancel(future)

    def _completion(self, reply: dict[str, Any], host: ModelHost) -> RawCompletion:
        text = str(reply.get("text") or "")
        model = self.target.model or self.path.name
        prompt_tokens = int(reply.get("prompt_tokens") or 0)
        completion_tokens = int(reply.get("completion_tokens") or 0)
        # Kept in the shape of an OpenAI chat completion, as every client's raw body
        # is in records, with the local model's own timings beside it.
        raw = {
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": reply.get("finish_reason"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": int(reply.get("cached_tokens") or 0)},
            },
            "timings": {
                "queued_s": reply.get("queued_s"),
                "prompt_s": reply.get("prompt_s"),
                "generate_s": reply.get("generate_s"),
            },
            "runtime": f"{host.ready.get('runtime')} {host.ready.get('version')}",
        }
        return RawCompletion(
            text=text,
            usage=Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens),
            raw=raw,
            model=model,
            finish_reason=reply.get("finish_reason"),
            queued_s=float(reply.get("queued_s") or 0.0),
        )

    async def aclose(self) -> None:
        """Nothing to release: the model's host is shared and stays in the registry."""
        self._host = None
