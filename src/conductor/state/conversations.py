"""Stored Responses conversations on a state server, so that a follow-up
(``previous_response_id``) may reach any replica, and outlive the process that answered.

One hash per response, ``conductor:resp:<id>``, with ``owner`` (the identity of the key
that made it, never its token) and ``body`` (JSON: what the server needs to answer a
retrieve, a list of input items or a follow-up), expiring after the server's retention
time.  The store compares owners itself: a read or delete by another owner finds
nothing, exactly as for an id never stored.  It knows nothing of the Responses API's
shapes; ``conductor.serve`` owns those.

Reads and deletes that cannot reach the server raise
:class:`~conductor.errors.StateUnavailable` (the caller answers 503: "not found"
would be a lie); a keep that cannot is logged and lost (the answer has been given).
"""

from __future__ import annotations

import contextlib
import hmac
import json
from typing import Any

from ..errors import StateUnavailable
from .shared import PREFIX, SharedServer

__all__ = ["MAX_CONVERSATION_BYTES", "RedisConversations"]

_KEY = PREFIX + "resp:"
#: The most bytes one stored conversation is read at: a value past it (written by
#: something else) is not found rather than this process's memory.
MAX_CONVERSATION_BYTES = 64 << 20

# Deleted only when the owner matches, in one step on the server.
_DELETE = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class RedisConversations:
    """The conversations store of ``conductor serve --state`` (see the module docstring)."""

    def __init__(self, server: SharedServer) -> None:
        self.server = server

    async def get(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """The body kept for ``response_id`` if ``owner`` made it, else ``None``."""
        read = self.server.client.hmget(_KEY + response_id, ["owner", "body"])
        found = await self.server.ask(read)  # type: ignore[arg-type]
        kept_owner, body = found
        if kept_owner is None or body is None:
            return None
        if not hmac.compare_digest(bytes(kept_owner), owner.encode()):
            return None
        if len(body) > MAX_CONVERSATION_BYTES:
            return None
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    async def keep(self, response_id: str, owner: str, body: dict[str, Any], keep_s: float) -> None:
        """Keep ``body`` for ``keep_s`` seconds; a server that cannot be reached is logged
        (once) and the body is not kept."""
        blob = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        key = _KEY + response_id
        pipe = self.server.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"owner": owner, "body": blob})
        pipe.pexpire(key, max(1, int(keep_s * 1000)))
        with contextlib.suppress(StateUnavailable):  # logged; a follow-up finds nothing
            await self.server.ask(pipe.execute())

    async def delete(self, response_id: str, owner: str) -> bool:
        """Forget ``response_id`` if ``owner`` made it: whether it did."""
        script = self.server.client.eval(_DELETE, 1, _KEY + response_id, owner)
        return bool(await self.server.ask(script))  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.server.aclose()
