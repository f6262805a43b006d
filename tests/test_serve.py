"""`conductor serve` with real clients: the openai SDK (sync, async, streaming), litellm's
`openai/` provider and plain httpx, against in-process servers whose workers are the
fake provider server (see test_serve_errors.py and test_serve_lifecycle.py for the
error statuses and the CLI)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, worker
from kit.servekit import make_pool, make_pool_file, served

from conductor.pool import load_pool
from conductor.runs.rundir import iter_records
from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

KEY = "sk-test-not-checked"


def script_two_steps(server: FakeLLMServer) -> None:
    """The Conductor plans w0 then w1 (w1 sees w0); each reply has known token counts:
    the Conductor 11 in / 7 out, w0 5 / 3, w1 13 / 2 (sums: 29 / 12)."""
    server.script(
        CONDUCTOR_MODEL,
        Reply(lists([0, 1], ["Draft it.", "Check the draft."], [[], [0]]), None, 11, 7),
    )
    server.script("w0", Reply("draft answer", None, 5, 3))
    server.script("w1", Reply("The answer is Paris.", None, 13, 2))


USAGE = {"prompt_tokens": 29, "completion_tokens": 12, "total_tokens": 41}


def usage_of(obj: Any) -> dict[str, int]:
    return {k: getattr(obj, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def test_openai_sdk_sync(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "Capital of France?"}]
        )
    assert reply.object == "chat.completion"
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == "The answer is Paris."
    assert choice.finish_reason == "stop"
    # Usage is every call of the run (the Conductor's and both workers'), not the last.
    assert usage_of(reply.usage) == USAGE
    extra = reply.model_extra or {}
    (run_id,) = extra["conductor"]["run_ids"]
    assert reply.id == f"chatcmpl-{run_id}"
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 1
    assert len(fake_server.requests_for("w0")) == len(fake_server.requests_for("w1")) == 1


async def test_openai_sdk_async(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = await client.chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "Capital of France?"}]
        )
        await client.close()
    assert reply.choices[0].message.content == "The answer is Paris."
    assert usage_of(reply.usage) == USAGE


def test_streaming_with_usage(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        with client.chat.completions.with_streaming_response.create(
            model="conductor",
            messages=[{"role": "user", "content": "Capital of France?"}],
            stream=True,
            stream_options={"include_usage": True},
        ) as raw:
            run_id_header = raw.headers.get("x-conductor-run-id")
            chunks = list(raw.parse())
    assert chunks, "no chunks"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == "The answer is Paris."
    finish = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    assert finish == ["stop"]
    # The usage chunk is the last one, with no choices, and sums every call of the run.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert usage_of(last.usage) == USAGE
    assert [c for c in chunks[:-1] if c.usage] == []
    # The header names the run whose answer this is; every chunk carries its id.
    assert run_id_header and {c.id for c in chunks} == {f"chatcmpl-{run_id_header}"}


async def test_async_streaming_with_usage(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
        stream = await client.chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": "Capital of France?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is Paris."
    assert chunks[-1].usage is not None and usage_of(chunks[-1].usage) == USAGE


def test_unpriced_run_has_no_cost(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # The fake models have no price (in the pool or litellm's table): the cost is not
    # known, and must not be reported as 0 (catches a made-up cost).
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            json={"model": "conductor", "messages": [{"role": "user", "content": "Capital?"}]},
            timeout=60,
        )
    assert resp.status_code == 200, resp.text
    assert resp.json()["conductor"]["cost_usd"] is None
    header = resp.headers["x-conductor-cost-usd"]
    assert header and header not in {"0", "0.0"}


def test_streaming_without_include_usage_sends_no_usage(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Catches a usage chunk sent to clients that did not ask for it (strict clients
    # break on a chunk with no choices they did not expect).
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url, httpx.Client(timeout=60) as http:
        body = {
            "model": "conductor",
            "stream": True,
            "messages": [{"role": "user", "content": "Capital of France?"}],
        }
        with http.stream("POST", f"{url}/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["choices"] for c in chunks)
    assert all(not c.get("usage") for c in chunks)


def test_progress_events_in_order(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        stream = client.chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": "Capital of France?"}],
            stream=True,
            extra_body={"conductor": {"progress": True}},
        )
        chunks = list(stream)
    events: list[dict[str, Any]] = []
    position: dict[str, int] = {}
    for i, chunk in enumerate(chunks):
        extra = (chunk.model_extra or {}).get("conductor")
        if extra and "event" in extra:
            assert chunk.choices == []  # plain clients see no content in these
            events.append(extra["event"])
            position.setdefault(f"event{len(events) - 1}", i)
        elif chunk.choices and chunk.choices[0].finish_reason:
            position["finish"] = i
    kinds = [e["kind"] for e in events]
    assert "workflow" in kinds, kinds
    assert kinds.count("step_started") == 2 and kinds.count("step_finished") == 2, kinds
    # The workflow is written before any step starts; each step starts before it finishes.
    first_step = kinds.index("step_started")
    assert kinds.index("workflow") < first_step
    for step in {(e.get("round"), e.get("step")) for e in events if e["kind"] == "step_started"}:
        started = [
            i for i, e in enumerate(events)
            if e["kind"] == "step_started" and (e.get("round"), e.get("step")) == step
        ]  # fmt: skip
        finished = [
            i for i, e in enumerate(events)
            if e["kind"] == "step_finished" and (e.get("round"), e.get("step")) == step
        ]  # fmt: skip
        assert len(started) == len(finished) == 1 and started[0] < finished[0], (step, kinds)
    # w1 sees w0: w0's step finishes before w1's starts (progress follows the run).
    # (The contract leaves the event's other keys open: the worker is "worker" or "worker_id".)
    steps = [
        (e["kind"], e.get("worker", e.get("worker_id")))
        for e in events
        if e["kind"].startswith("step_")
    ]
    assert steps.index(("step_finished", "w0")) < steps.index(("step_started", "w1")), steps
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is Paris."
    # Progress events all come before the end of the answer.
    assert max(v for k, v in position.items() if k.startswith("event")) < position["finish"]


def test_no_progress_events_unless_asked(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="conductor",
                messages=[{"role": "user", "content": "Capital of France?"}],
                stream=True,
            )
        )
    assert all(c.choices for c in chunks)
    assert not any((c.model_extra or {}).get("conductor", {}).get("event") for c in chunks)
    # ...and the stream is the answer (an empty stream would carry no events either).
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The answer is Paris."


def test_models_list(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    with served(make_pool(tmp_path, fake_server, n=3)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        models = list(client.models.list())
    ids = [m.id for m in models]
    assert len(ids) == len(set(ids))
    expected = {"conductor", "single:w0", "single:w1", "single:w2", "moa"}
    assert expected <= set(ids), ids
    # The patterns are not ids a client could call: they are listed beside the data.
    assert not any("K:W" in i for i in ids), ids
    for m in models:
        assert m.object == "model" and m.owned_by == "conductor"
        meta = (m.model_extra or {})["conductor"]
        assert meta["pool"] == "fake"
        assert meta["kind"] == ("conductor" if m.id.startswith("conductor") else "baseline")
        assert meta["pattern"] is None
    # Nothing is called to list models.
    assert fake_server.requests == []


def test_single_baseline_answers_without_the_conductor(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w1", "only w1 answers")
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model="single:w1", messages=[{"role": "user", "content": "Hello?"}]
        )
    assert reply.choices[0].message.content == "only w1 answers"
    assert fake_server.requests_for(CONDUCTOR_MODEL) == []
    assert len(fake_server.requests_for("w1")) == 1 and fake_server.requests_for("w0") == []


def test_vote_pattern_model(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # Three samples of w0, two of which agree: a pattern model not listed literally.
    fake_server.script("w0", ["\\boxed{3}", "\\boxed{7}", "\\boxed{7}"])
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model="vote:3:w0", messages=[{"role": "user", "content": "3 + 4?"}]
        )
    assert "\\boxed{7}" in (reply.choices[0].message.content or "")
    assert len(fake_server.requests_for("w0")) == 3
    assert fake_server.requests_for(CONDUCTOR_MODEL) == []


@pytest.mark.parametrize(
    ("model", "calls"),
    [("moa", {"w0": 2, "w1": 1}), ("reflect:2:w1", {"w0": 0, "w1": 3})],
)
def test_other_baselines_answer(
    tmp_path: Path, fake_server: FakeLLMServer, model: str, calls: dict[str, int]
) -> None:
    # moa: both workers propose, w0 aggregates; reflect:2:w1: an answer, two revisions.
    fake_server.script("w0", "from w0")
    fake_server.script("w1", "from w1")
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello?"}]
        )
    assert reply.choices[0].message.content == ("from w0" if model == "moa" else "from w1")
    assert {w: len(fake_server.requests_for(w)) for w in calls} == calls
    assert fake_server.requests_for(CONDUCTOR_MODEL) == []


def test_records_hold_every_run(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # n=2 is two runs, two records; a failed run (502) is recorded too.
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", "ok")
    fake_server.script("w1", Fault(401, "Incorrect API key provided"))
    records = tmp_path / "records"
    with served(make_pool(tmp_path, fake_server), records_dir=records) as url:
        two = httpx.post(
            f"{url}/chat/completions",
            json={"model": "conductor", "n": 2, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=60,
        )
        failed = httpx.post(
            f"{url}/chat/completions",
            json={"model": "single:w1", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=60,
        )
    assert two.status_code == 200 and failed.status_code == 502
    # Read back with the run directory's own reader (the one trace and report use).
    saved = list(iter_records(records / "samples.jsonl"))
    ids = two.headers["x-conductor-run-id"].split(",") + [failed.headers["x-conductor-run-id"]]
    # The n=2 runs run at once and each is written as it ends, in either order.
    assert {r.sample_id for r in saved[:2]} == set(ids[:2]) and saved[2].sample_id == ids[2]
    assert [r.status for r in saved] == ["ok", "ok", "failed"]
    assert "Incorrect API key provided" in (saved[2].error or "")
    # Each record names the model that answered, as a bench record names its strategy.
    assert [r.strategy for r in saved] == ["conductor", "conductor", "single:w1"]


def _all_text(request: FakeRequest) -> str:
    return "\n".join(m["content"] for m in request.messages)


def test_whole_conversation_reaches_the_conductor_and_workers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Catches a server that sends only the last message (what RouteLLM does).
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer the user."], [[]]))
    fake_server.script("w0", "Your name is Zorblax.")
    messages = [
        {"role": "system", "content": "Always answer in one line. SYSMARK-41"},
        {"role": "user", "content": "My name is Zorblax."},
        {"role": "assistant", "content": "Nice to meet you, EARLIER-REPLY-17."},
        {"role": "user", "content": "What is my name?"},
    ]
    with served(make_pool(tmp_path, fake_server)) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(model="conductor", messages=messages)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "Your name is Zorblax."
    for model in (CONDUCTOR_MODEL, "w0"):
        (request,) = fake_server.requests_for(model)
        text = _all_text(request)
        for needle in ("SYSMARK-41", "My name is Zorblax.", "EARLIER-REPLY-17", "What is my name?"):
            assert needle in text, (model, needle, text)
        # Earlier turns come before the question (a deterministic layout).
        assert text.index("My name is Zorblax.") < text.index("What is my name?")
        assert text.index("EARLIER-REPLY-17") < text.index("What is my name?")


def test_n_runs_independent_samples(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, Reply(lists([0], ["Answer."], [[]]), None, 10, 4))
    fake_server.script(
        "w0", [Reply("first sample", None, 3, 2), Reply("second sample", None, 3, 2)]
    )
    with served(make_pool(tmp_path, fake_server)) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            json={"model": "conductor", "n": 2, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=60,
        )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert {c["message"]["content"] for c in body["choices"]} == {"first sample", "second sample"}
    run_ids = body["conductor"]["run_ids"]
    assert len(run_ids) == len(set(run_ids)) == 2
    assert resp.headers["x-conductor-run-id"].split(",") == run_ids
    # Two whole runs: two plans, two worker calls; usage counts both.
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 2
    assert len(fake_server.requests_for("w0")) == 2
    assert [r["run_id"] for r in body["conductor"]["runs"]] == run_ids
    # Usage sums both runs: 2 x (Conductor 10 / 4 + w0 3 / 2).
    assert body["usage"] == {"prompt_tokens": 26, "completion_tokens": 12, "total_tokens": 38}


async def test_litellm_openai_provider(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    litellm = pytest.importorskip("litellm")
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server)) as url:
        reply = await litellm.acompletion(
            model="openai/conductor",
            api_base=url,
            api_key=KEY,
            messages=[{"role": "user", "content": "Capital of France?"}],
            num_retries=0,
        )
    assert reply.choices[0].message.content == "The answer is Paris."
    assert reply.usage.prompt_tokens == USAGE["prompt_tokens"]
    assert reply.usage.completion_tokens == USAGE["completion_tokens"]


def test_conductor_field_and_headers(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    script_two_steps(fake_server)
    price = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}
    workers = [worker(fake_server, f"w{i}", price=price) for i in range(2)]
    pool = load_pool(
        make_pool_file(
            tmp_path, fake_server, workers=workers,
            price={"input_per_mtok": 100.0, "output_per_mtok": 100.0},
        )
    )  # fmt: skip
    with served(pool) as url:
        resp = httpx.post(
            f"{url}/chat/completions",
            json={"model": "conductor", "messages": [{"role": "user", "content": "Capital?"}]},
            timeout=60,
        )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    info = body["conductor"]
    (run_id,) = info["run_ids"]
    assert resp.headers["x-conductor-run-id"] == run_id
    assert body["id"] == f"chatcmpl-{run_id}"
    # Cost: the Conductor 11*100 + 7*100, w0 5*1000 + 3*2000, w1 13*1000 + 2*2000 (per
    # million tokens): a priced run, so the cost is exact and in both places.
    expected = (11 * 100 + 7 * 100 + 5 * 1000 + 3 * 2000 + 13 * 1000 + 2 * 2000) / 1e6
    assert info["cost_usd"] == pytest.approx(expected)
    assert float(resp.headers["x-conductor-cost-usd"]) == pytest.approx(expected, rel=1e-3)
    (run,) = info["runs"]
    assert run["run_id"] == run_id and run["status"] == "ok"
    assert run["cost_usd"] == pytest.approx(expected)
    assert run["calls"] == 3
    (rnd,) = run["workflow"]["rounds"]
    assert [s["worker"] for s in rnd["steps"]] == ["w0", "w1"]
    assert [s["subtask"] for s in rnd["steps"]] == ["Draft it.", "Check the draft."]
    assert [s["sees"] for s in rnd["steps"]] == [[], [0]]


@pytest.mark.long
async def test_a_hundred_concurrent_requests(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # Each request has its own question; each answer must come back to its own client
    # (catches answers crossed between requests sharing one orchestrator), and none may
    # be refused (the client does not retry: max_retries=0).
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer it."], [[]]))

    def answer(request: FakeRequest) -> Reply:
        match = re.search(r"question number (\d+)", _all_text(request))
        assert match, _all_text(request)[:300]
        return Reply(f"answer {match.group(1)}", latency_s=0.05)

    fake_server.script("w0", answer)
    with served(make_pool(tmp_path, fake_server), max_concurrency=16, max_queue=128) as url:
        client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)

        async def ask(i: int) -> str | None:
            reply = await client.chat.completions.create(
                model="conductor",
                messages=[{"role": "user", "content": f"This is question number {i}."}],
            )
            return reply.choices[0].message.content

        answers = await asyncio.gather(*(ask(i) for i in range(100)))
        await client.close()
    assert answers == [f"answer {i}" for i in range(100)]
    assert len(fake_server.requests_for("w0")) == 100


@pytest.mark.long
@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_stops_the_run(
    tmp_path: Path, fake_server: FakeLLMServer, stream: bool
) -> None:
    # w0 takes 1.5 s; w1 sees w0 so it would be called after.  The client goes away while
    # w0 runs: w1 must never be called (the run was cancelled, not left running).
    fake_server.script(CONDUCTOR_MODEL, lists([0, 1], ["Draft.", "Finish."], [[], [0]]))
    fake_server.script("w0", Reply("draft", latency_s=1.5))
    fake_server.script("w1", "final")
    # One slot and no queue: a run left holding its slot would make the request after
    # it a 429 (catches a slot not given back when the client leaves).
    with served(make_pool(tmp_path, fake_server), max_concurrency=1, max_queue=0) as url:
        body = {
            "model": "conductor",
            "stream": stream,
            "messages": [{"role": "user", "content": "Go."}],
        }
        async with httpx.AsyncClient(timeout=60) as http:

            async def call() -> None:
                if stream:
                    async with http.stream("POST", f"{url}/chat/completions", json=body) as r:
                        async for _ in r.aiter_lines():
                            pass
                else:
                    await http.post(f"{url}/chat/completions", json=body)

            task = asyncio.create_task(call())
            for _ in range(1500):
                if fake_server.requests_for("w0") or task.done():
                    break
                await asyncio.sleep(0.02)
            assert fake_server.requests_for("w0"), "w0 was never called"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # Long enough for w0 to answer and w1 to be called if the run went on.
        await asyncio.sleep(3.0)
        assert fake_server.requests_for("w1") == []
        # The server still answers afterwards.
        fake_server.script(CONDUCTOR_MODEL, lists([1], ["Answer."], [[]]))
        async with httpx.AsyncClient(timeout=60) as http:
            resp = await http.post(f"{url}/chat/completions", json={**body, "stream": False})
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == (
            "final"
        )


def test_one_cache_for_all_requests(
    tmp_path: Path, fake_server: FakeLLMServer, cache_dir: Path
) -> None:
    # With the cache on, a second identical request is answered from the calls the first
    # one made: the server keeps one cache across requests (catches a cache per request).
    script_two_steps(fake_server)
    with served(make_pool(tmp_path, fake_server), use_cache=True) as url:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        first, second = (
            client.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": "Capital of France?"}]
            )
            for _ in range(2)
        )
    assert first.choices[0].message.content == second.choices[0].message.content
    assert len(fake_server.requests) == 3  # the first run's three calls, no more
    runs = [(r.model_extra or {})["conductor"]["runs"][0] for r in (first, second)]
    assert runs[0]["run_id"] != runs[1]["run_id"]


@pytest.mark.long
async def test_worker_limits_hold_across_requests(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # w0 allows one call at a time; three requests at once must queue on that one limit
    # (catches callers made per request, each with its own limit).
    fake_server.script("w0", Reply("one at a time", latency_s=0.3))
    workers = [worker(fake_server, "w0", max_concurrency=1), worker(fake_server, "w1")]
    pool = load_pool(make_pool_file(tmp_path, fake_server, workers=workers))
    with served(pool) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            resps = await asyncio.gather(
                *(
                    http.post(
                        f"{url}/chat/completions",
                        json={"model": "single:w0", "messages": [{"role": "user", "content": q}]},
                    )
                    for q in ("a?", "b?", "c?")
                )
            )
    assert [r.status_code for r in resps] == [200, 200, 200]
    arrivals = sorted(r.received_at for r in fake_server.requests_for("w0"))
    assert len(arrivals) == 3
    # Each call starts only after the one before it answered (0.3 s later).
    assert all(b - a >= 0.25 for a, b in zip(arrivals, arrivals[1:], strict=False))


@pytest.mark.long
async def test_a_client_that_leaves_the_queue_never_runs(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # One slot: the first request runs (w0 is slow), the second waits in the queue and
    # its client leaves.  Once the slot is free, the second run must not start: the
    # Conductor is asked once in all (catches a queue that runs abandoned requests).
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer."], [[]]))
    fake_server.script("w0", Reply("slow", latency_s=1.5))
    body = {"model": "conductor", "messages": [{"role": "user", "content": "Go."}]}
    with served(make_pool(tmp_path, fake_server), max_concurrency=1, max_queue=4) as url:
        async with httpx.AsyncClient(timeout=60) as http:
            first = asyncio.create_task(http.post(f"{url}/chat/completions", json=body))
            for _ in range(1500):
                if fake_server.requests_for("w0"):
                    break
                await asyncio.sleep(0.02)
            second = asyncio.create_task(http.post(f"{url}/chat/completions", json=body))
            await asyncio.sleep(0.3)  # let it reach the queue
            assert not second.done()
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            resp = await first
        assert resp.status_code == 200, resp.text
        await asyncio.sleep(1.0)  # time for a wrongly started second run to ask
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 1
    assert len(fake_server.requests_for("w0")) == 1
