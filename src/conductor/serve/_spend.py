"""A key's budget (``max_calls``, ``max_usd`` in the keys file), held by reservation.

A request is admitted by holding the worst case of its first plan against its key's
budget (:func:`first_plan`: the calls its strategy plans at the most steps it allows,
each at the dearest target that may make it, once for each of the request's ``n``
runs).  From then on the request holds each plan before the plan's first call
(:class:`Reservation`, the request's :class:`~conductor.steps.PlanHold`): a Conductor
try, and, once the Conductor has written a workflow, every step of it (a baseline's
fixed steps likewise), each call at its own target's price with a prompt of every byte
the client sent plus the templates plus the whole answer of every call held before it,
and an answer of the target's ``max_tokens``; never more calls than the request has
left.  What the admission held is drawn on first, so a plan within it holds nothing
more.  Tokens are counted as bytes (a token is at least one), so no plan can spend
past its hold.  A key with a USD budget may not call a model whose price is not known
(400 ``price_unknown``): no hold could bound it.

A request whose first plan does not fit under what the key has spent and holds is
refused (429) before anything is asked.  A plan that does not fit is not run: its
steps are recorded skipped with the reason, a request left without an answer ends
with that 429, and one that has an answer (an earlier round's) is answered with it.
When a request ends (answered, failed, cancelled, its client gone) its hold is
settled to what it spent.  Holding per plan rather than per request's call ceiling
keeps the budget for the calls requests really plan, so many more of them run at once
under one cap.

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
from collections.abc import Sequence
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
    "answer_tokens",
    "call_usd",
    "first_plan",
    "unpriced",
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


def call_usd(target: Worker, prompt_tokens: int) -> float | None:
    """The most one call of ``target`` can cost with a prompt of ``prompt_tokens``
    and an answer of its ``max_tokens``; ``None`` when its price is not known."""
    price = price_for(target)
    if price is None:
        return None
    answer = answer_tokens(target)
    return (prompt_tokens * price.input_per_mtok + answer * price.output_per_mtok) / 1e6


def answer_tokens(target: Worker) -> int:
    """The most tokens one answer of ``target`` may have."""
    return int(target.params.get("max_tokens") or DEFAULT_MAX_TOKENS)


def unpriced(strategy: Strategy) -> Worker | None:
    """The first target ``strategy`` may call whose price is not known (a USD hold
    without it would be a guess), or ``None``."""
    return next((t for t in strategy.targets if price_for(t) is None), None)


def first_plan(strategy: Strategy, question: str, sent_bytes: int) -> list[Worker]:
    """The target of each call a run of ``question`` may make before anything it is
    told changes its plan, at its largest: the calls ``strategy`` plans for the most
    steps it allows (a Conductor's rounds each at its ``max_steps``, a baseline's fixed
    steps), each at the dearest target that may make it; one call at the dearest target
    where the strategy cannot say."""
    prompt = sent_bytes + PROMPT_ALLOWANCE

    def dearest(targets: Sequence[Worker]) -> Worker:
        return max(targets, key=lambda t: call_usd(t, prompt) or 0.0)

    planned = strategy.planned_calls(question, workflow_steps=_MOST_STEPS)
    if planned is None or not planned.calls:
        return [dearest(strategy.targets)]
    return [dearest([share.target for share in call.shares]) for call in planned.calls]


#: More steps than any workflow may have: a plan at its strategy's own most.
_MOST_STEPS = 1 << 20


@dataclass
class Reservation:
    """One request's hold on its key's budget, grown plan by plan (it is the request's
    :class:`~conductor.steps.PlanHold`); :meth:`close` settles it (once) to what
    ``budget`` counted.

    Admitted, a request holds its :func:`first_plan`; each plan then holds its calls'
    worst case before the first of them is made, less what the admission held and no
    plan used yet (a plan larger than the largest one foreseen, a Conductor asked again
    or an answer asked again in its format, grows the hold).  A call's prompt is counted
    as every byte the client sent, plus the templates, plus the whole answer of every
    call held before it in this request (the most any step can be shown).
    """

    spending: Spending
    key: ApiKey
    id: str
    budget: Budget
    sent_bytes: int
    #: Held at admission and not yet taken by a plan.
    credit_calls: int = 0
    credit_nusd: int = 0
    #: The answer tokens of every call held so far (what a later prompt may include).
    answers: int = 0
    #: Why a plan was refused, as the error the request ends with when nothing was
    #: answered (``None``: none was).
    refused: ApiError | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def owner(self) -> str:
        return owner_of(self.key)

    def worst(self, calls: Sequence[Worker], most: int | None, answers: int) -> tuple[int, int]:
        """The calls and nano-dollars ``calls`` may spend (no more than ``most`` of
        them, the dearest), after calls whose answers add up to ``answers`` tokens."""
        costs = []
        for target in calls:
            # A key without a USD cap may call a model of unknown price: only calls count.
            costs.append(call_usd(target, self.sent_bytes + PROMPT_ALLOWANCE + answers) or 0.0)
            answers += answer_tokens(target)
        if most is not None:
            costs = sorted(costs, reverse=True)[: max(0, most)]
        return len(costs), nano_usd(sum(costs))

    async def hold(self, calls: Sequence[Worker], most: int | None) -> str | None:
        if self._closed:
            # Settled already (its client gone): a hold now would never be settled.
            return "the request has ended"
        want_calls, want_nusd = self.worst(calls, most, self.answers)
        self.answers += sum(answer_tokens(t) for t in calls)
        take_calls = min(self.credit_calls, want_calls)
        take_nusd = min(self.credit_nusd, want_nusd)
        self.credit_calls -= take_calls
        self.credit_nusd -= take_nusd
        more_calls, more_nusd = want_calls - take_calls, want_nusd - take_nusd
        if not (more_calls or more_nusd):
            return None
        what = f"this request's next {plural(want_calls, 'call')}"
        try:
            await self.spending.hold(self.key, self.id, more_calls, more_nusd, what)
        except ApiError as exc:
            self.refused = exc
            return exc.message
        return None

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
        self,
        key: ApiKey | None,
        strategy: Strategy,
        budget: Budget,
        question: str,
        sent_bytes: int,
        runs: int = 1,
    ) -> Reservation | None:
        """Hold the first plan of each of the request's ``runs`` against ``key``'s
        budget (``None``: the key has none) and make the reservation ``budget``'s
        holder, so each plan is held as it is written; or refuse it: :class:`ApiError`
        429 over budget, 503 when the budget cannot be checked, 400 for a model whose
        price a USD budget cannot see."""
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
        unknown = unpriced(strategy)
        if unknown is not None and key.max_usd is not None:
            raise ApiError(
                400,
                f"the API key {key.name!r} has a USD budget, and the price of "
                f"{unknown.model!r} ({target_name(unknown.id)}) is not known, so this "
                "request's cost cannot be held against it; set price: for it in the pool "
                "file",
                param="model",
                code="price_unknown",
            )
        reservation = Reservation(self, key, uuid.uuid4().hex, budget, sent_bytes)
        first = first_plan(strategy, question, sent_bytes) * runs
        calls, nusd = reservation.worst(first, budget.max_calls, 0)
        await self.hold(key, reservation.id, calls, nusd, "its first plan")
        reservation.credit_calls, reservation.credit_nusd = calls, nusd
        budget.holder = reservation
        return reservation

    async def hold(self, key: ApiKey, reservation: str, calls: int, nusd: int, what: str) -> None:
        """Add ``calls`` and ``nusd`` to ``reservation``'s hold on ``key``'s budget (for
        ``what``, as a refusal says), or raise the :class:`ApiError` that refuses it."""
        max_nusd = None if key.max_usd is None else nano_usd(key.max_usd)
        try:
            held = await self.budgets.reserve(
                owner_of(key), reservation, calls, nusd, key.max_calls, max_nusd
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
                f"progress, and {what} would need {plural(calls, 'more call')}",
                type="insufficient_quota",
                code="insufficient_quota",
                headers=_FINAL,
            )
        if held.refused == "usd":
            raise ApiError(
                429,
                f"the API key {key.name!r} has ${key.max_usd:.6f} in its budget, "
                f"${held.nusd / NANO:.6f} spent and ${held.held_nusd / NANO:.6f} held by "
                f"requests in progress, and {what} may cost up to ${nusd / NANO:.6f} more",
                type="insufficient_quota",
                code="insufficient_quota",
                headers=_FINAL,
            )

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
