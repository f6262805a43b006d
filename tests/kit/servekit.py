"""Helpers for the `conductor serve` tests: pools on the fake server, in-process servers
and the real CLI as a child process (shared by the test_serve*.py files)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from conductor.pool import Pool, load_pool
from conductor.testing import FakeLLMServer
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

URL_RE = re.compile(r"http://\S+/v1")


def make_pool_file(
    tmp_path: Path,
    server: FakeLLMServer,
    n: int = 2,
    name: str = "pool.yaml",
    workers: list[dict[str, Any]] | None = None,
    **conductor: Any,
) -> Path:
    """A pool file of ``n`` fake workers w0..w(n-1) (or ``workers``) on ``server``."""
    entries = workers if workers is not None else [worker(server, f"w{i}") for i in range(n)]
    return write_pool(tmp_path / name, pool_dict(server, entries, **conductor))


def make_pool(tmp_path: Path, server: FakeLLMServer, n: int = 2, **conductor: Any) -> Pool:
    return load_pool(make_pool_file(tmp_path, server, n, **conductor))


@contextmanager
def served(pool: Pool, **settings: Any) -> Iterator[str]:
    """An in-process `conductor serve` of ``pool``; yields ``http://127.0.0.1:PORT/v1``.

    The call cache is off unless asked for, so that counting the fake server's requests
    means what it says."""
    from conductor.serve import ServeSettings, serve_in_thread

    fields: dict[str, Any] = {
        "conductor": None,
        "records_dir": None,
        "api_key": None,
        "use_cache": False,
    }
    fields.update(settings)
    with serve_in_thread(ServeSettings(pool=pool, **fields)) as url:
        yield url


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds (a hang
    guard, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class ServeProcess:
    """``python -m conductor serve --port 0 ARGS`` as a user runs it.

    Waits for the one "listening on" line and takes the URL from it; a reader thread
    keeps draining stderr (kept in ``lines``) so the child never blocks on a full pipe.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        child = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conductor", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**child, **(env or {})},
        )
        self.lines: list[str] = []
        self.stdout = ""
        self._url_seen = threading.Event()
        self.url: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            match = URL_RE.search(line)
            if match and self.url is None:
                self.url = match.group(0)
                self._url_seen.set()
        self._url_seen.set()  # the child ended without listening

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_url(self, timeout: float = 60.0) -> str:
        """The URL the child listens on, waited for up to ``timeout`` seconds on an idle
        core (:func:`kit.clock.scaled`: a busy machine starts it slower)."""
        self._url_seen.wait(scaled(timeout))
        if self.url is None:
            self.stop()
            raise AssertionError(f"conductor serve did not listen; stderr:\n{self.stderr}")
        return self.url

    def wait(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(scaled(timeout))
        self._reader.join(10)
        self._out_reader.join(10)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def error_of(resp: httpx.Response, status: int = 400) -> dict[str, Any]:
    """The OpenAI-shaped error of ``resp``, after checking its status and shape."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert isinstance(error, dict)
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip()
    return error


def plan_two_steps(server: FakeLLMServer) -> None:
    """The Conductor plans w0 (a draft) then w1 (the answer, seeing the draft)."""
    server.script(CONDUCTOR_MODEL, lists([0, 1], ["Draft it.", "Answer."], [[], [0]]))
    server.script("w0", "draft: Paris")


def responses_at_once(url: str, token: str, model: str, n: int) -> list[Any]:
    """``n`` Responses requests for ``model`` sent at once through the real async openai
    SDK (no retries): each one's response, or the ``APIStatusError`` it was refused with."""
    import openai

    async def run() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key=token, max_retries=0)
        async with client:

            async def one(i: int) -> Any:
                try:
                    return await client.responses.create(model=model, input=f"Q{i}?")
                except openai.APIStatusError as exc:
                    return exc

            return list(await asyncio.gather(*(one(i) for i in range(n))))

    return asyncio.run(run())
