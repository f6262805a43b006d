"""Per-step credit (issue 40): the estimators on hand-built records, the spans of each
step in a reply, the per-token advantages, and the reward's credits on a three-step
routing task served by the fake server, where only the second step's worker matters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import lists, pool_dict, worker, write_pool

from conductor.conductors.spec import Conductor
from conductor.errors import TrainConfigError
from conductor.grading import get_grader
from conductor.grading.types import Sample
from conductor.llm.cache import ResponseCache
from conductor.pool import Pool, load_pool
from conductor.record import CallRecord, RoundRecord, StepRecord
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, FakeRequest
from conductor.train.config import load_train_config_text
from conductor.train.credit import (
    answer_step,
    counterfactual_credit,
    descendant_credit,
    step_calls,
    step_failures,
    structure_credit,
    token_advantages,
    worker_edits,
)
from conductor.train.metrics import summarise_rollouts
from conductor.train.reward import RolloutResult, WorkflowReward
from conductor.train.settings import RewardSettings
from conductor.workflow import Step, Workflow, parse_workflow, step_spans

GOLD = "42"
SAMPLE = Sample(id="q", input={}, gold=GOLD, metadata={})


def _round(answers: list[str | None], *, cached: tuple[int, ...] = ()) -> RoundRecord:
    """A round whose step ``i`` answered ``answers[i]`` (None: the step failed)."""
    steps = [
        StepRecord(
            index=i,
            worker_index=0,
            worker_id="w0",
            model="m",
            subtask="s",
            access=["all"],
            visible_steps=list(range(i)),
            call=CallRecord(
                messages=[],
                response=answer,
                error=None if answer is not None else "boom",
                cached=i in cached,
            ),
            answer=answer,
            status="ok" if answer is not None else "failed",
        )
        for i, answer in enumerate(answers)
    ]
    return RoundRecord(index=0, steps=steps)


# --------------------------------------------------------------------------- estimators


def test_structure_credit_spreads_the_penalty_over_the_failed_steps() -> None:
    grader = get_grader("short")
    rnd = _round(["7", None, "42", "9"])
    failed = step_failures(rnd, 4, SAMPLE, grader)
    # Wrong, an error, right, wrong: a step fails on its own answer, not the plan's.
    assert failed == [True, True, False, True]
    assert structure_credit(failed) == pytest.approx([-1 / 3, -1 / 3, 0.0, -1 / 3])
    assert structure_credit([False, False]) == [0.0, 0.0]
    # A step of the plan that never ran (no record) counts as failed.
    assert step_failures(_round(["42"]), 2, SAMPLE, grader) == [False, True]


def test_descendant_credit_follows_access_lists_transitively_to_the_final_answer() -> None:
    # 0 -> 1 -> 3 (final); 2 sees 0 but nothing sees 2.  Quality: 0 wrong, 1 right,
    # 2 right, 3 right.
    visible = [(), (0,), (0,), (1,)]
    quality = [0.0, 1.0, 1.0, 1.0]
    credit = descendant_credit(quality, visible, final=3)
    # Gains: 0 -> 0, 1 -> 1 (right over a wrong input), 2 -> 1, 3 -> 0 (kept it right).
    # Step 0's subgraph on the way to the answer is {0, 1, 3}: 3 sees 0 only through
    # 1 (a walk over direct readers alone would find step 0 never reaches the answer and
    # give it 0); step 2's gain never reaches the answer, so it counts for nobody.
    assert credit == [1.0, 1.0, 0.0, 0.0]
    # A chain where the gain is two steps down: only the transitive walk credits step 0.
    chain = descendant_credit([0.0, 0.0, 1.0], [(), (0,), (1,)], final=2)
    assert chain == [1.0, 1.0, 1.0]
    # A step that made a right answer wrong loses credit, and so do its ancestors.
    assert descendant_credit([1.0, 0.0], [(), (0,)], final=1) == [0.0, -1.0]
    # No answer at all: nothing to credit.
    assert descendant_credit([1.0, 1.0], [(), (0,)], final=None) == [0.0, 0.0]


def test_answer_step_is_the_last_step_that_answered() -> None:
    assert answer_step(_round(["7", "42", None])) == 1
    assert answer_step(_round([None])) is None


def test_counterfactual_edits_change_one_worker_and_credit_is_the_gap_to_their_mean() -> None:
    plan = Workflow((Step(0, "a"), Step(1, "b", "all"), Step(0, "c", (1,))))
    edits = worker_edits(plan, 3)
    assert [len(e) for e in edits] == [2, 2, 2]
    for i, plans in enumerate(edits):
        for edited in plans:
            differ = [j for j in range(3) if edited.steps[j] != plan.steps[j]]
            assert differ == [i]
            assert edited.steps[i].subtask == plan.steps[i].subtask
            assert edited.steps[i].access == plan.steps[i].access
    assert {p.steps[1].worker for p in edits[1]} == {0, 2}
    assert counterfactual_credit(1.0, [[1.0, 1.0], [0.5, 0.0], []]) == [0.0, 0.75, 0.0]


def test_step_calls_count_cache_hits_apart() -> None:
    calls = step_calls(_round(["a", "b", None], cached=(0,)), 3)
    assert (calls.made, calls.cached) == ([0, 1, 1], [1, 0, 0])
    calls.add(step_calls(_round(["a", "b"], cached=(0, 1)), 2))
    assert (calls.made, calls.cached) == ([0, 1, 1], [2, 1, 0])


# --------------------------------------------------------------------------- spans, tokens


def test_step_spans_locate_each_steps_entries_in_the_reply() -> None:
    plan = lists([2, 0, 1], ["Draft, roughly", "Solve [it]", "Report"], [[], ["all"], [0, 1]])
    text = (
        "<think>model_id = [9]\nsubtasks = ['decoy']\naccess_list = [[]]</think>\n"
        f"```python\n{plan}\n```"
    )
    spans = step_spans(text, 3)
    assert spans is not None
    assert [[text[a:b] for a, b in step] for step in spans] == [
        ["2", '"Draft, roughly"', "[]"],
        ["0", '"Solve [it]"', '["all"]'],
        ["1", '"Report"', "[0, 1]"],
    ]
    # The spans are those of the plan the parser takes.
    workflow = parse_workflow(text, n_workers=3)
    assert [s.worker for s in workflow.steps] == [2, 0, 1]
    # A count that does not match the lists: not located.
    assert step_spans(text, 2) is None
    assert step_spans("no plan here", 1) is None


def test_token_advantages_give_each_steps_tokens_its_credit() -> None:
    # Characters 0-9 are step 0's, 10-19 step 1's; tokens are 5 characters wide and the
    # last one (20-25) is outside every step.
    spans = [[(0, 10)], [(10, 20)]]
    out = token_advantages(0.5, [5, 10, 15, 20, 25], spans, [0.0, 1.0], weight=0.5)
    assert out == [0.5, 0.5, 1.0, 1.0, 0.5]
    # A token straddling two steps takes the first one's credit.
    assert token_advantages(0.0, [12], spans, [-1.0, 1.0], weight=1.0) == [-1.0]


def test_credit_advantages_weight_the_second_steps_tokens_with_a_real_tokenizer() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    from kit.tinymodels import tiny_tokenizer

    from conductor.train.grpo import credit_advantages

    plan = lists([0, 1, 0], ["Draft", "Solve", "Report"], [[], ["all"], ["all"]])
    tok = tiny_tokenizer([plan, "Some reasoning first. " + plan])
    texts = ["Some reasoning first.\n" + plan, plan]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows) + 2
    pad = tok.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    results = [
        RolloutResult(1.0, True, True, 3, credits=[0.0, 0.5, 0.0], spans=step_spans(t, 3))
        for t in texts
    ]
    results[1].credits = None  # an outcome-only row keeps one advantage
    advantages = torch.tensor([0.25, -0.5])
    out = credit_advantages(advantages, ids, mask, results, tok, weight=2.0)
    assert out.shape == ids.shape
    assert torch.all(out[1] == -0.5)
    row = out[0, : len(rows[0])].tolist()
    boosted = [t for t, v in enumerate(row) if v == pytest.approx(1.25)]
    assert boosted and set(row) == {0.25, 1.25}
    # The boosted tokens write exactly the second step's entries: "1", "Solve", ["all"].
    written = "".join(tok.decode([rows[0][t]]) for t in boosted)
    assert "1" in written and "Solve" in written and "all" in written
    assert "Draft" not in written and "Report" not in written


# --------------------------------------------------------------------------- config


def test_credit_is_a_config_choice_and_refused_with_recursion(tmp_path: Path) -> None:
    base = "base_model: m\npool: local\ndata: [math500]\noutput_dir: out\n"
    assert load_train_config_text(base).credit == "outcome"
    config = load_train_config_text(base + "credit: counterfactual\ncredit_weight: 0.5\n")
    assert (config.credit, config.credit_weight) == ("counterfactual", 0.5)
    with pytest.raises(TrainConfigError, match="credit must be one of"):
        load_train_config_text(base + "credit: shapley\n")
    with pytest.raises(TrainConfigError, match="recursion"):
        load_train_config_text(base + "recursion: {}\ncredit: structure\n")


# --------------------------------------------------------------------------- the reward


def routing_worker(good: bool) -> Any:
    """A worker of the three-step routing task.  Its subtask is the last line of the
    message: "Draft" (a wrong guess from anyone), "Solve" (right only from the good
    worker), "Report" (repeats the last answer it was shown)."""

    def answer(request: FakeRequest) -> str:
        text = request.last_user_message
        task = text.rsplit("\n", 1)[-1]
        if "Report" in task:
            seen = text.rsplit("\\boxed{", 1)
            return "\\boxed{" + seen[1].split("}", 1)[0] + "}" if len(seen) == 2 else "none"
        if "Solve" in task and good:
            return f"\\boxed{{{GOLD}}}"
        return "\\boxed{7}"

    return answer


@pytest.fixture
def routing_pool(tmp_path: Path, fake_server: FakeLLMServer) -> Pool:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    workers = [worker(fake_server, f"w{i}", max_retries=0, price=price) for i in range(3)]
    for i in range(3):
        fake_server.script(f"w{i}", routing_worker(good=i == 1))
    data = pool_dict(fake_server, workers)
    del data["conductor"]
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


@pytest.fixture
def make_reward(routing_pool: Pool, tmp_path: Path) -> Iterator[Any]:
    made: list[WorkflowReward] = []
    conductor = Conductor(
        backend="prompted", target=Worker(id="conductor", model="policy"), max_steps=3
    )

    def make(credit: str) -> WorkflowReward:
        cache = ResponseCache(tmp_path / f"cache-{credit}", write_behind=False)
        reward = WorkflowReward(
            routing_pool, conductor, RewardSettings(), cache=cache, credit=credit
        )
        made.append(reward)
        return reward

    yield make
    for reward in made:
        reward.close()


def _columns(n: int) -> dict[str, list[Any]]:
    row = {
        "question": "What is 6 * 7?",
        "sample_id": "q1",
        "gold": json.dumps(GOLD),
        "grader": "short",
        "grader_options": "{}",
        "sample": json.dumps({"input": {}, "metadata": {}}),
    }
    return {k: [v] * n for k, v in row.items()}


PLAN = lists([0, 1, 2], ["Draft", "Solve", "Report"], [[], ["all"], ["all"]])


@pytest.mark.process
def test_reward_credits_only_the_second_step_counterfactually_with_cache_hits(
    make_reward: Any,
) -> None:
    reward = make_reward("counterfactual")
    assert reward(prompts=["p"], completions=[PLAN], **_columns(1)) == [1.0]
    (result,) = reward.last_batch
    # Swapping the Solve step's worker loses the answer (0.5 each); the others do not.
    assert result.credits == [0.0, 0.5, 0.0]
    assert result.spans is not None and len(result.spans) == 3
    calls = result.step_calls
    assert calls is not None
    # The actual run (3 calls), then 2 edits per step.  A step that is not edited and
    # sees no edited step sends its call again unchanged: a cache hit.  Step 0: hit by
    # the 4 edits of steps 1 and 2.  Step 1: hit by the 2 edits of step 2 only (it sees
    # step 0, whose worker is named in what it is shown).  Step 2 sees both earlier
    # steps, so every edit sends it something new.
    assert (calls.made, calls.cached) == ([3, 5, 7], [4, 2, 0])
    line = summarise_rollouts(reward.last_batch)
    assert line["calls_by_step"] == calls.made and line["cached_by_step"] == calls.cached
    assert line["credit_by_step"] == [0.0, 0.5, 0.0]


@pytest.mark.process
def test_counterfactual_edits_are_charged_the_rows_cost_weight(make_reward: Any) -> None:
    # A cost-conditioned row: the actual plan and its edits must be scored with the
    # same weight, or the credit measures the weight, not the step.
    reward = make_reward("counterfactual")
    columns = _columns(1) | {"cost_weight": [1000.0]}
    (score,) = reward(prompts=["p"], completions=[PLAN], **columns)
    assert score < 0.95  # the weight is charged on the actual run
    (result,) = reward.last_batch
    assert result.credits is not None
    # The edits cost about what the actual plan costs, so the Solve step keeps about
    # the 0.5 it is worth; charging them nothing would move it by the whole charge.
    assert result.credits[1] == pytest.approx(0.5, abs=0.2 * (1 - score))
    assert result.credits[0] == pytest.approx(0.0, abs=0.2 * (1 - score))


@pytest.mark.process
def test_reward_structure_and_descendant_credit_on_the_routing_task(make_reward: Any) -> None:
    wrong = lists([1, 0, 2], ["Draft", "Solve", "Report"], [[], ["all"], ["all"]])
    structure = make_reward("structure")
    assert structure(prompts=["p"] * 2, completions=[PLAN, wrong], **_columns(2)) == [1.0, 0.5]
    right_plan, wrong_plan = structure.last_batch
    # The Draft step is always wrong, so structure blames it in the right plan too.
    assert right_plan.credits == [-1.0, 0.0, 0.0]
    assert wrong_plan.credits == pytest.approx([-1 / 3] * 3)
    descendant = make_reward("descendant")
    descendant(prompts=["p"] * 2, completions=[PLAN, wrong], **_columns(2))
    right_plan, wrong_plan = descendant.last_batch
    # Right plan: the Solve step's gain reaches the answer through Report; Draft's
    # subgraph holds it too.  Wrong plan: no step gained anything.
    assert right_plan.credits == [1.0, 1.0, 0.0]
    assert wrong_plan.credits == [0.0, 0.0, 0.0]
    # The outcome credit computes no step credit, and counts the plan's own calls only.
    outcome = make_reward("outcome")
    outcome(prompts=["p"], completions=[PLAN], **_columns(1))
    (result,) = outcome.last_batch
    assert result.credits is None and result.step_calls is not None
    assert (result.step_calls.made, result.step_calls.cached) == ([1, 1, 1], [0, 0, 0])
