"""Tools and structured output over `conductor serve`'s Responses API
(`POST /v1/responses`): function tools, ``function_call`` output items and their
stream events, ``function_call_output`` follow-ups, ``text.format`` and the openai
SDK's ``responses.parse``, against in-process servers on the fake provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL
from kit.servekit import make_pool, plan_two_steps, served

from conductor.testing import FakeLLMServer, FakeToolCall, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

KEY = "sk-test-not-checked"

#: A function tool in the Responses API's flat shape.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Capital(pydantic.BaseModel):
    country: str
    capital: str


def client_of(url: str) -> Any:
    return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)


@pytest.mark.process  # the request's schema is checked in a checker process
def test_function_call_then_its_output_by_previous_response_id(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    plan_two_steps(fake_server)
    fake_server.script(
        "w1",
        [
            Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "Paris"}, "call_a")]),
            "It is 18 C and sunny in Paris.",
        ],
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        first = client.responses.create(
            model="conductor", input="Weather in Paris?", tools=[WEATHER]
        )
        assert first.status == "completed"
        (call,) = first.output
        assert call.type == "function_call"
        assert (call.call_id, call.name, call.status) == ("call_a", "get_weather", "completed")
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert first.tools[0].name == "get_weather" and first.tool_choice == "auto"
        second = client.responses.create(
            model="conductor",
            previous_response_id=first.id,
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
            ],
            tools=[WEATHER],
        )
        items = client.responses.input_items.list(second.id, order="asc").data
    assert second.output_text == "It is 18 C and sunny in Paris."
    # The stored items: the question, the call and its output, in OpenAI's item types.
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert (items[1].call_id, items[1].name) == ("call_a", "get_weather")
    assert (items[2].call_id, items[2].output) == ("call_a", "18 C, sunny")
    assert [item.type for item in second.output] == ["message"]
    # The tools reach the answering step only.
    assert all(r.tools == ["get_weather"] for r in fake_server.requests_for("w1"))
    assert all(r.tools == [] for r in fake_server.requests_for(CONDUCTOR_MODEL))
    # The follow-up's question holds the kept call and the result sent for it.
    final = fake_server.requests_for("w1")[-1].last_user_message
    assert "Question:\nWeather in Paris?" in final
    assert 'Assistant called get_weather({"city": "Paris"}) as call_a.' in final
    assert "Result of call_a (get_weather): 18 C, sunny" in final


@pytest.mark.process  # the request's schema is checked in a checker process
def test_function_call_items_in_the_input(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """Without a kept conversation: the client sends the call and its output itself."""
    fake_server.script("w0", "Sunny.")
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = client_of(url).responses.create(
            model="single:w0",
            input=[
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "Oslo"}',
                },
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_text", "text": "-3 C"}],
                },
            ],
            tools=[WEATHER],
            store=False,
        )
    assert reply.output_text == "Sunny."
    (asked,) = fake_server.requests_for("w0")
    assert 'Assistant called get_weather({"city": "Oslo"}) as c1.' in asked.last_user_message
    assert "Result of c1 (get_weather): -3 C" in asked.last_user_message


@pytest.mark.process  # the request's schema is checked in a checker process
def test_function_call_streamed(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        "w0", Reply("", tool_calls=[FakeToolCall("get_weather", '{"city": "Rome"}', "call_s")])
    )
    with (
        served(make_pool(tmp_path, fake_server)) as url,
        client_of(url).responses.stream(
            model="single:w0", input="Weather in Rome?", tools=[WEATHER]
        ) as stream,
    ):
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2]
    assert added.item.type == "function_call" and added.item.arguments == ""
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert deltas == done.arguments == '{"city": "Rome"}'
    assert done.item_id == added.item.id
    (call,) = final.output
    assert (call.type, call.call_id, call.name) == ("function_call", "call_s", "get_weather")


@pytest.mark.process  # the request's schema is checked in a checker process
def test_parse_with_a_pydantic_model(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    plan_two_steps(fake_server)
    fake_server.script("w1", '{"country": "France", "capital": "Paris"}')
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = client_of(url).responses.parse(
            model="conductor", input="Capital of France?", text_format=Capital
        )
    assert reply.output_parsed == Capital(country="France", capital="Paris")
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "Capital"
    (final,) = fake_server.requests_for("w1")
    assert final.body["response_format"]["json_schema"]["name"] == "Capital"
    assert "response_format" not in fake_server.requests_for("w0")[0].body


def test_json_object_format(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", ["not json", '{"ok": true}'])
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = client_of(url).responses.create(
            model="single:w0", input="Say ok as JSON.", text={"format": {"type": "json_object"}}
        )
    assert json.loads(reply.output_text) == {"ok": True}
    first, _ = fake_server.requests_for("w0")  # the reply that was not JSON is asked again
    assert first.body["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("extra", "param", "said"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "'web_search' is not supported"),
        ({"tools": [WEATHER, {"type": "file_search"}]}, "tools", "'file_search'"),
        ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools", "name must be"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
            "tool_choice",
            "x",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", '"name": ...}'),
        ({"tools": [{**WEATHER, "strict": "yes"}]}, "tools", "tools[0].strict must be"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format", "with a name"),
        pytest.param(
            {"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": 3}}}},
            "text.format",
            "not a valid JSON Schema",
            marks=pytest.mark.process,  # checked in a checker process
        ),
        ({"text": {"format": {"type": "grammar"}}}, "text.format", "json_object"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]", "call_id"),
        ({"input": [{"type": "reasoning"}]}, "input[0]", "'reasoning'"),
    ],
)
def test_bad_tool_fields_are_400(
    tmp_path: Path, fake_server: FakeLLMServer, extra: dict[str, Any], param: str, said: str
) -> None:
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = httpx.post(
            f"{url}/responses",
            json={"model": "conductor", "input": "Hi", **extra},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=60,
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and said in error["message"], error
    assert fake_server.requests == []


def test_vote_with_tools_is_refused(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """The strategy's refusal (in the answer path every endpoint shares) applies here."""
    with (
        served(make_pool(tmp_path, fake_server)) as url,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client_of(url).responses.create(
            model="vote:3:w0", input="Weather in Paris?", tools=[WEATHER]
        )
    assert caught.value.code == "unsupported_parameter"
    assert "vote:3:w0 cannot answer with tools" in str(caught.value)
    assert fake_server.requests == []


def test_a_refused_json_format_names_text_format(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """The refusal names the field as this API spells it, not chat's response_format."""
    with (
        served(make_pool(tmp_path, fake_server)) as url,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client_of(url).responses.create(
            model="vote:3:w0", input="Capital of France?", text={"format": {"type": "json_object"}}
        )
    assert caught.value.param == "text.format"
    assert fake_server.requests == []


@pytest.mark.process  # the request's schema is checked in a checker process
def test_output_items_sent_back_as_input(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """The SDK's usual loop without a kept conversation: the first response's output
    items, as the SDK parsed them, go back in the next input beside the call's output."""
    fake_server.script(
        "w0",
        [
            Reply("Looking.", tool_calls=[FakeToolCall("get_weather", {"city": "Lima"}, "c2")]),
            "Warm.",
        ],
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        question = {"role": "user", "content": "Weather in Lima?"}
        first = client.responses.create(
            model="single:w0", input=[question], tools=[WEATHER], store=False
        )
        assert [item.type for item in first.output] == ["message", "function_call"]
        echoed = [item.model_dump(exclude_none=True) for item in first.output]
        result = {"type": "function_call_output", "call_id": "c2", "output": "25 C"}
        second = client.responses.create(
            model="single:w0", input=[question, *echoed, result], tools=[WEATHER], store=False
        )
    assert second.output_text == "Warm."
    asked = fake_server.requests_for("w0")[-1].last_user_message
    assert "Assistant: Looking." in asked
    assert 'Assistant called get_weather({"city": "Lima"}) as c2.' in asked
    assert "Result of c2 (get_weather): 25 C" in asked
