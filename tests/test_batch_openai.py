"""OpenAI's batch API: the fake server's Files and Batch routes driven by the real openai
SDK, and :class:`~conductor.batches.openai.OpenAIBatchAPI` end to end against them.

Everything talks real HTTP to the fake server on 127.0.0.1; batches move only when
their status is read (``BatchPlan`` says how), so each test decides when one ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conductor.batches import batch_api
from conductor.batches.api import BatchAPI, BatchEntry, BatchLimits, LineOutcome
from conductor.batches.openai import (
    LABEL_KEY,
    OPENAI_BATCH_LIMITS,
    OpenAIBatchAPI,
    status_of,
)
from conductor.batches.waves import BatchPoll, SampleTicket, WaveBatcher
from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    BadResponseError,
    GrammarIgnoredError,
    RateLimitError,
    RetryableError,
    ServerError,
)
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.openai_client import OpenAIClient
from conductor.llm.types import ModelRequest, ToolSpec
from conductor.runs.batches import BatchJournal
from conductor.targets import Worker
from conductor.testing import BatchPlan, FakeLLMServer, Fault, Reply
from conductor.testing.fake_openai_batch import LABEL_KEY as FAKE_LABEL_KEY
from conductor.testing.fake_openai_batch import OpenAIBatchRoutes

KEY = "sk-batch-secret-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_BATCH_KEY"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake server that insists on KEY, with KEY exported under KEY_ENV."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeLLMServer(expected_api_key=KEY) as srv:
        yield srv


def sdk(server: FakeLLMServer, key: str = KEY) -> Any:
    import openai

    return openai.OpenAI(base_url=server.openai_base, api_key=key, max_retries=0)


def line(custom_id: str, text: str = "hi", model: str = "gpt-x", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
        **extra,
    }


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return b"".join(
        (item if isinstance(item, str) else json.dumps(item)).encode() + b"\n" for item in lines
    )


def upload(client: Any, content: bytes, name: str = "in.jsonl") -> str:
    return str(client.files.create(file=(name, content), purpose="batch").id)


def make_batch(client: Any, content: bytes, label: str | None = None) -> Any:
    return client.batches.create(
        input_file_id=upload(client, content),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={LABEL_KEY: label} if label else None,
    )


def result_lines(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(row) for row in client.files.content(file_id).content.splitlines()]


def check_batch_object(raw: dict[str, Any]) -> None:
    """``raw`` is a Batch exactly as the SDK's type describes it (validated, not just
    constructed), with no field it does not know."""
    from openai.types import Batch

    parsed = Batch.model_validate(raw)
    assert set(raw) <= set(Batch.model_fields)
    assert parsed.model_dump(exclude_unset=True).keys() == raw.keys()


def raw_batch(server: FakeLLMServer, batch_id: str) -> dict[str, Any]:
    """A read of ``batch_id`` (it moves the batch) as the JSON the server sent."""
    response = sdk(server).batches.with_raw_response.retrieve(batch_id)
    data: dict[str, Any] = json.loads(response.content)
    check_batch_object(data)
    return data


def worker(server: FakeLLMServer, model: str = "gpt-x", **kw: Any) -> Worker:
    base: dict[str, Any] = {"id": "w-batch", "api_key_env": KEY_ENV}
    base.update(kw)
    if "client" not in base:
        base["client"] = "openai"
    return Worker(model=model, api_base=server.openai_base, **base)


def request(text: str, **params: Any) -> ModelRequest:
    return ModelRequest(
        messages=({"role": "user", "content": text},),
        params={"temperature": 0.2, "max_tokens": 64, **params},
    )


def entries(*texts: str, **params: Any) -> list[BatchEntry]:
    return [BatchEntry(f"{k:064x}", request(text, **params)) for k, text in enumerate(texts)]


async def run_batch(api: BatchAPI, batch: list[BatchEntry], label: str = "lab") -> str:
    """Submit ``batch`` and read its status until it stops changing."""
    batch_id = await api.submit(batch, label=label)
    for _ in range(20):
        if (await api.status(batch_id)).terminal:
            return batch_id
    raise AssertionError("the batch never ended")


def by_id(outcomes: list[LineOutcome]) -> dict[str, LineOutcome]:
    return {o.custom_id: o for o in outcomes}


# -- the fake server's routes, through the raw SDK --------------------------------------------


def test_a_file_is_uploaded_described_read_and_deleted(server: FakeLLMServer) -> None:
    import openai

    client = sdk(server)
    content = jsonl(line("a"), line("b"))
    made = client.files.create(file=("reqs.jsonl", content), purpose="batch")
    assert made.object == "file" and made.id.startswith("file-")
    assert (made.purpose, made.filename, made.bytes) == ("batch", "reqs.jsonl", len(content))
    assert client.files.retrieve(made.id).bytes == len(content)
    assert client.files.content(made.id).content == content
    assert server.openai_file(made.id).content == content
    assert client.files.delete(made.id).deleted is True
    with pytest.raises(openai.NotFoundError, match="No such File object"):
        client.files.retrieve(made.id)
    assert [c.operation for c in server.batch_calls] == ["upload", "file", "file", "file", "file"]


def test_a_batch_upload_must_be_jsonl(server: FakeLLMServer) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="Must be .jsonl"):
        sdk(server).files.create(file=("reqs.txt", b"{}\n"), purpose="batch")


def test_a_batch_moves_at_each_read_and_ends_with_its_output_file(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(validating_polls=1, running_polls=1))
    server.script("gpt-x", [Reply("first", input_tokens=4, output_tokens=2), "second"])
    client = sdk(server)
    made = make_batch(client, jsonl(line("a", "one"), line("b", "two")), label="L1")
    assert made.status == "validating" and made.id.startswith("batch_")
    assert made.metadata == {LABEL_KEY: "L1"}
    assert made.request_counts.total == 2 and made.output_file_id is None
    assert made.expires_at == made.created_at + 24 * 3600
    # Nothing is answered before the batch ends; a listing moves nothing.
    assert client.batches.list().data[0].status == "validating"
    assert server.requests == []

    assert raw_batch(server, made.id)["status"] == "validating"
    running = raw_batch(server, made.id)
    assert running["status"] == "in_progress" and running["in_progress_at"] is not None
    done = raw_batch(server, made.id)
    assert done["status"] == "completed"
    assert done["completed_at"] is not None and done["finalizing_at"] is not None
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert done["error_file_id"] is None and done["model"] == "gpt-x"
    assert done["usage"]["input_tokens"] == 4 + 1 and done["usage"]["output_tokens"] == 2 + 1

    rows = result_lines(client, done["output_file_id"])
    assert [r["custom_id"] for r in rows] == ["a", "b"]
    for row in rows:
        assert row["id"].startswith("batch_req_") and row["error"] is None
        assert row["response"]["status_code"] == 200 and row["response"]["request_id"]
    body = rows[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == "gpt-x"
    assert body["choices"][0]["message"]["content"] == "first"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    from openai.types.chat import ChatCompletion

    ChatCompletion.model_validate(body)
    # Each answered line is logged as a request of its batch, with no headers.
    logged = server.requests
    assert [(r.batch_id, r.custom_id, r.path) for r in logged] == [
        (made.id, "a", f"batch:{made.id}"),
        (made.id, "b", f"batch:{made.id}"),
    ]
    assert logged[1].last_user_message == "two" and logged[0].api_key == KEY
    assert server.batch(made.id).label == "L1"
    assert client.files.retrieve(done["output_file_id"]).purpose == "batch_output"


def test_lines_answered_with_errors_go_to_the_error_file(server: FakeLLMServer) -> None:
    server.script(
        "gpt-x",
        [
            "ok",
            Fault(400, "bad request here"),
            Fault(503),
            Fault.malformed("empty_choices"),
            Fault.reset(),
        ],
    )
    client = sdk(server)
    made = make_batch(client, jsonl(*(line(c) for c in "abcde")))
    raw_batch(server, made.id)
    done = raw_batch(server, made.id)
    # A reply of a broken shape still came with status 200: it is an output line.
    assert done["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    output = result_lines(client, done["output_file_id"])
    assert [r["custom_id"] for r in output] == ["a", "d"]
    assert output[1]["response"]["body"]["choices"] == []
    errors = result_lines(client, done["error_file_id"])
    assert [(r["custom_id"], r["response"]["status_code"]) for r in errors] == [
        ("b", 400),
        ("c", 503),
        ("e", 500),  # a reset, which a batch cannot show, is a server error
    ]
    assert errors[0]["error"] is None
    assert errors[0]["response"]["body"]["error"]["message"] == "bad request here"
    assert errors[0]["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert errors[1]["response"]["body"]["error"]["type"] == "server_error"


def test_an_expired_batch_has_results_for_the_lines_it_ran(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(outcome="expired", answered=1))
    client = sdk(server)
    made = make_batch(client, jsonl(line("a"), line("b"), line("c")))
    raw_batch(server, made.id)
    done = raw_batch(server, made.id)
    assert done["status"] == "expired" and done["expired_at"] is not None
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 0}
    assert [r["custom_id"] for r in result_lines(client, done["output_file_id"])] == ["a"]
    never = result_lines(client, done["error_file_id"])
    assert [(r["custom_id"], r["response"], r["error"]["code"]) for r in never] == [
        ("b", None, "batch_expired"),
        ("c", None, "batch_expired"),
    ]
    assert len(server.requests) == 1


def test_a_cancelled_batch_is_cancelling_until_read(server: FakeLLMServer) -> None:
    import openai

    server.batch_script(BatchPlan(running_polls=50))
    client = sdk(server)
    made = make_batch(client, jsonl(line("a"), line("b")))
    assert raw_batch(server, made.id)["status"] == "in_progress"
    cancelling = client.batches.cancel(made.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = raw_batch(server, made.id)
    assert done["status"] == "cancelled" and done["cancelled_at"] is not None
    assert done["output_file_id"] is None
    codes = [r["error"]["code"] for r in result_lines(client, done["error_file_id"])]
    assert codes == ["batch_cancelled", "batch_cancelled"]
    assert server.requests == []
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a batch with status"):
        client.batches.cancel(made.id)
    with pytest.raises(openai.NotFoundError, match="No batch found"):
        client.batches.cancel("batch_nope")


def test_a_batch_the_plan_fails_says_why_and_has_no_files(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(outcome="failed", message="the fake ran out of capacity"))
    client = sdk(server)
    made = make_batch(client, jsonl(line("a")))
    raw_batch(server, made.id)
    done = raw_batch(server, made.id)
    assert done["status"] == "failed" and done["failed_at"] is not None
    assert done["errors"]["data"][0]["message"] == "the fake ran out of capacity"
    assert done["output_file_id"] is None and done["error_file_id"] is None
    assert server.requests == []


@pytest.mark.parametrize(
    ("rows", "code", "at"),
    [
        ([line("a"), "{not json"], "invalid_json_line", 2),
        ([line("a"), {"method": "POST", "url": "/v1/chat/completions", "body": {}}], None, 2),
        ([line("a"), line("a")], "duplicate_custom_id", 2),
        ([line("a", url="/v1/embeddings")], "url_mismatch", 1),
        ([line("a", model="gpt-x"), line("b", model="gpt-y")], "model_mismatch", 2),
        ([line("a", method="GET")], "invalid_method", 1),
    ],
)
def test_an_invalid_input_file_fails_the_batch_naming_the_line(
    server: FakeLLMServer, rows: list[Any], code: str | None, at: int
) -> None:
    client = sdk(server)
    made = make_batch(client, jsonl(*rows))
    done = raw_batch(server, made.id)
    assert done["status"] == "failed"
    [error] = done["errors"]["data"]
    assert error["line"] == at
    assert error["code"] == (code or "missing_required_parameter")
    if code is None:
        assert error["param"] == "custom_id"
    assert done["request_counts"]["total"] == 0
    assert server.requests == []


def test_the_limits_of_one_batch_fail_it_and_take_no_plan(server: FakeLLMServer) -> None:
    server.openai_batch_max_requests = 2
    server.openai_batch_max_bytes = 1000
    server.batch_script([BatchPlan(outcome="expired", answered=0)])
    client = sdk(server)
    many = make_batch(client, jsonl(line("a"), line("b"), line("c")))
    big = make_batch(client, jsonl(line("a", "x" * 1000)))
    empty = make_batch(client, b"\n")
    for made, code in ((many, "too_many_tasks"), (big, "file_too_large"), (empty, "empty_file")):
        done = raw_batch(server, made.id)
        assert done["status"] == "failed"
        assert [e["code"] for e in done["errors"]["data"]] == [code]
    # The batches refused on validation took none of the test's plans.
    fine = make_batch(client, jsonl(line("a"), line("b")))
    raw_batch(server, fine.id)
    assert raw_batch(server, fine.id)["status"] == "expired"


def test_the_defaults_are_openais_limits_and_the_clients(server: FakeLLMServer) -> None:
    assert server.openai_batch_max_requests == OPENAI_BATCH_LIMITS.max_requests == 50_000
    assert server.openai_batch_max_bytes == OPENAI_BATCH_LIMITS.max_bytes == 200 * 1024 * 1024
    assert OpenAIBatchRoutes.openai_batch_max_requests == 50_000
    assert FAKE_LABEL_KEY == LABEL_KEY


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"input_file_id": "file-nope"}, "NotFoundError", "No such File object"),
        ({"completion_window": "48h"}, "BadRequestError", "24h"),
        ({"endpoint": "/v1/embeddings"}, "BadRequestError", "chat/completions"),
        ({"endpoint": "/v1/nothing"}, "BadRequestError", "not a supported endpoint"),
        ({"metadata": {f"k{n}": "v" for n in range(17)}}, "BadRequestError", "16"),
        ({"metadata": {"k": "v" * 513}}, "BadRequestError", "512"),
    ],
)
def test_a_creation_openai_refuses_at_once(
    server: FakeLLMServer, change: dict[str, Any], error: str, match: str
) -> None:
    import openai

    client = sdk(server)
    params: dict[str, Any] = {
        "input_file_id": upload(client, jsonl(line("a"))),
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    with pytest.raises(getattr(openai, error), match=match):
        client.batches.create(**{**params, **change})
    assert server.batches == []


def test_a_file_not_uploaded_for_batches_is_refused(server: FakeLLMServer) -> None:
    import openai

    client = sdk(server)
    other = client.files.create(file=("notes.jsonl", jsonl(line("a"))), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        client.batches.create(
            input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_batches_are_listed_newest_first_a_page_at_a_time(server: FakeLLMServer) -> None:
    client = sdk(server)
    made = [make_batch(client, jsonl(line("a"))).id for _ in range(5)]
    newest = list(reversed(made))
    first = client.batches.with_raw_response.list(limit=2)
    page = json.loads(first.content)
    assert page["object"] == "list" and page["has_more"] is True
    assert [b["id"] for b in page["data"]] == newest[:2]
    assert (page["first_id"], page["last_id"]) == (newest[0], newest[1])
    second = client.batches.list(limit=2, after=newest[1])
    assert [b.id for b in second.data] == newest[2:4] and second.has_more is True
    last = client.batches.list(limit=2, after=newest[3])
    assert [b.id for b in last.data] == newest[4:] and last.has_more is False
    # The SDK's own paging walks every page.
    assert [b.id for b in client.batches.list(limit=2)] == newest
    # Listing moves nothing.
    assert all(server.batch(i).polls == 0 for i in made)
    import openai

    with pytest.raises(openai.BadRequestError, match="limit"):
        client.batches.list(limit=101)


def test_a_wrong_key_is_refused_with_401(server: FakeLLMServer) -> None:
    import openai

    client = sdk(server, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        client.files.create(file=("in.jsonl", jsonl(line("a"))), purpose="batch")
    with pytest.raises(openai.AuthenticationError):
        client.batches.list()
    assert [c.operation for c in server.batch_calls] == ["upload", "list"]


def test_a_scripted_fault_answers_the_next_request_of_its_operation(
    server: FakeLLMServer,
) -> None:
    import openai

    client = sdk(server)
    made = make_batch(client, jsonl(line("a")))
    server.batch_fault("status", Fault(500, "status is down"))
    with pytest.raises(openai.InternalServerError):
        client.batches.retrieve(made.id)
    assert client.batches.retrieve(made.id).status == "in_progress"


# -- OpenAIBatchAPI end to end ------------------------------------------------------------


async def test_batch_lines_are_the_live_bodies_and_answers_the_live_answers(
    server: FakeLLMServer,
) -> None:
    w = worker(server, structured_outputs="vllm-legacy", system_prompt="Be brief.")
    tool = ToolSpec("lookup", "find a thing", {"type": "object", "properties": {}})
    reqs = [
        request("one", top_k=5, extra_headers={"X-Trace": "t1"}),
        ModelRequest(
            messages=({"role": "user", "content": "two"},),
            params={"max_tokens": 9},
            grammar='root ::= "Echo: two"',
        ),
        ModelRequest(messages=({"role": "user", "content": "three"},), tools=(tool,)),
    ]
    batch = [BatchEntry(f"{k:064x}", r) for k, r in enumerate(reqs)]
    live_client = OpenAIClient(w)
    live = [await live_client.send(r, timeout_s=10) for r in reqs]
    await live_client.aclose()
    live_bodies = [r.body for r in server.requests]
    live_headers = server.requests[0].headers

    api = OpenAIBatchAPI(w)
    batch_id = await run_batch(api, batch)
    outcomes = by_id(await api.results(batch_id))
    await api.aclose()

    answered = [r for r in server.requests if r.batch_id == batch_id]
    assert [r.body for r in answered] == live_bodies
    assert live_bodies[0]["top_k"] == 5 and "extra_headers" not in live_bodies[0]
    assert live_headers["x-trace"] == "t1"
    assert live_bodies[1]["guided_grammar"] == 'root ::= "Echo: two"'
    assert live_bodies[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert live_bodies[2]["tools"][0]["function"]["name"] == "lookup"
    for entry, want in zip(batch, live, strict=True):
        got = outcomes[entry.custom_id].completion
        assert got is not None
        assert (got.text, got.usage, got.model, got.finish_reason, got.tool_calls) == (
            want.text,
            want.usage,
            want.model,
            want.finish_reason,
            want.tool_calls,
        )
        assert got.reported_cost == want.reported_cost
        # The kept body has the live body's fields (its ids and times are its own).
        assert got.raw.keys() == want.raw.keys()
        assert got.raw["choices"] == want.raw["choices"]
        assert got.raw["usage"] == want.raw["usage"]


async def test_a_reply_the_grammar_does_not_admit_fails_as_live(server: FakeLLMServer) -> None:
    server.script("gpt-x", "not what was asked")
    w = worker(server, structured_outputs="llama.cpp")
    req = ModelRequest(messages=({"role": "user", "content": "q"},), grammar='root ::= "yes"')
    with pytest.raises(GrammarIgnoredError):
        await OpenAIClient(w).send(req, timeout_s=10)
    api = OpenAIBatchAPI(w)
    batch_id = await run_batch(api, [BatchEntry("a" * 64, req)])
    [outcome] = await api.results(batch_id)
    assert isinstance(outcome.error, GrammarIgnoredError)
    assert server.requests[-1].body["grammar"] == 'root ::= "yes"'
    await api.aclose()


async def test_line_errors_are_what_live_calls_raise(server: FakeLLMServer) -> None:
    server.script(
        "gpt-x",
        [
            "fine",
            Fault(429, "slow down"),
            Fault(400, "bad request"),
            Fault.malformed("empty_choices"),
            Fault(500),
            Fault.raw("<html>oops</html>", status=200, content_type="text/html"),
        ],
    )
    api = OpenAIBatchAPI(worker(server))
    batch = entries("a", "b", "c", "d", "e", "f")
    batch_id = await run_batch(api, batch)
    status = await api.status(batch_id)
    assert (status.state, status.total, status.succeeded, status.failed) == ("ended", 6, 3, 3)
    got = by_id(await api.results(batch_id))
    kinds = [got[e.custom_id] for e in batch]
    assert kinds[0].completion is not None and kinds[0].completion.text == "fine"
    assert isinstance(kinds[1].error, RateLimitError) and kinds[1].error.status == 429
    assert isinstance(kinds[2].error, BadRequestError)
    assert "bad request" in str(kinds[2].error)
    assert isinstance(kinds[3].error, BadResponseError)
    assert isinstance(kinds[4].error, ServerError)
    assert isinstance(kinds[5].error, BadResponseError)
    assert all(k.error.target == "w-batch" for k in kinds[1:] if k.error is not None)
    await api.aclose()


async def test_an_expired_batch_returns_only_the_answered_lines(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(outcome="expired", answered=2))
    api = OpenAIBatchAPI(worker(server))
    batch = entries("a", "b", "c", "d")
    batch_id = await run_batch(api, batch)
    status = await api.status(batch_id)
    assert (status.state, status.succeeded) == ("expired", 2)
    outcomes = await api.results(batch_id)
    assert sorted(o.custom_id for o in outcomes) == [e.custom_id for e in batch[:2]]
    assert all(o.completion is not None for o in outcomes)
    await api.aclose()


async def test_a_failed_batch_says_why_and_has_no_results(server: FakeLLMServer) -> None:
    server.batch_script(BatchPlan(outcome="failed", message="capacity is short"))
    api = OpenAIBatchAPI(worker(server))
    batch_id = await run_batch(api, entries("a", "b"))
    status = await api.status(batch_id)
    assert (status.state, status.detail) == ("failed", "capacity is short")
    assert await api.results(batch_id) == []
    # A batch refused on validation names the line and the reason.
    client = sdk(server)
    bad = make_batch(client, jsonl(line("x"), "{torn"))
    refused = await api.status(bad.id)
    assert refused.state == "failed"
    assert refused.detail == "line 2: This line is not parseable as valid JSON."
    await api.aclose()


async def test_cancel_stops_a_batch_and_its_lines_are_not_returned(
    server: FakeLLMServer,
) -> None:
    server.batch_script(BatchPlan(running_polls=100))
    api = OpenAIBatchAPI(worker(server))
    batch_id = await api.submit(entries("a", "b"), label="c1")
    assert (await api.status(batch_id)).state == "running"
    await api.cancel(batch_id)
    assert (await api.status(batch_id)).state == "cancelled"
    assert await api.results(batch_id) == []
    # Cancelling a batch that has ended is nothing to do.
    await api.cancel(batch_id)
    with pytest.raises(BadRequestError):
        await api.cancel("batch_unknown")
    assert server.requests == []
    await api.aclose()


async def test_find_recovers_a_batch_whose_id_was_never_kept(server: FakeLLMServer) -> None:
    lost = OpenAIBatchAPI(worker(server))
    batch = entries("a", "b")
    lost_id = await lost.submit(batch, label="conductor-run-w0-w-batch-0")
    await lost.aclose()
    # More batches after it than one page of the list holds.
    client = sdk(server)
    for _ in range(104):
        make_batch(client, jsonl(line("z")), label="someone-else")

    fresh = OpenAIBatchAPI(worker(server))
    assert await fresh.find("conductor-run-w0-w-batch-0") == lost_id
    assert await fresh.find("conductor-never-sent") is None
    lists = [c for c in server.batch_calls if c.operation == "list"]
    assert len(lists) == 4  # two pages for each search
    for _ in range(3):
        await fresh.status(lost_id)
    outcomes = await fresh.results(lost_id)
    assert sorted(o.custom_id for o in outcomes) == [e.custom_id for e in batch]
    await fresh.aclose()


async def test_a_server_error_while_polling_or_reading_may_pass(server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(worker(server))
    batch_id = await api.submit(entries("a"), label="p")
    server.batch_fault("status", Fault(500, "try later"))
    with pytest.raises(RetryableError):
        await api.status(batch_id)
    server.batch_fault("status", Fault(429, "slow down"))
    with pytest.raises(RateLimitError):
        await api.status(batch_id)
    while not (await api.status(batch_id)).terminal:
        pass
    server.batch_fault("results", Fault(503))
    with pytest.raises(RetryableError):
        await api.results(batch_id)
    assert len(await api.results(batch_id)) == 1
    await api.aclose()


async def test_a_wrong_key_fails_for_good_and_is_never_shown(
    server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "sk-wrong-secret-9876543210fedcba"
    monkeypatch.setenv(KEY_ENV, wrong)
    api = OpenAIBatchAPI(worker(server))
    with pytest.raises(AuthenticationError) as submitting:
        await api.submit(entries("a"), label="k")
    with pytest.raises(AuthenticationError) as polling:
        await api.status("batch_x")
    for err in (submitting.value, polling.value):
        assert wrong not in str(err) and wrong not in err.provider_message
        assert err.status == 401 and not err.retryable
    await api.aclose()


async def test_the_key_is_masked_in_line_and_submission_errors(server: FakeLLMServer) -> None:
    server.script("gpt-x", Fault(400, f"your key {KEY} cannot do that"))
    api = OpenAIBatchAPI(worker(server))
    batch_id = await run_batch(api, entries("a"))
    [outcome] = await api.results(batch_id)
    assert isinstance(outcome.error, BadRequestError)
    assert KEY not in str(outcome.error) and KEY not in outcome.error.provider_message
    assert "***" in outcome.error.provider_message
    server.batch_fault("create", Fault(400, f"no batches for {KEY}"))
    with pytest.raises(BadRequestError) as info:
        await api.submit(entries("b"), label="k2")
    assert KEY not in str(info.value) and KEY not in info.value.provider_message
    await api.aclose()


async def test_a_refused_submission_leaves_no_upload_behind(server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(worker(server))
    server.batch_fault("create", Fault(404, "this server runs no batches"))
    with pytest.raises(BadRequestError):
        await api.submit(entries("a"), label="gone")
    ops = [c.operation for c in server.batch_calls]
    assert ops == ["upload", "create", "file"]
    upload_path = server.batch_calls[-1].path
    with pytest.raises(KeyError):
        server.openai_file(upload_path.rsplit("/", 1)[1])
    await api.aclose()


async def test_torn_and_foreign_result_lines_are_left_out(server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(worker(server))
    batch = entries("a", "b")
    batch_id = await run_batch(api, batch)
    output_id = sdk(server).batches.retrieve(batch_id).output_file_id
    rows = server.openai_file(output_id).content.splitlines()
    foreign = json.loads(rows[0])
    foreign["custom_id"] = "f" * 64
    torn = rows[1][: len(rows[1]) // 2]
    content = b"\n".join([rows[0], rows[0], json.dumps(foreign).encode(), b"[1, 2]", torn])
    server.replace_openai_file(output_id, content + b"\n")
    outcomes = await api.results(batch_id)
    assert [o.custom_id for o in outcomes] == [batch[0].custom_id]
    await api.aclose()


async def test_chunks_cut_in_order_within_the_limits(server: FakeLLMServer) -> None:
    api = OpenAIBatchAPI(worker(server))
    assert api.limits == OPENAI_BATCH_LIMITS
    batch = entries("a", "b", "c", "d", "e")
    assert api.chunks(batch) == [batch]
    api.limits = BatchLimits(max_requests=2, max_bytes=10**6)
    assert api.chunks(batch) == [batch[0:2], batch[2:4], batch[4:]]
    sizes = [len(api.line(e)) for e in batch]
    api.limits = BatchLimits(max_requests=100, max_bytes=sizes[0] * 2 + 1)
    assert api.chunks(batch) == [batch[0:2], batch[2:4], batch[4:]]
    assert api.chunks([]) == []
    big = BatchEntry("9" * 64, request("x" * (sizes[0] * 3)))
    with pytest.raises(BadRequestError, match="larger than a batch may be"):
        api.chunks([*batch, big])
    # A chunk the client cuts is one the server takes whole.
    server.openai_batch_max_bytes = api.limits.max_bytes
    server.openai_batch_max_requests = 2
    api.limits = BatchLimits(max_requests=2, max_bytes=api.limits.max_bytes)
    for number, chunk in enumerate(api.chunks(batch)):
        assert (await api.status(await run_batch(api, chunk, f"c{number}"))).state == "ended"
    await api.aclose()


@pytest.mark.parametrize("prefix", ["openai", "hosted_vllm"])
async def test_litellm_workers_batch_through_the_same_protocol(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each reads the key litellm would: OPENAI_API_KEY, HOSTED_VLLM_API_KEY.
    env = "OPENAI_API_KEY" if prefix == "openai" else "HOSTED_VLLM_API_KEY"
    monkeypatch.setenv(env, KEY)
    with FakeLLMServer(expected_api_key=KEY) as srv:
        w = Worker(id="lite", model=f"{prefix}/gpt-x", api_base=srv.openai_base)
        api = batch_api(w)
        assert isinstance(api, OpenAIBatchAPI)
        batch = entries("one")
        batch_id = await run_batch(api, batch)
        [outcome] = await api.results(batch_id)
        assert outcome.completion is not None and outcome.completion.text == "Echo: one"
        [answered] = srv.requests
        assert answered.model == "gpt-x" and answered.api_key == KEY
        # An api_base server is sent max_tokens as it is (OpenAI's own wants it renamed).
        assert answered.body["max_tokens"] == 64
        await api.aclose()


# Each status word OpenAI writes, and one it may add later (still running: waiting
# longer is safe, ending early is not).
WORDS = (
    "validating=validating in_progress=running finalizing=running cancelling=running "
    "completed=ended failed=failed expired=expired cancelled=cancelled "
    "a_word_openai_adds_later=running"
)


@pytest.mark.parametrize(("word", "state"), [pair.split("=") for pair in WORDS.split()])
def test_status_words_map_to_the_common_states(word: str, state: str) -> None:
    counts = {"total": 3, "completed": 2, "failed": 1}
    got = status_of({"status": word, "request_counts": counts})
    assert (got.state, got.total, got.succeeded, got.failed) == (state, 3, 2, 1)


def test_a_status_with_no_word_or_many_errors() -> None:
    assert status_of({}).state == "running"
    many = {"data": [{"line": n, "message": "bad"} for n in range(1, 8)]}
    detail = status_of({"status": "failed", "errors": many}).detail
    assert detail is not None and detail.endswith("; and 2 more")


def test_the_class_is_a_batch_api() -> None:
    api = OpenAIBatchAPI(Worker(id="w", model="gpt-x", client="openai"))
    assert isinstance(api, BatchAPI)
    assert isinstance(api.limits, BatchLimits)


async def test_the_wave_batcher_runs_its_waves_through_the_openai_batch_api(
    server: FakeLLMServer, tmp_path: Path
) -> None:
    # The batcher makes the worker's API itself (the factory's), as a bench does: the
    # first batch expires with one line answered, and the next wave sends the others.
    server.batch_script([BatchPlan(outcome="expired", answered=1), BatchPlan()])
    w = worker(server, model="openai/gpt-x", client="litellm")
    cache = ResponseCache(tmp_path / "cache")
    poll = BatchPoll(first_s=0.001, growth=1.0, max_s=0.001)
    batcher = WaveBatcher([w], BatchJournal(tmp_path), cache, poll=poll)

    async def sample(ticket: SampleTicket, req: ModelRequest) -> str:
        ticket.enter()
        try:
            answer = await batcher.call(w, req, cache_key(w, req))
        finally:
            ticket.release()
        assert answer.raw.batch
        return answer.raw.text

    reqs = [request(f"q{k}") for k in range(3)]
    try:
        # Every ticket is taken before any sample starts, as the runner's dispatcher does.
        tickets = [batcher.admit() for _ in reqs]
        texts = await asyncio.gather(*(sample(t, r) for t, r in zip(tickets, reqs, strict=True)))
    finally:
        await batcher.aclose()
        cache.close()
    assert texts == ["Echo: q0", "Echo: q1", "Echo: q2"]
    assert [len(b.lines) for b in server.batches] == [3, 2]
    # Each call was paid for once.
    assert sorted(r.last_user_message for r in server.requests) == ["q0", "q1", "q2"]
