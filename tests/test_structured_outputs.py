"""A grammar sent to an OpenAI-compatible server in the field that server reads, the
server found out by asking it, and an error when a server ignores the grammar.

Real clients (the openai SDK, litellm, the aiohttp client) send real HTTP to servers on
127.0.0.1 that read the grammar the way each real server version does
(:mod:`kit.structkit`, which says where each rule was read); nothing is mocked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.structkit import GrammarServer, sent_grammar_fields

from conductor.errors import GrammarIgnoredError, PoolError
from conductor.grammar import workflow_grammar
from conductor.llm.caller import ModelCaller
from conductor.llm.factory import make_client
from conductor.llm.structured import clear_identified, vllm_kind
from conductor.llm.types import ModelRequest
from conductor.pool import load_pool_text
from conductor.targets import Worker

GRAMMAR = workflow_grammar(2, 2)
WORKFLOW = (
    "Model 0 solves it, model 1 checks.\n"
    'model_id = [0, 1]\nsubtasks = ["Solve the problem.", "Check the answer above."]\n'
    'access_list = [[], ["all"]]'
)
REQUEST = ModelRequest(
    messages=({"role": "user", "content": "Plan it."},),
    params={"max_tokens": 200},
    grammar=GRAMMAR,
)
# Each client kind, and the model name that reaches an OpenAI-compatible server.
CLIENTS = {"openai": "m", "http": "m", "litellm": "hosted_vllm/m", "litellm-openai": "openai/m"}
# What `auto` finds each emulation to be, and the field that carries the grammar there.
EXPECTED = {
    "vllm-0.10.1": {"guided_grammar": GRAMMAR},
    "vllm-0.11.0": {"structured_outputs": {"grammar": GRAMMAR}},
    "vllm-0.12.0": {"structured_outputs": {"grammar": GRAMMAR}},
    "sglang-0.5.23": {"ebnf": GRAMMAR},
    "llama.cpp": {"grammar": GRAMMAR},
}


@pytest.fixture(autouse=True)
def forget_servers() -> Iterator[None]:
    clear_identified()
    yield
    clear_identified()


def target(kind: str, server: GrammarServer, **kw: Any) -> Worker:
    client = "litellm" if kind.startswith("litellm") else kind
    fields: dict[str, Any] = {
        "id": "conductor",
        "model": CLIENTS[kind],
        "client": client,
        "api_base": server.base,
        "api_key_env": "CONDUCTOR_TEST_GRAMMAR_KEY",
        "max_retries": 0,
        "timeout_s": 20.0,
    }
    fields.update(kw)
    return Worker(**fields)


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_TEST_GRAMMAR_KEY", "sk-test")


async def send(worker: Worker, request: ModelRequest = REQUEST, times: int = 1) -> list[str]:
    client = make_client(worker)
    try:
        return [(await client.send(request, timeout_s=20)).text for _ in range(times)]
    finally:
        await client.aclose()


# ------------------------------------------------------------------ the field per server


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize("emulation", list(EXPECTED))
def test_auto_finds_the_server_and_sends_the_field_it_reads(kind: str, emulation: str) -> None:
    with GrammarServer(emulation, constrained=WORKFLOW) as server:
        texts = asyncio.run(send(target(kind, server)))
    assert texts == [WORKFLOW]
    assert sent_grammar_fields(server.bodies[0]) == EXPECTED[emulation]
    assert server.ignored == [set()]


@pytest.mark.parametrize(
    ("setting", "emulation"),
    [
        ("vllm", "vllm-0.12.0"),
        ("vllm", "vllm-0.11.0"),
        ("vllm-legacy", "vllm-0.11.0"),
        ("vllm-legacy", "vllm-0.10.1"),
        ("sglang", "sglang-0.5.23"),
        ("llama.cpp", "llama.cpp"),
    ],
)
def test_a_set_kind_is_sent_without_asking(setting: str, emulation: str) -> None:
    field = {
        "vllm": "structured_outputs",
        "vllm-legacy": "guided_grammar",
        "sglang": "ebnf",
        "llama.cpp": "grammar",
    }[setting]
    with GrammarServer(emulation, constrained=WORKFLOW) as server:
        texts = asyncio.run(send(target("http", server, structured_outputs=setting)))
    assert texts == [WORKFLOW]
    assert list(sent_grammar_fields(server.bodies[0])) == [field]
    assert server.gets == []


def test_the_server_is_asked_once_per_address() -> None:
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW) as server:
        asyncio.run(send(target("openai", server), times=3))
        asyncio.run(send(target("http", server), times=2))
    # The four probes of the first call, none after.
    assert sorted(server.gets) == ["/get_server_info", "/props", "/server_info", "/version"]
    assert len(server.bodies) == 5


def test_no_grammar_no_questions_and_no_field() -> None:
    with GrammarServer("vllm-0.12.0", free="plain") as server:
        request = ModelRequest(messages=REQUEST.messages)
        assert asyncio.run(send(target("openai", server), request)) == ["plain"]
    assert server.gets == [] and sent_grammar_fields(server.bodies[0]) == {}


def test_none_sends_no_grammar_and_checks_nothing() -> None:
    with GrammarServer("vllm-0.12.0", free="Sure, no lists.") as server:
        texts = asyncio.run(send(target("http", server, structured_outputs="none")))
    assert texts == ["Sure, no lists."]
    assert sent_grammar_fields(server.bodies[0]) == {} and server.gets == []


def test_vllm_versions() -> None:
    assert [vllm_kind(v) for v in ("0.10.1", "0.10.2.post1", "0.8.5", "0.11.0rc1", "0.12.0")] == [
        "vllm-legacy",
        "vllm-legacy",
        "vllm-legacy",
        "vllm",
        "vllm",
    ]
    assert vllm_kind("1.0.0") == "vllm" and vllm_kind("dev") == "vllm"


# ------------------------------------------------------------- a server that ignores it


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_the_old_field_to_vllm_0_12_is_an_error_not_a_silent_200(kind: str) -> None:
    """vLLM 0.12 logs guided_grammar as ignored and decodes unconstrained."""
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW) as server:
        worker = target(kind, server, structured_outputs="vllm-legacy")
        with pytest.raises(GrammarIgnoredError) as caught:
            asyncio.run(send(worker))
    assert server.ignored == [{"guided_grammar"}]
    error = caught.value
    assert error.field == "guided_grammar" and error.target == "conductor"
    message = str(error)
    assert "`guided_grammar`" in message and server.base in message
    assert "conductor.structured_outputs" in message
    # The server, asked when the reply failed, is named with the kind that reads it.
    assert "(vLLM 0.12.0)" in message
    assert "to vllm (vLLM 0.11 or later: structured_outputs.grammar);" in message
    assert "'Sure!" in message  # where the reply left the grammar


def test_the_new_field_to_vllm_0_10_is_an_error_naming_the_detected_version() -> None:
    with GrammarServer("vllm-0.10.1", constrained=WORKFLOW) as server:
        worker = target("openai", server, structured_outputs="vllm")
        with pytest.raises(GrammarIgnoredError) as caught:
            asyncio.run(send(worker))
    assert server.ignored == [{"structured_outputs"}]
    assert caught.value.field == "structured_outputs.grammar"
    assert "to vllm-legacy (vLLM 0.10 or earlier: guided_grammar);" in str(caught.value)


@pytest.mark.parametrize("emulation", ["sglang-0.5.23", "llama.cpp"])
def test_vllm_fields_to_sglang_or_llama_cpp_are_an_error(emulation: str) -> None:
    with GrammarServer(emulation, constrained=WORKFLOW) as server:
        worker = target("http", server, structured_outputs="vllm")
        with pytest.raises(GrammarIgnoredError, match="structured_outputs.grammar"):
            asyncio.run(send(worker))


def test_an_unknown_server_gets_vllms_field_with_a_warning_and_the_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        GrammarServer("other", constrained=WORKFLOW) as server,
        caplog.at_level(logging.WARNING, logger="conductor"),
        pytest.raises(GrammarIgnoredError) as caught,
    ):
        asyncio.run(send(target("openai", server)))
    assert sent_grammar_fields(server.bodies[0]) == {"structured_outputs": {"grammar": GRAMMAR}}
    assert "could not tell which server" in caplog.text
    message = str(caught.value)
    for choice in ("vllm-legacy", "sglang", "llama.cpp", "none"):
        assert choice in message


def test_the_caller_fails_the_call_once_without_retrying() -> None:
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW) as server:
        worker = target("http", server, structured_outputs="vllm-legacy", max_retries=3)

        async def call() -> None:
            caller = ModelCaller(worker)
            try:
                await caller.complete(REQUEST)
            finally:
                await caller.aclose()

        with pytest.raises(GrammarIgnoredError) as caught:
            asyncio.run(call())
    assert len(server.bodies) == 1
    assert caught.value.attempts == 1
    assert "the Conductor failed: grammar ignored: the server at" in caught.value.describe()


# ------------------------------------------------------- replies a grammar may give


def test_a_reply_cut_off_at_the_token_limit_need_only_begin_a_sentence() -> None:
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW[:70], finish_reason="length") as s:
        assert asyncio.run(send(target("http", s))) == [WORKFLOW[:70]]


def test_a_stopped_reply_need_only_begin_a_sentence_but_a_finished_one_must_end() -> None:
    request = ModelRequest(messages=REQUEST.messages, params={"stop": ["]]"]}, grammar=GRAMMAR)
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW[:-2]) as server:
        assert asyncio.run(send(target("http", server), request)) == [WORKFLOW[:-2]]
        with pytest.raises(GrammarIgnoredError, match="ended before the grammar did"):
            asyncio.run(send(target("http", server)))


def test_reasoning_returned_beside_the_content_is_not_held_to_the_grammar() -> None:
    """vLLM's reasoning parser returns the thinking as reasoning_content; the grammar
    constrains the content only."""
    with GrammarServer("vllm-0.12.0", constrained=WORKFLOW, reasoning="[thinking] hard") as server:
        texts = asyncio.run(send(target("openai", server)))
    assert texts == [f"<think>[thinking] hard</think>{WORKFLOW}"]


# ------------------------------------------------------------------ pool files


def _pool(conductor: str = "", worker: str = "") -> str:
    return (
        "workers:\n  - id: w0\n    model: m\n    client: openai\n"
        f"    api_base: http://127.0.0.1:9/v1\n{worker}"
        "conductor:\n  backend: endpoint\n  api_base: http://127.0.0.1:9/v1\n"
        f"  constrained: true\n{conductor}"
    )


def test_the_pool_file_setting_reaches_the_conductor_and_the_worker() -> None:
    from conductor.conductors.spec import resolve_conductor

    pool = load_pool_text(
        _pool("  structured_outputs: vllm-legacy\n", "    structured_outputs: sglang\n")
    )
    assert pool.workers[0].structured_outputs == "sglang"
    assert resolve_conductor(pool).target.structured_outputs == "vllm-legacy"
    assert resolve_conductor(load_pool_text(_pool())).target.structured_outputs == "auto"


def test_a_misspelt_kind_is_refused_with_a_suggestion() -> None:
    with pytest.raises(PoolError) as caught:
        load_pool_text(_pool("  structured_outputs: vlm\n"), source="p.yaml")
    message = str(caught.value)
    assert message.startswith("p.yaml:10: conductor.structured_outputs must be one of")
    assert "did you mean" in message.lower() and "vllm" in message


def test_the_setting_is_refused_where_no_server_reads_it() -> None:
    worker = (
        "  - id: w1\n    model: claude-x\n    client: anthropic\n    structured_outputs: vllm\n"
    )
    text = _pool().replace("conductor:\n", worker + "conductor:\n")
    with pytest.raises(PoolError, match="applies only to a client that sends a grammar"):
        load_pool_text(text)


def test_the_default_is_left_out_of_records(tmp_path: Path) -> None:
    from conductor.pool import pool_to_public_dict

    plain = pool_to_public_dict(load_pool_text(_pool()))
    assert "structured_outputs" not in plain["workers"][0]
    assert "structured_outputs" not in plain["conductor"]
    set_ = pool_to_public_dict(load_pool_text(_pool("  structured_outputs: sglang\n")))
    assert set_["conductor"]["structured_outputs"] == "sglang"


# ------------------------------------------------------------------ a whole question


def test_a_question_with_a_constrained_endpoint_conductor(tmp_path: Path) -> None:
    """`constrained: true` against an emulated vLLM 0.12: `auto` sends the field it
    reads and the run goes on; the old field fails the Conductor with the reason (the
    call is neither retried nor cached), where it used to pass an unconstrained reply."""
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import Orchestrator, RunSettings
    from conductor.llm.cache import ResponseCache
    from conductor.testing import FakeLLMServer

    plan = 'Ask model 0.\nmodel_id = [0]\nsubtasks = ["Answer the question."]\naccess_list = [[]]'

    async def run(pool_text: str, cache: str) -> Any:
        pool = load_pool_text(pool_text)
        orch = Orchestrator(pool, resolve_conductor(pool), cache=ResponseCache(tmp_path / cache))
        try:
            return await orch.run("What is 2 + 2?", RunSettings())
        finally:
            await orch.aclose()

    with (
        FakeLLMServer() as workers,
        GrammarServer("vllm-0.12.0", constrained=plan, free="I think 4.") as server,
    ):
        workers.script("w0", ["<answer>4</answer>"] * 2)
        text = (
            f"workers:\n  - id: w0\n    model: w0\n    client: openai\n"
            f"    api_base: {workers.openai_base}\n"
            f"conductor:\n  backend: endpoint\n  api_base: {server.base}\n"
            "  constrained: true\n  parse_retries: 0\n  max_retries: 3\n"
        )
        good = asyncio.run(run(text, "good"))
        assert good.status == "ok", good.error
        assert good.rounds[0].steps[0].call.response == "<answer>4</answer>"
        assert sent_grammar_fields(server.bodies[0])["structured_outputs"]["grammar"]

        # (A cached reply passed the check when it was made, whatever the field: a fresh
        # cache, so that the Conductor is asked.)
        bad = asyncio.run(run(text + "  structured_outputs: vllm-legacy\n", "bad"))
        reason = bad.rounds[0].stop_reason or ""
        assert "grammar ignored" in reason and "`guided_grammar`" in reason, reason
        assert bad.rounds[0].steps == []
        assert len(server.bodies) == 2  # one try, no retry
        again = asyncio.run(run(text + "  structured_outputs: vllm-legacy\n", "bad"))
        assert "grammar ignored" in (again.rounds[0].stop_reason or "")
        assert len(server.bodies) == 3  # not answered from the cache


def test_a_server_that_did_not_answer_is_asked_again() -> None:
    import socket

    from conductor.llm.structured import identify_server

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    base = f"http://127.0.0.1:{port}/v1"
    first = asyncio.run(identify_server(base, timeout_s=5))
    assert (first.kind, first.reached) == (None, False)
    with GrammarServer("llama.cpp") as server:
        found = asyncio.run(identify_server(server.base))
    assert (found.kind, found.described) == ("llama.cpp", "llama-server b7100-0123abc")
