"""The format warm start (``warm_start`` in a training config): its targets parse as
workflows over the listed workers with no preference among them, continue a prefill,
and a few supervised steps teach a tiny model to write the three lists."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import TrainConfigError, UsageError
from conductor.train.config import load_train_config_text
from conductor.train.settings import WarmStartSettings
from conductor.train.warmstart import warm_start_target
from conductor.workflow import parse_workflow

BASE = "base_model: gguf:smollm2\npool: local\ndata: [math500]\noutput_dir: out\n"


def test_targets_parse_over_the_listed_workers_and_favour_none() -> None:
    rng = random.Random(0)
    last = Counter()
    lengths = Counter()
    for _ in range(3000):
        text = warm_start_target(rng, 3, max_steps=5)
        workflow = parse_workflow(text, n_workers=3, max_steps=5)
        assert workflow.steps, text
        last[workflow.steps[-1].worker] += 1
        lengths[len(workflow.steps)] += 1
    # Uniform over the three workers (each ~1,000 of 3,000): the warm start must not
    # teach whom to ask.
    assert set(last) == {0, 1, 2}
    assert all(850 < n < 1150 for n in last.values()), last
    assert set(lengths) == {1, 2}


def test_one_step_limit_and_one_worker() -> None:
    rng = random.Random(1)
    for _ in range(200):
        workflow = parse_workflow(warm_start_target(rng, 1, max_steps=1), n_workers=1, max_steps=1)
        assert [s.worker for s in workflow.steps] == [0]
    with pytest.raises(UsageError, match="at least one worker"):
        warm_start_target(rng, 0, max_steps=3)


def test_a_prefill_is_continued_and_a_foreign_one_refused() -> None:
    rng = random.Random(2)
    text = warm_start_target(rng, 2, max_steps=3, prefill="model_id = [")
    assert not text.startswith("model_id")
    parse_workflow("model_id = [" + text, n_workers=2, max_steps=3)
    with pytest.raises(UsageError, match="prefill"):
        warm_start_target(rng, 2, max_steps=3, prefill="```json\n{")


def test_config_reads_true_false_and_a_mapping() -> None:
    assert load_train_config_text(BASE).warm_start is None
    assert load_train_config_text(BASE + "warm_start: true\n").warm_start == WarmStartSettings()
    assert load_train_config_text(BASE + "warm_start: false\n").warm_start is None
    got = load_train_config_text(BASE + "warm_start: {passes: 2, learning_rate: 5.0e-5}\n")
    assert got.warm_start == WarmStartSettings(passes=2, learning_rate=5e-5)
    with pytest.raises(TrainConfigError, match=r":5:.*warm_start.*mapping"):
        load_train_config_text(BASE + "warm_start: 3\n")
    with pytest.raises(TrainConfigError, match="passes"):
        load_train_config_text(BASE + "warm_start: {pases: 2}\n")
    with pytest.raises(TrainConfigError, match="warm_start.batch_size"):
        load_train_config_text(BASE + "warm_start: {batch_size: 0}\n")


pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.mark.slow
@pytest.mark.isolated
def test_warm_start_teaches_a_tiny_model_the_format(tmp_path: Path) -> None:
    """Before: the random tiny model writes nothing parseable; after the warm start its
    sampled replies parse, and their last worker is not one fixed choice."""
    import torch
    from kit.tinymodels import tiny_llama, tiny_tokenizer

    from conductor.llm.checkpoint_client import prompt_token_ids
    from conductor.train.warmstart import format_warm_start

    messages = [
        [{"role": "user", "content": f"Models: Model 0, Model 1. Q: What is {a} + {b}?"}]
        for a, b in ((2, 2), (3, 4), (5, 1), (6, 2))
    ]
    corpus = [m[0]["content"] for m in messages] + [
        warm_start_target(random.Random(i), 2, max_steps=2) for i in range(40)
    ]
    tok = tiny_tokenizer(corpus)
    model = tiny_llama(tok, seed=0, max_positions=512)
    rows: list[dict[str, Any]] = [{"prompt": m, "worker_ids": ["a", "b"]} for m in messages]

    def sample() -> list[str]:
        torch.manual_seed(0)
        out = []
        for m in messages:
            ids = torch.tensor([prompt_token_ids(tok, m)])
            gen = model.generate(
                ids,
                max_new_tokens=60,
                do_sample=True,
                temperature=0.3,
                pad_token_id=tok.pad_token_id,
            )
            out.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
        return out

    def parsed(texts: list[str]) -> list[Any]:
        found = []
        for text in texts:
            try:
                found.append(parse_workflow(text, n_workers=2, max_steps=2))
            except Exception:
                continue
        return found

    assert parsed(sample()) == []
    report = format_warm_start(
        model,
        tok,
        rows,
        WarmStartSettings(passes=120, learning_rate=5e-3, batch_size=8),
        max_steps=2,
        seed=0,
    )
    assert report.examples == 480 and len(report.losses) == 60
    assert report.losses[-1] < report.losses[0] / 5
    assert not model.training
    after = parsed(sample() + sample())
    assert len(after) >= 6, after


@pytest.mark.isolated
def test_micro_batches_give_the_whole_batchs_update() -> None:
    """The warm start scores a batch in micro-batches (its memory peak is one of them);
    weighted by their scored tokens they give the update of the whole batch at once."""
    import torch
    from kit.tinymodels import tiny_llama, tiny_tokenizer

    import conductor.train.warmstart as warmstart

    messages = [
        [{"role": "user", "content": f"Q{i}: What is {i} + {i}?" * (1 + i % 3)}] for i in range(8)
    ]
    corpus = [m[0]["content"] for m in messages] + [
        warm_start_target(random.Random(i), 3, max_steps=2) for i in range(20)
    ]
    tok = tiny_tokenizer(corpus)
    rows: list[dict[str, Any]] = [{"prompt": m, "worker_ids": ["a", "b", "c"]} for m in messages]
    settings = WarmStartSettings(passes=1, learning_rate=1e-2, batch_size=8)
    weights = []
    for micro in (8, 3, 1):
        model = tiny_llama(tok, seed=0, max_positions=512)
        report = warmstart.format_warm_start(
            model, tok, rows, settings, max_steps=2, seed=0, micro_batch=micro
        )
        assert len(report.losses) == 1
        weights.append((report.losses[0], [p.detach().clone() for p in model.parameters()]))
    (loss8, whole), *parts = weights
    for loss, got in parts:
        assert loss == pytest.approx(loss8, abs=1e-3)
        for a, b in zip(whole, got, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5)  # summation order differs
