"""Secrets: telling a key from a variable name, and keeping keys out of what is written.

A key is read from its environment variable only when a call is made; what a run
record, the cache or a log keeps of a pool (:func:`conductor.pool.pool_to_public_dict`)
is its targets' :func:`public_fields`, in which credentials in URLs (user-info, query
values under key-like names), params under secret-sounding keys and ``extra_headers``
values are ``***``.  Every label and message that shows an endpoint (the rate-limit
history's provider keys, ``pools show``, connection errors) shows it through
:func:`redact_url`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import fields
from typing import Any

from .targets import Price, WorkerContext

__all__ = [
    "ENV_NAME_RE",
    "REDACTED",
    "credentials_in",
    "looks_like_key",
    "public_fields",
    "redact_headers",
    "redact_params",
    "redact_url",
]

#: An environment variable's name.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: What a secret is replaced with.
REDACTED = "***"
# Prefixes of real provider keys (OpenAI, Anthropic, Google, Groq, xAI, Hugging Face,
# GitHub, Replicate, Perplexity): a value starting with one is a key, not a name.
_KEY_PREFIXES = ("sk-", "sk_", "AIza", "gsk_", "xai-", "hf_", "ghp_", "github_pat_", "r8_", "pplx-")
_SECRET_QUERY_KEYS = frozenset(
    {"key", "sig", "signature", "code", "password", "passwd", "pwd", "secret", "auth", "session"}
)
# Words that make a query parameter's value a credential wherever they appear in its
# name (api_key, X-Goog-Api-Key, access_token, client_secret, sessionid...).
_SECRET_QUERY_WORDS = ("key", "token", "secret", "passw", "auth", "sig", "credential", "session")
# extra_headers whose values are kept (they say how to talk, not who is talking);
# every other header's value is a credential until shown otherwise.
_HARMLESS_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "content-type",
        "user-agent",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "api-version",
        "http-referer",
        "referer",
        "x-title",
    }
)
# Param keys whose values are credentials (e.g. extra_headers: {Authorization: ...}).
# Matched on whole words so that max_tokens or budget_tokens are kept.
_SECRET_PARAM_NAMES = frozenset(
    {"authorization", "cookie", "password", "secret", "token", "key", "apikey", "bearer"}
)
_SECRET_PARAM_SUFFIXES = ("_key", "_token", "_secret", "_password", "apikey")


def looks_like_key(value: str) -> bool:
    """Whether an ``api_key_env`` value is probably a secret rather than a variable name."""
    if value.startswith(_KEY_PREFIXES):
        return True
    if not ENV_NAME_RE.match(value):
        return len(value) >= 20
    # A long mixed-case identifier with digits reads like a token, not like FOO_API_KEY.
    return (
        len(value) >= 32
        and any(c.islower() for c in value)
        and any(c.isupper() for c in value)
        and any(c.isdigit() for c in value)
    )


def redact_url(url: str) -> str:
    """``url`` with credentials and key-like query parameters replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, REDACTED if _is_secret_query_name(k) else v) for k, v in pairs],
            safe="*",
        )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_secret_query_name(name: str) -> bool:
    norm = name.lower()
    return norm in _SECRET_QUERY_KEYS or any(word in norm for word in _SECRET_QUERY_WORDS)


def _is_secret_name(name: str) -> bool:
    norm = name.lower().replace("-", "_")
    return norm in _SECRET_PARAM_NAMES or norm.endswith(_SECRET_PARAM_SUFFIXES)


def redact_headers(headers: Any) -> Any:
    """HTTP headers (a worker's ``extra_headers``) with every value but those of a few
    harmless headers (``Content-Type``, ``anthropic-version``...) replaced: a header's
    name does not tell whether its value is a key."""
    if not isinstance(headers, dict):
        return REDACTED if headers else headers
    return {k: v if str(k).lower() in _HARMLESS_HEADERS else REDACTED for k, v in headers.items()}


def redact_params(value: Any) -> Any:
    """Params with values under secret-sounding keys (tokens) and every ``extra_headers``
    value but harmless ones (:func:`redact_headers`) replaced."""
    if isinstance(value, dict):
        return {
            k: (
                redact_headers(v)
                if k == "extra_headers"
                else REDACTED
                if _is_secret_name(str(k)) and not isinstance(v, (dict, list))
                else redact_params(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_params(v) for v in value]
    return value


def credentials_in(api_base: str | None, params: dict[str, Any]) -> tuple[str, ...]:
    """The strings :func:`redact_url` and :func:`redact_params` would hide in a target's
    ``api_base`` and ``params``, so that an error message or a reply quoting one (a
    connection error naming its URL, a server echoing a header) can be masked too."""
    found: list[str] = []
    if api_base:
        try:
            parts = urllib.parse.urlsplit(api_base)
            # The password, or a lone user name (``https://KEY@host``).
            secret = parts.password if parts.password else parts.username
            found += [secret] if secret else []
            pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        except ValueError:
            pairs = []
        found += [v for k, v in pairs if v and _is_secret_query_name(k)]
    _hidden_values(params, redact_params(params), found)
    return tuple(dict.fromkeys(found))


def _hidden_values(value: Any, shown: Any, found: list[str]) -> None:
    """Collect into ``found`` each string of ``value`` that ``shown`` (its redaction) hid
    and that reads like a key: a header such as ``X-Env: production`` is hidden in what
    is written, but masking the word in every reply would mangle answers."""
    if isinstance(value, dict) and isinstance(shown, dict):
        for k, v in value.items():
            _hidden_values(v, shown.get(k), found)
    elif isinstance(value, list) and isinstance(shown, list):
        for v, w in zip(value, shown, strict=False):
            _hidden_values(v, w, found)
    elif shown == REDACTED and isinstance(value, str) and value != REDACTED:
        found += [part for part in value.split() if looks_like_key(part)]


def public_fields(obj: Any) -> dict[str, Any]:
    """A target dataclass (a worker, its context, the Conductor's settings) as JSON-ready
    fields, with URLs and params redacted."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Price):
            price = value
            value = {
                "input_per_mtok": price.input_per_mtok,
                "output_per_mtok": price.output_per_mtok,
            }
            # Only when set, so that the config hash of every earlier pool still holds.
            if price.batch_input_per_mtok is not None:
                value["batch_input_per_mtok"] = price.batch_input_per_mtok
            if price.batch_output_per_mtok is not None:
                value["batch_output_per_mtok"] = price.batch_output_per_mtok
        elif f.name == "api_base" and value is not None:
            value = redact_url(value)
        elif f.name == "params":
            value = redact_params(value)
        elif isinstance(value, WorkerContext):
            value = public_fields(value)
        elif (
            (f.name == "message" and value == "full")
            or (f.name == "subtasks" and not value)
            or (f.name == "structured_outputs" and value in ("auto", None))
            or (f.name == "batch" and value is None)
        ):
            # Defaults of settings added later are left out, so that the records (and
            # the keys bench resume and the sample cache compare) of pools written
            # before them read the same.
            continue
        elif isinstance(value, tuple):
            value = list(value)  # as JSON reads it back
        out[f.name] = value
    return out
