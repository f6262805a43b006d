"""Each API key's call and USD budget on a state server, shared by every replica.

A request reserves its first call, grows its reservation by each plan's worst case
before the plan's first call, and settles to what it spent when it ends. Both are one
Lua script each, so the check and the hold are one step on the server: two replicas
reserving at once cannot both fit under a cap that has room for one. Keys, per owner
(the key's identity, never its token), in one hash slot:

- ``conductor:budget:{OWNER}:t``: ``calls`` and ``nusd`` spent, ``hcalls`` and ``hnusd``
  held by reservations not yet settled;
- ``conductor:budget:{OWNER}:h``: each reservation's ``"CALLS NUSD"``, by its id;
- ``conductor:budget:{OWNER}:r``: each reservation's lease end (the server's clock).

USD is counted in whole nano-dollars (reservations and spend rounded up), so sums are
exact.  A reservation whose lease ends unsettled (its replica was killed) counts as
spent in full: the budget errs towards refusing, never towards spending past its cap.
The budget runs over the key's life on the server; deleting its keys starts it afresh.

A server that cannot be reached raises :class:`~conductor.errors.StateUnavailable`:
the caller refuses the request (fail closed).

A server restarted without its data (no persistence, flushed) has forgotten every key's
spend and every hold: counting on from there would start each budget again at zero.  So
the budgets' record has a sentinel, ``conductor:budget:record`` (a random token), made
only by :meth:`RedisBudgets.open` with ``new=True``: an operator's deliberate act
(``conductor serve --new-budgets``).  Every reserve and settle script checks it first
and, where it is missing, changes nothing and raises :class:`BudgetsLost`: a lost
record is never taken for an empty one.  (The sentinel is in another hash slot than a
key's three keys: one Redis server, not a cluster.)
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

from ..errors import StateUnavailable
from .shared import PREFIX, SharedServer

__all__ = ["NANO", "RECORD_KEY", "BudgetsLost", "Held", "RedisBudgets", "nano_usd"]

#: Nano-dollars in a dollar.
NANO = 1_000_000_000
#: The sentinel of the budgets' record (see the module docstring).
RECORD_KEY = PREFIX + "budget:record"

# KEYS[4] is always the sentinel: gone means the record was lost (nil, nothing written).
_TOTALS = """
if redis.call('EXISTS', KEYS[4]) == 0 then return false end
local function totals()
  local t = redis.call('HMGET', KEYS[1], 'calls', 'nusd', 'hcalls', 'hnusd')
  return tonumber(t[1] or 0), tonumber(t[2] or 0), tonumber(t[3] or 0), tonumber(t[4] or 0)
end
local function int(n) return string.format('%d', n) end
local now = tonumber(redis.call('TIME')[1])
local calls, nusd, hcalls, hnusd = totals()
-- Leases that ended unsettled: their whole reservation is spent.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  local held = redis.call('HGET', KEYS[2], id)
  if held then
    local c, u = string.match(held, '^(%d+) (%d+)$')
    c, u = tonumber(c), tonumber(u)
    hcalls, hnusd, calls, nusd = hcalls - c, hnusd - u, calls + c, nusd + u
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[3], id)
end
"""

_RESERVE = (
    _TOTALS
    + """
-- ARGV: id, calls, nusd, cap calls (-1: none), cap nusd (-1: none), lease seconds
local want_c, want_u = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap_c, cap_u = tonumber(ARGV[4]), tonumber(ARGV[5])
local refused = ''
if cap_c >= 0 and calls + hcalls + want_c > cap_c then
  refused = 'calls'
elseif cap_u >= 0 and nusd + hnusd + want_u > cap_u then
  refused = 'usd'
end
if refused == '' then
  -- A reservation asked again grows: a request holds plan after plan.
  local had_c, had_u = 0, 0
  local had = redis.call('HGET', KEYS[2], ARGV[1])
  if had then
    had_c, had_u = string.match(had, '^(%d+) (%d+)$')
    had_c, had_u = tonumber(had_c), tonumber(had_u)
  end
  redis.call('HSET', KEYS[2], ARGV[1], int(had_c + want_c) .. ' ' .. int(had_u + want_u))
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[1])
  hcalls, hnusd = hcalls + want_c, hnusd + want_u
end
redis.call('HSET', KEYS[1], 'calls', int(calls), 'nusd', int(nusd),
  'hcalls', int(hcalls), 'hnusd', int(hnusd))
return {refused, int(calls), int(nusd), int(hcalls), int(hnusd)}
"""
)

_SETTLE = (
    _TOTALS
    + """
-- ARGV: id, calls spent, nusd spent
local held = redis.call('HGET', KEYS[2], ARGV[1])
local settled = 0
if held then
  local c, u = string.match(held, '^(%d+) (%d+)$')
  hcalls, hnusd = hcalls - tonumber(c), hnusd - tonumber(u)
  calls, nusd = calls + tonumber(ARGV[2]), nusd + tonumber(ARGV[3])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  settled = 1
end
redis.call('HSET', KEYS[1], 'calls', int(calls), 'nusd', int(nusd),
  'hcalls', int(hcalls), 'hnusd', int(hnusd))
return settled
"""
)


def nano_usd(usd: float) -> int:
    """``usd`` in whole nano-dollars, rounded up (a sum of them never undercounts)."""
    return max(0, math.ceil(round(usd * NANO, 3)))


class BudgetsLost(StateUnavailable):
    """The state server answers but holds no record of the budgets (it restarted
    without its data, or was never opened with ``new=True``): no spend can be counted."""


@dataclass(frozen=True)
class Held:
    """What a key has spent and holds in reservations, as the server counted it when a
    reservation was asked for; ``refused`` names the cap it would pass (``"calls"``,
    ``"usd"``), or is ``None`` when the reservation was made."""

    refused: str | None
    calls: int
    nusd: int
    held_calls: int
    held_nusd: int


class RedisBudgets:
    """Per-key budgets on the state server (see the module docstring)."""

    def __init__(self, server: SharedServer, *, lease_s: float = 3600.0) -> None:
        self.server = server
        #: How long an unsettled reservation is held before it counts as spent.
        self.lease_s = lease_s

    @staticmethod
    def _keys(owner: str) -> list[str]:
        base = f"{PREFIX}budget:{{{owner}}}:"
        return [base + "t", base + "h", base + "r", RECORD_KEY]

    async def open(self, *, new: bool) -> None:
        """Check that the server holds the budgets' record (:class:`BudgetsLost` where
        not); with ``new``, make it first where there is none (every budget then starts
        from zero; a record already there is kept as it is)."""
        if new:
            make = self.server.client.set(RECORD_KEY, secrets.token_hex(16), nx=True)
            await self.server.ask(make)
        found = await self.server.ask(self.server.client.exists(RECORD_KEY))
        if not found:
            raise self._lost()

    def _lost(self) -> BudgetsLost:
        return BudgetsLost(
            f"the state server at {self.server.url.public} holds no record of the keys' "
            "budgets (it restarted without its data, or was never opened for them)",
            where=self.server.url.public,
        )

    async def reserve(
        self,
        owner: str,
        reservation: str,
        calls: int,
        nusd: int,
        max_calls: int | None,
        max_nusd: int | None,
    ) -> Held:
        """Hold ``calls`` and ``nusd`` more for ``reservation`` (new, or growing) if they
        fit under the caps with all that is spent and held."""
        args: list[str | int] = [
            reservation,
            calls,
            nusd,
            -1 if max_calls is None else max_calls,
            -1 if max_nusd is None else max_nusd,
            math.ceil(self.lease_s),
        ]
        script = self.server.client.eval(_RESERVE, 4, *self._keys(owner), *args)
        raw = await self.server.ask(script)  # type: ignore[arg-type]
        if raw is None:
            raise self._lost()
        refused, spent_c, spent_u, held_c, held_u = (
            x.decode() if isinstance(x, bytes) else str(x) for x in raw
        )
        return Held(refused or None, int(spent_c), int(spent_u), int(held_c), int(held_u))

    async def settle(self, owner: str, reservation: str, calls: int, nusd: int) -> None:
        """Release ``reservation`` and count what the request spent instead (nothing
        when its lease had ended: it was counted in full then).  :class:`BudgetsLost`
        where the record is gone (the hold went with it)."""
        script = self.server.client.eval(_SETTLE, 4, *self._keys(owner), reservation, calls, nusd)
        if await self.server.ask(script) is None:  # type: ignore[arg-type]
            raise self._lost()

    async def spent(self, owner: str) -> tuple[int, int]:
        """The calls and nano-dollars ``owner`` has spent (settled) so far."""
        read = self.server.client.hmget(self._keys(owner)[0], ["calls", "nusd"])
        raw = await self.server.ask(read)  # type: ignore[arg-type]
        return int(raw[0] or 0), int(raw[1] or 0)

    async def aclose(self) -> None:
        await self.server.aclose()
