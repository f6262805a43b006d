"""Gemini's batch mode: the fake server's routes driven by the raw google-genai SDK, and
:class:`~conductor.batches.google.GoogleBatchAPI` end to end against them.

Everything is real HTTP to the fake server on 127.0.0.1; nothing is mocked.  A batch
moves only when its status is read (``BatchPlan``), so each test says exactly when
a batch ends.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from conductor.batches import batch_api
from conductor.batches.api import BatchAPI, BatchEntry, BatchLimits, BatchStatus, LineOutcome
from conductor.batches.google import (
    GEMINI_BATCH_LIMITS,
    GEMINI_INLINE_LIMIT_BYTES,
    METADATA_KEY,
    GoogleBatchAPI,
)
from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    BadResponseError,
    ConnectionRefusedByHostError,
    RateLimitError,
    RetryableError,
    ServerError,
)
from conductor.llm.google_client import GoogleClient
from conductor.llm.types import ModelRequest
from conductor.targets import Worker
from conductor.testing import BatchPlan, FakeLLMServer, FakeRequest, Fault, Reply

KEY = "gk-fake-secret-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_GEMINI_KEY"
MODEL = "gemini-x"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake server that insists on KEY, with KEY exported under KEY_ENV."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeLLMServer(expected_api_key=KEY) as srv:
        yield srv


def sdk(server: FakeLLMServer, key: str = KEY) -> Any:
    """The raw google-genai client, one attempt per request."""
    from google import genai
    from google.genai import types

    return genai.Client(
        api_key=key,
        http_options=types.HttpOptions(
            base_url=server.gemini_base,
            api_version="v1beta",  # where batch mode is documented (and served here)
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )


def inline(text: str, key: str | None = None, **config: Any) -> dict[str, Any]:
    """An inline request of the raw SDK (``key``: its metadata's custom id)."""
    item: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": text}]}]}
    if key is not None:
        item["metadata"] = {"key": key}
    if config:
        item["config"] = config
    return item


def raw(server: FakeLLMServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A raw request with KEY; returns (status, parsed body)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "x-goog-api-key": KEY},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def worker(server: FakeLLMServer, model: str = MODEL, **kw: Any) -> Worker:
    """A native google worker pointed at ``server``."""
    base: dict[str, Any] = {"id": "g", "api_key_env": KEY_ENV}
    base.update(kw)
    return Worker(model=model, client="google", api_base=server.gemini_base, **base)


def key(i: int) -> str:
    return f"{i:064x}"


def entry(i: int, text: str | None = None, **params: Any) -> BatchEntry:
    return BatchEntry(
        key(i),
        ModelRequest(
            messages=(
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": text if text is not None else f"question {i}"},
            ),
            params={"temperature": 0.2, "max_tokens": 64, **params},
        ),
    )


def answer_by_question(request: FakeRequest) -> Reply:
    """Each question's own answer, so that a mix-up of lines shows."""
    return Reply(f"answer to {request.last_user_message}", output_tokens=4)


async def until_ended(api: BatchAPI, batch_id: str) -> list[BatchStatus]:
    """Every status read of ``batch_id`` up to its terminal one."""
    seen: list[BatchStatus] = []
    for _ in range(20):
        seen.append(await api.status(batch_id))
        if seen[-1].terminal:
            return seen
    raise AssertionError(f"batch {batch_id} did not end: {seen}")


def by_id(outcomes: list[LineOutcome]) -> dict[str, LineOutcome]:
    return {o.custom_id: o for o in outcomes}


# -- the fake server's routes, through the raw SDK ---------------------------------------


def test_fake_batch_moves_from_pending_to_succeeded(server: FakeLLMServer) -> None:
    server.script(MODEL, ["first answer", "second answer"])
    server.batch_script(BatchPlan(validating_polls=1, running_polls=1))
    client = sdk(server)
    job = client.batches.create(
        model=MODEL,
        src=[inline("one?", key(1)), inline("two?", key(2))],
        config={"display_name": "label-1"},
    )
    assert job.name.startswith("batches/")
    assert (job.display_name, job.model) == ("label-1", f"models/{MODEL}")
    assert job.state.value == "JOB_STATE_PENDING" and not job.done and job.dest is None
    states = []
    for _ in range(3):
        job = client.batches.get(name=job.name)
        states.append(job.state.value)
        if states[-1] != "JOB_STATE_SUCCEEDED":
            assert server.requests == []  # nothing answered before the batch ends
    assert states == ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
    assert job.done and job.end_time is not None
    answers = job.dest.inlined_responses
    assert [a.response.text for a in answers] == ["first answer", "second answer"]
    assert [a.metadata for a in answers] == [{"key": key(1)}, {"key": key(2)}]
    assert answers[0].response.candidates[0].finish_reason.value == "STOP"
    assert answers[0].response.usage_metadata.prompt_token_count == 1
    assert answers[0].response.usage_metadata.candidates_token_count == 2
    batch_id = job.name.removeprefix("batches/")
    [made] = server.batches
    assert (made.id, made.label, made.state, made.custom_ids) == (
        batch_id,
        "label-1",
        "ended",
        [key(1), key(2)],
    )
    logged = server.requests
    assert [(r.batch_id, r.custom_id, r.model) for r in logged] == [
        (batch_id, key(1), MODEL),
        (batch_id, key(2), MODEL),
    ]
    assert [r.last_user_message for r in logged] == ["one?", "two?"]
    # A read of the ended batch is its results read (it carries the answers).
    client.batches.get(name=job.name)
    assert [(c.operation, c.path) for c in server.batch_calls] == [
        ("create", f"/v1beta/models/{MODEL}:batchGenerateContent"),
        ("status", f"/v1beta/batches/{batch_id}"),
        ("status", f"/v1beta/batches/{batch_id}"),
        ("status", f"/v1beta/batches/{batch_id}"),
        ("results", f"/v1beta/batches/{batch_id}"),
    ]


def test_fake_operation_wire_shape(server: FakeLLMServer) -> None:
    server.script(MODEL, [Reply("fine", input_tokens=7, output_tokens=3), Fault(429, "slow")])
    status, created = raw(
        server,
        "POST",
        f"/v1beta/models/{MODEL}:batchGenerateContent",
        {
            "batch": {
                "displayName": "raw-1",
                "inputConfig": {
                    "requests": {
                        "requests": [
                            {"request": {"contents": [{"parts": [{"text": "a"}]}]}},
                            {
                                "request": {"contents": [{"parts": [{"text": "b"}]}]},
                                "metadata": {"key": "k-2"},
                            },
                        ]
                    }
                },
            }
        },
    )
    assert status == 200
    name = created["name"]
    assert created["metadata"]["name"] == name and "done" not in created
    assert created["metadata"]["@type"].endswith("GenerateContentBatch")
    assert created["metadata"]["state"] == "BATCH_STATE_PENDING"
    assert created["metadata"]["batchStats"] == {
        "requestCount": "2",
        "successfulRequestCount": "0",
        "failedRequestCount": "0",
        "pendingRequestCount": "2",
    }
    status, running = raw(server, "GET", f"/v1beta/{name}")
    assert (status, running["metadata"]["state"]) == (200, "BATCH_STATE_RUNNING")
    status, done = raw(server, "GET", f"/v1beta/{name}")
    assert done["done"] is True and done["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    assert done["metadata"]["batchStats"] == {
        "requestCount": "2",
        "successfulRequestCount": "1",
        "failedRequestCount": "1",
        "pendingRequestCount": "0",
    }
    output = done["metadata"]["output"]
    assert done["response"] == {"@type": done["response"]["@type"], **output}
    assert done["response"]["@type"].endswith("GenerateContentBatchOutput")
    first, second = output["inlinedResponses"]["inlinedResponses"]
    # A line sent with no metadata gets none back; the error is a google.rpc.Status.
    assert "metadata" not in first
    assert first["response"]["candidates"][0]["content"]["parts"] == [{"text": "fine"}]
    assert first["response"]["usageMetadata"] == {
        "promptTokenCount": 7,
        "candidatesTokenCount": 3,
        "totalTokenCount": 10,
    }
    assert second == {"error": {"code": 8, "message": "slow"}, "metadata": {"key": "k-2"}}
    # Without a key of its own, a line is logged under its position.
    assert [r.custom_id for r in server.requests] == ["0", "k-2"]


def test_fake_line_is_the_live_request_body(server: FakeLLMServer) -> None:
    client = sdk(server)
    config = {
        "system_instruction": "Be brief.",
        "temperature": 0.3,
        "max_output_tokens": 50,
        "stop_sequences": ["END"],
    }
    client.models.generate_content(model=MODEL, contents=inline("same?")["contents"], config=config)
    job = client.batches.create(
        model=MODEL, src=[inline("same?", key(1), **config)], config={"display_name": "b"}
    )
    while not client.batches.get(name=job.name).done:
        pass
    live, line = server.requests
    assert line.batch_id is not None and live.batch_id is None
    assert line.body == live.body
    assert line.body["systemInstruction"] == {"parts": [{"text": "Be brief."}], "role": "user"}
    assert line.messages == live.messages


def test_fake_expired_failed_and_cancelled_batches(server: FakeLLMServer) -> None:
    server.script(MODEL, "ok")
    server.batch_script(
        [
            BatchPlan(outcome="expired", answered=1),
            BatchPlan(outcome="failed", message="bad input file"),
            BatchPlan(running_polls=5),
        ]
    )
    client = sdk(server)
    src = [inline(f"q{i}", key(i)) for i in range(3)]
    expired = client.batches.create(model=MODEL, src=src, config={"display_name": "e"})
    failed = client.batches.create(model=MODEL, src=src, config={"display_name": "f"})
    cancelled = client.batches.create(model=MODEL, src=src, config={"display_name": "c"})

    for _ in range(2):
        job = client.batches.get(name=expired.name)
    assert job.state.value == "JOB_STATE_EXPIRED" and job.done
    assert [a.metadata["key"] for a in job.dest.inlined_responses] == [key(0)]

    for _ in range(2):
        job = client.batches.get(name=failed.name)
    assert job.state.value == "JOB_STATE_FAILED" and job.dest is None
    status, operation = raw(server, "GET", f"/v1beta/{failed.name}")
    assert operation["error"] == {"code": 3, "message": "bad input file"}
    assert "response" not in operation

    client.batches.get(name=cancelled.name)  # running
    client.batches.cancel(name=cancelled.name)
    # Gemini has no word for a batch being cancelled: a listing (no status read) still
    # finds it running; the next read finds it cancelled, with no answers.
    listed = {j.name: j.state.value for j in client.batches.list()}
    assert listed[cancelled.name] == "JOB_STATE_RUNNING"
    job = client.batches.get(name=cancelled.name)
    assert job.state.value == "JOB_STATE_CANCELLED" and job.dest is None

    # Only the expired batch's first line ran.
    assert [(r.batch_id, r.custom_id) for r in server.requests] == [
        (expired.name.removeprefix("batches/"), key(0))
    ]
    assert [c.operation for c in server.batch_calls].count("cancel") == 1


def test_fake_lists_newest_first_in_pages(server: FakeLLMServer) -> None:
    client = sdk(server)
    status, empty = raw(server, "GET", "/v1beta/batches")
    assert (status, empty) == (200, {})
    names = [
        client.batches.create(
            model=MODEL, src=[inline("q", key(i))], config={"display_name": f"l{i}"}
        ).name
        for i in range(5)
    ]
    pager = client.batches.list(config={"page_size": 2})
    assert [j.name for j in pager.page] == names[::-1][:2]
    assert [j.name for j in client.batches.list(config={"page_size": 2})] == names[::-1]
    server.gemini_list_page_max = 3
    assert len(client.batches.list(config={"page_size": 50}).page) == 3
    status, body = raw(server, "GET", "/v1beta/batches?pageToken=nonsense")
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    status, body = raw(server, "GET", "/v1beta/batches?pageSize=-1")
    assert status == 400
    assert {c.operation for c in server.batch_calls} == {"create", "list"}


def test_fake_delete_forgets_a_batch(server: FakeLLMServer) -> None:
    from google.genai import errors

    client = sdk(server)
    job = client.batches.create(
        model=MODEL, src=[inline("q", key(1))], config={"display_name": "d"}
    )
    client.batches.delete(name=job.name)
    with pytest.raises(errors.ClientError) as caught:
        client.batches.get(name=job.name)
    assert caught.value.code == 404
    assert list(client.batches.list()) == []
    [kept] = server.batches
    assert kept.deleted
    assert [c.operation for c in server.batch_calls] == ["create", "delete", "status", "list"]


def test_fake_key_faults_and_refusals(server: FakeLLMServer) -> None:
    from google.genai import errors

    stranger = sdk(server, key="wrong")
    with pytest.raises(errors.ClientError) as caught:
        stranger.batches.create(model=MODEL, src=[inline("q")], config={"display_name": "x"})
    assert caught.value.code == 401
    client = sdk(server)
    job = client.batches.create(model=MODEL, src=[inline("q")], config={"display_name": "x"})
    server.batch_fault("status", Fault(503, "try later"))
    with pytest.raises(errors.ServerError) as failed:
        client.batches.get(name=job.name)
    assert failed.value.code == 503 and failed.value.message == "try later"
    assert client.batches.get(name=job.name).state is not None  # as usual again
    # Refused as the API refuses them: no display name, a file source, no requests.
    path = f"/v1beta/models/{MODEL}:batchGenerateContent"
    request = {"request": {"contents": [{"parts": [{"text": "q"}]}]}}
    for batch in (
        {"inputConfig": {"requests": {"requests": [request]}}},
        {"displayName": "x", "inputConfig": {"fileName": "files/abc"}},
        {"displayName": "x", "inputConfig": {"requests": {"requests": []}}},
    ):
        status, body = raw(server, "POST", path, {"batch": batch})
        assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert len(server.batches) == 1
    # The live routes keep their own methods.
    status, body = raw(server, "POST", f"/v1/models/{MODEL}:embedContent", {})
    assert status == 404 and "embedContent" in body["error"]["message"]
    assert client.models.generate_content(model=MODEL, contents="hi").text == "Echo: hi"


def test_fake_refuses_a_batch_over_its_inline_limit(server: FakeLLMServer) -> None:
    from google.genai import errors

    server.gemini_inline_limit_bytes = 2000
    client = sdk(server)
    with pytest.raises(errors.ClientError) as caught:
        client.batches.create(
            model=MODEL, src=[inline("x" * 2000, key(1))], config={"display_name": "big"}
        )
    assert caught.value.code == 400
    assert "exceeds the limit: 2000 bytes" in caught.value.message
    client.batches.create(model=MODEL, src=[inline("x" * 1000)], config={"display_name": "s"})
    assert [b.label for b in server.batches] == ["s"]


# -- GoogleBatchAPI end to end -------------------------------------------------------------


async def test_api_answers_equal_live_calls(server: FakeLLMServer) -> None:
    server.script(MODEL, answer_by_question)
    target = worker(server)
    api = GoogleBatchAPI(target)
    # Extra headers have no place in a line: the live call sends them, the body is one.
    entries = [entry(i, stop="END", extra_headers={"x-trace": "t"}) for i in range(3)]
    batch_id = await api.submit(entries, label="conductor-run-w0-g-0")
    statuses = await until_ended(api, batch_id)
    assert [s.state for s in statuses] == ["running", "ended"]
    assert statuses[-1] == BatchStatus(
        "ended", total=3, succeeded=3, failed=0, detail="JOB_STATE_SUCCEEDED"
    )
    outcomes = by_id(await api.results(batch_id))
    assert set(outcomes) == {e.custom_id for e in entries}
    lines = server.requests
    live = GoogleClient(target)
    try:
        for e in entries:
            completion = outcomes[e.custom_id].completion
            expected = await live.send(e.request, timeout_s=30)
            assert completion is not None
            assert (
                completion.text == expected.text == f"answer to {e.request.messages[1]['content']}"
            )
            assert (completion.usage, completion.finish_reason, completion.model) == (
                expected.usage,
                expected.finish_reason,
                expected.model,
            )
            # The same body but for its id, and the SDK's own note of a live call.
            assert completion.raw.pop("response_id") != expected.raw.pop("response_id")
            assert expected.raw.pop("automatic_function_calling_history") == []
            assert completion.raw == expected.raw
    finally:
        await live.aclose()
        await api.aclose()
    # Each line is the body the live call sent.
    live_calls = [r for r in server.requests if r.batch_id is None]
    assert [r.body for r in lines] == [r.body for r in live_calls]
    assert {r.headers.get("x-trace") for r in live_calls} == {"t"}
    assert server.batches[0].label == "conductor-run-w0-g-0"


async def test_api_serves_a_litellm_gemini_worker(server: FakeLLMServer) -> None:
    server.script(MODEL, answer_by_question)
    target = Worker(id="lite", model=f"gemini/{MODEL}", api_base=server.url, api_key_env=KEY_ENV)
    api = batch_api(target)
    assert isinstance(api, GoogleBatchAPI) and isinstance(api, BatchAPI)
    try:
        batch_id = await api.submit([entry(1), entry(2)], label="lite-0")
        await until_ended(api, batch_id)
        outcomes = by_id(await api.results(batch_id))
    finally:
        await api.aclose()
    assert outcomes[key(1)].completion is not None
    assert outcomes[key(1)].completion.text == "answer to question 1"
    assert outcomes[key(1)].completion.model == MODEL
    assert server.batch_calls[0].path == f"/v1beta/models/{MODEL}:batchGenerateContent"
    assert {r.model for r in server.requests} == {MODEL}


async def test_api_line_errors_are_live_errors(server: FakeLLMServer) -> None:
    server.script(
        MODEL,
        [
            "fine",
            Fault(429, f"quota exhausted for key {KEY}"),
            Fault(400, "bad request"),
            Fault(503, "overloaded"),
            Fault.malformed("empty_choices"),
        ],
    )
    api = GoogleBatchAPI(worker(server))
    entries = [entry(i) for i in range(5)]
    batch_id = await api.submit(entries, label="errors")
    status = (await until_ended(api, batch_id))[-1]
    assert (status.state, status.total, status.succeeded, status.failed) == ("ended", 5, 2, 3)
    outcomes = by_id(await api.results(batch_id))
    await api.aclose()
    assert outcomes[key(0)].completion is not None
    errors = [outcomes[key(i)].error for i in range(1, 5)]
    assert [type(e) for e in errors] == [
        RateLimitError,
        BadRequestError,
        ServerError,
        BadResponseError,
    ]
    rate, bad, server_error, broken = (e for e in errors if e is not None)
    assert [rate.status, bad.status, server_error.status] == [429, 400, 503]
    assert rate.retryable and server_error.retryable and not bad.retryable
    for err in (rate, bad, server_error, broken):
        assert KEY not in str(err) and KEY not in err.provider_message
    assert "***" in str(rate)
    assert "no candidates" in str(broken)


async def test_api_expired_batch_answers_only_lines_that_ran(server: FakeLLMServer) -> None:
    server.script(MODEL, answer_by_question)
    server.batch_script(BatchPlan(outcome="expired", answered=2))
    api = GoogleBatchAPI(worker(server))
    batch_id = await api.submit([entry(i) for i in range(4)], label="exp")
    status = (await until_ended(api, batch_id))[-1]
    outcomes = await api.results(batch_id)
    await api.aclose()
    assert (status.state, status.detail, status.total, status.succeeded) == (
        "expired",
        "JOB_STATE_EXPIRED",
        4,
        2,
    )
    assert [o.custom_id for o in outcomes] == [key(0), key(1)]
    assert [o.completion.text for o in outcomes if o.completion] == [
        "answer to question 0",
        "answer to question 1",
    ]


async def test_api_failed_and_cancelled_batches_have_no_answers(server: FakeLLMServer) -> None:
    server.batch_script([BatchPlan(outcome="failed"), BatchPlan(running_polls=10)])
    api = GoogleBatchAPI(worker(server))
    failed = await api.submit([entry(1)], label="f")
    assert (await until_ended(api, failed))[-1].state == "failed"
    assert await api.results(failed) == []
    running = await api.submit([entry(2)], label="c")
    assert (await api.status(running)).state == "running"
    await api.cancel(running)
    status = await api.status(running)
    assert (status.state, status.detail) == ("cancelled", "JOB_STATE_CANCELLED")
    assert await api.results(running) == []
    await api.aclose()
    assert server.requests == []  # no line ran
    assert [c.operation for c in server.batch_calls].count("cancel") == 1


async def test_api_batch_request_failures(server: FakeLLMServer) -> None:
    api = GoogleBatchAPI(worker(server))
    server.batch_fault("create", Fault(429, "too many batches"))
    with pytest.raises(RateLimitError):
        await api.submit([entry(1)], label="x")
    batch_id = await api.submit([entry(1)], label="x")
    server.batch_fault("status", Fault(500, "internal"))
    with pytest.raises(RetryableError) as caught:
        await api.status(batch_id)
    assert isinstance(caught.value, ServerError) and caught.value.status == 500
    await until_ended(api, batch_id)
    server.batch_fault("results", Fault(503, "unavailable"))
    with pytest.raises(RetryableError):
        await api.results(batch_id)
    assert [o.custom_id for o in await api.results(batch_id)] == [key(1)]
    server.batch_fault("list", Fault(500))
    with pytest.raises(ServerError):
        await api.find("x")
    server.batch_fault("cancel", Fault(404, "Requested entity was not found."))
    with pytest.raises(BadRequestError):
        await api.cancel(batch_id)
    await api.aclose()


async def test_api_key_errors_never_show_the_key(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = GoogleBatchAPI(worker(server))
    server.batch_fault("create", Fault(403, f"key {KEY} may not use batch mode"))
    with pytest.raises(AuthenticationError) as forbidden:
        await api.submit([entry(1)], label="x")
    assert forbidden.value.status == 403
    batch_id = await api.submit([entry(1)], label="x")
    monkeypatch.setenv(KEY_ENV, "gk-some-other-key-9876543210")
    with pytest.raises(AuthenticationError) as wrong:
        await api.status(batch_id)
    assert wrong.value.status == 401
    await api.aclose()
    for err in (forbidden.value, wrong.value):
        assert not err.retryable
        text = " ".join([str(err), repr(err), err.provider_message, *map(str, err.args)])
        assert KEY not in text and "gk-some-other-key" not in text
    assert "***" in forbidden.value.provider_message


async def test_api_connection_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    api = GoogleBatchAPI(
        Worker(
            id="g", model=MODEL, client="google", api_base="http://127.0.0.1:9", api_key_env=KEY_ENV
        )
    )
    with pytest.raises(ConnectionRefusedByHostError):
        await api.submit([entry(1)], label="x")
    await api.aclose()


async def test_api_chunks_within_the_limits(server: FakeLLMServer) -> None:
    server.script(MODEL, answer_by_question)
    api = GoogleBatchAPI(worker(server))
    assert api.limits == GEMINI_BATCH_LIMITS
    assert GEMINI_BATCH_LIMITS.max_bytes == GEMINI_INLINE_LIMIT_BYTES == 20 * 1024 * 1024
    entries = [entry(i, "word " * (100 + 150 * (i % 4))) for i in range(12)]
    assert api.chunks(entries) == [entries]
    api.limits = BatchLimits(max_requests=5, max_bytes=10**9)
    assert [len(c) for c in api.chunks(entries)] == [5, 5, 2]
    # At a byte limit the fake server enforces too, every chunk is taken whole.
    api.limits = BatchLimits(max_requests=100, max_bytes=20_000)
    server.gemini_inline_limit_bytes = 20_000
    chunks = api.chunks(entries)
    assert len(chunks) > 1 and [e for c in chunks for e in c] == entries
    for number, chunk in enumerate(chunks):
        await api.submit(chunk, label=f"chunk-{number}")
    assert [len(b.lines) for b in server.batches] == [len(c) for c in chunks]
    # Filled, not cut early: some 26 kB of requests in batches of 20 kB.
    assert len(chunks) == 2
    with pytest.raises(BadRequestError) as too_big:
        api.chunks([entry(1, "word " * 5000)])
    assert "larger than a batch may be" in str(too_big.value)
    await api.aclose()


async def test_api_finds_a_batch_by_its_label_within_bounded_pages(
    server: FakeLLMServer,
) -> None:
    server.gemini_list_page_max = 2  # the client asks for 100 a page: it must page
    api = GoogleBatchAPI(worker(server))
    ids = [await api.submit([entry(i)], label=f"label-{i}") for i in range(21)]
    assert await api.find("label-20") == ids[20]
    assert await api.find("label-1") == ids[1]  # on the tenth page of two
    assert await api.find("label-0") is None  # past the pages it reads
    assert await api.find("no-such-label") is None
    lists = [c for c in server.batch_calls if c.operation == "list"]
    assert len(lists) == 1 + 10 + 10 + 10
    await api.aclose()


async def test_api_matches_answers_by_order_when_no_metadata_comes_back(
    server: FakeLLMServer,
) -> None:
    server.script(MODEL, answer_by_question)
    server.gemini_echo_metadata = False
    api = GoogleBatchAPI(worker(server))
    batch_id = await api.submit([entry(i) for i in range(3)], label="no-meta")
    await until_ended(api, batch_id)
    outcomes = by_id(await api.results(batch_id))
    assert {k: o.completion.text for k, o in outcomes.items() if o.completion} == {
        key(i): f"answer to question {i}" for i in range(3)
    }
    # A batch this object did not send (taken up after a crash): nothing can be matched.
    fresh = GoogleBatchAPI(worker(server))
    assert await fresh.find("no-meta") == batch_id
    assert await fresh.results(batch_id) == []
    # Nor when some lines have no answer: the order no longer says which is which.
    server.batch_script(BatchPlan(outcome="expired", answered=2))
    partial = await api.submit([entry(i) for i in range(3, 6)], label="partial")
    await until_ended(api, partial)
    assert await api.results(partial) == []
    await api.aclose()
    await fresh.aclose()


async def test_api_leaves_out_answers_that_are_not_its_own(server: FakeLLMServer) -> None:
    server.script(MODEL, "ok")
    client = sdk(server)
    job = client.batches.create(
        model=MODEL,
        src=[inline("mine?", key(1)), inline("no key?"), inline("other?", "someone-else")],
        config={"display_name": "mixed"},
    )
    api = GoogleBatchAPI(worker(server))
    await until_ended(api, job.name)
    outcomes = await api.results(job.name)
    await api.aclose()
    # The unkeyed line is left out; the batcher skips ids it did not send.
    assert sorted(o.custom_id for o in outcomes) == sorted([key(1), "someone-else"])
    assert METADATA_KEY == "key"


@pytest.mark.long
async def test_api_chunks_at_the_real_inline_limit(server: FakeLLMServer) -> None:
    """Twenty-odd megabytes of requests: cut into batches the fake server's 20 MB limit
    takes, where one batch of them all is refused."""
    from google.genai import errors

    api = GoogleBatchAPI(worker(server))
    big = "word " * 200_000  # a megabyte
    entries = [entry(i, big) for i in range(22)]
    chunks = api.chunks(entries)
    assert len(chunks) == 2 and [e for c in chunks for e in c] == entries
    for number, chunk in enumerate(chunks):
        await api.submit(chunk, label=f"big-{number}")
    assert [len(b.lines) for b in server.batches] == [len(c) for c in chunks]
    await api.aclose()
    client = sdk(server)
    with pytest.raises(errors.ClientError) as caught:
        await asyncio.to_thread(
            client.batches.create,
            model=MODEL,
            src=[inline(big, key(i)) for i in range(22)],
            config={"display_name": "too-big"},
        )
    assert caught.value.code == 400 and "exceeds the limit" in caught.value.message
