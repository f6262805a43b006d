"""A key's budget (``max_calls``, ``max_usd`` in the keys file), held by reservation.

Before a request's first call, its worst case is reserved against its key's budget
(:func:`worst_case`): every call its budget allows (``--max-calls-per-request`` or its
``conductor.max_calls``, and never more than its key's ``max_calls``), each at the
dearest target it may call, a prompt of every byte the client sent plus the templates
plus every earlier call's whole answer, and an answer of the target's ``max_tokens``.
Tokens are counted as bytes (a token is at least one), so no run can spend past it.  A
key with a USD budget may not call a model whose price is not known (400
``price_unknown``): its worst case cannot be bounded.  A request whose worst case does
not fit under what the key has spent and holds is refused (429) before anything is
asked; when it ends (answered, failed, cancelled, its client gone) the reservation is
settled to what it spent.
Reserving and settling are each one step of the store (:mod:`._stores`), so concurrent
requests, on one replica or many, cannot together spend past the cap.

A state server that cannot be reached refuses the requests of keys with a budget (503):
a budget that cannot be checked is not spent.  Keys without one are not held back.  So
does one that answers but holds no record of the budgets (restarted without its data:
:class:`~conductor.state.budgets.BudgetsLost`), until an operator starts them afresh
(``conductor serve --new-budgets``); the loss is one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

from ..errors import StateUnavailable, target_name
from ..llm.cost import price_for
from ..state.budgets import NANO, BudgetsLost, nano_usd
from ..steps import Budget
from ..strategies import Strategy
from ..targets import Worker
from ..text import plural
from ._keys import ApiKey
from ._protocol import ApiError
from ._stores import KeyBudgets, owner_of

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "NEW_BUDGETS",
    "PROMPT_ALLOWANCE",
    "Reservation",
    "Spending",
    "worst_case",
]

log = logging.getLogger("conductor")

#: What an operator does to start the budgets afresh on a state server without them.
NEW_BUDGETS = (
    "restart a `conductor serve --state` with --new-budgets, which starts every key's "
    "budget from zero (what was spent before is forgotten)"
)

#: A budget spent stays spent: the openai SDK, told so, does not send the request again.
_FINAL = {"x-should-retry": "false"}
#: The answer tokens counted for a target whose pool sets no ``max_tokens``.
DEFAULT_MAX_TOKENS = 16384
#: The tokens of the templates a step's prompt adds to what the client sent.
PROMPT_ALLOWANCE = 8192


def worst_case(strategy: Strategy, sent_bytes: int, max_calls: int) -> float | Worker:
    """The most USD ``max_calls`` calls of ``strategy`` can cost for a request of
    ``sent_bytes`` (see the module docstring), or the first target whose price is not
    known (a worst case without it would be a guess)."""
    dearest = 0.0
    for target in strategy.targets:
        price = price_for(target)
        if price is None:
            return target
        answer = int(target.params.get("max_tokens") or DEFAULT_MAX_TOKENS)
        prompt = sent_bytes + PROMPT_ALLOWANCE + (max_calls - 1) * answer
        cost = (prompt * price.input_per_mtok + answer * price.output_per_mtok) / 1e6
        dearest = max(dearest, cost)
    return max_calls * dearest


@dataclass
class Reservation:
    """One request's hold on its key's budget; :meth:`close` settles it (once) to what
    ``budget`` counted."""

    spending: Spending
    owner: str
    id: str
    budget: Budget
    _closed: bool = field(default=False, repr=False)

    async def settle(self) -> None:
        """Settle now: a request that ends normally does before its answer is sent, so
        the client's next request, on any replica, finds the hold given back."""
        if not self._closed:
            await self.spending.settle_now(self)
            # Only once it is done: cancelled halfway, close() settles again (the
            # store's settle does nothing for a reservation already settled).
            self._closed = True

    def close(self) -> None:
        """Settle in the background (a request cancelled, its client gone), unless
        settled already."""
        if self._closed:
            return
        self._closed = True
        self.spending.settle_soon(self)


class Spending:
    """The reservations of one server, on its :class:`~._stores.KeyBudgets`."""

    def __init__(self, budgets: KeyBudgets) -> None:
        self.budgets = budgets
        self._settling: set[asyncio.Task[None]] = set()
        # Whether the record's loss has been logged (once, again after it is back).
        self._lost_logged = False

    async def reserve(
        self, key: ApiKey | None, strategy: Strategy, budget: Budget, sent_bytes: int
    ) -> Reservation | None:
        """Hold the request's worst case against ``key``'s budget (``None``: the key has
        none), or refuse it: :class:`ApiError` 429 over budget, 503 when the budget
        cannot be checked."""
        if key is None or not key.has_budget:
            return None
        if budget.max_calls is None:
            raise ApiError(
                429,
                f"the API key {key.name!r} has a budget, and a request without a call "
                "ceiling could pass it: set conductor.max_calls",
                type="insufficient_quota",
                code="insufficient_quota",
                headers=_FINAL,
            )
        if key.max_calls is not None and key.max_calls < budget.max_calls:
            # A request may make no more calls than its key ever may.
            budget.max_calls = key.max_calls
        calls = budget.max_calls
        usd = worst_case(strategy, sent_bytes, calls)
        if not isinstance(usd, float):
            if key.max_usd is not None:
                raise ApiError(
                    400,
                    f"the API key {key.name!r} has a USD budget, and the price of "
                    f"{usd.model!r} ({target_name(usd.id)}) is not known, so this "
                    "request's cost cannot be held against it; set price: for it in "
                    "the pool file",
                    param="model",
                    code="price_unknown",
                )
            usd = 0.0  # only calls are capped
        owner = owner_of(key)
        reservation = uuid.uuid4().hex
        max_nusd = None if key.max_usd is None else nano_usd(key.max_usd)
        try:
            held = await self.budgets.reserve(
                owner, reservation, calls, nano_usd(usd), key.max_calls, max_nusd
            )
        except BudgetsLost as exc:
            self.lost(exc)
            raise ApiError(
                503,
                f"{exc}: requests of the API key {key.name!r}, which has a budget, are "
                f"refused until an operator starts the budgets afresh: {NEW_BUDGETS}",
                type="server_error",
                code="state_unavailable",
            ) from None
        except StateUnavailable as exc:
            raise ApiError(
                503,
                f"{exc}: requests of the API key {key.name!r}, which has a budget, "
                "are refused until it answers",
                type="server_error",
                code="state_unavailable",
            ) from None
        self._lost_logged = False
        if held.refused == "calls":
            raise ApiError(
                429,
                f"the API key {key.name!r} has {plural(key.max_calls or 0, 'call')} in its "
                f"budget, {held.calls} spent and {held.held_calls} held by requests in "
                f"progress, and this request may make {plural(calls, 'call')}",
                type="insufficient_quota",
                code="insufficient_quota",
                headers=_FINAL,
            )
        if held.refused == "usd":
            raise ApiError(
                429,
                f"the API key {key.name!r} has ${key.max_usd:.6f} in its budget, "
                f"${held.nusd / NANO:.6f} spent and ${held.held_nusd / NANO:.6f} held by "
                f"requests in progress, and this request may cost up to ${usd:.6f}",
                type="insufficient_quota",
                code="insufficient_quota",
                headers=_FINAL,
            )
        return Reservation(self, owner, reservation, budget)

    async def open(self, *, new: bool) -> None:
        """At the server's start: with ``new``, make the budgets' record where the store
        has none; without, log a record that is missing.  A store that cannot be
        reached does not stop the start (keys with a budget get 503 meanwhile); with
        ``new`` it is said that the record was not made: the operator's act did not
        happen, and a later reach of the server does not make it."""
        try:
            await self.budgets.open(new=new)
        except BudgetsLost as exc:
            self.lost(exc)
        except StateUnavailable as exc:
            if new:
                log.error(
                    "--new-budgets: %s, so the budgets' record was not made: requests of "
                    "keys with a budget are refused (503) until a `conductor serve` "
                    "started with --new-budgets reaches it",
                    exc,
                )

    def lost(self, exc: BudgetsLost) -> None:
        """Log the budgets' record lost, once until it is found again."""
        if not self._lost_logged:
            self._lost_logged = True
            log.warning(
                "%s: requests of keys with a budget are refused (503); to start the "
                "budgets afresh, %s",
                exc,
                NEW_BUDGETS,
            )

    def settle_soon(self, reservation: Reservation) -> None:
        task = asyncio.ensure_future(self.settle_now(reservation))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def settle_now(self, r: Reservation) -> None:
        # A store that cannot be reached has logged it; the hold is counted as spent
        # when its lease ends.
        with contextlib.suppress(StateUnavailable):
            await self.budgets.settle(r.owner, r.id, r.budget.calls, nano_usd(r.budget.usd))

    async def aclose(self) -> None:
        """Wait for the settlements under way (a stopping server settles what ran)."""
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
