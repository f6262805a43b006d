"""`conductor serve`'s Responses API (`POST /v1/responses`), legacy text completions
(`POST /v1/completions`) and opt-in CORS, through the real openai SDK (and raw httpx
for preflights and bad bodies) against in-process servers on the fake provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists
from kit.servekit import make_pool, served

from conductor.runs.rundir import iter_records
from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

KEY = "sk-test-not-checked"

#: What a Responses stream of one text answer sends, in order (the delta repeats).
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def script_two_steps(server: FakeLLMServer) -> None:
    """The Conductor plans w0 then w1; token counts sum to 29 in / 12 out."""
    server.script(
        CONDUCTOR_MODEL,
        Reply(lists([0, 1], ["Draft it.", "Check the draft."], [[], [0]]), None, 11, 7),
    )
    server.script("w0", Reply("draft answer", None, 5, 3))
    server.script("w1", Reply("The answer is Paris.", None, 13, 2))


def client_of(url: str) -> Any:
    return openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)


def text_of(request: FakeRequest) -> str:
    return "\n".join(m["content"] for m in request.messages)


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error  # type: ignore[no-any-return]


def collapsed(types: list[str]) -> list[str]:
    """``types`` with runs of the same type made one."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


# -- /v1/responses ------------------------------------------------------------------------


def test_responses_create_answers_with_the_spec_fields(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_two_steps(fake_server)
    records = tmp_path / "records"
    with served(make_pool(tmp_path, fake_server), records_dir=records) as url:
        raw = client_of(url).responses.with_raw_response.create(
            model="conductor", input="Capital of France?"
        )
    reply = raw.parse()
    assert reply.output_text == "The answer is Paris."
    assert reply.object == "response" and reply.status == "completed"
    assert reply.id.startswith("resp_") and reply.model == "conductor"
    assert reply.error is None and reply.incomplete_details is None
    (item,) = reply.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    (part,) = item.content
    assert part.type == "output_text" and part.annotations == []
    usage = reply.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (29, 12, 41)
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    # The run is the server's, named in the header, the id and the conductor field,
    # and recorded like a chat run.
    (run_id,) = (reply.model_extra or {})["conductor"]["run_ids"]
    assert raw.headers["x-conductor-run-id"] == run_id and reply.id == f"resp_{run_id}"
    (saved,) = iter_records(records / "samples.jsonl")
    assert saved.sample_id == run_id and saved.status == "ok"
    assert saved.strategy == "conductor"


def test_responses_stream_sends_the_events_in_order(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    long_answer = "Paris, " * 100 + "France."  # over one piece: more than one delta
    fake_server.script("w0", [long_answer, "second answer"])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        events = list(client.responses.create(model="single:w0", input="Capital?", stream=True))
        with client.responses.stream(model="single:w0", input="Again?") as stream:
            helper_types = [e.type for e in stream]
            final = stream.get_final_response()
    types = [e.type for e in events]
    assert collapsed(types) == STREAM_ORDER
    assert types.count("response.output_text.delta") > 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == long_answer
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == long_answer
    completed = events[-1].response
    assert completed.status == "completed" and completed.output_text == long_answer
    assert events[0].response.status == "in_progress" and events[0].response.id == completed.id
    assert completed.usage is not None and completed.usage.total_tokens > 0
    # The SDK's stream helper accumulates the same events into the final response.
    assert collapsed(helper_types) == STREAM_ORDER
    assert final.output_text == "second answer"


def test_previous_response_id_continues_the_conversation(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["Nice to meet you, EARLIER-REPLY-17.", "You are Zorblax.", "?"])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        first = client.responses.create(model="single:w0", input="My name is Zorblax.")
        second = client.responses.create(
            model="single:w0", input="What is my name?", previous_response_id=first.id
        )
        # A stream's response is kept too, and a response may be continued again.
        third = list(
            client.responses.create(
                model="single:w0", input="Sure?", previous_response_id=second.id, stream=True
            )
        )
    assert second.output_text == "You are Zorblax."
    assert second.previous_response_id == first.id
    asked = [text_of(r) for r in fake_server.requests_for("w0")]
    assert "Zorblax" in asked[0] and "EARLIER-REPLY-17" not in asked[0]
    for needle in ("My name is Zorblax.", "EARLIER-REPLY-17", "What is my name?"):
        assert needle in asked[1], (needle, asked[1])
    assert asked[1].index("EARLIER-REPLY-17") < asked[1].index("What is my name?")
    assert third[-1].type == "response.completed"
    assert "You are Zorblax." in asked[2] and "Sure?" in asked[2]


def test_unknown_or_unstored_previous_response_is_a_400(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", "kept nowhere")
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        with pytest.raises(openai.BadRequestError) as unknown:
            client.responses.create(model="single:w0", input="Hi", previous_response_id="resp_nope")
        unstored = client.responses.create(model="single:w0", input="Hi", store=False)
        with pytest.raises(openai.BadRequestError) as forgotten:
            client.responses.create(
                model="single:w0", input="Again", previous_response_id=unstored.id
            )
    for exc in (unknown, forgotten):
        error = exc.value.body
        assert isinstance(error, dict)
        assert error["param"] == "previous_response_id"
        assert error["code"] == "previous_response_not_found"
    assert "resp_nope" in str(unknown.value)
    assert len(fake_server.requests_for("w0")) == 1  # the refused requests made no call


#: Two keys' servers: a keys file of two, and a --api-key-env key beside a keys-file key
#: of the same name (a conversation is the key's, not the name's).
KEY_SETUPS = {
    "keys file": {"keys": ("A", "B")},
    "api-key-env beside a key of its name": {"api_key": "A", "keys": ("B",)},
}


def two_keys(setup: str) -> dict[str, Any]:
    from conductor.serve import ApiKey

    settings = dict(KEY_SETUPS[setup])
    names = {"A": "team-a", "B": "api-key-env" if "api_key" in settings else "team-b"}
    settings["keys"] = tuple(ApiKey(names[k], f"token-{k}") for k in settings["keys"])
    if "api_key" in settings:
        settings["api_key"] = f"token-{settings['api_key']}"
    return settings


def previous_refused(client: Any, previous: str, stream: bool = False) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as refused:
        list(client.responses.create(
            model="single:w0", input="What was asked before?", previous_response_id=previous,
            stream=True,
        )) if stream else client.responses.create(
            model="single:w0", input="What was asked before?", previous_response_id=previous
        )  # fmt: skip
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("setup", sorted(KEY_SETUPS))
def test_a_stored_conversation_belongs_to_the_key_that_made_it(
    tmp_path: Path, fake_server: FakeLLMServer, setup: str
) -> None:
    """Key B naming key A's response gets exactly what an id never answered gets (so it
    learns nothing, not even that it exists), streamed or not, and no call is made; A
    continues its own conversation; B can neither retrieve, list nor delete A's
    response (404, as for an unknown id), and A still can."""
    fake_server.script("w0", ["A's answer SECRET-ANSWER-5.", "A again."])
    with served(make_pool(tmp_path, fake_server), **two_keys(setup)) as url:
        a = openai.OpenAI(base_url=url, api_key="token-A", max_retries=0)
        b = openai.OpenAI(base_url=url, api_key="token-B", max_retries=0)
        first = a.responses.create(model="single:w0", input="A asks SECRET-QUESTION-4")
        never = "resp_" + "0" * len(first.id.removeprefix("resp_"))
        other = previous_refused(b, first.id)
        unknown = previous_refused(b, never)
        streamed = previous_refused(b, first.id, stream=True)
        again = a.responses.create(model="single:w0", input="And?", previous_response_id=first.id)

        def route(method: Any, tail: str, token: str) -> httpx.Response:
            where = f"{url}/responses/{first.id}{tail}"
            return method(where, headers={"authorization": f"Bearer {token}"})  # type: ignore[no-any-return]

        b_routes = [route(httpx.get, t, "token-B") for t in ("", "/input_items")]
        b_routes.append(route(httpx.delete, "", "token-B"))
        a_routes = [route(httpx.get, t, "token-A") for t in ("", "/input_items")]
        a_deleted = route(httpx.delete, "", "token-A")
        a_after = route(httpx.get, "", "token-A")
        unknown_route = route(httpx.get, "", "token-B").text.replace(first.id, never)
        never_route = httpx.get(
            f"{url}/responses/{never}", headers={"authorization": "Bearer token-B"}
        )
    assert json.dumps(other).replace(first.id, never) == json.dumps(unknown)
    assert streamed == other
    assert other["code"] == "previous_response_not_found"
    assert again.output_text == "A again."
    asked = [text_of(r) for r in fake_server.requests_for("w0")]
    assert len(asked) == 2  # B's refused requests made no call
    assert "SECRET-QUESTION-4" in asked[1] and "SECRET-ANSWER-5" in asked[1]
    assert {r.status_code for r in b_routes} == {404}
    assert all("SECRET" not in r.text for r in b_routes)
    assert unknown_route == never_route.text  # B learns nothing: the same as an unknown id
    assert [r.status_code for r in a_routes] == [200, 200]
    assert a_routes[0].json()["id"] == first.id
    assert a_deleted.status_code == 200 and a_after.status_code == 404


def test_the_positive_control_a_store_without_owners_leaks(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same request with the store's owner check removed: key B's follow-up sends
    A's question and answer to the worker (what issue 37 found)."""
    from conductor.serve._stores import MemoryConversations

    async def any_owner(self: MemoryConversations, response_id: str, owner: str) -> Any:
        kept = self._kept.get(response_id)
        return None if kept is None else kept.body

    monkeypatch.setattr(MemoryConversations, "get", any_owner)
    fake_server.script("w0", ["A's answer SECRET-ANSWER-5.", "leaked"])
    with served(make_pool(tmp_path, fake_server), **two_keys("keys file")) as url:
        a = openai.OpenAI(base_url=url, api_key="token-A", max_retries=0)
        b = openai.OpenAI(base_url=url, api_key="token-B", max_retries=0)
        first = a.responses.create(model="single:w0", input="A asks SECRET-QUESTION-4")
        b.responses.create(model="single:w0", input="What?", previous_response_id=first.id)
    assert "SECRET-QUESTION-4" in text_of(fake_server.requests_for("w0")[1])


def test_instructions_and_message_items_reach_the_workers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["first", "second"])
    items = [
        {"role": "developer", "content": "Be brief. DEVMARK-3"},
        {"role": "user", "content": [{"type": "input_text", "text": "Earlier question Q1"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Earlier answer A1"}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "Now Q2?"}]},
    ]
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        first = client.responses.create(
            model="single:w0", instructions="Answer in French. SYSMARK-9", input=items
        )
        client.responses.create(model="single:w0", input="Q3?", previous_response_id=first.id)
    assert first.instructions == "Answer in French. SYSMARK-9"
    one, two = (text_of(r) for r in fake_server.requests_for("w0"))
    for needle in ("SYSMARK-9", "DEVMARK-3", "Earlier question Q1", "Earlier answer A1", "Now Q2?"):
        assert needle in one, (needle, one)
    assert one.index("Earlier answer A1") < one.index("Now Q2?")
    # A follow-up carries the conversation but not the instructions (OpenAI's rule).
    assert "SYSMARK-9" not in two and "DEVMARK-3" in two and "first" in two and "Q3?" in two


def test_a_failed_run_is_a_502_or_a_failed_response(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", Fault(401, "Incorrect API key provided"))
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        with pytest.raises(openai.APIStatusError) as plain:
            client.responses.create(model="single:w0", input="Hi")
        events = list(client.responses.create(model="single:w0", input="Hi", stream=True))
    assert plain.value.status_code == 502
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error"
    assert "Incorrect API key provided" in failed.error.message


# -- /v1/completions ----------------------------------------------------------------------


def test_completions_plain_and_streamed(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", [Reply("Hello there.", None, 4, 3), "x" * 600])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        reply = client.completions.create(model="single:w0", prompt="Say hello")
        chunks = list(
            client.completions.create(
                model="single:w0",
                prompt=["Say x"],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    (choice,) = reply.choices
    assert (choice.text, choice.finish_reason, choice.logprobs) == ("Hello there.", "stop", None)
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 3)
    assert fake_server.requests_for("w0")[0].messages[-1]["content"] == "Say hello"
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "x" * 600
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"echo": True}, "echo"), ({"logprobs": 2}, "logprobs"), ({"best_of": 3}, "best_of")],
)
def test_completions_refuse_what_they_cannot_do(
    tmp_path: Path, fake_server: FakeLLMServer, extra: dict[str, Any], param: str
) -> None:
    with (
        served(make_pool(tmp_path, fake_server)) as url,
        pytest.raises(openai.BadRequestError) as exc,
    ):
        client_of(url).completions.create(model="single:w0", prompt="Hi", **extra)
    assert isinstance(exc.value.body, dict) and exc.value.body["param"] == param
    assert fake_server.requests_for("w0") == []


# -- bad bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("responses", {"model": "single:w0"}, "input"),
        ("responses", {"model": "single:w0", "input": 5}, "input"),
        ("responses", {"model": "single:w0", "input": []}, "input"),
        ("responses", {"model": "single:w0", "input": ["hi"]}, "input[0]"),
        (
            "responses",
            {"model": "single:w0", "input": [{"type": "function_call_output", "output": "1"}]},
            "input[0]",
        ),
        (
            "responses",
            {"model": "single:w0", "input": [{"role": "tool", "content": "x"}]},
            "input[0].role",
        ),
        (
            "responses",
            {"model": "single:w0", "input": [{"role": "user", "content": [{"type": "x"}]}]},
            "input[0].content",
        ),
        ("responses", {"input": "Hi"}, "model"),
        ("responses", {"model": "single:w0", "input": "Hi", "instructions": 3}, "instructions"),
        ("responses", {"model": "single:w0", "input": "Hi", "store": "yes"}, "store"),
        ("responses", {"model": "single:w0", "input": "Hi", "stream": "yes"}, "stream"),
        ("responses", {"model": "single:w0", "input": "Hi", "tools": [{"type": "x"}]}, "tools"),
        (
            "responses",
            {"model": "single:w0", "input": "Hi", "text": {"format": {"type": "grammar"}}},
            "text.format",
        ),
        (
            "responses",
            {"model": "single:w0", "input": "Hi", "previous_response_id": 7},
            "previous_response_id",
        ),
        ("completions", {"model": "single:w0"}, "prompt"),
        ("completions", {"model": "single:w0", "prompt": [1, 2, 3]}, "prompt"),
        ("completions", {"model": "single:w0", "prompt": ["a", "b"]}, "prompt"),
        ("completions", {"model": "single:w0", "prompt": "Hi", "n": 0}, "n"),
    ],
)
def test_bad_bodies_are_400s(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    path: str,
    payload: dict[str, Any],
    param: str | None,
) -> None:
    with served(make_pool(tmp_path, fake_server)) as url:
        resp = httpx.post(f"{url}/{path}", json=payload, timeout=30)
        not_json = httpx.post(f"{url}/{path}", content=b"{nope", timeout=30)
    error = error_of(resp, 400)
    if param is not None:
        assert error["param"] == param, error
    assert error_of(not_json, 400)["type"] == "invalid_request_error"
    assert fake_server.requests_for("w0") == []


# -- CORS ---------------------------------------------------------------------------------

ORIGIN = "http://localhost:3000"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang",
}


def test_cors_lets_the_listed_origins_in(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", "hi")
    pool = make_pool(tmp_path, fake_server)
    with served(pool, cors_origins=(ORIGIN,), api_key="secret-1") as url:
        pre = httpx.options(f"{url}/responses", headers=PREFLIGHT, timeout=30)
        other = httpx.options(
            f"{url}/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil"}, timeout=30
        )
        post = httpx.post(
            f"{url}/responses",
            json={"model": "single:w0", "input": "Hi"},
            headers={"Origin": ORIGIN, "Authorization": "Bearer secret-1"},
            timeout=30,
        )
    # The preflight needs no bearer token (a browser sends none).
    assert pre.status_code == 204, pre.text
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in pre.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    assert "access-control-allow-origin" not in other.headers
    error_of(other, 403)
    assert post.status_code == 200, post.text
    assert post.headers["access-control-allow-origin"] == ORIGIN
    assert "x-conductor-run-id" in post.headers["access-control-expose-headers"]


def test_without_cors_there_are_no_cors_headers(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", "hi")
    with served(make_pool(tmp_path, fake_server)) as url:
        pre = httpx.options(f"{url}/chat/completions", headers=PREFLIGHT, timeout=30)
        post = httpx.post(
            f"{url}/completions",
            json={"model": "single:w0", "prompt": "Hi"},
            headers={"Origin": ORIGIN},
            timeout=30,
        )
    error_of(pre, 405)
    assert not [h for h in pre.headers if h.startswith("access-control-")]
    assert post.status_code == 200, post.text
    assert not [h for h in post.headers if h.startswith("access-control-")]
    assert json.loads(post.text)["choices"][0]["text"] == "hi"


def _memory_store(**limits: int) -> Any:
    """A store in memory, driven synchronously (nothing it does awaits)."""
    import asyncio

    from conductor.serve._stores import MemoryConversations

    store = MemoryConversations(**limits)

    def run(name: str, *args: Any) -> Any:
        return asyncio.run(getattr(store, name)(*args))

    return run


def test_kept_conversations_are_bounded() -> None:
    run = _memory_store(limit=2)
    for name in ("a", "b", "c"):
        run("keep", name, "", {"m": name}, 60.0)
    assert run("get", "a", "") is None  # the oldest is forgotten first
    assert run("get", "b", "") == {"m": "b"} and run("get", "c", "") is not None


def test_kept_conversations_are_bounded_in_characters() -> None:
    """Many large inputs cannot grow the server without bound: the oldest go first once
    the characters kept pass the limit, and the newest stays even when it alone is over."""
    run = _memory_store(limit=100, max_chars=30)
    for name in ("a", "b", "c"):
        run("keep", name, "", {"m": name * 4}, 60.0)  # 13 characters of JSON each
    assert run("get", "a", "") is None
    assert run("get", "b", "") is not None and run("get", "c", "") is not None
    run("keep", "d", "", {"m": "d" * 50}, 60.0)
    assert [run("get", k, "") is not None for k in "abcd"] == [False, False, False, True]
    run("keep", "e", "", {"m": "e"}, 60.0)
    assert run("get", "d", "") is None and run("get", "e", "") is not None


def test_kept_conversations_expire_and_belong_to_their_owner() -> None:
    run = _memory_store()
    run("keep", "gone", "o1", {"m": 1}, 0.0)
    run("keep", "kept", "o1", {"m": 2}, 60.0)
    assert run("get", "gone", "o1") is None  # past its retention time
    assert run("get", "kept", "o2") is None and not run("delete", "kept", "o2")
    assert run("delete", "kept", "o1") and run("get", "kept", "o1") is None


def test_a_run_that_raises_ends_each_stream_in_its_format(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run raises rather than recording a failure when the server's set-up is wrong
    # (a missing model file); after a stream's headers that is an error in the format.
    from conductor.errors import ConductorError
    from conductor.serve._service import Service

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConductorError("the model file SETUP-MARK is missing")

    monkeypatch.setattr(Service, "run_one", broken)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = client_of(url)
        events = list(client.responses.create(model="single:w0", input="Hi", stream=True))
        with pytest.raises(openai.APIError, match="SETUP-MARK"):
            list(
                client.chat.completions.create(
                    model="single:w0", messages=[{"role": "user", "content": "Hi"}], stream=True
                )
            )
        with pytest.raises(openai.APIError, match="SETUP-MARK"):
            list(client.completions.create(model="single:w0", prompt="Hi", stream=True))
        plain = httpx.post(
            f"{url}/responses", json={"model": "single:w0", "input": "Hi"}, timeout=30
        )
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error"]
    assert "SETUP-MARK" in events[-1].message and events[-1].code == "server_error"
    assert "SETUP-MARK" in error_of(plain, 500)["message"]


async def test_litellm_text_completion(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    litellm = pytest.importorskip("litellm")
    fake_server.script("w0", "A text answer.")
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = await litellm.atext_completion(
            model="text-completion-openai/single:w0",
            api_base=url,
            api_key=KEY,
            prompt="Complete this",
            num_retries=0,
        )
    assert reply.choices[0].text == "A text answer."
    assert fake_server.requests_for("w0")[0].messages[-1]["content"] == "Complete this"
