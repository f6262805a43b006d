"""`conductor serve --state` when the state server restarts mid-load (a real
redis-server, started and killed here; the real openai SDK and httpx over HTTP).

- two replicas under load on a key with a USD budget: the server killed mid-load and
  started again EMPTY on its port; during the outage and after the restart the key's
  requests are refused (503, the second naming the operator's act), the key without a
  budget is served, a stored response is gone (404), the spend never passes the cap;
  only the operator's ``--new-budgets`` opens the budgets again, from zero;
- the positive control: with the sentinel check taken out of the scripts, the same
  restart reopens the budget at zero by itself and the spend passes the cap;
- a server restarted WITH its data (``SAVE``, then the same directory) goes on counting.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path

import httpx
import pytest
from kit.poolkit import pool_dict, run_cli, worker, write_pool
from kit.redisserver import RedisServer
from kit.servekit import ServeProcess, served, wait_for

from conductor.pool import load_pool
from conductor.serve import ApiKey
from conductor.state import state_url_from
from conductor.testing import FakeLLMServer, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.process  # a redis-server and serve processes

#: One call is exactly the worst case a request of one call reserves (256 answer
#: tokens at $1000 a million, input free): 19 fit under $5, a 20th would pass it.
PRICE = {"input_per_mtok": 0.0, "output_per_mtok": 1000.0}
CALL_USD = 0.256
BUDGET_USD = 5.0
FITS = 19

#: The first line of both budget scripts: the record's sentinel must exist.
GUARD = "if redis.call('EXISTS', KEYS[4]) == 0 then return false end"

KEYS_FILE = """\
keys:
  - name: team
    token_env: TEAM_TOKEN
    max_usd: 5.0
  - name: free
    token_env: FREE_TOKEN
"""


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def post(url: str, token: str, text: str = "Q") -> httpx.Response:
    return httpx.post(
        f"{url}/responses",
        json={"model": "single:w0", "input": text},
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def code_of(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"]) if resp.status_code >= 400 else "ok"


def unreachable(resp: httpx.Response) -> bool:
    return resp.status_code == 503 and "cannot be reached" in resp.text


def after_restart(send: Callable[[], httpx.Response]) -> httpx.Response:
    """The first answer that is not the pool's stale connection to the old server
    (one 503 "cannot be reached", nothing spent, as the server is found again)."""
    for _ in range(20):
        resp = send()
        if not unreachable(resp):
            return resp
    raise AssertionError(f"the state server was not found again: {resp.text}")


class Load:
    """Workers sending the budgeted key's requests to the replicas in turn until
    stopped, each result kept with the phase it was sent in."""

    def __init__(self, urls: list[str], workers: int = 6) -> None:
        self.urls = urls
        self.phase = "up"
        self.results: list[tuple[str, int, str, str]] = []  # phase, url, code, message
        self._stop = threading.Event()
        self._turn = count()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(workers)]

    def _run(self) -> None:
        while not self._stop.is_set():
            i = next(self._turn)
            phase = self.phase
            resp = post(self.urls[i % len(self.urls)], "team-token", f"Q{i}")
            message = resp.json()["error"]["message"] if resp.status_code >= 400 else ""
            with self._lock:
                self.results.append((phase, i % len(self.urls), code_of(resp), message))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def seen(self, phase: str, code: str, replica: int | None = None) -> int:
        with self._lock:
            return sum(
                p == phase and c == code and replica in (None, r) for p, r, c, _ in self.results
            )

    def of(self, phase: str) -> list[tuple[str, int, str, str]]:
        with self._lock:
            return [r for r in self.results if r[0] == phase]


def test_two_replicas_keep_a_budget_closed_when_the_state_server_restarts_empty(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer
) -> None:
    fake_server.script("w0", Reply("ok", latency_s=0.05, output_tokens=256))
    pool = write_pool(
        tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0", price=PRICE)])
    )
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    env = {"TEAM_TOKEN": "team-token", "FREE_TOKEN": "free-token", "OPENAI_API_KEY": "sk-fake"}
    args = ("--pool", str(pool), "--keys", str(keys), "--state", redis_server.url,
            "--no-cache", "--max-calls-per-request", "1")  # fmt: skip
    # The first replica makes the budgets' record; the second, started after it, finds it.
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(ServeProcess(*args, "--new-budgets", env=env))
        first_url = one.wait_url()
        two = stack.enter_context(ServeProcess(*args, env=env))
        urls = [first_url, two.wait_url()]
        stored = openai.OpenAI(base_url=urls[0], api_key="free-token", max_retries=0)
        kept = stored.responses.create(model="single:w0", input="keep me")
        with Load(urls) as load:
            wait_for(lambda: load.seen("up", "ok") >= 4, what="answers before the kill")
            redis_server.stop()  # mid-load: requests are in flight on both replicas
            load.phase = "down"
            wait_for(lambda: load.seen("down", "state_unavailable") >= 6, what="the outage")
            redis_server.start()  # the same port, no data
            load.phase = "empty"
            wait_for(
                lambda: all(load.seen("empty", "state_unavailable", r) >= 6 for r in (0, 1)),
                what="refusals after the restart",
            )
        before_reopen = len(fake_server.requests_for("w0"))
        free = [after_restart(lambda u=u: post(u, "free-token")) for u in urls]  # type: ignore[misc]
        lost = [after_restart(lambda u=u: httpx.get(  # type: ignore[misc]
            f"{u}/responses/{kept.id}", headers={"authorization": "Bearer free-token"}))
            for u in urls]  # fmt: skip
        still_closed = [post(u, "team-token").json()["error"] for u in urls]
        # The operator's act: one replica restarted with --new-budgets.
        one.stop()
        with ServeProcess(*args, "--new-budgets", env=env) as three:
            urls = [three.wait_url(), urls[1]]
            burst = [post(urls[i % 2], "team-token", f"again {i}") for i in range(FITS + 2)]
    team_calls_before = before_reopen - 1  # less the free key's stored response
    # The cap held over the outage and the empty restart.
    assert team_calls_before * CALL_USD <= BUDGET_USD
    assert load.seen("up", "ok") >= 4
    assert {code for _, _, code, _ in load.of("down")} == {"state_unavailable"}
    empty = load.of("empty")
    assert {code for _, _, code, _ in empty} == {"state_unavailable"}
    closed = [m for _, _, _, m in empty if "holds no record" in m]
    assert len(closed) >= 12 and all("--new-budgets" in m and "'team'" in m for m in closed)
    assert all(e["code"] == "state_unavailable" and "--new-budgets" in e["message"]
               for e in still_closed)  # fmt: skip
    # What has no budget goes on; what was stored went with the server.
    assert [r.status_code for r in free] == [200, 200]
    assert [r.status_code for r in lost] == [404, 404]
    # One line in each replica's log for the lost record.
    for replica in (one, two):
        assert replica.stderr.count("holds no record of the keys' budgets") == 1, replica.stderr
    # Reopened, from zero (the earlier spend is forgotten, as the flag says): a full
    # budget again, on both replicas, and not one call more.
    assert [code_of(r) for r in burst].count("ok") == FITS
    assert {code_of(r) for r in burst} == {"ok", "insufficient_quota"}


def _restart_once(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer, *, keep_data: bool
) -> tuple[list[str], list[str], int]:
    """A key of 3 calls spends them, the server restarts (with or without its data),
    and the key asks 3 more times: the codes before and after, and the calls made."""
    fake_server.script("w0", Reply("ok", output_tokens=256))
    pool = load_pool(
        write_pool(
            tmp_path / "pool.yaml",
            pool_dict(fake_server, [worker(fake_server, "w0", price=PRICE)]),
        )
    )
    keys = (ApiKey("team", "team-token", max_calls=3),)
    state = state_url_from(redis_server.url)
    with served(pool, keys=keys, state=state, new_budgets=True, max_calls_per_request=1) as url:
        before = [code_of(post(url, "team-token")) for _ in range(4)]
        if keep_data:
            import redis

            client = redis.Redis.from_url(redis_server.url)
            client.save()
            client.close()
        redis_server.stop()
        if not keep_data:
            (redis_server.dir / "dump.rdb").unlink(missing_ok=True)
        redis_server.start()
        after = [code_of(after_restart(lambda: post(url, "team-token")))]
        after += [code_of(post(url, "team-token")) for _ in range(2)]
    return before, after, len(fake_server.requests_for("w0"))


def test_a_state_server_restarted_with_its_data_goes_on_counting(
    tmp_path: Path, fake_server: FakeLLMServer, redis_server: RedisServer
) -> None:
    before, after, calls = _restart_once(tmp_path, fake_server, redis_server, keep_data=True)
    assert before == ["ok", "ok", "ok", "insufficient_quota"]
    assert after == ["insufficient_quota"] * 3  # the 3 calls spent are remembered
    assert calls == 3


@pytest.mark.parametrize("guarded", [True, False], ids=["sentinel", "no-sentinel"])
def test_the_positive_control_without_the_sentinel_an_empty_restart_reopens_the_budget(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    guarded: bool,
) -> None:
    """The same restart, empty: with the check, the key stays closed; with it taken out
    of both scripts, the key's spend starts again at zero and passes its cap."""
    from conductor.state import budgets

    for name in ("_RESERVE", "_SETTLE"):
        script = getattr(budgets, name)
        assert GUARD in script  # the control takes out what is really there
        if not guarded:
            monkeypatch.setattr(budgets, name, script.replace(GUARD, ""))
    before, after, calls = _restart_once(tmp_path, fake_server, redis_server, keep_data=False)
    assert before == ["ok", "ok", "ok", "insufficient_quota"]
    if guarded:
        assert after == ["state_unavailable"] * 3
        assert calls == 3  # never past the cap
    else:
        assert after == ["ok", "ok", "ok"]
        assert calls == 6  # twice the cap


def test_new_budgets_is_an_act_at_start_that_needs_the_state_server(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """Without --state it is refused; with a state server that cannot be reached at the
    start, the record is not made, and the server found later does not make it: the
    key with a budget stays refused (503), the key without one is served."""
    fake_server.script("w0", Reply("ok", output_tokens=256))
    pool = write_pool(
        tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0", price=PRICE)])
    )
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    env = {"TEAM_TOKEN": "team-token", "FREE_TOKEN": "free-token", "OPENAI_API_KEY": "sk-fake"}
    refused = run_cli("serve", "--pool", str(pool), "--new-budgets", env=env)
    assert refused.returncode == 2 and "give --state" in refused.stderr, refused.stderr
    later = RedisServer()  # its port, nothing listening yet
    args = ("--pool", str(pool), "--keys", str(keys), "--state", later.url, "--no-cache",
            "--max-calls-per-request", "1", "--new-budgets")  # fmt: skip
    with ServeProcess(*args, env=env) as replica:
        url = replica.wait_url()  # started, and opened, without the server
        with later:
            team = after_restart(lambda: post(url, "team-token"))
            free = post(url, "free-token")
    assert "the budgets' record was not made" in replica.stderr, replica.stderr
    assert team.status_code == 503 and "holds no record" in team.json()["error"]["message"]
    assert free.status_code == 200
    assert len(fake_server.requests_for("w0")) == 1
