"""Where a server keeps what outlives one request: stored Responses conversations and
each key's spend.  Two seams, each with a store in this process's memory (a server
without ``--state``) and one on the state server (:mod:`conductor.state`, shared by
replicas, surviving restarts) that fits the same protocol.

Both are told who asks by :func:`owner_of`: the identity of an API key, the same in
every replica that reads the same keys file (the key object is not shared between
processes), derived from the key's token by a one-way HMAC, so the token itself is
never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from ..state.budgets import Held
from ..state.url import StateURL
from ._keys import ApiKey

__all__ = [
    "KEEP_RESPONSES_S",
    "MAX_KEPT",
    "MAX_KEPT_CHARS",
    "ConversationStore",
    "KeyBudgets",
    "MemoryBudgets",
    "MemoryConversations",
    "Stores",
    "open_stores",
    "owner_of",
]

#: How many answered conversations a server without ``--state`` keeps.
MAX_KEPT = 1024
#: The characters the kept conversations may hold in all (64 Mi).
MAX_KEPT_CHARS = 64 << 20
#: How long a stored response is kept by default (OpenAI's 30 days).
KEEP_RESPONSES_S = 30 * 24 * 3600.0


def owner_of(key: ApiKey | None) -> str:
    """The stable identity of ``key`` (``""``: the caller of a server without keys):
    a hex HMAC of its name under its token, so two keys, or one name with a new token,
    are different owners, and what is stored cannot give the token back."""
    if key is None:
        return ""
    name = b"conductor-owner:" + key.name.encode()
    return hmac.new(key.token.encode(), name, hashlib.sha256).hexdigest()


class ConversationStore(Protocol):
    """Stored responses by id, each with its owner; another owner's id is not found."""

    async def get(self, response_id: str, owner: str) -> dict[str, Any] | None: ...

    async def keep(
        self, response_id: str, owner: str, body: dict[str, Any], keep_s: float
    ) -> None: ...

    async def delete(self, response_id: str, owner: str) -> bool: ...

    async def aclose(self) -> None: ...


class KeyBudgets(Protocol):
    """Each owner's spend against its caps, by reservation (see :mod:`._spend`)."""

    async def reserve(
        self,
        owner: str,
        reservation: str,
        calls: int,
        nusd: int,
        max_calls: int | None,
        max_nusd: int | None,
    ) -> Held: ...

    async def settle(self, owner: str, reservation: str, calls: int, nusd: int) -> None: ...

    async def open(self, *, new: bool) -> None:
        """Check that the store holds the budgets' record (``new``: make one where none
        is); :class:`~conductor.state.budgets.BudgetsLost` where it does not."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class _Kept:
    owner: str
    body: dict[str, Any]
    chars: int
    until: float


class MemoryConversations:
    """The stored responses of a server without ``--state``: the last ``limit`` (the
    oldest forgotten first), at most ``max_chars`` characters of JSON in all (the newest
    is always kept), each for its retention time.  A client sending many large inputs
    cannot grow the server without bound."""

    def __init__(self, limit: int = MAX_KEPT, max_chars: int = MAX_KEPT_CHARS) -> None:
        self.limit = limit
        self.max_chars = max_chars
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._chars = 0

    async def get(self, response_id: str, owner: str) -> dict[str, Any] | None:
        found = self._kept.get(response_id)
        if found is None or not hmac.compare_digest(found.owner, owner):
            return None
        if found.until <= time.monotonic():
            self._drop(response_id)
            return None
        return found.body

    async def keep(self, response_id: str, owner: str, body: dict[str, Any], keep_s: float) -> None:
        size = len(json.dumps(body, ensure_ascii=False))
        self._drop(response_id)
        self._kept[response_id] = _Kept(owner, body, size, time.monotonic() + keep_s)
        self._chars += size
        while len(self._kept) > 1 and (
            len(self._kept) > self.limit or self._chars > self.max_chars
        ):
            _, freed = self._kept.popitem(last=False)
            self._chars -= freed.chars

    async def delete(self, response_id: str, owner: str) -> bool:
        if await self.get(response_id, owner) is None:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        old = self._kept.pop(response_id, None)
        if old is not None:
            self._chars -= old.chars

    async def aclose(self) -> None:
        pass


class MemoryBudgets:
    """The budgets of a server without ``--state``: over the process's life.  The event
    loop runs one request's check and hold without a pause between them, so this needs
    no lock (nothing here awaits)."""

    def __init__(self) -> None:
        # owner -> [calls, nusd, held calls, held nusd]
        self._totals: dict[str, list[int]] = {}
        self._held: dict[tuple[str, str], tuple[int, int]] = {}

    async def reserve(
        self,
        owner: str,
        reservation: str,
        calls: int,
        nusd: int,
        max_calls: int | None,
        max_nusd: int | None,
    ) -> Held:
        t = self._totals.setdefault(owner, [0, 0, 0, 0])
        refused = None
        if max_calls is not None and t[0] + t[2] + calls > max_calls:
            refused = "calls"
        elif max_nusd is not None and t[1] + t[3] + nusd > max_nusd:
            refused = "usd"
        if refused is None:
            # A reservation asked again grows: a request holds plan after plan.
            c, u = self._held.get((owner, reservation), (0, 0))
            self._held[owner, reservation] = (c + calls, u + nusd)
            t[2] += calls
            t[3] += nusd
        return Held(refused, t[0], t[1], t[2], t[3])

    async def settle(self, owner: str, reservation: str, calls: int, nusd: int) -> None:
        held = self._held.pop((owner, reservation), None)
        if held is None:
            return
        t = self._totals[owner]
        t[2] -= held[0]
        t[3] -= held[1]
        t[0] += calls
        t[1] += nusd

    async def open(self, *, new: bool) -> None:
        pass  # the record is this process's: it cannot be lost while it runs

    async def aclose(self) -> None:
        pass


@dataclass
class Stores:
    """A server's two stores."""

    conversations: ConversationStore
    budgets: KeyBudgets

    async def aclose(self) -> None:
        await self.conversations.aclose()
        await self.budgets.aclose()


def open_stores(state: StateURL | None) -> Stores:
    """The stores on the state server ``state`` (``redis`` imported only then), or, with
    none, in this process."""
    if state is None:
        return Stores(MemoryConversations(), MemoryBudgets())
    from ..state.budgets import RedisBudgets
    from ..state.conversations import RedisConversations
    from ..state.shared import SharedServer

    # One connection pool, and one line when the server is lost, for both.
    server = SharedServer(
        state,
        "stored responses cannot be read, and requests of keys with a budget are "
        "refused (503), until it answers",
    )
    return Stores(RedisConversations(server), RedisBudgets(server))
