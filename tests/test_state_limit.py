"""A provider key's request rate (``rpm:``) and identical calls, across processes, on a
real redis-server started here, against the fake OpenAI server counting what arrives."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from kit.clock import scaled
from kit.redisserver import RedisServer

from conductor.errors import StateUnavailable
from conductor.llm.caller import CallerSet
from conductor.llm.limiter import LocalRate
from conductor.llm.types import ModelRequest
from conductor.state import StateURL
from conductor.state.redis_limiter import RedisRates
from conductor.targets import Worker
from conductor.testing import FakeLLMServer

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


# Each child makes N calls (distinct questions) through one CallerSet, its rate on the
# state server when one is given; it waits for a line on stdin to start, so that the
# three hammer at once however long each took to import (and open its connection).
CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from conductor.llm.caller import CallerSet
    from conductor.llm.types import ModelRequest
    from conductor.state import StateURL, open_rates
    from conductor.targets import Worker
    base, state, rpm, n, tag, mode = sys.argv[1:7]
    os.environ["FAKE_KEY"] = "k"
    w = Worker(id="w", model="m", client="openai", api_base=base, api_key_env="FAKE_KEY",
               rpm=float(rpm), max_concurrency=8, max_retries=0)
    async def main():
        callers = CallerSet(None, rates=open_rates(StateURL.parse(state) if state else None))
        caller = callers.get(w)
        # One call first, so that each child's connection is open before the count.
        await caller.complete(ModelRequest(messages=({"role": "user", "content": "warm " + tag},)))
        print("ready", flush=True)
        sys.stdin.readline()
        def ask(i):
            return [{"role": "user", "content": f"{tag} {i}" if mode == "rate" else f"q{i}"}]
        await asyncio.gather(*(caller.complete(ModelRequest(messages=tuple(ask(i))))
                               for i in range(int(n))))
        await callers.aclose()
    asyncio.run(main())
""")


def hammer(fake: FakeLLMServer, state: str, rpm: float, n: int, procs: int = 3) -> float:
    """Start ``procs`` children making ``n`` calls each at once; the rate (requests a
    minute) at which their requests arrived at the fake server."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                fake.openai_base,
                state,
                str(rpm),
                str(n),
                f"p{i}",
                "rate",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(procs)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    fake.reset()  # the warm-up calls are not counted
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        _, err = child.communicate(timeout=scaled(120))
        assert child.returncode == 0, err[-2000:]
    times = sorted(r.received_at for r in fake.requests)
    assert len(times) == procs * n
    return (len(times) - 1) / (times[-1] - times[0]) * 60


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
