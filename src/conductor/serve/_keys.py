"""Who may call a ``conductor serve`` server, and which of the pool's workers each may use.

A keys file (``conductor serve --keys FILE``) lists the tokens clients send as
``Authorization: Bearer TOKEN``, each with a name and, optionally, the workers it may
use::

    keys:
      - name: team-a
        token_env: TEAM_A_TOKEN      # the token is this variable's value
        allowed_workers: [w0, w1]
        max_calls: 10000             # a budget: calls and USD over the key's life
        max_usd: 25.0
      - name: admin
        token_env: ADMIN_TOKEN       # no allowed_workers: every worker

``token: TEXT`` is read too, but it writes the secret into the file: prefer
``token_env``.  The file is read like a pool file (:mod:`conductor.configfile`), so each
mistake is ``FILE:LINE: message`` naming the field, with a did-you-mean for a misspelt
key or worker id.  A ``--api-key-env`` token beside the file is a key with every worker.

``max_calls`` and ``max_usd`` are the key's budget, over its life (the server's, or
on a ``--state`` server every replica shares, as long as that server keeps it): each
request holds its first plan, then each plan's worst case before the plan runs, and
is refused (429) when it does not fit (:mod:`._spend`).

A request narrows what its key allows with ``conductor.allowed_workers`` in its body
(:func:`allowed_workers`): a worker its key may not use is refused (403), not dropped,
so a client never gets an answer from fewer workers than it asked for without knowing.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..bounds import KEY_CALLS
from ..configfile import (
    ConfigReader,
    compose_yaml,
    did_you_mean,
    node_line,
    read_config_file,
    show_value,
)
from ..errors import ConfigFileError, UsageError
from ..pool import Pool
from ..strategies import Strategy
from ._models import Catalog, WorkersOutside
from ._protocol import ApiError

__all__ = [
    "ApiKey",
    "KeyRing",
    "KeysFileError",
    "allowed_workers",
    "load_keys",
    "load_keys_text",
    "refused_workers",
    "strategy_for",
]

#: The largest USD budget a key may have.
MAX_KEY_USD = 1_000_000.0

_ENTRY_KEYS = ("name", "token", "token_env", "allowed_workers", "max_calls", "max_usd")


class KeysFileError(ConfigFileError):
    """A keys file (``conductor serve --keys``) is invalid."""


@dataclass(frozen=True)
class ApiKey:
    """One client's key: its ``name`` (in logs and records, never the token), the
    ``token`` it sends, the workers it may use (``None``: every worker), and its
    budget: ``max_calls`` calls and ``max_usd`` USD over its life (``None``: no cap)."""

    name: str
    token: str = field(repr=False)
    allowed_workers: tuple[str, ...] | None = None
    max_calls: int | None = None
    max_usd: float | None = None

    @property
    def has_budget(self) -> bool:
        """Whether either cap is set (its requests are held against the budget)."""
        return self.max_calls is not None or self.max_usd is not None


class _KeysReader(ConfigReader):
    error_class = KeysFileError
    what = "keys file"

    def keys(self, root: yaml.Node | None, pool: Pool) -> tuple[ApiKey, ...]:
        get = self.document(
            root,
            ("keys",),
            empty="the keys file is empty; it needs a keys list",
            shape="a mapping with a keys list",
            required=("keys",),
        )
        node = get["keys"]
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(
                "keys must be a list of one or more keys, each with a name and token_env",
                node,
                "keys",
            )
        out: list[ApiKey] = []
        names: dict[str, int] = {}
        tokens: dict[str, int] = {}
        for i, item in enumerate(node.value):
            key = self.entry(item, f"keys[{i}]", pool)
            if key.name in names:
                raise self.error(
                    f'keys[{i}].name: duplicate key name "{key.name}" on lines '
                    f"{names[key.name]} and {node_line(item)}",
                    item,
                    f"keys[{i}].name",
                )
            if key.token in tokens:
                # Which key a request is would be a guess; the token itself is not shown.
                raise self.error(
                    f"keys[{i}] has the same token as the key on line {tokens[key.token]}; "
                    "give each key its own token",
                    item,
                    f"keys[{i}].token",
                )
            names[key.name] = tokens[key.token] = node_line(item)
            out.append(key)
        return tuple(out)

    def entry(self, node: yaml.Node, where: str, pool: Pool) -> ApiKey:
        if isinstance(node, yaml.MappingNode):
            for key, key_node, _value in self.items(node, where):
                if key == "api_key":  # the base reader's advice (api_key_env) is a pool's
                    raise self.error(
                        f'{where}: unknown key "api_key"; name the variable that holds the '
                        "token with token_env (e.g. token_env: TEAM_A_TOKEN)",
                        key_node,
                        f"{where}.api_key",
                    )
        keys = self.mapping(node, where, _ENTRY_KEYS, what="a mapping with name and token_env")
        get = {k: vn for k, (_kn, vn) in keys.items()}
        if "name" not in get:
            raise self.error(f'{where} is missing required key "name"', node, f"{where}.name")
        name = self.required_string(get["name"], f"{where}.name").strip()
        if ("token" in get) == ("token_env" in get):
            raise self.error(
                f"{where} (name {show_value(name)}) needs one of token_env (the variable "
                "holding the token) or token, not " + ("both" if "token" in get else "neither"),
                node,
                f"{where}.token_env",
            )
        if "token_env" in get:
            variable = self.env_name(get["token_env"], f"{where}.token_env")
            token = self.environ.get(variable or "", "").strip()
            if not token:
                raise self.error(
                    f"{where}.token_env: the variable {variable} is not set; set it to the "
                    "token this key's clients send",
                    get["token_env"],
                    f"{where}.token_env",
                )
        else:
            token = self.required_string(get["token"], f"{where}.token").strip()
        workers = None
        if "allowed_workers" in get:
            workers = self.workers(get["allowed_workers"], f"{where}.allowed_workers", pool)
        max_calls = None
        if "max_calls" in get:
            max_calls = self.integer(get["max_calls"], f"{where}.max_calls", KEY_CALLS)
        max_usd = None
        if "max_usd" in get:
            # Up to a million: counted in whole nano-dollars, exact below 2**53.
            max_usd = self.number(
                get["max_usd"], f"{where}.max_usd", positive=True, maximum=MAX_KEY_USD
            )
        return ApiKey(
            name=name,
            token=token,
            allowed_workers=workers,
            max_calls=max_calls,
            max_usd=max_usd,
        )

    def workers(self, node: yaml.Node, where: str, pool: Pool) -> tuple[str, ...] | None:
        if isinstance(node, yaml.ScalarNode) and self.scalar(node, where) is None:
            return None
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(
                f"{where} must be a list of one or more worker ids, e.g. [w0, w1] "
                "(leave it out for every worker)",
                node,
                where,
            )
        ids = [w.id for w in pool.workers]
        seen: list[str] = []
        for j, item in enumerate(node.value):
            sub = f"{where}[{j}]"
            wid = self.required_string(item, sub).strip()
            if wid not in ids:
                hint = did_you_mean(wid, ids)
                raise self.error(
                    f"{sub}: pool {pool.name!r} has no worker {show_value(wid)}{hint}; "
                    f"its workers are {', '.join(ids)}",
                    item,
                    sub,
                )
            if wid in seen:
                raise self.error(f"{sub} repeats {show_value(wid)}", item, sub)
            seen.append(wid)
        return tuple(seen)


def load_keys_text(
    text: str, pool: Pool, *, source: str = "<string>", environ: Mapping[str, str] | None = None
) -> tuple[ApiKey, ...]:
    """The keys in ``text`` (a keys file's YAML), checked against ``pool``'s workers;
    ``token_env`` is looked up in ``environ`` (default: ``os.environ``).  Raises
    :class:`KeysFileError` (``FILE:LINE: message``) on any mistake."""
    root = compose_yaml(text, source, KeysFileError)
    reader = _KeysReader(source, os.environ if environ is None else environ)
    try:
        return reader.keys(root, pool)
    finally:
        reader.close()


def load_keys(
    path: str | Path, pool: Pool, *, environ: Mapping[str, str] | None = None
) -> tuple[ApiKey, ...]:
    """Read the keys file at ``path`` (see :func:`load_keys_text`)."""
    text = read_config_file(Path(path), "keys file", KeysFileError)
    return load_keys_text(text, pool, source=str(path), environ=environ)


class KeyRing:
    """The keys a server accepts: none, and every request is let in."""

    def __init__(self, pool: Pool, keys: Sequence[ApiKey]) -> None:
        ids = {w.id for w in pool.workers}
        tokens: set[str] = set()
        for key in keys:
            if not key.token:
                raise UsageError(f"API key {key.name!r} has an empty token")
            if key.token in tokens:
                raise UsageError(f"API key {key.name!r} has the same token as another key")
            tokens.add(key.token)
            unknown = sorted(set(key.allowed_workers or ()) - ids)
            if unknown:
                raise UsageError(
                    f"API key {key.name!r} allows {', '.join(unknown)}, which pool "
                    f"{pool.name!r} does not have"
                )
        self.keys = tuple(keys)

    def check(self, authorization: str) -> ApiKey | None:
        """The key an ``Authorization`` header carries (``None`` when the server needs
        none), or :class:`ApiError` 401."""
        if not self.keys:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "no API key was given: send it as Authorization: Bearer KEY",
                type="authentication_error",
                code="invalid_api_key",
            )
        sent = token.strip().encode()
        found = None
        for key in self.keys:  # every one compared, so the time says nothing of which
            if hmac.compare_digest(sent, key.token.encode()):
                found = key
        if found is None:
            raise ApiError(
                401,
                "the API key is not valid for this server",
                type="authentication_error",
                code="invalid_api_key",
            )
        return found


def allowed_workers(
    pool: Pool, key: ApiKey | None, asked: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """The workers a request may use, in the pool's order (``None``: all of them): those
    it ``asked`` for in ``conductor.allowed_workers``, else all its key allows.

    A worker the pool has not is a 400 with a did-you-mean; one the key may not use a
    403, naming it."""
    ids = [w.id for w in pool.workers]
    permitted = ids if key is None or key.allowed_workers is None else list(key.allowed_workers)
    chosen = set(permitted)
    if asked is not None:
        for wid in asked:
            if wid not in ids:
                raise ApiError(
                    400,
                    f"conductor.allowed_workers names {show_value(wid)}, which is not a "
                    f"worker of this server{did_you_mean(wid, permitted)}; the workers are "
                    f"{', '.join(permitted)}",
                    param="conductor.allowed_workers",
                    code="worker_not_found",
                )
            if wid not in permitted:
                raise refused_workers(key, [wid], "conductor.allowed_workers", permitted)
        chosen = set(asked)
    ordered = tuple(i for i in ids if i in chosen)
    return None if len(ordered) == len(ids) else ordered


def refused_workers(
    key: ApiKey | None, workers: Sequence[str], param: str, permitted: Sequence[str]
) -> ApiError:
    """The 403 for ``workers`` that ``key`` may not use (:func:`allowed_workers`)."""
    named = ", ".join(show_value(w) for w in workers)
    whose = f"the API key {key.name!r}" if key is not None else "this request"
    return ApiError(
        403,
        f"{whose} may not use the worker{'s' if len(workers) > 1 else ''} {named}; "
        f"it may use {', '.join(permitted)}",
        type="permission_error",
        param=param,
        code="worker_not_allowed",
    )


def strategy_for(
    catalog: Catalog, key: ApiKey | None, model: str, asked: tuple[str, ...] | None
) -> Strategy:
    """The strategy answering ``model`` for a request with ``key`` that asked for the
    workers ``asked`` (:func:`allowed_workers`).  A model naming a worker outside them
    (``single:w2``) is a 403 when the key may not use it, else a 400: the request's own
    ``conductor.allowed_workers`` left it out."""
    pool = catalog.pool
    workers = allowed_workers(pool, key, asked)
    try:
        return catalog.resolve(model, workers)
    except WorkersOutside as exc:
        permitted = [w.id for w in pool.workers]
        if key is not None and key.allowed_workers is not None:
            permitted = list(key.allowed_workers)
        beyond = [w for w in exc.workers if w not in permitted]
        if beyond:
            raise refused_workers(key, beyond, "model", permitted) from None
        left_out = ", ".join(show_value(w) for w in exc.workers)
        raise ApiError(
            400,
            f"the model {model!r} uses {left_out}, which this request's "
            f"conductor.allowed_workers leaves out (it allows {', '.join(workers or ())})",
            param="model",
            code="model_not_found",
        ) from None
