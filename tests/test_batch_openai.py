"""OpenAI's batch API: the fake server's Files and Batch routes through the real openai
SDK, and OpenAIBatchAPI against them (real HTTP throughout)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import openai
import pytest

from conductor.errors import AuthenticationError, BadRequestError, RateLimitError, ServerError
from conductor.llm.batch_openai import LABEL_KEY, OpenAIBatchAPI
from conductor.llm.batchapi import BatchEntry, BatchLimits
from conductor.llm.factory import batch_api, batch_protocol
from conductor.llm.openai_client import OpenAIClient
from conductor.llm.types import ModelRequest
from conductor.targets import Worker
from conductor.testing import BatchPlan, FakeLLMServer, Fault, Reply

KEY = "sk-batch-test-secret-1234"


def entry(i: int, text: str | None = None, **params: object) -> BatchEntry:
    request = ModelRequest(
        messages=({"role": "user", "content": text or f"question {i}"},),
        params={"max_tokens": 16, **params},
    )
    return BatchEntry(f"{i:064x}", request)


def target(server: FakeLLMServer, **kw: object) -> Worker:
    fields: dict[str, object] = {
        "id": "w", "model": "gpt-x", "client": "openai", "api_base": server.openai_base,
        "api_key_env": "BATCH_TEST_KEY", **kw,
    }  # fmt: skip
    return Worker(**fields)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_TEST_KEY", KEY)


def sdk(server: FakeLLMServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=server.openai_base, max_retries=0)


def upload(client: openai.OpenAI, lines: list[object]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def line(custom_id: str, model: str = "m", content: str = "hi") -> dict[str, object]:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


# -- the fake's routes, through the SDK -----------------------------------------------


def test_a_batch_moves_through_its_states_and_writes_its_files(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", ["first", Fault(400, "bad parameter")])
    fake_server.batch_script(BatchPlan(validating_polls=1, running_polls=1))
    client = sdk(fake_server)
    file_id = upload(client, [line("a"), line("b")])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"k": "v"},
    )  # fmt: skip
    assert (batch.status, batch.metadata) == ("validating", {"k": "v"})
    seen = [client.batches.retrieve(batch.id).status for _ in range(4)]
    assert seen == ["validating", "in_progress", "completed", "completed"]
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (2, 1)
    assert done.request_counts.failed == 1 and done.completed_at is not None
    assert done.output_file_id and done.error_file_id
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    err = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert out[0]["custom_id"] == "a" and out[0]["response"]["status_code"] == 200
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "first"
    assert err[0]["custom_id"] == "b" and err[0]["response"]["status_code"] == 400
    assert err[0]["response"]["body"]["error"]["message"] == "bad parameter"
    # Each answered line is logged as a request of its batch.
    assert [(r.batch_id, r.custom_id) for r in fake_server.requests] == [
        (batch.id, "a"),
        (batch.id, "b"),
    ]


def test_an_expired_batch_lists_its_lines_never_run(fake_server: FakeLLMServer) -> None:
    fake_server.batch_script(BatchPlan(outcome="expired", answered=1))
    client = sdk(fake_server)
    batch = client.batches.create(
        input_file_id=upload(client, [line("a"), line("b"), line("c")]),
        endpoint="/v1/chat/completions", completion_window="24h",
    )  # fmt: skip
    client.batches.retrieve(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "expired" and done.error_file_id
    err = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in err] == [
        ("b", "batch_expired", None),
        ("c", "batch_expired", None),
    ]


@pytest.mark.parametrize(
    ("lines", "code"),
    [
        ([line("a"), line("a")], "duplicate_custom_id"),
        ([line("a"), {**line("b"), "url": "/v1/embeddings"}], "invalid_url"),
        ([line("a", model="m"), line("b", model="n")], "mismatched_model"),
        (["not an object"], "invalid_request"),
        ([{"method": "POST", "url": "/v1/chat/completions", "body": {}}], "missing_required"),
    ],
)
def test_an_input_file_that_breaks_the_rules_fails_the_batch(
    fake_server: FakeLLMServer, lines: list[object], code: str
) -> None:
    client = sdk(fake_server)
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
        completion_window="24h",
    )  # fmt: skip
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.errors is not None
    assert failed.errors.data and (failed.errors.data[0].code or "").startswith(code)
    assert fake_server.requests == []  # nothing was run


def test_listing_pages_newest_first_and_cancel(fake_server: FakeLLMServer) -> None:
    fake_server.batch_script(BatchPlan(running_polls=100))
    client = sdk(fake_server)
    file_id = upload(client, [line("a")])
    ids = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(5)
    ]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    assert [b.id for b in client.batches.list(limit=100)] == ids[::-1]  # every page
    assert client.batches.cancel(ids[0]).status == "cancelling"
    assert client.batches.retrieve(ids[0]).status == "cancelled"


def test_a_wrong_key_is_refused_in_openais_words(fake_server: FakeLLMServer) -> None:
    fake_server.expected_api_key = KEY
    with pytest.raises(openai.AuthenticationError):
        sdk(fake_server, "sk-wrong").batches.list()


# -- OpenAIBatchAPI --------------------------------------------------------------------


async def test_batch_answers_are_what_live_calls_return(fake_server: FakeLLMServer) -> None:
    fake_server.script("gpt-x", lambda r: Reply(f"echo {r.last_user_message}", output_tokens=3))
    worker = target(fake_server)
    api = OpenAIBatchAPI(worker)
    live = OpenAIClient(worker)
    entries = [entry(i) for i in range(3)]
    try:
        batch_id = await api.submit(entries, label="conductor-x-w0-w-0")
        assert (await api.status(batch_id)).state == "running"
        status = await api.status(batch_id)
        assert (status.state, status.total, status.succeeded) == ("ended", 3, 3)
        outcomes = {o.custom_id: o for o in await api.results(batch_id)}
        for e in entries:
            answer = outcomes[e.custom_id].completion
            direct = await live.send(e.request, timeout_s=10)
            assert answer is not None
            assert (answer.text, answer.usage, answer.finish_reason) == (
                direct.text, direct.usage, direct.finish_reason,
            )  # fmt: skip
    finally:
        await api.aclose()
        await live.aclose()
    # The line's body is the live request's body: OpenAI's own max_tokens naming
    # aside (an api_base server keeps max_tokens).
    batched = [r for r in fake_server.requests if r.batch_id]
    direct_bodies = [r.body for r in fake_server.requests if not r.batch_id]
    assert [r.body for r in batched] == direct_bodies
    assert batched[0].api_key == KEY


async def test_line_failures_become_the_errors_live_calls_would_raise(
    fake_server: FakeLLMServer,
) -> None:
    fake_server.script(
        "gpt-x",
        [
            "fine",
            Fault(400, "unknown parameter"),
            Fault(429, "slow down"),
            Fault(500, "boom"),
            Fault.malformed("empty_choices"),
        ],
    )
    api = OpenAIBatchAPI(target(fake_server))
    try:
        batch_id = await api.submit([entry(i) for i in range(5)], label="l")
        await api.status(batch_id)
        outcomes = {o.custom_id: o for o in await api.results(batch_id)}
    finally:
        await api.aclose()
    kinds = [
        type(outcomes[entry(i).custom_id].error or outcomes[entry(i).custom_id].completion).__name__
        for i in range(5)
    ]
    assert kinds == [
        "RawCompletion",
        "BadRequestError",
        "RateLimitError",
        "ServerError",
        "BadResponseError",
    ]
    assert all(o.error is None or o.error.target == "w" for o in outcomes.values())


async def test_an_expired_batch_returns_only_its_answered_lines(
    fake_server: FakeLLMServer,
) -> None:
    fake_server.batch_script(BatchPlan(outcome="expired", answered=2))
    api = OpenAIBatchAPI(target(fake_server))
    try:
        batch_id = await api.submit([entry(i) for i in range(4)], label="l")
        await api.status(batch_id)
        status = await api.status(batch_id)
        outcomes = await api.results(batch_id)
    finally:
        await api.aclose()
    assert status.state == "expired"
    assert sorted(o.custom_id for o in outcomes) == [entry(0).custom_id, entry(1).custom_id]


async def test_a_failed_batch_says_why_and_returns_nothing(fake_server: FakeLLMServer) -> None:
    fake_server.batch_script(BatchPlan(running_polls=0, outcome="failed", message="no capacity"))
    api = OpenAIBatchAPI(target(fake_server))
    try:
        batch_id = await api.submit([entry(0)], label="l")
        status = await api.status(batch_id)
        assert await api.results(batch_id) == []
    finally:
        await api.aclose()
    assert status.state == "failed" and status.detail is not None and "no capacity" in status.detail


async def test_a_batch_whose_id_was_lost_is_found_by_its_label(fake_server: FakeLLMServer) -> None:
    fake_server.batch_script(BatchPlan(running_polls=10))
    api = OpenAIBatchAPI(target(fake_server))
    try:
        ids = [await api.submit([entry(i)], label=f"label-{i}") for i in range(150)]
        assert await api.find("label-3") == ids[3]  # on the second page
        assert await api.find("never-sent") is None
        await api.cancel(ids[0])
        assert (await api.status(ids[0])).state == "cancelled"
    finally:
        await api.aclose()
    assert fake_server.batch(ids[3]).extra["metadata"] == {LABEL_KEY: "label-3"}


async def test_provider_faults_are_our_errors_without_the_key(fake_server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(target(fake_server))
    try:
        fake_server.batch_fault("upload", Fault(500, f"disk full for {KEY}"))
        with pytest.raises(ServerError) as failed:
            await api.submit([entry(0)], label="l")
        assert KEY not in str(failed.value)
        fake_server.batch_fault("create", Fault(429, "too many batches"))
        with pytest.raises(RateLimitError):
            await api.submit([entry(0)], label="l")
        batch_id = await api.submit([entry(0)], label="l")
        fake_server.batch_fault("status", Fault(503, "unavailable"))
        with pytest.raises(ServerError):
            await api.status(batch_id)
        fake_server.expected_api_key = "sk-other"
        with pytest.raises(AuthenticationError) as refused:
            await api.status(batch_id)
        assert KEY not in str(refused.value)
    finally:
        await api.aclose()


def test_chunks_keep_to_the_limits(fake_server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(target(fake_server))
    api.limits = BatchLimits(max_requests=3, max_bytes=10_000)
    chunks = api.chunks([entry(i) for i in range(7)])
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [e.custom_id for c in chunks for e in c] == [entry(i).custom_id for i in range(7)]
    with pytest.raises(BadRequestError, match="larger than a batch may be"):
        api.chunks([entry(0, "x" * 20_000)])


@pytest.mark.parametrize(
    ("model", "client"), [("openai/gpt-x", "litellm"), ("hosted_vllm/gpt-x", "litellm")]
)
async def test_litellm_workers_batch_through_openais_protocol(
    fake_server: FakeLLMServer, model: str, client: str, tmp_path: Path
) -> None:
    fake_server.script("gpt-x", "from the batch")
    worker = target(fake_server, model=model, client=client)
    assert batch_protocol(worker) == "openai"
    api = batch_api(worker)
    assert isinstance(api, OpenAIBatchAPI)
    try:
        batch_id = await api.submit([entry(0)], label="l")
        await api.status(batch_id)
        [outcome] = await api.results(batch_id)
    finally:
        await api.aclose()
    assert outcome.completion is not None and outcome.completion.text == "from the batch"
    assert fake_server.requests[0].model == "gpt-x"  # the provider prefix is stripped
