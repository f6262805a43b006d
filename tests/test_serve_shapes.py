"""`conductor serve`'s bodies against OpenAI's schema, field by field: every field the
OpenAPI spec marks required (``CreateChatCompletionResponse``,
``CreateChatCompletionStreamResponse``, the error object) is present with the right
type, ``null`` included, as strict clients (generated from the spec) demand; then the
openai SDK's own types read each body in strict mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists
from kit.servekit import make_pool, served

from conductor.testing import FakeLLMServer, Fault, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
chat_types = pytest.importorskip("openai.types.chat")
shared_types = pytest.importorskip("openai.types.shared")

QUESTION = [{"role": "user", "content": "Capital of France?"}]
FINISH = {"stop", "length", "tool_calls", "content_filter", "function_call"}


def has(obj: dict[str, Any], name: str, *types: type) -> Any:
    """``obj[name]``, after checking it is there (``null`` counts) and of ``types``
    (``type(None)`` for a nullable field)."""
    assert name in obj, f"{name} is missing from {sorted(obj)}"
    assert isinstance(obj[name], types), (name, obj[name])
    return obj[name]


def check_usage(usage: Any) -> None:
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(has(usage, name, int), int) and not isinstance(usage[name], bool)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def check_completion(body: dict[str, Any], n: int) -> None:
    """``CreateChatCompletionResponse``: id, object, created, model, choices required;
    each choice index, message, finish_reason, logprobs; each message role, content,
    refusal."""
    has(body, "id", str)
    assert has(body, "object", str) == "chat.completion"
    has(body, "created", int)
    has(body, "model", str)
    choices = has(body, "choices", list)
    assert [has(c, "index", int) for c in choices] == list(range(n))
    for choice in choices:
        assert has(choice, "finish_reason", str) in FINISH
        has(choice, "logprobs", dict, type(None))
        message = has(choice, "message", dict)
        assert has(message, "role", str) == "assistant"
        has(message, "content", str, type(None))
        has(message, "refusal", str, type(None))
    check_usage(has(body, "usage", dict))
    chat_types.ChatCompletion.model_validate(body, strict=True)


def check_chunk(chunk: dict[str, Any], include_usage: bool) -> None:
    """``CreateChatCompletionStreamResponse``: id, object, created, model, choices
    required; each choice index, delta, finish_reason (``null`` until the last);
    ``usage`` on every chunk when asked for, ``null`` but on the last."""
    has(chunk, "id", str)
    assert has(chunk, "object", str) == "chat.completion.chunk"
    has(chunk, "created", int)
    has(chunk, "model", str)
    for choice in has(chunk, "choices", list):
        has(choice, "index", int)
        has(choice, "delta", dict)
        reason = has(choice, "finish_reason", str, type(None))
        assert reason is None or reason in FINISH
        has(choice, "logprobs", dict, type(None))
    if include_usage:
        has(chunk, "usage", dict, type(None))
    else:
        assert chunk.get("usage") is None
    chat_types.ChatCompletionChunk.model_validate(chunk, strict=True)


def check_error(body: dict[str, Any]) -> None:
    """OpenAI's error object: message and type strings, param and code nullable."""
    error = has(body, "error", dict)
    has(error, "message", str)
    has(error, "type", str)
    has(error, "param", str, type(None))
    has(error, "code", str, type(None))
    shared_types.ErrorObject.model_validate(error, strict=True)


@pytest.fixture
def answered(fake_server: FakeLLMServer) -> FakeLLMServer:
    fake_server.script(CONDUCTOR_MODEL, Reply(lists([0], ["Answer."], [[]]), None, 10, 4))
    fake_server.script("w0", Reply("Paris", None, 3, 2))
    return fake_server


def post(url: str, **extra: Any) -> httpx.Response:
    body = {"model": "conductor", "messages": QUESTION, **extra}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=60)


def stream(url: str, **extra: Any) -> list[dict[str, Any] | str]:
    body = {"model": "conductor", "messages": QUESTION, "stream": True, **extra}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{url}/chat/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        data = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


@pytest.mark.parametrize("n", [1, 2])
def test_a_completion_has_every_required_field(
    tmp_path: Path, answered: FakeLLMServer, n: int
) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = post(url, n=n)
    assert resp.status_code == 200, resp.text
    check_completion(resp.json(), n)
    assert all(c["message"]["refusal"] is None for c in resp.json()["choices"])


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("include_usage", [False, True])
def test_every_chunk_has_every_required_field(
    tmp_path: Path, answered: FakeLLMServer, n: int, include_usage: bool
) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        events = stream(url, n=n, stream_options={"include_usage": include_usage})
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    for c in chunks:
        check_chunk(c, include_usage)
    # finish_reason is null on every content chunk and "stop" once per choice.
    reasons = [ch["finish_reason"] for c in chunks for ch in c["choices"]]
    assert reasons.count("stop") == n and set(reasons) == {None, "stop"}
    usages = [c["usage"] for c in chunks if c.get("usage") is not None]
    if include_usage:
        # OpenAI's rule: usage null on every chunk but the last, which has no choices.
        assert len(usages) == 1 and chunks[-1]["usage"] is usages[0]
        assert chunks[-1]["choices"] == []
        check_usage(usages[0])
    else:
        assert usages == []


def test_error_bodies_have_every_required_field(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        bad_model = post(url, model="no-such-model")
        bad_n = post(url, n=0)
        missing = httpx.get(f"{url}/nowhere", timeout=30)
    for resp, status in ((bad_model, 400), (bad_n, 400), (missing, 404)):
        assert resp.status_code == status, resp.text
        check_error(resp.json())
    assert bad_n.json()["error"]["param"] == "n"


def test_a_failed_run_has_every_required_field(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Fault(401, "Incorrect API key provided"))
    with served(make_pool(tmp_path, fake_server)) as url:
        plain = post(url)
        events = stream(url)
    assert plain.status_code == 502
    check_error(plain.json())
    # Streamed, the failure is an error event (the SDK raises it) before [DONE].
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert isinstance(last, dict)
    check_error(last)
