"""What a client kind can do: :class:`ClientCapabilities`, declared by each client class.

Every client class in ``conductor/llm/*_client.py`` declares its kind's capabilities as
the class attribute ``capabilities``; the rest of the package reads them through the
registry (:func:`conductor.llm.factory.capabilities_of`) instead of comparing
``target.client`` with kind names, so that a new client kind is one class and one
registry line (plus its name in :data:`conductor.targets.ClientKind`, which the pool
loader, a floor below this one, checks ``client:`` against).

This module imports nothing of the package's own, so that every client can import it;
the helpers the clients share take the rule they need as an argument
(:func:`conductor.llm.prefill_rules.continue_fields`, the key variables passed to
:func:`conductor.llm.apikey.resolve_api_key`) rather than look the kind up, which would
make them import the clients that import them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "NO_CAPABILITIES",
    "BatchSupport",
    "ClientCapabilities",
    "GrammarSupport",
    "PrefillRule",
]

#: How a client sends a reply that begins with a prefill (a final assistant message):
#:
#: - ``native``: the API continues a final assistant message by itself (Anthropic);
#: - ``api_base``: a server named by ``api_base`` is taken to be vLLM or compatible and
#:   asked to continue it; the provider's own API (no api_base) cannot;
#: - ``model_prefix``: the model's provider prefix decides: ``anthropic/...`` as
#:   ``native``, ``openai/...`` or ``hosted_vllm/...`` as ``api_base`` (litellm);
#: - ``chat_template``: the model's tokenizer renders the conversation, prefill included
#:   (an in-process checkpoint); no wire protocol is involved;
#: - ``none``: it cannot, and a worker's prefill is left out with a warning.
PrefillRule = Literal["native", "api_base", "model_prefix", "chat_template", "none"]

#: What a client does with ``request.grammar`` (GBNF): constrains its own decoder
#: (``decoder``: llama.cpp, an in-process vLLM), sends it to a server named by
#: ``api_base`` in the body field that server reads (``server``; which field is the
#: target's ``structured_outputs``, see :mod:`conductor.llm.structured`), does so only
#: for an ``openai/`` or ``hosted_vllm/`` model (``server_model_prefix``: litellm), or
#: drops it (``none``: the workflow parser's re-ask loop is all that keeps the reply to
#: the grammar).
GrammarSupport = Literal["decoder", "server", "server_model_prefix", "none"]

#: Which provider batch API a kind's calls can be sent through (half price, answered
#: within hours; :mod:`conductor.batches.api`): ``openai`` (OpenAI's ``/v1/files`` and
#: ``/v1/batches``, also at an ``api_base`` server that speaks them), ``anthropic``
#: (Message Batches), ``google`` (Gemini's batch mode), ``model_prefix`` (the model's
#: provider prefix picks one of them: litellm), or ``none``.
BatchSupport = Literal["openai", "anthropic", "google", "model_prefix", "none"]


@dataclass(frozen=True)
class ClientCapabilities:
    """What the clients of one kind can do, and how the layers around them treat it.

    ``in_process``: the model runs in this process (or a host process of its own), not
    behind a provider: its calls cost nothing, need no key, share no provider quota,
    and every target naming one model file shares one loaded copy; the seed is fixed by
    the request, so a retry would reproduce the same reply.

    ``key_envs``: the variables the key is read from, in order, when the worker names
    none (``api_key_env``); empty for a client that needs none or finds its own.

    ``routes_by_model``: the model's provider prefix (``anthropic/claude``) picks the
    provider, hence its key variables, its quota and how it continues a prefill
    (litellm).  ``quota``: the provider a call counts against when no ``api_base``
    names a server (``None``: the kind's own name).

    ``prefill``: how a reply that begins with a prefill is sent (:data:`PrefillRule`);
    ``no_prefill``: why it cannot be, for the warning (``None``: the reason the
    ``model_prefix`` rule gives, naming the prefixes that can).

    ``grammar`` (:data:`GrammarSupport`) says what structured output
    the client honours; the client's own ``send`` is what does it.

    ``price_prefix``: the prefix litellm's price table files this client's models under
    when the model names none (``gemini/`` for Google's).

    ``tools``: the client sends ``request.tools`` / ``tool_choice`` and reads the
    reply's tool calls; ``json_reply``: it sends ``request.response_format`` to a
    provider that honours it.  A client without one of them cannot answer a request
    that asks for it (``conductor serve`` refuses it before any call).

    ``batch`` (:data:`BatchSupport`): the provider batch API the kind's calls can go
    through in a ``bench --batch`` run.
    """

    in_process: bool = False
    key_envs: tuple[str, ...] = ()
    routes_by_model: bool = False
    quota: str | None = None
    prefill: PrefillRule = "none"
    no_prefill: str | None = None
    grammar: GrammarSupport = "none"
    price_prefix: str | None = None
    tools: bool = False
    json_reply: bool = False
    batch: BatchSupport = "none"


#: The capabilities of a kind no client serves: none (making one says it is unknown).
NO_CAPABILITIES = ClientCapabilities()
