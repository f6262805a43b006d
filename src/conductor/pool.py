"""Pool files: the workers a Conductor may use, and an optional default Conductor.

The types here are the in-memory form of ``pools/*.yaml`` (see DESIGN.md).  The
order of ``Pool.workers`` is the order the Conductor sees ("Model 0", "Model 1", ...).
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from .errors import PoolError

__all__ = [
    "CLIENT_KINDS",
    "CONDUCTOR_BACKENDS",
    "ClientKind",
    "ConductorBackend",
    "ConductorConfig",
    "Pool",
    "Price",
    "REASONING_MODES",
    "ReasoningMode",
    "Worker",
    "WorkerContext",
    "builtin_pools_dir",
    "compose_yaml",
    "list_builtin_pools",
    "load_pool",
    "load_pool_text",
    "pool_to_public_dict",
    "read_config_file",
    "resolve_pool_path",
]

ClientKind = Literal["litellm", "openai", "http", "anthropic", "google", "local"]
CLIENT_KINDS: tuple[str, ...] = ("litellm", "openai", "http", "anthropic", "google", "local")
ConductorBackend = Literal["endpoint", "checkpoint", "prompted", "local"]
CONDUCTOR_BACKENDS: tuple[str, ...] = ("endpoint", "checkpoint", "prompted", "local")
ReasoningMode = Literal["strip", "keep"]
REASONING_MODES: tuple[str, ...] = ("strip", "keep")
MessageForm = Literal["full", "brief"]
MESSAGE_FORMS: tuple[str, ...] = ("full", "brief")


@dataclass(frozen=True)
class Price:
    """USD per million tokens; overrides litellm's price table for one worker."""

    input_per_mtok: float
    output_per_mtok: float


@dataclass(frozen=True)
class WorkerContext:
    """What a worker's request carries besides the task and its subtask (``context:``).

    ``prefill`` is text the worker's reply begins with: sent as a final assistant
    message for the model to continue, where the provider can (see
    :mod:`conductor.llm.prefill`), and left out with a warning where it cannot.
    ``reasoning`` says whether the earlier answers this worker sees keep their reasoning
    blocks (``keep``) or have them removed (``strip``, the default).  ``message`` is the
    form of the request: ``full`` (the paper's: a preamble about the team, the task, the
    earlier steps in tags, the subtask) or ``brief`` (the task, the earlier answers it
    may see, one line with the subtask: for small models, which echo a long preamble
    instead of answering).
    """

    prefill: str | None = None
    reasoning: ReasoningMode = "strip"
    message: MessageForm = "full"


@dataclass(frozen=True)
class Worker:
    """One model the Conductor can assign steps to (or the Conductor's own model).

    ``params`` is everything sent to the provider as sampling or pass-through
    parameters: the pool defaults' ``temperature`` and ``max_tokens`` merged with the
    worker's own ``params`` (the worker wins).  ``api_key_env`` names the environment
    variable holding the key; the key itself is read only when a call is made and is
    never stored in a record, the cache or a log.
    """

    id: str
    model: str
    client: ClientKind = "litellm"
    api_base: str | None = None
    api_key_env: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    price: Price | None = None
    max_concurrency: int = 16
    timeout_s: float = 600.0
    max_retries: int = 6
    # The most one call may take across its attempts and back-off waits (never less
    # than one timeout_s): a silent server fails the call in minutes, not an hour.
    total_timeout_s: float = 900.0
    description: str | None = None
    system_prompt: str | None = None
    # client: local only (llama.cpp).
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    # The pool's context: section with this worker's own context: keys over it.
    context: WorkerContext = field(default_factory=WorkerContext)


@dataclass(frozen=True)
class ConductorConfig:
    """Where workflows come from.

    ``backend``: ``endpoint`` (an OpenAI-compatible server, e.g. vLLM serving a trained
    checkpoint), ``prompted`` (a pool worker id or a litellm model acting as Conductor),
    ``local`` (the embedded llama.cpp model) or ``checkpoint`` (a model directory or
    ``hf:ORG/NAME`` loaded in-process).  ``template`` is a built-in template name or a
    path to a template file (``.txt``: one user message; ``.yaml``: a conversation with
    an optional reply prefill).  ``constrained`` asks for grammar / guided decoding where
    the backend supports it.  ``temperature``, ``max_tokens`` and ``top_p`` are the
    Conductor's sampling settings (``None``: the server's default, or a checkpoint's
    ``conductor.json``); a key of the same name in ``params`` wins.
    """

    backend: ConductorBackend = "prompted"
    model: str | None = None
    client: ClientKind = "openai"
    api_base: str | None = None
    api_key_env: str | None = None
    template: str = "default"
    params: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 5
    parse_retries: int = 5
    show_descriptions: bool = False
    constrained: bool = False
    max_concurrency: int = 64
    max_reasoning_chars: int = 600
    min_subtask_chars: int = 1
    max_subtask_chars: int = 300
    subtasks: tuple[str, ...] = ()
    timeout_s: float = 600.0
    total_timeout_s: float = 900.0
    max_retries: int = 6
    price: Price | None = None
    model_path: str | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None


@dataclass(frozen=True)
class Pool:
    """A validated pool file."""

    name: str
    workers: tuple[Worker, ...]
    description: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    conductor: ConductorConfig | None = None
    path: Path | None = None
    # The pool-wide context: section (each worker's own is already merged into it).
    context: WorkerContext = field(default_factory=WorkerContext)

    def worker(self, worker_id: str) -> Worker:
        """The worker named ``worker_id``; raises ``KeyError`` if there is none."""
        for w in self.workers:
            if w.id == worker_id:
                return w
        raise KeyError(worker_id)


# --------------------------------------------------------------------------- loading

# Field names, in the order the error messages list them.
_TOP_KEYS = ("name", "description", "defaults", "context", "workers", "conductor")
_DEFAULT_KEYS = (
    "temperature",
    "max_tokens",
    "top_p",
    "timeout_s",
    "max_retries",
    "max_concurrency",
    "total_timeout_s",
)
_WORKER_KEYS = (
    "id",
    "model",
    "client",
    "api_base",
    "api_key_env",
    "params",
    "price",
    "max_concurrency",
    "timeout_s",
    "max_retries",
    "total_timeout_s",
    "temperature",
    "max_tokens",
    "top_p",
    "description",
    "system_prompt",
    "model_path",
    "n_ctx",
    "n_threads",
    "n_gpu_layers",
    "context",
)
_CONTEXT_KEYS = tuple(f.name for f in fields(WorkerContext))
_CONDUCTOR_KEYS = tuple(f.name for f in fields(ConductorConfig))
_PRICE_KEYS = ("input_per_mtok", "output_per_mtok")
# Sampling settings that live in Worker.params rather than in their own fields.
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p")
_LOCAL_ONLY_KEYS = ("model_path", "n_ctx", "n_threads", "n_gpu_layers")
_LOCAL_DEFAULT_MODEL = "smollm2"

_VAR_RE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Prefixes of real provider keys (OpenAI, Anthropic, Google, Groq, xAI, Hugging Face,
# GitHub, Replicate, Perplexity): a value starting with one is a key, not a name.
_KEY_PREFIXES = ("sk-", "sk_", "AIza", "gsk_", "xai-", "hf_", "ghp_", "github_pat_", "r8_", "pplx-")
_SECRET_QUERY_KEYS = frozenset(
    {"key", "api_key", "apikey", "api-key", "token", "access_token", "auth", "secret", "password"}
)
# Param keys whose values are credentials (e.g. extra_headers: {Authorization: ...}).
# Matched on whole words so that max_tokens or budget_tokens are kept.
_SECRET_PARAM_NAMES = frozenset(
    {"authorization", "cookie", "password", "secret", "token", "key", "apikey", "bearer"}
)
_SECRET_PARAM_SUFFIXES = ("_key", "_token", "_secret", "_password", "apikey")
_REDACTED = "***"
#: How deeply collections may nest in a pool, benchmark or training file; the readers
#: recurse, and no real file comes near this.
MAX_YAML_DEPTH = 64


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _show(value: Any) -> str:
    """How a bad value is quoted in an error message."""
    if isinstance(value, (yaml.SequenceNode, list)):
        return "a list"
    if isinstance(value, (yaml.MappingNode, dict)):
        return "a mapping"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _key_list(keys: tuple[str, ...]) -> str:
    return ", ".join(keys)


class _Reader:
    """Walks a composed YAML tree, checking each value and expanding ``${VAR}``.

    Working on nodes rather than on ``yaml.safe_load``'s output is what lets every
    error name the line it is about.
    """

    def __init__(self, source: str, environ: Mapping[str, str]) -> None:
        self.source = source
        self.environ = environ
        # Used only to build scalars and to resolve plain scalars after expansion.
        self.loader = yaml.SafeLoader("")
        self.flattened: dict[int, list[tuple[str, yaml.Node, yaml.Node]]] = {}

    def close(self) -> None:
        self.loader.dispose()

    #: The class of the errors this reader raises (a subclass per kind of file).
    error_class: type[PoolError] = PoolError

    def error(self, message: str, node: yaml.Node | None, field: str | None) -> PoolError:
        return self.error_class(
            message,
            path=self.source,
            line=_line(node) if node is not None else 1,
            field=field,
        )

    def document(
        self,
        root: yaml.Node | None,
        top_keys: tuple[str, ...],
        *,
        empty: str,
        shape: str = "a mapping",
        required: tuple[str, ...] = (),
    ) -> dict[str, yaml.Node]:
        """The top-level mapping of a file, key -> value node, with its keys checked:
        ``empty`` is the sentence for an empty file, ``shape`` what the top level must be."""
        if root is None:
            raise self.error(empty, None, None)
        if not isinstance(root, yaml.MappingNode):
            raise self.error(
                f"the top level must be {shape}, got {_show(self.value(root, 'top level'))}",
                root,
                None,
            )
        keys = self.mapping(root, "", top_keys)
        get = {k: vn for k, (_kn, vn) in keys.items()}
        for key in required:
            if key not in get:
                raise self.error(f'missing required key "{key}"', root, key)
        return get

    # ---------------------------------------------------------------- raw values

    def expand(self, text: str, node: yaml.Node, field: str) -> str:
        """Replace ``${NAME}`` and ``${NAME:-default}`` in ``text``."""
        if "${" not in text:
            return text

        def substitute(match: re.Match[str]) -> str:
            inner = match.group(1)
            name, has_default, default = inner.partition(":-")
            if not _ENV_NAME_RE.match(name):
                raise self.error(
                    f'{field} has a malformed variable reference "${{{inner}}}"; '
                    "write ${NAME} or ${NAME:-default}",
                    node,
                    field,
                )
            value = self.environ.get(name)
            if has_default:
                # Shell semantics: an empty variable also takes the default.
                return value if value else default
            if value is None:
                raise self.error(
                    f"{field} uses ${{{name}}} but the environment variable {name} is not set "
                    f"(set it, or give a default with ${{{name}:-default}})",
                    node,
                    field,
                )
            return value

        if text.count("${") != len(_VAR_RE.findall(text)):
            raise self.error(
                f'{field} has an unclosed or nested variable reference in "{text}"; '
                "write ${NAME} or ${NAME:-default}",
                node,
                field,
            )
        return _VAR_RE.sub(substitute, text)

    def scalar(self, node: yaml.ScalarNode, field: str) -> Any:
        """The Python value of a scalar, after variable expansion."""
        value = self.construct(node, field)
        if isinstance(value, str) and "${" in value:
            expanded = self.expand(value, node, field)
            if node.style is None:
                # A plain (unquoted) scalar is typed by what it expands to, so that
                # `max_tokens: ${MAX_TOKENS:-4096}` gives an int and `${URL:-}` gives null.
                tag = self.loader.resolve(  # type: ignore[no-untyped-call, unused-ignore]
                    yaml.ScalarNode, expanded, (True, False)
                )
                return self.construct(yaml.ScalarNode(tag, expanded), field, node)
            return expanded
        return value

    def construct(self, node: yaml.ScalarNode, field: str, where: yaml.Node | None = None) -> Any:
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self.error(
                f"{field} has an invalid value: {exc.problem}", where or node, field
            ) from None
        if isinstance(value, (datetime.date, datetime.datetime)):
            # Keep params JSON-ready for records and cache keys.
            return value.isoformat()
        if isinstance(value, bytes):
            raise self.error(f"{field} must not be binary data", where or node, field)
        return value

    def plain(self, node: yaml.Node, field: str) -> Any:
        """Any value as plain Python (used for pass-through ``params``)."""
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, field)
        if isinstance(node, yaml.SequenceNode):
            return [self.plain(item, f"{field}[{i}]") for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.MappingNode)  # the only other kind of node
        out: dict[str, Any] = {}
        for key, _key_node, value_node in self.items(node, field):
            out[key] = self.plain(value_node, f"{field}.{key}")
        return out

    def items(self, node: yaml.MappingNode, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The (key, key node, value node) triples of a mapping; keys must be unique strings."""
        if id(node) in self.flattened:
            # An alias met again: already checked, and flattening changed its keys.
            return self.flattened[id(node)]
        seen: dict[str, yaml.Node] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.key_text(key_node, field)
            if key in seen:
                raise self.error(
                    f'{field or "top level"}: key "{key}" appears twice '
                    f"(lines {_line(seen[key])} and {_line(key_node)})",
                    key_node,
                    f"{field}.{key}" if field else key,
                )
            seen[key] = key_node
        try:
            # Applies YAML merge keys (`<<: *defaults`); explicit keys come after, so win.
            self.loader.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            raise self.error(
                f"{field or 'top level'} has a bad merge key: {exc.problem}", node, field
            ) from None
        result: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            result[self.key_text(key_node, field)] = (key_node, value_node)
        triples = [(k, kn, vn) for k, (kn, vn) in result.items()]
        self.flattened[id(node)] = triples
        return triples

    def key_text(self, key_node: yaml.Node, field: str) -> str:
        shown: Any = key_node
        if isinstance(key_node, yaml.ScalarNode):
            shown = self.construct(key_node, field)
            if isinstance(shown, str):
                return shown
        raise self.error(
            f"{field or 'top level'} has a key that is not a string: {_show(shown)}",
            key_node,
            field,
        )

    def mapping(
        self, node: yaml.Node, field: str, allowed: tuple[str, ...], what: str = "a mapping"
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Check ``node`` is a mapping with only ``allowed`` keys; return them by name."""
        if not isinstance(node, yaml.MappingNode):
            shown = self.scalar(node, field) if isinstance(node, yaml.ScalarNode) else node
            raise self.error(f"{field} must be {what}, got {_show(shown)}", node, field)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        where = field or "top level"
        for key, key_node, value_node in self.items(node, field):
            sub = f"{field}.{key}" if field else key
            if key == "api_key":
                raise self.error(
                    f"{where}: do not write an API key in a pool file; put the key in an "
                    "environment variable and name that variable with api_key_env "
                    "(e.g. api_key_env: OPENAI_API_KEY)",
                    key_node,
                    sub,
                )
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = (
                    f' (did you mean "{close[0]}"?)'
                    if close
                    else f"; allowed keys: {_key_list(allowed)}"
                )
                raise self.error(f'{where}: unknown key "{key}"{hint}', key_node, sub)
            out[key] = (key_node, value_node)
        return out

    # ---------------------------------------------------------------- typed values

    def value(self, node: yaml.Node, field: str) -> Any:
        """A scalar value, or the node itself when it is a list or mapping."""
        return self.scalar(node, field) if isinstance(node, yaml.ScalarNode) else node

    def string(self, node: yaml.Node, field: str, *, empty_ok: bool = False) -> str | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(f"{field} must be a string, got {_show(value)}", node, field)
        if not value and not empty_ok:
            return None
        return value

    def required_string(self, node: yaml.Node, field: str) -> str:
        value = self.value(node, field)
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"{field} must be a non-empty string, got {_show(value)}", node, field)
        return value

    def integer(self, node: yaml.Node, field: str, minimum: int) -> int | None:
        value = self.value(node, field)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(f"{field} must be {kind}, got {_show(value)}", node, field)
        return int(value)

    def number(
        self,
        node: yaml.Node,
        field: str,
        *,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        value = self.value(node, field)
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and (value <= 0 if positive else value < 0):
            ok = False
        if ok and maximum is not None and value > maximum:
            ok = False
        if ok and value != value:  # NaN
            ok = False
        if not ok:
            if maximum is not None:
                kind = f"a number between 0 and {maximum:g}"
            elif positive:
                kind = "a positive number"
            else:
                kind = "a number >= 0"
            raise self.error(f"{field} must be {kind}, got {_show(value)}", node, field)
        return float(value)

    def boolean(self, node: yaml.Node, field: str) -> bool | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(f"{field} must be true or false, got {_show(value)}", node, field)
        return value

    def choice(self, node: yaml.Node, field: str, allowed: tuple[str, ...]) -> str | None:
        value = self.value(node, field)
        if value is None:
            return None
        if not isinstance(value, str) or value not in allowed:
            hint = ""
            if isinstance(value, str):
                close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
                if close:
                    hint = f' (did you mean "{close[0]}"?)'
            raise self.error(
                f"{field} must be one of {_key_list(allowed)}; got {_show(value)}{hint}",
                node,
                field,
            )
        return value

    def url(self, node: yaml.Node, field: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None  # an empty string after expansion means "not set"
        value = value.strip()
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # The value may hold credentials from the environment: do not echo them.
            shown = _redact_url(value) if ("@" in value or "?" in value) else value
            raise self.error(
                f"{field} must be an http(s) URL such as http://localhost:8000/v1, "
                f"got {_show(shown)}",
                node,
                field,
            )
        return value

    def env_name(self, node: yaml.Node, field: str) -> str | None:
        value = self.string(node, field)
        if value is None:
            return None
        if _looks_like_key(value):
            raise self.error(
                f"{field} must name an environment variable (e.g. OPENAI_API_KEY), but its "
                "value looks like an API key itself; put the key in that variable instead",
                node,
                field,
            )
        if not _ENV_NAME_RE.match(value):
            raise self.error(
                f"{field} must be an environment variable name such as OPENAI_API_KEY, "
                f"got {_show(value)}",
                node,
                field,
            )
        return value

    def params(self, node: yaml.Node, field: str) -> dict[str, Any]:
        value = self.value(node, field)
        if value is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{field} must be a mapping, got {_show(value)}", node, field)
        result = self.plain(node, field)
        assert isinstance(result, dict)
        return result

    def price(self, node: yaml.Node, field: str) -> Price | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
            return None
        keys = self.mapping(
            node, field, _PRICE_KEYS, what="a mapping with input_per_mtok and output_per_mtok"
        )
        values: dict[str, float] = {}
        for key in _PRICE_KEYS:
            if key not in keys:
                raise self.error(f'{field} is missing required key "{key}"', node, f"{field}.{key}")
            number = self.number(keys[key][1], f"{field}.{key}")
            if number is None:
                raise self.error(
                    f"{field}.{key} must be a number >= 0, got nothing (null)",
                    keys[key][1],
                    f"{field}.{key}",
                )
            values[key] = float(number)
        return Price(**values)

    # ---------------------------------------------------------------- sections

    def defaults(self, node: yaml.Node) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, "defaults") is None:
            return {}
        keys = self.mapping(node, "defaults", _DEFAULT_KEYS)
        out: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            value = self.common_setting(key, vn, f"defaults.{key}")
            if value is not None:
                out[key] = value
        return out

    def common_setting(self, key: str, node: yaml.Node, field: str) -> Any:
        """The settings shared by ``defaults`` and workers."""
        if key == "temperature":
            return self.number(node, field)
        if key == "top_p":
            return self.number(node, field, maximum=1.0)
        if key in ("timeout_s", "total_timeout_s"):
            return self.number(node, field, positive=True)
        if key in ("max_tokens", "max_concurrency"):
            return self.integer(node, field, 1)
        if key == "max_retries":
            return self.integer(node, field, 0)
        raise AssertionError(key)  # pragma: no cover

    def subtask_choices(self, node: yaml.Node, field: str) -> tuple[str, ...] | None:
        """``conductor.subtasks``: the instructions a constrained Conductor chooses from."""
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
            return None
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(
                f"{field} must be a list of one or more instructions, e.g. "
                '["Answer the question.", "Check the answers above."]',
                node,
                field,
            )
        choices: list[str] = []
        for i, item in enumerate(node.value):
            sub = f"{field}[{i}]"
            text = self.required_string(item, sub).strip()
            # Each one is written inside a double-quoted string of the workflow's lists.
            bad = next((c for c in text if c in '"\\' or c < " "), None)
            if bad is not None:
                raise self.error(
                    f"{sub} may not hold a double quote, a backslash or a line break "
                    f"(found {bad!r}); write the instruction on one line without them",
                    item,
                    sub,
                )
            if text in choices:
                raise self.error(f"{sub} repeats {_show(text)}", item, sub)
            choices.append(text)
        return tuple(choices)

    def context(self, node: yaml.Node, field: str, base: WorkerContext) -> WorkerContext:
        """A ``context:`` section; the keys it sets replace those of ``base``."""
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
            return base
        keys = self.mapping(node, field, _CONTEXT_KEYS)
        result = base
        for key, (_kn, vn) in keys.items():
            sub = f"{field}.{key}"
            if key == "prefill":
                text = self.string(vn, sub, empty_ok=True)
                if text is not None and text and not text.strip():
                    raise self.error(
                        f"{sub} is only whitespace; write the text the reply should begin "
                        'with, or "" for no prefill',
                        vn,
                        sub,
                    )
                # null or "" turns off a prefill the pool's context: sets.
                result = replace(result, prefill=text or None)
            elif key == "reasoning":
                mode = self.choice(vn, sub, REASONING_MODES)
                if mode is not None:
                    result = replace(result, reasoning=cast(ReasoningMode, mode))
            elif key == "message":
                form = self.choice(vn, sub, MESSAGE_FORMS)
                if form is not None:
                    result = replace(result, message=cast(MessageForm, form))
            else:  # pragma: no cover - _CONTEXT_KEYS and this chain agree
                raise AssertionError(key)
        return result

    def worker(
        self,
        node: yaml.Node,
        index: int,
        defaults: dict[str, Any],
        context: WorkerContext | None = None,
    ) -> Worker:
        field = f"workers[{index}]"
        keys = self.mapping(node, field, _WORKER_KEYS, what="a mapping with at least id and model")
        get: dict[str, yaml.Node] = {k: vn for k, (_kn, vn) in keys.items()}

        if "id" not in get:
            raise self.error(f'{field} is missing required key "id"', node, f"{field}.id")
        worker_id = self.required_string(get["id"], f"{field}.id").strip()
        if any(ch.isspace() for ch in worker_id):
            raise self.error(
                f"{field}.id must not contain spaces, got {_show(worker_id)}",
                get["id"],
                f"{field}.id",
            )

        client = "litellm"
        if "client" in get:
            client = self.choice(get["client"], f"{field}.client", CLIENT_KINDS) or "litellm"

        if "model" in get:
            model = self.required_string(get["model"], f"{field}.model").strip()
        elif client == "local":
            model = _LOCAL_DEFAULT_MODEL
        else:
            raise self.error(
                f'{field} (id "{worker_id}") is missing required key "model"',
                node,
                f"{field}.model",
            )

        if client != "local":
            for key in _LOCAL_ONLY_KEYS:
                if key in get:
                    raise self.error(
                        f"{field}.{key} applies only to client: local, but this worker's "
                        f"client is {client}",
                        keys[key][0],
                        f"{field}.{key}",
                    )

        kwargs: dict[str, Any] = {
            "id": worker_id,
            "model": model,
            "client": client,
            "context": context or WorkerContext(),
        }
        sampling = {k: defaults[k] for k in _SAMPLING_KEYS if k in defaults}
        for key in ("timeout_s", "max_retries", "max_concurrency", "total_timeout_s"):
            if key in defaults:
                kwargs[key] = defaults[key]
        own_params: dict[str, Any] = {}

        for key, vn in get.items():
            sub = f"{field}.{key}"
            if key in ("id", "model", "client"):
                continue
            if key in _SAMPLING_KEYS:
                value = self.common_setting(key, vn, sub)
                if value is not None:
                    sampling[key] = value
            elif key in ("timeout_s", "max_retries", "max_concurrency", "total_timeout_s"):
                value = self.common_setting(key, vn, sub)
                if value is not None:
                    kwargs[key] = value
            elif key == "api_base":
                kwargs[key] = self.url(vn, sub)
            elif key == "api_key_env":
                kwargs[key] = self.env_name(vn, sub)
            elif key == "params":
                own_params = self.params(vn, sub)
            elif key == "price":
                kwargs[key] = self.price(vn, sub)
            elif key in ("description", "system_prompt", "model_path"):
                kwargs[key] = self.string(vn, sub)
            elif key in ("n_ctx", "n_threads"):
                kwargs[key] = self.integer(vn, sub, 1)
            elif key == "n_gpu_layers":
                # llama.cpp reads -1 as "all layers".
                kwargs[key] = self.integer(vn, sub, -1)
            elif key == "context":
                kwargs[key] = self.context(vn, sub, kwargs["context"])
            else:  # pragma: no cover - _WORKER_KEYS and this chain agree
                raise AssertionError(key)

        for key in ("timeout_s", "total_timeout_s"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        kwargs["params"] = {**sampling, **own_params}
        return Worker(**kwargs)

    def workers(
        self,
        node: yaml.Node | None,
        top: yaml.Node | None,
        defaults: dict[str, Any],
        context: WorkerContext | None = None,
    ) -> tuple[Worker, ...]:
        if node is None:
            raise self.error('the pool is missing required key "workers"', top, "workers")
        value = self.value(node, "workers")
        if value is None or (isinstance(node, yaml.SequenceNode) and not node.value):
            raise self.error("workers must list at least one worker", node, "workers")
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(
                f"workers must be a list of workers, got {_show(value)}", node, "workers"
            )
        result: list[Worker] = []
        first_line: dict[str, tuple[int, int]] = {}
        for index, item in enumerate(node.value):
            worker = self.worker(item, index, defaults, context)
            if worker.id in first_line:
                other, other_line = first_line[worker.id]
                raise self.error(
                    f'workers[{index}].id: duplicate worker id "{worker.id}" on lines '
                    f"{other_line} and {_line(item)} (workers[{other}] and workers[{index}])",
                    item,
                    f"workers[{index}].id",
                )
            first_line[worker.id] = (index, _line(item))
            result.append(worker)
        return tuple(result)

    def conductor(self, node: yaml.Node) -> ConductorConfig | None:
        field = "conductor"
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
            return None
        keys = self.mapping(node, field, _CONDUCTOR_KEYS)
        kwargs: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            sub = f"{field}.{key}"
            value: Any
            if key == "backend":
                value = self.choice(vn, sub, CONDUCTOR_BACKENDS)
            elif key == "client":
                value = self.choice(vn, sub, CLIENT_KINDS)
            elif key == "api_base":
                value = self.url(vn, sub)
            elif key == "api_key_env":
                value = self.env_name(vn, sub)
            elif key == "params":
                value = self.params(vn, sub)
            elif key == "price":
                value = self.price(vn, sub)
            elif key in _SAMPLING_KEYS:
                value = self.common_setting(key, vn, sub)
            elif key in ("model", "template", "model_path"):
                value = self.string(vn, sub)
                value = value.strip() if value else None
            elif key in ("max_steps", "n_ctx", "n_threads", "max_concurrency"):
                value = self.integer(vn, sub, 1)
            elif key in ("parse_retries", "max_retries", "max_reasoning_chars"):
                value = self.integer(vn, sub, 0)
            elif key in ("min_subtask_chars", "max_subtask_chars"):
                value = self.integer(vn, sub, 1)
            elif key == "n_gpu_layers":
                value = self.integer(vn, sub, -1)
            elif key in ("show_descriptions", "constrained"):
                value = self.boolean(vn, sub)
            elif key in ("timeout_s", "total_timeout_s"):
                value = self.number(vn, sub, positive=True)
                value = float(value) if value is not None else None
            elif key == "subtasks":
                value = self.subtask_choices(vn, sub)
            else:  # pragma: no cover
                raise AssertionError(key)
            if value is not None:
                kwargs[key] = value
        config = ConductorConfig(**kwargs)
        if config.subtasks and not config.constrained:
            raise self.error(
                "conductor.subtasks needs constrained: true: the grammar is what keeps the "
                "Conductor to those instructions (add constrained: true, or remove subtasks)",
                keys["subtasks"][1],
                "conductor.subtasks",
            )
        if config.backend == "endpoint" and config.api_base is None:
            raise self.error(
                "conductor.api_base is required when conductor.backend is endpoint "
                "(e.g. api_base: http://localhost:8001/v1)",
                node,
                "conductor.api_base",
            )
        if config.backend in ("prompted", "checkpoint") and config.model is None:
            needs = (
                "a worker id or a litellm model"
                if config.backend == "prompted"
                else "a model directory or hf:ORG/NAME"
            )
            raise self.error(
                f"conductor.model is required when conductor.backend is {config.backend} ({needs})",
                node,
                "conductor.model",
            )
        return config

    def pool(self, root: yaml.Node | None, default_name: str, path: Path | None) -> Pool:
        get = self.document(
            root,
            _TOP_KEYS,
            empty="the pool file is empty; it needs at least a workers list",
            shape="a mapping with a workers list",
        )
        name = default_name
        if "name" in get:
            name = self.required_string(get["name"], "name").strip()
        description = (
            self.string(get["description"], "description") if "description" in get else None
        )
        defaults = self.defaults(get["defaults"]) if "defaults" in get else {}
        context = (
            self.context(get["context"], "context", WorkerContext())
            if "context" in get
            else WorkerContext()
        )
        workers = self.workers(get.get("workers"), root, defaults, context)
        conductor = self.conductor(get["conductor"]) if "conductor" in get else None
        return Pool(
            name=name,
            workers=workers,
            description=description,
            defaults=defaults,
            conductor=conductor,
            path=path,
            context=context,
        )


def _looks_like_key(value: str) -> bool:
    """Whether an ``api_key_env`` value is probably a secret rather than a variable name."""
    if value.startswith(_KEY_PREFIXES):
        return True
    if not _ENV_NAME_RE.match(value):
        return len(value) >= 20
    # A long mixed-case identifier with digits reads like a token, not like FOO_API_KEY.
    return (
        len(value) >= 32
        and any(c.islower() for c in value)
        and any(c.isupper() for c in value)
        and any(c.isdigit() for c in value)
    )


def read_config_file(path: Path, what: str, error_class: type[PoolError] = PoolError) -> str:
    """The text of a YAML file the user named; each way reading fails is one sentence
    (``what`` names the kind of file, e.g. ``"pool file"``)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error_class(f"no such {what}", path=str(path)) from None
    except IsADirectoryError:
        raise error_class(f"is a directory, not a {what}", path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise error_class(f"is not UTF-8 text ({exc.reason})", path=str(path)) from None
    except OSError as exc:
        raise error_class(f"cannot be read: {exc.strerror}", path=str(path)) from None


def compose_yaml(
    text: str, source: str, error_class: type[PoolError] = PoolError
) -> yaml.Node | None:
    """The YAML node tree of ``text`` (nodes keep their line numbers for messages)."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # PyYAML splits its message as "while doing X" (context), "found Y" (problem).
        problem = exc.problem or "could not be parsed"
        context = f"{exc.context}, " if exc.context else ""
        raise error_class(
            f"invalid YAML: {context}{problem}",
            path=source,
            line=(mark.line + 1) if mark is not None else None,
        ) from None
    except yaml.YAMLError as exc:
        raise error_class(f"invalid YAML: {exc}", path=source) from None
    except RecursionError:
        # PyYAML composes nested collections recursively.
        raise error_class(
            f"invalid YAML: collections are nested too deeply (at most {MAX_YAML_DEPTH} "
            "levels are read)",
            path=source,
        ) from None
    _check_depth(node, source, error_class)
    return node


def _check_depth(root: yaml.Node | None, source: str, error_class: type[PoolError]) -> None:
    """Refuse trees deeper than :data:`MAX_YAML_DEPTH` before any recursive reader sees
    them (an explicit stack: the check itself must not recurse)."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)] if root is not None else []
    # Deepest level each node was walked at: an alias reached deeper is walked again.
    seen: dict[int, int] = {}
    while stack:
        node, depth = stack.pop()
        if depth > MAX_YAML_DEPTH:
            raise error_class(
                f"invalid YAML: collections are nested more than {MAX_YAML_DEPTH} levels deep",
                path=source,
                line=_line(node),
            )
        if seen.get(id(node), 0) >= depth:
            continue
        seen[id(node)] = depth
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))


def load_pool_text(
    text: str,
    *,
    source: str = "<string>",
    environ: Mapping[str, str] | None = None,
    path: Path | None = None,
) -> Pool:
    """Parse and validate pool YAML held in a string.

    ``source`` is the name errors start with (``FILE:LINE: ...``); ``environ`` is where
    ``${VAR}`` references are looked up (default: ``os.environ``).  The pool's ``name``
    defaults to the stem of ``source``.  Raises :class:`PoolError` on any mistake.
    """
    env = os.environ if environ is None else environ
    root = compose_yaml(text, source)
    default_name = "pool" if source.startswith("<") else Path(source).stem
    reader = _Reader(source, env)
    try:
        return reader.pool(root, default_name, path)
    finally:
        reader.close()


def load_pool(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Pool:
    """Read and validate the pool file at ``path`` (see :func:`load_pool_text`)."""
    file = Path(path)
    text = read_config_file(file, "pool file")
    return load_pool_text(text, source=str(path), environ=environ, path=file)


# --------------------------------------------------------------------------- public form


def _redact_url(url: str) -> str:
    """``url`` with credentials and key-like query parameters replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{_REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, _REDACTED if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs],
            safe="*",
        )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_secret_name(name: str) -> bool:
    norm = name.lower().replace("-", "_")
    return norm in _SECRET_PARAM_NAMES or norm.endswith(_SECRET_PARAM_SUFFIXES)


def _redact_params(value: Any) -> Any:
    """Params with values under secret-sounding keys (headers, tokens) replaced."""
    if isinstance(value, dict):
        return {
            k: (
                _REDACTED
                if _is_secret_name(str(k)) and not isinstance(v, (dict, list))
                else _redact_params(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact_params(v) for v in value]
    return value


def _public(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Price):
            value = {
                "input_per_mtok": value.input_per_mtok,
                "output_per_mtok": value.output_per_mtok,
            }
        elif f.name == "api_base" and value is not None:
            value = _redact_url(value)
        elif f.name == "params":
            value = _redact_params(value)
        elif isinstance(value, WorkerContext):
            value = _public(value)
        elif (f.name == "message" and value == "full") or (f.name == "subtasks" and not value):
            # Defaults of settings added later are left out, so that the records (and
            # the keys bench resume and the sample cache compare) of pools written
            # before them read the same.
            continue
        elif isinstance(value, tuple):
            value = list(value)  # as JSON reads it back
        out[f.name] = value
    return out


def pool_to_public_dict(pool: Pool) -> dict[str, Any]:
    """A JSON-ready description of ``pool`` for run records, with no secrets.

    ``api_key_env`` is kept (it is a variable name); credentials and key-like query
    parameters in URLs, and params under secret-sounding keys, become ``***``.
    """
    return {
        "name": pool.name,
        "description": pool.description,
        "path": str(pool.path) if pool.path is not None else None,
        "defaults": dict(pool.defaults),
        "context": _public(pool.context),
        "workers": [_public(w) for w in pool.workers],
        "conductor": _public(pool.conductor) if pool.conductor is not None else None,
    }


# --------------------------------------------------------------------------- shipped pools


def builtin_pools_dir() -> Path:
    """The folder of shipped pool files.

    Installed, it is ``conductor/pools`` (a symlink to the repository's ``pools/`` in a
    checkout); otherwise the repository's top-level ``pools/``.
    """
    here = Path(__file__).resolve().parent
    packaged = here / "pools"
    if packaged.is_dir():
        return packaged
    return here.parent.parent / "pools"


def list_builtin_pools() -> list[Path]:
    """The shipped pool files, sorted by name."""
    folder = builtin_pools_dir()
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def resolve_pool_path(name_or_path: str) -> Path:
    """An existing pool file path, or the shipped pool called ``name_or_path``.

    ``"frontier"`` (or ``"frontier.yaml"``) finds ``pools/frontier.yaml``.  Raises
    :class:`PoolError` naming the close shipped names (a did-you-mean) and listing all
    of them when neither exists.
    """
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    shipped = {p.stem: p for p in list_builtin_pools()}
    is_path = "/" in name_or_path or os.sep in name_or_path
    stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
    if stem in shipped and not is_path:
        return shipped[stem]
    names = ", ".join(sorted(shipped)) or "none"
    # A path is matched by its file name: "./pools/frontir.yaml" still means frontier.
    close = difflib.get_close_matches(candidate.stem if is_path else stem, sorted(shipped), n=3)
    if is_path:
        hint = f" (did you mean the shipped pool {_either(close)}?)" if close else ""
        raise PoolError(
            f'no pool file "{name_or_path}": no such file{hint}; '
            f"give an existing pool file, or a shipped pool by name: {names}"
        )
    hint = f" (did you mean {_either(close)}?)" if close else ""
    raise PoolError(
        f'no pool file or shipped pool named "{name_or_path}"{hint}; '
        f"shipped pools: {names}; give one of those names or a pool file's path"
    )


def _either(names: list[str]) -> str:
    """``"a"``, ``"a" or "b"``, ``"a", "b" or "c"``."""
    quoted = [f'"{n}"' for n in names]
    if len(quoted) == 1:
        return quoted[0]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"
