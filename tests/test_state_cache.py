"""The call cache on a real redis-server (started here): shared by processes, the same
rules as on disk, failing open, its secrets never stored or shown."""

from __future__ import annotations

import json
import logging
import pickle
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, run_cli
from kit.redisserver import RedisServer
from kit.servekit import make_pool_file

from conductor.errors import UsageError
from conductor.llm.cache import ResponseCache
from conductor.llm.types import RawCompletion, Usage
from conductor.redact import SECRETS
from conductor.state import StateURL, open_shared_cache, state_url_from
from conductor.state.redis_cache import (
    _ENTRY,
    COMPRESS_OVER,
    MAX_ENTRY_BYTES,
    RedisCacheStore,
    decode,
    encode,
)
from conductor.testing import FakeLLMServer

pytestmark = pytest.mark.process  # each test starts a redis-server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def answer(text: str = "The answer is 4.", finish_reason: str = "stop") -> RawCompletion:
    return RawCompletion(text, Usage(10, 3), {"id": "r", "text": text}, model="m",
                         finish_reason=finish_reason)  # fmt: skip


def raw(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url)


def test_two_caches_on_one_server_share_an_entry(server: RedisServer) -> None:
    url = StateURL.parse(server.url)
    with open_shared_cache(url) as one, open_shared_cache(url) as two:
        one.set("k", answer())
        assert two.get("k") == answer()
        assert two.get("other") is None


def test_another_process_reads_what_this_one_stored(server: RedisServer) -> None:
    with open_shared_cache(StateURL.parse(server.url)) as cache:
        cache.set("k", answer("stored by the parent"))
    child = (
        "import sys; from conductor.state import StateURL, open_shared_cache\n"
        "c = open_shared_cache(StateURL.parse(sys.argv[1])); print(c.get('k').text)"
    )
    out = subprocess.run([sys.executable, "-c", child, server.url], capture_output=True,
                         text=True, timeout=scaled(60))  # fmt: skip
    assert out.stdout.strip() == "stored by the parent", out.stderr


def test_only_complete_answers_are_stored_as_on_disk(server: RedisServer, tmp_path: Path) -> None:
    cut = answer("half an ans", finish_reason="length")
    empty = answer(" \n")
    with open_shared_cache(StateURL.parse(server.url)) as shared, ResponseCache(tmp_path) as disk:
        for cache in (shared, disk):
            cache.set("cut", cut)
            cache.set("empty", empty)
            cache.set("ok", answer())
            assert (cache.get("cut"), cache.get("empty"), cache.get("ok")) == (None, None, answer())
        assert shared.stats().entries == disk.stats().entries == 1


def test_a_long_reply_is_stored_compressed(server: RedisServer) -> None:
    text = "A long derivation, line after line. " * 6000  # ~216 KB
    with open_shared_cache(StateURL.parse(server.url)) as cache:
        cache.set("long", answer(text))
        assert cache.get("long") == answer(text)
    stored = raw(server).get(_ENTRY + "long")
    assert isinstance(stored, bytes) and stored[:1] == b"z"
    assert len(stored) < len(text) / 20
    small = encode({"a": 1})
    assert small[:1] == b"j" and len(small) < COMPRESS_OVER


@pytest.mark.parametrize(
    "stored",
    [
        # A whole entry, pickled: a store that unpickled would serve it as an answer.
        pickle.dumps(
            {
                "text": "forged",
                "usage": {"input_tokens": 1, "output_tokens": 1},
                "raw": {},
                "finish_reason": "stop",
            }
        ),  # fmt: skip
        b"z" + pickle.dumps({"text": "forged"}),
        b"jnot json",
        b"z" + b"not zlib",
        b'j["a list"]',
        b"",
    ],
)
def test_what_is_not_an_entry_is_a_miss_and_never_unpickled(
    server: RedisServer, stored: bytes
) -> None:
    raw(server).set(_ENTRY + "k", stored)
    with open_shared_cache(StateURL.parse(server.url)) as cache:
        assert cache.get("k") is None
    assert decode(stored) is None


def test_a_bomb_on_the_server_is_a_miss_not_this_process_s_memory(server: RedisServer) -> None:
    """Entries a hostile writer of the shared server could leave: a zlib bomb that grows
    past the bound, JSON nested past the interpreter's recursion limit."""
    big = b'{"text":"' + b"a" * (MAX_ENTRY_BYTES + (16 << 20)) + b'"}'
    bomb = b"z" + zlib.compress(big, 9)
    assert len(bomb) < 200_000  # what is stored is small...
    # ...and what it inflates to without the bound (the positive control) is past it.
    assert len(zlib.decompress(bomb[1:])) > MAX_ENTRY_BYTES
    deep = b"j" + b"[" * 200_000 + b"]" * 200_000
    for stored in (bomb, deep):
        raw(server).set(_ENTRY + "k", stored)
        with open_shared_cache(StateURL.parse(server.url)) as cache:
            assert cache.get("k") is None
        assert decode(stored) is None  # not even read as a dict (it holds a "text")
    # An entry under the bound, compressed the same way, still reads.
    fine = {"text": "b" * (1 << 20)}
    assert decode(b"z" + zlib.compress(json.dumps(fine).encode())) == fine


def test_stats_and_clear_older_than_read_only_the_index(server: RedisServer) -> None:
    store = RedisCacheStore(StateURL.parse(server.url))
    cache = ResponseCache(store=store)
    for i in range(5):
        store.write(f"old{i}", {"text": "x" * 50, "stored_at": 1000.0 + i})
    cache.set("new", answer())
    s = cache.stats()
    assert (s.entries, s.oldest) == (6, 1000.0) and s.newest is not None and s.newest > 1e9
    stored = [raw(server).get(k) or b"" for k in raw(server).keys(_ENTRY + "*")]
    assert s.size_bytes == sum(len(b) for b in stored)
    assert cache.clear(older_than_s=3600) == 5
    assert cache.stats().entries == 1 and cache.get("new") == answer()
    assert cache.clear() == 1
    assert cache.stats() == type(s)(store.where, 0, 0, None, None, kind="server")
    cache.close()


def test_a_secret_in_an_answer_never_reaches_the_server(server: RedisServer) -> None:
    secret = "sk-state-" + "q7" * 16
    SECRETS.add(secret)
    try:
        with open_shared_cache(StateURL.parse(server.url)) as cache:
            cache.set("k", answer(f"the key is {secret}"))
    finally:
        SECRETS.forget()
    body = decode(raw(server).get(_ENTRY + "k"))
    assert isinstance(body, dict)
    body = json.dumps(body).encode()
    assert b"sk-state-" not in body and b"the key is" in body
    # The positive control: the same answer stored with no secret known is there in clear.
    store = RedisCacheStore(StateURL.parse(server.url))
    store.write("control", {"text": f"the key is {secret}"})
    assert secret.encode() in (raw(server).get(_ENTRY + "control") or b"")


def test_a_lost_server_fails_open_with_one_line_each_way(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    cache = open_shared_cache(StateURL.parse(server.url))
    cache.set("k", answer())
    server.stop()
    with caplog.at_level(logging.WARNING, logger="conductor"):
        for _ in range(20):
            assert cache.get("k") is None  # a miss: the call is asked again
            cache.set("k2", answer())  # dropped, not raised
        assert cache.stats().entries == 0
        lost = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
        assert len(lost) == 1 and server.url.split("@")[-1].split("/")[0] in lost[0].getMessage()
        server.start()  # the same port, empty (no persistence)
        cache.set("k3", answer())
        assert cache.get("k3") == answer()
        assert sum(r.getMessage().endswith(" is back") for r in caplog.records) == 1
    cache.close()


def test_a_password_in_the_url_is_used_and_never_shown() -> None:
    password = "pw-" + "z9" * 12
    with RedisServer(password=password) as server:
        url = StateURL.parse(server.url)
        assert password not in url.public and password not in repr(url) and password not in str(url)
        with open_shared_cache(url) as cache:
            cache.set("k", answer())
            assert cache.get("k") == answer()
            assert password not in cache.stats().where  # what `cache stats` shows
        # A wrong password is a mistake in the command: one sentence, neither password.
        wrong_password = "wrong-" + "x" * 20
        wrong = StateURL.parse(server.url.replace(password, wrong_password))
        with pytest.raises(UsageError) as info:
            open_shared_cache(wrong)
        said = str(info.value)
        assert "refused this URL's credentials" in said
        assert password not in said and wrong_password not in said
        assert SECRETS.masker().text(password) != password
    SECRETS.forget()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("http://127.0.0.1:6379/0", "not a state server address"),
        ("rediss://", "names no host"),
        ("redis://127.0.0.1:port/0", "port that is not a number"),
        ("redis://127.0.0.1:6379/zero", "the database after the / is a number"),
        ("unix://", "names no socket"),
        ("redsi://h:1/0", "did you mean"),
    ],
)
def test_a_bad_address_is_one_sentence(text: str, said: str) -> None:
    with pytest.raises(UsageError) as info:
        StateURL.parse(text)
    assert said in str(info.value).lower() and "--state" in str(info.value)


def test_the_environment_names_the_server_when_no_option_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONDUCTOR_STATE_URL", raising=False)
    assert state_url_from(None) is None
    monkeypatch.setenv("CONDUCTOR_STATE_URL", "redis://10.0.0.5:6379/2")
    assert state_url_from(None) == StateURL("redis://10.0.0.5:6379/2")
    assert state_url_from("redis://h:1/0") == StateURL("redis://h:1/0")
    monkeypatch.setenv("CONDUCTOR_STATE_URL", "ftp://x")
    with pytest.raises(UsageError, match="CONDUCTOR_STATE_URL"):
        state_url_from(None)


# --- the commands ---------------------------------------------------------------------


def test_two_hosts_naming_one_server_pay_a_call_once(
    server: RedisServer, fake_server: FakeLLMServer, tmp_path: Path
) -> None:
    """Two `conductor ask` processes, each with a cache directory of its own (two hosts),
    one state server: the second is answered from the first's calls; without --state
    (the positive control) it asks the provider again."""
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer it."], [[]]))
    fake_server.script("w0", "The answer is 4.")
    pool = make_pool_file(tmp_path, fake_server, n=1)

    def ask(host: str, *state: str) -> None:
        env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / host), "OPENAI_API_KEY": "sk-fake"}
        done = run_cli("ask", "What is 2 + 2?", "--pool", str(pool), *state, env=env)
        assert done.returncode == 0, done.stderr
        assert "The answer is 4." in done.stdout

    ask("host-a", "--state", server.url)
    assert len(fake_server.requests) == 2  # the plan and the one step
    ask("host-b", "--state", server.url)
    assert len(fake_server.requests) == 2  # both from the shared cache
    ask("host-c")
    assert len(fake_server.requests) == 4  # a host of its own asks again
    done = run_cli("cache", "stats", "--state", server.url)
    assert "entries:   2" in done.stdout and server.url in done.stdout, done.stdout
    assert "server:" in done.stdout and "directory:" not in done.stdout


def test_bench_and_serve_take_the_state_server(
    server: RedisServer, fake_server: FakeLLMServer, tmp_path: Path
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer it."], [[]]))
    fake_server.script("w0", "The answer is 4.")
    pool = make_pool_file(tmp_path, fake_server, n=1)
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "a"), "OPENAI_API_KEY": "sk-fake"}
    args = ["bench", "smoke", "--pool", str(pool), "--strategy", "single:w0", "--limit", "3"]
    first = run_cli(*args, "--out", str(tmp_path / "r1"), "--state", server.url, env=env)
    assert first.returncode == 0, first.stderr
    asked = len(fake_server.requests)
    env["CONDUCTOR_CACHE_DIR"] = str(tmp_path / "b")
    env["CONDUCTOR_STATE_URL"] = server.url  # the environment, not the option
    again = run_cli(*args, "--out", str(tmp_path / "r2"), env=env)
    assert again.returncode == 0, again.stderr
    assert len(fake_server.requests) == asked == 3
    bad = run_cli(*args, "--out", str(tmp_path / "r3"), "--state", "http://x:1/0", env=env)
    assert bad.returncode == 2 and "not a state server address" in bad.stderr
    refused = run_cli("serve", "--pool", str(pool), "--state", "redis://:nope-wrong-pw@127.0.0.1:"
                      f"{server.port}/0", "--port", "0", env=env)  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "nope-wrong-pw" not in refused.stderr + refused.stdout
