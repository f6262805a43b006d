"""Exception hierarchy.

Every error the library raises on purpose derives from :class:`ConductorError`, so a
caller can catch one class.  The CLI maps :class:`UsageError` (and its subclasses) to
exit code 2 and every other :class:`ConductorError` to exit code 1.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "BadResponseError",
    "BudgetExceededError",
    "ConductorError",
    "ConnectionFailedError",
    "MissingDependencyError",
    "ModelCallError",
    "PoolError",
    "RateLimitError",
    "RecordError",
    "RequestTimeoutError",
    "RetryableError",
    "ServerError",
    "UsageError",
    "WorkflowParseError",
]


class ConductorError(Exception):
    """Base class of every error raised by conductor on purpose."""


class UsageError(ConductorError):
    """Bad input from the user: a bad option, file or setting (CLI exit code 2)."""


class PoolError(UsageError):
    """A pool file is invalid.  The message names the file, line and field."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.reason = message
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")


class RecordError(UsageError):
    """A run record cannot be read (wrong schema version, not JSON, missing fields)."""


class MissingDependencyError(UsageError):
    """An optional dependency (an extra) or a model file is not installed."""


class WorkflowParseError(ConductorError):
    """The Conductor's reply does not hold a valid workflow; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class BudgetExceededError(ConductorError):
    """A per-question budget (steps, rounds, calls or USD) was reached."""


class ModelCallError(ConductorError):
    """A model call failed.

    ``target`` is the worker id (or ``conductor``), ``status`` the HTTP status when
    there was one, and ``provider_message`` the provider's own words.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        target: str | None = None,
        status: int | None = None,
        provider_message: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.target = target
        self.status = status
        self.provider_message = provider_message if provider_message is not None else message
        self.retry_after_s = retry_after_s
        super().__init__(message)

    def with_target(self, target: str) -> ModelCallError:
        """Return the same error with ``target`` set (keeps the class)."""
        self.target = target
        return self

    def describe(self) -> str:
        """One sentence naming the target, the HTTP status and the provider's message."""
        who = f"worker {self.target!r}" if self.target else "model call"
        status = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{who} failed{status}: {self.kind}: {self.provider_message}"

    @property
    def kind(self) -> str:
        """A short name of the failure kind, e.g. ``rate limit``."""
        return "error"


class RetryableError(ModelCallError):
    """A failure that may pass: rate limits, server errors, time-outs, lost connections."""

    retryable = True


class RateLimitError(RetryableError):
    """HTTP 429, or the provider's equivalent."""

    @property
    def kind(self) -> str:
        return "rate limited"


class ServerError(RetryableError):
    """HTTP 5xx."""

    @property
    def kind(self) -> str:
        return "server error"


class RequestTimeoutError(RetryableError):
    """The request did not finish within the worker's ``timeout_s``."""

    @property
    def kind(self) -> str:
        return "timed out"


class ConnectionFailedError(RetryableError):
    """The server could not be reached."""

    @property
    def kind(self) -> str:
        return "connection failed"


class BadResponseError(RetryableError):
    """The server answered, but not with a usable completion: a body that is not JSON
    (an HTML error page, a cut-off body), a body of the wrong shape (no ``choices``, a
    ``message`` that is not an object) or an empty reply.  Retried, and never cached."""

    @property
    def kind(self) -> str:
        return "bad response"


class AuthenticationError(ModelCallError):
    """HTTP 401/403: a missing or wrong API key.  Never retried."""

    @property
    def kind(self) -> str:
        return "authentication failed"


class BadRequestError(ModelCallError):
    """HTTP 400/404/422: the request itself is wrong.  Never retried."""

    @property
    def kind(self) -> str:
        return "bad request"
