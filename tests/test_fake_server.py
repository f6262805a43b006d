"""The fake provider server, driven by the real openai, anthropic and google-genai SDKs."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply


def _openai(server: FakeLLMServer, key: str = "sk-test") -> Any:
    import openai

    return openai.OpenAI(base_url=server.openai_base, api_key=key, max_retries=0)


def _anthropic(server: FakeLLMServer, key: str = "ak-test") -> Any:
    import anthropic

    return anthropic.Anthropic(base_url=server.anthropic_base, api_key=key, max_retries=0)


def _gemini(server: FakeLLMServer, key: str = "gk-test") -> Any:
    from google import genai
    from google.genai import types

    return genai.Client(
        api_key=key,
        http_options=types.HttpOptions(
            base_url=server.gemini_base, retry_options=types.HttpRetryOptions(attempts=1)
        ),
    )


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """A raw JSON POST; returns (status, headers, parsed body)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


# -- OpenAI -----------------------------------------------------------------------------------


def test_openai_scripted_text_usage_and_log(fake_server: FakeLLMServer) -> None:
    fake_server.script("gpt-x", [Reply("The answer is 42.", input_tokens=11, output_tokens=5)])
    resp = _openai(fake_server).chat.completions.create(
        model="gpt-x",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is six times seven?"}]},
        ],
    )
    assert resp.object == "chat.completion"
    assert resp.model == "gpt-x"
    assert resp.choices[0].message.content == "The answer is 42."
    assert resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (11, 5)
    assert resp.usage.total_tokens == 16
    [req] = fake_server.requests
    assert req.protocol == "openai"
    assert req.path == "/v1/chat/completions"
    assert req.api_key == "sk-test"
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is six times seven?"},
    ]
    assert req.headers["authorization"] == "Bearer sk-test"


def test_default_echo_and_word_count_usage(fake_server: FakeLLMServer) -> None:
    long = "word " * 40
    resp = _openai(fake_server).chat.completions.create(
        model="anything",
        messages=[
            {"role": "system", "content": "two words"},
            {"role": "user", "content": long},
        ],
    )
    assert resp.choices[0].message.content == "Echo: " + long[:80]
    assert resp.usage.prompt_tokens == 42
    assert resp.usage.completion_tokens == len(("Echo: " + long[:80]).split())


def test_openai_list_is_consumed_and_last_repeats(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", ["one", "two"])
    client = _openai(fake_server)
    texts = [
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        .choices[0]
        .message.content
        for _ in range(4)
    ]
    assert texts == ["one", "two", "two", "two"]
    assert len(fake_server.requests_for("m")) == 4
    assert fake_server.requests_for("other") == []


def test_openai_rate_limit_fault_has_retry_after(fake_server: FakeLLMServer) -> None:
    import openai

    fake_server.script("m", [Fault(429, "slow down", headers={"Retry-After": "1"}), "ok"])
    client = _openai(fake_server)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.body["message"] == "slow down"  # type: ignore[index]
    assert info.value.code == "rate_limit_exceeded"
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert ok.choices[0].message.content == "ok"


def test_openai_server_error_and_bad_key() -> None:
    import openai

    with FakeLLMServer(expected_api_key="right") as server:
        with pytest.raises(openai.AuthenticationError):
            _openai(server, key="wrong").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        server.script("m", Fault(503))
        with pytest.raises(openai.InternalServerError) as info:
            _openai(server, key="right").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.status_code == 503
        # Rejected requests are logged too, so retry counts can be asserted.
        assert [r.api_key for r in server.requests] == ["wrong", "right"]


def test_openai_stream_with_usage(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", "alpha beta  gamma\ndelta")
    stream = _openai(fake_server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha beta  gamma\ndelta"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 4
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == 3
    assert chunks[-1].usage.completion_tokens == 4
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"


def test_openai_models_list(fake_server: FakeLLMServer) -> None:
    fake_server.script("b-model", "x")
    fake_server.script("a-model", "y")
    ids = [m.id for m in _openai(fake_server).models.list()]
    assert ids == ["a-model", "b-model"]


async def test_async_openai_and_async_callable(fake_server: FakeLLMServer) -> None:
    import openai

    async def responder(req: FakeRequest) -> Reply:
        await asyncio.sleep(0)
        return Reply(req.last_user_message.upper())

    fake_server.script("m", responder)
    client = openai.AsyncOpenAI(base_url=fake_server.openai_base, api_key="k", max_retries=0)
    resp = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "shout"}]
    )
    assert resp.choices[0].message.content == "SHOUT"
    await client.close()


# -- Anthropic --------------------------------------------------------------------------------


def test_anthropic_text_usage_and_system_prompt(fake_server: FakeLLMServer) -> None:
    fake_server.script("claude-x", lambda req: f"{len(req.messages)} messages")
    msg = _anthropic(fake_server).messages.create(
        model="claude-x",
        max_tokens=100,
        system="You are terse.",
        messages=[
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": "again"},
        ],
    )
    assert msg.type == "message"
    assert msg.content[0].text == "4 messages"
    assert msg.stop_reason == "end_turn"
    assert msg.usage.input_tokens == 3 + 2 + 1 + 1
    assert msg.usage.output_tokens == 2
    [req] = fake_server.requests
    assert req.protocol == "anthropic"
    assert req.api_key == "ak-test"
    assert req.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "again"},
    ]


def test_anthropic_errors() -> None:
    import anthropic

    with FakeLLMServer(expected_api_key="right") as server:
        with pytest.raises(anthropic.AuthenticationError) as auth:
            _anthropic(server, key="wrong").messages.create(
                model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}]
            )
        assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        server.script("c", [Fault(429, headers={"Retry-After": "2"}), Fault(500)])
        client = _anthropic(server, key="right")
        with pytest.raises(anthropic.RateLimitError) as rate:
            client.messages.create(
                model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}]
            )
        assert rate.value.response.headers["retry-after"] == "2"
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(
                model="c", max_tokens=10, messages=[{"role": "user", "content": "x"}]
            )


def test_anthropic_stream(fake_server: FakeLLMServer) -> None:
    fake_server.script("c", "streamed reply text")
    with _anthropic(fake_server).messages.stream(
        model="c", max_tokens=10, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed reply text"
    assert final.usage.output_tokens == 3
    assert final.stop_reason == "end_turn"


# -- Gemini -----------------------------------------------------------------------------------


def test_gemini_text_usage_and_normalised_messages(fake_server: FakeLLMServer) -> None:
    from google.genai import types

    fake_server.script("gemini-x", Reply("gem answer", input_tokens=7))
    client = _gemini(fake_server)  # kept alive: a dropped Client closes its HTTP client
    resp = client.models.generate_content(
        model="gemini-x",
        contents=[
            types.Content(role="user", parts=[types.Part(text="first")]),
            types.Content(role="model", parts=[types.Part(text="reply")]),
            types.Content(role="user", parts=[types.Part(text="a"), types.Part(text="b")]),
        ],
        config=types.GenerateContentConfig(system_instruction="Be exact."),
    )
    assert resp.text == "gem answer"
    assert resp.candidates[0].finish_reason == types.FinishReason.STOP
    assert resp.usage_metadata.prompt_token_count == 7
    assert resp.usage_metadata.candidates_token_count == 2
    assert resp.usage_metadata.total_token_count == 9
    [req] = fake_server.requests
    assert req.protocol == "gemini"
    assert req.model == "gemini-x"
    assert req.path.endswith("/models/gemini-x:generateContent")  # v1 or v1beta
    assert req.api_key == "gk-test"
    assert req.messages == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "a\nb"},
    ]


def test_gemini_errors() -> None:
    from google.genai import errors

    with FakeLLMServer(expected_api_key="right") as server:
        bad = _gemini(server, key="wrong")
        with pytest.raises(errors.ClientError) as auth:
            bad.models.generate_content(model="g", contents="x")
        assert auth.value.code == 401
        assert auth.value.status == "UNAUTHENTICATED"
        server.script("g", [Fault(429, "quota"), Fault(500)])
        client = _gemini(server, key="right")
        with pytest.raises(errors.ClientError) as rate:
            client.models.generate_content(model="g", contents="x")
        assert (rate.value.code, rate.value.status) == (429, "RESOURCE_EXHAUSTED")
        assert rate.value.message == "quota"
        with pytest.raises(errors.ServerError) as server_error:
            client.models.generate_content(model="g", contents="x")
        assert server_error.value.status == "INTERNAL"


def test_gemini_stream_and_query_key(fake_server: FakeLLMServer) -> None:
    fake_server.script("g", "one two three")
    client = _gemini(fake_server)
    chunks = list(client.models.generate_content_stream(model="g", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "one two three"
    assert chunks[-1].usage_metadata.candidates_token_count == 3
    fake_server.expected_api_key = "qk"
    status, _, body = _post(
        f"{fake_server.url}/v1/models/g:generateContent?key=qk",
        {"contents": [{"parts": [{"text": "hi"}]}]},
    )
    assert status == 200
    assert body["candidates"][0]["content"]["parts"][0]["text"] == "one two three"
    assert fake_server.requests[-1].api_key == "qk"
    # litellm's gemini provider posts to {api_base}/models/... with no version segment.
    status, _, body = _post(
        f"{fake_server.url}/models/g:generateContent",
        {"contents": [{"parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": "qk"},
    )
    assert status == 200 and body["modelVersion"] == "g"


# -- behaviour shared by all protocols --------------------------------------------------------


def test_error_shapes_raw(fake_server: FakeLLMServer) -> None:
    fake_server.set_default(Fault(429, "busy", headers={"Retry-After": "3"}))
    msgs = [{"role": "user", "content": "x"}]
    status, headers, body = _post(
        f"{fake_server.url}/chat/completions", {"model": "m", "messages": msgs}
    )
    assert status == 429 and headers["Retry-After"] == "3"
    assert body["error"]["message"] == "busy" and "type" in body["error"]
    status, _, body = _post(f"{fake_server.url}/v1/messages", {"model": "m", "messages": msgs})
    assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}}
    status, _, body = _post(f"{fake_server.url}/v1beta/models/m:generateContent", {})
    assert body == {"error": {"code": 429, "message": "busy", "status": "RESOURCE_EXHAUSTED"}}
    status, _, body = _post(f"{fake_server.url}/v1beta/models/m:countTokens", {})
    assert status == 404


@pytest.mark.long
def test_latency_per_reply_and_reset(fake_server: FakeLLMServer) -> None:
    # A server-wide latency far above what one local request takes, so that the
    # override is told apart from the default by a wide margin.
    fake_server.latency_s = 1.0
    fake_server.script("fast", [Reply("quick", latency_s=0.0)])
    client = _openai(fake_server)
    start = time.monotonic()
    client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "x"}])
    assert time.monotonic() - start < 1.0
    start = time.monotonic()
    client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
    assert time.monotonic() - start >= 1.0
    fake_server.reset()
    assert fake_server.requests == []
    resp = client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "y"}])
    assert resp.choices[0].message.content == "Echo: y"  # script cleared


@pytest.mark.long
async def test_concurrent_requests_are_not_serialised(fake_server: FakeLLMServer) -> None:
    import openai

    fake_server.latency_s = 2.0
    client = openai.AsyncOpenAI(base_url=fake_server.openai_base, api_key="k", max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}])
    start = time.monotonic()
    results = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"q{i}"}]
            )
            for i in range(50)
        )
    )
    elapsed = time.monotonic() - start
    await client.close()
    assert [r.choices[0].message.content for r in results] == [f"Echo: q{i}" for i in range(50)]
    # Overlap, not speed: every request reached the server before the first of them
    # could have been answered, which a serialising server would never allow.
    arrivals = [r.received_at for r in fake_server.requests[1:]]
    assert max(arrivals) - min(arrivals) < fake_server.latency_s
    assert elapsed >= fake_server.latency_s  # and each was answered after its latency


async def test_raw_concurrency_across_protocols(fake_server: FakeLLMServer) -> None:
    import aiohttp

    fake_server.latency_s = 0.5
    url = fake_server.url
    jobs = []
    for i in range(64):
        kind = i % 3
        if kind == 0:
            jobs.append(
                (
                    f"{url}/v1/chat/completions",
                    {"model": "o", "messages": [{"role": "user", "content": "x"}]},
                )
            )
        elif kind == 1:
            jobs.append(
                (
                    f"{url}/v1/messages",
                    {"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
                )
            )
        else:
            jobs.append(
                (
                    f"{url}/v1beta/models/g:generateContent",
                    {"contents": [{"parts": [{"text": "x"}]}]},
                )
            )
    async with aiohttp.ClientSession() as session:

        async def one(target: str, body: dict[str, Any]) -> int:
            async with session.post(target, json=body) as resp:
                await resp.read()
                return resp.status

        start = time.monotonic()
        statuses = await asyncio.gather(*(one(t, b) for t, b in jobs))
        elapsed = time.monotonic() - start
    assert statuses == [200] * 64
    # Serialised, 64 replies of 0.5 s would take 32 s; the bound leaves room for a
    # loaded machine.
    assert elapsed < 5.0, elapsed
    assert {r.protocol for r in fake_server.requests} == {"openai", "anthropic", "gemini"}


def test_bad_json_and_restart() -> None:
    server = FakeLLMServer()
    with pytest.raises(RuntimeError):
        _ = server.url
    server.start()
    first = server.url
    req = urllib.request.Request(
        f"{first}/v1/chat/completions",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 400
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{first}/v1/models", timeout=2)
    with server:
        status, _, body = _post(
            f"{server.openai_base}/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "back"}]},
        )
        assert status == 200 and body["choices"][0]["message"]["content"] == "Echo: back"


# -- faults that are not an error body ---------------------------------------------------------

_ENDPOINTS = {
    "openai": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "q"}]},
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}]},
    ),
    "gemini": ("/v1beta/models/m:generateContent", {"contents": [{"parts": [{"text": "q"}]}]}),
}


def _raw_post(server: FakeLLMServer, protocol: str, timeout: float = 10) -> tuple[int, str, bytes]:
    path, body = _ENDPOINTS[protocol]
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


@pytest.mark.parametrize("protocol", list(_ENDPOINTS))
def test_raw_bodies_are_served_verbatim(fake_server: FakeLLMServer, protocol: str) -> None:
    fake_server.script(
        "m",
        [Fault.raw("<html>down</html>", status=502, content_type="text/html"), Fault.raw('{"cut')],
    )
    assert _raw_post(fake_server, protocol) == (502, "text/html", b"<html>down</html>")
    status, ctype, body = _raw_post(fake_server, protocol)
    assert (status, body) == (200, b'{"cut') and ctype.startswith("application/json")


# Where each protocol keeps its answer, and what each broken shape leaves there.
_ANSWER_KEY = {"openai": "choices", "anthropic": "content", "gemini": "candidates"}


@pytest.mark.parametrize("protocol", list(_ENDPOINTS))
def test_malformed_shapes(fake_server: FakeLLMServer, protocol: str) -> None:
    from conductor.testing import SHAPES

    fake_server.script("m", [Fault.malformed(shape) for shape in SHAPES])
    got: dict[str, Any] = {}
    for shape in SHAPES:
        status, _ctype, body = _raw_post(fake_server, protocol)
        assert status == 200
        got[shape] = json.loads(body)
    key = _ANSWER_KEY[protocol]
    assert got["empty_choices"][key] == []
    assert key not in got["no_choices"]
    if protocol == "openai":
        assert got["null_content"]["choices"][0]["message"]["content"] is None
        assert got["empty_text"]["choices"][0]["message"]["content"] == ""
        assert isinstance(got["string_message"]["choices"][0]["message"], str)
    elif protocol == "anthropic":
        assert got["null_content"]["content"] is None
        assert got["empty_text"]["content"] == [{"type": "text", "text": ""}]
        assert isinstance(got["string_message"]["content"], str)
    else:
        assert "content" not in got["null_content"]["candidates"][0]
        assert got["empty_text"]["candidates"][0]["content"]["parts"] == [{"text": ""}]
        assert isinstance(got["string_message"]["candidates"][0]["content"], str)
    with pytest.raises(ValueError, match="unknown shape"):
        Fault.malformed("nonsense")  # type: ignore[arg-type]


def test_finish_reason_length_in_each_protocol(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", Reply("cut sh", finish_reason="length"))
    openai_client = _openai(fake_server)
    oa = openai_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "q"}]
    )
    assert oa.choices[0].finish_reason == "length"
    stream = openai_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "q"}], stream=True
    )
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "length"
    anthropic_client = _anthropic(fake_server)
    an = anthropic_client.messages.create(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "q"}]
    )
    assert an.stop_reason == "max_tokens"
    with anthropic_client.messages.stream(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "q"}]
    ) as s:
        assert s.get_final_message().stop_reason == "max_tokens"
    gemini_client = _gemini(fake_server)
    ge = gemini_client.models.generate_content(model="m", contents="q")
    assert ge.candidates[0].finish_reason.value == "MAX_TOKENS"


def test_reset_and_hang(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", [Fault.reset(), Fault.hang(5.0), "fine"])
    with pytest.raises((ConnectionError, urllib.error.URLError, OSError)):
        _raw_post(fake_server, "openai")
    started = time.monotonic()
    with pytest.raises((TimeoutError, urllib.error.URLError, OSError)):
        _raw_post(fake_server, "openai", timeout=0.3)
    assert time.monotonic() - started < 4.0
    status, _ctype, body = _raw_post(fake_server, "openai")
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "fine"
    assert len(fake_server.requests) == 3  # a reset or hung request is still logged


def test_reads_of_a_batch_at_once_answer_its_lines_once() -> None:
    import asyncio
    import json

    import openai

    from conductor.testing import BatchPlan

    def line(i: int) -> bytes:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        entry = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions"}
        return (json.dumps({**entry, "body": body}) + "\n").encode()

    async def slow(_request: FakeRequest) -> str:
        await asyncio.sleep(0.01)  # the batch's answering spans many reads
        return "ok"

    async def go(server: FakeLLMServer) -> None:
        client = openai.AsyncOpenAI(api_key="k", base_url=server.openai_base, max_retries=0)
        data = b"".join(line(i) for i in range(50))
        uploaded = await client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await asyncio.gather(*(client.batches.retrieve(batch.id) for _ in range(20)))
        await client.close()

    with FakeLLMServer() as server:
        server.script("m", slow)
        server.batch_script(BatchPlan(running_polls=0))
        asyncio.run(go(server))
        assert len(server.requests) == 50  # every line answered once
