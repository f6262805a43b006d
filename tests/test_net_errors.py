"""Errors that point the right way: a refused connection, a host name that does not
resolve, no route and a connect that hangs are each named as such, with the host and
port, after a short number of attempts; missing API keys are all named before any call;
the Conductor is called the Conductor.

Every case is real networking: a port on 127.0.0.1 with nothing listening, a name under
the reserved ``.invalid`` TLD (RFC 2606: it never resolves), the IPv6 discard prefix
(RFC 6666), a listener whose accept queue is full, and FakeLLMServer; the SDKs and
litellm are not mocked.  Back-off waits go through a recorder instead of sleeping.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, run_cli, write_pool

from conductor.errors import (
    ConnectionFailedError,
    ConnectionRefusedByHostError,
    ConnectTimeoutError,
    HostNotFoundError,
    HostUnreachableError,
    MissingKeysError,
    ModelCallError,
    RequestTimeoutError,
)
from conductor.llm.caller import CallerSet, ModelCaller
from conductor.llm.keys import missing_keys, require_keys
from conductor.llm.types import ModelRequest
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault

# Every client kind; litellm-anthropic and litellm-gemini drive litellm's own HTTP code,
# litellm its OpenAI route (through the openai SDK).
KINDS = ["litellm", "litellm-anthropic", "litellm-gemini", "openai", "http", "anthropic", "google"]
MAX_RETRIES = 6  # a pool's usual patience, which these failures must not use up
DNS_HOST = "conductor-no-such-host.invalid"

REQUEST = ModelRequest(
    messages=({"role": "user", "content": "What is 2+2?"},),
    params={"temperature": 0.0, "max_tokens": 16},
)


class Recorder:
    """A stand-in for asyncio.sleep that records the waits."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_at(kind: str, origin: str, **kw: object) -> Worker:
    """A worker of client ``kind`` whose server is ``origin`` (scheme://host:port)."""
    base: dict[str, object] = {
        "id": f"w-{kind}",
        "api_key_env": "CONDUCTOR_TEST_NET_KEY",
        "max_retries": MAX_RETRIES,
        "timeout_s": 5.0,
    }
    base.update(kw)
    if kind == "litellm":
        return Worker(model="openai/m", api_base=f"{origin}/v1", **base)  # type: ignore[arg-type]
    if kind == "litellm-anthropic":
        return Worker(model="anthropic/m", api_base=origin, **base)  # type: ignore[arg-type]
    if kind == "litellm-gemini":
        return Worker(model="gemini/m", api_base=origin, **base)  # type: ignore[arg-type]
    if kind in ("openai", "http"):
        return Worker(model="m", client=kind, api_base=f"{origin}/v1", **base)  # type: ignore[arg-type]
    if kind == "anthropic":
        return Worker(model="m", client="anthropic", api_base=origin, **base)  # type: ignore[arg-type]
    return Worker(model="m", client="google", api_base=origin, **base)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUCTOR_TEST_NET_KEY", "sk-net-test-0123456789")


async def fail(target: Worker, sleep: Recorder, callers: CallerSet | None = None) -> ModelCallError:
    caller = callers.get(target) if callers is not None else ModelCaller(target, sleep=sleep)
    try:
        with pytest.raises(ModelCallError) as info:
            await caller.complete(REQUEST)
    finally:
        if callers is None:
            await caller.aclose()
    return info.value


@pytest.mark.parametrize("kind", KINDS)
async def test_refused_connection_is_named_with_host_and_port_after_one_retry(kind: str) -> None:
    port = free_port()
    rec = Recorder()
    err = await fail(worker_at(kind, f"http://127.0.0.1:{port}"), rec)
    assert type(err) is ConnectionRefusedByHostError
    text = str(err)
    assert f"127.0.0.1:{port} refused the connection" in text
    assert "connection refused" in text and "check that the server is running" in text
    # A server that never answered this run is not waited for: one retry, not six.
    assert err.attempts == 2 and len(rec.waits) == 1
    assert "after 2 attempts" in text
    assert text.startswith(f"worker 'w-{kind}' failed")


@pytest.mark.parametrize("kind", KINDS)
async def test_dns_failure_is_named_with_the_host_and_fails_fast(kind: str) -> None:
    rec = Recorder()
    t0 = time.monotonic()
    err = await fail(worker_at(kind, f"http://{DNS_HOST}:8000"), rec)
    elapsed = time.monotonic() - t0
    assert type(err) is HostNotFoundError
    text = str(err)
    assert f"the name {DNS_HOST} could not be resolved (DNS)" in text
    assert "host not found" in text and "check the network connection" in text
    assert err.attempts == 2 and len(rec.waits) == 1  # at most one retry for DNS
    # .invalid never resolves, and the resolver says so without waiting on the network
    # (a loose bound: the point is that it is not a time-out).
    assert elapsed < 30


async def test_dns_failure_of_a_provider_default_endpoint_names_the_provider_host() -> None:
    """No api_base: the host the SDK dialled is named (here DNS fails: no network)."""
    target = Worker(
        id="w",
        model="m",
        client="openai",
        api_key_env="CONDUCTOR_TEST_NET_KEY",
        max_retries=0,
        timeout_s=5.0,
    )
    try:
        socket.getaddrinfo("api.openai.com", 443)
    except OSError:
        pass
    else:
        pytest.skip("this machine resolves api.openai.com (it has a network)")
    err = await fail(target, Recorder())
    assert isinstance(err, HostNotFoundError) and "api.openai.com" in str(err)


async def test_refused_after_the_server_answered_is_retried_twice() -> None:
    """A server that answered and then refuses is restarting: one retry more.  Two
    workers on the same server share what the run knows of it."""
    with FakeLLMServer() as server:
        origin = server.url
        first = worker_at("openai", origin, id="first")
        second = worker_at("http", origin, id="second")
        rec = Recorder()
        callers = CallerSet(sleep=rec)
        try:
            done = await callers.get(first).complete(REQUEST)
            assert done.attempts == 1 and len(server.requests) == 1
            server.stop()  # nothing listens on the port any more
            err = await fail(second, rec, callers)
            err_first = await fail(first, rec, callers)
        finally:
            await callers.aclose()
    for e in (err, err_first):
        assert type(e) is ConnectionRefusedByHostError
        assert e.attempts == 3 and "after 3 attempts" in str(e)
        assert origin.removeprefix("http://") in str(e)
    assert len(rec.waits) == 4


async def test_refused_on_a_fresh_caller_set_is_retried_once(fake_server: FakeLLMServer) -> None:
    """What the run knows does not outlive it: another run starts from scratch."""
    origin = fake_server.url
    fake_server.stop()
    rec = Recorder()
    callers = CallerSet(sleep=rec)
    try:
        err = await fail(worker_at("openai", origin), rec, callers)
    finally:
        await callers.aclose()
    assert isinstance(err, ConnectionRefusedByHostError) and err.attempts == 2


@pytest.mark.long
@pytest.mark.parametrize("kind", ["http", "openai", "litellm"])
async def test_no_route_is_named_unreachable_or_a_connect_time_out(kind: str) -> None:
    """The IPv6 discard prefix (RFC 6666): without an IPv6 route the kernel says "no
    route" at once; with one, packets vanish and the connect times out.  Either way the
    message names the address and what to check; never a generic connection error."""
    rec = Recorder()
    # Long enough for the kernel's neighbour discovery to give up (about 3 s) first.
    err = await fail(worker_at(kind, "http://[100::1]:9", timeout_s=6.0), rec)
    if err.status is not None:
        pytest.skip("something on this machine answers for the discard prefix")
    assert isinstance(err, (HostUnreachableError, ConnectTimeoutError)), repr(err)
    text = str(err)
    assert "[100::1]:9" in text
    assert "network" in text and "api_base" in text
    assert err.attempts == 2  # one retry: a network coming up may be there a second later


@pytest.fixture
def full_listener() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops further connection requests,
    so a connect hangs, as with a host behind a firewall that drops packets."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = int(srv.getsockname()[1])
    filler = socket.socket()
    filler.connect(("127.0.0.1", port))
    try:
        yield port
    finally:
        filler.close()
        srv.close()


@pytest.mark.long
@pytest.mark.parametrize("kind", ["openai", "anthropic", "http", "litellm"])
async def test_a_connect_that_hangs_is_a_time_out_that_names_the_host(
    kind: str, full_listener: int
) -> None:
    rec = Recorder()
    err = await fail(
        worker_at(kind, f"http://127.0.0.1:{full_listener}", timeout_s=0.5, total_timeout_s=60),
        rec,
    )
    assert isinstance(err, RequestTimeoutError)  # a time-out stays a time-out
    assert isinstance(err, ConnectTimeoutError)
    assert f"could not connect to 127.0.0.1:{full_listener} within 0.5 s" in str(err)
    assert err.attempts == 2


@pytest.mark.long
@pytest.mark.parametrize("kind", ["openai", "http", "litellm"])
async def test_a_server_that_stops_answering_is_a_plain_time_out(
    kind: str, fake_server: FakeLLMServer
) -> None:
    """Connected, then silence: the ordinary time-out, with the pool's full retries."""
    fake_server.script("m", [Fault.hang()] * 3)
    rec = Recorder()
    err = await fail(
        worker_at(kind, fake_server.url, timeout_s=0.4, max_retries=2, total_timeout_s=60), rec
    )
    assert type(err) is RequestTimeoutError and err.attempts == 3
    assert "no reply within" in str(err)


@pytest.mark.parametrize("kind", ["openai", "http"])
async def test_a_connection_reset_mid_reply_keeps_the_full_retries(
    kind: str, fake_server: FakeLLMServer
) -> None:
    fake_server.script("m", [Fault.reset()] * 3)
    rec = Recorder()
    err = await fail(worker_at(kind, fake_server.url, max_retries=2), rec)
    assert type(err) is ConnectionFailedError and err.attempts == 3
    assert len(fake_server.requests) == 3


# -- missing keys ----------------------------------------------------------------------


KEY_A, KEY_B, KEY_C = (f"CONDUCTOR_TEST_UNSET_{x}" for x in "ABC")


def keyless_pool(tmp_path: Path) -> Path:
    """Three workers needing two unset variables, and a Conductor needing a third.  No
    api_base (that would let a local server go without a key): the SDKs would use
    OPENAI_BASE_URL / ANTHROPIC_BASE_URL, which the test points at its fake server."""
    data = {
        "name": "keyless",
        "workers": [
            {"id": "alpha", "model": "alpha", "client": "openai", "api_key_env": KEY_A},
            {"id": "beta", "model": "beta", "client": "anthropic", "api_key_env": KEY_B},
            {"id": "gamma", "model": "gamma", "client": "openai", "api_key_env": KEY_A},
        ],
        "conductor": {
            "backend": "prompted",
            "model": f"openai/{CONDUCTOR_MODEL}",
            "api_key_env": KEY_C,
        },
    }
    return write_pool(tmp_path / "keyless.yaml", data)


@pytest.mark.process
def test_every_missing_key_is_named_at_once_before_any_request(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (KEY_A, KEY_B, KEY_C):
        monkeypatch.delenv(name, raising=False)
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["go"], [[]])])
    env = {
        "OPENAI_BASE_URL": fake_server.openai_base,
        "ANTHROPIC_BASE_URL": fake_server.url,
        "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    res = run_cli("ask", "What is 2+2?", "--pool", str(keyless_pool(tmp_path)), env=env)
    assert res.returncode == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert "3 API keys are not set, so nothing was sent" in text
    assert f"{KEY_A} (for workers 'alpha' and 'gamma')" in text
    assert f"{KEY_B} (for worker 'beta')" in text
    assert f"{KEY_C} (for the Conductor)" in text
    assert "worker 'conductor'" not in text and "Traceback" not in res.stderr
    assert fake_server.requests == []

    # With the keys set, the same pool reaches the server: the check is what stopped it.
    keys = {KEY_A: "sk-a-0123456789", KEY_B: "sk-b-0123456789", KEY_C: "sk-c-0123456789"}
    res = run_cli("ask", "What is 2+2?", "--pool", str(keyless_pool(tmp_path)), env=env | keys)
    assert res.returncode == 0, res.stderr
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 1


@pytest.mark.process
def test_bench_names_every_missing_key_before_the_first_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (KEY_A, KEY_B, KEY_C):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "1", "problem": "1+1?", "answer": "2"}\n')
    out = tmp_path / "run"
    res = run_cli(
        "bench", "math500", "--data", str(data), "--pool", str(keyless_pool(tmp_path)),
        "--strategy", "singles", "--out", str(out), "--no-cache",
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    text = " ".join(res.stderr.split())
    assert f"{KEY_A} (for workers 'alpha' and 'gamma')" in text
    assert f"{KEY_B} (for worker 'beta')" in text
    assert KEY_C not in text  # baselines do not call the Conductor
    assert not (out / "samples.jsonl").exists()


def test_key_alternatives_and_keys_that_are_not_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", KEY_A):
        monkeypatch.delenv(name, raising=False)
    targets = [
        Worker(id="g", model="gemini-2.5-pro", client="google"),
        # A local server named by api_base gets a placeholder key.
        Worker(
            id="vllm",
            model="m",
            client="openai",
            api_base="http://127.0.0.1:1/v1",
            api_key_env=KEY_A,
        ),  # fmt: skip
        Worker(id="here", model="smollm2", client="local"),
        Worker(id="conductor", model="m", client="http", api_key_env=KEY_A),
    ]
    assert missing_keys(targets) == {
        "GEMINI_API_KEY or GOOGLE_API_KEY": ["g"],
        KEY_A: ["conductor"],
    }
    with pytest.raises(MissingKeysError) as info:
        require_keys(targets)
    assert "GEMINI_API_KEY or GOOGLE_API_KEY (for worker 'g')" in str(info.value)
    assert f"{KEY_A} (for the Conductor)" in str(info.value)
    monkeypatch.setenv("GOOGLE_API_KEY", "AIza-0123456789")
    monkeypatch.setenv(KEY_A, "sk-0123456789")
    require_keys(targets)  # nothing missing: no error


def test_a_litellm_worker_without_api_key_env_needs_its_providers_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    claude = Worker(id="claude", model="anthropic/claude-sonnet-4-20250514")
    assert missing_keys([claude]) == {"ANTHROPIC_API_KEY": ["claude"]}
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-0123456789")
    assert missing_keys([claude]) == {}


# -- the Conductor, through the real CLI -------------------------------------------------


@pytest.mark.process
def test_unreachable_conductor_and_workers_through_the_cli(tmp_path: Path) -> None:
    """The run fails (exit 1) naming the Conductor, the kind and the address."""
    port = free_port()
    data = {
        "name": "down",
        "workers": [
            {"id": "w", "model": "m", "client": "openai", "api_base": f"http://127.0.0.1:{port}/v1"}
        ],
        "conductor": {
            "backend": "endpoint",
            "model": CONDUCTOR_MODEL,
            "api_base": f"http://{DNS_HOST}:8001/v1",
        },
    }
    pool = write_pool(tmp_path / "down.yaml", data)
    out = tmp_path / "r.json"
    res = run_cli("ask", "q", "--pool", str(pool), "--no-cache", "--out", str(out))
    assert res.returncode == 1, res.stderr
    text = " ".join(res.stderr.split())
    assert "the Conductor failed: host not found" in text
    assert f"the name {DNS_HOST} could not be resolved (DNS) after 2 attempts" in text
    assert "check the network connection" in text
    assert "worker 'conductor'" not in text and "Traceback" not in text
    record = out.read_text()
    assert "the Conductor failed" in record and "worker 'conductor'" not in record

    data["conductor"] = {"backend": "prompted", "model": "w"}  # the worker's endpoint
    write_pool(pool, data)
    res = run_cli("ask", "q", "--pool", str(pool), "--no-cache")
    assert res.returncode == 1
    text = " ".join(res.stderr.split())
    assert f"the Conductor failed: connection refused: 127.0.0.1:{port} refused" in text
    assert "after 2 attempts" in text and "check that the server is running" in text


async def test_litellm_connection_error_without_its_cause_is_not_a_server_error() -> None:
    """litellm re-raises the openai SDK's "Connection error." as an HTTP 500; when the
    cause is not chained, the words still say it was a connection, not a server's reply."""
    import litellm

    from conductor.llm.litellm_client import LiteLLMClient

    client = LiteLLMClient(worker_at("litellm", "http://127.0.0.1:9"))
    exc = litellm.InternalServerError(
        message="OpenAIException - Connection error.", llm_provider="openai", model="m"
    )
    err = client._classify(exc, 5.0)
    assert type(err) is ConnectionFailedError
    assert "the connection to 127.0.0.1:9 failed" in str(err) and "HTTP 500" not in str(err)
