"""``conductor serve``'s core, end to end: an in-process server (``serve_in_thread``)
whose workers and Conductor are on the fake provider server, asked over real HTTP.

The full client suite (the openai SDK, litellm, every error status, load, SIGTERM,
nesting) is in the serve test files; these pin the behaviour the implementation owns:
what the orchestration is asked, what the answer and usage hold, the records, the
stream's shape and the CLI's start-up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool  # noqa: E402

from conductor.pool import load_pool  # noqa: E402
from conductor.serve import ServeSettings, serve_in_thread  # noqa: E402
from conductor.serve._conversation import question_text  # noqa: E402
from conductor.serve._protocol import ChatMessage  # noqa: E402
from conductor.testing import FakeLLMServer, Fault, Reply  # noqa: E402

PLAN = lists([0, 1], ["Solve it", "Check and answer"], [[], [0]])


def _pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    return write_pool(
        tmp_path / "pool.yaml",
        pool_dict(server, [worker(server, "w0"), worker(server, "w1")]),
    )


@pytest.fixture
def scripted(fake_server: FakeLLMServer) -> FakeLLMServer:
    fake_server.script(CONDUCTOR_MODEL, [PLAN])
    fake_server.script("w0", [Reply("w0 thinks 391", input_tokens=10, output_tokens=4)])
    fake_server.script("w1", [Reply("ANSWER: 391", input_tokens=20, output_tokens=3)])
    return fake_server


@pytest.fixture
def served(tmp_path: Path, scripted: FakeLLMServer) -> Iterator[tuple[str, Path]]:
    settings = ServeSettings(
        pool=load_pool(_pool(tmp_path, scripted)),
        records_dir=tmp_path / "records",
        use_cache=False,
    )
    with serve_in_thread(settings) as url:
        yield url, tmp_path / "records"


def _ask(url: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, timeout=30, **kw)


@pytest.mark.process
def test_a_completion_answers_with_usage_records_and_the_workflow(
    served: tuple[str, Path], scripted: FakeLLMServer
) -> None:
    url, records = served
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 17 * 23?"},
    ]
    res = _ask(url, {"model": "conductor", "messages": messages})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "ANSWER: 391",
        "refusal": None,
    }
    run_id = res.headers["x-conductor-run-id"]
    assert body["id"] == f"chatcmpl-{run_id}"
    assert body["conductor"]["run_ids"] == [run_id]
    # Usage is every call's: the Conductor's (word counts) and both workers'.
    conductor_call = scripted.requests_for(CONDUCTOR_MODEL)[0]
    assert body["usage"]["prompt_tokens"] > 30
    assert body["usage"]["completion_tokens"] == 7 + len(PLAN.split())
    assert body["usage"]["total_tokens"] == sum(
        body["usage"][k] for k in ("prompt_tokens", "completion_tokens")
    )
    steps = body["conductor"]["runs"][0]["workflow"]["rounds"][0]["steps"]
    assert [(s["worker"], s["sees"], s["status"]) for s in steps] == [
        ("w0", [], "ok"),
        ("w1", [0], "ok"),
    ]
    # The system message reached the orchestration as part of the question.
    sent = json.dumps(conductor_call.messages)
    assert "Answer briefly." in sent and "What is 17 * 23?" in sent
    # The record is in DIR/samples.jsonl under the run id, and trace finds it.
    lines = (records / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [run_id]
    assert json.loads(lines[0])["sample_id"] == run_id
    shown = subprocess.run(
        [sys.executable, "-m", "conductor", "trace", str(records), "--sample", run_id],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert shown.returncode == 0, shown.stderr
    assert "w1" in shown.stdout


def test_a_stream_sends_role_content_finish_usage_and_done(served: tuple[str, Path]) -> None:
    url, _ = served
    body = {
        "model": "conductor",
        "messages": [{"role": "user", "content": "What is 17 * 23?"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "conductor": {"progress": True},
    }
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=30) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        run_id = res.headers["x-conductor-run-id"]
        data = [line[6:] for line in res.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    events = [c["conductor"]["event"]["kind"] for c in chunks if "event" in c.get("conductor", {})]
    assert events[:2] == ["conductor_started", "conductor_finished"]
    assert "workflow" in events and events.count("step_finished") == 2
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "ANSWER: 391"
    finish = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert finish[0]["conductor"]["run_ids"] == [run_id]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_plain_streams_carry_no_progress_and_n_runs_are_independent(
    served: tuple[str, Path], scripted: FakeLLMServer
) -> None:
    url, records = served
    body = {"model": "single:w1", "messages": [{"role": "user", "content": "hi"}], "n": 3}
    res = _ask(url, body)
    assert res.status_code == 200, res.text
    assert [c["index"] for c in res.json()["choices"]] == [0, 1, 2]
    ids = res.headers["x-conductor-run-id"].split(",")
    assert len(set(ids)) == 3
    assert len(scripted.requests_for("w1")) == 3
    assert len((records / "samples.jsonl").read_text().splitlines()) == 3
    with httpx.stream(
        "POST", f"{url}/chat/completions", json={**body, "n": 1, "stream": True}, timeout=30
    ) as res:
        data = [line[6:] for line in res.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["choices"] for c in chunks)
    # ...and the stream is the answer (an empty stream would carry no progress either).
    assert data[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "ANSWER: 391"


def test_errors_have_openai_shape(served: tuple[str, Path], scripted: FakeLLMServer) -> None:
    url, _ = served
    msgs = [{"role": "user", "content": "q"}]
    res = _ask(url, {"model": "nope", "messages": msgs})
    assert res.status_code == 400
    assert res.json()["error"]["code"] == "model_not_found"
    res = _ask(url, {"model": "conductor", "messages": msgs, "tools": [{"type": "function"}]})
    assert res.status_code == 400 and res.json()["error"]["param"] == "tools"
    res = httpx.post(f"{url}/chat/completions", content=b"{not json", timeout=10)
    assert res.status_code == 400 and set(res.json()["error"]) >= {"message", "type", "code"}
    scripted.script("w0", [Fault(400, "bad request from w0")])
    res = _ask(url, {"model": "single:w0", "messages": msgs})
    assert res.status_code == 502
    error = res.json()["error"]
    assert error["code"] == "orchestration_failed" and "bad request from w0" in error["message"]


def test_models_list_the_conductor_and_baselines(served: tuple[str, Path]) -> None:
    url, _ = served
    data = httpx.get(f"{url}/models", timeout=10).json()["data"]
    ids = [m["id"] for m in data]
    assert ids[:3] == ["conductor", "single:w0", "single:w1"]
    assert "moa" in ids and "vote:K:W" not in ids and "reflect:K:W" not in ids
    assert {m["conductor"]["pool"] for m in data} == {"fake"}


def test_the_conversation_is_one_deterministic_question() -> None:
    one = (ChatMessage("user", "Hi?"),)
    assert question_text(one) == "Hi?"
    chat = (
        ChatMessage("system", "Be terse."),
        ChatMessage("user", "What is 2+2?"),
        ChatMessage("assistant", "4"),
        ChatMessage("user", "And times 3?"),
    )
    assert question_text(chat) == (
        "Instructions:\nBe terse.\n\n"
        "Conversation so far:\nUser: What is 2+2?\n\nAssistant: 4\n\n"
        "Question:\nAnd times 3?"
    )


@pytest.mark.process
def test_the_cli_listens_answers_and_exits_0_on_sigterm(
    tmp_path: Path, scripted: FakeLLMServer
) -> None:
    pool = _pool(tmp_path, scripted)
    env = {**os.environ, "SERVE_TOKEN": "s3cret", "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    args = ["--pool", str(pool), "--port", "0", "--api-key-env", "SERVE_TOKEN"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor", "serve", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"http://\S+/v1", line)
        assert match, line
        assert "(pool fake)" in line
        url = match.group(0)
        msgs = [{"role": "user", "content": "What is 17 * 23?"}]
        assert _ask(url, {"model": "conductor", "messages": msgs}).status_code == 401
        ok = _ask(
            url,
            {"model": "conductor", "messages": msgs},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200, ok.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=scaled(30)) == 0
        rest = proc.stderr.read()
        assert "Traceback" not in rest and "ERROR" not in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.process
def test_the_cli_refuses_a_bad_conductor_or_unset_key_before_listening(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = _pool(tmp_path, fake_server)
    for extra, needle in (
        (["--conductor", "bogus-spec"], "bogus-spec"),
        (["--api-key-env", "NO_SUCH_VAR_SET"], "NO_SUCH_VAR_SET"),
    ):
        env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_VAR_SET"}
        res = subprocess.run(
            [sys.executable, "-m", "conductor", "serve", "--pool", str(pool), *extra],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            env=env,
        )
        assert res.returncode == 2, res.stderr
        assert needle in res.stderr and "listening" not in res.stderr


def _slow_server(tmp_path: Path, server: FakeLLMServer, **settings: Any) -> Any:
    server.script(CONDUCTOR_MODEL, [PLAN])
    server.script("w0", [Reply("w0 thinks 391", latency_s=3.0)])
    server.script("w1", ["ANSWER: 391"])
    return serve_in_thread(
        ServeSettings(
            pool=load_pool(_pool(tmp_path, server)),
            records_dir=tmp_path / "records",
            use_cache=False,
            **settings,
        )
    )


@pytest.mark.long
@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_run(
    tmp_path: Path, fake_server: FakeLLMServer, stream: bool
) -> None:
    body = {"model": "conductor", "messages": [{"role": "user", "content": "q"}], "stream": stream}
    with _slow_server(tmp_path, fake_server) as url:
        # A stream's role chunk comes at once; reading the rest times out as well.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=httpx.Timeout(10, read=1))
        samples = tmp_path / "records" / "samples.jsonl"
        deadline = time.monotonic() + 10
        while not samples.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3.5)  # past w0's reply: a run still going would now call w1
    record = json.loads(samples.read_text())
    assert record["status"] == "failed"
    assert "interrupted" in json.dumps(record["rounds"][0]["steps"][0]["call"])
    assert fake_server.requests_for("w1") == []


@pytest.mark.long
def test_a_baseline_whose_client_leaves_keeps_its_record(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # moa:w1: w0 (slow) and w1 answer at once, then w1 aggregates; the client leaves
    # while w0 is still answering, so the aggregator is never asked.
    body = {"model": "moa:w1", "messages": [{"role": "user", "content": "q"}]}
    with _slow_server(tmp_path, fake_server) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=httpx.Timeout(10, read=1))
        samples = tmp_path / "records" / "samples.jsonl"
        deadline = time.monotonic() + 10
        while not samples.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(3.5)  # past w0's reply: a run still going would now ask the aggregator
    record = json.loads(samples.read_text())
    assert record["status"] == "failed" and record["strategy"] == "moa:w1"
    assert "interrupted" in json.dumps(record["rounds"][0]["steps"][0]["call"])
    asked = [r.last_user_message for r in fake_server.requests_for("w1")]
    assert len(asked) <= 1 and not any("Several models answered" in a for a in asked)


def test_a_streamed_baseline_shows_its_plan_before_its_steps(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["Paris", "Final: Paris"])
    fake_server.script("w1", ["Lyon"])
    settings = ServeSettings(pool=load_pool(_pool(tmp_path, fake_server)), use_cache=False)
    body = {
        "model": "moa",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "stream": True,
        "conductor": {"progress": True},
    }
    with (
        serve_in_thread(settings) as url,
        httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=30) as res,
    ):
        assert res.status_code == 200
        data = [line[6:] for line in res.iter_lines() if line.startswith("data: ")]
    events = [
        c["conductor"]["event"]
        for c in map(json.loads, data[:-1])
        if "event" in c.get("conductor", {})
    ]
    kinds = [e["kind"] for e in events]
    assert kinds.index("workflow") < kinds.index("step_started")
    (workflow,) = [e for e in events if e["kind"] == "workflow"]
    assert workflow["round"] == 0 and workflow["choice"] == 0
    given = "(the task as given)"
    assert [(s["worker"], s["access"]) for s in workflow["steps"]] == [
        ("w0", []), ("w1", []), ("w0", [0, 1]),
    ]  # fmt: skip
    assert [s["subtask"] for s in workflow["steps"]][:2] == [given, given]


@pytest.mark.long
def test_a_full_queue_answers_429_with_retry_after(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    body = {"model": "single:w0", "messages": [{"role": "user", "content": "q"}]}
    slow = _slow_server(tmp_path, fake_server, max_concurrency=1, max_queue=0)
    with slow as url, httpx.Client(timeout=30) as client:
        first: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(client.post(f"{url}/chat/completions", json=body))
        )
        thread.start()
        while not fake_server.requests_for("w0"):
            time.sleep(0.02)
        busy = client.post(f"{url}/chat/completions", json=body)
        thread.join()
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "rate_limit_exceeded"
    assert "1 request is running and 0 are waiting" in busy.json()["error"]["message"]
    assert first[0].status_code == 200


@pytest.mark.long
def test_a_client_that_leaves_while_queued_never_starts_its_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    body = {"model": "single:w0", "messages": [{"role": "user", "content": "q"}]}
    with _slow_server(tmp_path, fake_server, max_concurrency=1) as url:
        first: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(
                _ask(url, {**body, "messages": [{"role": "user", "content": "first"}]})
            )
        )
        thread.start()
        while not fake_server.requests_for("w0"):
            time.sleep(0.02)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=httpx.Timeout(10, read=0.5))
        thread.join()
        time.sleep(0.5)  # the slot is free now: a queued run not cancelled would start
    assert first[0].status_code == 200
    assert [r.last_user_message for r in fake_server.requests_for("w0")] == ["first"]
