"""The on-disk cache: keys, values, several processes at once, clearing."""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.types import ModelRequest, RawCompletion, Usage
from conductor.private import default_cache_dir
from conductor.targets import Worker

W = Worker(id="w", model="openai/gpt-4o", api_base="http://localhost:1/v1")
REQ = ModelRequest(
    messages=({"role": "user", "content": "hi"},), params={"temperature": 0.2, "max_tokens": 9}
)


def test_key_covers_everything_that_decides_a_reply() -> None:
    base = cache_key(W, REQ)
    variants = [
        cache_key(replace(W, model="openai/gpt-4o-mini"), REQ),
        cache_key(replace(W, api_base="http://other:1/v1"), REQ),
        cache_key(replace(W, client="openai"), REQ),
        cache_key(W, replace(REQ, messages=({"role": "user", "content": "hi!"},))),
        cache_key(W, replace(REQ, params={"temperature": 0.3, "max_tokens": 9})),
        cache_key(W, replace(REQ, sample_index=1)),
        cache_key(W, replace(REQ, grammar='root ::= "x"')),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # Not part of the key: the worker's id or its key variable's name.
    assert cache_key(replace(W, id="other", api_key_env="X_KEY"), REQ) == base
    # Parameter order does not matter.
    assert cache_key(W, replace(REQ, params={"max_tokens": 9, "temperature": 0.2})) == base


def test_round_trip_and_clear(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    value = RawCompletion("hello", Usage(3, 1), {"id": "x"}, model="m", finish_reason="stop")
    cache.set("k", value)
    assert cache.get("k") == value
    assert cache.get("missing") is None
    stats = cache.stats()
    assert stats.entries == 1 and stats.oldest is not None
    assert cache.clear(older_than_s=3600) == 0
    assert cache.clear() == 1
    assert cache.get("k") is None
    cache.close()


def test_default_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("CONDUCTOR_CACHE_DIR")
    assert default_cache_dir().name == "calls"


def _writer(directory: str, worker: int, n: int) -> None:
    cache = ResponseCache(directory)
    for i in range(n):
        cache.set(f"{worker}-{i}", RawCompletion(f"v{worker}-{i}", Usage(i, i), {}))
        # Read what the other process wrote so far, to interleave reads and writes.
        cache.get(f"{1 - worker}-{i}")
    cache.close()


@pytest.mark.process
def test_several_processes_share_one_cache(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 150)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ResponseCache(tmp_path)
    assert cache.stats().entries == 300
    got = cache.get("1-149")
    assert got is not None and got.text == "v1-149"
    cache.close()


def test_the_cache_is_a_context_manager_that_closes(tmp_path: Path) -> None:
    value = RawCompletion("hello", Usage(3, 1), {"id": "x"}, model="m", finish_reason="stop")
    with ResponseCache(tmp_path) as cache:
        cache.set("k", value)
        inner = cache._store._cache  # type: ignore[attr-defined]
    # diskcache closes its SQLite connection on close(); the entry is on disk for the next.
    assert not getattr(inner._local, "con", None)
    with ResponseCache(tmp_path) as again:
        assert again.get("k") == value
