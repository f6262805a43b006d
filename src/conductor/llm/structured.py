"""A grammar sent to an OpenAI-compatible server, in the body field that server reads,
and the check that it was honoured: :class:`ServerGrammar`.

Each server reads a GBNF grammar from a field of its own, and every one of them answers
200 to a request whose field it does not know, decoding unconstrained (read from each
one's source):

==============  ======================================  ==================================
server          field                                   a field it does not know
==============  ======================================  ==================================
vLLM <= 0.10    ``guided_grammar``                      logged as ignored
vLLM 0.11       ``structured_outputs.grammar`` (and     logged as ignored
                ``guided_grammar``, deprecated)
vLLM >= 0.12    ``structured_outputs: {"grammar": g}``  logged as ignored
SGLang          ``ebnf``                                dropped silently (pydantic)
llama-server    ``grammar``                             dropped silently
==============  ======================================  ==================================

All of them read GBNF as it is (vLLM and SGLang hand it to xgrammar, whose EBNF is
GBNF's with extensions), so the grammar goes unchanged.  Which field is a target's
``structured_outputs`` setting (:data:`conductor.targets.StructuredOutputs`); ``auto``,
the default, asks the server once per address (:func:`identify_server`): vLLM answers
``GET /version``, llama-server ``GET /props``, SGLang ``GET /server_info`` (or the older
``/get_server_info``).  ``auto`` is the default because the right field changed within
one server's minor versions (vLLM 0.12 dropped the one 0.10 read), so a fixed default
is wrong for someone, silently; a server that answers none of those is sent vLLM's
current field, with a warning, and the check below tells if that was wrong.

Whatever was sent, a reply the grammar does not admit (checked with
:class:`~conductor.llm.gbnf.GbnfMatcher`; a reply cut off by ``max_tokens`` or a stop
string need only begin a sentence) means the server ignored it: the call fails with
:class:`~conductor.errors.GrammarIgnoredError` naming the field, the server and the
setting to use, instead of passing the unconstrained reply on as if it were constrained.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import GrammarIgnoredError, target_name
from .gbnf import GbnfMatcher
from .prefill_rules import OPENAI_COMPATIBLE_PREFIXES
from .replies import openai_content

if TYPE_CHECKING:
    from ..targets import Worker
    from .capabilities import GrammarSupport
    from .types import ModelRequest, RawCompletion

__all__ = [
    "FIELDS",
    "SERVER_KINDS",
    "SERVERS",
    "ServerGrammar",
    "ServerIdentity",
    "ServerKind",
    "carries_grammar",
    "clear_identified",
    "grammar_fields",
    "identify_server",
    "server_root",
    "vllm_kind",
]

log = logging.getLogger("conductor")

#: The servers a grammar can be sent to, by the field they read it from.
ServerKind = Literal["vllm", "vllm-legacy", "sglang", "llama.cpp"]
SERVER_KINDS: tuple[ServerKind, ...] = get_args(ServerKind)
#: The body field each kind reads the grammar from, as messages name it.
FIELDS: dict[ServerKind, str] = {
    "vllm": "structured_outputs.grammar",
    "vllm-legacy": "guided_grammar",
    "sglang": "ebnf",
    "llama.cpp": "grammar",
}
#: Each kind as messages name it.
SERVERS: dict[ServerKind, str] = {
    "vllm": "vLLM 0.11 or later",
    "vllm-legacy": "vLLM 0.10 or earlier",
    "sglang": "SGLang",
    "llama.cpp": "llama.cpp's llama-server",
}
# The first vLLM that reads structured_outputs (0.11 reads both; 0.12 only that one).
_VLLM_STRUCTURED = (0, 11)
# A server that answers none of the probes is sent vLLM's current field: vLLM is what
# serves a trained Conductor (docs/training.md), and the reply check catches a wrong guess.
_FALLBACK: ServerKind = "vllm"
_PROBE_TIMEOUT_S = 10.0
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)")


def grammar_fields(kind: ServerKind, grammar: str) -> dict[str, Any]:
    """The body fields that carry ``grammar`` to a server of ``kind``."""
    if kind == "vllm":
        return {"structured_outputs": {"grammar": grammar}}
    if kind == "vllm-legacy":
        return {"guided_grammar": grammar}
    if kind == "sglang":
        return {"ebnf": grammar}
    return {"grammar": grammar}


def vllm_kind(version: str) -> ServerKind:
    """The kind of a vLLM of ``version`` (``0.10.1`` -> ``vllm-legacy``); a version it
    cannot read is taken to be a current one."""
    found = _VERSION_RE.match(version.strip())
    if found is None:
        return "vllm"
    major, minor = int(found.group(1)), int(found.group(2))
    return "vllm" if (major, minor) >= _VLLM_STRUCTURED else "vllm-legacy"


@dataclass(frozen=True)
class ServerIdentity:
    """What :func:`identify_server` found: ``kind`` (``None``: none of the servers it
    knows) and ``described``, the server as messages name it (``vLLM 0.12.0``)."""

    kind: ServerKind | None
    described: str
    #: Whether anything answered (an unreachable server is asked again next time).
    reached: bool = True


# What each server root answered, for the life of the process: a server does not
# change kind under one address within a run.
_IDENTIFIED: dict[str, ServerIdentity] = {}


def clear_identified() -> None:
    """Forget every server identified so far (the next call asks again)."""
    _IDENTIFIED.clear()


def server_root(api_base: str) -> str:
    """The address the probes go to: ``api_base`` without its ``/v1``."""
    root = api_base.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


async def identify_server(
    api_base: str, *, api_key: str | None = None, timeout_s: float = _PROBE_TIMEOUT_S
) -> ServerIdentity:
    """Which server answers at ``api_base``, asked once per address (then remembered).

    ``GET /props`` answered with llama-server's fields is llama.cpp; ``GET
    /server_info`` (or ``/get_server_info``) with SGLang's server arguments is SGLang;
    ``GET /version`` with a version is vLLM.  A server that answers none of them is
    ``kind None``; one that could not be reached at all is not remembered (the call
    itself will say why).
    """
    root = server_root(api_base)
    known = _IDENTIFIED.get(root)
    if known is not None:
        return known
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    paths = ("/props", "/server_info", "/get_server_info", "/version")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        answers = await asyncio.gather(*(_get_json(session, root + path) for path in paths))
    props, info, old_info, version = answers
    identity = _identity(props, info if info is not None else old_info, version)
    if identity is not None:
        _IDENTIFIED[root] = identity
        return identity
    if all(answer is _UNREACHABLE for answer in answers):
        return ServerIdentity(None, "a server that did not answer", reached=False)
    unknown = ServerIdentity(None, "a server that is not vLLM, SGLang or llama-server")
    _IDENTIFIED[root] = unknown
    return unknown


_UNREACHABLE: Any = object()


async def _get_json(session: Any, url: str) -> Any:
    """The JSON object ``GET url`` answers with; ``None`` for any other answer, and
    :data:`_UNREACHABLE` when nothing answered."""
    import aiohttp

    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return None
            data = json.loads(await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return _UNREACHABLE
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _identity(props: Any, info: Any, version: Any) -> ServerIdentity | None:
    if isinstance(props, dict) and (
        "default_generation_settings" in props or "build_info" in props
    ):
        build = props.get("build_info")
        return ServerIdentity("llama.cpp", f"llama-server {build}" if build else "llama-server")
    if (
        isinstance(info, dict)
        and isinstance(info.get("version"), str)
        and ({"tp_size", "grammar_backend", "model_path"} & info.keys())
    ):
        return ServerIdentity("sglang", f"SGLang {info['version']}")
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        number = version["version"]
        return ServerIdentity(vllm_kind(number), f"vLLM {number}")
    return None


def carries_grammar(target: Worker, support: GrammarSupport) -> bool:
    """Whether a call to ``target``, by a client of ``support``, is constrained by the
    request's grammar at all (its decoder, or a server it sends the grammar to)."""
    if support == "decoder":
        return True
    if support == "none" or not target.api_base or target.structured_outputs == "none":
        return False
    return support == "server" or target.model.startswith(OPENAI_COMPATIBLE_PREFIXES)


class ServerGrammar:
    """How one client sends ``request.grammar`` to its target's server, and checks it.

    ``applies``: the client sends a grammar to this target at all
    (:func:`carries_grammar`: it names an ``api_base`` server, the model is one the
    client sends server fields for, and ``structured_outputs`` is not ``none``).  Call
    :meth:`resolve` before building a request (it asks the server which it is, for
    ``auto``, once), then :meth:`fields` for the body fields and :meth:`check` on the
    reply.
    """

    def __init__(self, target: Worker, support: GrammarSupport) -> None:
        self.target = target
        setting = target.structured_outputs
        # A decoder-side grammar is the client's own business, not a server's field.
        self.applies = support != "decoder" and carries_grammar(target, support)
        self._kind: ServerKind | None = next((k for k in SERVER_KINDS if k == setting), None)
        self._identity: ServerIdentity | None = None
        self._lock: asyncio.Lock | None = None
        self._matchers: dict[str, GbnfMatcher] = {}

    @property
    def kind(self) -> ServerKind:
        """The kind the grammar is sent as (before :meth:`resolve`: the fallback)."""
        return self._kind or _FALLBACK

    async def resolve(self, request: ModelRequest, *, api_key: str | None = None) -> None:
        """Settle which field the grammar goes in (for ``auto``, by asking the server)."""
        if request.grammar is None or not self.applies or self._kind is not None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._kind is not None:
                return
            assert self.target.api_base is not None
            identity = await identify_server(
                self.target.api_base,
                api_key=api_key,
                timeout_s=min(_PROBE_TIMEOUT_S, self.target.timeout_s),
            )
            if not identity.reached:
                # The call itself will say why; the next one asks again.
                return
            self._identity = identity
            if identity.kind is None:
                log.warning(
                    "%s: could not tell which server %s is (it answers none of /version, "
                    "/props and /server_info), so the grammar is sent as %s's %s; set "
                    "structured_outputs (%s) if it is another",
                    target_name(self.target.id),
                    self.target.api_base,
                    SERVERS[_FALLBACK],
                    FIELDS[_FALLBACK],
                    ", ".join(SERVER_KINDS),
                )
            self._kind = identity.kind or _FALLBACK

    def fields(self, request: ModelRequest) -> dict[str, Any]:
        """The body fields that carry ``request.grammar`` (none without one)."""
        if request.grammar is None or not self.applies:
            return {}
        return grammar_fields(self.kind, request.grammar)

    async def check(
        self, raw: RawCompletion, request: ModelRequest, *, api_key: str | None = None
    ) -> None:
        """Raise :class:`GrammarIgnoredError` when ``raw`` is a reply ``request.grammar``
        does not admit (the server ignored the field); a reply cut off at the token
        limit or by a stop string need only be the beginning of one.  When the kind was
        set rather than found, the server is asked which it is for the message."""
        grammar = request.grammar
        if grammar is None or not self.applies:
            return
        matcher = self._matchers.get(grammar)
        if matcher is None:
            if len(self._matchers) > 16:
                self._matchers.clear()
            matcher = self._matchers[grammar] = GbnfMatcher(grammar)
        try:
            text = openai_content(raw.raw)
        except (LookupError, TypeError, ValueError, AttributeError):
            text = raw.text
        found = matcher.match(text)
        cut_short = raw.truncated or bool(
            request.params.get("stop") or request.params.get("stop_token_ids")
        )
        if found.complete or (found.viable and cut_short):
            return
        if self._identity is None and self.target.api_base:
            self._identity = await identify_server(
                self.target.api_base,
                api_key=api_key,
                timeout_s=min(_PROBE_TIMEOUT_S, self.target.timeout_s),
            )
        raise self._ignored(text, found.offset)

    def _ignored(self, text: str, offset: int | None) -> GrammarIgnoredError:
        kind, identity = self.kind, self._identity
        field = FIELDS[kind]
        setting = (
            "conductor.structured_outputs"
            if self.target.id == "conductor"
            else f"structured_outputs of worker {self.target.id!r}"
        )
        if offset is None:
            where = f"it ended before the grammar did: ...{text[-40:]!r}"
        else:
            where = f"it leaves the grammar at character {offset}: {text[offset : offset + 40]!r}"
        found = identity.kind if identity is not None else None
        if self.target.structured_outputs != "auto":
            why = f"as {setting}: {self.target.structured_outputs} says"
        elif found is None:
            why = "the guess for a server that answers none of /version, /props, /server_info"
        else:
            why = f"the field {SERVERS[found]} reads"
        described = f" ({identity.described})" if identity is not None else ""
        shown = f"{self.target.api_base}{described}"
        message = (
            f"the server at {shown} answered a grammar-constrained request with a reply the "
            f"grammar does not admit ({where}): it ignored the grammar, sent as `{field}` "
            f"({why}); "
        )
        if found == kind and identity is not None:
            message += (
                f"{identity.described} reads that field, so something between (a proxy, a "
                f"gateway) may drop it; or set {setting}: none to send no grammar"
            )
        else:
            candidates = [found] if found is not None else [k for k in SERVER_KINDS if k != kind]
            choices = ", ".join(f"{k} ({SERVERS[k]}: {FIELDS[k]})" for k in candidates)
            message += f"set {setting} to {choices}; or to none to send no grammar"
        server = identity.described if identity is not None and found else SERVERS[kind]
        return GrammarIgnoredError(message, target=self.target.id, field=field, server=server)
