"""Work placed on a real local Ray cluster (a head and two worker nodes, separate
processes, started here once for the module): code grading as tasks that need the
``sandbox`` resource, with the verdicts of local grading on the agreement corpora; and
``bench --ray``, whose samples run on the nodes (calls over HTTP to the fake server
from there), whose records equal a one-process run's, and which loses and doubles
nothing when a node dies mid-run."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import bench_pool, cli, make_math_file, number_in, read_samples, script_math
from kit.clock import scaled

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from conductor.grading.code import CodeGrader  # noqa: E402
from conductor.placement import raycluster  # noqa: E402
from conductor.placement.raycluster import SANDBOX_RESOURCE, RayGrader  # noqa: E402
from conductor.sandbox import bubblewrap_available  # noqa: E402
from conductor.testing import FakeLLMServer  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def _perf_script() -> Any:
    path = REPO / "benchmarks" / "perf" / "ray_grading.py"
    spec = importlib.util.spec_from_file_location("ray_grading", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ray_grading"] = module
    spec.loader.exec_module(module)
    return module


class Nodes:
    """The module's cluster: ``sandboxed`` declares four ``sandbox`` units and no CPU
    (it grades, runs no sample), ``plain`` CPUs and no sandbox (a node without
    bubblewrap: every sample runs there)."""

    def __init__(self, cache: Path) -> None:
        # The nodes' worker processes inherit this process's environment: their call
        # cache is the module's, never the user's.
        os.environ["CONDUCTOR_CACHE_DIR"] = str(cache)
        # A dead node is noticed within a second or two, not Ray's default half minute.
        quick = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": quick}
        )
        self.sandboxed = self.cluster.add_node(num_cpus=0, resources={SANDBOX_RESOURCE: 4})
        self.plain = self.cluster.add_node(num_cpus=2)
        self.cluster.wait_for_nodes()
        raycluster.connect(self.cluster.address)

    def close(self) -> None:
        raycluster.disconnect()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    saved = os.environ.get("CONDUCTOR_CACHE_DIR")
    started = Nodes(tmp_path_factory.mktemp("node-cache"))
    if saved is None:
        del os.environ["CONDUCTOR_CACHE_DIR"]
    else:
        os.environ["CONDUCTOR_CACHE_DIR"] = saved
    try:
        yield started
    finally:
        started.close()


@pytest.mark.skipif(not bubblewrap_available(), reason="code grading needs bubblewrap")
def test_grades_on_the_cluster_are_the_local_grades(nodes: Nodes) -> None:
    """Every program of the LiveCodeBench and BigCodeBench agreement corpora gets,
    graded on the cluster, the very verdict local grading gives it."""
    perf = _perf_script()
    jobs = perf.agreement_jobs()
    assert len(jobs) > 60
    assert raycluster.sandbox_slots() == 4
    # four at a time either way: grading mostly waits on the corpus's time limits
    local = perf.grade_all(CodeGrader(**perf.OPTIONS), jobs, 4)
    grader = RayGrader("code", perf.OPTIONS)
    assert (grader.name, grader.version) == ("code", CodeGrader.version)
    remote = perf.grade_all(grader, jobs, 4)
    differ = [job[1].id for job, a, b in zip(jobs, local, remote, strict=True) if a != b]
    assert differ == []
    statuses = {v["status"] for v in remote}
    assert {"correct", "incorrect"} <= statuses  # the corpus is graded, not refused


def test_a_grade_never_runs_on_a_node_without_the_sandbox(nodes: Nodes) -> None:
    """A grading task that does not hold the resource (one placed on the plain node on
    purpose, as a caller leaving the resource out could) refuses to run the code; the
    same task through RayGrader, which asks for the resource, grades it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sample = _perf_script().agreement_jobs()[0]
    unplaced = ray.remote(raycluster._grade_on_node).options(
        num_cpus=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes.plain.node_id, soft=False),
    )
    verdict = ray.get(unplaced.remote("code", {}, sample[0], sample[1]))
    assert verdict["status"] == "grader_error"
    assert "holds no 'sandbox' resource" in verdict["reason"]


# -- bench --ray -----------------------------------------------------------------


def _outcomes(run: Path) -> list[tuple[str, int, str, str | None, str]]:
    """What must not depend on where a sample ran: its id, epoch, verdict and answer."""
    return sorted(
        (r["sample_id"], r["epoch"], r["grade"]["status"], r["grade"]["extracted"],
         r["final_answer"])
        for r in read_samples(run)
    )  # fmt: skip


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_bench_on_ray_records_what_one_process_records(
    nodes: Nodes, tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """The records of a --ray run equal a one-process run's; with --state, the calls
    the nodes made are in the shared cache: a second run (another seed, so no sample
    is replayed whole: each runs on a node again) asks the provider nothing.  (Built
    without the cache on the node, the second run asks again: seen once by hand.)"""
    from kit.redisserver import RedisServer

    script_math(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 6)
    pool = bench_pool(tmp_path, fake_server)
    args = ["bench", "math500", "--pool", str(pool), "--data", str(data), "--epochs", "2",
            "--strategy", "moa"]  # fmt: skip
    here = cli(*args, "--out", str(tmp_path / "here"), cache=tmp_path / "c1")
    assert here.returncode == 0, here.stderr
    asked_here = len(fake_server.requests)
    ray_args = [*args, "--ray", nodes.cluster.address]
    with RedisServer() as server:
        placed = cli(*ray_args, "--state", server.url, "--out", str(tmp_path / "ray"),
                     cache=tmp_path / "c2")  # fmt: skip
        assert placed.returncode == 0, placed.stderr
        asked_there = len(fake_server.requests) - asked_here
        again = cli(*ray_args, "--state", server.url, "--seed", "1",
                    "--out", str(tmp_path / "again"), cache=tmp_path / "c3")  # fmt: skip
        assert again.returncode == 0, again.stderr
    assert len(fake_server.requests) == asked_here + asked_there  # all from the shared cache
    assert all(r["replayed_from"] is None for r in read_samples(tmp_path / "again"))
    # The calls were made (over HTTP, from the nodes), as many as in one process.
    assert asked_there == asked_here
    assert _outcomes(tmp_path / "ray") == _outcomes(tmp_path / "here")
    assert len(_outcomes(tmp_path / "ray")) == 12
    # where samples run is not part of the run: the two configs agree
    strip = ("run_dir", "created_at", "started_at", "invocation")
    configs = [
        {k: v for k, v in json.loads((tmp_path / d / "config.json").read_text()).items()
         if k not in strip}
        for d in ("here", "ray")
    ]  # fmt: skip
    assert configs[0] == configs[1]


def _lcb_row(qid: str, stdin: str, stdout: str) -> str:
    """One problem in LiveCodeBench's schema, its private tests encoded as the dataset
    encodes them (JSON, pickled, zlib, base64)."""
    tests = [{"input": stdin, "output": stdout, "testtype": "stdin"}]
    private = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    row = {
        "question_title": qid, "question_content": f"Problem {qid}.", "platform": "atcoder",
        "question_id": qid, "contest_id": "abc999", "contest_date": "2024-10-05T00:00:00",
        "starter_code": "", "difficulty": "easy", "public_test_cases": json.dumps(tests),
        "private_test_cases": private, "metadata": "{}",
    }  # fmt: skip
    return json.dumps(row) + "\n"


@pytest.mark.skipif(not bubblewrap_available(), reason="code grading needs bubblewrap")
def test_a_code_benchmark_on_ray_grades_as_one_process(
    nodes: Nodes, tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """bench livecodebench --ray: the code grades run on the sandbox node, the verdicts
    (a pass, a wrong answer, a crash) those of a one-process run."""
    data = tmp_path / "lcb.jsonl"
    data.write_text(
        _lcb_row("double", "21\n", "42\n") + _lcb_row("triple", "2\n", "6\n")
        + _lcb_row("crash", "1\n", "1\n")
    )  # fmt: skip
    programs = {
        "double": "print(int(input()) * 2)",
        "triple": "print(int(input()) * 2)",
        "crash": "raise SystemExit(3)",
    }

    def answer(request: Any) -> str:
        qid = next(q for q in programs if f"Problem {q}." in request.last_user_message)
        return f"```python\n{programs[qid]}\n```"

    fake_server.script("w0", answer)
    pool = bench_pool(tmp_path, fake_server, n=1)
    args = ["bench", "livecodebench", "--pool", str(pool), "--data", str(data),
            "--strategy", "single:w0"]  # fmt: skip
    here = cli(*args, "--out", str(tmp_path / "here"), cache=tmp_path / "c1")
    assert here.returncode == 0, here.stderr
    placed = cli(*args, "--out", str(tmp_path / "ray"), "--ray", nodes.cluster.address,
                 cache=tmp_path / "c2")  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    grades = [{r["sample_id"]: r["grade"] for r in read_samples(tmp_path / d)}
              for d in ("here", "ray")]  # fmt: skip
    assert grades[0] == grades[1]
    statuses = sorted(g["status"] for g in grades[1].values())
    assert statuses == ["correct", "incorrect", "incorrect"], grades[1]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"batch": True}, "--batch needs them made in this process"),
        ({"batch": True, "state": "redis://127.0.0.1:1/0"}, "--batch needs them made"),
        ({"max_usd": 5.0}, "--max-usd counts their spend on a state server the nodes "
         "reach: add --state redis://HOST:PORT/DB"),
    ],
)  # fmt: skip
def test_ray_refuses_what_needs_every_call_here(
    given: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conductor.bench.session import BenchArgs, plan_bench
    from conductor.errors import UsageError
    from conductor.state.url import STATE_ENV

    monkeypatch.delenv(STATE_ENV, raising=False)
    with pytest.raises(UsageError, match="--ray runs the samples' calls on the cluster") as err:
        plan_bench(BenchArgs(benchmark="math500", ray="auto", **given))
    assert says in str(err.value)


#: A dollar a thousand tokens, in and out: the fake server counts words as tokens.
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}


def _priced_pool(tmp_path: Path, fake: FakeLLMServer) -> Path:
    from kit.poolkit import pool_dict, worker, write_pool

    workers = [worker(fake, "w0", price=PRICE)]
    return write_pool(tmp_path / "pool.yaml", pool_dict(fake, workers, price=PRICE))


def _run_spend(run: Path, url: str) -> float:
    """What the run's counter on the state server holds (all the nodes' charges)."""
    from conductor.runs.rundir import STATE_TOKEN
    from conductor.state import StateURL
    from conductor.state.claims import RunClaims

    claims = RunClaims(StateURL.parse(url), (run / STATE_TOKEN).read_text().strip())
    try:
        return claims.spent()
    finally:
        claims.close()


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_the_cap_holds_for_the_calls_the_nodes_make(
    nodes: Nodes, tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """bench --ray --state --max-usd: the nodes charge the run's counter on the state
    server, so the driver stops placing samples within one wave of the cap (the samples
    in flight, --concurrency of them, finish); every call the provider answered is in
    the counter and in the records.  (With the node's charge left out, the counter
    stays at 0 and the run goes to the end: seen once by hand.)"""
    from kit.redisserver import RedisServer

    script_math(fake_server)
    fake_server.latency_s = 0.05
    n, concurrency, cap = 16, 2, 0.25
    data = make_math_file(tmp_path / "math.jsonl", n)
    run = tmp_path / "run"
    with RedisServer() as server:
        done = cli("bench", "math500", "--pool", str(_priced_pool(tmp_path, fake_server)),
                   "--data", str(data), "--strategy", "single:w0", "--no-cache",
                   "--concurrency", str(concurrency), "--max-usd", str(cap),
                   "--ray", nodes.cluster.address, "--state", server.url, "--out", str(run),
                   cache=tmp_path / "c")  # fmt: skip
        counted = _run_spend(run, server.url)
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, text
    assert f"reaching its --max-usd ${cap:.4f}: no more samples were started" in text
    records = read_samples(run)
    costs = [r["totals"]["cost_usd"] for r in records]
    assert 0 < len(records) < n  # stopped: the rest were not started
    assert cap <= sum(costs) <= cap + concurrency * max(costs) + 1e-9
    # One call a sample, each answered call recorded and counted: nothing unmetered.
    assert len(fake_server.requests_for("w0")) == len(records)
    assert counted == pytest.approx(sum(costs))


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
@pytest.mark.parametrize("loss", ["killed", "restarted empty"])
async def test_a_node_that_cannot_count_its_spend_makes_no_call(
    fake_server: FakeLLMServer, loss: str
) -> None:
    """A node's meter charges each call to the run's counter; once the state server is
    gone (or holds the session no more), the node's next call is refused before the
    provider is asked, and nothing is counted in its place.  (With the read before each
    call left out, the call is made: seen once by hand.)"""
    import redis
    from kit.redisserver import RedisServer

    from conductor.errors import ModelCallError
    from conductor.llm.caller import ModelCaller
    from conductor.llm.types import ModelRequest
    from conductor.state import StateURL
    from conductor.state.claims import RunClaims, new_token
    from conductor.state.spend import NodeSpendMeter, RunSpend
    from conductor.targets import Price, Worker

    fake_server.script("m", lambda _request: "four")
    target = Worker(id="w0", model="m", client="openai", api_base=fake_server.openai_base,
                    price=Price(1000.0, 1000.0), max_retries=0)  # fmt: skip
    ask = ModelRequest(messages=({"role": "user", "content": "two and two"},))
    with RedisServer() as server:
        url, token = StateURL.parse(server.url), new_token()
        run = RunClaims(url, token)
        run.start(0.0)  # the driver opens the run's session
        meter = NodeSpendMeter(RunSpend(url, token))
        caller = ModelCaller(target, meter=meter)
        try:
            paid = await caller.complete(ask)
            assert paid.cost_usd is not None and paid.cost_usd > 0
            assert run.spent() == pytest.approx(paid.cost_usd)
            if loss == "killed":
                server.stop()
            else:
                redis.Redis.from_url(server.url).flushall()
            with pytest.raises(ModelCallError, match="its spend could not be counted"):
                await caller.complete(ask)
        finally:
            await caller.aclose()
            meter.close()
            run.close()
    assert len(fake_server.requests) == 1  # the refused call never reached the provider
    assert meter.spent_usd == pytest.approx(paid.cost_usd)


def test_a_node_lost_mid_run_loses_and_doubles_no_sample(
    nodes: Nodes, tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """The plain node (where every sample runs) is killed, its raylet first, while
    samples run on it; a new node joins: those samples run again there (their questions
    reach the server twice), and the run directory ends with every sample exactly
    once.  The last test of the module: it replaces the plain node."""
    script_math(fake_server)
    # Long enough that the samples in flight at the kill are still waiting on their
    # call, so their worker processes die with the node before they can answer.
    fake_server.latency_s = 1.5
    n = 8
    data = make_math_file(tmp_path / "math.jsonl", n)
    pool = bench_pool(tmp_path, fake_server)
    out = tmp_path / "run"
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conductor", "bench", "math500", "--pool", str(pool),
         "--data", str(data), "--strategy", "single:w0", "--concurrency", "4", "--no-cache",
         "--ray", nodes.cluster.address, "--out", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        if samples.exists() and samples.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None and samples.read_text().count("\n") < n
    nodes.cluster.remove_node(nodes.plain, allow_graceful=False)
    nodes.plain = nodes.cluster.add_node(num_cpus=2)
    _, err = proc.communicate(timeout=scaled(180))
    assert proc.returncode == 0, err
    keys = [(r["sample_id"], r["epoch"]) for r in read_samples(out)]
    assert len(keys) == len(set(keys)) == n  # 0 lost, 0 doubled
    assert all(r["grade"]["status"] == "correct" for r in read_samples(out))
    asked = Counter(number_in(r) for r in fake_server.requests_for("w0"))
    assert set(asked) == set(range(n))
    assert max(asked.values()) == 2, asked  # retried: asked again elsewhere
