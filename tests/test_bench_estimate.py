"""``bench --estimate`` and ``bench --pilot N`` against the fake server: an estimate calls
nothing and writes nothing, its assumed figures are the requests the run would send
counted by the stated rule, its measured figures come from the run's own records (a
resumed run, a pilot, the sample cache), and the spend of the run it estimates lands
within 20% of it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import read_samples
from kit.poolkit import CONDUCTOR_MODEL, invoke_cli, lists, pool_dict, worker, write_pool

from conductor.bench.estimate import ASSUMED, RunEstimate, estimate_run, without_pilot
from conductor.bench.session import BenchArgs, BenchRequest, BenchSession, plan_bench
from conductor.conductors.prompt import build_conductor_messages
from conductor.context import SharedStep, build_worker_messages
from conductor.errors import UsageError
from conductor.strategies import (
    CONDUCTOR_ROLE,
    CallPlan,
    EarlierReplies,
    PlannedCall,
    PlannedShare,
)
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
#: A dollar a thousand tokens, in and out: the fake server counts words as tokens.
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
#: A key variable no test sets.
NO_KEY = "CONDUCTOR_TEST_NO_SUCH_KEY"
#: The pool defaults' max_tokens (tests/kit/poolkit.py): an assumed reply's length.
MAX_TOKENS = 256


def words_benchmark(tmp_path: Path, sizes: list[int]) -> Path:
    """A benchmark whose prompt is the question alone, question ``i`` being
    ``sizes[i]`` words of four letters: its characters and its words (the fake's
    tokens) are known by hand."""
    rows = [{"problem": " ".join(["abcd"] * k), "answer": "1"} for k in sizes]
    (tmp_path / "words.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "words.yaml"
    path.write_text(
        "name: words\nsource: {file: words.jsonl}\nprompt: '${question}'\ngrader: short\n"
    )
    return path


def priced_pool(
    tmp_path: Path, server: FakeLLMServer, *, priced: bool = True, **conductor: Any
) -> Path:
    price = {"price": PRICE} if priced else {}
    workers = [worker(server, "w0", **price), worker(server, "w1", **price)]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers, **price, **conductor))


def plan(tmp_path: Path, benchmark: Path | str, pool: Path, **given: Any) -> list[BenchRequest]:
    given.setdefault("out", tmp_path / "run")
    return plan_bench(BenchArgs(benchmark=str(benchmark), pool=str(pool), **given))


def bench(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    res = invoke_cli("bench", *args, env={"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    return res.returncode, " ".join(res.stdout.split()), " ".join(res.stderr.split())


def role(estimate: RunEstimate, name: str) -> Any:
    return next(r for r in estimate.roles if r.role == name)


# -- an estimate calls nothing and writes nothing ----------------------------------------


def test_an_estimate_calls_no_model_and_writes_nothing(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6, 9])
    pool = priced_pool(tmp_path, fake_server)
    run = tmp_path / "run"
    code, out, err = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--out", str(run), "--estimate"
    )
    assert code == 0, out + err
    assert fake_server.requests == []
    assert not run.exists() and not (tmp_path / "cache").exists()
    assert "3 (sample, epoch) pairs to run of 3" in out
    assert "Estimate: words · conductor" in out and "this run pays about $" in out
    assert "figures assumed: nothing of this run has been measured yet" in out
    assert "no model was called and nothing was written" in out


def test_assumed_figures_are_the_requests_counted_by_the_stated_rule(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    sizes = [3, 6, 9, 12]
    bench_file = words_benchmark(tmp_path, sizes)
    prompts = [" ".join(["abcd"] * k) for k in sizes]
    pool = priced_pool(tmp_path, fake_server)
    cpt = ASSUMED.chars_per_token  # four characters a token

    # A baseline: the plan's calls, each sent the prompt alone, each reply at max_tokens.
    (vote,) = plan(tmp_path, bench_file, pool, strategy="vote:3:w0", epochs=2)
    got = estimate_run(vote)
    pairs = len(sizes) * 2
    assert (got.pairs, got.total, got.measured) == (pairs, pairs, 0)
    assert [r.role for r in got.roles] == ["w0"]
    inp = 3 * 2 * sum(len(p) for p in prompts) / cpt
    out = 3 * pairs * MAX_TOKENS
    assert got.calls == 3 * pairs
    assert got.input_tokens == pytest.approx(inp)
    assert got.output_tokens == out
    usd = (round(inp) + out) * 1000 / 1e6
    assert got.usd == pytest.approx(usd)
    assert got.batch_usd == pytest.approx(usd / 2)  # an OpenAI client: --batch halves it
    assert got.run_usd == got.usd  # the run was not asked for --batch

    # The Conductor: its first request as its template builds it, then three steps
    # shared by the two workers, each seeing the ones before it.
    (cond,) = plan(tmp_path, bench_file, pool)
    got = estimate_run(cond)
    n = len(sizes)
    plan_in = sum(
        len(build_conductor_messages(p, cond.pool.workers, max_steps=5)[0]["content"])
        for p in prompts
    )
    conductor = role(got, CONDUCTOR_ROLE)
    assert (conductor.calls, conductor.output_tokens) == (n, n * MAX_TOKENS)
    assert conductor.input_tokens == pytest.approx(plan_in / cpt)

    def step_in(prompt: str, k: int) -> float:
        seen = [SharedStep(f"0.{j}", 0, "", "") for j in range(k)]
        text = build_worker_messages(prompt, seen, "")[0]["content"]
        return len(text) / cpt + (k + 1) * ASSUMED.subtask_tokens + k * MAX_TOKENS

    for name in ("w0", "w1"):
        w = role(got, name)
        assert w.calls == pytest.approx(n * 1.5)  # 3 steps a workflow, 2 workers
        assert w.output_tokens == pytest.approx(n * 1.5 * MAX_TOKENS)
        expected = sum(step_in(p, k) for p in prompts for k in range(3)) / 2
        assert w.input_tokens == pytest.approx(expected)
    assert "workflows: 3 steps (the paper's average)" in " ".join(got.assumptions)


def test_max_calls_bounds_the_assumed_calls(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6])
    pool = priced_pool(tmp_path, fake_server)
    (request,) = plan(tmp_path, bench_file, pool, max_calls=2, rounds=2)
    got = estimate_run(request)
    # Of the Conductor's call and three steps a round, the first two are made.
    assert role(got, CONDUCTOR_ROLE).calls == 2
    assert role(got, "w0").calls + role(got, "w1").calls == pytest.approx(2)


# -- a strategy the estimator has never heard of ---------------------------------------------


class _AskTwice:
    """A strategy of this test's own (no class the estimator knows): ``w0`` answers the
    plain prompt, then ``w1`` is asked again with ``w0``'s answer shown.  ``plans``
    says whether it declares those calls, declares none (it makes none), or cannot
    say (``None``)."""

    def __init__(self, pool: Any, plans: str) -> None:
        self.name = "ask-twice"
        self.pool = pool
        self.plans = plans

    @property
    def targets(self) -> tuple[Worker, ...]:
        return tuple(self.pool.workers)

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        return tuple((w, 1) for w in self.pool.workers)

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        return tuple((w.id, w) for w in self.pool.workers)

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan | None:
        if self.plans == "unknown":
            return None
        if self.plans == "nothing":
            return CallPlan(())
        w0, w1 = self.pool.workers
        ask = [{"role": "user", "content": question}]
        again = [{"role": "user", "content": f"{question}\nAnother answer is shown; check it."}]
        return CallPlan(
            (
                PlannedCall((PlannedShare("w0", w0, 1.0, ask, "asked: {calls}"),)),
                PlannedCall(
                    (
                        PlannedShare(
                            "w1", w1, 1.0, again, "asked: {calls}",
                            replies=(EarlierReplies(1, (w0,)),),
                        ),
                    )
                ),
            )
        )  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}

    def answer_refusal(self, answer: Any) -> str | None:
        return None

    async def run(self, question: str, **kw: Any) -> Any:
        raise AssertionError("an estimate runs nothing")

    async def aclose(self) -> None:
        return None


@pytest.fixture
def ask_twice(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``--strategy single:w0`` built as :class:`_AskTwice` instead, planning as asked."""
    from conductor.bench import session

    chosen = {"plans": "calls"}

    def build(request: BenchRequest, callers: Any, options: Any) -> Any:
        return _AskTwice(request.pool, chosen["plans"]), options

    monkeypatch.setattr(session, "build_strategy", build)
    return chosen


def test_a_strategy_of_any_class_is_estimated_by_the_calls_it_plans(
    tmp_path: Path, fake_server: FakeLLMServer, ask_twice: Any
) -> None:
    sizes = [3, 6, 9]
    bench_file = words_benchmark(tmp_path, sizes)
    pool = priced_pool(tmp_path, fake_server)
    (request,) = plan(tmp_path, bench_file, pool, strategy="single:w0")
    got = estimate_run(request)
    cpt = ASSUMED.chars_per_token
    prompts = [" ".join(["abcd"] * k) for k in sizes]
    first, second = role(got, "w0"), role(got, "w1")
    assert (first.calls, second.calls) == (3, 3)
    assert first.input_tokens == pytest.approx(sum(len(p) for p in prompts) / cpt)
    shown = len("\nAnother answer is shown; check it.")
    # w1 is sent the prompt, the check and w0's reply, as long as its max_tokens.
    expected = sum(len(p) + shown for p in prompts) / cpt + 3 * MAX_TOKENS
    assert second.input_tokens == pytest.approx(expected)
    assert got.usd is not None and got.usd > 0
    assert first.basis.startswith("asked: 1 call a question")


def test_a_strategy_that_cannot_say_its_calls_is_refused_not_priced_at_nothing(
    tmp_path: Path, fake_server: FakeLLMServer, ask_twice: Any
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6])
    pool = priced_pool(tmp_path, fake_server)
    # Positive control: a strategy that plans no call is estimated at $0, as it says;
    # that is what a strategy the estimator knew nothing of was estimated at before.
    ask_twice["plans"] = "nothing"
    (request,) = plan(tmp_path, bench_file, pool, strategy="single:w0")
    assert estimate_run(request).usd == 0
    code, out, _ = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--strategy", "single:w0",
        "--out", str(tmp_path / "run"), "--estimate",
    )  # fmt: skip
    assert code == 0 and "$0" in out, out

    ask_twice["plans"] = "unknown"
    with pytest.raises(UsageError, match=r"ask-twice cannot say .*\(--pilot N\)"):
        estimate_run(request)
    code, out, err = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--strategy", "single:w0",
        "--out", str(tmp_path / "run"), "--estimate",
    )  # fmt: skip
    assert code == 2, out + err
    assert "cannot say before it runs which calls it will make" in err
    assert "$" not in out


# -- measured figures ---------------------------------------------------------------------


def test_a_pilot_runs_n_pairs_and_measures_the_rest_on_them(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    sizes = [3, 6, 9, 4, 8, 5, 7]
    bench_file = words_benchmark(tmp_path, sizes)
    pool = priced_pool(tmp_path, fake_server)
    fake_server.script("w0", lambda r: "a b c")
    run = tmp_path / "run"
    common = (str(bench_file), "--pool", str(pool), "--strategy", "single:w0")
    code, out, err = bench(tmp_path, *common, "--out", str(run), "--pilot", "3")
    assert code == 0, out + err
    assert len(fake_server.requests) == 3 and len(read_samples(run)) == 3
    assert "pilot: 3 pairs run for $" in out
    assert "4 (sample, epoch) pairs to run of 7 (3 recorded already)" in out
    assert "figures measured on 3 records of this run (3 in the run being continued)" in out
    assert f"continue the run with `conductor bench --resume {run}`" in out

    # Measured: the prompt's words are its tokens, and three questions of different
    # sizes fit them exactly, so the rest is expected at its own words, each reply at 3.
    (request,) = plan_bench(BenchArgs(resume=run))
    got = estimate_run(request)
    rest = sizes[3:]
    assert (got.pairs, got.recorded, got.measured, got.calibrated) == (4, 3, 3, True)
    w0 = role(got, "w0")
    assert "(fitted)" in w0.basis
    assert w0.calls == pytest.approx(4)
    assert w0.input_tokens == pytest.approx(sum(rest))
    assert w0.output_tokens == pytest.approx(3 * len(rest))
    predicted = got.run_usd
    assert predicted == pytest.approx((sum(rest) + 3 * len(rest)) / 1000)

    # The rest, run for real, spends what was expected (the fake counts as the estimate
    # did), and asks nothing of the pilot's pairs again.
    code, out, err = bench(tmp_path, "--resume", str(run))
    assert code == 0, out + err
    assert len(fake_server.requests) == 7
    records = read_samples(run)
    spent = sum(r["totals"]["cost_usd"] for r in records[3:])
    assert spent == pytest.approx(predicted)


def test_a_pilot_whose_every_pair_failed_exits_1_and_measures_nothing_on_it(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6, 9])
    pool = priced_pool(tmp_path, fake_server)
    fake_server.script("w0", Fault(400, "the model is not served here"))
    run = tmp_path / "run"
    common = (str(bench_file), "--pool", str(pool), "--strategy", "single:w0")
    code, out, err = bench(tmp_path, *common, "--out", str(run), "--pilot", "2")
    assert code == 1, out + err
    assert [r["status"] for r in read_samples(run)] == ["failed", "failed"]
    # Measured on calls that were never answered, the rest would cost nothing: the
    # figures are assumed instead, and say why.
    assert (
        "figures assumed: nothing of this run has been measured yet (2 records of this "
        "run left out: none of its calls was answered)"
    ) in out
    # The pair left, assumed: its 44 characters are 11 tokens, its reply 256.
    assert "this run pays about $0.267 (every call live)" in out
    assert "every pair of the pilot failed" in err
    assert f"continue the run with `conductor bench --resume {run}`" in out


def test_the_sample_cache_replays_pairs_at_no_cost_and_measures_them(
    tmp_path: Path, fake_server: FakeLLMServer, cache_dir: Path
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6, 9, 12])
    pool = priced_pool(tmp_path, fake_server)
    fake_server.script("w0", lambda r: "a b")
    (first,) = plan(tmp_path, bench_file, pool, strategy="single:w0", limit=2, out=tmp_path / "a")
    BenchSession(first).run()
    asked = len(fake_server.requests)

    # The same run in a new directory, on all four questions: the cache replays the two
    # it holds, which are also what the rest is measured on.
    (again,) = plan(tmp_path, bench_file, pool, strategy="single:w0", out=tmp_path / "b")
    got = estimate_run(again)
    assert (got.total, got.replayed, got.pairs, got.measured) == (4, 2, 2, 2)
    assert got.source == "measured on 2 records of this run (2 the sample cache holds)"
    assert role(got, "w0").output_tokens == pytest.approx(2 * 2)
    assert len(fake_server.requests) == asked and not (tmp_path / "b").exists()

    # Without the cache nothing is replayed, and nothing is measured.
    (uncached,) = plan(
        tmp_path, bench_file, pool, strategy="single:w0", out=tmp_path / "b", no_cache=True
    )
    got = estimate_run(uncached)
    assert (got.replayed, got.pairs, got.measured) == (0, 4, 0)

    # Everything replayed: nothing to pay for.
    (same,) = plan(tmp_path, bench_file, pool, strategy="single:w0", limit=2, out=tmp_path / "c")
    got = estimate_run(same)
    assert (got.replayed, got.pairs, got.usd) == (2, 0, 0.0)


def complete_run(tmp_path: Path, server: FakeLLMServer) -> tuple[Path, tuple[str, ...]]:
    """A run of single:w0 on two questions, complete; and the options that ran it."""
    bench_file = words_benchmark(tmp_path, [3, 6])
    pool = priced_pool(tmp_path, server)
    run = tmp_path / "run"
    given = (str(bench_file), "--pool", str(pool), "--strategy", "single:w0", "--out", str(run))
    assert bench(tmp_path, *given)[0] == 0
    return run, given


def test_a_resumed_complete_run_has_nothing_to_estimate(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    run, _ = complete_run(tmp_path, fake_server)
    asked = len(fake_server.requests)
    code, out, err = bench(tmp_path, "--resume", str(run), "--estimate")
    assert code == 0, out + err
    assert f"nothing to estimate: every pair of the run in {run} is recorded" in out
    assert len(fake_server.requests) == asked
    # The run was not resumed either: nothing in it changed.
    assert len(read_samples(run)) == 2


def test_an_estimate_refuses_what_the_run_would_refuse(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    run, given = complete_run(tmp_path, fake_server)
    code, _, err = bench(tmp_path, *given, "--estimate")
    assert code == 2 and "already holds this run, and it is complete" in err
    code, _, err = bench(tmp_path, "--resume", str(run), "--estimate", "--epochs", "2")
    assert code == 2 and "cannot resume: the epochs was 1, now 2" in err


# -- prices ------------------------------------------------------------------------------


def test_an_unknown_price_is_said_not_counted_as_free(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6])
    pool = priced_pool(tmp_path, fake_server, priced=False)
    (request,) = plan(tmp_path, bench_file, pool, strategy="single:w0")
    got = estimate_run(request)
    assert got.usd is None and got.batch_usd is None and got.unpriced == ("w0",)
    code, out, err = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--strategy", "single:w0", "--estimate"
    )
    assert code == 0, out + err
    assert "USD unknown: no price is known for 'w0'" in out
    assert "this run pays" not in out


def test_batch_prices_stand_beside_live_ones_and_a_batched_run_pays_them(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6])
    workers = [worker(fake_server, w, price=PRICE) for w in ("w0", "h")]
    workers[1]["client"] = "http"  # an OpenAI-compatible server, no batch API
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, workers))
    (request,) = plan(tmp_path, bench_file, pool, strategy="moa", batch=True)
    got = estimate_run(request)
    w0, h = role(got, "w0"), role(got, "h")
    assert w0.batch_usd == pytest.approx(w0.usd / 2) and w0.batched
    # A client without a batch API pays the live price, --batch or not.
    assert h.batch_usd == h.usd and not h.batched
    assert got.run_usd == pytest.approx(w0.batch_usd + h.usd)


# -- singles and refusals ----------------------------------------------------------------


def test_singles_estimates_each_worker_alone_without_their_keys(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NO_KEY, raising=False)
    bench_file = words_benchmark(tmp_path, [3, 6])
    # Workers of a provider (no api_base), whose key is in a variable that is not set.
    workers = [
        {"id": w, "client": "openai", "model": w, "price": PRICE, "api_key_env": NO_KEY}
        for w in ("w0", "w1")
    ]
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, workers))
    run = tmp_path / "run"
    code, out, err = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--strategy", "singles",
        "--out", str(run), "--estimate",
    )  # fmt: skip
    assert code == 0, out + err
    assert "Estimate: words · single:w0" in out and "Estimate: words · single:w1" in out
    assert fake_server.requests == [] and not run.exists()
    # The run itself still asks for every key before it starts.
    code, _, err = bench(
        tmp_path, str(bench_file), "--pool", str(pool), "--strategy", "singles", "--out", str(run)
    )
    assert code == 2 and f"{NO_KEY} (for workers 'w0' and 'w1')" in err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--pilot", "2", "--estimate"), "give either --estimate"),
        (("--pilot", "0"), "N must be 1 or more, got 0"),
        (("--pilot", "2", "--fail-under", "80"), "--pilot scores only its first samples"),
        (("--estimate", "--junit", "x.xml"), "--estimate scores nothing: leave out --junit"),
    ],
)
def test_pilot_and_estimate_refuse_what_makes_no_sense(
    tmp_path: Path, fake_server: FakeLLMServer, extra: tuple[str, ...], says: str
) -> None:
    bench_file = words_benchmark(tmp_path, [3])
    pool = priced_pool(tmp_path, fake_server)
    code, out, err = bench(tmp_path, str(bench_file), "--pool", str(pool), *extra)
    assert code == 2, out + err
    assert says in err
    assert fake_server.requests == [] and not (tmp_path / "runs").exists()


def test_pilot_refuses_a_merge(tmp_path: Path) -> None:
    code, _, err = bench(tmp_path, "merge", str(tmp_path), "--out", str(tmp_path), "--pilot", "1")
    assert code == 2 and "--pilot applies to a run, not to bench merge" in err


def test_the_library_refuses_a_pilot_below_one() -> None:
    with pytest.raises(UsageError, match="N must be 1 or more"):
        plan_bench(BenchArgs(benchmark="smoke", pilot=-1))


# -- the run spends what was estimated ---------------------------------------------------


def script_varied(server: FakeLLMServer) -> None:
    """The Conductor writes workflows of 1, 2 and 3 steps in turn (each step after the
    first sees the ones before it); a worker's reply grows with what it is sent."""
    turns = itertools.count()

    def plan_reply(request: object) -> str:
        steps = next(turns) % 3 + 1
        subtasks = ["Solve it step by step.", "Check the work above.", "Give the answer."]
        access: list[list[str]] = [[]] + [["all"]] * (steps - 1)
        return lists([i % 2 for i in range(steps)], subtasks[:steps], access)

    def answer(request: Any) -> str:
        sent = sum(len(str(m["content"]).split()) for m in request.messages)
        return " ".join(["so"] * (8 + sent // 10)) + "\n\\boxed{1}\nANSWER: 1"

    server.script(CONDUCTOR_MODEL, plan_reply)
    server.script("w0", answer)
    server.script("w1", answer)


@pytest.mark.parametrize(
    ("benchmark", "strategy"),
    [
        ("smoke", "conductor"),
        ("smoke", "moa"),
        pytest.param("math", "conductor", marks=pytest.mark.process),
        pytest.param("math", "vote:3:w1", marks=pytest.mark.process),
    ],
)
def test_the_rest_of_a_piloted_run_spends_within_20_percent_of_its_estimate(
    tmp_path: Path, fake_server: FakeLLMServer, benchmark: str, strategy: str
) -> None:
    """The smoke benchmark and the math fixture (the math grader's children are the
    ``process`` mark's reason), the Conductor writing workflows of varying size."""
    script_varied(fake_server)
    pool = priced_pool(tmp_path, fake_server)
    given: dict[str, Any] = {"strategy": strategy, "no_cache": True}
    if benchmark == "math":
        given.update(data=FIXTURES / "math500.jsonl", epochs=4)  # 5 questions x 4
    name = "math500" if benchmark == "math" else "smoke"
    (whole,) = plan(tmp_path, name, pool, **given)
    ceiling = estimate_run(whole).run_usd
    (piloted,) = plan(tmp_path, name, pool, pilot=6, **given)
    progress = BenchSession(piloted).run()
    assert progress.done == 6 and len(read_samples(piloted.run_dir)) == 6
    rest = without_pilot(piloted)
    estimate = estimate_run(rest)
    assert estimate.pairs == 14 and estimate.measured == 6
    spent = BenchSession(rest).run().cost_usd
    assert estimate.run_usd is not None and ceiling is not None
    assert 0.8 <= estimate.run_usd / spent <= 1.2, (estimate.run_usd, spent)
    # Assumed, every reply as long as max_tokens allows: a ceiling.
    assert ceiling >= progress.cost_usd + spent


def test_an_estimate_leaves_a_torn_last_line_for_the_run_to_cut(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    run, _ = complete_run(tmp_path, fake_server)
    samples = run / "samples.jsonl"
    lines = samples.read_text().splitlines(keepends=True)
    samples.write_text(lines[0] + lines[1][:40])  # killed while writing the second
    before = samples.read_bytes()
    (request,) = plan_bench(BenchArgs(resume=run))
    got = estimate_run(request)
    assert (got.recorded, got.pairs, got.measured) == (1, 1, 1)
    assert samples.read_bytes() == before


def test_a_narrow_terminal_shows_every_model_name_whole(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3])
    long_name = "a-provider-model-name-too-long-for-an-eighty-column-table"
    workers = [worker(fake_server, "w0", price=PRICE, model=long_name)]
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, workers))
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    args = (str(bench_file), "--pool", str(pool), "--strategy", "single:w0", "--estimate")
    res = invoke_cli("bench", *args, env=env, columns=None)  # a pipe: 80 columns
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"w0 ({long_name})" in res.stdout
    assert "calls 1, tokens in 4, tokens out 256" in res.stdout


def test_the_estimate_is_set_against_the_runs_cap(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bench_file = words_benchmark(tmp_path, [3, 6, 9, 4])
    pool = priced_pool(tmp_path, fake_server)
    fake_server.script("w0", lambda r: "a b c")
    run = tmp_path / "run"
    given = (str(bench_file), "--pool", str(pool), "--strategy", "single:w0", "--out", str(run))
    # Assumed: about (prompt + 256) / 1000 dollars a pair, $1.05 for the four.
    _, out, _ = bench(tmp_path, *given, "--estimate", "--max-usd", "0.5")
    assert "--max-usd $0.50 stops it first, after about 48% of the pairs left" in out
    _, out, _ = bench(tmp_path, *given, "--estimate", "--max-usd", "10")
    assert "within its --max-usd $10.00" in out
    # A resume's cap counts what the records cost: (3 + 3 + 6 + 3) / 1000 after the pilot.
    assert bench(tmp_path, *given, "--pilot", "2")[0] == 0
    code, out, err = bench(tmp_path, "--resume", str(run), "--estimate", "--max-usd", "0.01")
    assert code == 0, out + err
    assert "--max-usd $0.01 is reached ($0.015 spent already)" in out
