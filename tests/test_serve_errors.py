"""`conductor serve`'s error statuses over plain HTTP (httpx), each in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``): 401, 400, 413, 429 and 502."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists
from kit.servekit import error_of, make_pool, served

from conductor.testing import FakeLLMServer, Fault, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

QUESTION = [{"role": "user", "content": "Capital of France?"}]


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "conductor", "messages": QUESTION, **extra}


@pytest.fixture
def answered(fake_server: FakeLLMServer) -> FakeLLMServer:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", "Paris")
    return fake_server


def test_401_without_or_with_a_wrong_bearer(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered), api_key="right-key-123") as url:
        missing = httpx.post(f"{url}/chat/completions", json=body(), timeout=30)
        wrong = httpx.post(
            f"{url}/chat/completions",
            json=body(),
            headers={"Authorization": "Bearer wrong-key-456"},
            timeout=30,
        )
        models = httpx.get(f"{url}/models", timeout=30)
        # The README's health check answers without a token (for load balancers).
        health = httpx.get(f"{url.removesuffix('/v1')}/health", timeout=30)
        right = httpx.post(
            f"{url}/chat/completions",
            json=body(),
            headers={"Authorization": "Bearer right-key-123"},
            timeout=30,
        )
    for resp in (missing, wrong, models):
        error = error_of(resp, 401)
        assert error["code"] == "invalid_api_key"
        assert error["type"] == "authentication_error"
        assert "right-key-123" not in resp.text  # the key is never echoed
    assert right.status_code == 200, right.text
    assert right.json()["choices"][0]["message"]["content"] == "Paris"
    assert health.status_code == 200, health.text
    # Refused requests made no calls; only the authorised one ran.
    assert len(answered.requests_for("w0")) == 1


def test_no_api_key_set_needs_no_bearer(tmp_path: Path, answered: FakeLLMServer) -> None:
    # Catches a server that asks for a key it was never given.
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body(), timeout=30)
    assert resp.status_code == 200, resp.text


def test_400_bad_json(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            content=b'{"model": "conductor", "messages": [',
            headers={"content-type": "application/json"},
            timeout=30,
        )
    error = error_of(resp, 400)
    assert error["type"] == "invalid_request_error"
    assert answered.requests == []


@pytest.mark.parametrize(
    "payload",
    [
        {"model": "conductor"},  # no messages
        {"model": "conductor", "messages": "hello"},  # not a list
        {"messages": QUESTION},  # no model
        [1, 2, 3],  # not an object
        {"model": "conductor", "messages": []},  # no question
        {"model": "conductor", "messages": [{"role": "system", "content": "Be terse."}]},
        {"model": "conductor", "messages": [{"role": "user"}]},  # no content
    ],
    ids=[
        "no-messages",
        "messages-not-a-list",
        "no-model",
        "not-an-object",
        "empty-messages",
        "no-user-message",
        "message-without-content",
    ],  # fmt: skip
)
def test_400_bad_body(tmp_path: Path, answered: FakeLLMServer, payload: Any) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=payload, timeout=30)
    error = error_of(resp, 400)
    assert error["type"] == "invalid_request_error"
    assert answered.requests == []


@pytest.mark.parametrize("model", ["gpt-9", "single:nobody", "vote:3:nobody"])
def test_400_unknown_model(tmp_path: Path, answered: FakeLLMServer, model: str) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body(model=model), timeout=30)
    error = error_of(resp, 400)
    assert error["code"] == "model_not_found"
    assert model in error["message"] or model.split(":")[-1] in error["message"]
    assert answered.requests == []


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("functions", [{"name": "f", "parameters": {}}]),
        ("logprobs", True),
        ("top_logprobs", 2),
        ("logit_bias", {"50256": -100}),
    ],
)
def test_400_unsupported_parameter_is_named(
    tmp_path: Path, answered: FakeLLMServer, param: str, value: Any
) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body(**{param: value}), timeout=30)
    error = error_of(resp, 400)
    assert error["param"] == param
    assert param in error["message"]
    assert answered.requests == []


def test_text_response_format_is_accepted(tmp_path: Path, answered: FakeLLMServer) -> None:
    # Only formats an orchestration cannot honour are refused; "text" is what it gives.
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            json=body(response_format={"type": "text"}),
            timeout=30,
        )
    assert resp.status_code == 200, resp.text


def test_413_over_the_size_limit(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered), max_body_bytes=4096) as url:
        big = [{"role": "user", "content": "x" * 10_000}]
        resp = httpx.post(f"{url}/chat/completions", json=body(messages=big), timeout=30)
        small = httpx.post(f"{url}/chat/completions", json=body(), timeout=30)
    error = error_of(resp, 413)
    assert error["code"] == "request_too_large"
    assert small.status_code == 200, small.text
    assert len(answered.requests_for("w0")) == 1  # only the small request ran


@pytest.mark.long
async def test_429_when_the_queue_is_full(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # One slot, one place in the queue, three requests while the first is slow: one is
    # refused at once with Retry-After; the other two are answered.
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Reply("Paris", latency_s=2.0))
    pool = make_pool(tmp_path, fake_server)
    with served(pool, max_concurrency=1, max_queue=1) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            resps = await asyncio.gather(
                *(http.post(f"{url}/chat/completions", json=body()) for _ in range(3))
            )
    statuses = sorted(r.status_code for r in resps)
    assert statuses == [200, 200, 429], [r.text for r in resps]
    (refused,) = [r for r in resps if r.status_code == 429]
    error = error_of(refused, 429)
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith("the server is busy: 1 request is running and 1 is waiting")
    assert refused.headers["retry-after"] == "1"
    # The refused request made no calls: two plans, two worker calls.
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 2
    assert len(fake_server.requests_for("w0")) == 2


@pytest.mark.long
async def test_queued_requests_wait_their_turn(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # max_concurrency=1: two requests never run at once (w0's calls do not overlap).
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Reply("Paris", latency_s=0.5))
    pool = make_pool(tmp_path, fake_server)
    with served(pool, max_concurrency=1, max_queue=4) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            resps = await asyncio.gather(
                *(http.post(f"{url}/chat/completions", json=body()) for _ in range(2))
            )
    assert [r.status_code for r in resps] == [200, 200]
    first, second = fake_server.requests_for(CONDUCTOR_MODEL)
    w0_first = fake_server.requests_for("w0")[0]
    # The second plan is asked for only after the first run's worker answered.
    assert second.received_at >= w0_first.received_at + 0.4


def test_502_when_a_worker_fails_auth(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Fault(401, "Incorrect API key provided"))
    with served(make_pool(tmp_path, fake_server)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body(), timeout=60)
        single = httpx.post(f"{url}/chat/completions", json=body(model="single:w0"), timeout=60)
    for r in (resp, single):
        error = error_of(r, 502)
        assert error["code"] == "orchestration_failed"
        assert error["type"] == "server_error"
        # The reason comes from the run record: the worker and the provider's words.
        assert "Incorrect API key provided" in error["message"] or "401" in error["message"]
        assert "w0" in error["message"]


def test_502_when_the_conductor_reply_is_unparseable(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, "no lists here at all")
    with served(make_pool(tmp_path, fake_server)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body(), timeout=60)
    error = error_of(resp, 502)
    assert error["code"] == "orchestration_failed"
    assert "could not be parsed" in error["message"]
    assert fake_server.requests_for("w0") == []
