"""Pool files: the workers a Conductor may use, and an optional default Conductor.

:class:`Pool` is the in-memory form of ``pools/*.yaml`` (see "Pool files" in the README);
its workers and Conductor settings are the call targets of :mod:`conductor.targets`.  The
order of ``Pool.workers`` is the order the Conductor sees ("Model 0", "Model 1", ...).
The file is read with the line-aware reader of :mod:`conductor.configfile`; shipped pools
are found by :mod:`conductor.shipped`.  What a run record, the cache or a log keeps of a pool
is :func:`pool_to_public_dict`, redacted by :mod:`conductor.redact`; every value the file
took from the environment (``${NAME}``), and every credential the name rules find, is
also held by :data:`conductor.redact.SECRETS`, which the writers mask by value.

``defaults:`` holds the settings every model of the pool takes unless it sets its own
(``temperature``, ``max_tokens``, ``top_p``, ``timeout_s``, ``total_timeout_s``,
``max_retries``, ``max_concurrency``): each worker, and the ``conductor:`` section too.
Two Conductors take them otherwise: a ``prompted`` Conductor that names a pool worker
*is* that worker (its own settings over the defaults, as the worker has them), and a
``checkpoint`` Conductor takes its sampling settings (``temperature``, ``max_tokens``,
``top_p``) from the ``conductor.json`` it was trained with, not from the defaults (its
time-outs and retries it takes as any other).  A ``--conductor`` given on the command
line with the section's backend keeps the section's settings, defaults included; one
of another backend is not the pool's, and takes none of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

import yaml

from .bounds import (
    CHARS,
    CONCURRENCY,
    CONTEXT_TOKENS,
    GPU_LAYERS,
    LENGTH,
    RETRIES,
    STEPS,
    THREADS,
    TOKENS,
)
from .configfile import (
    MAX_TIMEOUT_S,
    ConfigReader,
    compose_yaml,
    node_line,
    read_config_file,
    show_value,
)
from .errors import PoolError
from .redact import SECRETS, credentials_in, public_fields
from .shipped import resolve_shipped, shipped, shipped_dir
from .targets import (
    CONDUCTOR_BACKENDS,
    MESSAGE_FORMS,
    POOL_CLIENT_KINDS,
    REASONING_MODES,
    STRUCTURED_OUTPUTS,
    ConductorConfig,
    MessageForm,
    Price,
    ReasoningMode,
    Worker,
    WorkerContext,
)

# Worker, Price, WorkerContext, ConductorConfig and MessageForm live in .targets, where
# the model-call layer imports them without this loader.
__all__ = [
    "Pool",
    "DEFAULT_POOL",
    "RUNTIME_FIELDS",
    "builtin_pools_dir",
    "list_builtin_pools",
    "load_pool",
    "load_pool_text",
    "open_pool",
    "pool_to_public_dict",
    "resolve_pool_path",
]


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


#: The fields of a pool's description (:func:`pool_to_public_dict`) that say how a model
#: is reached, paced and paid for, and not what it answers: a bench resume may change
#: them, and ``conductor serve``'s pinned model ids do not change with them.
RUNTIME_FIELDS = frozenset(
    {
        "path",
        "api_key_env",
        "max_concurrency",
        "rpm",
        "timeout_s",
        "total_timeout_s",
        "max_retries",
        "price",
        "n_threads",
        "n_gpu_layers",
        # Through a provider's batch API or live: the same answers, at another price.
        "batch",
    }
)


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
        "context": public_fields(pool.context),
        "workers": [public_fields(w) for w in pool.workers],
        "conductor": public_fields(pool.conductor) if pool.conductor is not None else None,
    }


# --------------------------------------------------------------------------- loading

# Field names, in the order the error messages list them.
# Sampling settings that live in Worker.params rather than in their own fields.
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p")
# The keys of a ``client: local`` worker's model file, and the model it runs when it names
# none, are the pool file's schema, kept here: the loader sits a floor below the model
# calls (conductor.llm) and reads no client class, and a worker is checked as the file
# is read, with the line it came from.  What a kind does with its calls is its client
# class's ``capabilities`` (conductor.llm.capabilities).
_LOCAL_ONLY_KEYS = ("model_path", "n_ctx", "n_threads", "n_gpu_layers")
_TOP_KEYS = ("name", "description", "defaults", "context", "workers", "conductor")
_DEFAULT_KEYS = (*_SAMPLING_KEYS, "timeout_s", "max_retries", "max_concurrency", "total_timeout_s")
_WORKER_KEYS = (
    *("id", "model", "client", "api_base", "api_key_env", "params", "price"),
    *("max_concurrency", "rpm", "timeout_s", "max_retries", "total_timeout_s"),
    *_SAMPLING_KEYS,
    *("description", "system_prompt", "structured_outputs", "batch"),
    *_LOCAL_ONLY_KEYS,
    "context",
)
_CONTEXT_KEYS = tuple(f.name for f in fields(WorkerContext))
_CONDUCTOR_KEYS = tuple(f.name for f in fields(ConductorConfig))
_PRICE_KEYS = ("input_per_mtok", "output_per_mtok")
# A batch price of its own, where the provider's is not half the live one.
_BATCH_PRICE_KEYS = ("batch_input_per_mtok", "batch_output_per_mtok")
# The defaults a conductor: section takes where it sets none (every one, so far).
_CONDUCTOR_DEFAULT_KEYS = tuple(k for k in _DEFAULT_KEYS if k in _CONDUCTOR_KEYS)
#: The highest request rate a worker may state (requests a minute): a million a
#: minute is past any provider's tier, and keeps the rate's interval above a microsecond.
MAX_RPM = 1_000_000.0
#: The highest sampling temperature a pool may set (providers take 0 to 2).
MAX_TEMPERATURE = 100.0
#: The range of each count of the conductor section (:mod:`conductor.bounds`).
_CONDUCTOR_COUNTS = {
    "max_steps": STEPS,
    "n_ctx": CONTEXT_TOKENS,
    "n_threads": THREADS,
    "max_concurrency": CONCURRENCY,
    "parse_retries": RETRIES,
    "max_retries": RETRIES,
    "max_reasoning_chars": CHARS,
    "min_subtask_chars": LENGTH,
    "max_subtask_chars": LENGTH,
    "n_gpu_layers": GPU_LAYERS,
}
_LOCAL_DEFAULT_MODEL = "smollm2"
# The clients that send a grammar to an OpenAI-compatible server, so the only ones a
# structured_outputs setting means anything to.
_SERVER_GRAMMAR_CLIENTS = ("litellm", "openai", "http")


class _PoolReader(ConfigReader):
    """The line-aware reader with the sections of a pool file."""

    error_class = PoolError
    what = "pool file"

    def price(self, node: yaml.Node, field: str) -> Price | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
            return None
        keys = self.mapping(
            node,
            field,
            _PRICE_KEYS + _BATCH_PRICE_KEYS,
            what="a mapping with input_per_mtok and output_per_mtok",
        )
        values: dict[str, float] = {}
        for key in _PRICE_KEYS + _BATCH_PRICE_KEYS:
            if key not in keys:
                if key in _BATCH_PRICE_KEYS:
                    continue
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
            return self.number(node, field, maximum=MAX_TEMPERATURE)
        if key == "top_p":
            return self.number(node, field, maximum=1.0)
        if key in ("timeout_s", "total_timeout_s"):
            return self.number(node, field, positive=True, maximum=MAX_TIMEOUT_S)
        if key == "max_tokens":
            return self.integer(node, field, TOKENS)
        if key == "max_concurrency":
            return self.integer(node, field, CONCURRENCY)
        if key == "max_retries":
            return self.integer(node, field, RETRIES)
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
                raise self.error(f"{sub} repeats {show_value(text)}", item, sub)
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
                f"{field}.id must not contain spaces, got {show_value(worker_id)}",
                get["id"],
                f"{field}.id",
            )

        client = "litellm"
        if "client" in get:
            client = self.choice(get["client"], f"{field}.client", POOL_CLIENT_KINDS) or "litellm"

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

        if "structured_outputs" in get and client not in _SERVER_GRAMMAR_CLIENTS:
            raise self.error(
                f"{field}.structured_outputs applies only to a client that sends a grammar "
                f"to an OpenAI-compatible server ({', '.join(_SERVER_GRAMMAR_CLIENTS)}), but "
                f"this worker's client is {client}",
                keys["structured_outputs"][0],
                f"{field}.structured_outputs",
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
            elif key == "rpm":
                kwargs[key] = self.number(vn, sub, positive=True, maximum=MAX_RPM)
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
                kwargs[key] = self.integer(vn, sub, CONTEXT_TOKENS if key == "n_ctx" else THREADS)
            elif key == "n_gpu_layers":
                # llama.cpp reads -1 as "all layers".
                kwargs[key] = self.integer(vn, sub, GPU_LAYERS)
            elif key == "context":
                kwargs[key] = self.context(vn, sub, kwargs["context"])
            elif key == "structured_outputs":
                kwargs[key] = self.choice(vn, sub, STRUCTURED_OUTPUTS) or "auto"
            elif key == "batch":
                # Whether its client has a batch API is the bench's to say (it knows
                # the client kinds); here only the value is read.
                kwargs[key] = self.boolean(vn, sub)
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
                f"workers must be a list of workers, got {show_value(value)}", node, "workers"
            )
        result: list[Worker] = []
        first_line: dict[str, tuple[int, int]] = {}
        for index, item in enumerate(node.value):
            worker = self.worker(item, index, defaults, context)
            if worker.id in first_line:
                other, other_line = first_line[worker.id]
                raise self.error(
                    f'workers[{index}].id: duplicate worker id "{worker.id}" on lines '
                    f"{other_line} and {node_line(item)} (workers[{other}] and workers[{index}])",
                    item,
                    f"workers[{index}].id",
                )
            first_line[worker.id] = (index, node_line(item))
            result.append(worker)
        return tuple(result)

    def conductor(
        self, node: yaml.Node, defaults: Mapping[str, Any], workers: tuple[Worker, ...]
    ) -> ConductorConfig | None:
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
                value = self.choice(vn, sub, POOL_CLIENT_KINDS)
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
            elif key in _CONDUCTOR_COUNTS:
                value = self.integer(vn, sub, _CONDUCTOR_COUNTS[key])
            elif key in ("show_descriptions", "constrained"):
                value = self.boolean(vn, sub)
            elif key in ("timeout_s", "total_timeout_s"):
                value = self.number(vn, sub, positive=True, maximum=MAX_TIMEOUT_S)
                value = float(value) if value is not None else None
            elif key == "subtasks":
                value = self.subtask_choices(vn, sub)
            elif key == "structured_outputs":
                value = self.choice(vn, sub, STRUCTURED_OUTPUTS)
            else:  # pragma: no cover
                raise AssertionError(key)
            if value is not None:
                kwargs[key] = value
        kwargs.update(_conductor_defaults(kwargs, defaults, workers))
        config = ConductorConfig(**kwargs)
        if config.subtasks and not config.constrained:
            raise self.error(
                "conductor.subtasks needs constrained: true: the grammar is what keeps the "
                "Conductor to those instructions (add constrained: true, or remove subtasks)",
                keys["subtasks"][1],
                "conductor.subtasks",
            )
        if config.structured_outputs is not None and config.backend in ("local", "checkpoint"):
            raise self.error(
                f"conductor.structured_outputs says how a grammar is sent to an "
                f"OpenAI-compatible server; a {config.backend} Conductor constrains its own "
                "decoder (remove structured_outputs)",
                keys["structured_outputs"][0],
                "conductor.structured_outputs",
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
        conductor = (
            self.conductor(get["conductor"], defaults, workers) if "conductor" in get else None
        )
        return Pool(
            name=name,
            workers=workers,
            description=description,
            defaults=defaults,
            conductor=conductor,
            path=path,
            context=context,
        )


def _conductor_defaults(
    own: Mapping[str, Any], defaults: Mapping[str, Any], workers: tuple[Worker, ...]
) -> dict[str, Any]:
    """The ``defaults:`` a ``conductor:`` section whose own keys are ``own`` takes (see
    the module's docstring): none for a prompted Conductor that names a pool worker,
    no sampling settings for a checkpoint."""
    backend = own.get("backend", ConductorConfig.backend)
    if backend == "prompted" and own.get("model") in {w.id for w in workers}:
        return {}
    keys = _CONDUCTOR_DEFAULT_KEYS
    if backend == "checkpoint":
        keys = tuple(k for k in keys if k not in _SAMPLING_KEYS)
    taken = {k: defaults[k] for k in keys if k in defaults and k not in own}
    for key in ("timeout_s", "total_timeout_s"):
        if key in taken:
            taken[key] = float(taken[key])
    return taken


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
    root = compose_yaml(text, source, PoolError)
    default_name = "pool" if source.startswith("<") else Path(source).stem
    reader = _PoolReader(source, env)
    try:
        pool = reader.pool(root, default_name, path)
    finally:
        reader.close()
    # What the name rules call a credential is masked by value too, wherever it lands
    # (a server echoing it in a reply, another field quoting it); what came from the
    # environment the reader has given SECRETS already.
    targets = (*pool.workers, *((pool.conductor,) if pool.conductor is not None else ()))
    for target in targets:
        for value in credentials_in(target.api_base, target.params):
            SECRETS.add(value)
    return pool


def load_pool(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Pool:
    """Read and validate the pool file at ``path`` (see :func:`load_pool_text`)."""
    file = Path(path)
    text = read_config_file(file, "pool file", PoolError)
    return load_pool_text(text, source=str(path), environ=environ, path=file)


# --------------------------------------------------------------------------- shipped pools


def builtin_pools_dir() -> Path:
    """The folder of shipped pool files (see :func:`conductor.shipped.shipped_dir`)."""
    return shipped_dir("pool")


def list_builtin_pools() -> list[Path]:
    """The shipped pool files, sorted by name."""
    return shipped("pool")


#: The pool a command uses when none is named: the embedded offline one.
DEFAULT_POOL = "local"


def open_pool(name_or_path: str | None) -> Pool:
    """The pool a command was pointed at: a file, a shipped name, or (None) the default."""
    return load_pool(resolve_pool_path(name_or_path or DEFAULT_POOL))


def resolve_pool_path(name_or_path: str) -> Path:
    """An existing pool file path, or the shipped pool called ``name_or_path``.

    ``"frontier"`` (or ``"frontier.yaml"``) finds ``pools/frontier.yaml``.  Raises
    :class:`PoolError` naming the close shipped names (a did-you-mean) and listing all
    of them when neither exists.
    """
    return resolve_shipped("pool", name_or_path)
