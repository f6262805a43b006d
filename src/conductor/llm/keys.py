"""Which keys a run lacks before it starts, and which values to mask: the checks made
on every target, by the rules its client kind declares (its capabilities' ``key_envs``,
``in_process`` and ``routes_by_model``).

How a client reads its key when it is made is :mod:`conductor.llm.apikey`, below the
clients; these checks ask the registry about each kind, so they sit above them.  A key
is read from its variable when a client is made or a call is checked, and never stored
anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import MissingKeysError
from ..redact import SECRETS, credentials_in
from ..text import joined, targets_named
from .apikey import PLACEHOLDER_KEY, PROVIDER_KEY_ENVS
from .factory import capabilities_of
from .sdk import import_litellm

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "KnownSecrets",
    "key_env_names",
    "known_secrets",
    "missing_keys",
    "needed_key",
    "require_keys",
]

#: Shorter values are not masked: they are not keys, and masking them would mangle text.
_MIN_SECRET_CHARS = 8


def needed_key(target: Worker) -> tuple[str, ...]:
    """The variables of which one must be set before ``target`` can be called, or ()
    when its key is set or it needs none (an in-process model, or a local server named
    by ``api_base``, which gets the placeholder key).  The same rules as the clients'
    own look-up (:func:`~conductor.llm.apikey.resolve_api_key`, and litellm's for a
    worker whose model picks its provider and names no variable), applied before any
    call."""
    caps = capabilities_of(target)
    if caps.in_process:
        return ()
    if target.api_key_env:
        names: tuple[str, ...] = (target.api_key_env,)
    elif caps.routes_by_model:
        # litellm finds its own key; a local server gets the placeholder.
        names = () if target.api_base else _litellm_key_names(target.model)
    else:
        names = caps.key_envs
    if not names or target.api_base or any(os.environ.get(name) for name in names):
        return ()
    return names


def _litellm_key_names(model: str) -> tuple[str, ...]:
    """The API-key variables litellm reads for ``model``'s provider, as litellm itself
    reports them.  Only ``*_API_KEY`` names count: other providers' credentials (AWS
    profiles, Vertex's application default credentials, Ollama's optional base URL) can
    come from elsewhere, and their failures are left to the call."""
    try:
        report = import_litellm().validate_environment(model)
    except Exception:  # litellm does not know the model: the call will say so
        return ()
    missing = (report.get("missing_keys") or []) if isinstance(report, dict) else []
    names = tuple(str(n) for n in missing if str(n).endswith("_API_KEY"))
    # Google's models take either of two variables; prefer the one the docs name first.
    return tuple(sorted(names, key=lambda n: n != "GEMINI_API_KEY"))


def missing_keys(targets: Iterable[Worker]) -> dict[str, list[str]]:
    """Each unset key variable (``A or B`` where either will do), with the targets
    (``worker 'ID'`` or ``the Conductor``) that need it, in the order first met."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for target in targets:
        if target.id in seen:
            continue
        seen.add(target.id)
        names = needed_key(target)
        if names:
            out.setdefault(" or ".join(names), []).append(target.id)
    return out


def require_keys(targets: Iterable[Worker]) -> None:
    """Raise :class:`MissingKeysError` naming every unset key variable and who needs
    it, so that a run fails before its first call instead of at each target in turn."""
    missing = missing_keys(targets)
    if not missing:
        return
    parts = [f"{names} (for {targets_named(ids)})" for names, ids in missing.items()]
    listing = joined(parts)
    noun = "key is" if len(parts) == 1 else "keys are"
    raise MissingKeysError(
        f"{len(parts)} API {noun} not set, so nothing was sent: set {listing} in the "
        "environment (or point the worker's api_key_env at the variable that holds it)",
        missing,
    )


def key_env_names(target: Worker) -> tuple[str, ...]:
    """Every variable ``target``'s key may come from: its ``api_key_env``, the defaults
    of its client kind, and where the model picks the provider (litellm) those of the
    model's provider prefix (litellm reads ``{PROVIDER}_API_KEY`` itself when the worker
    names no variable)."""
    names: list[str] = [target.api_key_env] if target.api_key_env else []
    caps = capabilities_of(target)
    names.extend(caps.key_envs)
    if caps.routes_by_model:
        provider = target.model.split("/", 1)[0] if "/" in target.model else "openai"
        names.extend(PROVIDER_KEY_ENVS.get(provider, ()))
        names.append(f"{provider.upper()}_API_KEY")
    return tuple(dict.fromkeys(names))


class KnownSecrets:
    """:func:`known_secrets` of one target, for a caller that masks them at every call.

    Where they may come from is worked out once: the target's key variables and the
    credentials written into its ``api_base`` and ``extra_headers`` (a target does not
    change).  The variables themselves are read at each :meth:`values`: litellm reads
    its key from the environment when it calls, so a key set or changed after the
    caller was made is the one a provider could echo.  Both are handed to
    :data:`conductor.redact.SECRETS` too, so that every writer of the process masks
    them (a key variable whose name does not sound like one included).
    """

    def __init__(self, target: Worker) -> None:
        self._names = key_env_names(target)
        # Keys written into the URL or the headers, which a message quoting them would show.
        self._written = credentials_in(target.api_base, target.params)
        SECRETS.watch(*self._names)
        for value in self._written:
            SECRETS.add(value)

    def values(self) -> tuple[str, ...]:
        """The values to mask now, each once, in a stable order."""
        values = [os.environ.get(name) for name in self._names]
        values += self._written
        return tuple(
            dict.fromkeys(
                v for v in values if v and len(v) >= _MIN_SECRET_CHARS and v != PLACEHOLDER_KEY
            )
        )


def known_secrets(target: Worker) -> tuple[str, ...]:
    """The values of ``target``'s key variables and the credentials in its ``api_base``
    and ``extra_headers``, to be masked wherever a reply or an
    error message could carry them (a provider may echo the key it was sent)."""
    return KnownSecrets(target).values()
