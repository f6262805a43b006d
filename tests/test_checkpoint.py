"""The ``checkpoint`` Conductor backend: conductor.json metadata and the in-process client.

The models here are built in the test (a 2-layer Llama with hidden size 64 and a
byte-level BPE tokenizer trained on a few lines), so nothing is downloaded.  One of
them is trained for a few dozen steps to reproduce a workflow, so that generation
through :class:`CheckpointClient` can be checked against the real workflow parser.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from conductor.conductors.checkpoint import (
    META_FILE,
    CheckpointMeta,
    check_pool_against_meta,
    read_checkpoint_meta,
    template_ref,
    write_checkpoint_meta,
)
from conductor.errors import MissingDependencyError, UsageError
from conductor.llm.checkpoint_load import require_torch_transformers, resolve_checkpoint_dir
from conductor.llm.types import ModelRequest
from conductor.targets import Worker
from conductor.workflow import parse_workflow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer  # noqa: E402

from conductor.llm import checkpoint_client as cc  # noqa: E402

# torch runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

WORKFLOW = 'model_id = [0]\nsubtasks = ["Solve it"]\naccess_list = [[]]'
QUESTION = "What is 2 + 2?"
CORPUS = [
    WORKFLOW,
    'model_id = [2, 0, 1]\nsubtasks = ["Plan", "Write the code", "Check it"]',
    'access_list = [[], ["all"], [0, 1]]',
    "0 1 2 3 4 5 6 7 8 9 10 [ ] ( ) { } \" ' , . : = + - * / ?",
    "Solve it step by step. What is the answer? The question is hard.",
    "user assistant system Model 0 Model 1 Model 2 workers question",
]


def _tokenizer(*, chat_template: bool = True) -> Any:
    return tiny_tokenizer(CORPUS, chat_template=chat_template)


def _model(tokenizer: Any, seed: int = 0) -> Any:
    return tiny_llama(tokenizer, seed=seed)


def _save(directory: Path, tokenizer: Any, model: Any, meta: dict[str, Any] | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    if meta is not None:
        (directory / META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return directory


def _target(path: Path | str) -> Worker:
    return Worker(id="conductor", model=str(path), client="checkpoint")  # type: ignore[arg-type]


def _request(text: str = QUESTION, **params: Any) -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": text},), params=params)


@pytest.fixture(autouse=True)
def _fresh_registry() -> Any:
    cc.unload_all()
    yield
    cc.unload_all()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight checkpoint with a chat template, a template file and conductor.json."""
    tok = _tokenizer()
    directory = _save(
        tmp_path_factory.mktemp("tiny"),
        tok,
        _model(tok),
        {
            "format_version": 1,
            "template": "prompt.txt",
            "pool_order": ["alpha", "beta"],
            "max_steps": 3,
            "base_model": "tiny-llama",
            "allow_indices": False,
        },
    )
    (directory / "prompt.txt").write_text(
        "Workers:\n${workers}\nAt most ${max_steps} steps.\nQuestion: ${question}\n",
        encoding="utf-8",
    )
    return directory


# ---------------------------------------------------------------- conductor.json


def test_meta_is_read_and_honoured(tiny_dir: Path) -> None:
    from conductor.conductors.prompt import build_conductor_messages

    meta = read_checkpoint_meta(tiny_dir)
    assert meta is not None
    assert meta.template == "prompt.txt"
    assert meta.max_steps == 3
    assert meta.pool_order == ("alpha", "beta")
    assert meta.base_model == "tiny-llama"
    ref = template_ref(tiny_dir, meta)
    assert ref == str(tiny_dir / "prompt.txt")
    workers = [Worker(id="alpha", model="x"), Worker(id="beta", model="y")]
    messages = build_conductor_messages(QUESTION, workers, template=ref, max_steps=meta.max_steps)
    text = "".join(m["content"] for m in messages)
    assert "At most 3 steps." in text and "Question: What is 2 + 2?" in text


def test_pool_matches_or_warns(tiny_dir: Path) -> None:
    meta = read_checkpoint_meta(tiny_dir)
    assert meta is not None
    assert check_pool_against_meta(["alpha", "beta"], meta) == []

    swapped = check_pool_against_meta(["beta", "alpha"], meta)
    assert len(swapped) == 1
    assert "order" in swapped[0] and "Model 0 is 'beta'" in swapped[0]

    grown = check_pool_against_meta(["alpha", "beta", "gamma"], meta)
    assert any("3 workers" in w and "trained on 2" in w for w in grown)
    assert any("gamma" in w and "not in the checkpoint" in w for w in grown)

    shrunk = check_pool_against_meta(["alpha"], meta)
    assert any("missing" in w and "beta" in w for w in shrunk)

    assert check_pool_against_meta(["x"], CheckpointMeta()) == []


def test_meta_absent_and_round_trip(tmp_path: Path) -> None:
    assert read_checkpoint_meta(tmp_path) is None
    meta = CheckpointMeta(
        template_text="Q: ${question}\n${workers}",
        pool_order=("a", "b", "c"),
        max_steps=4,
        allow_indices=True,
        extra={"trained_with": "grpo"},
    )
    file = write_checkpoint_meta(tmp_path, meta)
    assert file == tmp_path / META_FILE
    again = read_checkpoint_meta(tmp_path)
    assert again == meta
    ref = template_ref(tmp_path, again)
    assert ref is not None and Path(ref).read_text(encoding="utf-8") == meta.template_text


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"template": "p.txt"}', "'format_version'"),
        ('{"format_version": 2}', "'format_version'"),
        ('{"format_version": 1, "max_steps": "five"}', "'max_steps'"),
        ('{"format_version": 1, "max_steps": 0}', "'max_steps'"),
        ('{"format_version": 1, "pool_order": "a,b"}', "'pool_order'"),
        ('{"format_version": 1, "pool_order": ["a", "a"]}', "'pool_order'"),
        ('{"format_version": 1, "allow_indices": "no"}', "'allow_indices'"),
        ('{"format_version": 1, "template": "missing.txt"}', "'template'"),
        ('{"format_version": 1, "template": "../outside.txt"}', "'template'"),
        ('{"format_version": 1, "template": "a", "template_text": "b"}', "'template'"),
    ],
)
def test_malformed_meta_names_file_and_field(tmp_path: Path, content: str, field: str) -> None:
    (tmp_path / "outside.txt").write_text("x", encoding="utf-8")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / META_FILE).write_text(content, encoding="utf-8")
    with pytest.raises(UsageError) as info:
        read_checkpoint_meta(ckpt)
    message = str(info.value)
    assert str(ckpt / META_FILE) in message
    assert field in message


# ------------------------------------------------------------- resolving the spec


def test_local_dir_and_missing_dir(tiny_dir: Path, tmp_path: Path) -> None:
    assert resolve_checkpoint_dir(str(tiny_dir)) == tiny_dir.resolve()
    with pytest.raises(UsageError, match="does not exist"):
        resolve_checkpoint_dir(str(tmp_path / "nope"))


def test_hf_id_not_in_offline_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = "hf:conductor-tests/no-such-checkpoint-3f9a"
    with pytest.raises(UsageError) as info:
        resolve_checkpoint_dir(spec)
    message = str(info.value)
    assert "conductor-tests/no-such-checkpoint-3f9a" in message
    assert "not in the local Hugging Face cache" in message
    with pytest.raises(UsageError, match="not a Hugging Face id"):
        resolve_checkpoint_dir("hf:just-a-name")


async def test_client_reports_unavailable_hf_checkpoint() -> None:
    client = cc.CheckpointClient(_target("hf:conductor-tests/no-such-checkpoint-3f9a"))
    with pytest.raises(UsageError, match="no-such-checkpoint-3f9a"):
        await client.send(_request(max_tokens=4), timeout_s=60)


def test_missing_transformers_is_one_clear_sentence(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError) as info:
        cc.CheckpointClient(_target(tiny_dir))
    assert "pip install" in str(info.value) and "transformers" in str(info.value)
    with pytest.raises(MissingDependencyError, match="pip install"):
        require_torch_transformers()


# ------------------------------------------------------------------- generation


async def test_generates_with_random_weights(tiny_dir: Path) -> None:
    client = cc.CheckpointClient(_target(tiny_dir))
    request = _request(max_tokens=8, temperature=0.8, dtype="float32")
    out = await client.send(request, timeout_s=120)
    assert isinstance(out.text, str)
    assert out.finish_reason in ("stop", "length")
    assert 1 <= out.usage.output_tokens <= 8
    if out.finish_reason == "length":
        assert out.usage.output_tokens == 8
    tok = _tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    assert out.usage.input_tokens == len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert out.raw["engine"] == "transformers"
    assert out.raw["model"] == str(tiny_dir.resolve())
    assert out.raw["dtype"] == "float32" and out.raw["device"] == "cpu"
    assert out.model == str(tiny_dir)

    # Same sample index: same reply; a second client shares the loaded model.
    other = cc.CheckpointClient(_target(tiny_dir))
    again = await other.send(request, timeout_s=120)
    assert again.text == out.text and again.usage == out.usage
    assert len(cc.loaded_checkpoints()) == 1
    # Another sample index draws another sample.
    longer = _request(max_tokens=16, temperature=1.0, dtype="float32")
    texts = set()
    for i in range(3):
        varied = ModelRequest(messages=longer.messages, params=longer.params, sample_index=i)
        texts.add((await client.send(varied, timeout_s=120)).text)
    assert len(texts) > 1
    await client.aclose()
    await other.aclose()


async def test_plain_prompt_without_chat_template(tmp_path: Path) -> None:
    tok = _tokenizer(chat_template=False)
    directory = _save(tmp_path / "plain", tok, _model(tok, seed=1), None)
    client = cc.CheckpointClient(_target(directory))
    out = await client.send(_request(max_tokens=3, temperature=0, dtype="float32"), timeout_s=120)
    expected = cc.plain_prompt([{"role": "user", "content": QUESTION}])
    assert expected.endswith("\nAssistant:") and expected.startswith("User: ")
    assert out.usage.input_tokens == len(tok(expected)["input_ids"])
    assert out.usage.output_tokens <= 3


def _overfit_checkpoint(directory: Path, meta: dict[str, Any]) -> Path:
    """A tiny model trained until it answers QUESTION with WORKFLOW, saved to ``directory``."""
    tok = _tokenizer()
    model = _model(tok, seed=2)
    messages = [{"role": "user", "content": QUESTION}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert overfit(model, tok, [(prompt, WORKFLOW)], steps=100, stop_below=0.02) < 0.05
    return _save(directory, tok, model, meta)


def test_trained_checkpoint_writes_a_parsable_workflow(tmp_path: Path) -> None:
    """A tiny model overfit on one workflow reproduces it greedily; the parser accepts it."""
    import asyncio

    directory = _overfit_checkpoint(tmp_path / "trained", {"format_version": 1, "max_steps": 5})

    client = cc.CheckpointClient(_target(directory))
    out = asyncio.run(
        client.send(_request(max_tokens=64, temperature=0, dtype="float32"), timeout_s=120)
    )
    assert out.text == WORKFLOW
    assert out.finish_reason == "stop"
    workflow = parse_workflow(out.text, n_workers=2)
    assert [s.worker for s in workflow.steps] == [0]
    assert workflow.steps[0].subtask == "Solve it"


async def test_directory_without_a_model_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    client = cc.CheckpointClient(_target(empty))
    with pytest.raises(UsageError, match="cannot be loaded by transformers"):
        await client.send(_request(max_tokens=2), timeout_s=60)


async def test_timeout_while_queued_never_generates(tiny_dir: Path) -> None:
    import asyncio

    from conductor.errors import RequestTimeoutError

    entry = cc.get_loaded_checkpoint(tiny_dir, "transformers", "float32", "cpu")
    calls: list[int] = []
    real_generate = entry.model.generate

    def counting_generate(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_generate(*args, **kwargs)

    entry.model.generate = counting_generate
    client = cc.CheckpointClient(_target(tiny_dir))
    request = _request(max_tokens=2, temperature=0, dtype="float32", device="cpu")
    entry.lock.acquire()  # another call is "generating"
    try:
        with pytest.raises(RequestTimeoutError, match="did not answer within"):
            await client.send(request, timeout_s=0.2)
    finally:
        entry.lock.release()
    await asyncio.sleep(0.2)  # the abandoned thread gets the lock and must skip
    assert calls == []
    out = await client.send(request, timeout_s=60)
    assert calls == [1] and out.usage.output_tokens >= 1


def test_checkpoint_conductor_runs_a_question_end_to_end(
    tmp_path: Path, fake_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`--conductor DIR`: the checkpoint's template is honoured, its workflow runs on the
    pool, and a pool that differs from the trained order is warned about."""
    import asyncio

    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import Orchestrator, RunSettings
    from conductor.pool import load_pool_text

    # The template it was "trained" with is the bare question.
    meta = {"format_version": 1, "template": "tiny.txt", "max_steps": 2, "pool_order": ["w1", "w0"]}
    directory = _overfit_checkpoint(tmp_path / "ckpt", meta)
    (directory / "tiny.txt").write_text("${question}")
    fake_server.script("w0", ["4"])
    pool = load_pool_text(
        "workers:\n"
        f"  - {{id: w0, model: w0, client: openai, api_base: {fake_server.openai_base}}}\n"
        f"  - {{id: w1, model: w1, client: openai, api_base: {fake_server.openai_base}}}\n"
        "conductor:\n"
        f"  {{backend: checkpoint, model: {directory},"
        " params: {temperature: 0, max_tokens: 64, dtype: float32}}\n"
    )
    with caplog.at_level("WARNING", logger="conductor"):
        conductor = resolve_conductor(pool)
    assert conductor.max_steps == 2
    assert conductor.template.endswith("tiny.txt")
    assert any("Model 0" in r.getMessage() for r in caplog.records)

    async def go() -> Any:
        async with Orchestrator(pool, conductor) as orch:
            return await orch.run(QUESTION, RunSettings())

    record = asyncio.run(go())
    assert record.status == "ok", record.error
    assert record.rounds[0].conductor_calls[0].messages[0]["content"] == QUESTION
    assert record.rounds[0].conductor_calls[0].response == WORKFLOW
    assert [s.worker_id for s in record.rounds[0].steps] == ["w0"]
    assert record.final_answer == "4"
