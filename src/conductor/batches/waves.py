"""Provider batch calls in workflow waves, written down before they are sent.

A ``bench --batch`` run sends the calls of batch-capable workers through their
provider's batch API (:mod:`conductor.batches.api`) at half the live price.  A batch
takes minutes to hours, so what matters is how many *rounds* a run needs, not how many
calls: :class:`WaveBatcher` holds each call until every sample in flight waits on one
(the samples are *parked*) and no batch is out, then sends all the held calls at once,
one batch per target (its provider key and model), cut only where the provider's limits
say.  Every question's Conductor plan is therefore the first wave; a step joins the
wave after the answers it may see; recursion rounds and re-asks are later waves.  A run
takes as many rounds as its deepest workflow has waves, however many questions it has.
Waves are kept whole on purpose: sending the answers of a quick batch on at once would
split every later wave in two, and a provider answers a batch in about the same time
whatever its size.

A sample also making a live call (a local worker, a worker with ``batch: false``) is not
parked while that call runs: the wave waits the seconds it takes, so the next step of
that sample is not a whole round late.  Samples enter and leave through a
:class:`SampleTicket`; a ticket's calls are found through the running task's context,
which the steps a sample runs side by side inherit.

Nothing is paid for twice or lost:

- each submission is written to the run directory (:class:`~conductor.runs.batches.
  BatchJournal`) before it is sent, and its batch id as soon as it is known;
- a batch's answers go into the call cache (and the cache is flushed) before the batch
  is marked collected, so a resumed run finds them there;
- a resumed run polls the batches still in flight instead of sending their calls again
  (:meth:`WaveBatcher.start`): a sample that asks for a call one of them holds waits
  for that batch;
- a line the provider did not answer (an expired or cancelled batch, an error a retry
  may help) goes into the next wave, up to :data:`LINE_RETRIES` more times; after that,
  or when a target's batch API refuses batches for good (a server without one), the
  call is made live (:class:`SendLive`, which :class:`~conductor.llm.caller.ModelCaller`
  answers by calling the model itself).  A line that failed for good (a bad request)
  fails as the live call would have.

The one gap: a process killed after a batch was sent and before its id was written
down.  The next run looks the batch up by its label where the provider lists batches
with one (OpenAI's metadata, Gemini's display name); Anthropic's keep none, so there
those calls are sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import BadResponseError, ModelCallError, RetryableError, UsageError, target_name
from ..llm.batcher import BatchAnswer, SendLive
from ..llm.keys import KnownSecrets
from ..llm.replies import check_reply
from ..llm.types import ModelRequest, RawCompletion
from .api import BatchAPI, BatchEntry, BatchStatus, LineOutcome

if TYPE_CHECKING:
    from ..llm.cache import ResponseCache
    from ..targets import Worker

__all__ = [
    "LINE_RETRIES",
    "POLL_ENV",
    "BatchBoard",
    "BatchPoll",
    "BatchView",
    "Journal",
    "JournalEntry",
    "SampleTicket",
    "WaveBatcher",
    "check_batch_targets",
]

log = logging.getLogger("conductor")

#: How many more waves a line the provider did not answer is sent in before it is made
#: live: an expired batch usually means a provider short of capacity, and the next
#: batch of the same calls often finishes.
LINE_RETRIES = 2

#: Loop turns a wave waits, once every sample is parked, for calls that are on their
#: way (two steps a workflow runs side by side reach the batcher a turn apart).
SETTLE_TURNS = 8

#: Reads of a batch whose reply cannot be read, in a row, before its calls are made
#: live: a body no reader foresaw does not mend by waiting.
UNREADABLE_READS = 5

_T = TypeVar("_T")

#: The variable that sets the seconds between reads of a batch's status (a fixed
#: wait; unset: :class:`BatchPoll`'s growing one).
POLL_ENV = "CONDUCTOR_BATCH_POLL_S"


def check_batch_targets(targets: Iterable[Worker]) -> None:
    """Refuse a ``batch: true`` on a worker whose client has no batch API, naming it."""
    from ..llm.factory import batch_protocol

    for target in targets:
        if target.batch and batch_protocol(target) is None:
            raise UsageError(
                f"{target_name(target.id)} sets batch: true, but its client "
                f"({target.client or 'litellm'} with model {target.model!r}) has no batch "
                "API; use client: openai, anthropic or google (or a litellm model named "
                "openai/, anthropic/ or gemini/), or remove batch: true"
            )


class JournalEntry(Protocol):
    """One submission as a journal tells it (:class:`~conductor.runs.batches.
    JournalBatch` is the run directory's)."""

    @property
    def label(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def wave(self) -> int: ...
    @property
    def custom_ids(self) -> tuple[str, ...]: ...
    @property
    def batch_id(self) -> str | None: ...


class Journal(Protocol):
    """Where the batches of a run are written down before and after they are sent: a
    bench's is its run directory's ``batches.jsonl``
    (:class:`~conductor.runs.batches.BatchJournal`, a floor above this one).  Writes
    raise ``OSError``."""

    @property
    def waves(self) -> int: ...
    def in_flight(self) -> Sequence[JournalEntry]: ...
    def intent(self, label: str, target: str, model: str, wave: int, ids: list[str]) -> None: ...
    def submitted(self, label: str, batch_id: str) -> None: ...
    def collected(self, label: str, state: str, succeeded: int, failed: int) -> None: ...
    def abandoned(self, label: str, reason: str) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class BatchPoll:
    """How often a batch in flight is asked about: ``first_s`` after it is sent, then
    each wait ``growth`` times longer, up to ``max_s``."""

    first_s: float = 5.0
    growth: float = 1.5
    max_s: float = 60.0

    @classmethod
    def from_env(cls) -> BatchPoll:
        """The default, or a fixed wait set by :data:`POLL_ENV` (tests and impatient
        users of a local batch server)."""
        text = os.environ.get(POLL_ENV, "").strip()
        if not text:
            return cls()
        try:
            wait = float(text)
        except ValueError:
            raise UsageError(f"{POLL_ENV}={text!r} is not a number of seconds") from None
        if not wait > 0:
            raise UsageError(f"{POLL_ENV}={text!r} must be more than 0 seconds")
        return cls(first_s=wait, growth=1.0, max_s=wait)

    def waits(self) -> Iterator[float]:
        wait = self.first_s
        while True:
            yield wait
            wait = min(self.max_s, wait * self.growth)


@dataclass(frozen=True)
class BatchView:
    """One batch in flight, for a progress display: ``status`` is ``None`` until its
    first read."""

    label: str
    target: str
    wave: int
    lines: int
    status: BatchStatus | None


@dataclass(frozen=True)
class BatchBoard:
    """Where the run's batches stand: the last wave sent (``-1``: none yet), batches
    this invocation sent, those in flight, calls held for the next wave and calls made
    live instead."""

    wave: int
    sent: int
    in_flight: tuple[BatchView, ...]
    held: int
    live: int = 0


class SampleTicket:
    """A sample's place among those a wave waits for: taken when the sample is
    dispatched (so a wave never leaves before a sample that has not started yet),
    given back when its model calls are over.  ``waiting`` counts its calls held or
    sent in a batch, ``live`` its live calls; it is parked while it has the first and
    not the second."""

    def __init__(self, batcher: WaveBatcher) -> None:
        self._batcher: WaveBatcher | None = batcher
        self.waiting = 0
        self.live = 0

    @property
    def parked(self) -> bool:
        return self.waiting > 0 and self.live == 0

    def enter(self) -> None:
        """Make this the ticket of the calls the current task (and its children) make."""
        _current.set(self)

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Parked while the block runs: what it waits for needs the other samples to
        move first (the dispatcher waiting for a free slot)."""
        batcher = self._batcher
        if batcher is None:
            yield
            return
        batcher._move(self, waiting=+1)
        try:
            yield
        finally:
            batcher._move(self, waiting=-1)

    def release(self) -> None:
        """This sample makes no more calls (given back once; later calls are no-ops)."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher._leave(self)


_current: ContextVar[SampleTicket | None] = ContextVar("conductor_batch_ticket", default=None)


@dataclass
class _Line:
    """One call held for, or sent in, a batch; every caller of one key shares it.
    ``waves`` counts the batches it was put in (sent or refused)."""

    key: str
    target: Worker | None
    request: ModelRequest | None
    future: asyncio.Future[BatchAnswer]
    waves: int = 0
    sent_at: float | None = None


@dataclass
class _Submission:
    label: str
    target: Worker
    wave: int
    keys: tuple[str, ...]
    batch_id: str | None = None
    status: BatchStatus | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class WaveBatcher:
    """Holds the batched calls of one bench invocation and sends them in waves.

    ``targets`` are the run's (a resumed batch names its target by id and model);
    ``journal`` the run directory's (:class:`Journal`); ``cache`` where answers are
    kept (a resume finds them there).  ``on_board`` is told each time a batch moves;
    ``gate`` is asked before each wave and returns why no more may be sent (the run's
    spend cap), which ends the sending for good: ``on_stop`` is told why, and the calls
    held wait until the run stops them.  :meth:`start` takes up the batches an earlier
    invocation left in flight; :meth:`aclose` leaves those in flight at the provider,
    for a resume.
    """

    def __init__(
        self,
        targets: Sequence[Worker],
        journal: Journal,
        cache: ResponseCache | None,
        *,
        poll: BatchPoll | None = None,
        on_board: Callable[[BatchBoard], None] | None = None,
        gate: Callable[[], str | None] | None = None,
        on_stop: Callable[[str], None] | None = None,
        api_for: Callable[[Worker], BatchAPI | None] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if api_for is None:
            from . import batch_api

            api_for = batch_api
        self._targets = {(t.id, t.model): t for t in targets}
        self._journal = journal
        self._cache = cache
        self._poll = poll or BatchPoll.from_env()
        self._notify = on_board or (lambda _b: None)
        self._gate = gate or (lambda: None)
        self._on_stop = on_stop or (lambda _r: None)
        self._api_for = api_for
        self._sleep = sleep
        self._apis: dict[tuple[str, str], BatchAPI] = {}
        self._secrets: dict[tuple[str, str], KnownSecrets] = {}
        # Targets whose batch API refused a batch for good: their calls are made live.
        self._refused: dict[tuple[str, str], str] = {}
        # Every line held or in flight, by key (the call's cache key, its custom id).
        self._lines: dict[str, _Line] = {}
        self._held: dict[tuple[str, str], list[_Line]] = {}
        self._submissions: dict[str, _Submission] = {}
        self._active = 0
        self._parked = 0
        self._wave = journal.waves
        self._sent = 0
        self._live = 0
        # A wave whose submissions a provider turned away for now (a rate limit): the
        # next one waits this long (loop time), not a turn.
        self._not_before = 0.0
        self._backoff = iter(self._poll.waits())
        self._token = secrets.token_hex(4)
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        #: Why waves are no longer sent (the gate's reason), once it said so.
        self.stopped: str | None = None

    # -- samples ---------------------------------------------------------------------

    def admit(self) -> SampleTicket:
        """A ticket for a sample about to be dispatched (or for the dispatcher)."""
        self._active += 1
        return SampleTicket(self)

    def _leave(self, ticket: SampleTicket) -> None:
        self._active -= 1
        if ticket.parked:
            self._parked -= 1
        ticket.waiting = ticket.live = 0
        self._check()

    def _move(self, ticket: SampleTicket, *, waiting: int = 0, live: int = 0) -> None:
        before = ticket.parked
        ticket.waiting += waiting
        ticket.live += live
        after = ticket.parked
        self._parked += int(after) - int(before)
        self._check()

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """Around a live call of the current sample: it is not parked meanwhile."""
        ticket = _current.get()
        if ticket is None or ticket._batcher is not self:
            yield
            return
        self._move(ticket, live=+1)
        try:
            yield
        finally:
            self._move(ticket, live=-1)

    # -- calls -----------------------------------------------------------------------

    async def call(self, target: Worker, request: ModelRequest, key: str) -> BatchAnswer:
        """The answer to ``request`` (cache key ``key``) from a batch: the one that
        already holds it, or the next wave's.  Raises the line's ``ModelCallError`` (a
        bad request fails as live), or :class:`SendLive` when it is to be made live."""
        group = (target.id, target.model)
        refused = self._refused.get(group)
        if refused is not None:
            self._live += 1
            raise SendLive(refused)
        line = self._lines.get(key)
        if line is None:
            line = _Line(key, target, request, asyncio.get_running_loop().create_future())
            self._lines[key] = line
            self._hold(line)
        elif line.request is None:
            # A line a resumed batch holds: now it can be sent again if it must be.
            line.target, line.request = target, request
        ticket = _current.get()
        own = ticket is None or ticket._batcher is not self
        if own:
            # A call outside any sample is a sample of its own.
            ticket = self.admit()
        assert ticket is not None
        self._move(ticket, waiting=+1)
        try:
            answer = await asyncio.shield(line.future)
        except SendLive:
            self._live += 1
            raise
        finally:
            if own:
                ticket.release()
            else:
                self._move(ticket, waiting=-1)
        return answer

    def _hold(self, line: _Line) -> None:
        assert line.target is not None
        self._held.setdefault((line.target.id, line.target.model), []).append(line)

    # -- waves -----------------------------------------------------------------------

    def _check(self) -> None:
        """Send the held calls once every sample in flight waits on a batch and no
        batch is out (a wave is sent whole, after the last one came back)."""
        if self._closed or self.stopped is not None or self._flusher is not None:
            return
        if not self._held or self._submissions or self._parked < self._active:
            return
        self._flusher = asyncio.get_running_loop().create_task(self._settle_and_send())

    async def _settle_and_send(self) -> None:
        try:
            for _ in range(SETTLE_TURNS):
                await asyncio.sleep(0)
            wait = self._not_before - asyncio.get_running_loop().time()
            if wait > 0:
                await self._sleep(wait)
            if self._held and not self._submissions and self._parked >= self._active:
                reason = self._gate()
                if reason is not None:
                    self.stopped = reason
                    self._on_stop(reason)
                    return
                await self._send_wave()
        except Exception as exc:  # noqa: BLE001 - a fault here must not leave samples waiting
            log.warning("sending a wave of batches failed (%r); its calls are made live", exc)
            for lines in self._held.values():
                for line in lines:
                    self._end(line, SendLive(f"sending its batch failed ({exc!r})"))
            self._held = {}
        finally:
            self._flusher = None
        self._check()

    async def _send_wave(self) -> None:
        held, self._held = self._held, {}
        wave = self._wave
        self._wave += 1
        pushed_back = False
        for lines in held.values():
            target = lines[0].target
            assert target is not None
            pushed_back |= await self._send_group(target, wave, lines)
        if pushed_back:
            loop = asyncio.get_running_loop()
            self._not_before = loop.time() + next(self._backoff)
        else:
            self._backoff = iter(self._poll.waits())
        self._board()

    async def _send_group(self, target: Worker, wave: int, lines: list[_Line]) -> bool:
        """Send ``lines`` (one target's) as this wave's batches; whether a provider
        turned a batch away for now (the next wave should wait)."""
        pushed_back = False
        try:
            api = self._api(target)
            entries = [BatchEntry(line.key, line.request) for line in lines if line.request]
            chunks = api.chunks(entries)
        except Exception as exc:  # noqa: BLE001 - no client, a line too large: made live
            self._refuse(target, exc, lines)
            return False
        for number, chunk in enumerate(chunks):
            label = f"conductor-{self._token}-w{wave}-{target.id}-{number}"[:120]
            keys = tuple(entry.custom_id for entry in chunk)
            for key in keys:
                self._lines[key].waves += 1
            try:
                # Written down before it is sent: a resume must know it may exist.
                self._journal.intent(label, target.id, target.model, wave, list(keys))
            except OSError as exc:
                self._journal_fault(exc, keys)
                return pushed_back
            try:
                batch_id = await api.submit(chunk, label=label)
            except Exception as exc:  # noqa: BLE001 - each kind is told apart below
                # A submission that failed may still have made the batch (the answer was
                # lost on its way back): look for it before sending its calls again.
                found = await self._look_up(api, label)
                if found is None:
                    with contextlib.suppress(OSError):
                        self._journal.abandoned(label, _describe(exc))
                    if not isinstance(exc, ModelCallError) or not exc.retryable:
                        # A server without a batch API, a model it will not batch: live.
                        self._refuse(target, exc, [self._lines[key] for key in keys])
                        continue
                    pushed_back = True
                    for key in keys:
                        self._retry_or_fail(self._lines[key], exc)
                    continue
                batch_id = found
            self._sent += 1
            sent_at = time.perf_counter()
            for key in keys:
                self._lines[key].sent_at = sent_at
            sub = _Submission(label, target, wave, keys, batch_id)
            self._submissions[label] = sub
            try:
                self._journal.submitted(label, batch_id)
            except OSError as exc:
                # Sent but not written down: the batch is tracked (its answers are still
                # cached), nothing more is sent.
                self._journal_fault(exc, ())
            sub.task = asyncio.get_running_loop().create_task(self._track(sub, api))
        return pushed_back

    @staticmethod
    async def _look_up(api: BatchAPI, label: str) -> str | None:
        """The id of the batch labelled ``label`` where the provider lists one (a
        failure to ask is a ``None``)."""
        try:
            return await api.find(label)
        except Exception as exc:  # noqa: BLE001 - only a hint: not found
            log.debug("looking up batch %s failed (%r)", label, exc)
            return None

    def _api(self, target: Worker) -> BatchAPI:
        group = (target.id, target.model)
        api = self._apis.get(group)
        if api is None:
            api = self._api_for(target)
            if api is None:
                raise UsageError(f"{target_name(target.id)}'s client has no batch API")
            self._apis[group] = api
        return api

    def _refuse(self, target: Worker, exc: BaseException, lines: Iterable[_Line]) -> None:
        """``target``'s batch API will not take its batches: make its calls live."""
        why = _describe(exc)
        reason = f"{target_name(target.id)}'s batch API refused a batch ({why})"
        if (target.id, target.model) not in self._refused:
            log.warning("%s; its calls are made live from now on", reason)
        self._refused[(target.id, target.model)] = reason
        for line in lines:
            self._end(line, SendLive(reason))

    # -- resume ----------------------------------------------------------------------

    async def start(self) -> None:
        """Take up the batches an earlier invocation sent and did not collect: poll
        them, and let the samples that ask for their calls wait for them."""
        loop = asyncio.get_running_loop()
        for entry in self._journal.in_flight():
            target = self._targets.get((entry.target, entry.model))
            if target is None:
                # Not among this run's targets (a changed pool): its calls run again.
                self._journal.abandoned(entry.label, "its target is not in this run's pool")
                continue
            try:
                api = self._api(target)
                batch_id = entry.batch_id
                if batch_id is None:
                    batch_id = await api.find(entry.label)
                    if batch_id is None:
                        self._journal.abandoned(
                            entry.label, "never written down as sent, and the provider lists none"
                        )
                        continue
                    self._journal.submitted(entry.label, batch_id)
            except (ModelCallError, UsageError) as exc:
                log.warning(
                    "batch %s cannot be taken up (%s); its calls are sent again", entry.label, exc
                )
                with contextlib.suppress(OSError):
                    self._journal.abandoned(entry.label, f"cannot be taken up: {exc}")
                continue
            now = time.perf_counter()
            keys = tuple(k for k in entry.custom_ids if k not in self._lines)
            for key in keys:
                self._lines[key] = _Line(key, None, None, loop.create_future(), 1, now)
            sub = _Submission(entry.label, target, entry.wave, keys, batch_id)
            self._submissions[entry.label] = sub
            sub.task = loop.create_task(self._track(sub, api))
        self._board()

    # -- batches in flight -----------------------------------------------------------

    async def _track(self, sub: _Submission, api: BatchAPI) -> None:
        """Poll ``sub`` until it ends, then hand out its answers."""
        assert sub.batch_id is not None
        waits = self._poll.waits()
        try:
            batch_id = sub.batch_id
            while True:
                status = await self._patiently(
                    "asking about", batch_id, lambda: api.status(batch_id)
                )
                if status != sub.status:
                    sub.status = status
                    self._board()
                if status.terminal:
                    break
                await self._sleep(next(waits))
            outcomes = await self._patiently("reading", batch_id, lambda: api.results(batch_id))
            await self._collect(sub, status, outcomes)
        except ModelCallError as exc:
            # Polling or reading it failed for good (a revoked key): its calls fail so.
            for key in sub.keys:
                line = self._lines.get(key)
                if line is not None:
                    self._end(line, exc)
        except Exception as exc:  # noqa: BLE001 - a reply no reader foresaw: never a hang
            log.warning(
                "batch %s could not be followed (%r); its calls are made live", sub.batch_id, exc
            )
            for key in sub.keys:
                line = self._lines.get(key)
                if line is not None:
                    self._end(line, SendLive(f"its batch could not be followed ({exc!r})"))
        finally:
            self._submissions.pop(sub.label, None)
            self._board()
            self._check()

    async def _patiently(self, what: str, batch_id: str, ask: Callable[[], Awaitable[_T]]) -> _T:
        """``ask()`` until it answers: a failure a retry may help (the provider down for
        a while) is asked again after a wait, however often, since a batch runs for
        hours; a reply that cannot be read, :data:`UNREADABLE_READS` times in a row, is
        no passing fault and is raised (the batch's calls are then made live)."""
        waits = self._poll.waits()
        unreadable = 0
        failure: ModelCallError
        while True:
            try:
                return await ask()
            except BadResponseError as exc:
                unreadable += 1
                if unreadable >= UNREADABLE_READS:
                    raise RuntimeError(
                        f"{what} batch {batch_id}: its reply could not be read "
                        f"{unreadable} times ({exc.describe()})"
                    ) from None
                failure = exc
            except RetryableError as exc:
                unreadable = 0
                failure = exc
            log.warning(
                "%s batch %s failed (%s); trying again later", what, batch_id, failure.describe()
            )
            await self._sleep(next(waits))

    async def _collect(
        self, sub: _Submission, status: BatchStatus, outcomes: list[LineOutcome]
    ) -> None:
        mine = set(sub.keys)
        answered: dict[str, RawCompletion] = {}
        failed: dict[str, ModelCallError] = {}
        for outcome in outcomes:
            key = outcome.custom_id
            if key not in mine or key in answered or key in failed:
                continue  # not ours, or a repeated line: never taken for another call
            if outcome.completion is not None:
                try:
                    answered[key] = self._checked(sub.target, outcome.completion)
                except ModelCallError as exc:
                    failed[key] = exc
            else:
                assert outcome.error is not None
                failed[key] = outcome.error.with_target(sub.target.id)
        if self._cache is not None:
            for key, raw in answered.items():
                self._cache.set(key, raw)
            # Durable before the batch is marked collected: a resume finds them there.
            await asyncio.to_thread(self._cache.flush)
        with contextlib.suppress(OSError):
            self._journal.collected(
                sub.label, status.state, len(answered), len(mine) - len(answered)
            )
        missing = RetryableError(
            f"batch {sub.batch_id} ({status.detail or status.state}) returned no answer "
            "for this call",
            target=sub.target.id,
        )
        for key in sub.keys:
            line = self._lines.get(key)
            if line is None:
                continue
            if key in answered:
                self._lines.pop(key, None)
                if not line.future.done():
                    line.future.set_result(BatchAnswer(answered[key], line.sent_at or 0.0))
            else:
                self._retry_or_fail(line, failed.get(key, missing))

    def _checked(self, target: Worker, raw: RawCompletion) -> RawCompletion:
        """The checks and masking a live reply gets (an empty reply is an error), and
        the batch flag its price and the cache go by."""
        group = (target.id, target.model)
        known = self._secrets.get(group)
        if known is None:
            known = self._secrets[group] = KnownSecrets(target)
        checked = check_reply(raw, target.id, known.values(), deterministic=False)
        return replace(checked, batch=True)

    def _retry_or_fail(self, line: _Line, exc: ModelCallError) -> None:
        """Send ``line`` in the next wave if a retry may help and it has waves left;
        after that a retryable failure is made live, any other fails the call."""
        if exc.retryable and line.request is not None and line.waves <= LINE_RETRIES:
            self._hold(line)
            self._check()
        elif exc.retryable:
            self._end(line, SendLive(f"unanswered in {line.waves} batches ({exc.describe()})"))
        else:
            self._end(line, exc)

    def _end(self, line: _Line, exc: BaseException) -> None:
        self._lines.pop(line.key, None)
        if not line.future.done():
            line.future.set_exception(exc)
            # Nobody may be waiting (a resumed batch's call no sample asked for).
            line.future.exception()

    def _journal_fault(self, exc: OSError, keys: Iterable[str]) -> None:
        """The journal cannot be written: send nothing more (a batch not written down
        could be paid twice); the calls held are made live, each its own record."""
        reason = f"the batch journal cannot be written ({exc.strerror or exc})"
        log.warning("%s; the run's calls are made live from now on", reason)
        for group in list(self._targets):
            self._refused[group] = reason
        for key in list(keys):
            line = self._lines.get(key)
            if line is not None:
                self._end(line, SendLive(reason))
        for lines in self._held.values():
            for line in lines:
                self._end(line, SendLive(reason))
        self._held = {}

    # -- progress and shutdown -------------------------------------------------------

    def board(self) -> BatchBoard:
        """Where the run's batches stand now."""
        views = tuple(
            BatchView(s.label, s.target.id, s.wave, len(s.keys), s.status)
            for s in self._submissions.values()
        )
        held = sum(len(lines) for lines in self._held.values())
        return BatchBoard(self._wave - 1, self._sent, views, held, self._live)

    def _board(self) -> None:
        self._notify(self.board())

    @property
    def sent(self) -> int:
        """Batches this invocation sent."""
        return self._sent

    @property
    def in_flight(self) -> int:
        """Batches sent (by this invocation or an earlier one) and not yet collected."""
        return len(self._submissions)

    async def aclose(self) -> None:
        """Stop polling and close connections.  Batches in flight keep running at the
        provider: the journal says where, and a resume collects them."""
        self._closed = True
        tasks = [s.task for s in self._submissions.values() if s.task is not None]
        if self._flusher is not None:
            tasks.append(self._flusher)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for api in self._apis.values():
            with contextlib.suppress(Exception):
                await api.aclose()
        self._apis = {}
        self._journal.close()


def _describe(exc: BaseException) -> str:
    return exc.describe() if isinstance(exc, ModelCallError) else repr(exc)
