"""The fault matrix: every client kind against every fault a provider can serve.

Each client (the native ``openai``, ``anthropic`` and ``google-genai`` SDKs, the lean
aiohttp ``http`` client, and litellm over its OpenAI, Anthropic and Gemini routes) talks
real HTTP to a FakeLLMServer on 127.0.0.1 that serves one fault, either once (then a
good answer) or every time.  Each case checks the requests the server saw, what the call
returned or raised, and what the response cache holds afterwards: a good answer, or
nothing; never an error, an empty reply or a reply cut off at the token limit.  Back-off
waits go through a recorder instead of sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kit.poolkit import no_pause_limiter

from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    BadResponseError,
    ConnectionFailedError,
    ModelCallError,
    RateLimitError,
    RequestTimeoutError,
    ServerError,
)
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.caller import ModelCaller
from conductor.llm.types import Completion, ModelRequest
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault, Reply, ResponderResult

KEY = "sk-fake-matrix-key-0123456789abcdef"
KEY_ENV = "CONDUCTOR_TEST_MATRIX_KEY"
GOOD = "The answer is 42."
RETRIES = 2  # so a persistent retryable fault is tried 3 times
HANG_TIMEOUT_S = 0.4

# litellm-anthropic and litellm-gemini drive litellm's own Anthropic and Gemini code,
# whose failures differ from its OpenAI route's.
CLIENTS = [
    "openai",
    "http",
    "litellm",
    "litellm-anthropic",
    "litellm-gemini",
    "anthropic",
    "google",
]


@dataclass(frozen=True)
class Case:
    """One fault: what the server serves, and the error class a persistent one ends in
    (None: the reply is returned, as a truncated one is)."""

    fault: ResponderResult
    error: type[ModelCallError] | None
    retryable: bool = True
    timeout_s: float = 10.0


FAULTS: dict[str, Case] = {
    "429 retry-after": Case(Fault(429, "slow down", headers={"Retry-After": "7"}), RateLimitError),
    "429": Case(Fault(429, "slow down"), RateLimitError),
    "500": Case(Fault(500, "boom"), ServerError),
    "502": Case(Fault(502, "bad gateway"), ServerError),
    "503": Case(Fault(503, "unavailable"), ServerError),
    "reset": Case(Fault.reset(), ConnectionFailedError),
    "hang": Case(Fault.hang(), RequestTimeoutError, timeout_s=HANG_TIMEOUT_S),
    "malformed json": Case(
        Fault.raw('{"choices": [{"message": {"content": "cut'), BadResponseError
    ),
    "html": Case(
        Fault.raw("<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html"),
        BadResponseError,
    ),
    "html as json": Case(Fault.raw("<html><body>oops</body></html>"), BadResponseError),
    "empty body": Case(Fault.raw(b""), BadResponseError),
    "empty choices": Case(Fault.malformed("empty_choices"), BadResponseError),
    "no choices": Case(Fault.malformed("no_choices"), BadResponseError),
    "null content": Case(Fault.malformed("null_content"), BadResponseError),
    "empty text": Case(Fault.malformed("empty_text"), BadResponseError),
    "string message": Case(Fault.malformed("string_message"), BadResponseError),
    "finish length": Case(Reply("The answer is", finish_reason="length"), None),
    "401": Case(Fault(401, "Incorrect API key provided."), AuthenticationError, retryable=False),
    "400": Case(Fault(400, "bad parameter"), BadRequestError, retryable=False),
}

TRUNCATED = {
    "openai": "length",
    "http": "length",
    "litellm": "length",
    "litellm-anthropic": "length",  # litellm maps Anthropic's max_tokens to length
    "litellm-gemini": "length",
    "anthropic": "max_tokens",
    "google": "MAX_TOKENS",
}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, KEY)
        with FakeLLMServer(expected_api_key=KEY) as srv:
            yield srv


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[ResponseCache]:
    store = ResponseCache(tmp_path / "calls")
    yield store
    store.close()


def make_worker(kind: str, server: FakeLLMServer, model: str, **kw: object) -> Worker:
    base: dict[str, object] = {"id": f"w-{kind}", "api_key_env": KEY_ENV, "max_retries": RETRIES}
    base.update(kw)
    if kind == "litellm":
        return Worker(model=f"openai/{model}", api_base=server.openai_base, **base)  # type: ignore[arg-type]
    if kind == "litellm-anthropic":
        return Worker(model=f"anthropic/{model}", api_base=server.url, **base)  # type: ignore[arg-type]
    if kind == "litellm-gemini":
        return Worker(model=f"gemini/{model}", api_base=server.url, **base)  # type: ignore[arg-type]
    if kind in ("openai", "http"):
        return Worker(model=model, client=kind, api_base=server.openai_base, **base)  # type: ignore[arg-type]
    if kind == "anthropic":
        return Worker(model=model, client="anthropic", api_base=server.anthropic_base, **base)  # type: ignore[arg-type]
    return Worker(model=model, client="google", api_base=server.gemini_base, **base)  # type: ignore[arg-type]


REQUEST = ModelRequest(
    messages=({"role": "user", "content": "What is six times seven?"},),
    params={"temperature": 0.0, "max_tokens": 64},
)


class Waits:
    """Stands in for asyncio.sleep: records the back-off waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def complete(worker: Worker, cache: ResponseCache, waits: Waits) -> Completion:
    caller = ModelCaller(worker, cache=cache, sleep=waits, limiter=no_pause_limiter(worker))
    try:
        return await caller.complete(REQUEST)
    finally:
        await caller.aclose()


def model_name(kind: str, fault: str, mode: str) -> str:
    return f"m-{kind}-{fault}-{mode}".replace(" ", "_")


def assert_cached(cache: ResponseCache, worker: Worker, text: str | None) -> None:
    """The cache holds exactly ``text`` for the request (None: it holds nothing)."""
    hit = cache.get(cache_key(worker, REQUEST))
    assert cache.stats().entries == (0 if text is None else 1)
    assert (hit.text if hit is not None else None) == text


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("kind", CLIENTS)
async def test_transient_fault(
    kind: str, fault: str, server: FakeLLMServer, cache: ResponseCache
) -> None:
    """The fault once, then a good answer."""
    case = FAULTS[fault]
    model = model_name(kind, fault, "once")
    server.script(model, [case.fault, GOOD])
    worker = make_worker(kind, server, model, timeout_s=case.timeout_s)
    waits = Waits()
    if case.error is None:
        # A truncated reply is the answer, marked as such, and not cached: a rerun asks
        # again and caches the complete answer.
        done = await complete(worker, cache, waits)
        assert (done.text, done.truncated, done.attempts) == ("The answer is", True, 1)
        assert done.finish_reason == TRUNCATED[kind]
        assert_cached(cache, worker, None)
        again = await complete(worker, cache, waits)
        assert (again.text, again.truncated, again.cached) == (GOOD, False, False)
        assert len(server.requests_for(model)) == 2
        assert_cached(cache, worker, GOOD)
        return
    if not case.retryable:
        with pytest.raises(case.error) as info:
            await complete(worker, cache, waits)
        assert info.value.target == worker.id
        assert getattr(info.value, "attempts", None) == 1
        assert len(server.requests_for(model)) == 1
        assert waits.waits == []
        assert_cached(cache, worker, None)
        return
    done = await complete(worker, cache, waits)
    assert done.text == GOOD and not done.truncated
    assert done.attempts == 2
    assert len(server.requests_for(model)) == 2
    assert len(waits.waits) == 1
    if fault == "429 retry-after":
        assert waits.waits[0] >= 7.0
    else:
        assert waits.waits[0] < 7.0
    assert_cached(cache, worker, GOOD)
    # The cached answer is replayed with no request.
    replay = await complete(worker, cache, waits)
    assert (replay.text, replay.cached) == (GOOD, True)
    assert len(server.requests_for(model)) == 2


@pytest.mark.parametrize(
    "fault", [pytest.param(f, marks=pytest.mark.long) if f == "hang" else f for f in FAULTS]
)
@pytest.mark.parametrize("kind", CLIENTS)
async def test_persistent_fault(
    kind: str, fault: str, server: FakeLLMServer, cache: ResponseCache
) -> None:
    """The fault every time."""
    case = FAULTS[fault]
    model = model_name(kind, fault, "always")
    server.script(model, [case.fault])
    worker = make_worker(kind, server, model, timeout_s=case.timeout_s)
    waits = Waits()
    if case.error is None:
        for n in (1, 2):
            done = await complete(worker, cache, waits)
            assert done.truncated and not done.cached
            assert len(server.requests_for(model)) == n
        assert_cached(cache, worker, None)
        return
    with pytest.raises(case.error) as info:
        await complete(worker, cache, waits)
    err = info.value
    expected = RETRIES + 1 if case.retryable else 1
    assert getattr(err, "attempts", None) == expected
    assert len(server.requests_for(model)) == expected
    assert len(waits.waits) == expected - 1
    assert err.retryable is case.retryable
    # One sentence naming the worker; never a traceback or the key.
    assert str(err).startswith(f"worker {worker.id!r} failed")
    assert "Traceback" not in str(err) and KEY not in str(err)
    assert err.__context__ is None and err.__cause__ is None
    assert_cached(cache, worker, None)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_total_deadline_bounds_a_silent_server(
    kind: str, server: FakeLLMServer, cache: ResponseCache
) -> None:
    """With many retries allowed, a server that never answers fails the call once the
    total deadline is spent, not after (max_retries + 1) time-outs."""
    model = model_name(kind, "deadline", "always")
    server.script(model, [Fault.hang()])
    worker = make_worker(kind, server, model, timeout_s=0.4, total_timeout_s=0.6, max_retries=6)
    with pytest.raises(RequestTimeoutError, match="total_timeout_s of 0.6 s ran out") as info:
        await complete(worker, cache, Waits())
    sent = len(server.requests_for(model))
    assert 1 <= sent <= 3 and getattr(info.value, "attempts", None) == sent
    assert_cached(cache, worker, None)


@pytest.mark.parametrize("kind", CLIENTS)
async def test_extra_headers_travel_as_headers(
    kind: str, server: FakeLLMServer, cache: ResponseCache
) -> None:
    model = model_name(kind, "headers", "ok")
    server.script(model, [GOOD])
    worker = make_worker(kind, server, model)
    request = ModelRequest(
        messages=REQUEST.messages,
        params={**REQUEST.params, "extra_headers": {"X-Conductor-Trace": "trace-7"}},
    )
    caller = ModelCaller(worker, cache=cache, sleep=Waits())
    try:
        done = await caller.complete(request)
    finally:
        await caller.aclose()
    assert done.text == GOOD
    (sent,) = server.requests_for(model)
    assert sent.headers.get("x-conductor-trace") == "trace-7"
    assert "extra_headers" not in json.dumps(sent.body)
    assert "trace-7" not in json.dumps(sent.body)


LITELLM_DEFAULT_KEY_ROUTES = {
    "litellm": ("openai", "OPENAI_API_KEY"),
    "litellm-anthropic": ("anthropic", "ANTHROPIC_API_KEY"),
}


@pytest.mark.parametrize("kind", list(LITELLM_DEFAULT_KEY_ROUTES))
async def test_litellm_default_key_is_masked_when_echoed(
    kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A litellm worker with no api_key_env: litellm reads the provider's variable
    itself; a provider that echoes the key (in an error, or in a reply) must not get it
    into the error, the completion or the cache."""
    _provider, env = LITELLM_DEFAULT_KEY_ROUTES[kind]
    secret = "sk-default-variable-key-9876543210"
    monkeypatch.setenv(env, secret)
    with FakeLLMServer(expected_api_key=secret) as srv:
        worker = make_worker(kind, srv, "m-echo", api_key_env=None, max_retries=0)
        srv.script("m-echo", [Fault(401, f"Incorrect API key provided: {secret}.")])
        store = ResponseCache(tmp_path / "calls")
        try:
            with pytest.raises(AuthenticationError) as info:
                await complete(worker, store, Waits())
            assert secret not in str(info.value)
            assert secret not in info.value.provider_message
            assert "Incorrect API key provided" in info.value.provider_message
            srv.script("m-echo", [Reply(f"Your key is {secret}, keep it safe.")])
            done = await complete(worker, store, Waits())
            assert done.text == "Your key is ***, keep it safe."
            assert secret not in json.dumps(done.raw)
            hit = store.get(cache_key(worker, REQUEST))
            assert hit is not None and secret not in json.dumps([hit.text, hit.raw])
        finally:
            store.close()


@pytest.mark.process  # the math grader's comparison children
async def test_bench_records_and_reports_truncated_calls(tmp_path: Path) -> None:
    """Through a bench: a truncated reply is the sample's answer, marked on its call in
    the record and counted by the report; a bad body retried then answered loses no
    sample; neither the truncated nor the bad reply is in the cache."""
    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.grading import get_grader
    from conductor.llm.caller import CallerSet
    from conductor.pool import Pool, pool_to_public_dict
    from conductor.runs.summary import summarize_run
    from conductor.strategies import answer_key_for, parse_strategy

    data = tmp_path / "math.jsonl"
    with data.open("w") as fh:
        for i in range(4):
            item = {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"t/{i}"}
            fh.write(json.dumps(item) + "\n")

    def answer(request: object) -> ResponderResult:
        text = request.last_user_message  # type: ignore[attr-defined]
        n = next(i for i in range(4) if f"What is {i} + 0?" in text)
        if n == 1:
            return Reply("Let me think about \\boxed", finish_reason="length")
        return f"\\boxed{{{n}}}"

    with FakeLLMServer() as srv:
        srv.script("w0", answer)
        srv.script("w1", [Fault.malformed("empty_choices"), "\\boxed{3}"])
        pool = Pool(
            name="fake",
            workers=(
                Worker(id="w0", model="w0", client="http", api_base=srv.openai_base),
                Worker(id="w1", model="w1", client="http", api_base=srv.openai_base),
            ),
        )
        store = ResponseCache(tmp_path / "calls")
        callers = CallerSet(store, sleep=Waits())
        try:
            spec = load_benchmark("math500")
            strat = parse_strategy("single:w0", pool, callers, vote_key=answer_key_for("math"))
            out = tmp_path / "run"
            options = BenchOptions(out_dir=out, data_file=data)
            await run_benchmark(
                spec, strat, get_grader(spec.grader), pool_to_public_dict(pool), options
            )
            records = [
                json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()
            ]
            assert len(records) == 4
            calls = {r["sample_id"]: r["rounds"][0]["steps"][0]["call"] for r in records}
            truncated = [sid for sid, call in calls.items() if call["truncated"]]
            assert truncated == ["math500/t/1"]
            assert calls["math500/t/1"]["finish_reason"] == "length"
            assert calls["math500/t/0"]["finish_reason"] == "stop"
            summary = summarize_run(out)
            assert summary.truncated_calls == 1 and summary.n_records == 4
            # Three complete answers are cached; the truncated one is not.
            assert store.stats().entries == 3

            # A bad body once, then the answer: retried within the call, one record.
            strat1 = parse_strategy("single:w1", pool, callers, vote_key=answer_key_for("math"))
            out1 = tmp_path / "run1"
            options1 = BenchOptions(out_dir=out1, data_file=data, limit=1)
            await run_benchmark(
                spec, strat1, get_grader(spec.grader), pool_to_public_dict(pool), options1
            )
            (rec,) = [
                json.loads(line) for line in (out1 / "samples.jsonl").read_text().splitlines()
            ]
            call = rec["rounds"][0]["steps"][0]["call"]
            assert call["attempts"] == 2 and call["response"] == "\\boxed{3}"
            assert len(srv.requests_for("w1")) == 2
        finally:
            await callers.aclose()
            store.close()


@pytest.mark.process  # the math grader's comparison children
async def test_bench_sample_cache_never_replays_a_truncated_answer(tmp_path: Path) -> None:
    """An identical rerun replays whole samples from the cache, except the one whose
    answer came from a cut-off reply: that one asks the model again."""
    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.grading import get_grader
    from conductor.llm.caller import CallerSet
    from conductor.pool import Pool, pool_to_public_dict
    from conductor.strategies import answer_key_for, parse_strategy

    data = tmp_path / "math.jsonl"
    with data.open("w") as fh:
        for i in range(3):
            item = {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"t/{i}"}
            fh.write(json.dumps(item) + "\n")

    def answer(request: object) -> ResponderResult:
        text = request.last_user_message  # type: ignore[attr-defined]
        n = next(i for i in range(3) if f"What is {i} + 0?" in text)
        if n == 1:
            return Reply("\\boxed{1", finish_reason="length")
        return f"\\boxed{{{n}}}"

    with FakeLLMServer() as srv:
        srv.script("w0", answer)
        pool = Pool(
            name="fake",
            workers=(Worker(id="w0", model="w0", client="http", api_base=srv.openai_base),),
        )
        store = ResponseCache(tmp_path / "calls")
        spec = load_benchmark("math500")
        for run in ("first", "again"):
            callers = CallerSet(store, sleep=Waits())
            try:
                strat = parse_strategy("single:w0", pool, callers, vote_key=answer_key_for("math"))
                options = BenchOptions(out_dir=tmp_path / run, data_file=data)
                await run_benchmark(
                    spec,
                    strat,
                    get_grader(spec.grader),
                    pool_to_public_dict(pool),
                    options,
                    cache=store,
                )
            finally:
                await callers.aclose()
        asked = [r.last_user_message for r in srv.requests_for("w0")]
        # Three on the first run; on the rerun only the truncated sample is asked again.
        assert len(asked) == 4
        assert "What is 1 + 0?" in asked[-1]
        again = [json.loads(line) for line in (tmp_path / "again" / "samples.jsonl").open()]
        replayed = sorted(r["sample_id"] for r in again if r.get("replayed_from"))
        assert replayed == ["math500/t/0", "math500/t/2"]
