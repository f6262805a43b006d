"""One request cannot stall `conductor serve`: while a structured-output request whose
schema and reply are built to be expensive to check runs, ``GET /health`` answers every
probe within half a second (a bound only a stall breaks), against a real in-process
server on the fake provider.  The attacks are issue 37's two (``uniqueItems`` over
6,000 objects, an enum of 10,000 numbers over 3,000 items) and variants of the class:
work that is linear but large, work that is exponential in a small schema (``anyOf``,
``allOf``, ``contains`` fan-out, catastrophic patterns), recursion (``$ref`` cycles,
deep replies), a pattern slow to compile, big numbers, a big ``const``, and a ``$ref``
to a remote server that never answers or to ``/dev/zero``.  The positive control runs
the same checks on the event loop and shows the probes failing; a client that leaves
has its check's process killed at once."""

from __future__ import annotations

import functools
import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.clock import scaled
from kit.servekit import error_of, make_pool, served

from conductor.llm.check_workers import InlineRunner, RequestChecks
from conductor.testing import FakeLLMServer

pytest.importorskip("fastapi")
pytest.importorskip("jsonschema")

#: What a probe of /health may take: a bound that only a stall breaks.
PROBE_BOUND_S = 0.5


def _fan_out(levels: int, combinator: str, first: dict[str, Any]) -> dict[str, Any]:
    """Definitions whose check doubles at each level: ``l0`` is ``combinator`` of two
    branches that both follow ``l1`` (the first with ``first`` beside it)."""
    defs: dict[str, Any] = {f"l{levels}": {"type": "string"}}
    for level in range(levels - 1, -1, -1):
        ref = {"$ref": f"#/$defs/l{level + 1}"}
        defs[f"l{level}"] = {combinator: [{**ref, **first}, ref]}
    return defs


def _object(v: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": v}, "required": ["v"], **extra}


def _attacks(silent_port: int) -> dict[str, tuple[dict[str, Any], str]]:
    """Each attack's schema and the worker's reply."""
    big = {f"key{i}": i for i in range(1000)}
    deep: Any = []
    for _ in range(900):
        deep = [deep]
    return {
        "unique": (
            _object({"type": "array", "uniqueItems": True}),
            json.dumps({"v": [{"i": k, "name": f"item {k}"} for k in range(6000)]}),
        ),
        "enum": (
            _object({"type": "array", "items": {"enum": list(range(10_000))}}),
            json.dumps({"v": [9999] * 3000}),
        ),
        "enum-within-limits": (
            _object({"type": "array", "items": {"enum": list(range(1000))}}),
            json.dumps({"v": [999] * 30_000}),
        ),
        "patterns": (
            {"type": "object", "patternProperties": {f"^(a|aa)+{c}$": {} for c in "bcdefghij"}},
            json.dumps({f"{'a' * 30}{k}!": k for k in range(400)}),
        ),
        "many-patterns": (
            {
                "type": "object",
                "patternProperties": {f"^k{i}_": {"type": "integer"} for i in range(100)},
            },
            json.dumps({f"key{k}": k for k in range(5000)}),
        ),  # fmt: skip
        "anyOf": (
            _object({"$ref": "#/$defs/l0"}, **{"$defs": _fan_out(26, "anyOf", {"minLength": 99})}),
            json.dumps({"v": "x" * 10}),
        ),
        "allOf": (
            _object({"$ref": "#/$defs/l0"}, **{"$defs": _fan_out(26, "allOf", {})}),
            json.dumps({"v": "x" * 10}),
        ),
        "contains": (
            _object(
                {"type": "array", "contains": {"$ref": "#/$defs/l0"}, "minContains": 900},
                **{"$defs": _fan_out(18, "anyOf", {"minLength": 99})},
            ),
            json.dumps({"v": ["x"] * 900}),
        ),
        "ref-cycle": (
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            },
            json.dumps({"v": 1}),
        ),
        "deep-reply": (
            _object(
                {"$ref": "#/$defs/n"},
                **{"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}},
            ),
            json.dumps({"v": deep}),
        ),  # fmt: skip
        "big-numbers": (
            _object({"type": "array", "items": {"multipleOf": 7}}),
            json.dumps({"v": [int("9" * 4000) - k for k in range(900)]}),
        ),
        "big-const": (
            _object({"type": "array", "items": {"const": big}}),
            json.dumps({"v": [big] * 250}),
        ),
        "slow-compile": (
            _object({"type": "string", "pattern": "(?:(?:a{1000}){1000}){10}"}),
            json.dumps({"v": "a"}),
        ),
        "remote-ref": (
            _object({"$ref": f"http://127.0.0.1:{silent_port}/schema.json"}),
            json.dumps({"v": 1}),
        ),
        "file-ref": (_object({"$ref": "file:///dev/zero"}), json.dumps({"v": 1})),
    }


#: What each attack must come to: the statuses allowed, and words the error must hold.
EXPECTED: dict[str, tuple[set[int], str]] = {
    "unique": ({200}, ""),
    "enum": ({400}, "10,000 enum values in all, over the limit of 1,000"),
    "enum-within-limits": ({200}, ""),
    "patterns": ({502}, "limit of 5 s"),
    "many-patterns": ({200, 502}, ""),
    "anyOf": ({502}, "limit of 5 s"),
    "allOf": ({502}, "limit of 5 s"),
    "contains": ({502}, "limit of 5 s"),
    "ref-cycle": ({502}, "could not be checked"),
    "deep-reply": ({200, 502}, ""),
    "big-numbers": ({200, 502}, ""),
    "big-const": ({200}, ""),
    "slow-compile": ({502}, "could not be checked"),
    "remote-ref": ({502}, "not fetched"),
    "file-ref": ({502}, "not fetched"),
}


class Prober:
    """Probes ``GET /health`` every 50 ms from its own thread, keeping each probe's
    latency (given 60 s, so a stall shows as its length)."""

    def __init__(self, url: str) -> None:
        self.url = url.removesuffix("/v1") + "/health"
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)

    def _probe(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                client.get(self.url, timeout=60).raise_for_status()
                self.latencies.append(time.monotonic() - t0)
                self._stop.wait(0.05)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)

    def summary(self) -> str:
        ordered = sorted(self.latencies)
        return (
            f"{len(ordered)} probes, max {ordered[-1]:.3f} s, "
            f"median {statistics.median(ordered):.3f} s"
        )


@contextmanager
def silent_listener() -> Iterator[socket.socket]:
    """A port that accepts connections and never answers (where a remote $ref points)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock
    finally:
        sock.close()


def structured(schema: dict[str, Any], question: str = "Give the list.") -> dict[str, Any]:
    return {
        "model": "single:w0",
        "messages": [{"role": "user", "content": question}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}},
    }


def run_attack(url: str, schema: dict[str, Any]) -> tuple[httpx.Response, Prober]:
    """Send one attack while probing /health; the probes go on until 0.3 s after it is
    answered (so a check still running afterwards shows too).  A plain request goes
    first: a fresh server's first call imports its provider's SDK (once, on the loop),
    which is not what is measured here."""
    plain = {"model": "single:w0", "messages": [{"role": "user", "content": "Warm up."}]}
    assert httpx.post(f"{url}/chat/completions", json=plain, timeout=120).status_code == 200
    with Prober(url) as prober:
        time.sleep(0.3)
        reply = httpx.post(f"{url}/chat/completions", json=structured(schema), timeout=120)
        time.sleep(0.3)
    return reply, prober


@pytest.mark.process  # the checks run in checker processes
@pytest.mark.long  # each attack may take its 5 s budget
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_health_answers_while_an_attack_is_checked(
    tmp_path: Path, fake_server: FakeLLMServer, name: str
) -> None:
    with silent_listener() as silent:
        schema, text = _attacks(silent.getsockname()[1])[name]
        fake_server.script("w0", text)
        with served(make_pool(tmp_path, fake_server)) as url:
            reply, prober = run_attack(url, schema)
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):
            silent.accept()  # the remote $ref was never fetched (nor anything else)
    statuses, words = EXPECTED[name]
    assert reply.status_code in statuses, (reply.status_code, reply.text[:300])
    if reply.status_code != 200:
        assert words in reply.json()["error"]["message"], reply.text[:500]
    assert max(prober.latencies) < PROBE_BOUND_S, prober.summary()


@pytest.mark.process  # the checker processes of the server
@pytest.mark.long
def test_the_positive_control_checks_on_the_event_loop_and_stalls_it(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same server with its checks moved back onto the event loop (InlineRunner:
    the same checks, under the same budget, in the loop's thread): the probes wait for
    each check, for up to the whole 5 s budget."""
    import conductor.serve._service as service

    monkeypatch.setattr(service, "CheckerPool", InlineRunner)
    for name in ("patterns", "anyOf"):
        schema, text = _attacks(1)[name]
        fake_server.script("w0", text)
        with served(make_pool(tmp_path, fake_server)) as url:
            reply, prober = run_attack(url, schema)
        assert reply.status_code == 502 and "limit of 5 s" in reply.text
        assert max(prober.latencies) > 2.0, prober.summary()


def _checkers() -> dict[int, float]:
    """This process's checker children (the server runs in a thread here): pid to the
    CPU seconds each has used."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"conductor.llm.check_workers" in cmdline:
            out[int(entry)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.process  # the checker processes of the server
@pytest.mark.long  # waits for a check to be busy, and for it to end
@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_stops_its_check(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A request whose client left has its check's process killed at once: with a budget
    of 120 s the check would go on for two minutes; it ends within seconds of the
    connection closing.  The control is the same check seen busy and alive while its
    client still waits."""
    import conductor.serve._service as service

    monkeypatch.setattr(service, "RequestChecks", functools.partial(RequestChecks, budget_s=120))
    schema, text = _attacks(1)["anyOf"]
    fake_server.script("w0", text)
    body = {**structured(schema), "stream": stream}
    with served(make_pool(tmp_path, fake_server)) as url:
        gone = threading.Event()
        host, port = url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
        raw = json.dumps(body).encode()

        def client() -> None:
            # A raw connection: it can leave before the response's headers arrive.
            with socket.create_connection((host, int(port)), timeout=120) as conn:
                conn.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                    b"content-type: application/json\r\n"
                    + f"content-length: {len(raw)}\r\n\r\n".encode()
                    + raw
                )
                gone.wait(120)  # leaves when the test says so: the connection closes

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        deadline = time.monotonic() + scaled(60)
        busy: dict[int, float] = {}
        while time.monotonic() < deadline and not busy:
            first = _checkers()
            time.sleep(0.5)
            later = _checkers()
            busy = {p: t for p, t in later.items() if t > first.get(p, t)}
        assert busy, "no checker process got busy with the request"
        (pid,) = busy
        time.sleep(1.0)
        assert _alive(pid), "the check ended while its client still waited"
        gone.set()
        thread.join(30)
        left = time.monotonic()
        while _alive(pid) and time.monotonic() - left < 20:
            time.sleep(0.05)
        assert not _alive(pid), "the check went on after its client left"


@pytest.mark.process  # the schema is checked in a checker process
def test_a_schema_check_over_the_budget_is_a_400_naming_it(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's own schema is checked off the loop on the request's budget too: over
    it, the request is refused with a 400 naming the limit.  (The control: the same
    schema within the default budget is accepted.)"""
    import conductor.serve._service as service

    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "d" * 40} for i in range(4000)},
    }
    fake_server.script("w0", json.dumps({"p0": "x"}))
    with served(make_pool(tmp_path, fake_server)) as url:
        accepted = httpx.post(f"{url}/chat/completions", json=structured(schema), timeout=120)
    assert accepted.status_code == 200, accepted.text[:300]
    monkeypatch.setattr(service, "RequestChecks", functools.partial(RequestChecks, budget_s=0.001))
    with served(make_pool(tmp_path, fake_server)) as url:
        refused = httpx.post(f"{url}/chat/completions", json=structured(schema), timeout=120)
    error = error_of(refused, 400)
    assert error["param"] == "response_format" and error["code"] == "schema_check_timeout"
    assert error["message"].startswith("response_format.json_schema.schema could not be checked")
    assert "limit of 0.001 s" in error["message"]
    assert len(fake_server.requests_for("w0")) == 1  # the refused request made no call


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        (
            "schema",
            {"enum": list(range(1001))},
            "1,001 enum values in all, over the limit of 1,000",
        ),
        ("schema", {"properties": {"a": {"pattern": "x" * 1001}}}, "a pattern of 1,001 characters"),
        ("tools", 129, "tools has 129 tools, over the limit of 128"),
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_a_schema_over_a_limit_is_a_400_naming_it(
    tmp_path: Path, fake_server: FakeLLMServer, field: str, value: Any, words: str, endpoint: str
) -> None:
    """Refused when the request arrives, before any check or call, on both endpoints."""
    if field == "tools":
        fn = {"name": "f", "parameters": {"type": "object"}}
        tools: list[Any] = [
            {"type": "function", "function": {**fn, "name": f"f{i}"}} for i in range(value)
        ]
        if endpoint == "responses":
            tools = [{"type": "function", **t["function"]} for t in tools]
        body: dict[str, Any] = {"tools": tools}
    elif endpoint == "chat":
        body = {"response_format": structured(value)["response_format"]}
    else:
        body = {"text": {"format": {"type": "json_schema", "name": "A", "schema": value}}}
    with served(make_pool(tmp_path, fake_server)) as url:
        if endpoint == "chat":
            body |= {"model": "single:w0", "messages": [{"role": "user", "content": "Hi"}]}
            reply = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
        else:
            body |= {"model": "single:w0", "input": "Hi"}
            reply = httpx.post(f"{url}/responses", json=body, timeout=60)
    error = error_of(reply, 400)
    assert words in error["message"], error
    assert error["code"] == "schema_over_limit"
    if field == "schema":
        where = "response_format.json_schema.schema" if endpoint == "chat" else "text.format.schema"
        assert error["message"].startswith(where), error
    assert fake_server.requests == []
