"""Training rows: one per question, in the conversational shape TRL's GRPOTrainer reads.

Each row holds the Conductor's prompt (``prompt``: one user message) and everything the
reward needs to execute and grade a completion without looking anything up again: the
rendered benchmark question, the sample (JSON), the gold answer (JSON), the grader and
its options, the ids of the workers the prompt lists (in order) and, for recursion rows,
the first round's record and the reward it earned.  A cost-conditioned run
(``reward.cost_weights``) adds ``cost_weight``: the weight the row's prompt states and
its reward charges per USD.  TRL repeats a row for each completion of its group, so the
whole group shares it.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

from ..bench.spec import load_benchmark, training_spec
from ..benchmark import BenchmarkSpec
from ..conductors.prompt import build_conductor_messages
from ..conductors.spec import Conductor
from ..datasets.samples import render_prompt, sample_subset
from ..errors import UsageError
from ..grading import Grader, get_grader
from ..grading.code import with_unsafe_opt_in
from ..grading.types import Sample
from ..pool import Pool
from ..record import RunRecord, record_to_dict
from .pools import SubPool, sample_subpool, subpool_from_ids
from .recursion import can_revise, revision_messages
from .reward import score_record
from .settings import DataMix, TrainConfig

__all__ = ["build_rows", "draw_cost_weight", "mix_spec"]

log = logging.getLogger("conductor")


def mix_spec(mix: DataMix) -> BenchmarkSpec:
    """The benchmark a mix entry reads, with its source chosen by ``split``.

    ``split="train"`` reads the benchmark's ``train_source`` (its fields, filters and
    balance fields).  ``mix.file``, when set, is read instead (it is passed to
    :func:`~conductor.datasets.samples.sample_subset` as ``data_file``) in the benchmark's own
    (evaluation) schema, whatever the split, except for a train_source with a seeded
    ``select``: the file is then a copy of the dataset that selection cuts its training
    part from, and is read as the train_source.  A benchmark without a train_source cannot be
    used with ``split: train`` and no file: that would train on its evaluation questions
    (:class:`UsageError`; the config loader refuses it earlier, naming the line).
    """
    spec = load_benchmark(mix.benchmark)
    if mix.split != "train":
        return spec
    train = training_spec(spec)
    # A training part cut by a seeded selection (the paper sets') is read from a local
    # copy of the dataset with that selection: the evaluation source would give the
    # file its own selection, the test part, and train on the very questions held out.
    if mix.file is not None and (train is None or train.source.select is None):
        return spec
    if train is not None:
        return train
    raise UsageError(
        f"benchmark {spec.name} has no train_source, so split: train would train on its "
        "evaluation questions; give data[].file (training questions in its schema) or "
        "split: test"
    )


def draw_cost_weight(weights: tuple[float, ...], seed: int, sample_id: str) -> float:
    """The cost weight of question ``sample_id``: one of ``weights``, drawn by a random
    stream seeded with the run's ``seed`` and the question's id alone.

    Why by the question and not by a shared stream: the draw then does not depend on
    which other questions the mix holds, their order or how many processes build rows,
    so a rerun, a resumed run and every process of a multi-process run give a
    question the same weight.
    """
    if not weights:
        raise UsageError("no cost weights to draw from")
    return random.Random(f"cost-weight:{seed}:{sample_id}").choice(weights)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _record_workers(record: RunRecord, pool: Pool) -> SubPool | None:
    """The (sub-)pool ``record`` ran on, in its order, or None if ``pool`` lacks one of
    its workers."""
    ids = [str(w.get("id")) for w in (record.pool or {}).get("workers", [])]
    if not ids:
        return None
    try:
        return subpool_from_ids(pool, ids)
    except UsageError:
        return None


def build_rows(
    config: TrainConfig,
    pool: Pool,
    conductor: Conductor,
    *,
    rng_seed: int,
    first_rounds: dict[str, RunRecord] | None = None,
) -> list[dict[str, Any]]:
    """The training rows for ``config``: every question of every data mix, in order.

    With ``config.randomise_pool``, each row lists a random sub-pool (drawn with
    ``random.Random(rng_seed)``, so the same seed gives the same rows); otherwise the
    full pool.  With ``config.recursion`` and ``first_rounds`` (sample id -> a first-round
    record of that question), ``recursion.fraction`` of the rows whose sample has a
    revisable record become revision rows: their prompt is the round-2 prompt over the
    workers that record ran on, ``round1`` its JSON and ``round1_reward`` the reward it
    earned under ``config.reward``.  Prompts use ``conductor``'s template, step limit,
    description setting and ``subtasks``, as the executor's do.  Raises
    :class:`UsageError` when no question is found.
    """
    rng = random.Random(rng_seed)
    full = SubPool(pool=pool, original_index=tuple(range(len(pool.workers))))
    rows: list[dict[str, Any]] = []
    samples: list[tuple[Sample, Grader]] = []
    for mix in config.data:
        spec = mix_spec(mix)
        options = with_unsafe_opt_in(
            spec.grader, spec.grader_options, config.confirm_run_unsafe_code
        )
        grader = get_grader(spec.grader, options)
        # A seeded sample, balanced over the source's groups (subjects, levels, ...).
        picked = sample_subset(spec, data_file=mix.file, seed=config.seed, limit=mix.limit)
        for sample in picked:
            question = render_prompt(spec, sample)
            sub = full
            if config.randomise_pool is not None:
                k = config.randomise_pool
                sub = sample_subpool(pool, rng, k.k_min, k.k_max)
            weight = None
            if config.reward.cost_weights:
                weight = draw_cost_weight(config.reward.cost_weights, config.seed, sample.id)
            messages = build_conductor_messages(
                question,
                sub.pool.workers,
                max_steps=conductor.max_steps,
                template=conductor.template,
                show_descriptions=conductor.show_descriptions,
                subtasks=conductor.subtasks,
                cost_weight=weight,
            )
            row: dict[str, Any] = {
                "prompt": [dict(m) for m in messages],
                "question": question,
                "sample_id": sample.id,
                "gold": _dumps(sample.gold),
                "grader": spec.grader,
                "grader_options": _dumps(options),
                "sample": _dumps({"input": sample.input, "metadata": sample.metadata}),
                "worker_ids": sub.worker_ids,
                "round1": "",
                "round1_reward": 0.0,
            }
            if weight is not None:
                row["cost_weight"] = weight
            rows.append(row)
            samples.append((sample, grader))
    if not rows:
        names = ", ".join(m.benchmark for m in config.data)
        raise UsageError(f"the training data ({names}) holds no questions")
    if config.recursion is not None and first_rounds:
        _add_revisions(config, pool, conductor, rows, samples, first_rounds, rng)
    return rows


def _add_revisions(
    config: TrainConfig,
    pool: Pool,
    conductor: Conductor,
    rows: list[dict[str, Any]],
    samples: list[tuple[Sample, Grader]],
    first_rounds: dict[str, RunRecord],
    rng: random.Random,
) -> None:
    """Turn ``recursion.fraction`` of the eligible rows into revision rows, in place."""
    assert config.recursion is not None
    eligible: list[tuple[int, SubPool]] = []
    for i, row in enumerate(rows):
        record = first_rounds.get(row["sample_id"])
        if record is None or not can_revise(record):
            continue
        sub = _record_workers(record, pool)
        if sub is None:
            log.warning(
                "recursion: the first round of %s ran on workers the pool lacks; skipped",
                row["sample_id"],
            )
            continue
        eligible.append((i, sub))
    count = round(config.recursion.fraction * len(eligible))
    for i, sub in sorted(rng.sample(eligible, count), key=lambda item: item[0]):
        record = first_rounds[rows[i]["sample_id"]]
        sample, grader = samples[i]
        messages = revision_messages(record, sub.pool.workers, conductor)
        rows[i].update(
            prompt=[dict(m) for m in messages],
            worker_ids=sub.worker_ids,
            round1=_dumps(record_to_dict(record)),
            round1_reward=float(score_record(record, sample, grader, config.reward)),
        )
