"""A bench run's traces as a real receiver stores them: an MLflow tracking server (its
OTLP/HTTP endpoint, ``/v1/traces``) started here on 127.0.0.1, read back with MLflow's
own client.

MLflow is large (about 850 MB with its dependencies), so it lives in a virtual
environment of its own, named by ``CONDUCTOR_MLFLOW_PYTHON`` (its python); CI's
``otel receiver`` step makes one.  Without it this test skips, saying so, unless
``CONDUCTOR_REQUIRE_RECEIVER=1`` makes that a failure.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.benchkit import boxed_number, make_math_file
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, worker, write_pool

from conductor.testing import FakeLLMServer, Fault

pytestmark = pytest.mark.process

MLFLOW_PYTHON = os.environ.get("CONDUCTOR_MLFLOW_PYTHON")
QUERY = Path(__file__).parent / "kit" / "mlflow_query.py"


def _need_mlflow() -> str:
    if MLFLOW_PYTHON and Path(MLFLOW_PYTHON).is_file():
        return MLFLOW_PYTHON
    why = "CONDUCTOR_MLFLOW_PYTHON does not name the python of an MLflow installation"
    if os.environ.get("CONDUCTOR_REQUIRE_RECEIVER") == "1":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    python = _need_mlflow()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "mlflow.log").open("wb")
    proc = subprocess.Popen(
        [
            python, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + scaled(120)
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.close()
                pytest.fail(
                    "MLflow did not start:\n" + (tmp_path / "mlflow.log").read_text()[-3000:]
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _stored(url: str) -> list[dict[str, Any]]:
    python = _need_mlflow()
    done = subprocess.run(
        [python, str(QUERY), url, "0"], capture_output=True, text=True, timeout=scaled(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    traces: list[dict[str, Any]] = json.loads(done.stdout)
    return traces


def _wait_stored(url: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + scaled(60)
    while True:
        traces = _stored(url)
        if len(traces) >= n or time.monotonic() > deadline:
            return traces
        time.sleep(1)


def _render(spans: list[dict[str, Any]]) -> str:
    """The span tree as the receiver stored it, one span a line, indented by depth."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:
        children.setdefault(s["parent_id"], []).append(s)
    names = {s["span_id"]: s["name"] for s in spans}
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: (s["start_ns"], s["name"])):
            a = s["attributes"]
            took = (s["end_ns"] - s["start_ns"]) / 1e6
            extra = [f"{took:.0f} ms"]
            for key, label in (
                ("gen_ai.provider.name", "provider"),
                ("gen_ai.usage.input_tokens", "in"),
                ("gen_ai.usage.output_tokens", "out"),
                ("conductor.cost_usd", "usd"),
                ("conductor.grade.status", "grade"),
            ):
                if key in a:
                    extra.append(f"{label}={a[key]}")
            extra += [f"sees {names.get(link['span_id'], '?')}" for link in s["links"]]
            extra += [f"event {e['name']}" for e in s["events"]]
            lines.append("  " * depth + f"{s['name']}  [{', '.join(extra)}]")
            walk(s["span_id"], depth + 1)

    walk(None, 0)
    return "\n".join(lines)


def test_mlflow_stores_a_bench_run_as_one_trace_per_sample(
    tmp_path: Path, fake_server: FakeLLMServer, mlflow_server: str
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL, [lists([0, 1, 0], ["solve", "check", "combine"], [[], [0], [0, 1]])] * 20
    )
    fake_server.script("w0", boxed_number)
    # w1's first call is refused once (429) and retried: an event on its chat span.
    asked: list[object] = []

    def w1(request: Any) -> Any:
        asked.append(request)
        if len(asked) == 1:
            return Fault(429, "slow down", headers={"Retry-After": "0"})
        return boxed_number(request)

    fake_server.script("w1", w1)
    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    pool = write_pool(
        tmp_path / "pool.yaml",
        pool_dict(
            fake_server,
            [
                worker(fake_server, "w0", price=price),
                worker(fake_server, "w1", client="anthropic", price=price),
            ],
            price=price,
        ),
    )
    data = make_math_file(tmp_path / "m.jsonl", 3)
    out = tmp_path / "run"
    r = run_cli(
        "bench", "math500", "--pool", str(pool), "--data", str(data), "--out", str(out),
        "--concurrency", "1", "--otel", mlflow_server,
        # MLflow's first ingestion can take over the SDK's 10 s per request on a busy
        # machine (the batch is then not sent, and the run says so).
        env={
            "OTEL_EXPORTER_OTLP_HEADERS": "x-mlflow-experiment-id=0",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "120",
        },
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "traces: 30 of 30 spans (3 records) sent to" in r.stderr, r.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    traces = _wait_stored(mlflow_server, 3)
    assert len(traces) == 3
    by_run = {}
    for t in traces:
        (root,) = [s for s in t["spans"] if s["parent_id"] is None]
        by_run[root["attributes"]["conductor.run_id"]] = t["spans"]
    assert set(by_run) == {rec["run_id"] for rec in records}
    counts = []
    for rec in records:
        spans = by_run[rec["run_id"]]
        counts.append(len(spans))
        names = {s["span_id"]: s["name"] for s in spans}
        tree = sorted((s["name"], names.get(s["parent_id"])) for s in spans)
        assert tree == sorted(
            [
                ("invoke_workflow conductor", None),
                ("invoke_workflow conductor round 1", "invoke_workflow conductor"),
                (f"plan {CONDUCTOR_MODEL}", "invoke_workflow conductor round 1"),
                (f"chat {CONDUCTOR_MODEL}", f"plan {CONDUCTOR_MODEL}"),
                ("invoke_agent w0", "invoke_workflow conductor round 1"),
                ("chat w0", "invoke_agent w0"),
                ("invoke_agent w1", "invoke_workflow conductor round 1"),
                ("chat w1", "invoke_agent w1"),
                ("invoke_agent w0", "invoke_workflow conductor round 1"),
                ("chat w0", "invoke_agent w0"),
            ]
        )
        agents = sorted(
            (s for s in spans if s["name"].startswith("invoke_agent")),
            key=lambda s: s["attributes"]["conductor.step"],
        )
        ids = [a["span_id"] for a in agents]
        assert [sorted(link["span_id"] for link in a["links"]) for a in agents] == [
            [],
            [ids[0]],
            sorted(ids[:2]),
        ]
        root = next(s for s in spans if s["parent_id"] is None)
        assert root["attributes"]["gen_ai.operation.name"] == "invoke_workflow"
        assert root["attributes"]["conductor.sample_id"] == rec["sample_id"]
        assert root["attributes"]["gen_ai.usage.input_tokens"] == rec["totals"]["input_tokens"]
        assert root["attributes"]["conductor.cost_usd"] == pytest.approx(rec["totals"]["cost_usd"])
        step1 = rec["rounds"][0]["steps"][1]["call"]
        chat_w1 = next(s for s in spans if s["name"] == "chat w1")
        assert chat_w1["attributes"]["gen_ai.provider.name"] == "anthropic"
        assert chat_w1["attributes"]["gen_ai.usage.output_tokens"] == step1["output_tokens"]
        assert [e["name"] for e in chat_w1["events"]] == ["conductor.retry"] * len(step1["retries"])
        # Message contents were not asked for: none was stored.
        assert not any(k.startswith("gen_ai.input") for s in spans for k in s["attributes"])
    retried = [rec for rec in records if rec["rounds"][0]["steps"][1]["call"]["retries"]]
    assert len(retried) == 1
    shown = by_run[retried[0]["run_id"]]
    print(f"\nspans per question, as MLflow stored them: {counts}")
    print(f"the trace of sample {retried[0]['sample_id']} as MLflow stored it:")
    print(_render(shown))
