"""What a call's latency counts: the answer, not the client's set-up or a queue.

A call's ``latency_s`` is the time it was being answered; ``queue_s`` the time it
waited for a concurrency slot or for a model busy with other calls; neither counts the
client's one-time set-up (an SDK imported, a local model loaded).  A record's
``totals.queue_s`` is the part of its wall time in which some call waited and none was
being answered, which ``report`` and ``view`` show beside the latency.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conductor.llm.caller import ModelCaller
from conductor.llm.types import ModelRequest, RawCompletion, Usage
from conductor.record import CallRecord, Totals
from conductor.steps import waiting_s
from conductor.targets import Worker


def _request(text: str = "hi") -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},))


class SlowToSetUp:
    """A client whose set-up takes ``setup_s`` and whose answer takes ``answer_s``."""

    def __init__(self, setup_s: float, answer_s: float = 0.0, queued_s: float = 0.0) -> None:
        self.setup_s, self.answer_s, self.queued_s = setup_s, answer_s, queued_s
        self.events: list[str] = []

    async def prepare(self) -> None:
        self.events.append("prepare")
        await asyncio.sleep(self.setup_s)
        self.events.append("ready")

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        self.events.append("send")
        await asyncio.sleep(self.answer_s)
        return RawCompletion(
            "ok", Usage(1, 1), {}, model="m", finish_reason="stop", queued_s=self.queued_s
        )

    async def aclose(self) -> None:
        return None


@pytest.mark.long
async def test_set_up_is_done_once_before_any_call_and_is_no_calls_latency() -> None:
    client = SlowToSetUp(setup_s=1.5)
    caller = ModelCaller(Worker(id="w", model="m"), client)
    done = await asyncio.gather(*(caller.complete(_request(str(i))) for i in range(5)))
    # Set up once, before the first send; every call waited for it, none counts it.
    assert client.events[:2] == ["prepare", "ready"]
    assert client.events.count("prepare") == 1 and client.events.count("send") == 5
    assert all(d.latency_s < 1.0 and d.queue_s < 1.0 for d in done), done
    again = await caller.complete(_request("later"))
    assert client.events.count("prepare") == 1 and again.text == "ok"


async def test_a_set_up_that_hangs_fails_the_call_within_its_time_out() -> None:
    from conductor.errors import RequestTimeoutError

    caller = ModelCaller(
        Worker(id="w", model="m", timeout_s=0.2, total_timeout_s=0.2), SlowToSetUp(setup_s=60)
    )
    with pytest.raises(RequestTimeoutError, match="getting ready") as info:
        await caller.complete(_request())
    assert info.value.target == "w"


async def test_time_a_model_spent_on_other_calls_is_queue_not_latency() -> None:
    caller = ModelCaller(
        Worker(id="w", model="m"), SlowToSetUp(setup_s=0, answer_s=0.6, queued_s=0.5)
    )
    done = await caller.complete(_request())
    assert done.queue_s == pytest.approx(0.5, abs=0.05)
    assert done.latency_s == pytest.approx(0.1, abs=0.3)


async def test_waiting_for_a_concurrency_slot_is_queue_not_latency() -> None:
    client = SlowToSetUp(setup_s=0, answer_s=0.4)
    caller = ModelCaller(Worker(id="w", model="m", max_concurrency=1), client)
    first, second = await asyncio.gather(
        caller.complete(_request("a")), caller.complete(_request("b"))
    )
    waited = max(first, second, key=lambda d: d.queue_s)
    assert waited.queue_s >= 0.3  # it waited for the other call's slot
    assert waited.latency_s < waited.queue_s + 0.4


def _call(finished: datetime, latency: float, queue: float) -> CallRecord:
    call = CallRecord(messages=[])
    call.finished_at = finished.isoformat(timespec="milliseconds")
    call.latency_s, call.queue_s = latency, queue
    return call


def test_a_records_wait_counts_overlapping_waits_once_and_never_while_a_call_works() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    # A chain: waited 0-2, worked 2-3; then waited 3-4, worked 4-6: 3 s of waiting.
    chain = [_call(at(3), 1.0, 2.0), _call(at(6), 2.0, 1.0)]
    assert waiting_s(chain) == pytest.approx(3.0)
    # Two parallel steps waiting over the same 2 s count them once.
    parallel = [_call(at(3), 1.0, 2.0), _call(at(3.5), 1.5, 2.0)]
    assert waiting_s(parallel) == pytest.approx(2.0)
    # One call's wait while another is being answered is no waiting of the question.
    overlapped = [_call(at(4), 4.0, 0.0), _call(at(4), 1.0, 3.0)]
    assert waiting_s(overlapped) == pytest.approx(0.0)
    assert waiting_s([]) == 0.0
    assert Totals(wall_s=5.0, queue_s=3.0).answer_s == pytest.approx(2.0)


@pytest.mark.process
def test_a_bench_on_a_busy_model_reports_its_queue_apart_from_its_latency(
    tmp_path: Path,
) -> None:
    from kit.benchkit import make_math_file
    from kit.poolkit import pool_dict, run_cli, worker, write_pool

    from conductor.testing import FakeLLMServer

    with FakeLLMServer(latency_s=0.5) as server:
        server.script("w0", lambda r: "\\boxed{1}")
        # One call at a time on w0, four samples asking at once: three wait.
        pool = write_pool(
            tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0", max_concurrency=1)])
        )
        data = make_math_file(tmp_path / "math.jsonl", 4)
        out = tmp_path / "run"
        env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
        res = run_cli(
            "bench", "math500", "--pool", str(pool), "--data", str(data),
            "--strategy", "single:w0", "--concurrency", "4", "--out", str(out), env=env,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    calls = [s["call"] for r in records for s in r["rounds"][0]["steps"]]
    assert len(calls) == 4 and min(c["latency_s"] for c in calls) >= 0.5
    # One call at a time: if latency held any queue time, the answering intervals
    # [finished - latency, finished] of two calls would overlap by a whole call (0.5 s).
    # (finished_at is stamped a little after the answer, so a small overlap is allowed;
    # on a loaded machine every figure grows, and this relation does not change.)
    spans = sorted(
        (datetime.fromisoformat(c["finished_at"]).timestamp() - c["latency_s"],
         datetime.fromisoformat(c["finished_at"]).timestamp())
        for c in calls
    )  # fmt: skip
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start > end - 0.25, spans
    # ...and the wait is the queue: some sample waited for at least one other call.
    assert max(r["totals"]["queue_s"] for r in records) >= 0.25
    report = run_cli("report", str(out), env={**env, "COLUMNS": "200"})
    assert report.returncode == 0, report.stderr
    assert "queued p50 / p95" in report.stdout


@pytest.mark.process
async def test_a_local_model_busy_with_another_call_is_queue_and_its_load_is_neither() -> None:
    from kit.poolkit import embedded_model_or_skip

    from conductor.localmodel import models

    embedded_model_or_skip()
    models.stop_all()  # so this caller's set-up really loads the model
    params = {"max_tokens": 24, "temperature": 0.0}
    callers = [
        ModelCaller(Worker(id=f"w{i}", model="smollm2", client="local", params=params))
        for i in range(2)
    ]
    first, second = await asyncio.gather(
        *(c.complete(_request(f"Name {n} colours.")) for c, n in zip(callers, (3, 4), strict=True))
    )
    waited, other = sorted((first, second), key=lambda d: d.queue_s, reverse=True)
    # One generation at a time on the one model: one call waited for the other's...
    assert waited.queue_s > 0.5 * other.latency_s
    # ...and its latency is its own generation, its queue and the model's load left out.
    timings = waited.raw["timings"]
    assert waited.latency_s < timings["prompt_s"] + timings["generate_s"] + 1.0
