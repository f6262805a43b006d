"""The wave batcher (conductor.batches.waves): what is sent when, what each kind of
answer leads to, the journal a resume reads, and the caller's side of it.

The provider is a batch API held in memory at the seam (tests/kit/batchkit.py); the
wire protocols are tested against the fake server's batch routes elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kit.batchkit import MemoryBatchAPI, MemoryPlan, answer_of

from conductor.batches.api import BatchEntry
from conductor.batches.waves import (
    LINE_RETRIES,
    BatchBoard,
    BatchPoll,
    SampleTicket,
    WaveBatcher,
)
from conductor.errors import BadRequestError, RateLimitError
from conductor.llm.batcher import SendLive
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.caller import CallerSet
from conductor.llm.types import ModelRequest
from conductor.runs.batches import BatchJournal
from conductor.targets import Price, Worker
from conductor.testing import FakeLLMServer, Reply

POLL = BatchPoll(first_s=0.001, growth=1.0, max_s=0.001)

A = Worker(id="a", model="openai/gpt-a")
B = Worker(id="b", model="anthropic/claude-b")
C = Worker(id="c", model="gemini/gemini-c")


def req(text: str) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},))


class Run:
    """A batcher over a journal and cache in ``tmp``, each target's API in ``apis``."""

    def __init__(
        self,
        tmp: Path,
        apis: dict[str, MemoryBatchAPI],
        targets: Sequence[Worker] = (A, B, C),
        gate: Callable[[], str | None] | None = None,
    ) -> None:
        self.apis = apis
        self.journal = BatchJournal(tmp)
        self.cache = ResponseCache(tmp / "cache")
        self.boards: list[BatchBoard] = []
        self.stops: list[str] = []
        self.batcher = WaveBatcher(
            targets,
            self.journal,
            self.cache,
            poll=POLL,
            on_board=self.boards.append,
            gate=gate,
            on_stop=self.stops.append,
            api_for=lambda t: apis[t.id],
        )

    async def ask(self, target: Worker, text: str) -> str:
        request = req(text)
        answer = await self.batcher.call(target, request, cache_key(target, request))
        assert answer.raw.batch
        return answer.raw.text

    async def samples(self, bodies: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
        """Run each body as a sample: every ticket taken before any starts, as the
        runner's dispatcher does."""
        tickets = [self.batcher.admit() for _ in bodies]

        async def one(ticket: SampleTicket, body: Callable[[], Awaitable[Any]]) -> Any:
            ticket.enter()
            try:
                return await body()
            finally:
                ticket.release()

        tasks = [asyncio.create_task(one(t, b)) for t, b in zip(tickets, bodies, strict=True)]
        return await asyncio.gather(*tasks, return_exceptions=True)

    def chain(self, targets: Sequence[Worker], question: str) -> Callable[[], Awaitable[str]]:
        """A sample whose calls go one after another, each sent the answer before."""

        async def body() -> str:
            text = question
            for target in targets:
                text = await self.ask(target, text)
            return text

        return body

    async def close(self) -> None:
        await self.batcher.aclose()
        self.cache.close()

    def events(self, tmp: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (tmp / "batches.jsonl").read_text().splitlines()]


def labels(api: MemoryBatchAPI) -> list[str]:
    return [b.label for b in api.submissions]


async def test_a_chain_takes_one_wave_per_step_whatever_the_number_of_samples(
    tmp_path: Path,
) -> None:
    apis = {"a": MemoryBatchAPI(), "b": MemoryBatchAPI()}
    run = Run(tmp_path, apis)
    try:
        answers = await run.samples([run.chain([A, B, A], f"q{i}") for i in range(60)])
    finally:
        await run.close()
    assert answers == [f"A(A(A(q{i})))" for i in range(60)]
    # Wave 0 and 2 are a's, wave 1 b's: one batch each, every sample in it.
    assert [len(b.entries) for b in apis["a"].submissions] == [60, 60]
    assert [len(b.entries) for b in apis["b"].submissions] == [60]
    assert ["-w0-" in labels(apis["a"])[0], "-w2-" in labels(apis["a"])[1]] == [True, True]
    assert "-w1-" in labels(apis["b"])[0]
    assert run.batcher.sent == 3 and run.boards[-1].in_flight == ()


async def test_steps_side_by_side_share_a_wave_and_a_wave_waits_for_the_last_batch(
    tmp_path: Path,
) -> None:
    # b's batch takes many more reads than a's: the next wave still waits for it, so
    # the samples that went through a and those that went through b meet again in c.
    apis = {
        "a": MemoryBatchAPI(),
        "b": MemoryBatchAPI([MemoryPlan(polls=30)]),
        "c": MemoryBatchAPI(),
    }
    run = Run(tmp_path, apis)

    def sample(i: int) -> Callable[[], Awaitable[str]]:
        async def body() -> str:
            x, y = await asyncio.gather(run.ask(A, f"x{i}"), run.ask(B, f"y{i}"))
            return await run.ask(C, x + y)

        return body

    bodies = [sample(i) for i in range(3)]
    bodies += [run.chain([A, C], f"p{i}") for i in range(3)]
    bodies += [run.chain([B, C], f"r{i}") for i in range(3)]
    try:
        answers = await run.samples(bodies)
    finally:
        await run.close()
    assert answers[:3] == [f"A(A(x{i})A(y{i}))" for i in range(3)]
    assert answers[3:] == [*(f"A(A(p{i}))" for i in range(3)), *(f"A(A(r{i}))" for i in range(3))]
    # One wave for all nine second calls, not one as each first batch came back.
    assert [len(b.entries) for b in apis["c"].submissions] == [9]
    events = run.events(tmp_path)
    b_label = next(e["label"] for e in events if e.get("target") == "b")
    b_collected = next(
        i for i, e in enumerate(events) if e["event"] == "collected" and e["label"] == b_label
    )
    c_intent = next(i for i, e in enumerate(events) if e.get("target") == "c")
    assert b_collected < c_intent


async def test_a_live_call_keeps_its_sample_in_the_wave(tmp_path: Path) -> None:
    apis = {"a": MemoryBatchAPI(), "b": MemoryBatchAPI()}
    run = Run(tmp_path, apis)

    async def live_then_b() -> str:
        with run.batcher.live():
            await asyncio.sleep(0.05)
        return await run.ask(B, "after the live call")

    async def body() -> list[str]:
        return list(await asyncio.gather(run.ask(A, "now"), live_then_b()))

    try:
        [answer] = await run.samples([body])
    finally:
        await run.close()
    assert answer == ["A(now)", "A(after the live call)"]
    # The batched call waited for the live one: both in the first wave.
    assert "-w0-" in labels(apis["a"])[0] and "-w0-" in labels(apis["b"])[0]


async def test_an_expired_batch_sends_only_its_unanswered_lines_again(tmp_path: Path) -> None:
    api = MemoryBatchAPI([MemoryPlan(outcome="expired", answered=2), MemoryPlan()])
    run = Run(tmp_path, {"a": api})
    try:
        answers = await run.samples([run.chain([A], f"q{i}") for i in range(5)])
    finally:
        await run.close()
    assert answers == [f"A(q{i})" for i in range(5)]
    first, second = api.submissions
    answered = {e.custom_id for e in first.entries[:2]}
    assert len(first.entries) == 5 and len(second.entries) == 3
    assert not answered & {e.custom_id for e in second.entries}  # nothing paid twice


async def test_a_line_unanswered_in_every_wave_is_made_live(tmp_path: Path) -> None:
    api = MemoryBatchAPI([MemoryPlan(outcome="expired", answered=0)])
    run = Run(tmp_path, {"a": api})
    try:
        [outcome] = await run.samples([run.chain([A], "q")])
    finally:
        await run.close()
    assert isinstance(outcome, SendLive)
    assert len(api.submissions) == LINE_RETRIES + 1
    assert run.batcher.board().live == 1


async def test_line_errors_fail_as_live_or_go_into_the_next_wave(tmp_path: Path) -> None:
    bad, limited = req("bad"), req("limited")
    bad_key, limited_key = cache_key(A, bad), cache_key(A, limited)
    plan = MemoryPlan(
        failing={
            bad_key: BadRequestError("no such parameter", status=400),
            limited_key: RateLimitError("slow down", status=429),
        }
    )
    api = MemoryBatchAPI([plan, MemoryPlan()])
    run = Run(tmp_path, {"a": api})
    try:
        results = await run.samples([run.chain([A], "bad"), run.chain([A], "limited")])
    finally:
        await run.close()
    assert isinstance(results[0], BadRequestError) and results[0].target == "a"
    assert results[1] == "A(limited)"
    assert [e.custom_id for e in api.submissions[1].entries] == [limited_key]


async def test_a_batch_api_that_refuses_for_good_makes_the_target_live(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api = MemoryBatchAPI(submit_errors=[BadRequestError("no /v1/files here", status=404)])
    run = Run(tmp_path, {"a": api})
    try:
        first = await run.samples([run.chain([A], f"q{i}") for i in range(3)])
        again = await run.samples([run.chain([A], "later")])
    finally:
        await run.close()
    assert all(isinstance(x, SendLive) for x in [*first, *again])
    assert api.submissions == []  # never accepted, and never asked again
    assert "made live from now on" in caplog.text
    abandoned = [e for e in run.events(tmp_path) if e["event"] == "abandoned"]
    assert len(abandoned) == 1 and "404" in abandoned[0]["reason"]


async def test_a_submission_turned_away_for_now_goes_in_the_next_wave(tmp_path: Path) -> None:
    api = MemoryBatchAPI(submit_errors=[RateLimitError("too many batches", status=429)])
    run = Run(tmp_path, {"a": api})
    try:
        answers = await run.samples([run.chain([A], f"q{i}") for i in range(3)])
    finally:
        await run.close()
    assert answers == ["A(q0)", "A(q1)", "A(q2)"]
    assert len(api.submissions) == 1 and "-w1-" in api.submissions[0].label


async def test_answers_are_cached_with_the_batch_flag_before_the_batch_is_collected(
    tmp_path: Path,
) -> None:
    api = MemoryBatchAPI()
    run = Run(tmp_path, {"a": api})
    try:
        await run.samples([run.chain([A], "q")])
        hit = run.cache.get(cache_key(A, req("q")))
    finally:
        await run.close()
    assert hit is not None and hit.batch and hit.text == "A(q)"
    kinds = [e["event"] for e in run.events(tmp_path)]
    assert kinds == ["intent", "submitted", "collected"]


async def test_a_resumed_run_collects_the_batches_in_flight_instead_of_paying_again(
    tmp_path: Path,
) -> None:
    api = MemoryBatchAPI([MemoryPlan(polls=10**9)])
    first = Run(tmp_path, {"a": api})
    tasks = asyncio.ensure_future(first.samples([first.chain([A], f"q{i}") for i in range(4)]))
    while not api.submissions:
        await asyncio.sleep(0.001)
    # The process is killed: its samples end, its batch runs on at the provider.
    tasks.cancel()
    await asyncio.gather(tasks, return_exceptions=True)
    await first.close()
    api.batches[api.submissions[0].id].plan = MemoryPlan(polls=0)

    second = Run(tmp_path, {"a": api})
    try:
        await second.batcher.start()
        answers = await second.samples([second.chain([A], f"q{i}") for i in range(4)])
    finally:
        await second.close()
    assert answers == [f"A(q{i})" for i in range(4)]
    assert len(api.submissions) == 1  # collected, never sent again
    assert [e["event"] for e in second.events(tmp_path)][-1] == "collected"


@pytest.mark.parametrize("listed", [True, False])
async def test_a_batch_sent_but_never_written_down_is_found_by_its_label(
    tmp_path: Path, listed: bool
) -> None:
    api = MemoryBatchAPI(listed=listed)
    journal = BatchJournal(tmp_path)
    request = req("q")
    key = cache_key(A, request)
    label = "conductor-dead-w0-a-0"
    journal.intent(label, A.id, A.model, 0, [key])
    await api.submit([BatchEntry(key, request)], label=label)
    journal.close()

    run = Run(tmp_path, {"a": api})
    try:
        await run.batcher.start()
        answers = await run.samples([run.chain([A], "q")])
    finally:
        await run.close()
    assert answers == ["A(q)"]
    # Found: adopted, nothing sent again.  Not listed (Anthropic's): sent again.
    assert len(api.submissions) == (1 if listed else 2)
    kinds = [e["event"] for e in run.events(tmp_path)]
    assert ("abandoned" in kinds) is (not listed)


async def test_the_gate_stops_the_waves_and_says_why(tmp_path: Path) -> None:
    api = MemoryBatchAPI()
    spent: list[int] = []

    def gate() -> str | None:
        return "the cap is reached" if spent else None

    run = Run(tmp_path, {"a": api}, gate=gate)

    async def body() -> str:
        first = await run.ask(A, "one")
        spent.append(1)
        return await run.ask(A, first)

    task = asyncio.ensure_future(run.samples([body]))
    while not run.stops:
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await run.close()
    assert run.stops == ["the cap is reached"] and run.batcher.stopped == "the cap is reached"
    assert len(api.submissions) == 1  # the second wave was never sent


async def test_a_journal_that_cannot_be_written_sends_nothing_more(tmp_path: Path) -> None:
    api = MemoryBatchAPI()
    run = Run(tmp_path, {"a": api})

    def broken(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    run.journal.intent = broken  # type: ignore[method-assign]
    try:
        results = await run.samples([run.chain([A], "q"), run.chain([A], "r")])
        later = await run.samples([run.chain([A], "s")])
    finally:
        await run.close()
    assert all(isinstance(r, SendLive) for r in [*results, *later])
    assert api.submissions == []


async def test_an_empty_batch_reply_is_sent_again_in_the_next_wave(tmp_path: Path) -> None:
    replies = iter(["", "full"])
    api = MemoryBatchAPI(answer=lambda _r: next(replies))
    run = Run(tmp_path, {"a": api})
    try:
        [answer] = await run.samples([run.chain([A], "q")])
    finally:
        await run.close()
    assert answer == "full" and len(api.submissions) == 2


async def test_the_caller_prices_a_batch_answer_at_the_batch_rate_and_falls_back_live(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("m", Reply("live answer", input_tokens=10, output_tokens=5))
    target = Worker(
        id="w",
        model="m",
        client="openai",
        api_base=fake_server.openai_base,
        price=Price(1.0, 2.0),
    )
    apis = {"w": MemoryBatchAPI(submit_errors=[])}
    cache = ResponseCache(tmp_path / "cache")
    journal = BatchJournal(tmp_path)
    batcher = WaveBatcher([target], journal, cache, poll=POLL, api_for=lambda t: apis[t.id])
    callers = CallerSet(cache)
    callers.use_batches(batcher, True)
    caller = callers.get(target)
    try:
        batch = await caller.complete(req("q"))
        replay = await caller.complete(req("q"))
        apis["w"].submit_errors.append(BadRequestError("batches are off", status=400))
        live = await caller.complete(req("other"))
    finally:
        await batcher.aclose()
        await callers.aclose()
        cache.close()
    # 10 in and 5 out at $1 and $2 per million, half price in a batch.
    assert (batch.text, batch.batch, batch.cached) == (answer_of(req("q")), True, False)
    assert batch.cost_usd == pytest.approx(10e-6) and batch.live_cost_usd == pytest.approx(20e-6)
    assert (replay.batch, replay.cached) == (True, True)
    assert replay.cost_usd == pytest.approx(10e-6)
    assert (live.text, live.batch, live.live_cost_usd) == ("live answer", False, None)
    assert live.cost_usd == pytest.approx(20e-6)
    assert [r.custom_id for r in fake_server.requests] == [None]  # the one live call


class LostReply(MemoryBatchAPI):
    """Makes the batch, then loses the answer on its way back (a timeout)."""

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        await super().submit(entries, label=label)
        if len(self.submissions) == 1:
            raise RateLimitError("the connection dropped", status=None)
        return self.submissions[-1].id


async def test_a_batch_made_though_its_submission_failed_is_adopted_not_paid_twice(
    tmp_path: Path,
) -> None:
    api = LostReply()
    run = Run(tmp_path, {"a": api})
    try:
        answers = await run.samples([run.chain([A], f"q{i}") for i in range(3)])
    finally:
        await run.close()
    assert answers == ["A(q0)", "A(q1)", "A(q2)"]
    assert len(api.submissions) == 1


class Broken(MemoryBatchAPI):
    """A client with a bug: reading a status raises what no reader foresaw."""

    async def status(self, batch_id: str) -> Any:
        raise KeyError("processing_status")


async def test_a_fault_no_one_foresaw_makes_the_calls_live_instead_of_hanging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path, {"a": Broken()})
    try:
        results = await asyncio.wait_for(run.samples([run.chain([A], "q")]), 10)
    finally:
        await run.close()
    assert isinstance(results[0], SendLive) and "could not be followed" in caplog.text

    def no_client(_t: Worker) -> Any:
        raise ModuleNotFoundError("conductor.batches.nowhere")

    cache = ResponseCache(tmp_path / "c2")
    batcher = WaveBatcher([A], BatchJournal(tmp_path / "j2"), cache, poll=POLL, api_for=no_client)
    ticket = batcher.admit()

    async def one() -> Any:
        ticket.enter()
        try:
            return await batcher.call(A, req("q"), cache_key(A, req("q")))
        finally:
            ticket.release()

    try:
        with pytest.raises(SendLive):
            await asyncio.wait_for(one(), 10)
    finally:
        await batcher.aclose()
        cache.close()


class Unreadable(MemoryBatchAPI):
    """Its batches end, but their results can never be read (a body no reader knows)."""

    async def results(self, batch_id: str) -> list[Any]:
        from conductor.errors import BadResponseError

        raise BadResponseError("the results could not be read", target="a")


class Flaky(MemoryBatchAPI):
    """Its status reads fail for a while (the provider down), then answer."""

    def __init__(self) -> None:
        super().__init__()
        self.down = 12

    async def status(self, batch_id: str) -> Any:
        from conductor.errors import ServerError

        if self.down:
            self.down -= 1
            raise ServerError("unavailable", status=503)
        return await super().status(batch_id)


async def test_results_that_never_read_make_the_calls_live_and_an_outage_is_waited_out(
    tmp_path: Path,
) -> None:
    from conductor.batches.waves import UNREADABLE_READS

    unreadable = Unreadable()
    run = Run(tmp_path, {"a": unreadable})
    try:
        [outcome] = await asyncio.wait_for(run.samples([run.chain([A], "q")]), 10)
    finally:
        await run.close()
    assert isinstance(outcome, SendLive) and "could not be read" in outcome.reason
    assert len(unreadable.submissions) == 1 and UNREADABLE_READS > 1

    flaky = Flaky()
    run = Run(tmp_path / "again", {"a": flaky})
    try:
        answers = await asyncio.wait_for(run.samples([run.chain([A], "q")]), 10)
    finally:
        await run.close()
    assert answers == ["A(q)"] and flaky.down == 0 and len(flaky.submissions) == 1
