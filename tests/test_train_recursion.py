"""On-policy recursion training without TRL: pairing, the mixed reward, GRPO advantages.

A "policy" here is a function that writes each revision from the round-2 prompt it is
given, so the tests can tell which round-1 plan each revision saw.  Workers are served
by the fake LLM server and answer right when their subtask says "right".
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import lists, pool_dict, worker, write_pool

from conductor.conductors.spec import Conductor
from conductor.llm.types import Message
from conductor.pool import Pool, load_pool
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, FakeRequest
from conductor.train.dataset import build_rows
from conductor.train.metrics import summarise_rollouts
from conductor.train.recursion import (
    RECURSION_COLUMN,
    ROLLOUT_COLUMN,
    RecursionReward,
    mark_recursion_rows,
    mixed_reward,
    pair_slots,
    recursion_rollouts,
    revision_messages,
)
from conductor.train.reward import RolloutResult, WorkflowReward
from conductor.train.settings import DataMix, RecursionSettings, RewardSettings, TrainConfig

GOLD = "42"
WRONG_A = lists([1], ["Variant alpha: compute it, get it wrong"], [[]])
WRONG_B = lists([2], ["Variant beta: compute it, get it wrong"], [[]])
RIGHT = lists([0], ["Compute it right"], [[]])
FIX = lists([3], ["Fix the earlier answer, say it right"], [[]])
BREAK = lists([3], ["Redo it, get it wrong"], [[]])
KEEP = lists([], [], [])


def answering(request: FakeRequest) -> str:
    task = request.last_user_message.rsplit("\n", 1)[-1]
    return f"\\boxed{{{GOLD}}}" if "right" in task else "\\boxed{7}"


@pytest.fixture
def pool(tmp_path: Path, fake_server: FakeLLMServer) -> Pool:
    workers = [worker(fake_server, f"w{i}", max_retries=0) for i in range(4)]
    for i in range(4):
        fake_server.script(f"w{i}", answering)
    data = pool_dict(fake_server, workers)
    del data["conductor"]
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


@pytest.fixture
def conductor() -> Conductor:
    return Conductor(backend="prompted", target=Worker(id="conductor", model="policy"), max_steps=4)


@pytest.fixture
def reward(pool: Pool, conductor: Conductor) -> Iterator[WorkflowReward]:
    made = WorkflowReward(pool, conductor, RewardSettings())
    yield made
    made.close()


@pytest.fixture
def group(tmp_path: Path, pool: Pool, conductor: Conductor) -> dict[str, list[Any]]:
    """One marked question repeated as a GRPO group of 8 rows, as TRL's reward columns."""
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"problem": "What is 6 * 7?", "answer": GOLD, "unique_id": "q"}))
    config = TrainConfig(
        base_model="x/y",
        pool=str(pool.path),
        data=(DataMix(benchmark="math500", file=str(path)),),
        output_dir="unused",
        max_steps=4,
        recursion=RecursionSettings(fraction=1.0),
    )
    rows = build_rows(config, pool, conductor, rng_seed=0)
    assert mark_recursion_rows(rows, 1.0, seed=0) == 1
    batch = rows * 8
    return {key: [row[key] for row in batch] for key in batch[0]}


class Policy:
    """Writes a revision from what the round-2 prompt shows; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[list[Message]]] = []

    def __call__(self, prompts: list[list[Message]]) -> list[str]:
        self.calls.append(prompts)
        out = []
        for messages in prompts:
            text = messages[-1]["content"]
            # Fixes plan alpha, breaks plan beta, keeps any other answer.
            if "Variant alpha" in text:
                out.append(FIX)
            elif "Variant beta" in text:
                out.append(BREAK)
            else:
                out.append(KEEP)
        return out


def grpo_advantages(rewards: Sequence[float | None], group_size: int) -> list[float]:
    """Group-normalised advantages as TRL's GRPOTrainer computes them (scale "group"):
    (reward - group mean) / (unbiased group std + 1e-4), unscored rows excluded from the
    statistics and given 0."""
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        chunk = rewards[start : start + group_size]
        scored = [float(r) for r in chunk if r is not None]
        mean = statistics.fmean(scored)
        std = statistics.stdev(scored) if len(scored) > 1 else 0.0
        out += [0.0 if r is None else (r - mean) / (std + 1e-4) for r in chunk]
    return out


def test_pairs_marks_and_mix() -> None:
    flags = [True, True, True, True, False, False, True, True, True]
    ids = ["a", "a", "a", "a", "b", "b", "c", "c", "c"]
    assert pair_slots(flags, ids) == [(0, 1), (2, 3), (6, 7)]
    # Neighbours of different questions are never paired.
    assert pair_slots([True, True], ["a", "b"]) == []
    rows: list[dict[str, Any]] = [{} for _ in range(10)]
    assert mark_recursion_rows(rows, 0.5, seed=4) == 5
    again: list[dict[str, Any]] = [{} for _ in range(10)]
    mark_recursion_rows(again, 0.5, seed=4)
    assert rows == again and sum(r[RECURSION_COLUMN] for r in rows) == 5
    assert mixed_reward(0.5, 1.0, 0.2) == pytest.approx(0.6)
    assert mixed_reward(0.5, 1.0, 0.0) == 0.5


@pytest.mark.process
def test_round1_reward_follows_its_own_revision(
    group: dict[str, list[Any]], reward: WorkflowReward, pool: Pool, conductor: Conductor
) -> None:
    # Pairs: (alpha -> fixed), (beta -> broken), (right -> kept), (alpha -> fixed).
    firsts = [WRONG_A, "", WRONG_B, "", RIGHT, "", WRONG_A, ""]
    policy = Policy()
    batch = recursion_rollouts(reward, group, firsts, discount=0.2, generate=policy)
    assert len(policy.calls) == 1 and len(policy.calls[0]) == 4
    assert batch.revised == [1, 3, 5, 7]
    rewards = [r.reward for r in batch.results]
    # Round-1 rows: 0.8 * r1 + 0.2 * own r2; round-2 rows: r2 alone.
    assert rewards == pytest.approx([0.6, 1.0, 0.5, 0.5, 1.0, 1.0, 0.6, 1.0])
    # The same wrong answer earns more when its own revision succeeds.
    alpha, beta = batch.results[0], batch.results[2]
    assert alpha.round_reward == beta.round_reward == 0.5
    assert alpha.reward is not None and beta.reward is not None and alpha.reward > beta.reward
    fixed = batch.results[1]
    assert (fixed.round, fixed.round_reward, fixed.previous_reward) == (2, 1.0, 0.5)
    assert fixed.workers == ["w3"] and fixed.calls == 1  # round 2's own work only

    # Each revision continued its partner's round 1, and the prompt the policy sampled
    # from is the one the executor recorded for that round 2.
    for k, j in enumerate(batch.revised):
        record = batch.results[j].record
        assert record is not None and len(record.rounds) == 2
        assert record.rounds[0].conductor_calls[0].response == firsts[j - 1]
        assert record.rounds[1].conductor_calls[0].messages == batch.prompts[k]
        first = batch.results[j - 1].record
        assert first is not None and len(first.rounds) == 1  # the round-1 record is intact
        workers = subpool_workers(pool, first)
        assert batch.prompts[k] == revision_messages(first, workers, conductor)
    kept = batch.results[5].record
    assert kept is not None and kept.final_answer == f"\\boxed{{{GOLD}}}"


def subpool_workers(pool: Pool, record: Any) -> list[Any]:
    ids = [w["id"] for w in record.pool["workers"]]
    by_id = {w.id: w for w in pool.workers}
    return [by_id[i] for i in ids]


@pytest.mark.process
def test_discount_moves_round1_advantages(
    group: dict[str, list[Any]], reward: WorkflowReward
) -> None:
    firsts = [WRONG_A, "", WRONG_B, "", RIGHT, "", WRONG_B, ""]

    def advantages(discount: float) -> list[float]:
        batch = recursion_rollouts(reward, group, firsts, discount=discount, generate=Policy())
        return grpo_advantages([r.reward for r in batch.results], 8)

    low, paper, high = advantages(0.0), advantages(0.2), advantages(0.5)
    round1 = [0, 2, 4, 6]
    for a, b in ((low, paper), (paper, high)):
        assert any(abs(a[i] - b[i]) > 1e-3 for i in round1), (a, b)
    # Alpha (revised into a right answer) pulls ahead of beta (revised into a wrong one)
    # as the discount grows; with no discount they are level.
    assert low[0] == pytest.approx(low[2])
    assert paper[0] > paper[2] and high[0] - high[2] > paper[0] - paper[2]


@pytest.mark.process
def test_nothing_to_revise_leaves_round1_reward_and_no_revision_signal(
    group: dict[str, list[Any]], reward: WorkflowReward
) -> None:
    firsts = ["no lists here", "", RIGHT, "", "still none", "", RIGHT, ""]
    policy = Policy()
    batch = recursion_rollouts(reward, group, firsts, discount=0.2, generate=policy)
    assert [len(p) for p in policy.calls] == [2]  # only the parsed plans are revised
    assert batch.revised == [3, 7]
    rewards = [r.reward for r in batch.results]
    assert rewards == [0.0, None, 1.0, 1.0, 0.0, None, 1.0, 1.0]
    assert grpo_advantages(rewards, 8)[1] == 0.0

    # The policy is asked once even when nothing at all can be revised.
    nothing = Policy()
    batch = recursion_rollouts(reward, group, ["x"] * 8, discount=0.2, generate=nothing)
    assert nothing.calls == [[]] and batch.revised == []

    # TRL's reward function returns the scores handed over with the batch; metrics skip
    # the unscored revision slots.
    scorer = RecursionReward()
    columns = {ROLLOUT_COLUMN: batch.results}
    assert scorer(prompts=[""] * 8, completions=[""] * 8, **columns) == [
        0.0,
        None,
        0.0,
        None,
        0.0,
        None,
        0.0,
        None,
    ]
    assert summarise_rollouts(scorer.last_batch)["rollouts"] == 4


def test_metrics_count_revisions_and_their_gain() -> None:
    results = [
        RolloutResult(0.6, True, False, 1, ["a"], 1, 0.0, None, round=1, round_reward=0.5),
        RolloutResult(1.0, True, True, 1, ["b"], 1, 0.0, None, 2, 1.0, 0.5),
        RolloutResult(0.5, True, False, 1, ["a"], 1, 0.0, None, round=1, round_reward=0.5),
        RolloutResult(0.5, True, False, 1, ["b"], 1, 0.0, None, 2, 0.5, 0.5),
        RolloutResult(None, False, None, 0, round=2),
    ]
    summary = summarise_rollouts(results)
    assert summary["rollouts"] == 4 and summary["revisions"] == 2
    assert summary["revision_gain"] == pytest.approx(0.25)
    assert summary["reward_mean"] == pytest.approx(0.65)


def test_recursion_needs_whole_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from conductor.errors import UsageError
    from conductor.train.settings import GRPOSettings
    from conductor.train.trainer import check_recursion_layout

    config = TrainConfig(
        base_model="x/y",
        pool="local",
        data=(DataMix(benchmark="math500"),),
        output_dir="unused",
        grpo=GRPOSettings(group_size=4, questions_per_step=3),
        recursion=RecursionSettings(),
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_recursion_layout(config)  # 12 completions, 6 per process: whole pairs
    odd = dataclasses.replace(config, grpo=GRPOSettings(group_size=3, questions_per_step=2))
    with pytest.raises(UsageError, match=r"group_size \(3\)"):
        check_recursion_layout(odd)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UsageError, match="3 completions per step must be even"):
        check_recursion_layout(config)
    check_recursion_layout(dataclasses.replace(config, recursion=None))


def _grpo_batch(rows: list[dict[str, Any]], group_size: int) -> tuple[list[Any], list[Any]]:
    """The recursion flags and sample ids of one generation batch as TRL lays it out:
    each question's row repeated ``group_size`` times, next to each other."""
    batch = [row for row in rows for _ in range(group_size)]
    return [r[RECURSION_COLUMN] for r in batch], [r["sample_id"] for r in batch]


@pytest.mark.parametrize("group_size", [2, 8, 64])
def test_fraction_one_revises_every_question_with_half_of_its_group(group_size: int) -> None:
    """fraction 1.0 is the authors' layout: their trainer marks every question and gives
    the first half of its group to round 1 and the second half to revisions of those
    plans (the k-th revising the k-th).  Here each neighbouring pair is (plan, its
    revision): the same counts per group, so GRPO's per-group normalisation sees the
    same mix of rounds."""
    rows: list[dict[str, Any]] = [{"sample_id": f"q{i}"} for i in range(5)]
    assert mark_recursion_rows(rows, 1.0, seed=3) == 5
    flags, ids = _grpo_batch(rows, group_size)
    pairs = pair_slots(flags, ids)
    firsts, revisions = {i for i, _ in pairs}, {j for _, j in pairs}
    for start in range(0, len(flags), group_size):
        group = set(range(start, start + group_size))
        assert len(group & firsts) == len(group & revisions) == group_size // 2
    # Every rollout is in exactly one pair, each revision right after its own plan.
    assert firsts | revisions == set(range(len(flags))) and not firsts & revisions
    assert all(j == i + 1 and ids[i] == ids[j] for i, j in pairs)
    # Split over processes and micro-batches of an even size, the pairs stay whole.
    chunk = 2
    assert [
        (i + s, j + s)
        for s in range(0, len(flags), chunk)
        for i, j in pair_slots(flags[s : s + chunk], ids[s : s + chunk])
    ] == pairs


def test_a_smaller_fraction_marks_that_share_of_the_questions() -> None:
    rows: list[dict[str, Any]] = [{"sample_id": f"q{i}"} for i in range(6)]
    assert mark_recursion_rows(rows, 0.5, seed=1) == 3
    flags, ids = _grpo_batch(rows, 4)
    pairs = pair_slots(flags, ids)
    marked = {r["sample_id"] for r in rows if r[RECURSION_COLUMN]}
    assert len(pairs) == 3 * 2  # each marked group of 4: two (plan, revision) pairs
    assert {ids[i] for i, _ in pairs} == marked
    assert mark_recursion_rows(rows, 0.0, seed=1) == 0
    assert pair_slots(*_grpo_batch(rows, 4)) == []


def test_recursion_defaults_to_the_authors_layout() -> None:
    assert RecursionSettings() == RecursionSettings(fraction=1.0, discount=0.2)
