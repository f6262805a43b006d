"""A key's budget held plan by plan: a request is admitted on its first call, and each
plan the Conductor writes is held whole (its steps at their own targets' prices) before
its first step, then settled to what was spent.

Through the real openai SDK against in-process servers on the fake provider, with the
budgets in the server's memory and on a real redis-server (started here): a plan that
does not fit is never sent, 200 Conductor requests at once never spend past the key's
budget, each plan's hold keeps it alone, and without the holds they spend past it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool
from kit.redisserver import RedisServer
from kit.servekit import responses_at_once, served

from conductor.pool import Pool, load_pool
from conductor.serve import ApiKey
from conductor.state import state_url_from
from conductor.testing import FakeLLMServer, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.process  # a redis-server, in-process servers

#: Every call's worst case: 256 answer tokens (the pool's max_tokens) at $1000 per
#: million, input free: $0.256, so what fits under a budget is exact.
PRICE = {"input_per_mtok": 0.0, "output_per_mtok": 1000.0}
CALL_USD = 0.256


def priced_pool(tmp_path: Path, server: FakeLLMServer, **conductor: Any) -> Pool:
    workers = [worker(server, w, price=PRICE) for w in ("w0", "w1")]
    data = pool_dict(server, workers, price=PRICE, **conductor)
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


def plan_reply(steps: int) -> str:
    """A Conductor reply planning ``steps`` steps, alternating w0 and w1, each seeing
    the last."""
    ids = [i % 2 for i in range(steps)]
    access: list[Any] = [[]] + [[i] for i in range(steps - 1)]
    return lists(ids, [f"Step {i}." for i in range(steps)], access)


def plan(server: FakeLLMServer, steps: int, output_tokens: int = 256) -> None:
    """The Conductor plans ``steps`` steps; every reply is ``output_tokens`` long."""
    server.script(CONDUCTOR_MODEL, Reply(plan_reply(steps), output_tokens=output_tokens))
    for w in ("w0", "w1"):
        server.script(w, Reply("Paris", output_tokens=output_tokens))


def calls_made(server: FakeLLMServer) -> dict[str, int]:
    return {m: len(server.requests_for(m)) for m in (CONDUCTOR_MODEL, "w0", "w1")}


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_plan_past_its_admission_is_held_before_its_first_step_or_never_sent(
    tmp_path: Path, fake_server: FakeLLMServer, store: str
) -> None:
    """A Conductor of at most 2 steps: a request is admitted on 3 calls ($0.768 of
    $1.10).  Its Conductor is asked twice (the first reply does not parse), so its
    2-step plan needs a call more than was held ($0.256).  Twice it fits and runs, each
    settled to the 4 calls it made ($0.04); the third time ($0.08 spent, $0.768 held)
    it does not, and that plan is never sent (429).  A plan within its admission still
    runs after."""
    key = ApiKey("team", "team-token", max_usd=1.1)
    replies = [Reply("no plan here", output_tokens=10), Reply(plan_reply(2), output_tokens=10)]

    def ask(client: Any) -> Any:
        return client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "Capital?"}]
        )

    with contextlib.ExitStack() as stack:
        state = None
        if store == "redis":
            state = state_url_from(stack.enter_context(RedisServer()).url)
        pool = priced_pool(tmp_path, fake_server, max_steps=2)
        settings = {"keys": (key,), "state": state, "new_budgets": state is not None}
        url = stack.enter_context(served(pool, **settings))
        client = openai.OpenAI(base_url=url, api_key="team-token", max_retries=0)
        plan(fake_server, 2, output_tokens=10)
        answers = []
        for _ in range(2):
            fake_server.script(CONDUCTOR_MODEL, replies)
            answers.append(ask(client).choices[0].message.content)
        fake_server.script(CONDUCTOR_MODEL, replies)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(client)
        after_refusal = calls_made(fake_server)
        plan(fake_server, 2, output_tokens=10)
        answers.append(ask(client).choices[0].message.content)
    error = refused.value.body
    assert error["code"] == "insufficient_quota"
    assert refused.value.response.headers["x-should-retry"] == "false"
    message = error["message"]
    assert "$0.080000 spent and $0.768000 held" in message, message
    assert "next 2 calls may cost up to $0.256000 more" in message, message
    assert after_refusal == {CONDUCTOR_MODEL: 6, "w0": 2, "w1": 2}  # the plan never ran
    assert answers == ["Paris"] * 3
    assert calls_made(fake_server) == {CONDUCTOR_MODEL: 7, "w0": 3, "w1": 3}


def _conductor_flood(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer | None
) -> tuple[list[Any], float]:
    """200 Conductor requests at once under $5, each planning two steps (each call
    exactly its worst case); what they got and what the provider was asked for.  One
    request after them finds every hold settled."""
    plan(fake_server, 2)
    fake_server.latency_s = 0.05  # every request is admitted before any settles
    state = state_url_from(redis_server.url) if redis_server is not None else None
    with served(
        priced_pool(tmp_path, fake_server),
        keys=(ApiKey("team", "team-token", max_usd=5.0),),
        state=state,
        new_budgets=state is not None,
        max_concurrency=256,
        max_queue=256,
    ) as url:
        results = responses_at_once(url, "team-token", "conductor", 200)
        charged = sum(calls_made(fake_server).values()) * CALL_USD
        # A request whose 16 runs cannot fit ($12.29) says what is held: every hold
        # is settled, so nothing.
        client = openai.OpenAI(base_url=url, api_key="team-token", max_retries=0)
        with pytest.raises(openai.RateLimitError) as after:
            client.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": "Q?"}], n=16
            )
    assert "$0.000000 held by requests in progress" in after.value.body["message"]
    return results, charged


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_200_conductor_requests_at_once_never_spend_past_the_budget(
    tmp_path: Path, fake_server: FakeLLMServer, store: str
) -> None:
    if store == "redis":
        with RedisServer() as redis_server:
            results, charged = _conductor_flood(tmp_path, fake_server, redis_server)
    else:
        results, charged = _conductor_flood(tmp_path, fake_server, None)
    answered = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(answered) + len(refused) == 200
    assert charged <= 5.0  # $0 overshoot
    assert answered and all(r.output_text == "Paris" for r in answered)
    assert {r.status_code for r in refused} == {429}
    # Each answered request made its three calls; no worker call was made for another.
    made = calls_made(fake_server)
    assert made["w0"] == made["w1"] == len(answered)


@pytest.mark.parametrize("plans_held", [True, False])
def test_each_plan_s_hold_is_a_wall_of_its_own_and_without_it_the_budget_is_overshot(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, plans_held: bool
) -> None:
    """The same flood with each request admitted on its first call alone: with the
    plans held, $5 still holds (the plans that do not fit are never sent); with them
    let through unheld too (the positive control), the Conductor's calls fit and the
    plans they write spend past $5."""

    def first_call_only(strategy: Any, question: str, sent_bytes: int) -> list[Any]:
        return [strategy.targets[-1]]  # the Conductor's (its targets end with it)

    async def unheld(self: Any, calls: Any, most: Any) -> None:
        return None

    monkeypatch.setattr("conductor.serve._spend.first_plan", first_call_only)
    if not plans_held:
        monkeypatch.setattr("conductor.serve._spend.Reservation.hold", unheld)
    results, charged = _conductor_flood(tmp_path, fake_server, None)
    assert (charged <= 5.0) is plans_held, charged
