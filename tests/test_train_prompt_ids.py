"""Training and inference give a Conductor prompt the same token ids.

The training side is TRL's own ``GRPOTrainer._tokenize_prompts`` code path as the
Conductor's trainer runs it (an uninitialised trainer holding only what that method
reads: no model is needed to tokenize); the inference side is the checkpoint backend's
transformers engine itself, whose ``generate`` call is watched.  Both with a tokenizer
that adds BOS (Llama-, Gemma-, Mistral-like: a ``TemplateProcessing`` post-processor
and a template that opens with ``{{ bos_token }}``) and one that adds nothing
(SmolLM2-like), for a prompt left open at a prefill (rendered to text) and a plain
conversational one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from kit.tinymodels import BOS, tiny_llama, tiny_tokenizer

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("trl")

# torch runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

CORPUS = [
    'model_id = [0]\nsubtasks = ["Solve it"]\naccess_list = [[]]',
    "Plan it. What is 2 + 2? system user assistant",
    "0 1 2 3 4 5 6 7 8 9 [ ] \" ' , . : = + ?",
]
QUESTION = [
    {"role": "system", "content": "Plan it."},
    {"role": "user", "content": "What is 2 + 2?"},
]
PREFILLED = [*QUESTION, {"role": "assistant", "content": "model_id = ["}]


def _trainer(tokenizer: Any, cls: Any = None) -> Any:
    """The Conductor's GRPO trainer, uninitialised, holding what ``_tokenize_prompts``
    reads (TRL 1.16: a text-only policy, no tools, environments or chat-template
    override)."""
    from conductor.train.grpo import grpo_trainer_class

    cls = cls or grpo_trainer_class()
    trainer = cls.__new__(cls)
    trainer.processing_class = tokenizer
    trainer._is_vlm = False
    trainer.environment_factories = None
    trainer.tools = None
    trainer.chat_template = None
    trainer.chat_template_kwargs = {}
    return trainer


def _training_ids(tokenizer: Any, messages: list[dict[str, str]], *, render: bool) -> list[int]:
    """The prompt ids GRPO samples from and trains on for ``messages``."""
    from conductor.train.policy import policy_prompt

    prompt = policy_prompt(tokenizer, messages, render=render)
    ids, _images, _fields = _trainer(tokenizer)._tokenize_prompts([prompt])
    return [int(i) for i in ids[0]]


def _inference_ids(directory: Path, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids the checkpoint backend's transformers engine generates from."""
    import asyncio

    from conductor.llm import checkpoint_client as cc
    from conductor.llm.types import ModelRequest
    from conductor.targets import Worker

    cc.unload_all()
    # The same load options to prepare and send: one loaded copy, the one watched.
    params = {"max_tokens": 2, "temperature": 0, "dtype": "float32", "device": "cpu"}
    target = Worker(id="conductor", model=str(directory), client="checkpoint", params=params)
    client = cc.CheckpointClient(target)
    seen: list[list[int]] = []

    async def run() -> None:
        await client.prepare()
        (entry,) = cc.loaded_checkpoints()
        real = entry.model.generate

        def watched(input_ids: Any, **kwargs: Any) -> Any:
            seen.append(input_ids[0].tolist())
            return real(input_ids, **kwargs)

        entry.model.generate = watched
        request = ModelRequest(messages=tuple(cast(Any, messages)), params=params)
        await client.send(request, timeout_s=120)

    try:
        asyncio.run(run())
    finally:
        cc.unload_all()
    (ids,) = seen
    return ids


@pytest.fixture(scope="module", params=[True, False], ids=["adds-bos", "no-bos"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(tokenizer, checkpoint directory) for a tokenizer that adds BOS, and one that
    does not."""
    tok = tiny_tokenizer(CORPUS, adds_bos=request.param)
    directory = tmp_path_factory.mktemp("bos" if request.param else "nobos")
    tok.save_pretrained(directory)
    tiny_llama(tok).save_pretrained(directory)
    return tok, directory


# A prefill is trained from rendered text only (TRL would close a conversational one).
@pytest.mark.parametrize(
    ("messages", "render"),
    [(PREFILLED, True), (QUESTION, True), (QUESTION, False)],
    ids=["prefill-rendered", "question-rendered", "question-conversational"],
)
def test_training_prompt_ids_are_the_checkpoint_backends(
    checkpoint: Any, messages: list[dict[str, str]], render: bool
) -> None:
    tok, directory = checkpoint
    trained = _training_ids(tok, messages, render=render)
    assert trained == _inference_ids(directory, messages)
    bos = tok.convert_tokens_to_ids(BOS)
    adds_bos = tok("x")["input_ids"][0] == bos
    # One BOS, first, where the tokenizer adds one; none where it does not.
    assert trained.count(bos) == (1 if adds_bos else 0)
    assert not adds_bos or trained[0] == bos


def test_trl_alone_would_put_two_bos_on_rendered_prompts() -> None:
    """What the Conductor's trainer corrects: TRL's own text branch lets the tokenizer
    add BOS before the BOS the template wrote."""
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    from conductor.train.policy import policy_prompt

    tok = tiny_tokenizer(CORPUS, adds_bos=True)
    bos = tok.convert_tokens_to_ids(BOS)
    text = policy_prompt(tok, PREFILLED, render=True)
    assert text.startswith(BOS)
    ids, _images, _fields = _trainer(tok, GRPOTrainer)._tokenize_prompts([text])
    assert list(ids[0][:2]) == [bos, bos]
    assert _training_ids(tok, PREFILLED, render=True)[:2] != [bos, bos]


@pytest.mark.parametrize("adds_bos", [True, False], ids=["adds-bos", "no-bos"])
def test_a_base_model_without_template_keeps_its_special_tokens(
    tmp_path: Path, adds_bos: bool
) -> None:
    """A base model with no chat template trains on the plain transcript with the ids
    the backend gives that transcript untemplated: the tokenizer's own BOS included."""
    from conductor.llm import checkpoint_client as cc
    from conductor.train.policy import load_policy

    tok = tiny_tokenizer(CORPUS, chat_template=False, adds_bos=adds_bos)
    tok.save_pretrained(tmp_path)
    tiny_llama(tok).save_pretrained(tmp_path)
    _model, policy_tok = load_policy(str(tmp_path))
    bos = tok.convert_tokens_to_ids(BOS)
    for messages in (PREFILLED, QUESTION):
        untemplated = cc.prompt_token_ids(tok, messages)
        assert untemplated.count(bos) == (1 if adds_bos else 0)
        assert _training_ids(policy_tok, messages, render=True) == untemplated
    assert _training_ids(policy_tok, QUESTION, render=False) == cc.prompt_token_ids(tok, QUESTION)
