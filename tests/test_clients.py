"""Every client kind against the fake provider server, through ModelCaller.

Real SDKs (openai, anthropic, google-genai) and litellm send real HTTP to the fake server
on 127.0.0.1; nothing is mocked.  Retries wait through an injected ``sleep`` that only
records, so the tests do not wait for back-off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import ClassVar

import pytest
from kit.clock import scaled
from kit.poolkit import no_pause_limiter

from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    ModelCallError,
)
from conductor.llm.base import ModelClient
from conductor.llm.caller import ModelCaller
from conductor.llm.capabilities import ClientCapabilities
from conductor.llm.factory import make_client
from conductor.llm.types import ModelRequest, RawCompletion, Usage
from conductor.targets import Price, Worker
from conductor.testing import FakeLLMServer, Fault, Reply

KEY = "sk-fake-secret-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_FAKE_KEY"

# litellm-anthropic drives litellm's Anthropic route, the others its OpenAI route.
KINDS = ["litellm", "litellm-anthropic", "openai", "http", "anthropic", "google"]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    """A fake server that insists on KEY, with KEY exported under KEY_ENV."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeLLMServer(expected_api_key=KEY) as srv:
        yield srv


def make_worker(kind: str, server: FakeLLMServer, model: str, **kw: object) -> Worker:
    """A worker of client ``kind`` pointed at ``server`` for the scripted ``model``."""
    base: dict[str, object] = {"id": f"w-{kind}", "api_key_env": KEY_ENV, "max_retries": 3}
    base.update(kw)
    if kind == "litellm":
        return Worker(model=f"openai/{model}", api_base=server.openai_base, **base)  # type: ignore[arg-type]
    if kind == "litellm-anthropic":
        return Worker(model=f"anthropic/{model}", api_base=server.url, **base)  # type: ignore[arg-type]
    if kind in ("openai", "http"):
        return Worker(model=model, client=kind, api_base=server.openai_base, **base)  # type: ignore[arg-type]
    if kind == "anthropic":
        return Worker(model=model, client="anthropic", api_base=server.anthropic_base, **base)  # type: ignore[arg-type]
    return Worker(model=model, client="google", api_base=server.gemini_base, **base)  # type: ignore[arg-type]


def request(text: str = "What is 2+2?", **params: object) -> ModelRequest:
    return ModelRequest(
        messages=({"role": "user", "content": text},),
        params={"temperature": 0.2, "max_tokens": 64, **params},
    )


class Recorder:
    """A stand-in for asyncio.sleep that records the waits."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def call(worker: Worker, req: ModelRequest, sleep: Recorder | None = None):  # type: ignore[no-untyped-def]
    caller = ModelCaller(worker, sleep=sleep or Recorder(), limiter=no_pause_limiter(worker))
    try:
        return await caller.complete(req)
    finally:
        await caller.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_success_text_usage_and_system_prompt(kind: str, server: FakeLLMServer) -> None:
    server.script(
        "m-ok", [Reply("<think>hmm</think>The answer is 4.", input_tokens=11, output_tokens=7)]
    )
    worker = make_worker(kind, server, "m-ok", system_prompt="Be brief.")
    client = make_client(worker)
    assert isinstance(client, ModelClient)
    done = await call(worker, request())
    assert done.text == "<think>hmm</think>The answer is 4."
    assert (done.usage.input_tokens, done.usage.output_tokens) == (11, 7)
    assert done.attempts == 1 and not done.cached
    assert isinstance(done.raw, dict) and json.dumps(done.raw)
    (sent,) = server.requests
    assert sent.model == "m-ok"
    assert sent.api_key == KEY
    assert sent.messages[0] == {"role": "system", "content": "Be brief."}
    assert sent.messages[-1] == {"role": "user", "content": "What is 2+2?"}
    # The key is never echoed into what we keep.
    assert KEY not in json.dumps(done.raw, default=str)


@pytest.mark.parametrize("kind", ["litellm", "openai", "http"])
async def test_a_cost_the_provider_reports_is_the_calls_cost(
    kind: str, server: FakeLLMServer
) -> None:
    # OpenRouter's usage.cost (USD) is what the call cost, before any price: the pool's
    # price here would give 11 * 1000 / 1e6, not 0.0042.
    server.script("m-cost", [Reply("4", input_tokens=11, output_tokens=0, cost_usd=0.0042)])
    priced = make_worker(kind, server, "m-cost", price=Price(1000.0, 1000.0))
    done = await call(priced, request())
    assert done.cost_usd == pytest.approx(0.0042)
    assert done.cost_reported
    server.script("m-cost", [Reply("4", input_tokens=11, output_tokens=0)])
    plain = await call(priced, request())
    assert plain.cost_usd == pytest.approx(11 * 1000 / 1e6) and not plain.cost_reported


@pytest.mark.parametrize("kind", KINDS)
async def test_rate_limit_waits_at_least_retry_after(kind: str, server: FakeLLMServer) -> None:
    server.script("m-429", [Fault(429, "slow down", headers={"Retry-After": "7"}), "ok now"])
    rec = Recorder()
    done = await call(make_worker(kind, server, "m-429"), request(), rec)
    assert done.text == "ok now"
    assert done.attempts == 2
    assert len(rec.waits) == 1 and rec.waits[0] >= 7.0
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_server_error_then_success(kind: str, server: FakeLLMServer) -> None:
    server.script("m-500", [Fault(500, "boom"), "recovered"])
    rec = Recorder()
    done = await call(make_worker(kind, server, "m-500"), request(), rec)
    assert done.text == "recovered"
    assert done.attempts == 2 and len(rec.waits) == 1
    assert len(server.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_timeout_then_success(kind: str, server: FakeLLMServer) -> None:
    server.script("m-slow", [Reply("too late", latency_s=1.5), "in time"])
    rec = Recorder()
    worker = make_worker(kind, server, "m-slow", timeout_s=0.3)
    done = await call(worker, request(), rec)
    assert done.text == "in time"
    assert done.attempts == 2 and len(rec.waits) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_auth_error_fails_at_once(kind: str, server: FakeLLMServer) -> None:
    server.script("m-401", Fault(401, "Your key was revoked by the fake server."))
    rec = Recorder()
    with pytest.raises(AuthenticationError) as info:
        await call(make_worker(kind, server, "m-401"), request(), rec)
    err = info.value
    assert err.attempts == 1  # type: ignore[attr-defined]
    assert rec.waits == [] and len(server.requests) == 1
    assert err.status == 401 and err.target == f"w-{kind}"
    text = str(err)
    assert f"w-{kind}" in text and "HTTP 401" in text
    assert "Your key was revoked by the fake server." in text
    assert KEY not in text and KEY not in repr(err.__dict__)


@pytest.mark.parametrize("kind", KINDS)
async def test_wrong_key_is_rejected_and_not_leaked(
    kind: str, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "sk-wrong-key-should-never-show-up-42"
    monkeypatch.setenv(KEY_ENV, wrong)
    with pytest.raises(AuthenticationError) as info:
        await call(make_worker(kind, server, "m-any"), request())
    assert info.value.attempts == 1  # type: ignore[attr-defined]
    assert wrong not in str(info.value) and wrong not in str(info.value.provider_message)


@pytest.mark.parametrize("kind", KINDS)
async def test_bad_request_fails_at_once(kind: str, server: FakeLLMServer) -> None:
    server.script("m-400", Fault(400, "max_tokens is too large"))
    rec = Recorder()
    with pytest.raises(BadRequestError) as info:
        await call(make_worker(kind, server, "m-400"), request(), rec)
    assert info.value.attempts == 1  # type: ignore[attr-defined]
    assert info.value.status == 400
    assert "max_tokens is too large" in str(info.value)
    assert rec.waits == [] and len(server.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_retries_exhausted_raise_last_error(kind: str, server: FakeLLMServer) -> None:
    server.script("m-503", Fault(503, "still down"))
    rec = Recorder()
    with pytest.raises(ModelCallError) as info:
        await call(make_worker(kind, server, "m-503", max_retries=2), request(), rec)
    assert info.value.retryable and info.value.attempts == 3  # type: ignore[attr-defined]
    assert len(rec.waits) == 2 and len(server.requests) == 3


@pytest.mark.parametrize("kind", ["openai", "http", "anthropic", "google"])
async def test_missing_key_names_the_variable(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONDUCTOR_NO_SUCH_KEY", raising=False)
    worker = Worker(id="nokey", model="m", client=kind, api_key_env="CONDUCTOR_NO_SUCH_KEY")  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError, match="CONDUCTOR_NO_SUCH_KEY"):
        await call(worker, request())


@pytest.mark.parametrize("kind", ["litellm", "openai", "http"])
async def test_local_server_without_key_gets_placeholder(
    kind: str, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONDUCTOR_NO_SUCH_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = "openai/local-model" if kind == "litellm" else "local-model"
    for env in ("CONDUCTOR_NO_SUCH_KEY", None):
        worker = Worker(
            id="vllm",
            model=model,
            client=kind,  # type: ignore[arg-type]
            api_base=fake_server.openai_base,
            api_key_env=env,
        )
        done = await call(worker, request("hello"))
        assert done.text == "Echo: hello"
        assert fake_server.requests[-1].api_key == "not-needed"


async def test_openai_params_split_and_grammar(fake_server: FakeLLMServer) -> None:
    # The grammar's field per server is tests/test_structured_outputs.py's; here, the
    # one a vLLM 0.10 takes, beside the split of the parameters.
    fake_server.script("qwen", ["x"])
    worker = Worker(
        id="vllm",
        model="qwen",
        client="openai",
        api_base=fake_server.openai_base,
        structured_outputs="vllm-legacy",
    )
    req = ModelRequest(
        messages=({"role": "user", "content": "hi"},),
        params={"temperature": 0.5, "max_tokens": 9, "top_k": 20, "chat_template_kwargs": {"a": 1}},
        grammar='root ::= "x"',
    )
    await call(worker, req)
    body = fake_server.requests[0].body
    assert body["temperature"] == 0.5 and body["max_tokens"] == 9
    assert body["top_k"] == 20 and body["chat_template_kwargs"] == {"a": 1}
    assert body["guided_grammar"] == 'root ::= "x"'


async def test_anthropic_and_google_params(fake_server: FakeLLMServer) -> None:
    req = ModelRequest(
        messages=({"role": "system", "content": "S"}, {"role": "user", "content": "hi"}),
        params={"temperature": 0.1, "top_k": 5, "thinking_budget": 128},
    )
    anth = Worker(id="a", model="claude-x", client="anthropic", api_base=fake_server.url)
    await call(anth, ModelRequest(messages=req.messages, params={"top_k": 5}))
    body = fake_server.requests[-1].body
    assert body["max_tokens"] == 4096 and body["top_k"] == 5 and body["system"] == "S"
    goog = Worker(id="g", model="gemini/gem-x", client="google", api_base=fake_server.url)
    await call(goog, req)
    sent = fake_server.requests[-1]
    assert sent.model == "gem-x"
    config = sent.body["generationConfig"]
    assert config["temperature"] == 0.1 and config["topK"] == 5
    thinking = config["thinkingConfig"]
    # The SDK's wire casing of this field differs between releases.
    assert thinking.get("thinkingBudget", thinking.get("thinking_budget")) == 128
    assert sent.messages[0] == {"role": "system", "content": "S"}


def test_the_registry_serves_every_pool_kind_and_the_checkpoint() -> None:
    from conductor.llm.factory import CLIENTS, client_class
    from conductor.targets import CLIENT_KINDS

    assert set(CLIENTS) == set(CLIENT_KINDS)  # checkpoint included
    for kind, (module, class_name) in CLIENTS.items():
        cls = client_class(kind)
        assert isinstance(cls, type) and cls.__name__ == class_name
        assert cls.__module__ == "conductor.llm" + module
        assert callable(getattr(cls, "send", None)) and callable(getattr(cls, "aclose", None))


def test_an_unknown_client_kind_is_a_usage_error_naming_the_kinds() -> None:
    from conductor.errors import UsageError

    worker = Worker(id="w1", model="m", client="nope")  # type: ignore[arg-type]
    with pytest.raises(UsageError) as info:
        make_client(worker)
    assert str(info.value) == (
        "worker 'w1': unknown client 'nope' "
        "(expected litellm, openai, http, anthropic, google or local)"
    )


def test_make_client_builds_the_registered_class(fake_server: FakeLLMServer) -> None:
    from conductor.llm.http_client import HttpClient
    from conductor.llm.openai_client import OpenAIClient

    base = fake_server.openai_base
    assert type(make_client(Worker(id="a", model="m", client="openai", api_base=base))) is (
        OpenAIClient
    )
    assert type(make_client(Worker(id="b", model="m", client="http", api_base=base))) is (
        HttpClient
    )


# --------------------------------------------------------------------------- capabilities


def test_every_registered_client_class_declares_its_capabilities() -> None:
    from conductor.llm.capabilities import ClientCapabilities
    from conductor.llm.factory import CLIENTS, capabilities, client_class

    for kind in CLIENTS:
        cls = client_class(kind)
        assert isinstance(cls, type)
        declared = cls.__dict__.get("capabilities")  # on the class itself, not inherited
        assert isinstance(declared, ClientCapabilities), kind
        assert capabilities(kind) is declared
    # What the layers around the clients used to read off the kind names.
    assert {k for k in CLIENTS if capabilities(k).in_process} == {"local", "checkpoint"}
    assert [k for k in CLIENTS if capabilities(k).routes_by_model] == ["litellm"]
    assert capabilities("checkpoint").prefill == "chat_template"
    assert capabilities("nope") == ClientCapabilities()  # no client: no capabilities


@pytest.mark.process
def test_reading_capabilities_imports_no_sdk() -> None:
    """The registry imports a client's module to read its class's capabilities: that
    module must import no SDK (each imports its own on first send)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from conductor.llm.factory import CLIENTS, capabilities\n"
        "for kind in CLIENTS: capabilities(kind)\n"
        "heavy = ('litellm', 'openai', 'anthropic', 'google.genai', 'aiohttp', 'torch',\n"
        "         'transformers', 'vllm', 'llama_cpp', 'cyllama')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


class _FakeKindClient:
    """A client of a kind no release has, registered by the test alone."""

    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        key_envs=("CONDUCTOR_TEST_FAKE_KIND_KEY",),
        quota="fakeco",
        prefill="api_base",
        no_prefill="the fake API cannot continue an assistant message",
        price_prefix="fakeco/",
    )

    def __init__(self, target: Worker) -> None:
        self.target = target

    async def prepare(self) -> None:
        return None

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        return RawCompletion(text="fake reply", usage=Usage(3, 2), raw={})

    async def aclose(self) -> None:
        return None


class _FakeInProcessClient(_FakeKindClient):
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(in_process=True)


@pytest.fixture
def fake_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two new kinds, each registered with one line, as a new client would be."""
    import sys
    import types

    from conductor.llm import factory

    module = types.ModuleType("conductor_test_fake_kind")
    module.FakeKindClient = _FakeKindClient  # type: ignore[attr-defined]
    module.FakeInProcessClient = _FakeInProcessClient  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(factory.CLIENTS, "fakeco", (module.__name__, "FakeKindClient"))  # type: ignore[arg-type]
    monkeypatch.setitem(factory.CLIENTS, "fakelocal", (module.__name__, "FakeInProcessClient"))  # type: ignore[arg-type]
    monkeypatch.delenv("CONDUCTOR_TEST_FAKE_KIND_KEY", raising=False)


@pytest.mark.usefixtures("fake_kinds")
async def test_a_new_client_kind_needs_only_its_class_and_a_registry_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conductor.llm import cost
    from conductor.llm.cost import failed_call_cost, price_for
    from conductor.llm.keys import key_env_names, needed_key
    from conductor.llm.limiter import provider_key, sample_capacity
    from conductor.llm.prefill import continuation, prefill_message, unsupported_reason
    from conductor.targets import Price

    remote = Worker(id="r", model="m1", client="fakeco")  # type: ignore[arg-type]
    local = Worker(id="l", model="m2", client="fakelocal")  # type: ignore[arg-type]
    assert type(make_client(remote)) is _FakeKindClient
    # Keys: its own variable, needed unless a server is named; none in-process.
    assert needed_key(remote) == ("CONDUCTOR_TEST_FAKE_KIND_KEY",)
    assert key_env_names(remote) == ("CONDUCTOR_TEST_FAKE_KIND_KEY",)
    assert needed_key(local) == ()
    # Quota: its provider's, or none in-process (and one loaded copy per model).
    assert provider_key(remote) == "fakeco · default key"
    assert provider_key(local) is None
    assert sample_capacity([(local, 1), (replace(local, id="l2"), 1)]).samples == 1
    # Prefill: continued by a named server only, else left out for its reason.
    assert continuation(remote) is None and prefill_message(remote, "Go:") is None
    assert unsupported_reason(remote) == "the fake API cannot continue an assistant message"
    served = replace(remote, api_base="http://127.0.0.1:9/v1")
    assert continuation(served) == "vllm"
    # Price: the table under its prefix; free in-process.
    monkeypatch.setattr(cost, "_table", {"fakeco/m1": {"input_cost_per_token": 1e-6}})
    assert price_for(remote) == Price(1.0, 0.0)
    assert price_for(local) == Price(0.0, 0.0) and failed_call_cost(local) == 0.0
    # And a call goes through the caller like any other kind's.
    caller = ModelCaller(local)
    done = await caller.complete(ModelRequest(messages=({"role": "user", "content": "hi"},)))
    assert (done.text, done.cost_usd) == ("fake reply", 0.0)
    await caller.aclose()


# A child process in which another thread is half-way through importing a module (it
# sits in sys.modules with none of its attributes for a second and a half) when an SDK
# client is made ready and used. openai 3.x looks ``httpx`` up in sys.modules on every
# call: once an SDK import on a worker thread raced a call this way and `conductor ask`
# died ("partially initialized module 'httpx' has no attribute 'Timeout'").
_HALF_IMPORTED = """
import asyncio, importlib.abc, importlib.util, json, sys, threading, time

SLOW = sys.argv[1]
started = threading.Event()

class SlowFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != SLOW:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        real = spec.loader

        class Slow(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                started.set()
                time.sleep(1.5)
                real.exec_module(module)

        spec.loader = Slow()
        return spec

assert SLOW not in sys.modules
sys.meta_path.insert(0, SlowFinder())
threading.Thread(target=lambda: __import__(SLOW), daemon=True).start()
started.wait(30)
{body}
"""


@pytest.mark.process
@pytest.mark.parametrize(("sdk", "peeked"), [("openai", "httpx"), ("google.genai", "requests")])
def test_an_sdk_is_ready_only_once_what_it_peeks_at_is_whole(sdk: str, peeked: str) -> None:
    import subprocess
    import sys

    body = (
        "from conductor.llm.sdk import import_sdk\n"
        f"import_sdk({sdk!r})\n"
        "module = sys.modules[SLOW]\n"
        "print(len(vars(module)) > 20 and getattr(module, '__version__', None) is not None)\n"
    )
    code = _HALF_IMPORTED.replace("{body}", body)
    done = subprocess.run(
        [sys.executable, "-c", code, peeked], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", (sdk, peeked, done.stdout)


@pytest.mark.process
def test_an_openai_call_survives_another_thread_importing_httpx(server: FakeLLMServer) -> None:
    import subprocess
    import sys

    server.script("m-race", ["The answer is 4."])
    worker = make_worker("openai", server, "m-race")
    body = (
        "from conductor.llm.caller import ModelCaller\n"
        "from conductor.llm.types import ModelRequest\n"
        "from conductor.targets import Worker\n"
        "worker = Worker(**json.loads(sys.argv[2]))\n"
        "async def main():\n"
        "    caller = ModelCaller(worker)\n"
        "    try:\n"
        "        done = await caller.complete(ModelRequest(\n"
        "            messages=({'role': 'user', 'content': 'What is 2+2?'},), params={}))\n"
        "    finally:\n"
        "        await caller.aclose()\n"
        "    print(done.text)\n"
        "asyncio.run(main())\n"
    )
    fields = {
        "id": worker.id,
        "model": worker.model,
        "client": worker.client,
        "api_base": worker.api_base,
        "api_key_env": worker.api_key_env,
    }
    code = _HALF_IMPORTED.replace("{body}", body)
    done = subprocess.run(
        [sys.executable, "-c", code, "httpx", json.dumps(fields)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "The answer is 4."
    assert len(server.requests) == 1
