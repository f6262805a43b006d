"""`conductor serve` with tools and structured output, through real clients (the openai
SDK's ``parse()`` and tool calling, litellm's ``openai/`` provider) against in-process
servers whose workers are the fake provider: the answering step alone gets the tools and
the response format, its reply is checked, and a tool call comes back in OpenAI's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, worker
from kit.servekit import make_pool, make_pool_file, plan_two_steps, served

from conductor.llm.answer_format import AnswerFormat
from conductor.llm.types import ToolCall, ToolSpec
from conductor.pool import load_pool
from conductor.testing import FakeLLMServer, FakeToolCall, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from conductor.serve._conversation import question_text  # noqa: E402
from conductor.serve._protocol import ApiError, ChatMessage  # noqa: E402

KEY = "sk-test-not-checked"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


class Capital(pydantic.BaseModel):
    country: str
    capital: str


@pytest.mark.process  # the request's schema is checked in a checker process
def test_parse_with_a_pydantic_model(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    plan_two_steps(fake_server)
    fake_server.script("w1", '{"country": "France", "capital": "Paris"}')
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.parse(
            model="conductor",
            messages=[{"role": "user", "content": "Capital of France?"}],
            response_format=Capital,
        )
    assert reply.choices[0].message.parsed == Capital(country="France", capital="Paris")
    # Only the final step is asked for the schema; the draft and the Conductor are not.
    (final,) = fake_server.requests_for("w1")
    assert final.body["response_format"]["json_schema"]["name"] == "Capital"
    (draft,) = fake_server.requests_for("w0")
    (plan,) = fake_server.requests_for(CONDUCTOR_MODEL)
    for request in (draft, plan):
        assert "response_format" not in request.body and "tools" not in request.body
    # The question tells the Conductor what shape the answer must have.
    assert "JSON schema Capital" in plan.last_user_message


@pytest.mark.process  # the request's schema is checked in a checker process
def test_a_reply_that_breaks_the_schema_is_asked_again(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w1", ['{"country": "France"}', '{"country": "France", "capital": "Paris"}'])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.parse(
            model="single:w1",
            messages=[{"role": "user", "content": "Capital of France?"}],
            response_format=Capital,
        )
    assert reply.choices[0].message.parsed == Capital(country="France", capital="Paris")
    assert len(fake_server.requests_for("w1")) == 2


@pytest.mark.process  # the request's schema is checked in a checker process
def test_a_schema_broken_twice_fails_with_502(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w1", "Paris, of course")
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.parse(
                model="single:w1",
                messages=[{"role": "user", "content": "Capital of France?"}],
                response_format=Capital,
            )
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "orchestration_failed"
    assert "broke the requested answer format after 2 tries" in error["message"]
    assert "not JSON" in error["message"]
    assert len(fake_server.requests_for("w1")) == 2


def test_json_object_must_be_an_object(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", ["[1, 2]", '{"ok": true}'])
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = httpx.post(
            f"{url}/chat/completions",
            json={
                "model": "single:w0",
                "messages": [{"role": "user", "content": "Say ok."}],
                "response_format": {"type": "json_object"},
            },
            timeout=60,
        )
    assert reply.status_code == 200, reply.text
    assert json.loads(reply.json()["choices"][0]["message"]["content"]) == {"ok": True}
    first, _ = fake_server.requests_for("w0")
    assert first.body["response_format"] == {"type": "json_object"}


def _ask_weather(client: Any, model: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        **extra,
    )


def _next_turn(call: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]


@pytest.mark.process  # the request's schema is checked in a checker process
def test_tool_round_trip(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    plan_two_steps(fake_server)
    fake_server.script(
        "w1",
        [
            Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Paris"}, "call_a")]),
            "It is 18 C and sunny in Paris.",
        ],
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        first = _ask_weather(client, "conductor")
        (choice,) = first.choices
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert (call.id, call.type, call.function.name) == ("call_a", "function", "get_weather")
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        second = client.chat.completions.create(
            model="conductor", messages=_next_turn(call), tools=[WEATHER]
        )
    assert second.choices[0].message.content == "It is 18 C and sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    # The tools reach the final step only; the Conductor sees their names in its question.
    assert all(r.tools == ["get_weather"] for r in fake_server.requests_for("w1"))
    assert all(r.tools == [] for r in fake_server.requests_for("w0"))
    plans = fake_server.requests_for(CONDUCTOR_MODEL)
    assert all(r.tools == [] for r in plans)
    assert "get_weather: The weather in a city now." in plans[0].last_user_message
    # The next turn's question holds the call and its result, for every step to see.
    final = fake_server.requests_for("w1")[-1].last_user_message
    assert 'Assistant called get_weather({"city": "Paris"}) as call_a.' in final
    assert "Result of call_a (get_weather): 18 C and sunny" in final


@pytest.mark.process  # the request's schema is checked in a checker process
def test_tool_call_streamed(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        "w0", Reply("", tool_calls=[FakeToolCall("get_weather", '{"city": "Paris"}', "call_s")])
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with client.chat.completions.stream(
            model="single:w0",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
        ) as stream:
            for _ in stream:
                pass
            done = stream.get_final_completion()
    (choice,) = done.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("call_s", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # strict: the SDK parsed the arguments against the tool's schema itself.
    assert call.function.parsed_arguments == {"city": "Paris"}


@pytest.mark.process  # the request's schema is checked in a checker process
def test_tool_round_trip_streamed_with_raw_chunks(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(
        "w0",
        [Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Paris"}, "c1")]), "Sunny."],
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        chunks = list(_ask_weather(client, "single:w0", stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert [(tc.index, tc.id, tc.function.name) for tc in calls] == [(0, "c1", "get_weather")]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finish[-1] == "tool_calls"
        call = calls[0]
        call.function.arguments = call.function.arguments or ""
        second = list(
            client.chat.completions.create(
                model="single:w0", messages=_next_turn(call), tools=[WEATHER], stream=True
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
    assert text == "Sunny."


@pytest.mark.process  # the request's schema is checked in a checker process
def test_strict_arguments_that_break_the_schema_are_asked_again(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(
        "w0",
        [
            Reply("", tool_calls=[FakeToolCall("get_weather", {"town": "Paris"})]),
            Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Paris"})]),
        ],
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = _ask_weather(client, "single:w0")
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert len(fake_server.requests_for("w0")) == 2


@pytest.mark.process  # the request's schema is checked in a checker process
def test_required_tool_choice_not_honoured_fails(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", "I will not call anything.")
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            _ask_weather(client, "single:w0", tool_choice="required")
    assert caught.value.status_code == 502
    assert "tool_choice is required" in str(caught.value)
    assert fake_server.requests_for("w0")[0].body["tool_choice"] == "required"


@pytest.mark.process  # the request's schema is checked in a checker process
async def test_litellm_tool_call(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    litellm = pytest.importorskip("litellm")
    # The worker is a litellm client too: tools go out and come back through litellm.
    fake_server.script(
        "w0", Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Rome"}, "c9")])
    )
    pool = load_pool(
        make_pool_file(tmp_path, fake_server, workers=[worker(fake_server, "w0", "litellm")])
    )
    with served(pool) as url:
        reply = await litellm.acompletion(
            model="openai/single:w0",
            api_base=url,
            api_key=KEY,
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER],
            num_retries=0,
        )
    (call,) = reply.choices[0].message.tool_calls
    assert (call.id, call.function.name) == ("c9", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    assert reply.choices[0].finish_reason == "tool_calls"
    assert fake_server.requests_for("w0")[0].tools == ["get_weather"]


def test_vote_with_tools_is_refused(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            _ask_weather(client, "vote:3:w0")
    assert "vote:3:w0 cannot answer with tools" in str(caught.value)
    assert fake_server.requests == []


def test_a_worker_whose_client_cannot_honour_the_format_is_refused(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Anthropic's API has no response_format: a JSON answer cannot be asked of it.
    workers = [worker(fake_server, "w0"), worker(fake_server, "claude", "anthropic")]
    pool = load_pool(make_pool_file(tmp_path, fake_server, workers=workers))
    with served(pool) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        for model in ("single:claude", "conductor"):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.parse(
                    model=model,
                    messages=[{"role": "user", "content": "Capital of France?"}],
                    response_format=Capital,
                )
            message = str(caught.value)
            assert "worker 'claude' (anthropic client) cannot be asked for a JSON" in message
    assert fake_server.requests == []


@pytest.mark.process  # the request's schema is checked in a checker process
def test_anthropic_worker_calls_tools(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        "claude",
        [
            Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Oslo"}, "toolu_1")]),
            "Cold in Oslo.",
        ],
    )
    workers = [worker(fake_server, "claude", "anthropic")]
    pool = load_pool(make_pool_file(tmp_path, fake_server, workers=workers))
    with served(pool) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        first = _ask_weather(client, "single:claude", tool_choice="required")
        (call,) = first.choices[0].message.tool_calls
        assert (call.id, call.function.name) == ("toolu_1", "get_weather")
        assert json.loads(call.function.arguments) == {"city": "Oslo"}
        second = client.chat.completions.create(
            model="single:claude", messages=_next_turn(call), tools=[WEATHER]
        )
    assert second.choices[0].message.content == "Cold in Oslo."
    sent = fake_server.requests_for("claude")[0].body
    assert sent["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]
    assert sent["tool_choice"] == {"type": "any"}


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "letters"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "not one of the tools",
        ),
        pytest.param(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "A", "schema": {"type": 3}},
                }
            },
            "not a valid JSON Schema",
            marks=pytest.mark.process,  # checked in a checker process
        ),
        ({"response_format": {"type": "xml"}}, "response_format must be"),
        ({"functions": [{"name": "f"}]}, "functions is not supported"),
    ],
)
def test_bad_tool_fields_are_400(
    tmp_path: Path, fake_server: FakeLLMServer, extra: dict[str, Any], words: str
) -> None:
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = httpx.post(
            f"{url}/chat/completions",
            json={"model": "single:w0", "messages": [{"role": "user", "content": "Hi"}], **extra},
            timeout=60,
        )
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]
    assert fake_server.requests == []


def test_tool_turns_in_the_question_layout() -> None:
    call = ToolCall("c1", "get_weather", '{"city": "Paris"}')
    messages = (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "18 C", tool_call_id="c1"),
    )
    fmt = AnswerFormat((ToolSpec("get_weather", "The weather now."),))
    assert question_text(messages, fmt) == (
        "Instructions:\nBe brief.\n\n"
        "Question:\nWeather in Paris?\n\n"
        "Tool calls made for this question:\n"
        'Assistant called get_weather({"city": "Paris"}) as c1.\n\n'
        "Result of c1 (get_weather): 18 C\n\n"
        "Answer format:\nThe final answer may call these tools:\n"
        "- get_weather: The weather now."
    )
    # An assistant message with text alone after the question is still refused.
    with pytest.raises(ApiError, match="cannot continue an assistant message"):
        question_text((*messages, ChatMessage("assistant", "So far")), fmt)


async def test_the_fake_provider_streams_tool_calls(fake_server: FakeLLMServer) -> None:
    # The scripted reply in OpenAI's streamed shape, read by the SDK and by litellm.
    litellm = pytest.importorskip("litellm")
    fake_server.script(
        "m", Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Lima"}, "c7")])
    )
    client = openai.OpenAI(base_url=fake_server.openai_base, api_key=KEY, max_retries=0)
    with client.chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER]
    ) as stream:
        done = stream.get_final_completion()
    (call,) = done.choices[0].message.tool_calls
    assert (call.id, call.function.parsed_arguments) == ("c7", {"city": "Lima"})
    assert done.choices[0].finish_reason == "tool_calls"
    parts = await litellm.acompletion(
        model="openai/m",
        api_base=fake_server.openai_base,
        api_key=KEY,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER],
        stream=True,
        num_retries=0,
    )
    chunks = [c async for c in parts]
    whole = litellm.stream_chunk_builder(chunks)
    (call,) = whole.choices[0].message.tool_calls
    assert (call.id, json.loads(call.function.arguments)) == ("c7", {"city": "Lima"})
    assert fake_server.requests[-1].tools == ["get_weather"]


@pytest.mark.process  # the request's schema is checked in a checker process
def test_parallel_tool_calls_false_allows_one_call(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # LangChain's with_structured_output sends parallel_tool_calls false: two calls in
    # one reply are asked again, one is returned.
    two = [FakeToolCall("get_weather", {"city": c}) for c in ("A", "B")]
    fake_server.script("w0", [Reply("", tool_calls=two), Reply("", tool_calls=two[:1])])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = _ask_weather(client, "single:w0", parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "A"}
    assert len(fake_server.requests_for("w0")) == 2
