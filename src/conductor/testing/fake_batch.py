"""The fake server's batch engine: what the OpenAI, Anthropic and Gemini batch routes
share (``fake_openai_batch``, ``fake_anthropic_batch``, ``fake_gemini_batch``).

A batch the server is sent becomes a :class:`FakeBatch` of :class:`BatchLine` items.
How it moves is scripted with :class:`BatchPlan` (:meth:`BatchBase.batch_script`): it
stays ``validating`` for some reads of its status, then ``in_progress`` for more reads
(or until some seconds after it was made), then ends as its plan says: ``ended`` (every
line answered), ``expired`` (only the first lines answered) or ``failed`` (refused
whole, no line answered).  A batch the client cancels is ``cancelling`` until its
status is next read, then ``cancelled``.  Only a read of one batch's status moves it
(a listing does not), so a test decides exactly when each batch ends.

Each line is answered when its batch ends, by its model's script, as a live request
would be (:meth:`~conductor.testing.FakeLLMServer.script`): a :class:`Reply` is a
result line, a :class:`Fault` an error line in the protocol's words.  Every answered
line is logged among :attr:`~conductor.testing.FakeLLMServer.requests` with its
``batch_id`` and ``custom_id`` set, so a test counts exactly which calls were paid for;
the batch API's own requests (uploads, creations, status reads, result reads, lists,
cancellations, deletions) are logged in :attr:`BatchBase.batch_calls`.  The next requests of one
operation can be made to fail with :meth:`BatchBase.batch_fault`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import FakeRequest, Fault, Protocol, Reply
from .fake_wire import request_messages

__all__ = [
    "BATCH_OPERATIONS",
    "BatchBase",
    "BatchCall",
    "BatchLine",
    "BatchOperation",
    "BatchPlan",
    "FakeBatch",
    "FakeBatchState",
]

#: Where a fake batch stands, in common words each protocol translates into its own.
FakeBatchState = Literal[
    "validating", "in_progress", "ended", "expired", "failed", "cancelling", "cancelled"
]
_TERMINAL: frozenset[str] = frozenset({"ended", "expired", "failed", "cancelled"})

#: The batch API's operations, as :meth:`BatchBase.batch_fault` and
#: :attr:`BatchBase.batch_calls` name them.
BatchOperation = Literal[
    "upload", "create", "status", "results", "list", "cancel", "delete", "file"
]
BATCH_OPERATIONS: tuple[BatchOperation, ...] = (
    "upload",
    "create",
    "status",
    "results",
    "list",
    "cancel",
    "delete",
    "file",
)


@dataclass(frozen=True)
class BatchPlan:
    """How the fake server runs one batch it is sent.

    The batch is ``validating`` for the first ``validating_polls`` reads of its status
    and ``in_progress`` for the next ``running_polls`` reads (with ``run_s``: until
    ``run_s`` seconds after it was made, however often it is read); the read after that
    finds it ended as ``outcome`` says:

    - ``ended``: every line answered by its model's script;
    - ``expired``: only the first ``answered`` lines answered (``None``: half of them,
      rounded down), the others left with the protocol's expired result;
    - ``failed``: refused whole (``message`` says why); no line answered.
    """

    validating_polls: int = 0
    running_polls: int = 1
    run_s: float | None = None
    outcome: Literal["ended", "expired", "failed"] = "ended"
    answered: int | None = None
    message: str = "the fake server failed this batch"


@dataclass
class BatchLine:
    """One request of a batch: its ``custom_id``, the model it names and the request
    body the line carries (in its protocol's shape).  Once the batch ends, ``outcome``
    is the model script's answer (``None``: not answered), ``usage`` its token counts
    and ``request`` the request as logged."""

    custom_id: str
    model: str
    body: dict[str, Any]
    outcome: Reply | Fault | None = None
    usage: tuple[int, int] = (0, 0)
    request: FakeRequest | None = None


@dataclass
class FakeBatch:
    """A batch as the fake server holds it.  ``label`` is the name the client gave it
    (OpenAI's metadata, Gemini's display name; ``None`` for Anthropic's, which keep
    none); ``deleted``: the client deleted it (it is no longer found or listed);
    ``extra`` holds what one protocol keeps of its own (file ids, metadata)."""

    id: str
    protocol: Protocol
    lines: list[BatchLine]
    plan: BatchPlan
    label: str | None = None
    api_key: str | None = None
    state: FakeBatchState = "validating"
    polls: int = 0
    created_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    cancel_asked: bool = False
    #: Its lines are being answered (a read meanwhile finds it still in progress).
    answering: bool = False
    deleted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in _TERMINAL

    @property
    def model(self) -> str:
        """The model of its first line (every line of one batch names one model)."""
        return self.lines[0].model if self.lines else ""

    @property
    def custom_ids(self) -> list[str]:
        return [line.custom_id for line in self.lines]

    @property
    def succeeded(self) -> int:
        return sum(isinstance(line.outcome, Reply) for line in self.lines)

    @property
    def errored(self) -> int:
        return sum(isinstance(line.outcome, Fault) for line in self.lines)

    @property
    def unanswered(self) -> int:
        """Lines with no answer: none yet, or never (expired, cancelled, failed)."""
        return sum(line.outcome is None for line in self.lines)


@dataclass(frozen=True)
class BatchCall:
    """One request of the batch API itself: its operation, protocol and path, and the
    batch it was about (``None`` for uploads, creations refused and lists)."""

    operation: BatchOperation
    protocol: Protocol
    path: str
    batch_id: str | None
    at: float


class BatchBase(ServerBase):
    """The batches a fake server was sent, how they move, and their answers."""

    def __init__(self, expected_api_key: str | None = None, latency_s: float = 0.0) -> None:
        super().__init__(expected_api_key=expected_api_key, latency_s=latency_s)
        self._batches: dict[str, FakeBatch] = {}
        self._batch_plans: list[BatchPlan] = [BatchPlan()]
        self._batch_plan_index = 0
        self._batch_faults: dict[BatchOperation, list[Fault]] = {}
        self._batch_log: list[BatchCall] = []

    # -- scripting and log (the test's side) ---------------------------------------------

    def batch_script(self, plans: BatchPlan | Sequence[BatchPlan]) -> None:
        """How the batches sent from now on run: one plan for all, or a list given to
        them in the order they are made (the last repeats)."""
        listed = [plans] if isinstance(plans, BatchPlan) else list(plans)
        if not listed:
            raise ValueError("batch_script needs at least one BatchPlan")
        with self._lock:
            self._batch_plans = listed
            self._batch_plan_index = 0

    def batch_fault(self, operation: BatchOperation, *faults: Fault) -> None:
        """Answer the next requests of ``operation`` with ``faults``, one each, in order
        (then as usual)."""
        if operation not in BATCH_OPERATIONS:
            raise ValueError(f"unknown batch operation {operation!r}")
        with self._lock:
            self._batch_faults.setdefault(operation, []).extend(faults)

    @property
    def batches(self) -> list[FakeBatch]:
        """Every batch the server was sent, in the order they were made (copies)."""
        with self._lock:
            return [replace(b, lines=list(b.lines)) for b in self._batches.values()]

    def batch(self, batch_id: str) -> FakeBatch:
        """The batch ``batch_id`` (a copy); ``KeyError`` when there is none."""
        with self._lock:
            b = self._batches[batch_id]
            return replace(b, lines=list(b.lines))

    @property
    def batch_calls(self) -> list[BatchCall]:
        """Every request of the batch API, in arrival order."""
        with self._lock:
            return list(self._batch_log)

    def end_batches(self) -> None:
        """Make every batch not yet ended end at the next read of its status."""
        with self._lock:
            for b in self._batches.values():
                if not b.terminal:
                    b.plan = replace(b.plan, validating_polls=0, running_polls=0, run_s=None)

    # -- the routes' side ----------------------------------------------------------------

    def _batch_routes(self, app: web.Application) -> None:
        """Add a protocol's batch routes to ``app``: each protocol's mixin adds its own
        and calls this (``super()``) first."""

    def _batch_intake(
        self,
        request: web.Request,
        protocol: Protocol,
        operation: BatchOperation,
        batch_id: str | None = None,
    ) -> tuple[str | None, web.Response | None]:
        """Log one batch API request and check its key; returns (api key, None), or
        (None, the error to answer: a wrong key, or a fault scripted for
        ``operation``)."""
        api_key = self._api_key_of(request, protocol)
        with self._lock:
            self._batch_log.append(
                BatchCall(operation, protocol, request.path, batch_id, time.time())
            )
            queued = self._batch_faults.get(operation)
            fault = queued.pop(0) if queued else None
        if self.expected_api_key is not None and api_key != self.expected_api_key:
            return None, self._error(protocol, 401, "Incorrect API key provided.", {})
        if fault is not None:
            # Batch API faults are error bodies only (no hang or reset).
            return None, self._error(protocol, fault.status or 500, fault.message, fault.headers)
        return api_key, None

    def _batch_make(
        self,
        protocol: Protocol,
        prefix: str,
        lines: list[BatchLine],
        *,
        label: str | None,
        api_key: str | None,
        extra: dict[str, Any] | None = None,
        plan: BatchPlan | None = None,
    ) -> FakeBatch:
        """A new batch of ``lines``, its id ``prefix`` + a number, given the next plan
        of the script, or ``plan`` (a batch the protocol refuses by itself, such as one
        whose input fails validation, takes none of the test's plans)."""
        with self._lock:
            if plan is None:
                index = min(self._batch_plan_index, len(self._batch_plans) - 1)
                plan = self._batch_plans[index]
                self._batch_plan_index += 1
            batch = FakeBatch(
                id=self._new_id(prefix),
                protocol=protocol,
                lines=lines,
                plan=plan,
                label=label,
                api_key=api_key,
                extra=dict(extra or {}),
            )
            self._batches[batch.id] = batch
        return batch

    def _batch_find(self, batch_id: str) -> FakeBatch | None:
        with self._lock:
            batch = self._batches.get(batch_id)
            return None if batch is None or batch.deleted else batch

    def _batch_list(self, protocol: Protocol) -> list[FakeBatch]:
        """The batches of ``protocol``, newest first (as the providers list them)."""
        with self._lock:
            return [
                b
                for b in reversed(self._batches.values())
                if b.protocol == protocol and not b.deleted
            ]

    async def _batch_poll(self, batch: FakeBatch) -> None:
        """One read of ``batch``'s status: move it on as its plan says, answering its
        lines when it ends."""
        with self._lock:
            if batch.terminal or batch.answering:
                return
            batch.polls += 1
            plan = batch.plan
            if batch.cancel_asked:
                batch.state = "cancelled"
                batch.ended_at = time.time()
                return
            if batch.polls <= plan.validating_polls:
                batch.state = "validating"
                return
            if plan.run_s is not None:
                running = time.time() < batch.created_at + plan.run_s
            else:
                running = batch.polls <= plan.validating_polls + plan.running_polls
            if running:
                batch.state = "in_progress"
                return
            outcome = plan.outcome
            # Answered before it is marked ended, once: a concurrent read finds it in
            # progress, never ended without its answers nor answered twice.
            batch.state = "in_progress"
            batch.answering = True
        if outcome == "failed":
            end_state: FakeBatchState = "failed"
        else:
            count = len(batch.lines)
            if outcome == "expired":
                count = plan.answered if plan.answered is not None else len(batch.lines) // 2
            await self._batch_answer(batch, batch.lines[:count])
            end_state = "ended" if outcome == "ended" else "expired"
        with self._lock:
            batch.state = end_state
            batch.ended_at = time.time()
            batch.answering = False

    def _batch_drop(self, batch: FakeBatch) -> None:
        """The client deletes ``batch``: it is no longer found or listed (it stays
        among :attr:`batches`, marked ``deleted``: a test still sees what was sent)."""
        with self._lock:
            batch.deleted = True

    def _batch_cancel(self, batch: FakeBatch) -> None:
        """The client asks to cancel ``batch``: ``cancelling`` until its status is read."""
        with self._lock:
            if batch.terminal or batch.answering:
                return
            batch.cancel_asked = True
            batch.state = "cancelling"

    async def _batch_answer(self, batch: FakeBatch, lines: list[BatchLine]) -> None:
        """Answer ``lines`` by their models' scripts, each logged as a request."""
        for line in lines:
            fake = FakeRequest(
                protocol=batch.protocol,
                path=f"batch:{batch.id}",
                model=line.model,
                headers={},
                body=line.body,
                messages=request_messages(batch.protocol, line.body),
                api_key=batch.api_key,
                received_at=time.monotonic(),
                batch_id=batch.id,
                custom_id=line.custom_id,
            )
            with self._lock:
                self._log.append(fake)
            outcome = await self._answer(fake)
            line.request = fake
            line.outcome = outcome
            if isinstance(outcome, Reply):
                line.usage = self._usage(fake, outcome)
