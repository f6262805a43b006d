"""Each provider key's request rate on a Redis-protocol server, one for every process.

The rules are :mod:`conductor.llm.limiter`'s (a GCRA schedule per key, cut in half by
a rate-limit reply once per generation, held back by its ``Retry-After``, grown back
one request a minute per success); here they run as two scripts the server executes
atomically, on the server's own clock (``TIME``), so that processes on hosts whose
clocks disagree still share one schedule.  A key's state is one hash,
``conductor:rate:<provider key>`` (the key is a label with no secret), with the next
theoretical arrival time in microseconds (``tat``), the current rate (``rpm``) and its
generation (``gen``); it expires after :data:`IDLE_TTL_MS` unused, and a server that
lost it (restarted, flushed) makes a new one at the stated rate on the next request.

A limit fails closed, where the call cache fails open: while the server cannot be
reached no request is admitted; admission is retried with a bounded back-off, one
line is logged when the server is lost and one when it is back, and a call still
waiting after ``give_up_s`` fails with :class:`~conductor.errors.StateUnavailable`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import StateUnavailable
from ..llm.limiter import MIN_RPM, RateMeter
from .url import StateURL

if TYPE_CHECKING:
    import redis

__all__ = ["GIVE_UP_S", "IDLE_TTL_MS", "PREFIX", "RedisRate", "RedisRates", "open_rates"]

log = logging.getLogger("conductor")

#: Every key this module writes starts with it.
PREFIX = "conductor:rate:"
#: A key's state unused this long is dropped (its rate starts again as stated).
IDLE_TTL_MS = 600_000
#: How long a call waits for a server that cannot be reached before it fails.
GIVE_UP_S = 60.0
#: The longest wait between two tries of a server that cannot be reached.
MAX_BACKOFF_S = 2.0
#: How long one request to the server may take before it counts as unreachable.
SOCKET_TIMEOUT_S = 2.0

# ARGV: the rate this process states (requests a minute), the idle TTL (ms).
# Returns {admitted (1/0), microseconds to wait, generation, the rate in thousandths}.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('HMGET', KEYS[1], 'tat', 'rpm', 'gen')
local stated = tonumber(ARGV[1])
local rpm = tonumber(v[2]) or stated
if rpm > stated then rpm = stated end
local gen = tonumber(v[3]) or 0
local tat = tonumber(v[1]) or 0
if tat > now then return {0, tat - now, gen, math.floor(rpm * 1000)} end
local interval = math.floor(60000000 / rpm)
if tat < now - interval then tat = now - interval end
redis.call('HSET', KEYS[1], 'tat', string.format('%d', tat + interval), 'rpm', rpm, 'gen', gen)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, 0, gen, math.floor(rpm * 1000)}
"""

# ARGV: 'cut' or 'grow', the generation the attempt went under, the stated rate, the
# factor of a cut, the wait the reply asked for (microseconds), the idle TTL (ms), the
# lowest rate.  Returns the rate now, in thousandths of a request a minute.
_FEEDBACK = """
local v = redis.call('HMGET', KEYS[1], 'rpm', 'gen', 'tat')
local stated = tonumber(ARGV[3])
local rpm = tonumber(v[1]) or stated
local gen = tonumber(v[2]) or 0
if ARGV[1] == 'cut' then
  if tonumber(ARGV[2]) == gen then
    gen = gen + 1
    rpm = math.max(tonumber(ARGV[7]), rpm * tonumber(ARGV[4]))
  end
  local wait = tonumber(ARGV[5])
  if wait > 0 then
    local t = redis.call('TIME')
    local hold = tonumber(t[1]) * 1000000 + tonumber(t[2]) + wait
    if (tonumber(v[3]) or 0) < hold then
      redis.call('HSET', KEYS[1], 'tat', string.format('%d', hold))
    end
  end
else
  rpm = math.min(stated, rpm + 1)
end
redis.call('HSET', KEYS[1], 'rpm', rpm, 'gen', gen)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return math.floor(rpm * 1000)
"""


class RedisRates:
    """A :class:`~conductor.llm.limiter.RateSource` on the server at ``url``: the
    rates it makes share one connection, and one lost/back state for the log.
    ``give_up_s`` bounds how long a call waits for a lost server; ``sleep`` is what
    every wait uses."""

    def __init__(
        self,
        url: StateURL,
        *,
        give_up_s: float = GIVE_UP_S,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        client: redis.Redis | None = None,
    ) -> None:
        import redis as redis_lib

        self.where = url.public
        self.give_up_s = give_up_s
        self.sleep = sleep
        self._errors: tuple[type[BaseException], ...] = (
            redis_lib.ConnectionError,
            redis_lib.TimeoutError,
            OSError,
        )
        self._redis = client or redis_lib.Redis.from_url(
            url.url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
        )
        # Script objects send EVALSHA, and EVAL again when a restarted server lost them.
        self.admit_script = self._redis.register_script(_ADMIT)
        self.feedback_script = self._redis.register_script(_FEEDBACK)
        self._lock = threading.Lock()
        self._lost = False

    def __call__(self, key: str, rpm: float) -> RateMeter:
        return RedisRate(self, key, rpm)

    def _down(self, exc: BaseException) -> None:
        with self._lock:
            first, self._lost = not self._lost, True
        if first:
            log.warning(
                "the request rates on the state server at %s cannot be reached (%s): "
                "no call is sent until it answers (at most %g s)",
                self.where,
                type(exc).__name__,
                self.give_up_s,
            )

    def _up(self) -> None:
        if self._lost:
            with self._lock:
                back, self._lost = self._lost, False
            if back:
                log.warning("the request rates on the state server at %s are back", self.where)

    async def run(self, script: Any, key: str, args: list[Any]) -> Any:
        """``script`` run on ``key``'s hash; while the server cannot be reached it is
        tried again, backing off, until :attr:`give_up_s` has passed."""
        delay = 0.05
        deadline: float | None = None
        while True:
            try:
                result = script(keys=[PREFIX + key], args=args)
            except self._errors as exc:
                self._down(exc)
                now = time.monotonic()
                deadline = now + self.give_up_s if deadline is None else deadline
                if now >= deadline:
                    raise StateUnavailable(
                        f"the state server at {self.where}, which keeps the request rate "
                        f"of {key}, could not be reached for {self.give_up_s:g} s, so the "
                        "call was not sent",
                        where=self.where,
                    ) from None
                await self.sleep(min(delay, deadline - now))
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            self._up()
            return result

    def tell(self, key: str, args: list[Any]) -> int | None:
        """The feedback script run once; a server that cannot be reached loses the
        signal (what is limited is admission, which waits for the server)."""
        try:
            return int(self.feedback_script(keys=[PREFIX + key], args=args))
        except self._errors as exc:
            self._down(exc)
            return None

    def close(self) -> None:
        self._redis.close()


class RedisRate:
    """One key's rate on the server (a :class:`~conductor.llm.limiter.RateMeter`).
    This process's attempts ask the server one at a time: the others wait their turn
    here rather than polling the server each."""

    def __init__(self, rates: RedisRates, key: str, rpm: float, *, decrease: float = 0.5) -> None:
        self.key = key
        self.ceiling = max(MIN_RPM, rpm)
        self.decrease = decrease
        #: The rate as this process last heard it from the server.
        self.rpm = self.ceiling
        self._rates = rates
        self._turn = asyncio.Lock()

    def lower(self, rpm: float) -> None:
        self.ceiling = min(self.ceiling, max(MIN_RPM, rpm))

    async def admit(self) -> int:
        rates = self._rates
        async with self._turn:
            while True:
                admitted, wait_us, generation, rpm = await rates.run(
                    rates.admit_script, self.key, [repr(self.ceiling), IDLE_TTL_MS]
                )
                # Another process's cut is heard here, so this one grows it back too.
                self.rpm = int(rpm) / 1000
                if int(admitted):
                    return int(generation)
                await rates.sleep(int(wait_us) / 1e6)

    def feedback(self, generation: int, *, rate_limited: bool, wait_s: float | None) -> None:
        if not rate_limited and self.rpm >= self.ceiling:
            return  # nothing to grow back: no round trip
        wait_us = int((wait_s or 0.0) * 1e6) if rate_limited else 0
        kind = "cut" if rate_limited else "grow"
        args = [kind, generation, repr(self.ceiling), repr(self.decrease), wait_us]
        now = self._rates.tell(self.key, [*args, IDLE_TTL_MS, repr(MIN_RPM)])
        if now is not None:
            self.rpm = now / 1000


def open_rates(url: StateURL | None) -> RedisRates | None:
    """The request rates of a command given ``--state URL`` (shared by every process on
    that server), or None: each process keeps its own."""
    return None if url is None else RedisRates(url)
