"""The address of the state server: read once, checked, its secrets held.

A URL may carry a password (``redis://:PASSWORD@host:6379/0``, or a user and
password) and TLS settings (``rediss://``, ``?ssl_cert_reqs=...``).  The password is
added to :data:`conductor.redact.SECRETS` the moment the URL is read, so every writer
the project has (logs, records, errors) masks it by value, and :attr:`StateURL.public`
is the form shown to people.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass

from ..configfile import did_you_mean
from ..errors import UsageError
from ..redact import SECRETS, redact_url

__all__ = ["SCHEMES", "STATE_ENV", "StateURL", "state_url_from"]

#: The environment variable read when no ``--state`` is given.
STATE_ENV = "CONDUCTOR_STATE_URL"
#: What redis-py connects to: TCP, TCP with TLS, a Unix socket.
SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class StateURL:
    """A checked state server address."""

    #: The URL as given (secrets included): handed to the client library only.
    url: str

    @property
    def public(self) -> str:
        """The URL with its user, password and secret-looking query values replaced."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"StateURL({self.public!r})"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str, *, where: str = "--state") -> StateURL:
        """``text`` checked; :class:`~conductor.errors.UsageError` (one sentence naming
        ``where``) for a URL redis-py could not use."""
        value = text.strip()
        parts = urllib.parse.urlsplit(value)
        scheme = parts.scheme.lower()
        shown = redact_url(value)
        if scheme not in SCHEMES:
            hint = did_you_mean(scheme, SCHEMES) if scheme else ""
            raise UsageError(
                f"{where}: {shown!r} is not a state server address; give "
                f"redis://HOST:PORT/DB, rediss:// (TLS) or unix:///PATH{hint}"
            )
        if parts.password:
            SECRETS.add(urllib.parse.unquote(parts.password))
        if scheme == "unix":
            if not parts.path:
                raise UsageError(f"{where}: {shown!r} names no socket (unix:///PATH)")
            return cls(value)
        if not parts.hostname:
            raise UsageError(f"{where}: {shown!r} names no host (redis://HOST:PORT/DB)")
        try:
            port = parts.port
        except ValueError:
            raise UsageError(f"{where}: {shown!r} has a port that is not a number") from None
        del port
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise UsageError(f"{where}: {shown!r}: the database after the / is a number")
        return cls(value)


def state_url_from(option: str | None) -> StateURL | None:
    """The state server of a command: its ``--state`` option, else ``$CONDUCTOR_STATE_URL``,
    else None (local files)."""
    if option:
        return StateURL.parse(option)
    env = os.environ.get(STATE_ENV, "").strip()
    return StateURL.parse(env, where=STATE_ENV) if env else None
