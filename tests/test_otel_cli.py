"""``--otel`` on ``ask``, ``bench`` and ``serve``, and ``conductor export otel``, end to
end: the spans reach an OTLP/HTTP receiver (decoded with OpenTelemetry's own protobuf
classes), a receiver that is down or refuses never fails a run, and a command that does
not trace imports nothing of OpenTelemetry."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import boxed_number, make_math_file
from kit.otlpkit import OtlpReceiver
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, worker, write_pool
from kit.records import make_record, make_round, step

from conductor.testing import FakeLLMServer

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")


def _script(server: FakeLLMServer) -> None:
    server.script(CONDUCTOR_MODEL, [lists([0, 1], ["solve", "check"], [[], [0]])] * 50)
    server.script("w0", boxed_number)
    server.script("w1", boxed_number)


def _pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    return write_pool(
        tmp_path / "pool.yaml",
        pool_dict(server, [worker(server, "w0"), worker(server, "w1", client="anthropic")]),
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(spans: list[Any]) -> list[tuple[str, str | None]]:
    names = {s.span_id: s.name for s in spans}
    return sorted((s.name, names.get(s.parent_id) if s.parent_id else None) for s in spans)


EXPECTED_TREE = sorted(
    [
        ("invoke_workflow conductor", None),
        ("invoke_workflow conductor round 1", "invoke_workflow conductor"),
        (f"plan {CONDUCTOR_MODEL}", "invoke_workflow conductor round 1"),
        (f"chat {CONDUCTOR_MODEL}", f"plan {CONDUCTOR_MODEL}"),
        ("invoke_agent w0", "invoke_workflow conductor round 1"),
        ("chat w0", "invoke_agent w0"),
        ("invoke_agent w1", "invoke_workflow conductor round 1"),
        ("chat w1", "invoke_agent w1"),
    ]
)


@pytest.mark.process
def test_bench_sends_each_sample_as_a_trace_and_export_replays_them(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    _script(fake_server)
    pool = _pool(tmp_path, fake_server)
    data = make_math_file(tmp_path / "m.jsonl", 3)
    out = tmp_path / "run"
    with OtlpReceiver() as live:
        r = run_cli(
            "bench", "math500", "--pool", str(pool), "--data", str(data), "--out", str(out),
            "--otel", live.url,
            env={"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a", "OTEL_SERVICE_NAME": ""},
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "traces: 24 of 24 spans (3 records) sent to" in r.stderr
    traces = live.traces()
    assert len(traces) == 3
    records = {
        json.loads(line)["run_id"] for line in (out / "samples.jsonl").read_text().splitlines()
    }
    for spans in traces.values():
        assert _tree(spans) == EXPECTED_TREE
        root = next(s for s in spans if s.parent_id is None)
        assert root.attributes["conductor.run_id"] in records
        assert root.attributes["conductor.benchmark"] == "math500"
        assert root.attributes["conductor.grade.status"] == "correct"
        assert root.resource["service.name"] == "conductor"
        w1 = next(s for s in spans if s.name == "invoke_agent w1")
        w0 = next(s for s in spans if s.name == "invoke_agent w0")
        assert w1.links == [(w0.span_id, {"conductor.link": "may_see", "conductor.step": 0})]
    # The OTLP headers the SDK reads reach the receiver.
    assert all(req.get("x-tenant") == "team-a" for req in live.requests)

    with OtlpReceiver() as replay:
        r = run_cli("export", "otel", str(out), env={"OTEL_EXPORTER_OTLP_ENDPOINT": replay.url})
    assert r.returncode == 0, r.stderr
    assert "traces: 24 of 24 spans (3 records) sent to" in r.stderr

    def times(t: dict[str, list[Any]]) -> list[Any]:
        return sorted(
            sorted((s.name, s.start_ns, s.end_ns, sorted(s.attributes.items())) for s in spans)
            for spans in t.values()
        )

    assert times(replay.traces()) == times(traces)


@pytest.mark.process
def test_export_sends_what_it_can_read_and_exits_1_for_the_rest(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    _script(fake_server)
    pool = _pool(tmp_path, fake_server)
    record = tmp_path / "ask.json"
    r = run_cli("ask", "What is 3 + 0?", "--pool", str(pool), "--out", str(record))
    assert r.returncode == 0, r.stderr
    samples = tmp_path / "served" / "samples.jsonl"
    samples.parent.mkdir()
    good = json.dumps(json.loads(record.read_text()))
    samples.write_text(good + "\n{not json\n" + json.dumps({"question": 5}) + "\n" + good + "\n")
    with OtlpReceiver() as receiver:
        r = run_cli("export", "otel", str(record), str(samples.parent), "--otel", receiver.url)
        assert r.returncode == 1
        assert "samples.jsonl:3" in r.stderr
        assert "2 records could not be read" in r.stderr
        assert len(receiver.traces()) == 3  # the ask record, and the two good lines
        r = run_cli("export", "otel", str(record), "--otel", receiver.url, "--sample", "nope")
        assert r.returncode == 2 and "no record with sample id" in r.stderr


@pytest.mark.process
def test_a_receiver_that_is_down_or_refuses_never_fails_the_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    _script(fake_server)
    pool = _pool(tmp_path, fake_server)
    env = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"}
    down = f"http://127.0.0.1:{_closed_port()}"
    r = run_cli("ask", "What is 3 + 0?", "--pool", str(pool), "--otel", down, env=env)
    assert r.returncode == 0, r.stderr
    assert "8 of 8 spans could not be sent to" in r.stderr
    with OtlpReceiver(status=400) as refusing:
        r = run_cli("ask", "What is 4 + 0?", "--pool", str(pool), "--otel", refusing.url)
    assert r.returncode == 0, r.stderr
    assert "8 of 8 spans could not be sent" in r.stderr and "400" in r.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--otel", "ftp://collector"], {}, "is not an http(s) URL"),
        (["--otel", "http://x:4318", "--no-otel"], {}, "contradict"),
        ([], {"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        (
            [],
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
            },
            "protocol",
        ),
        (
            [],
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "maybe",
            },
            "give true or false",
        ),
    ],
)
def test_tracing_settings_it_cannot_use_are_refused_before_any_call(
    tmp_path: Path, fake_server: FakeLLMServer, args: list[str], env: dict[str, str], said: str
) -> None:
    _script(fake_server)
    r = run_cli(
        "ask", "What is 3 + 0?", "--pool", str(_pool(tmp_path, fake_server)), *args, env=env
    )
    assert r.returncode == 2, r.stderr
    assert said in r.stderr
    assert not fake_server.requests


@pytest.mark.process
def test_export_needs_somewhere_to_send(tmp_path: Path) -> None:
    r = run_cli("export", "otel", str(tmp_path), env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""})
    assert r.returncode == 2 and "--otel URL" in r.stderr


@pytest.mark.process
def test_a_command_that_does_not_trace_imports_no_opentelemetry(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    _script(fake_server)
    pool = _pool(tmp_path, fake_server)
    r = run_cli("ask", "What is 3 + 0?", "--pool", str(pool), env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert r.returncode == 0, r.stderr
    assert "conductor.cli.ask" in r.stderr  # the import log is there
    # (The Anthropic SDK imports OpenTelemetry's API for tracing of its own; the SDK,
    # which sends spans, and conductor's tracing are not imported.)
    assert "opentelemetry.sdk" not in r.stderr
    assert "conductor.otel" not in r.stderr


@pytest.mark.process
def test_serve_traces_each_run_under_the_caller_s_trace(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    import openai
    from kit.servekit import make_pool, served

    from conductor.otel import otel_settings

    _script(fake_server)
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    with OtlpReceiver() as receiver:
        settings = otel_settings(receiver.url, env={})
        with served(make_pool(tmp_path, fake_server), otel=settings) as url:
            client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="conductor",
                messages=[{"role": "user", "content": "What is 5 + 0?"}],
                extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"},
            )
            run_id = raw.headers["x-conductor-run-id"]
        traces = receiver.traces()
    assert list(traces) == [trace_id]
    (root,) = [s for s in traces[trace_id] if s.parent_id == parent]
    assert root.name == "invoke_workflow conductor"
    assert root.attributes["conductor.run_id"] == run_id
    assert {s.name for s in traces[trace_id]} >= {"invoke_agent w0", "invoke_agent w1"}


@pytest.mark.process
def test_the_sending_process_dying_costs_the_run_only_its_spans(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    import os
    import signal

    from conductor.otel import open_tracer, otel_settings
    from conductor.record import read_record

    _script(fake_server)
    record_file = tmp_path / "ask.json"
    r = run_cli(
        "ask",
        "What is 3 + 0?",
        "--pool",
        str(_pool(tmp_path, fake_server)),
        "--out",
        str(record_file),
    )
    assert r.returncode == 0, r.stderr
    record = read_record(record_file)
    with OtlpReceiver() as receiver:
        settings = otel_settings(receiver.url, env={})
        assert settings is not None
        tracer = open_tracer(settings)
        for _ in range(3):
            tracer.emit(record)
        report = tracer.close()
        assert report.problem() is None and report.sent == 24
        assert len(receiver.traces()) == 3

        # A line the child cannot read costs that record only.
        tracer = open_tracer(settings)
        tracer.emit(record, line='{"run_id": "x", "question": ')
        tracer.emit(record, line="\t\n[]")
        tracer.emit(record, source="a\tb\nc\ud800")  # raw tab, newline, lone surrogate
        report = tracer.close()
        assert report.unplanned == 2 and report.sent == 8, report
        assert report.problem() is not None and "could not be read" in report.problem()
        assert len(receiver.traces()) == 4

        tracer = open_tracer(settings)
        tracer.emit(record)
        assert tracer.pid is not None
        os.kill(tracer.pid, signal.SIGKILL)
        for _ in range(5):
            tracer.emit(record)  # after the child died: dropped, never raised
        report = tracer.close()
    problem = report.problem()
    assert problem is not None and "without a report" in problem, report
    assert report.records == 6


@pytest.mark.process
def test_a_tracer_whose_process_cannot_start_counts_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conductor.otel import open_tracer, otel_settings

    settings = otel_settings("http://127.0.0.1:9/v1/traces", env={})
    assert settings is not None
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    tracer = open_tracer(settings)
    assert tracer.pid is None
    record = make_record([make_round(0, [step(0, 0, "x", [], [])])])
    for _ in range(3):
        tracer.emit(record)
    report = tracer.close()
    assert tracer.close() is report
    problem = report.problem()
    assert problem is not None and "could not be started" in problem, problem
    assert report.records == 3 and report.unplanned == 3
