"""Exception hierarchy.

Every error the library raises on purpose derives from :class:`ConductorError`, so a
caller can catch one class.  The CLI maps :class:`UsageError` (and its subclasses) to
exit code 2 and every other :class:`ConductorError` to exit code 1.

A configuration file that cannot be used raises a :class:`ConfigFileError`, one
sibling class per kind of file, each a :class:`UsageError`::

    ConfigFileError          FILE:LINE: message, naming the field
    ├── PoolError            pool files (pools/*.yaml)
    ├── BenchmarkFileError   benchmark files (benchmarks/*.yaml)
    ├── TrainConfigError     training configs (configs/train/*.yaml)
    └── TemplateFileError    Conductor prompt templates (a chat template's YAML)

Errors of one room are declared in the module that raises them, under these::

    ConductorError
    ├── DatasetError             a benchmark's rows cannot be read (datasets/sources.py)
    │   └── DataFileError        ... from a local file; also a UsageError
    ├── StateUnavailable         the state server a limit is kept on stays unreachable
    │   ├── StateLost            ... or a run's claims on it (state/claims.py)
    │   └── BudgetsLost          ... or serve's budgets on it (state/budgets.py)
    └── UsageError
        ├── RunConfigError       a run directory's config.json (runs/config.py)
        ├── RunDirBusyError      another process holds the run directory (runs/lock.py)
        └── ContaminationError   training questions overlap held-out ones
            └── HoldoutUnavailableError   ... or cannot be compared (train/contamination.py)
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "BadResponseError",
    "BenchmarkFileError",
    "CacheError",
    "CONDUCTOR_TARGET",
    "ConductorError",
    "ConfigFileError",
    "ConnectTimeoutError",
    "ConnectionFailedError",
    "ConnectionRefusedByHostError",
    "GrammarIgnoredError",
    "HostNotFoundError",
    "HostUnreachableError",
    "LocalModelCrashedError",
    "MissingDependencyError",
    "MissingKeysError",
    "ModelCallError",
    "PoolError",
    "RateLimitError",
    "RecordError",
    "RequestTimeoutError",
    "RetryableError",
    "ServerError",
    "StateUnavailable",
    "TemplateFileError",
    "TrainConfigError",
    "UsageError",
    "WorkflowParseError",
    "host_port",
    "install_hint",
    "target_name",
]

#: The target id of every Conductor call (whatever model or backend it uses).
CONDUCTOR_TARGET = "conductor"


def target_name(target: str | None) -> str:
    """How a message names a call's target: ``the Conductor`` or ``worker 'ID'``."""
    if target == CONDUCTOR_TARGET:
        return "the Conductor"
    return f"worker {target!r}" if target else "model call"


class ConductorError(Exception):
    """Base class of every error raised by conductor on purpose."""


class UsageError(ConductorError):
    """Bad input from the user: a bad option, file or setting (CLI exit code 2)."""


class ConfigFileError(UsageError):
    """A configuration file cannot be used: ``FILE:LINE: message``.

    ``path``, ``line`` and ``field`` say where (each may be None); ``reason`` is the
    message without the place.  Catch this class for "any configuration file"; each
    kind of file raises its own subclass.
    """

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


class PoolError(ConfigFileError):
    """A pool file is invalid, or no pool file or shipped pool has the name given."""


class BenchmarkFileError(ConfigFileError):
    """A benchmark file is invalid, or no benchmark has the name given."""


class TrainConfigError(ConfigFileError):
    """A training config is invalid."""


class TemplateFileError(ConfigFileError):
    """A Conductor prompt template is invalid, or no template has the name given."""


class RecordError(UsageError):
    """A run record cannot be read (wrong schema version, not JSON, missing fields)."""


class CacheError(ConductorError):
    """The call cache cannot be used: its disk is full, it is read-only or not ours
    (``corrupt`` False), or its database is damaged (``corrupt`` True).  The message says
    what to do; ``path`` is the cache directory.  A run that meets one stops: every
    later call would meet it too."""

    def __init__(self, message: str, *, path: str, corrupt: bool = False) -> None:
        super().__init__(message)
        self.path = path
        self.corrupt = corrupt


class StateUnavailable(ConductorError):
    """The state server (``--state``) that keeps a limit every process shares could not
    be reached (for the rate, for longer than the wait allowed): the call is not sent
    unmetered, the request refused, the run stopped (its kinds:
    :class:`~conductor.state.claims.StateLost`, a run's claims on it lost;
    :class:`~conductor.state.budgets.BudgetsLost`, serve's budgets).  ``where`` is the
    server's address, with no secret."""

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.where = where


class MissingDependencyError(UsageError):
    """An optional dependency (an extra) or a model file is not installed."""


def install_hint(extra: str) -> str:
    """The command that installs the optional dependencies ``extra`` of this package."""
    return f"pip install 'conductor-orchestrate[{extra}]'"


class MissingKeysError(UsageError):
    """API keys a run needs are not set; ``missing`` maps each variable (or ``A or B``
    where either will do) to the targets that need it.  Raised before any call."""

    def __init__(self, message: str, missing: dict[str, list[str]]) -> None:
        self.missing = missing
        super().__init__(message)


class WorkflowParseError(ConductorError):
    """The Conductor's reply does not hold a valid workflow; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


_E = TypeVar("_E", bound="ModelCallError")


class ModelCallError(ConductorError):
    """A model call failed.

    ``target`` is the worker id (or :data:`CONDUCTOR_TARGET`), ``status`` the HTTP
    status when there was one, ``provider_message`` the provider's own words and
    ``retry_after_s`` the wait the server asked for.  ``max_retries`` caps the target's
    own ``max_retries`` for this failure (None: the class's cap, :attr:`MAX_RETRIES`);
    ``attempts`` is how many attempts were made, known once retries are over, and
    ``retries`` the attempts before the last, each a :class:`~conductor.llm.types.Retry`.

    An error is not changed once raised: :meth:`replace` makes the same failure with
    other fields (the retry layer passes ``attempts``, the caller the ``target``).
    """

    retryable: ClassVar[bool] = False
    #: The cap on retries for this kind of failure (None: no cap).
    MAX_RETRIES: ClassVar[int | None] = None

    def __init__(
        self,
        message: str,
        *,
        target: str | None = None,
        status: int | None = None,
        provider_message: str | None = None,
        retry_after_s: float | None = None,
        max_retries: int | None = None,
        attempts: int | None = None,
        retries: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.target: str | None = target
        self.status: int | None = status
        self.provider_message: str = provider_message if provider_message is not None else message
        self.retry_after_s: float | None = retry_after_s
        self.max_retries: int | None = max_retries if max_retries is not None else self.MAX_RETRIES
        self.attempts: int | None = attempts
        self.retries: tuple[dict[str, Any], ...] = retries
        super().__init__(message)

    def fields(self) -> dict[str, Any]:
        """The constructor keywords that rebuild this error (subclasses add theirs)."""
        return {
            "target": self.target,
            "status": self.status,
            "provider_message": self.provider_message,
            "retry_after_s": self.retry_after_s,
            "max_retries": self.max_retries,
            "attempts": self.attempts,
            "retries": self.retries,
        }

    def replace(self: _E, *, described: bool = False, **changes: Any) -> _E:
        """The same failure (same class) with ``changes`` to its fields, keeping its
        message, or with :meth:`describe`'s sentence for it when ``described``."""
        unknown = set(changes) - set(self.fields())
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        message = str(self.args[0]) if self.args else self.provider_message
        new = type(self)(message, **{**self.fields(), **changes})
        if described:
            new.args = (new.describe(),)
        else:
            new.args = self.args
        return new.with_traceback(self.__traceback__)

    def with_target(self: _E, target: str) -> _E:
        """The same error with ``target`` set (keeps the class and the message)."""
        return self if target == self.target else self.replace(target=target)

    def describe(self) -> str:
        """One sentence naming the target, the HTTP status and the provider's message."""
        who = target_name(self.target)
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


def host_port(host: str | None, port: int | None) -> str | None:
    """``host:port`` (``[v6]:port``), the host alone without a port, or None."""
    if not host:
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port else shown


class ConnectTimeoutError(RequestTimeoutError):
    """No connection to the server within the time-out: the host is down, a firewall
    drops the packets, or the address is wrong.  Still a time-out, with the address.

    Retried at most once: a host that swallowed one connect most likely swallows the
    next, and each try costs a whole time-out."""

    MAX_RETRIES = 1

    def __init__(
        self, message: str, *, host: str | None = None, port: int | None = None, **kw: Any
    ) -> None:
        self.host: str | None = host
        self.port: int | None = port
        super().__init__(message, **kw)

    def fields(self) -> dict[str, Any]:
        return {**super().fields(), "host": self.host, "port": self.port}


class ConnectionFailedError(RetryableError):
    """The connection to the server failed or was lost.  ``host`` and ``port`` are the
    server's when they are known.  The subclasses are the failures before any byte was
    sent, each with what to do about it; this class itself is a connection lost on the
    way (reset, closed early), which the full retry policy covers."""

    #: What the user can do about it.
    advice: str = ""

    def __init__(
        self, message: str, *, host: str | None = None, port: int | None = None, **kw: Any
    ) -> None:
        self.host: str | None = host
        self.port: int | None = port
        super().__init__(message, **kw)

    def fields(self) -> dict[str, Any]:
        return {**super().fields(), "host": self.host, "port": self.port}

    @property
    def address(self) -> str | None:
        """``host:port``, or None when unknown."""
        return host_port(self.host, self.port)

    @property
    def kind(self) -> str:
        return "connection failed"

    def what(self) -> str:
        """What happened, naming the server."""
        return f"the connection to {self.address or 'the server'} failed"

    def describe(self) -> str:
        """Who, what happened and where, after how many attempts, what to do, and the
        transport's own words."""
        tries = ""
        if self.attempts is not None and self.attempts > 1:
            tries = f" after {self.attempts} attempts"
        advice = f"; {self.advice}" if self.advice else ""
        return (
            f"{target_name(self.target)} failed: {self.kind}: {self.what()}{tries}{advice} "
            f"({self.provider_message})"
        )


class HostNotFoundError(ConnectionFailedError):
    """The host name does not resolve (DNS): a typo in api_base, or no network.

    Retried at most once: a name that does not resolve rarely resolves a second later,
    but a resolver can fail for a moment (a network coming up)."""

    MAX_RETRIES = 1
    advice = "check the network connection and the host name (api_base)"

    @property
    def kind(self) -> str:
        return "host not found"

    def what(self) -> str:
        return f"the name {self.host or 'of the server'} could not be resolved (DNS)"


class ConnectionRefusedByHostError(ConnectionFailedError):
    """The host answered but nothing listens on the port: the server is not running
    (yet), or api_base names the wrong port.

    Retried once (this class's cap) when the host never answered this run, since a
    server that is not running will not start within seconds; the caller lifts the cap
    to two when the host did answer before (a server restarting, or one whose listen
    queue overflowed, is back soon)."""

    MAX_RETRIES = 1
    advice = "check that the server is running and that api_base names its host and port"

    @property
    def kind(self) -> str:
        return "connection refused"

    def what(self) -> str:
        return f"{self.address or 'the server'} refused the connection"


class HostUnreachableError(ConnectionFailedError):
    """The network has no route to the host: no network, or a wrong address.

    Retried once: a network that is coming up (Wi-Fi, VPN) may be there a second later."""

    MAX_RETRIES = 1
    advice = "check the network connection (and VPN) and the address in api_base"

    @property
    def kind(self) -> str:
        return "host unreachable"

    def what(self) -> str:
        return f"no route to {self.address or 'the server'}"


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


class GrammarIgnoredError(ModelCallError):
    """A server asked to constrain a reply to a grammar answered (HTTP 200) with a reply
    the grammar does not admit: it ignored the body field the grammar went in, as a
    server does with a field it does not know.  ``field`` is the field sent (e.g.
    ``structured_outputs.grammar``), ``server`` the server as identified (e.g.
    ``vLLM 0.10.1``); the message says which ``structured_outputs`` setting to use.
    Never retried: the same request to the same server is ignored the same way."""

    def __init__(
        self, message: str, *, field: str | None = None, server: str | None = None, **kw: Any
    ) -> None:
        self.field: str | None = field
        self.server: str | None = server
        super().__init__(message, **kw)

    def fields(self) -> dict[str, Any]:
        return {**super().fields(), "field": self.field, "server": self.server}

    @property
    def kind(self) -> str:
        return "grammar ignored"


class LocalModelCrashedError(ModelCallError):
    """A local model's host process died (a native crash in llama.cpp, an instruction
    the CPU lacks, the out-of-memory killer).  The message says what happened and what
    to try.  Never retried: the same call would most likely die the same way."""

    @property
    def kind(self) -> str:
        return "local model crashed"
