"""ModelCaller and CallerSet: cache use, concurrency limit, cost, error targets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from conductor.errors import BadRequestError, ServerError
from conductor.llm.cache import ResponseCache
from conductor.llm.caller import CallerSet, ModelCaller
from conductor.llm.failures import make_error
from conductor.llm.types import ModelRequest, RawCompletion, Usage
from conductor.targets import Price, Worker
from conductor.testing import FakeLLMServer, Fault, Reply


def worker(server: FakeLLMServer, model: str, **kw: object) -> Worker:
    return Worker(id="w1", model=model, client="openai", api_base=server.openai_base, **kw)  # type: ignore[arg-type]


def req(text: str = "hi", sample: int = 0) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},), sample_index=sample)


async def no_sleep(_: float) -> None:
    return None


async def test_cache_hit_sends_nothing(fake_server: FakeLLMServer, tmp_path: Path) -> None:
    fake_server.script(
        "m", [Reply("first", input_tokens=1000, output_tokens=500, latency_s=0.5), "second"]
    )
    cache = ResponseCache(tmp_path)
    caller = ModelCaller(worker(fake_server, "m", price=Price(1.0, 2.0)), cache=cache)
    try:
        a = await caller.complete(req())
        b = await caller.complete(req())
        c = await caller.complete(req(sample=1))
    finally:
        await caller.aclose()
        cache.close()
    assert (a.text, a.cached, a.attempts) == ("first", False, 1)
    assert a.cost_usd == pytest.approx(0.002)
    assert (b.text, b.cached, b.attempts) == ("first", True, 0)
    assert b.cost_usd == pytest.approx(0.002) and b.usage == a.usage
    # The replay never waits for the server (which takes 0.5 s to answer).
    assert b.latency_s < 0.5 <= a.latency_s and b.raw == a.raw
    assert c.text == "second" and not c.cached  # another sample index is another key
    assert len(fake_server.requests) == 2


async def test_errors_are_not_cached(fake_server: FakeLLMServer, tmp_path: Path) -> None:
    fake_server.script("m", [Fault(400, "nope"), "fine"])
    cache = ResponseCache(tmp_path)
    caller = ModelCaller(worker(fake_server, "m"), cache=cache)
    try:
        with pytest.raises(BadRequestError):
            await caller.complete(req())
        ok = await caller.complete(req())
    finally:
        await caller.aclose()
        cache.close()
    assert ok.text == "fine" and not ok.cached
    assert len(fake_server.requests) == 2


async def test_semaphore_limits_concurrency(fake_server: FakeLLMServer) -> None:
    fake_server.script("m", Reply("x", latency_s=0.2))
    caller = ModelCaller(worker(fake_server, "m", max_concurrency=2))
    try:
        await caller.complete(req("warm-up"))  # connection set-up out of the timing
        t0 = time.perf_counter()
        results = await asyncio.gather(*(caller.complete(req(f"q{i}")) for i in range(6)))
        elapsed = time.perf_counter() - t0
    finally:
        await caller.aclose()
    assert [r.text for r in results] == ["x"] * 6
    # Three rounds of two, never three at once: a lower bound, which a busy machine
    # cannot break (an upper bound on the time would be about speed, not behaviour).
    assert elapsed >= 0.55
    # Never more than two requests in flight: arrivals come in pairs 0.2 s apart.
    arrivals = sorted(r.received_at for r in fake_server.requests[1:])
    assert arrivals[2] - arrivals[0] >= 0.15 and arrivals[4] - arrivals[2] >= 0.15


class FailingClient:
    """A ModelClient whose every attempt fails with a server error and no target."""

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        self.calls += 1
        raise make_error(ServerError, target=None, status=503, provider_message="overloaded")

    async def aclose(self) -> None:
        return None


async def test_final_error_names_target_and_attempts() -> None:
    client = FailingClient()
    caller = ModelCaller(Worker(id="judge", model="m", max_retries=2), client, sleep=no_sleep)
    with pytest.raises(ServerError) as info:
        await caller.complete(req())
    assert info.value.target == "judge" and info.value.attempts == 3  # type: ignore[attr-defined]
    assert "judge" in str(info.value) and "HTTP 503" in str(info.value)
    assert client.calls == 3


class OkClient:
    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        return RawCompletion("done", Usage(2, 3), {"id": 1}, model="m", finish_reason="stop")

    async def aclose(self) -> None:
        return None


async def test_completion_fields_from_raw() -> None:
    caller = ModelCaller(Worker(id="w", model="m", price=Price(0.0, 1e6)), OkClient())
    done = await caller.complete(req())
    assert done.text == "done" and done.usage == Usage(2, 3)
    assert done.cost_usd == pytest.approx(3.0)
    assert done.model == "m" and done.finish_reason == "stop" and done.raw == {"id": 1}


async def test_caller_set_reuses_callers(fake_server: FakeLLMServer) -> None:
    callers = CallerSet(None)
    w = worker(fake_server, "m")
    first = callers.get(w)
    assert callers.get(w) is first
    assert callers.get(worker(fake_server, "other")) is not first
    done = await first.complete(req("hello"))
    assert done.text == "Echo: hello"
    await callers.aclose()


async def test_degenerate_entries_of_older_versions_are_not_replayed(
    fake_server: FakeLLMServer, tmp_path: Path
) -> None:
    """An empty or truncated reply an older version cached is a miss: the model is asked
    again, and only its complete answer is stored."""
    from conductor.llm.cache import cache_key

    fake_server.script("m", ["complete answer"])
    target = worker(fake_server, "m")
    cache = ResponseCache(tmp_path)
    key = cache_key(target, req())
    degenerate = [
        {"text": "", "finish_reason": "stop"},
        {"text": "half an ans", "finish_reason": "length"},
    ]
    caller = ModelCaller(target, cache=cache)
    try:
        for old in degenerate:
            # Written as an older version did, around ResponseCache.set's refusal (once
            # the answer of the round before is on disk, which it would overwrite).
            cache.flush()
            cache._store._cache.set(  # type: ignore[attr-defined]
                key, {**old, "usage": {"input_tokens": 1, "output_tokens": 1}, "raw": {}}
            )
            assert cache.get(key) is None
            done = await caller.complete(req())
            assert (done.text, done.cached) == ("complete answer", False)
            hit = cache.get(key)
            assert hit is not None and hit.text == "complete answer"
        cache.set("other", RawCompletion(text=" \n", usage=Usage(), raw={}))
        cache.set("cut", RawCompletion(text="x", usage=Usage(), raw={}, finish_reason="MAX_TOKENS"))
        assert cache.get("other") is None and cache.get("cut") is None
    finally:
        await caller.aclose()
        cache.close()
    assert len(fake_server.requests) == 2


async def test_one_full_attempt_fits_whatever_the_total_timeout(
    fake_server: FakeLLMServer,
) -> None:
    """total_timeout_s below timeout_s still allows one attempt of timeout_s."""
    from conductor.errors import RequestTimeoutError

    fake_server.script("m", [Fault.hang()])
    caller = ModelCaller(
        worker(fake_server, "m", timeout_s=0.4, total_timeout_s=0.01, max_retries=3),
        sleep=no_sleep,
    )
    try:
        with pytest.raises(RequestTimeoutError, match="no reply within 0.4 s"):
            await caller.complete(req())
    finally:
        await caller.aclose()
    assert len(fake_server.requests) == 1


def test_total_timeout_is_a_pool_setting(tmp_path: Path) -> None:
    from conductor.pool import load_pool

    path = tmp_path / "pool.yaml"
    path.write_text(
        "defaults: {total_timeout_s: 120}\n"
        "workers:\n"
        "  - {id: a, model: openai/gpt-x}\n"
        "  - {id: b, model: openai/gpt-x, total_timeout_s: 30}\n"
    )
    pool = load_pool(path)
    assert [w.total_timeout_s for w in pool.workers] == [120.0, 30.0]
    assert Worker(id="c", model="m").total_timeout_s == 900.0
    path.write_text("workers:\n  - {id: a, model: m, total_timeout_s: 0}\n")
    from conductor.errors import PoolError

    with pytest.raises(PoolError, match="total_timeout_s"):
        load_pool(path)


async def test_empty_reply_of_a_seeded_in_process_model_is_returned_not_retried(
    tmp_path: Path,
) -> None:
    """A local model with a fixed seed would only repeat an empty reply: it is returned
    at once (the Conductor's parser answers it), and not cached."""

    class Empty:
        def __init__(self) -> None:
            self.sends = 0

        async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
            self.sends += 1
            return RawCompletion(text="", usage=Usage(1, 0), raw={})

        async def aclose(self) -> None:
            return None

    cache = ResponseCache(tmp_path)
    for client_kind, sends, error in (("local", 1, None), ("openai", 3, True)):
        fake = Empty()
        target = Worker(id="w", model="m", client=client_kind, max_retries=2)  # type: ignore[arg-type]
        caller = ModelCaller(target, fake, cache=cache, sleep=no_sleep)
        if error:
            from conductor.errors import BadResponseError

            with pytest.raises(BadResponseError, match="the reply is empty"):
                await caller.complete(req())
        else:
            done = await caller.complete(req())
            assert done.text == "" and not done.cached
        assert fake.sends == sends
    assert cache.stats().entries == 0
    cache.close()
