"""A local model's host process: its wire, and what happens when it dies.

The crashes here are real deaths of the host process (a signal sent to it, or a
wrapper command that dies the way llama.cpp does), seen by the parent through the
same pipes a segfault inside llama.cpp would close.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.poolkit import embedded_model_or_skip

from conductor.errors import LocalModelCrashedError
from conductor.llm.types import ModelRequest
from conductor.localmodel import models
from conductor.localmodel.host import HostOptions, decode, encode, resolve_extra_buffers
from conductor.localmodel.models import crash_sentence
from conductor.targets import Worker

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture(autouse=True)
def _fresh_hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts its own hosts and remembers crashes in its own cache."""
    monkeypatch.setenv("CONDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", raising=False)
    monkeypatch.delenv("CONDUCTOR_LOCAL_HOST_PREFIX", raising=False)
    models.stop_all()
    yield
    models.stop_all()


def _client(worker_id: str = "w", **kwargs: Any) -> Any:
    from conductor.llm.local_client import LocalClient

    embedded_model_or_skip()
    return LocalClient(Worker(id=worker_id, model="smollm2", client="local", **kwargs))


def _request(text: str, **params: Any) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},), params=params)


LONG = {"max_tokens": 300, "temperature": 0.0}


async def _kill_while_generating(client: Any, sig: int) -> Any:
    """Start a long call, send ``sig`` to the host once it is generating, return the
    call's outcome (its reply, or the exception)."""
    host = await client._loaded()
    call = asyncio.create_task(client.send(_request("Count from 1 to 300.", **LONG), timeout_s=300))
    while not host._pending or all(p.started is None for p in host._pending.values()):
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    os.kill(host.pid, sig)
    try:
        return await call
    except Exception as exc:
        return exc


# -- the wire and the words, no model -----------------------------------------------


def test_messages_survive_the_wire() -> None:
    message = {"op": "generate", "id": 3, "messages": [{"role": "user", "content": "é\n✓"}]}
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line, whatever the text
    assert decode(line) == message
    with pytest.raises(ValueError):
        decode(b"[1, 2]\n")


def test_extra_buffers_are_used_only_where_they_are_not_known_to_crash() -> None:
    assert resolve_extra_buffers("auto", has_amx=False, crashed=False) is True
    assert resolve_extra_buffers("auto", has_amx=True, crashed=False) is False
    assert resolve_extra_buffers("auto", has_amx=False, crashed=True) is False
    assert resolve_extra_buffers("on", has_amx=True, crashed=True) is True
    assert resolve_extra_buffers("off", has_amx=False, crashed=False) is False


def test_each_way_of_dying_gets_its_own_sentence() -> None:
    segv = crash_sentence(
        -signal.SIGSEGV, model="m.gguf", runtime="cyllama", stderr="x\ny\nz", extra_buffers=True
    )
    assert "crashed inside llama.cpp (SIGSEGV)" in segv
    assert "CONDUCTOR_LOCAL_EXTRA_BUFFERS=off" in segv
    assert "(CONDUCTOR_LOCAL_RUNTIME=llama-cpp-python)" in segv
    assert segv.endswith("its last words: x | y | z")
    plain = crash_sentence(-signal.SIGBUS, model="m", runtime="llama-cpp-python", stderr="")
    assert "EXTRA_BUFFERS" not in plain and "(CONDUCTOR_LOCAL_RUNTIME=cyllama)" in plain
    ill = crash_sentence(-signal.SIGILL, model="m.gguf", runtime="cyllama", stderr="")
    assert "instruction this CPU does not have (SIGILL)" in ill and "AVX2" in ill
    assert "CONDUCTOR_LOCAL_RUNTIME=llama-cpp-python" in ill
    ill_source = crash_sentence(-signal.SIGILL, model="m", runtime="llama-cpp-python", stderr="")
    assert "--force-reinstall" in ill_source
    oom = crash_sentence(-signal.SIGKILL, model="m.gguf", runtime=None, stderr="")
    assert "out-of-memory" in oom
    assert "exit code 3" in crash_sentence(3, model="m", runtime=None, stderr="")
    windows = crash_sentence(0xC0000005, model="m", runtime=None, stderr="")
    assert "an access violation" in windows


def test_host_options_go_over_the_command_line_and_back() -> None:
    from conductor.localmodel.host import _arguments

    options = HostOptions(
        path="/m.gguf",
        n_ctx=512,
        n_threads=2,
        n_gpu_layers=3,
        extra_buffers="off",
        extra_buffers_crashed=True,
    )
    assert _arguments(options.argv()) == options


# -- the host dies ---------------------------------------------------------------------


@pytest.mark.process
async def test_a_crash_with_extra_buffers_on_is_survived_and_remembered(tmp_path: Path) -> None:
    client = _client()
    host = await client._loaded()
    assert host.ready["extra_buffers"] is True  # auto, on a CPU without AMX kernels
    first_pid = host.pid
    outcome = await _kill_while_generating(client, signal.SIGSEGV)
    # The call was sent again to a host started without them, and answered.
    assert not isinstance(outcome, Exception), outcome
    assert outcome.text.strip()
    assert host.pid != first_pid and host.ready["extra_buffers"] is False
    remembered = json.loads((tmp_path / "cache" / "local-model-crashes.json").read_text())
    (entry,) = remembered.values()
    assert entry["path"] == host.options.path and "SIGSEGV" in entry["crash"]
    # The next run on this machine loads without them from the start.
    models.stop_all()
    again = await _client()._loaded()
    assert again.ready["extra_buffers"] is False


@pytest.mark.process
async def test_a_crash_fails_the_call_in_one_sentence_and_the_next_call_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")
    client = _client()
    outcome = await _kill_while_generating(client, signal.SIGSEGV)
    assert isinstance(outcome, LocalModelCrashedError), outcome
    assert "crashed inside llama.cpp (SIGSEGV)" in str(outcome)
    assert outcome.retryable is False
    reply = await client.send(_request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=120)
    assert reply.text.strip()


@pytest.mark.process
async def test_every_call_waiting_on_a_dead_host_fails_and_none_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")
    client = _client()
    host = await client._loaded()
    calls = [
        asyncio.create_task(client.send(_request(f"Count to {n}.", **LONG), timeout_s=300))
        for n in (100, 200, 300)
    ]
    while len(host._pending) < 3 or all(p.started is None for p in host._pending.values()):
        await asyncio.sleep(0.02)
    os.kill(host.pid, signal.SIGKILL)
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, LocalModelCrashedError) for o in outcomes), outcomes
    assert all("out-of-memory" in str(o) for o in outcomes)


@pytest.mark.process
async def test_an_illegal_instruction_says_what_cpu_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")
    outcome = await _kill_while_generating(_client(), signal.SIGILL)
    assert isinstance(outcome, LocalModelCrashedError)
    assert "(SIGILL)" in str(outcome) and "CPU" in str(outcome)


def _dying_prefix(tmp_path: Path, *, unless: str | None = None) -> str:
    """A wrapper that makes the host die of SIGSEGV as it starts, as a crash while
    llama.cpp loads the model does (except when its command line holds ``unless``)."""
    script = tmp_path / "die.sh"
    survive = f'case "$*" in *{unless}*) exec "$@";; esac\n' if unless else ""
    script.write_text(f"#!/bin/sh\necho 'ggml: about to fall over' >&2\n{survive}kill -SEGV $$\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.process
async def test_a_crash_while_loading_is_tried_again_without_extra_buffers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(
        "CONDUCTOR_LOCAL_HOST_PREFIX", _dying_prefix(tmp_path, unless="--extra-buffers-crashed")
    )
    client = _client()
    reply = await client.send(_request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=120)
    assert reply.text.strip()
    assert client._host.ready["extra_buffers"] is False


@pytest.mark.process
async def test_a_host_that_always_dies_fails_at_once_after_a_few_tries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONDUCTOR_LOCAL_HOST_PREFIX", _dying_prefix(tmp_path))
    client = _client()
    with pytest.raises(LocalModelCrashedError) as info:
        await client.send(_request("Say yes.", max_tokens=4), timeout_s=120)
    assert "crashed inside llama.cpp (SIGSEGV)" in str(info.value)
    assert "about to fall over" in str(info.value)  # its last words, from its stderr


@pytest.mark.process
def test_ask_on_a_crashing_model_exits_1_with_one_sentence(tmp_path: Path) -> None:
    embedded_model_or_skip()
    env = {
        **os.environ,
        "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "CONDUCTOR_LOCAL_HOST_PREFIX": _dying_prefix(tmp_path),
        "COLUMNS": "120",
    }
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "ask", "What is 2 + 2?", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=scaled(300),
        env=env,
    )
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    assert "crashed inside llama.cpp (SIGSEGV)" in " ".join((res.stdout + res.stderr).split())


@pytest.mark.process
async def test_an_illegal_instruction_is_not_blamed_on_the_extra_buffers(tmp_path: Path) -> None:
    client = _client()
    host = await client._loaded()
    assert host.ready["extra_buffers"] is True
    outcome = await _kill_while_generating(client, signal.SIGILL)
    # Loading without them would die the same way: no second try, nothing remembered.
    assert isinstance(outcome, LocalModelCrashedError)
    assert not (tmp_path / "cache" / "local-model-crashes.json").exists()


@pytest.mark.process
def test_serve_on_the_local_pool_survives_a_crash_of_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx
    from kit.servekit import served

    from conductor.pool import load_pool

    embedded_model_or_skip()
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")  # no fallback: a real failure
    pool = load_pool(Path(__file__).resolve().parent.parent / "pools" / "local.yaml")
    body = {
        "model": "single:answerer",
        "messages": [{"role": "user", "content": "Count from 1 to 300."}],
        "max_tokens": 300,
    }
    with served(pool) as url, httpx.Client(base_url=url, timeout=300) as http:
        assert http.post("/chat/completions", json={**body, "max_tokens": 4}).status_code == 200
        (host,) = models.loaded_hosts()
        results: list[httpx.Response] = []
        call = threading.Thread(
            target=lambda: results.append(http.post("/chat/completions", json=body))
        )
        call.start()
        deadline = time.monotonic() + scaled(120)
        while not any(p.started for p in host._pending.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(host.pid, signal.SIGSEGV)
        call.join(120)
        (crashed,) = results
        assert crashed.status_code >= 500
        assert "crashed inside llama.cpp (SIGSEGV)" in crashed.text
        # The server is still there, and the next request starts a new model process.
        again = http.post("/chat/completions", json={**body, "max_tokens": 4})
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["message"]["content"].strip()


@pytest.mark.process
async def test_a_host_that_answered_is_restarted_after_each_later_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")
    client = _client()
    # More crashes than the restarts allowed in a row, each followed by an answer.
    for _ in range(models._MAX_RESTARTS + 2):
        outcome = await _kill_while_generating(client, signal.SIGSEGV)
        assert isinstance(outcome, LocalModelCrashedError)
        reply = await client.send(
            _request("Say yes.", max_tokens=4, temperature=0.0), timeout_s=120
        )
        assert reply.text.strip()


# -- embeddings over the wire (a router's gguf-mean-v1 features) ----------------------


@pytest.mark.process
def test_a_host_embeds_beside_generations_and_refuses_what_it_cannot_do() -> None:
    path = embedded_model_or_skip()
    host = models.get_host(path)
    talk = host.submit(
        {"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4,
         "sampling": {"temperature": 0.0}}
    )  # fmt: skip
    vectors = host.embed(["What is 17 * 23?", "Name a colour."], timeout_s=120)
    assert talk.result(timeout=scaled(120))["text"].strip()
    assert [len(v) for v in vectors] == [576, 576] and vectors[0] != vectors[1]
    assert host.embed(["What is 17 * 23?"], timeout_s=120) == vectors[:1]
    for request, op in (({}, "summon"), ({"texts": "What is 17 * 23?"}, "embed"),
                        ({"texts": [3]}, "embed")):  # fmt: skip
        with pytest.raises(models.HostFailure) as failed:
            host.submit(request, op=op).result(timeout=scaled(120))
        assert failed.value.kind == "bad_request", failed.value
    # A request cannot take another's id: the host answers this one, under its own.
    forged = host.submit({"texts": ["hello"], "id": 0, "op": "generate"}, op="embed")
    assert len(forged.result(timeout=scaled(120))["vectors"]) == 1


@pytest.mark.process
def test_a_crash_while_embedding_fails_the_embed_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not the extra buffers' fault: the calls the host held are not sent again.
    monkeypatch.setenv("CONDUCTOR_LOCAL_EXTRA_BUFFERS", "off")
    path = embedded_model_or_skip()
    host = models.get_host(path)
    future = host.submit({"texts": ["alpha " * 2000] * 20}, op="embed")
    while not host._pending or all(p.started is None for p in host._pending.values()):
        time.sleep(0.02)
    time.sleep(0.2)
    os.kill(host.pid, signal.SIGSEGV)
    with pytest.raises(LocalModelCrashedError, match="SIGSEGV"):
        future.result(timeout=scaled(120))
    # The next request starts the host again.
    assert len(host.embed(["Say yes."], timeout_s=120)[0]) == 576
