"""The call cache's writes made behind the caller (:mod:`conductor.llm.cache`): seen at
once, committed in batches by one thread, bounded, flushed on close and at exit, and a
fault of the disk raised where the caller can stop on it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from kit.cachefaults import full_after
from kit.clock import scaled
from kit.poolkit import pool_dict, worker, write_pool

from conductor.errors import CacheError
from conductor.llm import cache as cache_module
from conductor.llm.cache import ResponseCache
from conductor.llm.types import RawCompletion, Usage
from conductor.testing import FakeLLMServer

SRC = Path(__file__).resolve().parents[1] / "src"


def answer(i: int) -> RawCompletion:
    return RawCompletion(f"answer {i}", Usage(1, 1), {})


class Gate:
    """Holds the writer thread inside its transaction until opened; counts the
    transactions and the threads that wrote."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import diskcache

        self.open = threading.Event()
        self.transactions = 0
        self.writers: set[str] = set()
        real_transact = diskcache.Cache.transact
        real_set = diskcache.Cache.set
        gate = self

        def transact(self: Any, *args: Any, **kw: Any) -> Any:
            gate.open.wait(30)
            gate.transactions += 1
            return real_transact(self, *args, **kw)

        def set_(self: Any, *args: Any, **kw: Any) -> Any:
            gate.writers.add(threading.current_thread().name)
            return real_set(self, *args, **kw)

        monkeypatch.setattr(diskcache.Cache, "transact", transact)
        monkeypatch.setattr(diskcache.Cache, "set", set_)


def test_a_value_set_is_read_back_before_it_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    with ResponseCache(tmp_path) as cache:
        cache.set("k", answer(1))
        cache.set_value("sample", {"line": "x"})
        # The writer is held: nothing is on disk, yet both are seen.
        hit = cache.get("k")
        assert hit is not None and hit.text == "answer 1"
        assert cache.get_value("sample") == {"line": "x"}
        with ResponseCache(tmp_path, write_behind=False) as other:
            assert other.get("k") is None
        gate.open.set()
        cache.flush()
        with ResponseCache(tmp_path, write_behind=False) as other:
            assert other.get("k") is not None and other.get_value("sample") == {"line": "x"}


def test_writes_are_committed_in_batches_by_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    n = 3 * cache_module.WRITE_BATCH
    with ResponseCache(tmp_path) as cache:
        for i in range(n):
            cache.set(f"k{i}", answer(i))
        gate.open.set()
        cache.flush()
        # Held while the first entry waited: the rest gathered behind it.
        assert gate.transactions <= n // cache_module.WRITE_BATCH + 2
        assert gate.writers == {"conductor-cache-writer"}
        assert cache.stats().entries == n
        assert cache.get(f"k{n - 1}").text == f"answer {n - 1}"  # type: ignore[union-attr]


def test_a_full_queue_makes_the_writer_wait_for_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    monkeypatch.setattr(cache_module, "WRITE_QUEUE", 8)
    with ResponseCache(tmp_path) as cache:
        done = threading.Event()

        def fill() -> None:
            for i in range(40):
                cache.set(f"k{i}", answer(i))
            done.set()

        filler = threading.Thread(target=fill)
        filler.start()
        # Held writer: the filler stops once 8 wait (and one more is being written).
        assert not done.wait(0.5)
        gate.open.set()
        assert done.wait(30)
        filler.join()
        cache.flush()
        assert cache.stats().entries == 40


def test_a_fault_of_the_writer_is_raised_by_the_next_write_and_by_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_after(monkeypatch, 0)
    cache = ResponseCache(tmp_path)
    cache.set("k0", answer(0))  # handed over: the writer fails on it
    with pytest.raises(CacheError) as info:
        cache.flush()
    assert "database or disk is full" in str(info.value) and not info.value.corrupt
    with pytest.raises(CacheError):
        cache.set("k1", answer(1))
    # Reported already: closing does not raise it a second time.
    cache.close()


def test_a_fault_nobody_was_told_of_is_raised_on_closing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_after(monkeypatch, 0)
    cache = ResponseCache(tmp_path)
    cache.set("k0", answer(0))
    with pytest.raises(CacheError):
        cache.close()
    cache.close()  # closed once: a second close does nothing


def test_one_value_that_cannot_be_stored_is_left_out_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="conductor")
    with ResponseCache(tmp_path) as cache:
        cache.set_value("good-1", {"n": 1})
        cache.set_value("bad", {"n": threading.Lock()})  # cannot be pickled
        cache.set_value("good-2", {"n": 2})
        cache.flush()
    with ResponseCache(tmp_path, write_behind=False) as cache:
        assert cache.get_value("good-1") == {"n": 1} and cache.get_value("good-2") == {"n": 2}
        assert cache.get_value("bad") is None
    assert "could not be written" in caplog.text


@pytest.mark.process
def test_a_process_that_never_closes_its_cache_still_writes_it(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from conductor.llm.cache import ResponseCache
        from conductor.llm.types import RawCompletion, Usage
        cache = ResponseCache({str(tmp_path)!r})
        for i in range(2000):
            cache.set(f"k{{i}}", RawCompletion(f"answer {{i}}", Usage(1, 1), {{}}))
        sys.exit(0)  # no close: the exit hook writes what is held
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=scaled(120))
    with ResponseCache(tmp_path, write_behind=False) as cache:
        assert cache.stats().entries == 2000


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_waits_for_the_writer_nor_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    cache = ResponseCache(tmp_path)
    cache.set("k", answer(1))  # held: pending when the child is forked
    pid = os.fork()
    if pid == 0:  # the child: closing its copy must return at once
        try:
            cache.close()
        finally:
            os._exit(0)
    # The child exits although the writer it copied is held (and absent in it).
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    gate.open.set()
    cache.close()
    with ResponseCache(tmp_path, write_behind=False) as other:
        assert other.stats().entries == 1


def test_without_write_behind_each_write_is_committed_at_once(tmp_path: Path) -> None:
    with ResponseCache(tmp_path, write_behind=False) as cache:
        cache.set("k", answer(1))
        with ResponseCache(tmp_path, write_behind=False) as other:
            assert other.get("k") is not None
        assert not any(t.name == "conductor-cache-writer" for t in threading.enumerate())


def test_a_bench_writes_its_caches_from_the_writer_thread_only(
    tmp_path: Path, fake_server: FakeLLMServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conductor.cli import main

    gate = Gate(monkeypatch)
    gate.open.set()
    fake_server.set_default(lambda r: "ANSWER: 4")
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    out = tmp_path / "run"
    code = 0
    try:
        main(["bench", "smoke", "--pool", str(pool), "--strategy", "single:w0",
              "--out", str(out)])  # fmt: skip
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 0
    # 20 calls and 20 samples, none written on the event loop's thread.
    assert gate.writers == {"conductor-cache-writer"}
    with ResponseCache(cache_dir, write_behind=False) as cache:
        assert cache.stats().entries == 40
