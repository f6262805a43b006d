"""`conductor serve` replicas that agree: stored responses and keys' budgets in this
process or on a real redis-server (started here), through the real openai SDK against
servers on the fake provider.

- a key's budget is held for each request's first plan before its first call (and for
  each later plan before it runs: tests/test_serve_plan_hold.py), so 200 requests at
  once never spend past it; with the holds taken out they do;
- a state server that is down refuses the requests of budgeted keys (503), and stored
  responses cannot be read (503, not "not found");
- two `conductor serve --state` processes on one redis-server: a conversation goes on
  from either, one budget holds across both, and one killed leaves the other answering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import pool_dict, worker, write_pool
from kit.redisserver import RedisServer
from kit.servekit import ServeProcess, make_pool, responses_at_once, served, wait_for

from conductor.pool import Pool, load_pool
from conductor.serve import ApiKey
from conductor.state import state_url_from
from conductor.testing import FakeLLMServer, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.process  # a redis-server, or serve processes

#: Each call answers 256 tokens at $1000 per million output tokens: $0.256, exactly
#: the worst case a request of one call reserves (the pool's max_tokens is 256 and
#: input is free), so how many fit under a budget is exact.
PRICE = {"input_per_mtok": 0.0, "output_per_mtok": 1000.0}
CALL_USD = 0.256
BUDGET_USD = 5.0  # 19 calls fit ($4.864); a 20th would pass it


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def priced_pool_file(tmp_path: Path, server: FakeLLMServer) -> Path:
    return write_pool(
        tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0", price=PRICE)])
    )


def priced_pool(tmp_path: Path, server: FakeLLMServer) -> Pool:
    return load_pool(priced_pool_file(tmp_path, server))


def sdk(url: str, token: str) -> Any:
    return openai.OpenAI(base_url=url, api_key=token, max_retries=0)


def _flood(
    tmp_path: Path, fake_server: FakeLLMServer, store: str, redis_server: RedisServer | None
) -> tuple[list[Any], float]:
    """200 requests at once under a $5 budget; the results and what the provider was
    asked for (calls times their price)."""
    fake_server.script("w0", Reply("ok", latency_s=0.2, input_tokens=10, output_tokens=256))
    key = ApiKey("team", "team-token", max_usd=BUDGET_USD)
    state = state_url_from(redis_server.url) if redis_server is not None else None
    with served(
        priced_pool(tmp_path, fake_server),
        keys=(key,),
        state=state,
        new_budgets=state is not None,
        max_concurrency=256,
        max_queue=256,
        max_calls_per_request=1,
    ) as url:
        results = responses_at_once(url, "team-token", "single:w0", 200)
    return results, len(fake_server.requests_for("w0")) * CALL_USD


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_200_requests_at_once_never_spend_past_the_key_s_budget(
    tmp_path: Path, fake_server: FakeLLMServer, store: str
) -> None:
    if store == "redis":
        with RedisServer() as redis_server:
            results, charged = _flood(tmp_path, fake_server, store, redis_server)
    else:
        results, charged = _flood(tmp_path, fake_server, store, None)
    answered = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(answered) + len(refused) == 200
    assert charged <= BUDGET_USD  # $0 overshoot
    assert len(answered) == 19 == int(BUDGET_USD // CALL_USD)  # and none refused needlessly
    assert {r.status_code for r in refused} == {429}
    assert refused[0].response.headers["x-should-retry"] == "false"  # the SDK retries not
    error = refused[0].body
    assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
    assert "'team'" in error["message"] and "$5.000000" in error["message"]
    assert "team-token" not in error["message"]


def test_the_positive_control_without_reservation_the_budget_is_overshot(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same flood with nothing reserved (each request checks only what was spent
    when it started, as a plain counter would): far more than $5 is spent."""
    monkeypatch.setattr("conductor.serve._spend.call_usd", lambda *a: 0.0)
    results, charged = _flood(tmp_path, fake_server, "memory", None)
    assert charged > BUDGET_USD
    assert sum(not isinstance(r, Exception) for r in results) > 19


def test_a_budget_is_settled_to_what_was_spent(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """A request's hold is settled to what it spent, answered at once, streamed, or
    left by its client mid-call: a key of 5 calls answers five requests of one call and
    then says all 5 are spent and none is held (a hold never settled would still be
    held, and counted as spent only when its lease ended an hour later)."""
    fake_server.script("w0", Reply("ok", output_tokens=256))
    key = ApiKey("team", "team-token", max_calls=5)
    with served(priced_pool(tmp_path, fake_server), keys=(key,), max_calls_per_request=2) as url:
        client = sdk(url, "team-token")
        client.responses.create(model="single:w0", input="one")  # holds 1, spends 1
        streamed = list(client.responses.create(model="single:w0", input="two", stream=True))
        fake_server.script("w0", Reply("slow", latency_s=30))
        with pytest.raises(httpx.ReadTimeout):  # the client leaves; its call was made
            httpx.post(
                f"{url}/responses",
                json={"model": "single:w0", "input": "three"},
                headers={"authorization": "Bearer team-token"},
                timeout=1.0,
            )
        wait_for(lambda: len(fake_server.requests_for("w0")) == 3, what="the third call")
        fake_server.script("w0", Reply("ok", output_tokens=256))
        for question in ("four", "five"):
            client.responses.create(model="single:w0", input=question)
        refusals: list[str] = []
        wait_for(lambda: "5 spent and 0 held" in _refusal(client, refusals), what="settled")
    assert streamed[-1].type == "response.completed"
    assert "5 calls in its budget, 5 spent and 0 held" in refusals[-1], refusals[-1]
    assert len(fake_server.requests_for("w0")) == 5  # a refused request asks nothing


def _refusal(client: Any, seen: list[str]) -> str:
    """The message of a request the spent budget refuses (kept in ``seen``)."""
    with pytest.raises(openai.RateLimitError) as refused:
        client.responses.create(model="single:w0", input="six")
    seen.append(refused.value.body["message"])
    return seen[-1]


def test_a_usd_budget_refuses_a_model_of_unknown_price(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """Its worst case cannot be bounded, so it is not guessed: a 400 naming the model,
    before any call; a key capping only calls is served."""
    fake_server.script("w0", "ok")
    keys = (ApiKey("usd", "usd-token", max_usd=1.0), ApiKey("calls", "calls-token", max_calls=5))
    with served(make_pool(tmp_path, fake_server, n=1), keys=keys) as url:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk(url, "usd-token").responses.create(model="single:w0", input="Q")
        served_ok = sdk(url, "calls-token").responses.create(model="single:w0", input="Q")
    assert refused.value.body["code"] == "price_unknown"
    assert "'w0'" in refused.value.body["message"] and "price:" in refused.value.body["message"]
    assert served_ok.output_text == "ok"
    assert len(fake_server.requests_for("w0")) == 1


def test_a_state_server_that_is_down_fails_closed(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Budgeted requests are refused (503, one sentence) and no call is made; a stored
    response cannot be read (503, not a false "not found"); a key without a budget is
    still answered; the loss is one log line."""
    fake_server.script("w0", Reply("ok", output_tokens=256))
    keys = (ApiKey("team", "team-token", max_calls=100), ApiKey("free", "free-token"))
    state = state_url_from(redis_server.url)
    pool = priced_pool(tmp_path, fake_server)
    with served(pool, keys=keys, state=state, new_budgets=True) as url:
        first = sdk(url, "team-token").responses.create(model="single:w0", input="Q")
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="conductor"):
            budgeted = [
                httpx.post(
                    f"{url}/responses",
                    json={"model": "single:w0", "input": "Q"},
                    headers={"authorization": "Bearer team-token"},
                    timeout=30,
                )
                for _ in range(2)
            ]
            read = httpx.get(
                f"{url}/responses/{first.id}", headers={"authorization": "Bearer team-token"}
            )
            free = sdk(url, "free-token").responses.create(model="single:w0", input="Q")
    for resp in budgeted:
        assert resp.status_code == 503, resp.text
        error = resp.json()["error"]
        assert error["code"] == "state_unavailable" and "'team'" in error["message"]
    assert read.status_code == 503 and read.json()["error"]["code"] == "state_unavailable"
    assert free.output_text == "ok"
    assert len(fake_server.requests_for("w0")) == 2  # the first and the free key's
    lost = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in lost]  # one line, for both stores


def test_a_stored_response_outlives_its_server(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer
) -> None:
    """On the state server, a response stored by one server is read, continued and
    deleted by the next (a restart, or another replica), only by the key that made it;
    its retention time is the server's --keep-responses-s."""
    fake_server.script("w0", ["first answer", "second answer"])
    keys = (ApiKey("a", "token-a"), ApiKey("b", "token-b"))
    pool = priced_pool(tmp_path, fake_server)
    state = state_url_from(redis_server.url)
    with served(pool, keys=keys, state=state) as url:
        first = sdk(url, "token-a").responses.create(model="single:w0", input="Q1 MARK-1")
    with served(pool, keys=keys, state=state, keep_responses_s=0.001) as url:
        a, b = sdk(url, "token-a"), sdk(url, "token-b")
        assert a.responses.retrieve(first.id).output_text == "first answer"
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(first.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.delete(first.id)
        second = a.responses.create(model="single:w0", input="Q2", previous_response_id=first.id)
        items = a.responses.input_items.list(first.id)
        assert [i.content[0].text for i in items.data] == ["Q1 MARK-1"]
        a.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(first.id)
        # The second was kept for a millisecond: gone by now.
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(second.id)
    asked = fake_server.requests_for("w0")[1]
    assert "MARK-1" in str(asked.messages) and "first answer" in str(asked.messages)
    keys_left = {k.decode() for k in redis_server_keys(redis_server)}
    assert not any("token-a" in k or "token-b" in k for k in keys_left)


def redis_server_keys(server: RedisServer) -> list[bytes]:
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        keys: list[bytes] = client.keys("*")  # type: ignore[assignment]
        values = [str(client.hgetall(k)) for k in keys if client.type(k) == b"hash"]
        assert not any("token-a" in v for v in values)
        return keys
    finally:
        client.close()


KEYS_FILE = """\
keys:
  - name: team
    token_env: TEAM_TOKEN
    max_calls: 101
  - name: free
    token_env: FREE_TOKEN
"""


def test_two_replicas_agree(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer
) -> None:
    """Two `conductor serve --state` processes on one redis-server: 100 continuations,
    each sent to the other replica than the last, all answered, each seeing the whole
    conversation; the key's 101 calls hold across both; one replica killed, the other
    goes on."""
    fake_server.script("w0", Reply("ok", output_tokens=256))
    pool = priced_pool_file(tmp_path, fake_server)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    env = {"TEAM_TOKEN": "team-token", "FREE_TOKEN": "free-token", "OPENAI_API_KEY": "sk-fake"}
    args = ("--pool", str(pool), "--keys", str(keys), "--state", redis_server.url,
            "--no-cache", "--max-calls-per-request", "1", "--new-budgets")  # fmt: skip
    with ServeProcess(*args, env=env) as one, ServeProcess(*args, env=env) as two:
        replicas = [sdk(one.wait_url(), "team-token"), sdk(two.wait_url(), "team-token")]
        previous = None
        answered = 0
        for i in range(100):
            reply = replicas[i % 2].responses.create(
                model="single:w0", input=f"turn {i}", previous_response_id=previous
            )
            answered += reply.status == "completed"
            previous = reply.id
        last = fake_server.requests_for("w0")[-1]
        assert "turn 0" in str(last.messages) and "turn 99" in str(last.messages)
        replicas[0].responses.create(model="single:w0", input="the 101st call")
        with pytest.raises(openai.RateLimitError):  # the budget is one, across both
            replicas[1].responses.create(model="single:w0", input="the 102nd")
        with pytest.raises(openai.RateLimitError):
            replicas[0].responses.create(model="single:w0", input="the 102nd")
        one.stop()
        survivor = sdk(two.url or "", "free-token")
        after = survivor.responses.create(model="single:w0", input="still there?")
        kept = replicas[1].responses.retrieve(previous)
    assert answered == 100
    assert after.output_text == "ok" and kept.id == previous
    assert len(fake_server.requests_for("w0")) == 102


def test_a_reservation_its_replica_never_settled_counts_as_spent(
    redis_server: RedisServer,
) -> None:
    """A replica killed mid-request leaves its hold: when the lease ends it is counted
    as spent in full (the budget errs towards refusing), and a late settle adds nothing."""
    from conductor.state.budgets import RedisBudgets
    from conductor.state.shared import SharedServer

    async def scenario() -> list[Any]:
        server = SharedServer(state_url_from(redis_server.url), "a test")
        budgets = RedisBudgets(server, lease_s=1)
        try:
            await budgets.open(new=True)
            held = await budgets.reserve("o", "r1", 3, 0, 5, None)
            refused = await budgets.reserve("o", "r2", 3, 0, 5, None)  # 3 held + 3 > 5
            await asyncio.sleep(2.5)  # the server's clock counts whole seconds
            after = await budgets.reserve("o", "r3", 2, 0, 5, None)  # 3 spent + 2 <= 5
            await budgets.settle("o", "r1", 0, 0)  # too late: counted already
            spent = await budgets.spent("o")
        finally:
            await budgets.aclose()
        return [held, refused, after, spent]

    held, refused, after, spent = asyncio.run(scenario())
    assert held.refused is None and refused.refused == "calls"
    assert after.refused is None and (after.calls, after.held_calls) == (3, 2)
    assert spent == (3, 0)
