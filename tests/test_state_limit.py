"""A provider key's request rate (``rpm:``) and identical calls, across processes, on a
real redis-server started here, against the fake OpenAI server counting what arrives."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kit.clock import scaled
from kit.poolkit import run_cli
from kit.redisserver import RedisServer
from kit.servekit import make_pool_file
from kit.servekit import worker as kit_worker

from conductor.errors import StateUnavailable
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.caller import CallerSet
from conductor.llm.limiter import LocalRate
from conductor.llm.types import ModelRequest
from conductor.state import StateURL, open_rates
from conductor.state.redis_cache import RedisCacheStore
from conductor.state.redis_limiter import RedisRates
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault

pytestmark = pytest.mark.process  # each test starts a redis-server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


@pytest.fixture
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as s:
        yield s


def req(text: str) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},))


def worker(fake: FakeLLMServer, **kw: object) -> Worker:
    return Worker(id="w", model="m", client="openai", api_base=fake.openai_base,
                  api_key_env="FAKE_KEY", max_retries=0, **kw)  # type: ignore[arg-type]  # fmt: skip


# Each child makes N calls at once through one CallerSet, its rate on the state server
# when one is given (``rpm`` 0: none); ``mode`` "rate" asks N questions of its own,
# "same" the N questions every child asks, through the shared call cache ("nolease":
# the cache with its leases taken out, the positive control).  It waits for a line on
# stdin to start, so that the three ask at once however long each took to import (and
# to open its connection, with one call first).
CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from conductor.llm.cache import ResponseCache
    from conductor.llm.caller import CallerSet
    from conductor.llm.types import ModelRequest
    from conductor.state import StateURL, open_rates
    from conductor.state.redis_cache import RedisCacheStore
    from conductor.targets import Worker
    base, state, rpm, n, tag, mode = sys.argv[1:7]
    os.environ["FAKE_KEY"] = "k"
    w = Worker(id="w", model="m", client="openai", api_base=base, api_key_env="FAKE_KEY",
               rpm=float(rpm) or None, max_concurrency=8, max_retries=0)
    class NoLease(RedisCacheStore):
        def claim(self, key, ttl_s):
            return ""
    def ask(text):
        return ModelRequest(messages=({"role": "user", "content": text},))
    async def main():
        url = StateURL.parse(state) if state else None
        cache = None
        if mode != "rate":
            cache = ResponseCache(store=(NoLease if mode == "nolease" else RedisCacheStore)(url))
        callers = CallerSet(cache, rates=open_rates(url) if mode == "rate" else None)
        caller = callers.get(w)
        await caller.complete(ask("warm " + tag))
        print("ready", flush=True)
        sys.stdin.readline()
        texts = [f"{tag} {i}" if mode == "rate" else f"q{i}" for i in range(int(n))]
        answers = await asyncio.gather(*(caller.complete(ask(t)) for t in texts))
        assert [a.text for a in answers] == ["Echo: " + t for t in texts]
        await callers.aclose()
    asyncio.run(main())
""")


def children(
    fake: FakeLLMServer, state: str, n: int, *, rpm: float = 0, mode: str = "rate"
) -> list[float]:
    """Start three children making ``n`` calls each at once; when the requests they sent
    arrived at the fake server (the warm-up calls left out)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, fake.openai_base, state, str(rpm), str(n), f"p{i}", mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(3)
    ]
    for child in procs:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    fake.reset()
    for child in procs:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in procs:
        _, err = child.communicate(timeout=scaled(120))
        assert child.returncode == 0, err[-2000:]
    return sorted(r.received_at for r in fake.requests)


def hammer(fake: FakeLLMServer, state: str, rpm: float, n: int) -> float:
    """The rate (requests a minute) at which three children's ``n`` calls each arrived."""
    times = children(fake, state, n, rpm=rpm)
    assert len(times) == 3 * n
    return (len(times) - 1) / (times[-1] - times[0]) * 60


@pytest.mark.long  # waits on real time (a rate, latency, a lease running out)
def test_three_processes_share_one_rate_on_the_state_server(
    server: RedisServer, fake: FakeLLMServer
) -> None:
    rpm = 1200.0  # 20 a second
    shared = hammer(fake, server.url, rpm, 30)
    assert abs(shared - rpm) / rpm <= 0.05, shared
    # The contrast: with no state server each process keeps the rate to itself, and
    # three of them send about three times as much.
    fake.reset()
    alone = hammer(fake, "", rpm, 30)
    assert alone > 2.4 * rpm, alone


async def admitted(rate: object, times: int) -> None:
    for _ in range(times):
        await rate.admit()  # type: ignore[attr-defined]


async def test_a_rate_limit_reply_cuts_the_rate_of_every_process_once_per_generation(
    server: RedisServer,
) -> None:
    url = StateURL.parse(server.url)
    one, two = RedisRates(url)("key", 600), RedisRates(url)("key", 600)
    generation = await one.admit()
    one.feedback(generation, rate_limited=True, wait_s=None)
    # The second 429 of an attempt sent under the old rate does not cut again.
    one.feedback(generation, rate_limited=True, wait_s=None)
    await two.admit()  # the other process hears it at its next admission
    assert two.rpm == one.rpm == 300  # type: ignore[attr-defined]
    two.feedback(generation + 1, rate_limited=False, wait_s=None)  # a success grows it back
    assert two.rpm == 301  # type: ignore[attr-defined]


async def test_the_local_rate_follows_the_same_rules() -> None:
    rate = LocalRate("key", 600)
    generation = await rate.admit()
    rate.feedback(generation, rate_limited=True, wait_s=None)
    rate.feedback(generation, rate_limited=True, wait_s=None)
    assert rate.rpm == 300
    rate.feedback(generation + 1, rate_limited=False, wait_s=None)
    assert rate.rpm == 301


@pytest.mark.long  # waits on real time (a rate, latency, a lease running out)
async def test_a_server_down_holds_every_call_back_then_restarts_fresh(
    server: RedisServer, fake: FakeLLMServer, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("FAKE_KEY", "k")
    callers = CallerSet(None, rates=RedisRates(StateURL.parse(server.url)))
    caller = callers.get(worker(fake, rpm=6000))
    await caller.complete(req("before"))
    server.stop()
    with caplog.at_level(logging.WARNING, logger="conductor"):
        calls = asyncio.gather(*(caller.complete(req(f"during {i}")) for i in range(3)))
        await asyncio.sleep(1.0)
        # Fails closed: nothing is sent unmetered while the limit cannot be read.
        assert len(fake.requests) == 1
        server.start()  # on the same port, with nothing of the old state
        await asyncio.wait_for(calls, scaled(30))
    assert len(fake.requests) == 4
    lines = [r.getMessage() for r in caplog.records]
    assert sum("cannot be reached" in line for line in lines) == 1, lines
    assert sum("are back" in line for line in lines) == 1, lines
    await callers.aclose()


async def test_a_server_that_stays_down_fails_the_call_in_one_sentence(
    server: RedisServer, fake: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KEY", "k")
    callers = CallerSet(None, rates=RedisRates(StateURL.parse(server.url), give_up_s=0.5))
    caller = callers.get(worker(fake, rpm=6000))
    server.stop()
    with pytest.raises(StateUnavailable) as failed:
        await caller.complete(req("q"))
    message = str(failed.value)
    assert "could not be reached for 0.5 s" in message and message.count(". ") == 0
    assert fake.requests == []
    await callers.aclose()


# --------------------------------------------------------------------------- in flight


@pytest.mark.long  # waits on real time (a rate, latency, a lease running out)
def test_three_processes_asking_the_same_at_once_pay_each_call_once(
    server: RedisServer, fake: FakeLLMServer
) -> None:
    fake.latency_s = 0.3  # every call is still in flight when the others ask
    assert len(children(fake, server.url, 6, mode="same")) == 6
    # The positive control: the same cache with its leases taken out pays more.
    redis.Redis.from_url(server.url).flushdb()
    assert len(children(fake, server.url, 6, mode="nolease")) > 6


def two_callers(server: RedisServer, fake: FakeLLMServer) -> list[CallerSet]:
    """Two callers of one worker, each with a store of its own (two processes, in one)."""
    url = StateURL.parse(server.url)
    return [CallerSet(ResponseCache(store=RedisCacheStore(url))) for _ in range(2)]


@pytest.mark.long  # waits on real time (a rate, latency, a lease running out)
async def test_a_failed_call_is_not_shared_a_waiter_makes_its_own(
    server: RedisServer, fake: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KEY", "k")
    fake.latency_s = 0.3
    fake.script("m", [Fault(400), "fine"])  # a 400 is not retried
    one, two = (c.get(worker(fake)) for c in two_callers(server, fake))
    results = await asyncio.gather(one.complete(req("q")), two.complete(req("q")),
                                   return_exceptions=True)  # fmt: skip
    assert len(fake.requests) == 2
    assert sorted(type(r).__name__ for r in results) == ["BadRequestError", "Completion"]


@pytest.mark.long  # waits on real time (a rate, latency, a lease running out)
async def test_a_lease_whose_holder_died_is_taken_over(
    server: RedisServer, fake: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KEY", "k")
    target = worker(fake)
    # A holder that died: its lease is never renewed nor released, and runs out.
    lease = "conductor:cache:lease:" + cache_key(target, req("q"))
    redis.Redis.from_url(server.url).set(lease, "dead", px=500)
    caller = two_callers(server, fake)[0].get(target)
    answer = await asyncio.wait_for(caller.complete(req("q")), scaled(30))
    assert answer.text == "Echo: q" and not answer.cached
    assert len(fake.requests) == 1


def test_only_the_holder_frees_or_renews_a_lease(server: RedisServer) -> None:
    store = RedisCacheStore(StateURL.parse(server.url))
    token = store.claim("k", 10.0)
    assert token and store.claim("k", 10.0) is None  # held
    store.release("k", "another holder's token")
    store.renew("k", "another holder's token", 0.001)
    assert store.claim("k", 10.0) is None  # still held: neither acted
    store.release("k", token)
    assert store.claim("k", 10.0)
    server.stop()
    assert store.claim("k", 10.0) == ""  # lost: the call is made with no lease


def test_bench_keeps_a_worker_s_rate_on_the_state_server(
    server: RedisServer, fake: FakeLLMServer, tmp_path: Path
) -> None:
    pool = make_pool_file(tmp_path, fake, workers=[{**kit_worker(fake, "w0"), "rpm": 600}])
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "c"), "OPENAI_API_KEY": "sk-fake"}
    args = ["bench", "smoke", "--pool", str(pool), "--strategy", "single:w0", "--limit", "3"]
    done = run_cli(*args, "--out", str(tmp_path / "r"), "--state", server.url, env=env)
    assert done.returncode == 0, done.stderr
    assert len(fake.requests) == 3
    (key,) = redis.Redis.from_url(server.url).keys("conductor:rate:*")
    assert redis.Redis.from_url(server.url).hget(key, "rpm") == b"600"


def test_a_workers_rate_holds_the_conductors_calls_on_its_key_from_the_first(
    server: RedisServer, fake: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Conductor states no rate and calls first; the worker on its key states one.
    # Declared before the first call, the worker's rate spaces the Conductor's calls too
    # (undeclared, the key had no rate until the worker's own first call: the calls
    # went out at once; found by benchmarks/perf/shared_state.py).
    monkeypatch.setenv("FAKE_KEY", "k")
    conductor = worker(fake)
    rated = Worker(id="w2", model="m2", client="openai", api_base=fake.openai_base,
                   api_key_env="FAKE_KEY", max_retries=0, rpm=60.0)  # fmt: skip

    async def main() -> None:
        callers = CallerSet(None, rates=open_rates(StateURL.parse(server.url)))
        callers.declare([conductor, rated])
        caller = callers.get(conductor)
        await asyncio.gather(*(caller.complete(req(f"q{i}")) for i in range(5)))
        await callers.aclose()

    asyncio.run(main())
    times = sorted(r.received_at for r in fake.requests)
    # One a second, the first two at once (the schedule's start): five calls span about
    # three seconds (never less than 2.5, however busy the machine; undeclared, none).
    assert len(times) == 5 and times[-1] - times[0] >= 2.5, times
