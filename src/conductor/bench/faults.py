"""Why a bench run stops, and how a fault is told: :class:`BenchStopped` and its
messages (a directory that cannot be written, refused credentials), and exceptions as
one clipped line with the pool's key values masked.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import AuthenticationError, CacheError, ConductorError
from ..record import RunRecord
from ..redact import SECRETS
from ..text import plural

__all__ = [
    "MAX_REASON_CHARS",
    "BenchStopped",
    "auth_failure",
    "auth_stop",
    "cache_stop",
    "cap_stop",
    "io_stop",
    "pool_secrets",
    "reason",
    "scrub",
]

#: The longest reason kept from an unexpected exception.
MAX_REASON_CHARS = 500


class BenchStopped(ConductorError):
    """The run stopped early for a reason every remaining sample would share; the
    records already written are kept and the message says how to resume."""


def reason(exc: BaseException, secrets: list[str]) -> str:
    """An exception as one clipped line (its type and message), with secrets masked."""
    return scrub(f"{type(exc).__name__}: {exc}", secrets)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` on one line, each of ``secrets`` and every secret value of this
    process masked (before it is clipped, so that no part of one is left), clipped to
    :data:`MAX_REASON_CHARS`."""
    text = text.replace("\n", " ")
    for secret in secrets:
        text = text.replace(secret, "***")
    text = SECRETS.masker().text(text)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def pool_secrets(pool_dict: Mapping[str, Any]) -> list[str]:
    """The values of the key variables the pool names, to mask in reasons."""
    entries = [*(pool_dict.get("workers") or []), pool_dict.get("conductor") or {}]
    names = {e.get("api_key_env") for e in entries if isinstance(e, Mapping)}
    return [v for n in names if isinstance(n, str) and len(v := os.environ.get(n, "")) >= 4]


def auth_failure(record: RunRecord) -> str | None:
    """The first call of ``record`` refused for its credentials or permissions."""
    for call in record.all_calls():
        cls = getattr(errors, call.error_kind or "", None)
        if isinstance(cls, type) and issubclass(cls, AuthenticationError):
            return call.error or "authentication failed"
    return None


def io_stop(exc: OSError, path: Path, out: Path, written: int) -> BenchStopped:
    """The stop for ``path`` in the run ``out`` that cannot be written (a full disk), after
    ``written`` records."""
    what = errno.errorcode.get(exc.errno or 0, "I/O error")
    return BenchStopped(
        f"cannot write {path} ({exc.strerror or exc}, {what}): stopped before starting "
        f"more samples; the {plural(written, 'record')} written this time are kept, so free space "
        f"or fix the directory, then continue with `conductor bench --resume {out}`"
    )


def cache_stop(exc: CacheError, out: Path, written: int) -> BenchStopped:
    """The stop for a sample cache that cannot be used, after ``written`` records."""
    return BenchStopped(
        f"stopped: {exc}; no more samples were started and the {plural(written, 'record')} "
        f"written this time are kept; once the cache is fixed, continue with "
        f"`conductor bench --resume {out}`"
    )


def auth_stop(message: str, out: Path, written: int) -> BenchStopped:
    """The stop for credentials a provider refused (``message``, secrets already
    masked), after ``written`` records."""
    return BenchStopped(
        f"stopped: {message}; no more samples were started and the "
        f"{plural(written, 'record')} written this time are kept, so fix the key or its "
        f"permissions, then continue with `conductor bench --resume {out}`"
    )


def cap_stop(why: str, out: Path, *, batched: bool, in_flight: int = 0) -> BenchStopped:
    """The stop of the run ``out`` whose spend reached its ``--max-usd`` (``why`` says
    how far).  Live, the samples in flight finish and are written; ``batched``, they
    wait on waves that will not be sent and are left for the resume (their answered
    calls are in the cache), with ``in_flight`` provider batches still running (paid
    for: a resume collects them)."""
    if batched:
        kept = (
            "the records written are kept; the samples in flight are left for the resume, "
            "which finds their answered calls in the cache"
        )
        if in_flight:
            kept += (
                f", and {plural(in_flight, 'batch', 'batches')} still running at the "
                "provider, which it collects"
            )
    else:
        kept = "the samples in flight were finished, and every record is kept"
    return BenchStopped(
        f"{why}: no more samples were started; {kept}; to go on, continue with "
        f"`conductor bench --resume {out} --max-usd X` with a higher X"
    )
