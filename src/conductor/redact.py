"""Secrets: telling a key from a variable name, and keeping keys out of what is written.

Two walls, one behind the other.

By name: a key is read from its environment variable only when a call is made; what a
run record, the cache or a log keeps of a pool (:func:`conductor.pool.pool_to_public_dict`)
is its targets' :func:`public_fields`, in which credentials in URLs (user-info, query
values under key-like names), params under secret-sounding keys and ``extra_headers``
values are ``***``.  Every label and message that shows an endpoint (the rate-limit
history's provider keys, ``pools show``, connection errors) shows it through
:func:`redact_url`.

By value: a name does not say what a value is (``?project=${KEY}``, a path segment, a
model name, a harmless-looking header), so :data:`SECRETS` owns *the secret values of
this process*: every value a configuration file took from the environment
(``${NAME}``, added by :class:`conductor.configfile.ConfigReader`), the credentials the
name rules find in a pool (added by the pool loader), and the current values of the
variables a key may be read from (those a client names, :meth:`Secrets.watch`, and every
variable whose name sounds like a key).  Every writer and renderer hands what it writes
through it once, at its boundary: the record and line writers (:func:`masked_json`), the
cache's values, the traces sent, the HTML page, the CI files, the consoles and the log
handler (:func:`mask_text`, :class:`MaskingFilter`).  A value is found raw and in the
forms a writer or a protocol gives it: backslash-escaped punctuation (JSON, Markdown),
``\\uXXXX`` escapes, percent-encoding, HTML and XML entities, base64 at any alignment
(a Basic ``Authorization`` header), lower- or upper-cased, and cut short beside the
ellipsis of a clipped text.  A value shorter than :data:`MIN_SECRET_CHARS` cannot be
masked without masking every word it happens to spell: it is not added, and the reader
that met it says so.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any

from .targets import Price, WorkerContext

__all__ = [
    "ENV_NAME_RE",
    "MIN_SECRET_CHARS",
    "REDACTED",
    "SECRETS",
    "Masker",
    "MaskingFilter",
    "Secrets",
    "credentials_in",
    "looks_like_key",
    "mask",
    "mask_text",
    "masked_json",
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


# --------------------------------------------------------------------------- by value

#: The shortest value masked by value.  A shorter one would mask every word it happens
#: to spell (a 4-character project id inside every answer); :meth:`Secrets.add` refuses
#: it and the reader that met it says so.
MIN_SECRET_CHARS = 8
# What an environment variable's name holds when its value is a credential
# (OPENAI_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, *_CREDENTIALS...).
_SECRET_ENV_WORDS = ("KEY", "TOKEN", "SECRET", "PASSW", "CREDENTIAL", "AUTH")
# How long a scan of the environment for such variables is reused.  The variables a
# target names are read at every mask (a key set after a caller was made is the one a
# provider may echo); the scan only widens the net to variables no target names.
_ENV_SCAN_S = 1.0
# A masker remembers what it made of texts up to this long, this many at most: each
# record repeats its pool's description and its prompts.
_MEMO_CHARS = 4096
_MEMO_ENTRIES = 4096
# How many maskers (sets of values) are kept compiled at once.
_MASKERS = 16
# What a clipped text ends with (and a text cut at its start begins with).
_ELLIPSES = ("\u2026", "...")


def _secret_env_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in _SECRET_ENV_WORDS)


def _base64_forms(raw: bytes) -> list[str]:
    """The base64 text that ``raw`` gives wherever it sits in a longer encoded string:
    at each of the three byte alignments, the characters that depend on ``raw`` alone
    (``user:KEY`` in a Basic header puts the key at an offset of 2)."""
    forms: list[str] = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        start = (8 * offset + 5) // 6
        end = (8 * (offset + len(raw))) // 6
        middle = encoded[start:end]
        forms += [middle, middle.replace("+", "-").replace("/", "_")]
    return forms


def _literal_forms(value: str) -> set[str]:
    """``value`` as base64 writes it (forms :func:`_lenient` cannot match character by
    character)."""
    forms = set(_base64_forms(value.encode("utf-8")))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS and f != value}


# The entities HTML, XML and markupsafe write for a character.
_ENTITIES = {
    "&": ("&amp;", "&#38;"),
    "<": ("&lt;", "&#60;"),
    ">": ("&gt;", "&#62;"),
    '"': ("&quot;", "&#34;", "&#x22;"),
    "'": ("&#39;", "&#x27;", "&apos;"),
}


def _char_pattern(c: str) -> str:
    """The ways one character of a secret may be written: itself (after up to three
    backslashes: JSON, JSON inside JSON, Markdown and rich escapes), percent-encoded
    (either case of hex; ``+`` for a space), as an entity, or as a ``\\u`` escape."""
    if c.isalnum() and c.isascii():
        return re.escape(c)
    ways = [r"\\{0,3}" + re.escape(c)]
    encoded = c.encode("utf-8")
    ways.append("".join(f"%{_hex(b >> 4)}{_hex(b & 15)}" for b in encoded))
    if c == " ":
        ways.append(r"\+")
    ways += [re.escape(e) for e in _ENTITIES.get(c, ())]
    if not c.isascii() or not c.isprintable():
        code = json.dumps(c, ensure_ascii=True)[1:-1]
        if code.startswith("\\u"):
            ways.append(r"\\{1,3}u" + "".join(_hex(int(d, 16)) for d in code[2:]))
        elif code.startswith("\\"):
            ways.append(r"\\{1,3}" + re.escape(code[1:]))
    return "(?:" + "|".join(ways) + ")"


def _hex(digit: int) -> str:
    """A hex digit in either case, as a pattern."""
    low = f"{digit:x}"
    return low if low.isdigit() else f"[{low}{low.upper()}]"


def _lenient(value: str) -> str:
    """A pattern for ``value`` written raw or in any mix of the forms of
    :func:`_char_pattern` (``+`` kept and ``=`` encoded, as a re-encoded query has it)."""
    return "".join(_char_pattern(c) for c in value)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` sorted, those that overlap joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


class Masker:
    """Masks a fixed set of secret values in text and in JSON-like data.

    Each value is found as written, lower- or upper-cased, raw or in any mix of the
    forms of :func:`_char_pattern` (backslash escapes, percent-encoding, entities,
    ``\\u`` escapes), and as base64 (:func:`_literal_forms`); a value cut short (at least
    :data:`MIN_SECRET_CHARS` of it) before an ellipsis, or following one, is masked
    too, since a clipped text keeps only part of what it quoted.  (A text clipped
    with no mark is masked before it is clipped, where it is clipped.)  Longer values
    are tried first, so a secret that holds another is masked whole.
    """

    def __init__(self, values: Iterable[str]) -> None:
        self.values: tuple[str, ...] = tuple(
            sorted({v for v in values if len(v) >= MIN_SECRET_CHARS}, key=lambda v: (-len(v), v))
        )
        patterns: list[tuple[int, str]] = []
        for value in self.values:
            # As written, lower-cased (a search index) and upper-cased (a label).
            cased = dict.fromkeys((value, value.lower(), value.upper()))
            patterns += [(len(value), _lenient(v)) for v in cased]
            patterns += [(len(f), re.escape(f)) for f in _literal_forms(value)]
        patterns.sort(key=lambda p: -p[0])
        # The texts masked lately (a record repeats its pool's URLs, ids and prompts).
        self._seen: dict[str, str] = {}
        # Case-sensitive, the case variants listed: re.IGNORECASE would stop the
        # engine's literal-prefix search and make masking some fifty times slower.
        self._pattern = re.compile("|".join(p for _, p in patterns)) if patterns else None

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self, text: str) -> str:
        """``text`` with every secret in it replaced by ``***``."""
        if self._pattern is None or len(text) < MIN_SECRET_CHARS:
            return text  # too short to hold a piece of a secret worth masking
        seen = self._seen.get(text)
        if seen is not None:
            return seen
        shown = self._pattern.sub(REDACTED, text)
        if any(m in shown for m in _ELLIPSES):
            shown = self._clipped(shown)
        if len(text) <= _MEMO_CHARS:
            if len(self._seen) >= _MEMO_ENTRIES:
                self._seen.clear()
            self._seen[text] = shown
        return shown

    def _clipped(self, text: str) -> str:
        """Mask the start of a secret left before an ellipsis (a text clipped there)
        and the end of one left after an ellipsis (a text clipped at its start)."""
        marks: list[tuple[int, int]] = []
        for mark in _ELLIPSES:
            at = text.find(mark)
            while at >= 0:
                marks.append((at, at + len(mark)))
                at = text.find(mark, at + 1)
        spans: list[tuple[int, int]] = []
        for before, after in marks:
            end = len(text[:before].rstrip())
            start = after + len(text[after:]) - len(text[after:].lstrip())
            spans += [s for s in (self._cut_end(text, end), self._cut_start(text, start)) if s]
        for lo, hi in _merged(spans)[::-1]:
            text = text[:lo] + REDACTED + text[hi:]
        return text

    def _cut_end(self, text: str, end: int) -> tuple[int, int] | None:
        """The span of the longest start of a secret (at least :data:`MIN_SECRET_CHARS`)
        that ends ``text[:end]``."""
        tail = text[end - MIN_SECRET_CHARS : end] if end >= MIN_SECRET_CHARS else ""
        for value in self.values if tail else ():
            if tail in value:
                for k in range(min(len(value), end), MIN_SECRET_CHARS - 1, -1):
                    if text.endswith(value[:k], 0, end):
                        return (end - k, end)
        return None

    def _cut_start(self, text: str, start: int) -> tuple[int, int] | None:
        """The span of the longest end of a secret that begins ``text[start:]``."""
        head = text[start : start + MIN_SECRET_CHARS]
        for value in self.values if len(head) == MIN_SECRET_CHARS else ():
            if head in value:
                for k in range(min(len(value), len(text) - start), MIN_SECRET_CHARS - 1, -1):
                    if text.startswith(value[-k:], start):
                        return (start, start + k)
        return None

    def data(self, value: Any, default: Callable[[Any], Any] | None = None) -> Any:
        """JSON-like ``value`` (dicts, lists, tuples, strings, numbers) with every
        secret masked in its strings and keys; a number whose digits hold one becomes
        ``"***"``.  Anything else is turned into what ``default`` makes of it (as
        ``json.dumps`` would) and masked, or without ``default`` returned as it is."""
        if self._pattern is None:
            return value
        return self._data(value, default)

    def _data(self, value: Any, default: Callable[[Any], Any] | None) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                (self.text(k) if isinstance(k, str) else k): self._data(v, default)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self._data(v, default) for v in value]
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, (int, float)):
            shown = str(value)
            return REDACTED if self.text(shown) != shown else value
        return value if default is None else self._data(default(value), None)


class Secrets:
    """The secret values of this process (see the module's docstring).

    ``add`` takes a value that came from the environment or was found by the name
    rules; ``watch`` names variables whose current values are secrets.  What a writer
    masks (:meth:`masker`) is those, with the current values of the watched variables
    and of every variable whose name sounds like a key.  ``enabled`` is for the tests'
    positive controls: off, nothing is masked by value.
    """

    def __init__(self) -> None:
        self.enabled = True
        self._lock = threading.Lock()
        self._added: set[str] = set()
        self._watched: set[str] = set()
        self._short: set[str] = set()
        self._scan: tuple[float, frozenset[str]] = (float("-inf"), frozenset())
        # Maskers by the values they mask: the process's, and that with a client's own
        # key added (its error mapper's), each compiled once.
        self._maskers: dict[frozenset[str], Masker] = {}

    def add(self, value: str) -> bool:
        """Hold ``value`` as a secret; False (and nothing held) when it is too short to
        mask (:data:`MIN_SECRET_CHARS`)."""
        if len(value) < MIN_SECRET_CHARS:
            return False
        with self._lock:
            self._added.add(value)
        return True

    def first_short(self, where: str) -> bool:
        """Whether ``where`` (a file, line and field) is met for the first time with a
        value too short to mask: the reader says so once per place, not at each load."""
        with self._lock:
            if where in self._short:
                return False
            self._short.add(where)
            return True

    def watch(self, *names: str) -> None:
        """Mask the values the variables ``names`` hold, whenever they are read."""
        with self._lock:
            self._watched.update(n for n in names if n)

    def forget(self) -> None:
        """Hold nothing (a test's end: the next test starts from this process's start)."""
        with self._lock:
            self._added.clear()
            self._watched.clear()
            self._short.clear()
            self._scan = (float("-inf"), frozenset())
            self._maskers.clear()

    def values(self) -> frozenset[str]:
        """The values masked now."""
        now = time.monotonic()
        with self._lock:
            scanned_at, scanned = self._scan
            if now - scanned_at > _ENV_SCAN_S:
                scanned = frozenset(v for k, v in os.environ.items() if _secret_env_name(k))
                self._scan = (now, scanned)
            current = set(self._added) | scanned
            current.update(v for v in (os.environ.get(n) for n in self._watched) if v)
        return frozenset(v for v in current if len(v) >= MIN_SECRET_CHARS)

    def masker(self, extra: Iterable[str] = ()) -> Masker:
        """A :class:`Masker` of :meth:`values` (and ``extra``), made again only when
        they change."""
        if not self.enabled:
            return Masker(())
        wanted = self.values() | {v for v in extra if len(v) >= MIN_SECRET_CHARS}
        with self._lock:
            masker = self._maskers.get(wanted)
        if masker is None:
            masker = Masker(wanted)
            with self._lock:
                if len(self._maskers) >= _MASKERS:
                    self._maskers.clear()
                self._maskers[wanted] = masker
        return masker


#: The one owner of this process's secret values.
SECRETS = Secrets()


def mask_text(text: str) -> str:
    """``text`` with every secret value of this process masked."""
    return SECRETS.masker().text(text)


def mask(value: Any) -> Any:
    """JSON-like ``value`` with every secret value of this process masked
    (:meth:`Masker.data`)."""
    return SECRETS.masker().data(value)


def masked_json(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, **dumps)`` of ``value`` masked: how a writer turns data into
    the text it writes."""
    return json.dumps(SECRETS.masker().data(value, dumps.get("default")), **dumps)


class MaskingFilter(logging.Filter):
    """A log handler's filter that masks every secret value in the message it formats
    (arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logger's to report
            return True
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None:
            # The traceback's text is made by the formatter; keep it from quoting one.
            import traceback

            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = mask_text(text.rstrip("\n"))
            record.exc_info = None
        return True
