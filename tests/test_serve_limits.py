"""Limits one client of `conductor serve` cannot exceed, over real sockets: K of
``vote:K:W`` / ``reflect:K:W``, a request's call budget, every bad value a 400 in
OpenAI's shape, and connections that are slow to send a request (slowloris), which are
closed after a time-out while the server keeps answering."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, worker
from kit.servekit import error_of, make_pool, make_pool_file, served, wait_for

from conductor.errors import UsageError
from conductor.pool import load_pool
from conductor.serve import ServeSettings, create_app
from conductor.testing import FakeLLMServer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

QUESTION = [{"role": "user", "content": "Capital of France?"}]


def body(model: str = "conductor", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": QUESTION, **extra}


@pytest.fixture
def answered(fake_server: FakeLLMServer) -> FakeLLMServer:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", "Paris")
    return fake_server


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FakeLLMServer]]:
    """One server (max_k=4) for the tests of requests it must refuse: its fake
    provider must never be called."""
    with (
        FakeLLMServer() as fake,
        served(make_pool(tmp_path_factory.mktemp("refusing"), fake), max_k=4) as url,
    ):
        yield url, fake


# -- K of vote:K:W and reflect:K:W --------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "vote:5:w0",  # past max_k=4
        "reflect:5:w0",
        "vote:300000:w0",
        "vote:" + "9" * 5000 + ":w0",  # past Python's int-string limit
        "vote:0:w0",
        "vote:000:w0",
        "vote:-1:w0",
        "vote:\u00b2:w0",  # a digit to str.isdigit, not to int()
        "vote:3:nosuchworker",
        "vote:3:",
        "vote::w0",
        "reflect:x:w0",
        "singles",
    ],
)
def test_a_k_past_the_bound_or_a_bad_model_id_is_a_400_on_model(
    refusing: tuple[str, FakeLLMServer], model: str
) -> None:
    url, fake = refusing
    chat = httpx.post(f"{url}/chat/completions", json=body(model), timeout=30)
    one = httpx.get(f"{url}/models/{model}", timeout=30)
    for resp in (chat, one):
        error = error_of(resp)
        assert error["param"] == "model"
        assert error["code"] == "model_not_found"
        assert len(error["message"]) < 500  # a 5,000-digit id is not echoed whole
    assert fake.requests == []


def test_k_up_to_the_bound_runs(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered), max_k=4) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body("vote:4:w0"), timeout=30)
    assert resp.status_code == 200, resp.text
    assert len(answered.requests_for("w0")) == 4


def test_a_k_of_300000_is_refused_at_once_and_the_server_stays_up(
    tmp_path: Path, answered: FakeLLMServer
) -> None:
    # Before the bound this request made a plan of 300,001 steps and left /health
    # dead for minutes; now it is refused on its name.
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body("vote:300000:w0"), timeout=30)
        health = httpx.get(f"{url.removesuffix('/v1')}/health", timeout=30)
    assert "at most 16" in error_of(resp)["message"]
    assert health.status_code == 200
    assert answered.requests == []


# -- a request's budget -------------------------------------------------------------------


def test_a_request_budget_stops_the_run_and_says_so(
    tmp_path: Path, answered: FakeLLMServer
) -> None:
    with served(make_pool(tmp_path, answered)) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            json=body("vote:16:w0", conductor={"max_calls": 5}),
            timeout=30,
        )
    assert resp.status_code == 200, resp.text
    assert len(answered.requests_for("w0")) == 5
    ours = resp.json()["conductor"]
    assert ours["budget"]["max_calls"] == 5
    assert ours["budget"]["calls"] == 5
    assert "call budget reached" in ours["budget"]["stopped"]
    assert resp.json()["choices"][0]["message"]["content"] == "Paris"


def test_the_server_ceiling_caps_a_larger_ask_and_bounds_every_run_together(
    tmp_path: Path, answered: FakeLLMServer
) -> None:
    with served(make_pool(tmp_path, answered), max_calls_per_request=3) as url:
        asked_more = httpx.post(
            f"{url}/chat/completions",
            json=body("vote:8:w0", conductor={"max_calls": 100}),
            timeout=30,
        )
        calls_then = len(answered.requests_for("w0"))
        # n runs share one budget: three votes of three runs make three calls in all.
        several = httpx.post(
            f"{url}/chat/completions", json=body("vote:3:w0", n=3, stream=True), timeout=30
        )
    assert asked_more.status_code == 200, asked_more.text
    assert calls_then == 3
    assert asked_more.json()["conductor"]["budget"]["max_calls"] == 3
    assert several.status_code == 200
    assert len(answered.requests_for("w0")) == 6
    finals = [
        json.loads(line[6:])
        for line in several.text.splitlines()
        if line.startswith("data: {") and '"finish_reason": "stop"' in line
    ]
    assert any(f["conductor"]["budget"]["stopped"] for f in finals)


def test_without_an_ask_a_request_gets_the_ceiling(tmp_path: Path, answered: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, answered), max_calls_per_request=2) as url:
        resp = httpx.post(f"{url}/chat/completions", json=body("single:w0"), timeout=30)
    budget = resp.json()["conductor"]["budget"]
    assert budget == {"max_calls": 2, "max_usd": None, "calls": 1, "usd": 0.0, "stopped": None}


def test_a_usd_budget_stops_the_next_call_once_spent(
    tmp_path: Path, answered: FakeLLMServer
) -> None:
    price = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}
    pool = load_pool(
        make_pool_file(tmp_path, answered, workers=[worker(answered, "w0", price=price)])
    )
    # reflect's steps run one after another, so each call is paid before the next asks.
    with served(pool, max_usd_per_request=1e-9) as url:
        capped = httpx.post(f"{url}/chat/completions", json=body("reflect:4:w0"), timeout=30)
        calls_then = len(answered.requests_for("w0"))
        asked = httpx.post(
            f"{url}/chat/completions",
            json=body("reflect:4:w0", conductor={"max_usd": 1.0}),  # over the ceiling
            timeout=30,
        )
    assert calls_then == 1
    assert len(answered.requests_for("w0")) == 2
    for resp in (capped, asked):
        assert resp.status_code == 200, resp.text
        budget = resp.json()["conductor"]["budget"]
        assert budget["max_usd"] == 1e-9
        assert budget["calls"] == 1 and budget["usd"] > 0
        assert "USD budget reached" in budget["stopped"]


# -- every bad value a 400 ----------------------------------------------------------------

_DEEP = "[" * 100_000 + "]" * 100_000
#: A body up to its ``conductor`` object, whose value follows.
_OURS = '{"model": "conductor", "messages": MSG, "conductor": '


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "conductor", "messages": MSG, "n": 1e308}', "n"),
        ('{"model": "conductor", "messages": MSG, "n": "3"}', "n"),
        ('{"model": "conductor", "messages": MSG, "n": true}', "n"),
        ('{"model": "conductor", "messages": MSG, "n": 17}', "n"),
        ('{"model": "conductor", "messages": MSG, "n": -1}', "n"),
        ('{"model": "conductor", "messages": MSG, "n": ' + "9" * 5000 + "}", None),
        (_OURS + '{"max_calls": -1}}', "conductor"),
        (_OURS + '{"max_calls": 0}}', "conductor"),
        (_OURS + '{"max_calls": "x"}}', "conductor"),
        (_OURS + '{"max_calls": 1e400}}', "conductor"),
        (_OURS + '{"max_calls": 2.5}}', "conductor"),
        (_OURS + '{"max_calls": true}}', "conductor"),
        (_OURS + '{"max_usd": NaN}}', "conductor"),
        (_OURS + '{"max_usd": Infinity}}', "conductor"),
        (_OURS + '{"max_usd": -1}}', "conductor"),
        (_OURS + '{"max_usd": 0}}', "conductor"),
        (_OURS + '{"max_usd": "1"}}', "conductor"),
        (
            '{"model": "conductor", "messages": MSG, "conductor": {"max_usd": ' + "9" * 400 + "}}",
            "conductor",
        ),
        (_OURS + '{"max_call": 5}}', "conductor"),
        ('{"model": "conductor", "messages": MSG, "conductor": [1]}', "conductor"),
        (_OURS + '{"progress": "yes"}}', "conductor"),
        ('{"model": "conductor", "messages": MSG, "stream": "true"}', "stream"),
        ('{"model": "conductor", "messages": MSG, "stream_options": 3}', "stream_options"),
        ('{"model": ["conductor"], "messages": MSG}', "model"),
        ('{"model": 7, "messages": MSG}', "model"),
        ('{"model": "\\ud800", "messages": MSG}', "model"),
        ('{"model": "conductor", "messages": {"role": "user"}}', "messages"),
        ('{"model": "conductor", "messages": [[]]}', "messages[0]"),
        ('{"model": "conductor", "messages": [{"role": 5, "content": "x"}]}', "messages[0].role"),
        (
            '{"model": "conductor", "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
        (_DEEP, None),
        ('{"model": "conductor", "messages": ' + _DEEP + "}", None),
        ("[1, 2]", None),
        ('"a string"', None),
        ("{", None),
        ("\udcff\udcfe", None),  # bytes that are not UTF-8
    ],
)
def test_every_bad_value_is_a_400_in_openais_shape(
    refusing: tuple[str, FakeLLMServer], raw: str, param: str | None
) -> None:
    url, fake = refusing
    content = raw.replace("MSG", json.dumps(QUESTION)).encode("utf-8", "surrogateescape")
    resp = httpx.post(
        f"{url}/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    error = error_of(resp)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert fake.requests == []


@pytest.mark.parametrize(
    "changes",
    [
        {"max_k": 0},
        {"max_connections": 0},
        {"max_calls_per_request": 0},
        {"max_usd_per_request": 0.0},
        {"header_timeout_s": 0.0},
        {"body_timeout_s": float("inf")},
        {"keep_alive_s": -1.0},
    ],
)
def test_a_server_limit_out_of_range_is_a_usage_error(
    tmp_path: Path, fake_server: FakeLLMServer, changes: dict[str, Any]
) -> None:
    pool = make_pool(tmp_path, fake_server)
    with pytest.raises(UsageError, match="--"):
        create_app(ServeSettings(pool=pool, use_cache=False, **changes))


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2",
        b"GARBAGE\r\n",
    ],
)
def test_a_request_that_is_not_http_is_a_400_in_openais_shape(
    refusing: tuple[str, FakeLLMServer], head: bytes
) -> None:
    url, _ = refusing
    sock = _open(url, head + b"\r\n\r\n")
    try:
        sock.settimeout(10)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    finally:
        sock.close()
    status, _, rest = reply.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", reply
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_http"


# -- slow connections ---------------------------------------------------------------------


def _open(url: str, partial: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    if partial:
        sock.sendall(partial)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (what it sent first is read and dropped)."""
    sock.settimeout(0.0)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _health(url: str) -> int:
    return httpx.get(f"{url.removesuffix('/v1')}/health", timeout=10).status_code


_PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "


@pytest.mark.long
def test_slowloris_sockets_are_closed_and_health_answers_meanwhile(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    with served(make_pool(tmp_path, fake_server), header_timeout_s=0.5, max_connections=20) as url:
        slow = [_open(url, _PARTIAL if i % 2 else b"") for i in range(60)]
        try:
            # Three times the cap are open or were: each new one closed the one that
            # waited longest, so a client that sends its request at once gets in.
            assert _health(url) == 200
            wait_for(lambda: all(_closed(s) for s in slow), timeout=20, what="slow closed")
            assert _health(url) == 200
        finally:
            for s in slow:
                s.close()


@pytest.mark.long
def test_a_kept_alive_connection_trickling_its_next_headers_is_closed(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    with served(make_pool(tmp_path, fake_server), header_timeout_s=0.5, keep_alive_s=30) as url:
        sock = _open(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            # One byte of the next request now and then keeps the keep-alive time-out
            # from firing; the header time-out still does.
            started = time.monotonic()
            for byte in _PARTIAL:
                if _closed(sock):
                    break
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                assert time.monotonic() - started < 20, "the trickling connection stayed open"
            else:
                raise AssertionError("the trickling connection stayed open")
        finally:
            sock.close()


@pytest.mark.long
def test_slow_bodies_are_closed_and_past_the_cap_a_503_until_they_are(
    tmp_path: Path, fake_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    with served(make_pool(tmp_path, fake_server), body_timeout_s=1.0, max_connections=2) as url:
        slow = [_open(url, head) for _ in range(2)]
        try:
            time.sleep(0.2)  # both requests are in progress: no room can be made
            refused = httpx.get(f"{url.removesuffix('/v1')}/health", timeout=10)
            error = error_of(refused, 503)
            assert error["code"] == "too_many_connections"
            wait_for(lambda: all(_closed(s) for s in slow), timeout=20, what="slow bodies")
            wait_for(lambda: _health(url) == 200, timeout=20, what="health again")
        finally:
            for s in slow:
                s.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_cap_the_fd_limit_cannot_hold_is_a_usage_error(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    resource = pytest.importorskip("resource")
    # Up to the hard limit the soft one is raised to make room; past it, no room.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no file-descriptor limit")
    with (
        pytest.raises(UsageError, match="--max-connections"),
        served(make_pool(tmp_path, fake_server), max_connections=hard),
    ):
        pass
