"""`conductor serve` as a user runs it (the real CLI in a child process): records that
`conductor trace` reads, SIGTERM with a request in flight, start-up errors, the API key
variable; and nesting, a pool whose worker is another `conductor serve`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, run_cli, write_pool
from kit.servekit import ServeProcess, make_pool, make_pool_file, served, wait_for

from conductor.pool import load_pool
from conductor.testing import FakeLLMServer, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "Capital of France?"}]


def ask(url: str, question: str = "Capital of France?", **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": "conductor", "messages": [{"role": "user", "content": question}]},
        headers=headers,
        timeout=60,
    )


@pytest.mark.process
def test_cli_listens_answers_and_records_are_traceable(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0, 1], ["Draft.", "Check."], [[], [0]]))
    fake_server.script("w0", "draft about Paris")
    fake_server.script("w1", "Final: Paris")
    pool = make_pool_file(tmp_path, fake_server)
    records = tmp_path / "records"
    with ServeProcess("--pool", str(pool), "--records", str(records), "--no-cache") as server:
        url = server.wait_url()
        # Exactly one "listening on" line, naming the pool.
        listening = [line for line in server.lines if "listening on" in line]
        assert len(listening) == 1 and "(pool fake)" in listening[0], server.stderr
        assert url.startswith("http://127.0.0.1:")
        first, second = ask(url, "Capital of France?"), ask(url, "Capital of Spain?")
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        run_ids = [r.headers["x-conductor-run-id"] for r in (first, second)]
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait() == 0, server.stderr
    # One last line says that it stopped, and how many requests it served.
    assert server.lines[-1].strip() == "conductor serve: stopped, after serving 2 requests"
    # One full run record per request, under its run id.
    lines = (records / "samples.jsonl").read_text().splitlines()
    saved = [json.loads(line) for line in lines]
    assert [r["sample_id"] for r in saved] == run_ids
    assert all(r["final_answer"] == "Final: Paris" for r in saved)
    listed = run_cli("trace", str(records))
    assert listed.returncode == 0, listed.stderr
    for run_id in run_ids:
        assert run_id in listed.stdout
    # Served runs have no gold answer: listed as ungraded, not as failed runs.
    assert "2 samples: 2 ungraded" in listed.stdout and "run_failed" not in listed.stdout
    shown = run_cli("trace", str(records), "--sample", run_ids[1])
    assert shown.returncode == 0, shown.stderr
    assert "Final: Paris" in shown.stdout and "w1" in shown.stdout
    assert run_ids[0] not in shown.stdout


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_finishes_the_request_in_flight(
    tmp_path: Path, fake_server: FakeLLMServer, sig: signal.Signals
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Reply("slow Paris", latency_s=2.0))
    pool = make_pool_file(tmp_path, fake_server)
    records = tmp_path / "records"
    with ServeProcess("--pool", str(pool), "--records", str(records), "--no-cache") as server:
        url = server.wait_url()
        result: dict[str, Any] = {}

        def request() -> None:
            try:
                result["resp"] = ask(url)
            except Exception as exc:  # reported by the assertion below
                result["error"] = exc

        thread = threading.Thread(target=request)
        thread.start()
        wait_for(lambda: fake_server.requests_for("w0"), what="w0 to be called")
        server.proc.send_signal(sig)
        thread.join(60)
        code = server.wait()
    assert "error" not in result, result
    resp = result["resp"]
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "slow Paris"
    assert code == 0, server.stderr
    assert server.lines[-1].strip() == "conductor serve: stopped, after serving 1 request"
    (saved,) = [json.loads(line) for line in (records / "samples.jsonl").read_text().splitlines()]
    assert saved["sample_id"] == resp.headers["x-conductor-run-id"]
    assert saved["final_answer"] == "slow Paris"


@pytest.mark.process
@pytest.mark.parametrize(
    "case",
    [
        "no-workers", "missing-file", "bad-conductor", "unset-key-env", "unusable-cache",
        "unusable-records",
    ],
)  # fmt: skip
def test_start_up_errors_exit_2_before_listening(
    tmp_path: Path, fake_server: FakeLLMServer, case: str
) -> None:
    good = make_pool_file(tmp_path, fake_server)
    args: list[str] = ["--pool", str(good)]
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_SERVE_TEST_KEY"}
    if case == "no-workers":
        bad = write_pool(tmp_path / "bad.yaml", {"name": "bad", "workers": []})
        args = ["--pool", str(bad)]
        needle = "bad.yaml"
    elif case == "missing-file":
        args = ["--pool", str(tmp_path / "nowhere.yaml")]
        needle = "nowhere"
    elif case == "bad-conductor":
        args += ["--conductor", "no-such-conductor-spec"]
        needle = "no-such-conductor-spec"
    elif case == "unset-key-env":
        args += ["--api-key-env", "CONDUCTOR_SERVE_TEST_KEY"]
        needle = "CONDUCTOR_SERVE_TEST_KEY"
    else:  # the call cache's directory, or --records, is a file
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("")
        if case == "unusable-cache":
            env["CONDUCTOR_CACHE_DIR"] = str(blocker)
        else:
            args += ["--records", str(blocker)]
        needle = "not-a-directory"
    # A server that started listening would never exit: the timeout fails the test.
    res = run_cli("serve", "--port", "0", *args, env=env, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "listening on" not in res.stderr
    assert needle.lower() in res.stderr.lower(), res.stderr
    assert "Traceback" not in res.stderr
    assert fake_server.requests == []


@pytest.mark.process
def test_cli_api_key_env(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", "Paris")
    pool = make_pool_file(tmp_path, fake_server)
    env = {"SERVE_TEST_BEARER": "bearer-secret-789"}
    with ServeProcess(
        "--pool", str(pool), "--api-key-env", "SERVE_TEST_BEARER", "--no-cache", env=env
    ) as server:
        url = server.wait_url()
        refused = ask(url, Authorization="Bearer nope")
        client = openai.OpenAI(base_url=url, api_key="bearer-secret-789", max_retries=0)
        reply = client.chat.completions.create(model="conductor", messages=QUESTION)  # type: ignore[arg-type]
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait() == 0
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert reply.choices[0].message.content == "Paris"
    assert "bearer-secret-789" not in server.stderr + server.stdout


def nested_worker(url: str, client: str, key_env: str | None = None) -> dict[str, Any]:
    """A worker that is another `conductor serve`'s Conductor."""
    entry: dict[str, Any] = {
        "id": "inner",
        "client": client,
        "model": "conductor",
        "api_base": url,
        "max_retries": 0,
        "timeout_s": 60,
    }
    if key_env:
        entry["api_key_env"] = key_env
    return entry


def script_nested(server: FakeLLMServer) -> None:
    # Two Conductors on one fake server: the outer plans a step for its only worker (the
    # inner server); the inner plans a step for w0, whose answer must come back out.
    server.script("outer-conductor", lists([0], ["Ask the inner team."], [[]]))
    server.script(CONDUCTOR_MODEL, lists([0], ["Answer it."], [[]]))
    server.script("w0", "inner answer: 42")


@pytest.mark.parametrize("client", ["http", "openai"])
def test_nested_serve_through_a_second_server(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    script_nested(fake_server)
    with served(make_pool(tmp_path, fake_server)) as inner_url:
        outer = load_pool(
            make_pool_file(
                tmp_path, fake_server, name="outer.yaml",
                workers=[nested_worker(inner_url, client)], model="outer-conductor",
            )
        )  # fmt: skip
        with served(outer) as outer_url:
            resp = ask(outer_url, "What is six times seven?")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "inner answer: 42"
    # The question travelled outer -> inner -> w0; each Conductor planned once.
    assert len(fake_server.requests_for("outer-conductor")) == 1
    (inner_plan,) = fake_server.requests_for(CONDUCTOR_MODEL)
    assert "What is six times seven?" in "\n".join(m["content"] for m in inner_plan.messages)
    (w0_call,) = fake_server.requests_for("w0")
    assert "What is six times seven?" in "\n".join(m["content"] for m in w0_call.messages)


@pytest.mark.process
def test_nested_serve_through_conductor_ask(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # The inner server wants a key; the outer pool's worker reads it from its variable.
    script_nested(fake_server)
    with served(make_pool(tmp_path, fake_server), api_key="inner-key-abc") as inner_url:
        outer = make_pool_file(
            tmp_path, fake_server, name="outer.yaml",
            workers=[nested_worker(inner_url, "http", key_env="INNER_SERVE_KEY")],
            model="outer-conductor",
        )  # fmt: skip
        res = run_cli(
            "ask", "--pool", str(outer), "--no-cache", "--json", "What is six times seven?",
            env={"INNER_SERVE_KEY": "inner-key-abc"},
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    assert record["final_answer"] == "inner answer: 42"
    assert len(fake_server.requests_for("w0")) == 1
    assert [s["worker_id"] for s in record["rounds"][0]["steps"]] == ["inner"]


@pytest.mark.process
def test_help_does_not_import_the_server_stack() -> None:
    # `conductor --help` stays instant: fastapi / uvicorn load only when serve runs.
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', [m for m in ('fastapi', 'uvicorn', 'starlette', 'conductor.serve')"
        " if m in sys.modules])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert "LOADED []" in res.stdout, res.stdout + res.stderr
    assert "serve" in res.stdout


@pytest.mark.process
def test_serve_help_lists_the_contract_options() -> None:
    res = run_cli("serve", "--help")
    assert res.returncode == 0, res.stderr
    for option in (
        "--pool", "--conductor", "--host", "--port", "--records", "--api-key-env",
        "--max-concurrency", "--max-queue", "--max-body-bytes", "--grace-s", "--no-cache",
        "--keys",
    ):  # fmt: skip
        assert option in res.stdout, option


@pytest.mark.process
def test_without_the_serve_extra_the_command_names_what_to_install(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # fastapi made unimportable in the child: the command must say which package to
    # install, by the name it is published under (it once said 'conductor[serve]').
    pool = str(make_pool_file(tmp_path, fake_server))
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "from conductor.cli import main\n"
        f"main(['serve', '--pool', {pool!r}, '--port', '0'])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert res.returncode == 2, res.stderr
    assert "pip install 'conductor-orchestrate[serve]'" in res.stderr
