"""Provider batch calls in workflow waves, written down before they are sent.

A ``bench --batch`` run sends the calls of batch-capable workers through their
provider's batch API (:mod:`conductor.llm.batchapi`) at half the live price.  A batch
takes minutes to hours, so what matters is how many *rounds* a run needs, not how many
calls: :class:`WaveBatcher` holds each call until every sample in flight is waiting on
one (the samples are *parked*), then sends all the held calls at once, one batch per
target (its provider key and model), cut only where the provider's limits say.  Every
question's Conductor plan is therefore the first wave; a step joins the wave after the
answers it may see, and recursion rounds and re-asks come in later waves: a run takes
about as many rounds as its deepest workflow has steps, however many questions it has.
Calls of local or non-batch workers run live meanwhile (a sample in a live call is not
parked, so the wave waits for it).

Nothing is paid for twice or lost:

- each submission is written to the run directory (:class:`~conductor.runs.batches.
  BatchJournal`) before it is sent, and its batch id as soon as it is known;
- a batch's answers go into the call cache (and the cache is flushed) before the batch
  is marked collected, so a resumed run finds them there;
- a resumed run polls the batches still in flight instead of sending their calls again:
  a sample that asks for a call one of them holds waits for that batch;
- a line the provider did not answer (an expired batch, an errored line a retry may
  help) goes into the next wave, up to :data:`LINE_RETRIES` times; after that the
  caller makes it live (:class:`~conductor.llm.caller.ModelCaller`).  A line that
  failed for good (a bad request) fails as the live call would have.

The one gap: a process killed after a batch was sent and before its id was written
down.  The next run looks the batch up by its label where the provider lists batches
with one (OpenAI's metadata, Gemini's display name); Anthropic's keep none, so there
those calls are sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ModelCallError, RetryableError, ServerError, UsageError, target_name
from .batchapi import BatchAPI, BatchEntry, BatchStatus, LineOutcome
from .keys import KnownSecrets
from .replies import check_reply
from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..runs.batches import BatchJournal
    from ..targets import Worker
    from .cache import ResponseCache

__all__ = [
    "LINE_RETRIES",
    "BatchBoard",
    "BatchPoll",
    "BatchView",
    "SampleTicket",
    "WaveBatcher",
    "batched",
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


def batched(target: Worker, flag: bool) -> bool:
    """Whether ``target``'s calls go through its provider's batch API in a bench: as its
    ``batch:`` setting says, else as ``--batch`` (``flag``) says for a client that has
    one."""
    from .factory import batch_protocol

    if target.batch is not None:
        return target.batch
    return flag and batch_protocol(target) is not None


def check_batch_targets(targets: Iterable[Worker]) -> None:
    """Refuse a ``batch: true`` on a worker whose client has no batch API, naming it."""
    from .factory import batch_protocol

    for target in targets:
        if target.batch and batch_protocol(target) is None:
            raise UsageError(
                f"{target_name(target.id)} sets batch: true, but its client "
                f"({target.client}) has no batch API; use client: openai, anthropic or "
                f"google, or remove batch: true"
            )


@dataclass(frozen=True)
class BatchPoll:
    """How often a batch in flight is asked about: ``first_s`` after it is sent, then
    each wait ``growth`` times longer, up to ``max_s``."""

    first_s: float = 5.0
    growth: float = 1.5
    max_s: float = 60.0

    def waits(self) -> Iterable[float]:
        wait = self.first_s
        while True:
            yield wait
            wait = min(self.max_s, wait * self.growth)


@dataclass(frozen=True)
class BatchView:
    """One batch in flight, for a progress display."""

    label: str
    target: str
    wave: int
    lines: int
    status: BatchStatus | None


@dataclass(frozen=True)
class BatchBoard:
    """Where the run's batches stand: the wave being sent or waited on, batches this
    run sent, those in flight, and calls held for the next wave."""

    wave: int
    sent: int
    in_flight: tuple[BatchView, ...]
    held: int


class SampleTicket:
    """A sample's place among those a wave waits for: taken when the sample is
    dispatched (so a wave never leaves before a sample that has not started yet),
    given back when its model calls are over."""

    def __init__(self, batcher: WaveBatcher) -> None:
        self._batcher: WaveBatcher | None = batcher
        self.waiting = 0

    def enter(self) -> None:
        """Make this the ticket of the calls the current task (and its children) make."""
        _current.set(self)

    def release(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher._leave(self)


_current: ContextVar[SampleTicket | None] = ContextVar("conductor_batch_ticket", default=None)


@dataclass
class _Line:
    """One call held for, or sent in, a batch; every caller of one key shares it."""

    key: str
    target: Worker | None
    request: ModelRequest | None
    future: asyncio.Future[RawCompletion]
    waves: int = 0


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

    ``targets`` are the run's (a resumed batch names its target by id); ``journal`` the
    run directory's; ``cache`` where answers are kept (required for a resume to find
    them); ``on_board`` is told each time a batch moves.  :meth:`start` takes up the
    batches an earlier invocation left in flight.
    """

    def __init__(
        self,
        targets: Sequence[Worker],
        journal: BatchJournal,
        cache: ResponseCache | None,
        *,
        poll: BatchPoll | None = None,
        on_board: Callable[[BatchBoard], None] | None = None,
        api_for: Callable[[Worker], BatchAPI | None] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if api_for is None:
            from .factory import batch_api

            api_for = batch_api
        self._targets = {(t.id, t.model): t for t in targets}
        self._journal = journal
        self._cache = cache
        self._poll = poll or BatchPoll()
        self._notify = on_board or (lambda _b: None)
        self._api_for = api_for
        self._sleep = sleep
        self._apis: dict[tuple[str, str], BatchAPI] = {}
        self._secrets: dict[tuple[str, str], KnownSecrets] = {}
        # Every line held or in flight, by key (the call's cache key, its custom id).
        self._lines: dict[str, _Line] = {}
        self._held: dict[tuple[str, str], list[_Line]] = {}
        self._submissions: dict[str, _Submission] = {}
        self._active = 0
        self._parked = 0
        self._wave = journal.waves
        self._sent = 0
        self._token = secrets.token_hex(4)
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        #: The first fault that keeps batches from being sent or written down.
        self.fault: BaseException | None = None

    # -- samples ---------------------------------------------------------------------

    def admit(self) -> SampleTicket:
        """A ticket for a sample about to be dispatched."""
        self._active += 1
        return SampleTicket(self)

    def _leave(self, ticket: SampleTicket) -> None:
        self._active -= 1
        if ticket.waiting:
            self._parked -= 1
            ticket.waiting = 0
        self._check()

    # -- calls -----------------------------------------------------------------------

    async def call(self, target: Worker, request: ModelRequest, key: str) -> RawCompletion:
        """The answer to ``request`` (cache key ``key``) from a batch: the one that
        already holds it, or the next wave's.  Raises the line's ``ModelCallError``:
        a ``RetryableError`` once the line has been in :data:`LINE_RETRIES` + 1 waves
        (the caller then makes it live)."""
        if self.fault is not None:
            raise ServerError(f"batches cannot be sent ({self.fault})", target=target.id)
        line = self._lines.get(key)
        if line is None:
            line = _Line(key, target, request, asyncio.get_running_loop().create_future())
            self._lines[key] = line
            self._hold(line)
        elif line.request is None:
            # A line a resumed batch holds: now it can be sent again if it must be.
            line.target, line.request = target, request
        ticket = _current.get()
        if ticket is None:
            # A call outside any sample is a sample of its own.
            self._active += 1
        self._park(ticket, +1)
        self._check()
        try:
            return await asyncio.shield(line.future)
        finally:
            self._park(ticket, -1)
            if ticket is None:
                self._active -= 1
            self._check()

    def _park(self, ticket: SampleTicket | None, step: int) -> None:
        if ticket is None:
            self._parked += step
            return
        before = ticket.waiting
        ticket.waiting += step
        if before == 0 and ticket.waiting > 0:
            self._parked += 1
        elif before > 0 and ticket.waiting == 0:
            self._parked -= 1

    def _hold(self, line: _Line) -> None:
        assert line.target is not None
        self._held.setdefault((line.target.id, line.target.model), []).append(line)

    # -- waves -----------------------------------------------------------------------

    def _check(self) -> None:
        """Send the held calls once every sample in flight waits on a batch."""
        if self._closed or self._flusher is not None or not self._held:
            return
        if self._parked < self._active:
            return
        self._flusher = asyncio.get_running_loop().create_task(self._settle_and_send())

    async def _settle_and_send(self) -> None:
        try:
            for _ in range(SETTLE_TURNS):
                await asyncio.sleep(0)
            if self._held and self._parked >= self._active:
                await self._send_wave()
        finally:
            self._flusher = None
        self._check()

    async def _send_wave(self) -> None:
        held, self._held = self._held, {}
        wave = self._wave
        self._wave += 1
        for (target_id, model), lines in held.items():
            target = self._targets.get((target_id, model)) or lines[0].target
            assert target is not None
            await self._send_group(target, wave, lines)
        self._board()

    async def _send_group(self, target: Worker, wave: int, lines: list[_Line]) -> None:
        try:
            api = self._api(target)
            entries = [BatchEntry(line.key, line.request) for line in lines if line.request]
            chunks = api.chunks(entries)
        except ModelCallError as exc:
            for line in lines:
                self._fail(line, exc)
            return
        for number, chunk in enumerate(chunks):
            label = f"conductor-{self._token}-w{wave}-{target.id}-{number}"[:120]
            keys = tuple(entry.custom_id for entry in chunk)
            try:
                # Written down before it is sent: a resume must know it may exist.
                self._journal.intent(label, target.id, target.model, wave, list(keys))
            except OSError as exc:
                self._stop(exc, keys)
                return
            try:
                batch_id = await api.submit(chunk, label=label)
            except ModelCallError as exc:
                with contextlib.suppress(OSError):
                    self._journal.abandoned(label, exc.describe())
                for key in keys:
                    self._retry_or_fail(self._lines[key], exc)
                continue
            self._sent += 1
            for key in keys:
                self._lines[key].waves += 1
            sub = _Submission(label, target, wave, keys, batch_id)
            self._submissions[label] = sub
            try:
                self._journal.submitted(label, batch_id)
            except OSError as exc:
                # Sent but not written down: the batch is kept, the run stops.
                self._stop(exc, ())
            sub.task = asyncio.get_running_loop().create_task(self._track(sub, api))

    def _api(self, target: Worker) -> BatchAPI:
        group = (target.id, target.model)
        api = self._apis.get(group)
        if api is None:
            api = self._api_for(target)
            if api is None:
                raise UsageError(f"{target_name(target.id)}'s client has no batch API")
            self._apis[group] = api
        return api

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
            keys = tuple(k for k in entry.custom_ids if k not in self._lines)
            for key in keys:
                self._lines[key] = _Line(key, None, None, loop.create_future(), waves=1)
            sub = _Submission(entry.label, target, entry.wave, keys, batch_id)
            self._submissions[entry.label] = sub
            sub.task = loop.create_task(self._track(sub, api))
        self._board()

    # -- batches in flight -----------------------------------------------------------

    async def _track(self, sub: _Submission, api: BatchAPI) -> None:
        """Poll ``sub`` until it ends, then hand out its answers."""
        assert sub.batch_id is not None
        waits = iter(self._poll.waits())
        try:
            while True:
                try:
                    status = await api.status(sub.batch_id)
                except RetryableError as exc:
                    log.warning("asking about batch %s failed (%s); asking again later",
                                sub.batch_id, exc.describe())
                    await self._sleep(next(waits))
                    continue
                if status != sub.status:
                    sub.status = status
                    self._board()
                if status.terminal:
                    break
                await self._sleep(next(waits))
            outcomes = await self._results(api, sub)
            await self._collect(sub, status, outcomes)
        except ModelCallError as exc:
            # Polling or reading it failed for good (a revoked key): its calls fail so.
            for key in sub.keys:
                line = self._lines.get(key)
                if line is not None:
                    self._fail(line, exc)
        finally:
            self._submissions.pop(sub.label, None)
            self._board()

    async def _results(self, api: BatchAPI, sub: _Submission) -> list[LineOutcome]:
        assert sub.batch_id is not None
        for wait in self._poll.waits():
            try:
                return await api.results(sub.batch_id)
            except RetryableError as exc:
                log.warning("reading batch %s failed (%s); reading again later",
                            sub.batch_id, exc.describe())
                await self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover - waits() never ends

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
                failed[key] = outcome.error
        if self._cache is not None:
            for key, raw in answered.items():
                self._cache.set(key, raw)
            # Durable before the batch is marked collected: a resume finds them there.
            await asyncio.to_thread(self._cache.flush)
        with contextlib.suppress(OSError):
            self._journal.collected(
                sub.label, status.state, len(answered), len(mine) - len(answered)
            )
        missing = ServerError(
            f"batch {sub.batch_id} ({status.detail or status.state}) returned no answer "
            f"for this call",
            target=sub.target.id,
        )
        for key in sub.keys:
            line = self._lines.get(key)
            if line is None:
                continue
            if key in answered:
                del self._lines[key]
                if not line.future.done():
                    line.future.set_result(answered[key])
            else:
                self._retry_or_fail(line, failed.get(key, missing))

    def _checked(self, target: Worker, raw: RawCompletion) -> RawCompletion:
        """The checks and masking a live reply gets (an empty reply is an error)."""
        group = (target.id, target.model)
        known = self._secrets.get(group)
        if known is None:
            known = self._secrets[group] = KnownSecrets(target)
        return check_reply(raw, target.id, known.values(), deterministic=False)

    def _retry_or_fail(self, line: _Line, exc: ModelCallError) -> None:
        """Send ``line`` in the next wave if a retry may help and it has waves left."""
        if exc.retryable and line.waves <= LINE_RETRIES and line.request is not None:
            self._hold(line)
            self._check()
            return
        self._fail(line, exc)

    def _fail(self, line: _Line, exc: ModelCallError) -> None:
        self._lines.pop(line.key, None)
        if not line.future.done():
            line.future.set_exception(exc)
            # Nobody may be waiting (a resumed batch's call no sample asked for).
            line.future.exception()

    def _stop(self, exc: BaseException, keys: Iterable[str]) -> None:
        """The journal cannot be written: send nothing more, fail what is held."""
        self.fault = exc
        error = ServerError(f"the batch journal cannot be written ({exc})")
        for key in list(keys):
            line = self._lines.get(key)
            if line is not None:
                self._fail(line, error)
        for lines in self._held.values():
            for line in lines:
                self._fail(line, error)
        self._held = {}

    # -- progress and shutdown -------------------------------------------------------

    def board(self) -> BatchBoard:
        """Where the run's batches stand now."""
        views = tuple(
            BatchView(s.label, s.target.id, s.wave, len(s.keys), s.status)
            for s in self._submissions.values()
        )
        held = sum(len(lines) for lines in self._held.values())
        return BatchBoard(max(0, self._wave - 1), self._sent, views, held)

    def _board(self) -> None:
        self._notify(self.board())

    @property
    def sent(self) -> int:
        """Batches this invocation sent."""
        return self._sent

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


def wall_clock() -> float:
    """The time a batch call is timed with (seconds)."""
    return time.perf_counter()
