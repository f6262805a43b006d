"""Anthropic's Message Batches: the fake server's routes driven by the real anthropic
SDK, and :class:`~conductor.batches.anthropic.AnthropicBatchAPI` end to end against
them (real HTTP to 127.0.0.1; nothing mocked)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conductor.batches import batch_api
from conductor.batches.anthropic import ANTHROPIC_BATCH_LIMITS, AnthropicBatchAPI
from conductor.batches.api import BatchAPI, BatchEntry, BatchLimits, BatchStatus, LineOutcome
from conductor.batches.waves import BatchPoll, SampleTicket, WaveBatcher
from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    BadResponseError,
    ConnectionRefusedByHostError,
    ModelCallError,
    RateLimitError,
    RetryableError,
    ServerError,
)
from conductor.llm.anthropic_client import AnthropicClient
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.types import ModelRequest
from conductor.runs.batches import BatchJournal
from conductor.targets import Worker
from conductor.testing import BatchPlan, FakeLLMServer, FakeRequest, FakeToolCall, Fault, Reply

KEY = "sk-ant-fake-secret-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_ANTHROPIC_KEY"
MODEL = "claude-x"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake server that insists on KEY, with KEY exported under KEY_ENV."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeLLMServer(expected_api_key=KEY) as srv:
        yield srv


def sdk(server: FakeLLMServer, key: str = KEY) -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=server.anthropic_base, api_key=key, max_retries=0)


def params(text: str = "hello", model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}


def requests_of(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [{"custom_id": f"{prefix}{i}", "params": params(f"question {i}")} for i in range(n)]


def native(server: FakeLLMServer, **kw: Any) -> Worker:
    return Worker(
        id="claude",
        model=MODEL,
        client="anthropic",
        api_base=server.anthropic_base,
        api_key_env=KEY_ENV,
        **kw,
    )


def request(text: str, **extra: Any) -> ModelRequest:
    return ModelRequest(
        messages=({"role": "user", "content": text},),
        params={"temperature": 0.2, "max_tokens": 64, **extra},
    )


def entries(*texts: str) -> list[BatchEntry]:
    return [BatchEntry(f"{n:064x}", request(text)) for n, text in enumerate(texts)]


def post(url: str, body: bytes, key: str = KEY) -> tuple[int, Any]:
    """A raw POST (for bodies the SDK would not send); returns (status, parsed body)."""
    headers = {"Content-Type": "application/json", "x-api-key": key}
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, key: str = KEY) -> tuple[int, Any]:
    """A raw GET; returns (status, parsed body)."""
    req = urllib.request.Request(url, headers={"x-api-key": key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def until_ended(api: AnthropicBatchAPI, batch_id: str) -> BatchStatus:
    for _ in range(20):
        status = await api.status(batch_id)
        if status.terminal:
            return status
    raise AssertionError(f"batch {batch_id} never ended")


# -- the fake server's routes, through the raw SDK --------------------------------------


def test_create_answers_a_message_batch(server: FakeLLMServer) -> None:
    batch = sdk(server).messages.batches.create(requests=requests_of(3))
    assert batch.type == "message_batch"
    assert batch.id.startswith("msgbatch_")
    assert batch.processing_status == "in_progress"
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored) == (3, 0, 0)
    assert (counts.canceled, counts.expired) == (0, 0)
    assert batch.results_url is None and batch.ended_at is None
    assert batch.cancel_initiated_at is None and batch.archived_at is None
    assert batch.expires_at - batch.created_at == timedelta(hours=24)
    held = server.batch(batch.id)
    assert held.protocol == "anthropic" and held.label is None and held.api_key == KEY
    assert held.custom_ids == ["r0", "r1", "r2"]
    assert held.lines[1].body == params("question 1")
    assert [c.operation for c in server.batch_calls] == ["create"]
    # Nothing is answered (nor paid for) before the batch ends.
    assert server.requests == []


def test_status_reads_move_the_batch_and_a_listing_does_not(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(validating_polls=1, running_polls=1))
    client = sdk(server)
    batch = client.messages.batches.create(requests=requests_of(2))
    for _ in range(3):
        listed = list(client.messages.batches.list())
        assert [b.processing_status for b in listed] == ["in_progress"]
    # Validating and running are both "in_progress" in Anthropic's words.
    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    assert server.batch(batch.id).state == "validating"
    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    assert server.requests == []
    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.succeeded == 2 and ended.request_counts.processing == 0
    assert ended.ended_at is not None
    assert ended.results_url == f"{server.url}/v1/messages/batches/{batch.id}/results"
    answered = server.requests
    assert [(r.batch_id, r.custom_id, r.model) for r in answered] == [
        (batch.id, "r0", MODEL),
        (batch.id, "r1", MODEL),
    ]
    assert answered[0].last_user_message == "question 0"


def test_results_stream_each_line_in_anthropic_words(server: FakeLLMServer) -> None:
    server.script(
        MODEL,
        [
            Reply("Paris.", input_tokens=7, output_tokens=2),
            Fault(429, "slow down"),
            Fault(529, "overloaded"),
            Fault(400, "prompt is too long"),
            Fault.malformed("null_content"),
            Reply("", tool_calls=[FakeToolCall("add", {"a": 1})]),
        ],
    )
    client = sdk(server)
    batch = client.messages.batches.create(requests=requests_of(6))
    assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    counts = ended.request_counts
    # A broken reply is still a succeeded line: only its Message is broken.
    assert (counts.succeeded, counts.errored, counts.expired, counts.canceled) == (3, 3, 0, 0)
    lines = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert [lines[f"r{i}"].type for i in range(6)] == [
        "succeeded",
        "errored",
        "errored",
        "errored",
        "succeeded",
        "succeeded",
    ]
    first = lines["r0"].message
    assert first.content[0].text == "Paris." and first.model == MODEL
    assert (first.usage.input_tokens, first.usage.output_tokens) == (7, 2)
    assert first.stop_reason == "end_turn" and first.id.startswith("msg_")
    errors = [lines[f"r{i}"].error for i in (1, 2, 3)]
    assert [e.type for e in errors] == ["error"] * 3
    assert [(e.error.type, e.error.message) for e in errors] == [
        ("rate_limit_error", "slow down"),
        ("overloaded_error", "overloaded"),
        ("invalid_request_error", "prompt is too long"),
    ]
    assert lines["r4"].message.content is None
    tool = lines["r5"].message
    assert tool.stop_reason == "tool_use" and tool.content[0].input == {"a": 1}
    # Read again, the same Messages (ids and all).
    again = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert again["r0"].message.id == first.id
    assert [c.operation for c in server.batch_calls].count("results") == 2


def test_results_of_a_batch_still_running_are_not_found(server: FakeLLMServer) -> None:
    import anthropic

    server.batch_script(BatchPlan(running_polls=5))
    client = sdk(server)
    batch = client.messages.batches.create(requests=requests_of(1))
    status, body = get(f"{server.url}/v1/messages/batches/{batch.id}/results")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_nonesuch")


def test_list_pages_newest_first(server: FakeLLMServer) -> None:
    import anthropic

    client = sdk(server)
    made = [client.messages.batches.create(requests=requests_of(1)).id for _ in range(5)]
    newest_first = made[::-1]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2]
    assert page.has_more is True
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    # The SDK follows after_id = last_id to the end.
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    last = client.messages.batches.list(limit=2, after_id=newest_first[3])
    assert [b.id for b in last.data] == newest_first[4:] and last.has_more is False
    before = client.messages.batches.list(limit=2, before_id=newest_first[3])
    assert [b.id for b in before.data] == newest_first[1:3] and before.has_more is True
    # Going back, the SDK asks before_id = first_id, a page at a time, to the newest.
    back = client.messages.batches.list(limit=2, before_id=newest_first[4])
    assert [b.id for b in back] == newest_first[2:4] + newest_first[0:2]
    empty = client.messages.batches.list(after_id=newest_first[4])
    assert empty.data == [] and empty.has_more is False and empty.first_id is None
    for bad in ({"limit": 0}, {"limit": 1001}, {"after_id": "msgbatch_x"}):
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.list(**bad)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.list(after_id=made[0], before_id=made[1])
    assert all(c.operation in ("create", "list") for c in server.batch_calls)


def test_cancel_then_a_status_read_ends_it_cancelled(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(running_polls=5))
    client = sdk(server)
    batch = client.messages.batches.create(requests=requests_of(3))
    client.messages.batches.retrieve(batch.id)
    cancelling = client.messages.batches.cancel(batch.id)
    assert cancelling.processing_status == "canceling"
    assert cancelling.cancel_initiated_at is not None
    assert cancelling.request_counts.processing == 3
    ended = client.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended"
    assert ended.request_counts.canceled == 3 and ended.request_counts.processing == 0
    assert ended.cancel_initiated_at == cancelling.cancel_initiated_at
    results = list(client.messages.batches.results(batch.id))
    assert [r.result.type for r in results] == ["canceled"] * 3
    assert server.requests == []
    # A batch that has ended is answered unchanged.
    assert client.messages.batches.cancel(batch.id).processing_status == "ended"


def test_expired_and_failed_endings(server: FakeLLMServer) -> None:
    server.batch_script(
        [
            BatchPlan(running_polls=0, outcome="expired", answered=1),
            BatchPlan(running_polls=0, outcome="failed", message="the params were refused"),
        ]
    )
    client = sdk(server)
    expired = client.messages.batches.create(requests=requests_of(3))
    failed = client.messages.batches.create(requests=requests_of(2))
    counts = client.messages.batches.retrieve(expired.id).request_counts
    assert (counts.succeeded, counts.expired) == (1, 2)
    assert [r.result.type for r in client.messages.batches.results(expired.id)] == [
        "succeeded",
        "expired",
        "expired",
    ]
    # Anthropic fails no batch whole: every line is errored instead.
    ended = client.messages.batches.retrieve(failed.id)
    assert ended.processing_status == "ended" and ended.request_counts.errored == 2
    results = list(client.messages.batches.results(failed.id))
    assert [r.result.error.error.type for r in results] == ["invalid_request_error"] * 2
    assert results[0].result.error.error.message == "the params were refused"
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("requests", "named"),
    [
        ([{"custom_id": "a" * 65, "params": params()}], "requests.0.custom_id"),
        ([{"custom_id": "", "params": params()}], "requests.0.custom_id"),
        ([{"custom_id": "has space", "params": params()}], "requests.0.custom_id"),
        ([{"custom_id": "dot.ted", "params": params()}], "requests.0.custom_id"),
        (
            [{"custom_id": "same", "params": params()}, {"custom_id": "same", "params": params()}],
            "requests.1.custom_id",
        ),
        ([{"custom_id": "a", "params": {"max_tokens": 5, "messages": []}}], "params.model"),
        ([{"custom_id": "a", "params": {"model": MODEL, "messages": []}}], "params.max_tokens"),
        ([{"custom_id": "a", "params": {"model": MODEL, "max_tokens": 5}}], "params.messages"),
        ([], "at least 1 item"),
    ],
)
def test_create_refuses_what_anthropic_refuses(
    server: FakeLLMServer, requests: list[dict[str, Any]], named: str
) -> None:
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk(server).messages.batches.create(requests=requests)
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert named in raised.value.body["error"]["message"]
    assert server.batches == []


def test_a_64_character_custom_id_of_every_allowed_kind_is_taken(server: FakeLLMServer) -> None:
    custom_id = ("aZ09_-" * 11)[:64]
    batch = sdk(server).messages.batches.create(
        requests=[{"custom_id": custom_id, "params": params()}]
    )
    assert server.batch(batch.id).custom_ids == [custom_id]


def test_create_refuses_too_many_requests_and_too_many_bytes(server: FakeLLMServer) -> None:
    import anthropic

    client = sdk(server)
    server.anthropic_batch_max_requests = 3
    client.messages.batches.create(requests=requests_of(3))
    with pytest.raises(anthropic.BadRequestError) as many:
        client.messages.batches.create(requests=requests_of(4))
    assert "at most 3 items" in many.value.message
    server.anthropic_batch_max_bytes = 2_000
    with pytest.raises(anthropic.APIStatusError) as big:
        client.messages.batches.create(
            requests=[{"custom_id": "big", "params": params("word " * 500)}]
        )
    assert big.value.status_code == 413
    assert big.value.body["error"]["type"] == "request_too_large"
    assert len(server.batches) == 1


def test_the_real_request_limit_is_100000(server: FakeLLMServer) -> None:
    line = {"custom_id": "x", "params": {"model": "m", "max_tokens": 1, "messages": []}}
    many = [{**line, "custom_id": f"r{i}"} for i in range(100_001)]
    status, body = post(
        f"{server.url}/v1/messages/batches", json.dumps({"requests": many}).encode()
    )
    assert status == 400
    assert "at most 100000 items" in body["error"]["message"]
    assert server.batches == []


def test_a_wrong_key_is_refused_everywhere(server: FakeLLMServer) -> None:
    import anthropic

    good = sdk(server).messages.batches.create(requests=requests_of(1))
    wrong = sdk(server, key="sk-ant-wrong")
    calls = [
        lambda: wrong.messages.batches.create(requests=requests_of(1)),
        lambda: wrong.messages.batches.retrieve(good.id),
        lambda: wrong.messages.batches.list(),
        lambda: wrong.messages.batches.cancel(good.id),
    ]
    for call in calls:
        with pytest.raises(anthropic.AuthenticationError) as raised:
            call()
        assert raised.value.body["error"]["type"] == "authentication_error"
    assert len(server.batches) == 1
    assert server.batch(good.id).state == "validating"


# -- AnthropicBatchAPI against the fake -------------------------------------------------


def test_the_factory_makes_it_for_both_kinds_of_worker(server: FakeLLMServer) -> None:
    for worker in (native(server), Worker(id="l", model=f"anthropic/{MODEL}")):
        api = batch_api(worker)
        assert isinstance(api, AnthropicBatchAPI) and isinstance(api, BatchAPI)
        assert api.limits == ANTHROPIC_BATCH_LIMITS == BatchLimits(100_000, 256_000_000)


def answer(fake: FakeRequest) -> Reply:
    """A reply that depends only on the request, so a live and a batch call agree."""
    text = fake.last_user_message
    if text.startswith("tool"):
        return Reply("", tool_calls=[FakeToolCall("lookup", {"q": text}, id="toolu_1")])
    if text.startswith("long"):
        return Reply(f"cut: {text}", finish_reason="length")
    return Reply(f"A: {text}", input_tokens=len(text), output_tokens=3)


@pytest.mark.parametrize("kind", ["native", "litellm"])
async def test_batch_answers_equal_live_answers(server: FakeLLMServer, kind: str) -> None:
    server.script(MODEL, answer)
    if kind == "native":
        worker = native(server, system_prompt="Be brief.")
    else:
        worker = Worker(
            id="claude",
            model=f"anthropic/{MODEL}",
            api_base=f"{server.url}/v1/messages",
            api_key_env=KEY_ENV,
            system_prompt="Be brief.",
        )
    reqs = [
        request("what is 2+2?", stop="END", top_k=5, extra_headers={"x-extra": "1"}),
        request("tool please"),
        request("long answer", custom_flag=True),
        ModelRequest(
            messages=(
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "capital?"},
            ),
            params={"max_tokens": 32},
        ),
    ]
    batch_entries = [BatchEntry(f"{n:064x}", r) for n, r in enumerate(reqs)]
    api = AnthropicBatchAPI(worker)
    # What the live call sends is what the native client sends: a litellm worker's
    # base may name the messages route, which only litellm itself takes.
    live = AnthropicClient(replace(worker, api_base=server.anthropic_base))
    try:
        assert api.chunks(batch_entries) == [batch_entries]
        batch_id = await api.submit(batch_entries, label="conductor-x-w0-claude-0")
        status = await until_ended(api, batch_id)
        assert status == BatchStatus("ended", total=4, succeeded=4, failed=0, detail="ended")
        outcomes = {o.custom_id: o for o in await api.results(batch_id)}
        answers = [await live.send(r, timeout_s=30) for r in reqs]
    finally:
        await api.aclose()
        await live.aclose()
    lines = [r for r in server.requests if r.batch_id == batch_id]
    calls = [r for r in server.requests if r.batch_id is None]
    assert len(lines) == len(calls) == 4
    for entry, line, call, reply in zip(batch_entries, lines, calls, answers, strict=True):
        # Each line is exactly the body the live call sent.
        assert line.custom_id == entry.custom_id
        assert line.body == call.body
        batched = outcomes[entry.custom_id].completion
        assert batched is not None and outcomes[entry.custom_id].error is None
        assert (batched.text, batched.usage, batched.finish_reason) == (
            reply.text,
            reply.usage,
            reply.finish_reason,
        )
        assert (batched.model, batched.tool_calls) == (reply.model, reply.tool_calls)
        assert {**batched.raw, "id": None} == {**reply.raw, "id": None}
        assert batched.batch is False  # the batcher marks it, once checked
    first = lines[0].body
    assert first["model"] == MODEL and first["system"] == "Be brief."
    assert first["stop_sequences"] == ["END"] and first["top_k"] == 5
    assert "extra_headers" not in first and "extra_body" not in first
    assert lines[2].body["custom_flag"] is True
    assert lines[3].body["system"] == "Be brief.\n\nAnswer in French."
    assert outcomes[batch_entries[1].custom_id].completion.tool_calls[0].name == "lookup"  # type: ignore[union-attr]
    assert outcomes[batch_entries[2].custom_id].completion.truncated  # type: ignore[union-attr]


async def test_line_errors_are_the_errors_a_live_call_raises(server: FakeLLMServer) -> None:
    server.script(
        MODEL,
        [
            Reply("fine"),
            Fault(400, "prompt is too long"),
            Fault(403, "not allowed"),
            Fault(429, "slow down"),
            Fault(500, "oops"),
            Fault(529, "overloaded"),
            Fault(504, "took too long"),
            Fault.malformed("string_message"),
            Fault.malformed("empty_text"),
        ],
    )
    api = AnthropicBatchAPI(native(server))
    batch_entries = entries(*[f"q{i}" for i in range(9)])
    try:
        batch_id = await api.submit(batch_entries, label="l")
        status = await until_ended(api, batch_id)
        outcomes = {o.custom_id: o for o in await api.results(batch_id)}
    finally:
        await api.aclose()
    assert (status.state, status.total, status.succeeded, status.failed) == ("ended", 9, 3, 6)
    by_line = [outcomes[e.custom_id] for e in batch_entries]
    assert by_line[0].completion is not None and by_line[0].completion.text == "fine"
    errors = [o.error for o in by_line[1:8]]
    assert [type(e) for e in errors] == [
        BadRequestError,
        AuthenticationError,
        RateLimitError,
        ServerError,
        ServerError,
        ServerError,
        BadResponseError,
    ]
    assert [e.status for e in errors[:6] if e is not None] == [400, 403, 429, 500, 529, 504]
    assert [e.retryable for e in errors if e is not None] == [
        False,
        False,
        True,
        True,
        True,
        True,
        True,
    ]
    assert errors[0] is not None and errors[0].provider_message == "prompt is too long"
    assert all(e is not None and e.target == "claude" for e in errors)
    # An empty reply is a reply: the batcher's check (as a live reply's) refuses it.
    empty = by_line[8].completion
    assert empty is not None and empty.text == ""


async def test_an_expired_batch_reports_expired_and_only_its_answered_lines(
    server: FakeLLMServer,
) -> None:
    server.batch_script(
        [
            BatchPlan(running_polls=1, outcome="expired", answered=0),
            BatchPlan(running_polls=1, outcome="expired", answered=2),
        ]
    )
    api = AnthropicBatchAPI(native(server))
    try:
        none_ran = await api.submit(entries("a", "b", "c"), label="l0")
        some_ran = await api.submit(entries("a", "b", "c"), label="l1")
        assert (await api.status(none_ran)).state == "running"
        nothing = await until_ended(api, none_ran)
        partly = await until_ended(api, some_ran)
        assert nothing == BatchStatus("expired", total=3, detail="ended")
        assert await api.results(none_ran) == []
        assert partly == BatchStatus("ended", total=3, succeeded=2, detail="ended")
        got = await api.results(some_ran)
    finally:
        await api.aclose()
    assert sorted(o.custom_id for o in got) == [f"{n:064x}" for n in (0, 1)]


async def test_a_cancelled_batch_reports_cancelled_with_no_lines(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(running_polls=10))
    api = AnthropicBatchAPI(native(server))
    try:
        batch_id = await api.submit(entries("a", "b"), label="l")
        assert (await api.status(batch_id)).state == "running"
        await api.cancel(batch_id)
        assert server.batch(batch_id).state == "cancelling"
        status = await until_ended(api, batch_id)
        assert status == BatchStatus("cancelled", total=2, detail="ended")
        assert await api.results(batch_id) == []
        assert await api.find("l") is None
    finally:
        await api.aclose()
    assert server.requests == []


async def test_batch_api_faults_map_to_our_errors(server: FakeLLMServer) -> None:
    api = AnthropicBatchAPI(native(server))
    try:
        server.batch_fault("create", Fault(429, "too many batches"), Fault(400, "bad"))
        with pytest.raises(RateLimitError):
            await api.submit(entries("a"), label="l")
        with pytest.raises(BadRequestError):
            await api.submit(entries("a"), label="l")
        batch_id = await api.submit(entries("a"), label="l")
        server.batch_fault("status", Fault(500, "try later"), Fault(529, "busy"))
        for _ in range(2):
            with pytest.raises(RetryableError) as raised:
                await api.status(batch_id)
            assert isinstance(raised.value, ServerError)
        await until_ended(api, batch_id)
        server.batch_fault("results", Fault(500, "results later"))
        with pytest.raises(ServerError):
            await api.results(batch_id)
        assert len(await api.results(batch_id)) == 1
        server.batch_fault("cancel", Fault(404, "no such batch"))
        with pytest.raises(BadRequestError):
            await api.cancel(batch_id)
        with pytest.raises(BadRequestError) as missing:
            await api.status("msgbatch_nonesuch")
        assert missing.value.status == 404
    finally:
        await api.aclose()


async def test_a_server_gone_is_a_connection_error_to_ask_again() -> None:
    with FakeLLMServer() as gone:
        worker = Worker(id="claude", model=MODEL, client="anthropic", api_base=gone.url)
    api = AnthropicBatchAPI(worker)
    try:
        with pytest.raises(ConnectionRefusedByHostError) as raised:
            await api.status("msgbatch_1")
    finally:
        await api.aclose()
    assert raised.value.retryable and raised.value.host == "127.0.0.1"


async def test_results_asked_for_too_early_may_be_asked_again(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(running_polls=5))
    api = AnthropicBatchAPI(native(server))
    try:
        batch_id = await api.submit(entries("a"), label="l")
        with pytest.raises(RetryableError):
            await api.results(batch_id)
    finally:
        await api.aclose()


async def test_a_wrong_key_is_an_authentication_error_without_the_key(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = sdk(server).messages.batches.create(requests=requests_of(1)).id
    wrong = "sk-ant-wrong-key-9876543210fedcba"
    monkeypatch.setenv(KEY_ENV, wrong)
    api = AnthropicBatchAPI(native(server))
    failures: list[ModelCallError] = []
    try:
        for call in (
            lambda: api.submit(entries("a"), label="l"),
            lambda: api.status(batch_id),
            lambda: api.results(batch_id),
            lambda: api.cancel(batch_id),
        ):
            with pytest.raises(AuthenticationError) as raised:
                await call()
            assert raised.value.status == 401 and raised.value.target == "claude"
            failures.append(raised.value)
    finally:
        await api.aclose()
    assert all(wrong not in f"{f} {f.describe()} {f.provider_message}" for f in failures)


async def test_the_key_reaches_no_error_text(server: FakeLLMServer) -> None:
    # A provider that quotes the key back, in a refusal and in a line's error.
    server.batch_fault("create", Fault(400, f"key {KEY} may not batch"))
    server.script(MODEL, Fault(400, f"request with key {KEY} refused"))
    api = AnthropicBatchAPI(native(server))
    try:
        with pytest.raises(BadRequestError) as refused:
            await api.submit(entries("a"), label="l")
        batch_id = await api.submit(entries("a"), label="l")
        await until_ended(api, batch_id)
        [line] = await api.results(batch_id)
    finally:
        await api.aclose()
    assert line.error is not None
    for error in (refused.value, line.error):
        text = f"{error} {error.describe()} {error.provider_message} {error.args}"
        assert KEY not in text and "***" in text


async def test_chunks_keep_within_small_limits(server: FakeLLMServer) -> None:
    api = AnthropicBatchAPI(native(server))
    texts = [f"question number {i}" for i in range(5)]
    batch_entries = entries(*texts)
    api.limits = BatchLimits(max_requests=2, max_bytes=10**6)
    assert api.chunks(batch_entries) == [
        batch_entries[0:2],
        batch_entries[2:4],
        batch_entries[4:5],
    ]
    assert api.chunks([]) == []
    # Bytes: the body of two lines fits, of three does not.
    line_bytes = len(json.dumps({"custom_id": "0" * 64, "params": {}}).encode())
    one = len(json.dumps(_line_params(api, batch_entries[0])).encode()) + line_bytes
    api.limits = BatchLimits(max_requests=100, max_bytes=2 * one + 60)
    chunks = api.chunks(batch_entries)
    assert [len(c) for c in chunks] == [2, 2, 1]
    assert [e for c in chunks for e in c] == batch_entries
    # Each chunk is a batch the fake takes at exactly those limits.
    server.anthropic_batch_max_bytes = api.limits.max_bytes
    server.anthropic_batch_max_requests = 2
    try:
        for chunk in chunks:
            await api.submit(chunk, label="l")
        api.limits = BatchLimits(max_requests=100, max_bytes=one // 2)
        with pytest.raises(BadRequestError) as too_big:
            api.chunks(batch_entries)
        assert "larger than a batch may be" in str(too_big.value)
    finally:
        await api.aclose()
    assert [len(b.lines) for b in server.batches] == [2, 2, 1]


def _line_params(api: AnthropicBatchAPI, entry: BatchEntry) -> dict[str, Any]:
    """The params of ``entry``'s line, as the live client builds them."""
    kwargs = AnthropicClient(api.worker).build_kwargs(entry.request)
    kwargs.pop("extra_headers", None)
    kwargs.update(kwargs.pop("extra_body", None) or {})
    return kwargs


async def test_a_litellm_worker_sends_the_bare_model_name(server: FakeLLMServer) -> None:
    worker = Worker(id="lite", model=f"anthropic/{MODEL}", api_base=server.url, api_key_env=KEY_ENV)
    server.script(MODEL, "from claude")
    api = batch_api(worker)
    assert api is not None
    try:
        batch_id = await api.submit(entries("hi"), label="l")
        ended = await api.status(batch_id)
        while not ended.terminal:
            ended = await api.status(batch_id)
        [outcome] = await api.results(batch_id)
    finally:
        await api.aclose()
    assert isinstance(outcome, LineOutcome) and outcome.completion is not None
    assert outcome.completion.text == "from claude"
    assert server.batches[0].model == MODEL
    assert server.requests[0].api_key == KEY


async def test_the_wave_batcher_gets_its_answers_through_it(
    server: FakeLLMServer, tmp_path: Path
) -> None:
    # The batcher's own choice of batch API (the factory's), against the fake: a line
    # rate limited once is sent again in the next wave's batch.
    limited: list[str] = []

    def once_limited(fake: FakeRequest) -> Reply | Fault:
        text = fake.last_user_message
        if text == "q1" and not limited:
            limited.append(text)
            return Fault(429, "slow down")
        return Reply(f"A: {text}")

    server.script(MODEL, once_limited)
    worker = native(server)
    cache = ResponseCache(tmp_path / "cache")
    batcher = WaveBatcher(
        [worker], BatchJournal(tmp_path), cache, poll=BatchPoll(0.001, 1.0, 0.001)
    )

    async def sample(ticket: SampleTicket, text: str) -> str:
        ticket.enter()
        try:
            one = request(text)
            answer = await batcher.call(worker, one, cache_key(worker, one))
            return answer.raw.text
        finally:
            ticket.release()

    tickets = [batcher.admit() for _ in range(3)]
    try:
        answers = await asyncio.gather(*(sample(t, f"q{i}") for i, t in enumerate(tickets)))
    finally:
        await batcher.aclose()
        cache.close()
    assert answers == ["A: q0", "A: q1", "A: q2"]
    assert [len(b.lines) for b in server.batches] == [3, 1]
    assert all(r.batch_id is not None for r in server.requests)
    assert [r.last_user_message for r in server.requests] == ["q0", "q1", "q2", "q1"]
