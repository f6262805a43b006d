"""Adaptive concurrency per provider key: shrink on 429, grow back, honour reset times.

Client behaviour is tested over real HTTP against FakeLLMServer; the limiter's own
bookkeeping (cancellation, history cap) and the header parsers directly.  Timing
assertions are lower bounds set by the server's requested waits, or orders.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, write_pool
from kit.poolkit import worker as pool_worker

from conductor.errors import RateLimitError
from conductor.llm.caller import CallerSet, ModelCaller
from conductor.llm.failures import error_for_status, parse_duration_s, reset_wait_s
from conductor.llm.limiter import (
    AdaptiveLimiter,
    provider_key,
    sample_capacity,
)
from conductor.llm.types import ModelRequest
from conductor.render.report import rate_limit_table
from conductor.runs.summary import summarize_run
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply


def req(text: str) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},))


async def no_sleep(_: float) -> None:
    return None


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (for at most 10 s, so a broken limiter fails, not hangs)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


def openai_worker(server: FakeLLMServer, wid: str, **kw: Any) -> Worker:
    kw.setdefault("max_retries", 30)
    return Worker(id=wid, model=wid, client="openai", api_base=server.openai_base, **kw)


class Capacity:
    """A server-side responder that serves ``k`` requests at once and answers 429 above.

    Runs on the server's event loop.  A refusal also takes a moment (``refuse_s``), as
    a provider's does; ``arrivals`` records how many requests, served or being refused,
    were at the server when each one arrived (itself included).
    """

    def __init__(self, k: int, latency_s: float = 0.05, refuse_s: float = 0.01) -> None:
        self.k = k
        self.latency_s = latency_s
        self.refuse_s = refuse_s
        self.serving = 0
        self.present = 0
        self.arrivals: list[int] = []
        self.refused = 0
        self.served = 0

    async def __call__(self, request: FakeRequest) -> Reply | Fault:
        self.present += 1
        self.arrivals.append(self.present)
        try:
            if self.serving >= self.k:
                self.refused += 1
                await asyncio.sleep(self.refuse_s)
                return Fault(429, "Rate limit reached for requests", latency_s=0)
            self.serving += 1
            try:
                await asyncio.sleep(self.latency_s)
            finally:
                self.serving -= 1
            self.served += 1
            return Reply("ok", latency_s=0)
        finally:
            self.present -= 1


# --------------------------------------------------------------------------- identity


def test_provider_key_identity_holds_names_not_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEY_ONE", "sk-secret-value-1234")
    base = "http://127.0.0.1:9/v1"
    a = Worker(id="a", model="m1", client="openai", api_base=base, api_key_env="KEY_ONE")
    b = Worker(id="b", model="m2", client="http", api_base=base + "/", api_key_env="KEY_ONE")
    c = Worker(id="c", model="m1", client="openai", api_base=base, api_key_env="KEY_TWO")
    key_a = provider_key(a)
    assert key_a is not None and key_a == provider_key(b)  # same server, same key
    assert provider_key(c) != key_a  # another key is another quota
    assert "KEY_ONE" in key_a and "sk-secret" not in key_a
    # Without api_base: the openai and http clients both default to OpenAI's API.
    assert provider_key(Worker(id="x", model="gpt", client="openai")) == provider_key(
        Worker(id="y", model="gpt-4o", client="http")
    )
    assert provider_key(Worker(id="x", model="claude", client="anthropic")) != provider_key(
        Worker(id="y", model="gpt", client="openai")
    )
    assert provider_key(Worker(id="x", model="anthropic/claude")) != provider_key(
        Worker(id="y", model="openai/gpt")
    )
    assert provider_key(Worker(id="l", model="m", client="local")) is None


# --------------------------------------------------------------------------- headers


def test_parse_duration_openai_style() -> None:
    assert parse_duration_s("1s") == 1.0
    assert parse_duration_s("6m0s") == 360.0
    assert parse_duration_s("20ms") == pytest.approx(0.02)
    assert parse_duration_s("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration_s("2.5") == 2.5
    for bad in ("", "soon", "1x", "s1", "1s garbage"):
        assert parse_duration_s(bad) is None, bad


def test_reset_wait_reads_the_exhausted_limit_only() -> None:
    openai = {
        "X-RateLimit-Remaining-Requests": "0",
        "X-RateLimit-Reset-Requests": "1s",
        "X-RateLimit-Remaining-Tokens": "5000",
        "X-RateLimit-Reset-Tokens": "6m0s",
    }
    assert reset_wait_s(openai) == 1.0  # tokens were left: their reset does not apply
    both = {**openai, "X-RateLimit-Remaining-Tokens": "0"}
    assert reset_wait_s(both) == 360.0
    # Without "remaining" headers every reset given counts.
    assert reset_wait_s({"x-ratelimit-reset-tokens": "250ms"}) == pytest.approx(0.25)
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    anthropic = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-01-01T12:00:03Z",
        "anthropic-ratelimit-tokens-remaining": "9000",
        "anthropic-ratelimit-tokens-reset": "2026-01-01T12:01:00Z",
    }
    assert reset_wait_s(anthropic, now=now.timestamp()) == pytest.approx(3.0)
    assert reset_wait_s({"retry-after": "3"}) is None  # Retry-After is parse_retry_after's
    assert reset_wait_s(None) is None


def test_rate_limit_error_carries_the_reset_wait() -> None:
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"}
    err = error_for_status(429, "slow down", target="w", headers=headers)
    assert isinstance(err, RateLimitError) and err.retry_after_s == pytest.approx(1.5)
    # Retry-After wins over reset headers.
    err = error_for_status(429, "slow down", target="w", headers={**headers, "Retry-After": "4"})
    assert err.retry_after_s == 4.0
    # A server error's reset headers are not a rate limit's.
    assert error_for_status(503, "busy", target="w", headers=headers).retry_after_s is None


# --------------------------------------------------------------------------- over HTTP


@pytest.mark.long
async def test_concurrency_shrinks_under_429s(fake_server: FakeLLMServer) -> None:
    cap = Capacity(k=3)
    fake_server.script("m", cap)
    callers = CallerSet(None, sleep=no_sleep)
    caller = callers.get(openai_worker(fake_server, "m", max_concurrency=16))
    try:
        results = await asyncio.gather(*(caller.complete(req(f"q{i}")) for i in range(60)))
    finally:
        await callers.aclose()
    assert [r.text for r in results] == ["ok"] * 60 and cap.served == 60
    limiter = caller.gate.shared
    assert limiter is not None
    assert limiter.rate_limits == cap.refused > 0
    assert limiter.min_limit <= cap.k < limiter.ceiling == 16
    # The first wave hit the server with far more than it serves; once the limit had
    # adapted, attempts in flight stayed within one of the server's capacity.
    assert max(cap.arrivals[:16]) > cap.k + 1
    settled = cap.arrivals[len(cap.arrivals) // 2 :]
    assert max(settled) <= cap.k + 1
    reasons = [e.reason for e in limiter.events]
    assert reasons[0] == "start" and "rate limited" in reasons


async def test_limit_grows_back_after_successes(fake_server: FakeLLMServer) -> None:
    calls = {"n": 0}
    active = {"now": 0, "max": 0}

    async def respond(_: FakeRequest) -> Reply | Fault:
        calls["n"] += 1
        if calls["n"] <= 3:
            return Fault(429, "Rate limit reached", latency_s=0)
        active["now"] += 1
        active["max"] = max(active["max"], active["now"])
        try:
            await asyncio.sleep(0.05)
        finally:
            active["now"] -= 1
        return Reply("ok", latency_s=0)

    fake_server.script("m", respond)
    callers = CallerSet(None, sleep=no_sleep)
    caller = callers.get(openai_worker(fake_server, "m", max_concurrency=4))
    limiter = caller.gate.shared
    assert limiter is not None and limiter.limit == 4
    try:
        first = await caller.complete(req("first"))  # three 429s, then an answer
        # 4 -> 2 -> 1 (a third 429 cannot cut further), and the first success at a
        # limit of one adds one back.
        assert first.attempts == 4 and limiter.limit == 2
        # Concurrent calls reach the server two at a time, below the worker's cap of 4.
        await asyncio.gather(*(caller.complete(req(f"two{i}")) for i in range(3)))
        assert active["max"] == 2
        for i in range(6):
            await caller.complete(req(f"seq{i}"))
        assert limiter.limit == 4  # back to the ceiling
        active["max"] = 0
        await asyncio.gather(*(caller.complete(req(f"wide{i}")) for i in range(8)))
        assert active["max"] == 4
    finally:
        await callers.aclose()
    assert [(e.limit, e.reason) for e in limiter.events] == [
        (4, "start"),
        (2, "rate limited"),
        (1, "rate limited"),
        (2, "recovered"),
        (3, "recovered"),
        (4, "recovered"),
    ]


@pytest.mark.long
async def test_retry_after_pauses_the_shared_key_only(fake_server: FakeLLMServer) -> None:
    fake_server.script("a", [Fault(429, "wait", headers={"Retry-After": "2"}), "a-ok"])
    a = openai_worker(fake_server, "a", api_key_env="KEY_ONE")
    b = openai_worker(fake_server, "b", api_key_env="KEY_ONE")
    c = openai_worker(fake_server, "c", api_key_env="KEY_TWO")
    callers = CallerSet(None, sleep=no_sleep)
    try:
        shared = callers.get(a).gate.shared
        assert shared is not None and callers.get(b).gate.shared is shared
        assert callers.get(c).gate.shared is not shared
        task_a = asyncio.create_task(callers.get(a).complete(req("a")))
        await wait_until(lambda: shared.rate_limits > 0, "a was rate limited")
        assert shared.paused
        done_b, done_c = await asyncio.gather(
            callers.get(b).complete(req("b")), callers.get(c).complete(req("c"))
        )
        done_a = await task_a
    finally:
        await callers.aclose()
    assert (done_a.text, done_a.attempts, done_b.text) == ("a-ok", 2, "Echo: b")
    a1, a2 = fake_server.requests_for("a")
    (b1,) = fake_server.requests_for("b")
    (c1,) = fake_server.requests_for("c")
    # b shares a's key: it waited out the Retry-After, as a's own retry did.
    assert b1.received_at - a1.received_at >= 1.5
    assert a2.received_at - a1.received_at >= 1.5
    # c has another key: it went at once, before a's retry.
    assert c1.received_at < a2.received_at and done_c.text == "Echo: c"
    assert any(e.reason.startswith("rate limited, paused") for e in shared.events)


@pytest.mark.long
async def test_openai_reset_headers_delay_the_next_call(fake_server: FakeLLMServer) -> None:
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "90000",
        "x-ratelimit-reset-tokens": "6m0s",  # not exhausted: must not stall the run
    }
    fake_server.script("m", [Fault(429, "Rate limit reached", headers=headers), "fine"])
    callers = CallerSet(None, sleep=no_sleep)
    caller = callers.get(openai_worker(fake_server, "m"))
    try:
        done = await caller.complete(req("x"))
    finally:
        await callers.aclose()
    first, second = fake_server.requests_for("m")
    assert done.text == "fine" and done.attempts == 2
    assert second.received_at - first.received_at >= 0.8
    limiter = caller.gate.shared
    assert limiter is not None and 0.9 <= limiter.paused_s <= 1.1


@pytest.mark.long
async def test_anthropic_reset_time_delays_the_next_call(fake_server: FakeLLMServer) -> None:
    def respond(_: FakeRequest) -> str | Fault:
        if len(fake_server.requests_for("claude-x")) > 1:
            return "hi"
        reset = datetime.now(timezone.utc) + timedelta(seconds=1.5)
        headers = {
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": reset.isoformat().replace("+00:00", "Z"),
        }
        return Fault(429, "Number of requests", headers=headers)

    fake_server.script("claude-x", respond)
    target = Worker(
        id="claude",
        model="claude-x",
        client="anthropic",
        api_base=fake_server.anthropic_base,
        max_retries=3,
    )
    callers = CallerSet(None, sleep=no_sleep)
    try:
        done = await callers.get(target).complete(req("x"))
    finally:
        await callers.aclose()
    first, second = fake_server.requests_for("claude-x")
    assert done.text == "hi" and done.attempts == 2
    assert second.received_at - first.received_at >= 1.0


async def test_targets_sharing_a_key_share_one_limit(fake_server: FakeLLMServer) -> None:
    fake_server.script("a", [Fault(429, "slow")] * 2 + ["a-ok"])
    active: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def slow(request: FakeRequest) -> str:
        active[request.model] = active.get(request.model, 0) + 1
        peak[request.model] = max(peak.get(request.model, 0), active[request.model])
        try:
            await asyncio.sleep(0.15)
        finally:
            active[request.model] -= 1
        return "ok"

    fake_server.script("b", slow)
    fake_server.script("c", slow)
    a = openai_worker(fake_server, "a", max_concurrency=8, api_key_env="KEY_ONE")
    b = openai_worker(fake_server, "b", max_concurrency=8, api_key_env="KEY_ONE")
    c = openai_worker(fake_server, "c", max_concurrency=8, api_key_env="KEY_TWO")
    callers = CallerSet(None, sleep=no_sleep)
    try:
        shared = callers.get(a).gate.shared
        callers.get(b)
        assert shared is not None and (shared.ceiling, shared.limit) == (16, 16)
        await callers.get(a).complete(req("a"))  # two 429s: 16 -> 8 -> 4
        assert shared.limit == 4
        await asyncio.gather(
            *(callers.get(b).complete(req(f"b{i}")) for i in range(16)),
            *(callers.get(c).complete(req(f"c{i}")) for i in range(16)),
        )
    finally:
        await callers.aclose()
    # a's rate limits bound b below its own cap of 8 (the shared limit, 4, grows by one
    # after four successes); c has another key, where only its own cap applies.
    assert 4 <= peak["b"] < 8 and peak["c"] == 8
    assert shared.min_limit == 4
    history = callers.limits.history()
    assert set(history) == {provider_key(a), provider_key(c)}
    assert history[provider_key(a)]["targets"] == ["a", "b"]
    assert history[provider_key(c)]["rate_limits"] == 0


async def test_a_call_sleeping_before_its_retry_holds_no_slot(fake_server: FakeLLMServer) -> None:
    seen: list[str] = []

    def respond(request: FakeRequest) -> str | Fault:
        text = request.last_user_message
        seen.append(text)
        return Fault(503, "busy") if seen.count(text) == 1 and text == "x" else f"{text}-ok"

    fake_server.script("m", respond)
    waking = asyncio.Event()

    async def held_sleep(_: float) -> None:
        await waking.wait()

    caller = ModelCaller(openai_worker(fake_server, "m", max_concurrency=1), sleep=held_sleep)
    try:
        first = asyncio.create_task(caller.complete(req("x")))
        await wait_until(lambda: bool(seen), "x reached the server")
        # With the slot held across the back-off this would wait forever.
        second = await asyncio.wait_for(caller.complete(req("y")), 10)
        waking.set()
        done = await first
    finally:
        await caller.aclose()
    assert (second.text, done.text, done.attempts) == ("y-ok", "x-ok", 2)
    assert seen == ["x", "y", "x"]


# --------------------------------------------------------------------------- bookkeeping


async def test_cancelled_waiter_leaks_no_slot() -> None:
    limiter = AdaptiveLimiter("k", 1)
    held = await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    limiter.release(held, ok=True)
    assert limiter.in_flight == 0
    await asyncio.wait_for(limiter.acquire(), 1)
    assert limiter.in_flight == 1


async def test_one_cut_per_generation_and_capped_history() -> None:
    limiter = AdaptiveLimiter("k", 16, history_size=3)
    slots = [await limiter.acquire() for _ in range(16)]
    for g in slots:  # sixteen 429s from calls sent under one limit: one cut
        limiter.release(g, ok=False, rate_limited=True)
    assert limiter.limit == 8 and limiter.rate_limits == 16
    for _ in range(4):  # 8 -> 4 -> 2 -> 1, and never below one
        g = await limiter.acquire()
        limiter.release(g, ok=False, rate_limited=True)
    assert limiter.limit == 1 and limiter.min_limit == 1
    assert len(limiter.events) == 3 and limiter.events_dropped == 2
    assert [e.limit for e in limiter.events] == [4, 2, 1]
    assert limiter.to_dict()["events"][-1][1:] == [1, "rate limited"]


def test_start_limit_caps_the_start_and_ceiling_is_the_sum() -> None:
    callers = CallerSet(None, start_limit=5)
    one = Worker(id="a", model="m", client="openai", api_base="http://h/v1", max_concurrency=4)
    two = Worker(id="b", model="n", client="openai", api_base="http://h/v1", max_concurrency=8)
    shared = callers.get(one).gate.shared
    callers.get(two)
    assert shared is not None and (shared.ceiling, shared.limit) == (12, 5)


# --------------------------------------------------------------------------- warning


def test_sample_capacity_sums_what_each_model_serves() -> None:
    cond = Worker(id="conductor", model="c", client="openai", max_concurrency=4)
    w = Worker(id="w", model="m", client="openai", max_concurrency=16)
    cap = sample_capacity([(cond, 1), (w, 1)])
    assert cap.samples == 20
    assert [(s.ids, s.samples) for s in cap.shares] == [(("conductor",), 4), (("w",), 16)]
    # vote:5:w makes five calls per sample at once: 16 // 5 samples.
    vote = sample_capacity([(w, 5)])
    assert vote.samples == 3 and vote.shares[0].per_sample == 5
    # Targets on one in-process model share it, one call at a time, whatever they set.
    local = [Worker(id=i, model="smollm2", client="local", max_concurrency=8) for i in "abc"]
    one = sample_capacity([(t, 1) for t in local])
    assert one.samples == 1 and one.shares[0].ids == ("a", "b", "c")
    other = Worker(id="d", model="other", client="local", model_path="/m/other.gguf")
    assert sample_capacity([(local[0], 1), (other, 1)]).samples == 2


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CONDUCTOR_CACHE_DIR": str(cache)})


@pytest.mark.process
def test_bench_warns_once_and_records_the_limit_history(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["Solve the problem."], [[]])])
    seen = {"n": 0}

    def w0(_: FakeRequest) -> Reply | Fault:
        seen["n"] += 1
        if seen["n"] <= 2:
            return Fault(429, "Rate limit reached", headers={"Retry-After": "0.3"})
        return Reply("\\boxed{1}")

    fake_server.script("w0", w0)
    data = tmp_path / "math.jsonl"
    rows = [
        {"problem": f"Q{i}", "answer": "1", "subject": "Algebra", "level": 1, "unique_id": f"t/{i}"}
        for i in range(4)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = pool_dict(fake_server, [pool_worker(fake_server, "w0", max_retries=4)])
    pool["conductor"]["max_concurrency"] = 2
    pool_file = write_pool(tmp_path / "pool.yaml", pool)
    out = tmp_path / "run"
    res = _cli(
        "bench", "math500", "--pool", str(pool_file), "--data", str(data), "--out", str(out),
        "--concurrency", "24", "--no-cache", cache=tmp_path / "c",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    said = " ".join(res.stderr.split())
    assert said.count("--concurrency 24 is more than") == 1
    assert (
        "--concurrency 24 is more than the models of pool 'fake' can serve: at most 18 "
        "samples can be calling a model at once (the Conductor 2, worker 'w0' 16), so 6 "
        f"samples would only wait; give --concurrency 18 or less, or raise max_concurrency "
        f"in {pool_file}"
    ) in said
    summary = json.loads((out / "summary.json").read_text())
    (invocation,) = summary["rate_limits"]
    (key,) = [k for k, p in invocation["providers"].items() if p["rate_limits"]]
    entry = invocation["providers"][key]
    assert fake_server.openai_base in key
    assert entry["targets"] == ["conductor", "w0"]
    assert entry["rate_limits"] == 2 and entry["paused_s"] > 0
    # The limit starts at the first target's cap (the Conductor's 2) and rises as w0 joins.
    assert entry["events"][0][1:] == [2, "start"] and entry["ceiling"] == 2 + 16
    assert any(e[2].startswith("rate limited") for e in entry["events"])
    table = rate_limit_table(summarize_run(out))
    assert table is not None
    report = _cli("report", str(out), cache=tmp_path / "c")
    assert report.returncode == 0 and "Rate limits" in report.stdout
    # Without oversubscription nothing is said.
    res = _cli(
        "bench", "math500", "--pool", str(pool_file), "--data", str(data), "--limit", "1",
        "--out", str(tmp_path / "run2"), "--concurrency", "2", cache=tmp_path / "c",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "exceeds" not in res.stderr


def test_no_shipped_pool_warns_at_the_default_concurrency() -> None:
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.pool import load_pool
    from conductor.shipped import shipped
    from conductor.strategies import (
        ConductorStrategy,
        concurrency_warning,
        default_concurrency,
        parse_strategy,
    )

    checked = []
    for path in shipped("pool"):
        pool = load_pool(path)
        callers = CallerSet(None)
        strategies: list[Any] = [
            ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), callers)
        ]
        first = pool.workers[0].id
        for name in ("moa", f"single:{first}", f"vote:5:{first}", f"reflect:2:{first}"):
            strategies.append(parse_strategy(name, pool, callers, vote_key=lambda t: t))
        for strategy in strategies:
            n = default_concurrency(strategy)
            assert 1 <= n <= 16
            assert concurrency_warning(strategy, n) is None, (path.name, strategy.name)
            checked.append((pool.name, strategy.name, n))
    by_pool = {(p, s): n for p, s, n in checked}
    # One in-process model serves one sample at a time; Ollama's workers (2 each) and
    # the Conductor serve 10 at once; hosted models up to the cap of 16.
    assert by_pool[("local", "conductor")] == 1
    assert by_pool[("open", "conductor")] == 10
    assert by_pool[("frontier", "conductor")] == 16
    assert by_pool[("frontier", "vote:5:gpt-5")] == 3


def test_the_warning_names_the_users_file_or_a_copy_of_the_shipped_one(tmp_path: Path) -> None:
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.pool import load_pool, resolve_pool_path
    from conductor.strategies import ConductorStrategy, concurrency_warning

    def warning(pool_path: Path, concurrency: int) -> str | None:
        pool = load_pool(pool_path)
        strategy = ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))
        return concurrency_warning(strategy, concurrency)

    local = warning(resolve_pool_path("local"), 4)
    assert local == (
        "--concurrency 4 is more than the models of pool 'local' can serve: at most 1 "
        "sample can be calling a model at once (the in-process model 'smollm2' of workers "
        "'answerer', 'solver' and 'checker' and the Conductor takes one call at a time), "
        "so 3 samples would only wait; give --concurrency 1"
    )
    shipped_open = warning(resolve_pool_path("open"), 12)
    assert shipped_open is not None and "so 2 samples would only wait" in shipped_open
    assert "raise max_concurrency in a copy of the shipped pool 'open' given with --pool" in (
        shipped_open
    )
    assert str(resolve_pool_path("open")) not in shipped_open
    mine = tmp_path / "mine.yaml"
    mine.write_text(resolve_pool_path("open").read_text())
    text = warning(mine, 12)
    assert text is not None and text.endswith(f"or raise max_concurrency in {mine}")
    assert warning(mine, 10) is None


def _three_sample_bench(
    tmp_path: Path, fake_server: FakeLLMServer, *, worker_cap: int, conductor_cap: int
) -> tuple[list[str], dict[str, Any], Path]:
    """A bench of three math questions on one worker ``w0`` that always answers right:
    the command line (to add ``--out`` and options to), the pool and its file (written
    with those caps; a test may change the pool and write it again)."""
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["Solve the problem."], [[]])])
    fake_server.script("w0", "\\boxed{1}")
    data = tmp_path / "math.jsonl"
    rows = [{"problem": f"Q{i}", "answer": "1", "unique_id": f"t/{i}"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = pool_dict(fake_server, [pool_worker(fake_server, "w0", max_concurrency=worker_cap)])
    pool["conductor"]["max_concurrency"] = conductor_cap
    pool_file = write_pool(tmp_path / "pool.yaml", pool)
    base = ["bench", "math500", "--pool", str(pool_file), "--data", str(data), "--no-cache"]
    return base, pool, pool_file


@pytest.mark.process
def test_bench_follows_the_pool_without_concurrency_and_warns_only_when_given(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    base, _pool, _pool_file = _three_sample_bench(
        tmp_path, fake_server, worker_cap=2, conductor_cap=1
    )
    res = _cli(*base, "--out", str(tmp_path / "a"), cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["settings"]["concurrency"] == 3  # the Conductor's 1 and w0's 2
    assert config["invocation"]["concurrency"] is None  # a resume follows the pool again
    res = _cli(*base, "--out", str(tmp_path / "b"), "--concurrency", "4", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert "at most 3 samples can be calling a model at once" in " ".join(res.stderr.split())
    assert "so 1 sample would only wait" in " ".join(res.stderr.split())


def _strategy(pool_text: str, path: Path) -> Any:
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.pool import load_pool
    from conductor.strategies import ConductorStrategy

    path.write_text(pool_text)
    pool = load_pool(path)
    return ConductorStrategy(pool, resolve_conductor(pool), RunSettings(), CallerSet(None))


def test_a_concurrency_above_one_models_cap_is_told_naming_it(tmp_path: Path) -> None:
    from conductor.strategies import capped_warning, concurrency_warning

    pool = tmp_path / "pool.yaml"
    strategy = _strategy(
        "workers:\n"
        "  - {id: w0, model: w0, client: openai, api_base: http://a/v1, max_concurrency: 1000}\n"
        "  - {id: w1, model: w1, client: openai, api_base: http://b/v1, max_concurrency: 100}\n"
        "conductor: {backend: endpoint, api_base: http://c/v1, max_concurrency: 64}\n",
        pool,
    )
    # Within what every model serves alone: nothing to say.
    assert capped_warning(strategy, 64) is None
    # Above the Conductor's 64 (but within the 1,164 they serve together).
    assert concurrency_warning(strategy, 80) is None
    assert capped_warning(strategy, 80) == (
        "--concurrency 80 is more than the Conductor of pool 'pool' can serve at once (the "
        "Conductor 64): the samples beyond that wait for it in turn; to serve more at once, "
        "raise max_concurrency (a worker's own, the conductor: section's, or defaults: for "
        f"every model) in {pool}"
    )
    both = capped_warning(strategy, 256)
    assert both is not None and both.startswith(
        "--concurrency 256 is more than worker 'w1' and the Conductor of pool 'pool' can each "
        "serve at once (the Conductor 64, worker 'w1' 100)"
    )


def test_pool_defaults_lift_the_conductors_cap(tmp_path: Path) -> None:
    from conductor.strategies import capped_warning

    strategy = _strategy(
        "defaults: {max_concurrency: 256}\n"
        "workers:\n  - {id: w0, model: w0, client: openai, api_base: http://a/v1}\n"
        "conductor: {backend: endpoint, api_base: http://c/v1}\n",
        tmp_path / "pool.yaml",
    )
    assert capped_warning(strategy, 256) is None
    assert capped_warning(strategy, 257) is not None


@pytest.mark.process
def test_bench_says_once_that_the_conductor_caps_the_concurrency(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    base, pool, pool_file = _three_sample_bench(
        tmp_path, fake_server, worker_cap=8, conductor_cap=2
    )
    res = _cli(*base, "--out", str(tmp_path / "a"), "--concurrency", "4", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    said = " ".join(res.stderr.split())
    assert said.count("warning:") == 1, res.stderr
    assert "--concurrency 4 is more than the Conductor of pool 'fake' can serve at once" in said
    # The pool's defaults reach the Conductor: with them nothing is capped, nothing said.
    pool["defaults"]["max_concurrency"] = 8
    del pool["conductor"]["max_concurrency"]
    write_pool(pool_file, pool)
    res = _cli(*base, "--out", str(tmp_path / "b"), "--concurrency", "4", cache=tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["pool"]["conductor"]["max_concurrency"] == 8
