"""Leases on the work of one run, shared by every process that joins it.

A run's session on the server is named by a token its first process draws (the run
directory keeps it, so joiners on any host find it).  Under ``conductor:run:<token>:``:

- ``alive``: set when the session starts.  Every script below checks it first, so a
  server that restarted without its data (or whose keys were deleted) is *lost*, never
  taken for an empty run: :class:`StateLost`, and the run fails closed.
- ``lease:<epoch>:<sample>``: the owner token of the process running that pair, with a
  time to live; renewed by that process's heartbeat, so a process that dies (SIGKILL
  included) stops renewing and the pair is claimed again once its lease runs out.
- ``done``: the set of pairs whose record is durable in the run directory.  A pair
  joins it only through :meth:`RunClaims.finish`, a compare-and-set that succeeds only
  while the caller still holds the lease.
- ``started``: the set of pairs ever leased in this session.  A lease taken on a pair
  already in it is a *retake* (its holder died, stalled or gave it back): the holder
  may have written its record and died before :meth:`RunClaims.finish`, so the taker
  looks in the records first (:meth:`RunClaims.claim` says ``"retaken"``).
- ``spent``: the run's spend in USD (:mod:`conductor.state.spend`).

Each step is one Lua script, so it is atomic on the server whatever the processes do
between them.  Which pairs a run has, and what a record is, this module does not know.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import TYPE_CHECKING, Any

from ..errors import StateUnavailable
from .url import StateURL

if TYPE_CHECKING:
    import redis

__all__ = ["LEASE_S", "RunClaims", "StateLost", "is_token", "new_token"]

log = logging.getLogger("conductor")

#: How long a lease lasts unless renewed; the heartbeat renews at a third of it.
LEASE_S = 30.0
#: How long a session's keys outlive their last use (a run left for a week is gone).
_KEEP_MS = 7 * 24 * 3600 * 1000
_TIMEOUT_S = 5.0
_GONE = "it no longer holds this run's session: restarted or cleared"

# KEYS[1] is always the session's ``alive`` key: gone means lost (-1).
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 2 end
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then
  local first = redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  if first == 0 then return 3 end
  return 1 end
if redis.call('GET', KEYS[3]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[3], ARGV[3]) return 1 end
return 0
"""
_RENEW = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2]) return 1 end
return 0
"""
_FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
_CHARGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('INCRBYFLOAT', KEYS[2], ARGV[1])
"""
_SPENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return redis.call('GET', KEYS[2]) or '0'
"""


class StateLost(StateUnavailable):
    """The state server cannot be reached, or no longer holds the run's session (it
    restarted without its data): nothing the run shares can be trusted."""


def new_token() -> str:
    """A fresh session token (random, so an overwritten run never meets old marks)."""
    return secrets.token_hex(16)


def is_token(text: str) -> bool:
    """Whether ``text`` is a token :func:`new_token` draws (what a run directory holds
    is checked before it names keys on the server)."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _member(sample_id: str, epoch: int) -> str:
    return f"{epoch}:{sample_id}"


class RunClaims:
    """This process's view of one run session on the server at ``url``.

    ``owner`` names this process on the server; :meth:`claim` takes a pair's lease,
    a heartbeat thread renews every lease held, :meth:`confirm` renews one and says
    whether it is still ours (just before its record is written), and :meth:`finish`
    marks it done only if it is.  Any fault talking to the server raises
    :class:`StateLost` (and the heartbeat remembers it: :attr:`lost`).
    """

    def __init__(self, url: StateURL, token: str, *, lease_s: float = LEASE_S) -> None:
        import redis as redis_lib

        self.where = url.public
        #: The server and the session's token: what names this run's keys to a process
        #: that opens its own view of them (a Ray node charging the run's spend).
        self.url, self.token = url, token
        self.owner = secrets.token_hex(8)
        self.lease_ms = max(1, int(lease_s * 1000))
        self._errors: tuple[type[BaseException], ...] = (redis_lib.RedisError, OSError)
        self._redis: redis.Redis = redis_lib.Redis.from_url(
            url.url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S
        )
        base = f"conductor:run:{token}:"
        self._alive, self._done, self._spent = base + "alive", base + "done", base + "spent"
        self._started = base + "started"
        self._lease = base + "lease:"
        self._held: set[str] = set()
        self._guard = threading.Lock()
        self.lost: StateLost | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # --- the session -----------------------------------------------------------------

    def start(self, spent_usd: float) -> None:
        """Open the session (the run's first process): its spend starts at
        ``spent_usd``, what the records already written cost."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._alive, self.owner, px=_KEEP_MS)
        pipe.set(self._spent, repr(float(spent_usd)), px=_KEEP_MS)
        pipe.delete(self._done, self._started)
        self._call(pipe.execute)
        self._start_beat()

    def join(self) -> None:
        """Join the session another process opened; lost if it is not there."""
        if not self._call(self._redis.exists, self._alive):
            raise self._lose(_GONE)
        self._start_beat()

    def close(self) -> None:
        """Stop the heartbeat and hand back what is still held (its pairs are then
        claimable at once, not after the lease runs out)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=_TIMEOUT_S)
        with self._guard:
            held, self._held = list(self._held), set()
        for member in held:
            try:
                self._script(_RELEASE, [self._lease + member], [self.owner])
            except StateLost:
                break
        self._redis.close()

    # --- pairs -----------------------------------------------------------------------

    def claim(self, sample_id: str, epoch: int) -> str:
        """Try to take the pair: ``"claimed"`` (ours now, first taken), ``"retaken"``
        (ours now, but leased before in this session: its record may be written though
        not marked done), ``"done"`` (its record is written) or ``"held"`` (another live
        process runs it)."""
        member = _member(sample_id, epoch)
        got = self._script(
            _CLAIM,
            [self._alive, self._done, self._lease + member, self._started],
            [member, self.owner, self.lease_ms, _KEEP_MS],
        )
        if got in (1, 3):
            with self._guard:
                self._held.add(member)
            return "claimed" if got == 1 else "retaken"
        return "done" if got == 2 else "held"

    def confirm(self, sample_id: str, epoch: int) -> bool:
        """Renew the pair's lease and say whether it is still ours (checked just before
        its record is written: a full lease is then left for the write)."""
        member = _member(sample_id, epoch)
        got = self._script(_RENEW, [self._alive, self._lease + member], [self.owner, self.lease_ms])
        return bool(got == 1)

    def finish(self, sample_id: str, epoch: int) -> bool:
        """Mark the pair done (its record is durable), only if its lease is still ours."""
        member = _member(sample_id, epoch)
        with self._guard:
            self._held.discard(member)
        got = self._script(
            _FINISH, [self._alive, self._done, self._lease + member], [member, self.owner]
        )
        return bool(got == 1)

    def release(self, sample_id: str, epoch: int) -> None:
        """Give the pair back unfinished (its record was not written)."""
        member = _member(sample_id, epoch)
        with self._guard:
            self._held.discard(member)
        self._script(_RELEASE, [self._lease + member], [self.owner])

    # --- spend -----------------------------------------------------------------------

    def charge(self, usd: float) -> float:
        """Add ``usd`` to the run's spend; returns the run's total."""
        got = self._script(_CHARGE, [self._alive, self._spent], [repr(float(usd))])
        if got is None:
            raise self._lose(_GONE)
        return float(got)

    def spent(self) -> float:
        """The run's spend, all processes together."""
        got = self._script(_SPENT, [self._alive, self._spent], [])
        if got is None:
            raise self._lose(_GONE)
        return float(got)

    # --- plumbing --------------------------------------------------------------------

    def _start_beat(self) -> None:
        self._beat = threading.Thread(target=self._heartbeat, name="conductor-lease", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        interval = self.lease_ms / 3000.0
        while not self._stop.wait(interval):
            with self._guard:
                held = list(self._held)
            try:
                for member in held:
                    self._script(
                        _RENEW, [self._alive, self._lease + member], [self.owner, self.lease_ms]
                    )
                if not held:
                    self.spent()  # a server that went away is noticed even when idle
            except StateLost:
                return

    def _script(self, body: str, keys: list[str], args: list[Any]) -> Any:
        got = self._call(self._redis.eval, body, len(keys), *keys, *args)
        if got == -1:
            raise self._lose(_GONE)
        return got

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            raise self._lose(f"{type(exc).__name__}") from None

    def _lose(self, why: str) -> StateLost:
        error = StateLost(
            f"the state server at {self.where} cannot be trusted ({why})", where=self.where
        )
        with self._guard:
            first = self.lost is None
            if first:
                self.lost = error
        if first:
            log.warning("%s", error)
        return self.lost or error
