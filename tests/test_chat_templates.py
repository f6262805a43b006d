"""Chat-shaped Conductor templates: system / user / prefill / revise, sent to real clients.

Every request goes over real HTTP to the local FakeLLMServer (or through a tiny
transformers model built in the test), and the assertions read what the server received
and what the run record says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, worker, write_pool
from rich.console import Console

from conductor.conductors.checkpoint import (
    META_FILE,
    CheckpointMeta,
    read_checkpoint_meta,
    stored_template,
    template_ref,
    write_checkpoint_meta,
)
from conductor.conductors.prompt import (
    ChatTemplate,
    PreviousRound,
    build_conductor_messages,
    build_reask_messages,
    load_conductor_template,
)
from conductor.conductors.spec import Conductor, resolve_conductor
from conductor.errors import PoolError, TemplateFileError, UsageError
from conductor.execute import Orchestrator, RunSettings
from conductor.llm.caller import ModelCaller
from conductor.llm.types import ModelRequest
from conductor.pool import Pool, load_pool, load_pool_text
from conductor.record import RunRecord, read_record, write_record
from conductor.render import trace_renderable
from conductor.targets import Worker
from conductor.testing import FakeLLMServer

# torch runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

QUESTION = "What is 6 times 7?"
WORKERS = [Worker("alpha", "x"), Worker("beta", "y")]

# The round-1 prefill ends inside the first list: only prefill + reply parses.
TEMPLATE = """\
system: You plan for a team of ${max_steps}-step workflows.
user: |
  Models:
  ${workers}
  Question: ${question}
prefill: "Plan: one model.\\nmodel_id = ["
revise:
  user: |
    The answer was ${previous_answer}. Keep it or write a new plan.
  prefill: "Checking:"
"""
REPLY = '1]\nsubtasks = ["Multiply 6 by 7."]\naccess_list = [[]]'
KEEP = "fine.\nmodel_id = []\nsubtasks = []\naccess_list = []"


def chat_file(tmp_path: Path, text: str = TEMPLATE, name: str = "conductor.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def make_pool(tmp_path: Path, server: FakeLLMServer, template: Path, **conductor: Any) -> Pool:
    workers = [worker(server, "w0"), worker(server, "w1")]
    data = pool_dict(server, workers, template=str(template), **conductor)
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


async def run(pool: Pool, **settings: Any) -> RunRecord:
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        return await orch.run(QUESTION, RunSettings(**settings))
    finally:
        await orch.aclose()


# ------------------------------------------------------------------ the messages


def test_yaml_template_gives_system_user_and_prefill(tmp_path: Path) -> None:
    messages = build_conductor_messages(
        QUESTION, WORKERS, max_steps=4, template=str(chat_file(tmp_path))
    )
    assert messages == [
        {"role": "system", "content": "You plan for a team of 4-step workflows."},
        {"role": "user", "content": f"Models:\n- Model 0\n- Model 1\nQuestion: {QUESTION}\n"},
        {"role": "assistant", "content": "Plan: one model.\nmodel_id = ["},
    ]


def test_revision_round_continues_the_conversation(tmp_path: Path) -> None:
    path = str(chat_file(tmp_path))
    first = build_conductor_messages(QUESTION, WORKERS, template=path)
    previous = PreviousRound("model_id = [1]", "42", reply="Plan: one model.\nmodel_id = [1]...")
    second = build_conductor_messages(QUESTION, WORKERS, template=path, previous=previous)
    assert second[:2] == first[:2]  # the same system and user turns
    assert second[2:] == [
        {"role": "assistant", "content": "Plan: one model.\nmodel_id = [1]..."},
        {"role": "user", "content": "The answer was 42. Keep it or write a new plan.\n"},
        {"role": "assistant", "content": "Checking:"},
    ]
    # Without the reply (an older record), the canonical lists stand in for it; without
    # a `revise` section, the built-in revision text is the user turn.
    bare = chat_file(tmp_path, "user: 'Q: ${question}'\nprefill: 'P'\n", "bare.yaml")
    third = build_conductor_messages(
        QUESTION, WORKERS, template=str(bare), previous=PreviousRound("model_id = [1]", "42")
    )
    assert [m["role"] for m in third] == ["user", "assistant", "user"]
    assert third[1]["content"] == "model_id = [1]"
    assert "Its final answer:\n42" in third[2]["content"]


def test_reask_keeps_the_whole_reply_and_prefills_again(tmp_path: Path) -> None:
    first = build_conductor_messages(QUESTION, WORKERS, template=str(chat_file(tmp_path)))
    again = build_reask_messages(first, "oops", "no lists")
    assert again[:2] == first[:2]
    assert again[2] == {"role": "assistant", "content": "Plan: one model.\nmodel_id = [oops"}
    assert again[3]["role"] == "user" and "no lists" in again[3]["content"]
    assert again[4] == {"role": "assistant", "content": "Plan: one model.\nmodel_id = ["}


def test_text_templates_are_unchanged(tmp_path: Path) -> None:
    loaded = load_conductor_template("default")
    assert loaded.form == "text" and loaded.chat is None
    path = tmp_path / "t.txt"
    path.write_text("Q: ${question}\n${workers}")
    previous = PreviousRound("model_id = [0]", "4")
    messages = build_conductor_messages(QUESTION, WORKERS, template=str(path), previous=previous)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    assert messages[0]["content"].startswith(f"Q: {QUESTION}\n- Model 0\n- Model 1")
    assert "Its final answer:\n4" in messages[0]["content"]
    # The built-in chat template is a conversation with a prefill.
    chat = load_conductor_template("chat").chat
    assert chat is not None and chat.system and chat.prefill and chat.revise_prefill


def test_the_paper_template_has_the_authors_prompt_shape() -> None:
    """The shipped `paper` template in the shape of the authors' Conductor prompt
    (custom_data/dataset.py: system, user, assistant prefill; routing_question_formats.py:
    the instructions, worked examples, then the question, then the pool as "Model id i";
    recursion: the answer shown in a further user turn, then a second prefill)."""
    from conductor.workflow import parse_workflow

    chat = load_conductor_template("paper").chat
    assert chat is not None and chat.system and chat.prefill and chat.revise_prefill
    messages = build_conductor_messages(QUESTION, WORKERS, template="paper", max_steps=4)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[-1]["content"] == chat.prefill
    user = messages[1]["content"]
    # The question comes before the pool, and the pool closes the message.
    assert user.index(QUESTION) < user.index("Model id 0")
    assert user.endswith("\nModel id 0\nModel id 1") and "- Model" not in user
    assert "at most 4 steps" in user
    # No advice the authors do not give about how long a plan should be.
    for nudge in ("easy question", "one step", "as short as"):
        assert nudge not in user.lower()
    # The worked examples are plans that parse, over Models 0-2 only (any pool of three).
    examples = user.split("EXAMPLE ")[1:]
    assert len(examples) == 4
    for example in examples:
        assert parse_workflow(example.split("Assistant Response:")[1], n_workers=3).steps
    # Round 2 continues the conversation: the round-1 reply, the answer, a new opener.
    previous = PreviousRound("model_id = [0]", "The answer is 42.", "PLAN REPLY")
    again = build_conductor_messages(QUESTION, WORKERS, template="paper", previous=previous)
    assert [m["role"] for m in again] == ["system", "user", "assistant", "user", "assistant"]
    assert again[:2] == build_conductor_messages(QUESTION, WORKERS, template="paper")[:2]
    assert again[2]["content"] == "PLAN REPLY"
    assert "The answer is 42." in again[3]["content"]
    assert "three empty lists" in again[3]["content"]
    assert again[4]["content"] == chat.revise_prefill


# ------------------------------------------------------------------ bad files


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("user: 'Q: ${question}'\nprefil: x\n", 2, "unknown key 'prefil'"),
        ("user: |\n  Models: ${workers}\n  Q: ${question} in ${steps}\n", 3, "${steps}"),
        ("user: 'Q: ${question} costs $5'\n", 1, "$$"),
        ("system: hi\nuser: [1, 2]\n", 2, "must be text"),
        ("system: 'Q: ${question}'\n", 1, "needs a non-empty `user`"),
        ("user: 'Q: ${question}'\nrevise:\n  prefill: x\n", 3, "`revise` needs"),
        ("user: 'Q: ${question}'\nrevise: later\n", 2, "must be a mapping"),
        (
            "user: 'Q: ${question}'\nrevise:\n  user: x\n  prefill: '${nope}'\n",
            4,
            "revise.prefill",
        ),
        ("user: 'no question here'\n", 1, "${question}"),
        ("user: 'Q: ${question}'\nuser: again\n", 2, "appears twice"),
        ("user: [unclosed\n", 2, "invalid YAML"),
        ("", 1, "empty"),
        ("- a list\n", 1, "top level"),
    ],
)
def test_bad_template_files_name_file_and_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = chat_file(tmp_path, text, "bad.yaml")
    with pytest.raises(TemplateFileError) as info:
        load_conductor_template(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert words in message
    assert isinstance(info.value, UsageError)  # exit code 2 from the CLI


def test_bad_template_stops_a_pool_run_before_any_call(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    bad = chat_file(tmp_path, "user: 'Q: ${question} ${oops}'\n", "bad.yaml")
    pool = make_pool(tmp_path, fake_server, bad)
    with pytest.raises(TemplateFileError, match=r"bad\.yaml:1: .*\$\{oops\}"):
        resolve_conductor(pool)
    assert fake_server.requests == []


# ------------------------------------------------------------------ over the wire


@pytest.mark.parametrize("client", ["openai", "http"])
async def test_endpoint_continues_the_prefill(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [REPLY])
    fake_server.script("w1", ["<answer>42</answer>"])
    pool = make_pool(
        tmp_path,
        fake_server,
        chat_file(tmp_path),
        client=client,
        temperature=0.2,
        max_tokens=1024,
        top_p=0.95,
    )
    record = await run(pool)
    assert record.status == "ok", record.error
    (sent,) = fake_server.requests_for(CONDUCTOR_MODEL)
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user", "assistant"]
    assert sent.body["messages"][-1]["content"] == "Plan: one model.\nmodel_id = ["
    assert sent.body["continue_final_message"] is True
    assert sent.body["add_generation_prompt"] is False
    assert (sent.body["temperature"], sent.body["max_tokens"], sent.body["top_p"]) == (
        0.2,
        1024,
        0.95,
    )
    # The parser read prefill + reply: the lists began inside the prefill.
    assert record.rounds[0].workflow == {
        "model_id": [1],
        "subtasks": ["Multiply 6 by 7."],
        "access_list": [[]],
    }
    call = record.rounds[0].conductor_calls[0]
    assert call.response == REPLY and call.prefill == "Plan: one model.\nmodel_id = ["
    assert call.reply == "Plan: one model.\nmodel_id = [" + REPLY
    assert record.conductor["sampling"] == {"temperature": 0.2, "max_tokens": 1024, "top_p": 0.95}
    assert record.conductor["template_form"] == "chat"
    # Workers' requests are untouched.
    (step,) = fake_server.requests_for("w1")
    assert "continue_final_message" not in step.body
    # The record keeps all of it through a write and a read, and the trace shows the
    # whole reply.
    write_record(record, tmp_path / "run.json")
    again = read_record(tmp_path / "run.json")
    assert again.rounds[0].conductor_calls[0].prefill == call.prefill
    assert again.conductor["sampling"]["temperature"] == 0.2
    console = Console(width=200, record=True)
    console.print(trace_renderable(again, "table"))
    assert "Plan: one model." in console.export_text()


async def test_text_template_requests_have_no_continuation(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("Q: ${question}\n${workers}\nmodel_id, subtasks, access_list")
    fake_server.script(CONDUCTOR_MODEL, ["model_id = [" + REPLY])
    fake_server.script("w1", ["<answer>42</answer>"])
    record = await run(make_pool(tmp_path, fake_server, plain))
    assert record.status == "ok", record.error
    (sent,) = fake_server.requests_for(CONDUCTOR_MODEL)
    assert [m["role"] for m in sent.body["messages"]] == ["user"]
    assert "continue_final_message" not in sent.body
    assert "add_generation_prompt" not in sent.body
    # The section sets none: the pool's defaults: reach it.
    assert sent.body["temperature"] == 0.2
    assert record.conductor["template_form"] == "text"
    assert record.conductor["sampling"] == {"temperature": 0.2, "max_tokens": 256, "top_p": None}
    assert record.rounds[0].conductor_calls[0].prefill is None


async def test_revision_round_is_a_continued_conversation_on_the_wire(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [REPLY, KEEP])
    fake_server.script("w1", ["<answer>42</answer>"])
    record = await run(make_pool(tmp_path, fake_server, chat_file(tmp_path)), rounds=2)
    assert record.status == "ok", record.error
    first, second = fake_server.requests_for(CONDUCTOR_MODEL)
    messages = second.body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[:2] == first.body["messages"][:2]
    assert messages[2]["content"] == "Plan: one model.\nmodel_id = [" + REPLY
    assert (
        messages[3]["content"]
        == "The answer was <answer>42</answer>. Keep it or write a new plan.\n"
    )
    assert messages[4]["content"] == "Checking:"
    assert second.body["continue_final_message"] is True
    assert record.rounds[1].stop_reason == "the Conductor kept the previous answer"
    assert record.final_answer == "<answer>42</answer>"


async def test_reask_over_the_wire_prefills_again(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, ["no idea", REPLY])
    fake_server.script("w1", ["<answer>42</answer>"])
    record = await run(make_pool(tmp_path, fake_server, chat_file(tmp_path)))
    assert record.status == "ok", record.error
    _first, second = fake_server.requests_for(CONDUCTOR_MODEL)
    roles = [m["role"] for m in second.body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert second.body["messages"][2]["content"] == "Plan: one model.\nmodel_id = [no idea"
    assert second.body["messages"][4]["content"] == "Plan: one model.\nmodel_id = ["
    assert second.body["continue_final_message"] is True


@pytest.mark.parametrize("prefix", ["hosted_vllm", "openai"])
async def test_litellm_openai_compatible_continues(fake_server: FakeLLMServer, prefix: str) -> None:
    fake_server.script("c", ["continued"])
    target = Worker(
        id="conductor", model=f"{prefix}/c", client="litellm", api_base=fake_server.openai_base
    )
    request = ModelRequest(
        messages=({"role": "user", "content": "Q"}, {"role": "assistant", "content": "Start"}),
        params={"temperature": 0.2},
    )
    caller = ModelCaller(target)
    try:
        done = await caller.complete(request)
    finally:
        await caller.aclose()
    assert done.text == "continued"
    (sent,) = fake_server.requests_for("c")
    assert sent.body["messages"][-1] == {"role": "assistant", "content": "Start"}
    assert sent.body["continue_final_message"] is True
    assert sent.body["add_generation_prompt"] is False


@pytest.mark.parametrize("client", ["anthropic", "litellm"])
async def test_anthropic_conductor_continues_its_prefill(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    fake_server.script("claude-x", [REPLY])
    fake_server.script("w1", ["<answer>42</answer>"])
    # The Messages API refuses a final assistant message ending in whitespace.
    template = chat_file(tmp_path, TEMPLATE.replace('model_id = ["', 'model_id = [\\n"'))
    conductor: dict[str, Any] = {"backend": "prompted", "template": str(template)}
    if client == "anthropic":
        conductor.update(client="anthropic", model="claude-x", api_base=fake_server.anthropic_base)
    else:
        conductor.update(client="litellm", model="anthropic/claude-x", api_base=fake_server.url)
    data = pool_dict(fake_server, [worker(fake_server, "w0"), worker(fake_server, "w1")])
    data["conductor"] = conductor
    record = await run(load_pool(write_pool(tmp_path / "pool.yaml", data)))
    assert record.status == "ok", record.error
    (sent,) = fake_server.requests_for("claude-x")
    assert sent.protocol == "anthropic"
    assert sent.messages[-1] == {"role": "assistant", "content": "Plan: one model.\nmodel_id = ["}
    assert "continue_final_message" not in sent.body
    # The record shows the prefill as sent; the parser read it with the continuation.
    call = record.rounds[0].conductor_calls[0]
    assert call.messages[-1]["content"] == call.prefill == "Plan: one model.\nmodel_id = ["
    assert record.rounds[0].workflow is not None


@pytest.mark.parametrize(
    ("conductor", "why"),
    [
        ({"backend": "prompted", "model": "gpt-4o"}, "litellm model 'gpt-4o'"),
        ({"backend": "prompted", "model": "gemini/gemini-2.5-pro"}, "'gemini/gemini-2.5-pro'"),
        ({"backend": "prompted", "model": "x", "client": "google"}, "Gemini API"),
    ],
)
def test_providers_that_cannot_continue_are_refused(
    tmp_path: Path, fake_server: FakeLLMServer, conductor: dict[str, Any], why: str
) -> None:
    template = chat_file(tmp_path)
    data = pool_dict(fake_server, [worker(fake_server, "w0")])
    data["conductor"] = {**conductor, "template": str(template)}
    pool = load_pool(write_pool(tmp_path / "pool.yaml", data))
    with pytest.raises(UsageError) as info:
        resolve_conductor(pool)
    message = str(info.value)
    assert str(template) in message and "prefill" in message and why in message
    # A chat template without a prefill is fine anywhere.
    plain = chat_file(tmp_path, "system: s\nuser: 'Q: ${question}'\n", "noprefill.yaml")
    data["conductor"]["template"] = str(plain)
    resolve_conductor(load_pool(write_pool(tmp_path / "pool2.yaml", data)))


async def test_orchestrator_refuses_before_calling_a_model_that_cannot_continue(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    base = fake_server.openai_base
    pool = load_pool_text(
        f"workers:\n  - {{id: w0, model: w0, api_base: {base}}}\n"
        f"  - {{id: w1, model: w1, api_base: {base}}}\n"
    )
    conductor = Conductor(
        backend="prompted",
        target=Worker(id="conductor", model="gpt-4o", client="openai"),
        template=str(chat_file(tmp_path)),
    )
    async with Orchestrator(pool, conductor) as orch:
        with pytest.raises(UsageError, match="cannot continue a reply: OpenAI's own API"):
            await orch.run(QUESTION)
        # A given plan (a trainer's rollout) needs no call: prefill + plan is parsed.
        record = await orch.run(QUESTION, plan=REPLY)
    assert record.rounds[0].workflow is not None
    assert record.rounds[0].conductor_calls[0].prefill == "Plan: one model.\nmodel_id = ["
    assert all(r.model != "gpt-4o" for r in fake_server.requests)


# ------------------------------------------------------------------ sampling settings


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("temperature: -1", "conductor.temperature must be a number between 0 and 100"),
        ("top_p: 2", "conductor.top_p must be a number between 0 and 1"),
        ("max_tokens: 0", "conductor.max_tokens must be an integer from 1 to 100,000,000"),
    ],
)
def test_bad_conductor_sampling_names_line(setting: str, words: str) -> None:
    text = (
        "workers:\n  - {id: a, model: x}\nconductor:\n  backend: prompted\n  model: a\n"
        f"  {setting}\n"
    )
    with pytest.raises(PoolError) as info:
        load_pool_text(text, source="p.yaml")
    assert str(info.value).startswith("p.yaml:6: ") and words in str(info.value)


def test_params_win_over_sampling_keys() -> None:
    pool = load_pool_text(
        "workers:\n  - {id: a, model: x, temperature: 0.7}\n"
        "conductor: {backend: prompted, model: a, temperature: 0.2, max_tokens: 1024,"
        " params: {max_tokens: 512}}\n"
    )
    cond = resolve_conductor(pool)
    assert cond.target.params["temperature"] == 0.2  # the Conductor's own, over the worker's
    assert cond.target.params["max_tokens"] == 512


# ------------------------------------------------------------------ checkpoints


CHAT = {
    "system": "You plan.",
    "user": "${workers}\n${question}",
    "prefill": "model_id = [",
    "revise": {"user": "Was ${previous_answer} right?", "prefill": "Checking:"},
}


def test_conductor_json_carries_a_chat_template_and_sampling(tmp_path: Path) -> None:
    meta = CheckpointMeta(
        template_chat=CHAT, sampling={"temperature": 0.2, "max_tokens": 1024}, max_steps=3
    )
    write_checkpoint_meta(tmp_path, meta)
    on_disk = json.loads((tmp_path / META_FILE).read_text())
    assert on_disk["template"] == CHAT and on_disk["sampling"]["max_tokens"] == 1024
    again = read_checkpoint_meta(tmp_path)
    assert again == meta
    ref = template_ref(tmp_path, again)
    assert ref is not None and ref.endswith(".yaml")
    assert load_conductor_template(ref).chat == ChatTemplate(
        user="${workers}\n${question}",
        system="You plan.",
        prefill="model_id = [",
        revise_user="Was ${previous_answer} right?",
        revise_prefill="Checking:",
    )


@pytest.mark.parametrize(
    ("template", "sampling", "field"),
    [
        ({"user": "no question"}, None, "'template.user'"),
        ({"user": "${question}", "prefil": "x"}, None, "'template.prefil'"),
        ({"user": "${question}", "revise": {"prefill": "x"}}, None, "'template.revise'"),
        ({"user": "${question} ${nope}"}, None, "'template.user'"),
        ("p.txt", {"temperature": "hot"}, "'sampling.temperature'"),
        ("p.txt", {"max_tokens": 1.5}, "'sampling.max_tokens'"),
        ("p.txt", {"seed": 1}, "'sampling.seed'"),
        ("p.txt", [0.2], "'sampling'"),
    ],
)
def test_bad_inline_template_or_sampling_names_field(
    tmp_path: Path, template: Any, sampling: Any, field: str
) -> None:
    (tmp_path / "p.txt").write_text("${question}")
    data: dict[str, Any] = {"format_version": 1, "template": template}
    if sampling is not None:
        data["sampling"] = sampling
    (tmp_path / META_FILE).write_text(json.dumps(data))
    with pytest.raises(UsageError) as info:
        read_checkpoint_meta(tmp_path)
    assert str(tmp_path / META_FILE) in str(info.value) and field in str(info.value)


def test_training_stores_the_template_in_its_own_form(tmp_path: Path) -> None:
    chat_dir = tmp_path / "chat"
    chat_dir.mkdir()
    fields = stored_template(chat_dir, str(chat_file(tmp_path)))
    write_checkpoint_meta(chat_dir, CheckpointMeta(**fields))
    meta = read_checkpoint_meta(chat_dir)
    assert meta is not None and meta.template is None and meta.template_chat is not None
    ref = template_ref(chat_dir, meta)
    assert ref is not None
    original = build_conductor_messages(QUESTION, WORKERS, template=str(chat_file(tmp_path)))
    assert build_conductor_messages(QUESTION, WORKERS, template=ref) == original

    text_dir = tmp_path / "text"
    text_dir.mkdir()
    assert stored_template(text_dir, "compact") == {"template": "prompt.txt"}
    assert (text_dir / "prompt.txt").read_text() == load_conductor_template("compact").text


def _fake_checkpoint(tmp_path: Path, meta: dict[str, Any]) -> Path:
    # resolve_conductor reads only conductor.json; the model is loaded on the first call.
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / META_FILE).write_text(json.dumps(meta))
    return directory


def test_checkpoint_template_and_sampling_are_honoured(tmp_path: Path) -> None:
    directory = _fake_checkpoint(
        tmp_path,
        {
            "format_version": 1,
            "template": CHAT,
            "sampling": {"temperature": 0.2, "max_tokens": 1024, "top_p": 0.9},
        },
    )
    pool = load_pool_text(
        f"workers:\n  - {{id: a, model: x}}\nconductor: {{backend: checkpoint, model: {directory},"
        " top_p: 0.5}\n"
    )
    cond = resolve_conductor(pool)
    assert load_conductor_template(cond.template).chat is not None
    # The checkpoint's settings fill in what the pool leaves unset; the pool's win.
    assert cond.target.params == {"temperature": 0.2, "max_tokens": 1024, "top_p": 0.5}
    messages = build_conductor_messages(QUESTION, WORKERS, template=cond.template)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert cond.describe()["template_form"] == "chat"


# ------------------------------------------------------------------ the checkpoint backend

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer  # noqa: E402

from conductor.llm import checkpoint_client as cc  # noqa: E402

CORPUS = [
    'model_id = [0]\nsubtasks = ["Multiply"]\naccess_list = [[]]',
    "What is 6 times 7? Plan: system user assistant Model 0 Model 1 workers",
    "0 1 2 3 4 5 6 7 8 9 [ ] ( ) \" ' , . : = + - * / ?",
]
PREFILL = "model_id = ["
CONTINUATION = '0]\nsubtasks = ["Multiply"]\naccess_list = [[]]'


def test_chat_prompt_leaves_the_prefill_open() -> None:
    tok = tiny_tokenizer(CORPUS)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": PREFILL},
    ]
    text = cc.chat_prompt(tok, messages)
    assert text == f"<|system|>S<|end|>\n<|user|>Q<|end|>\n<|assistant|>{PREFILL}"
    # A conversation ending with the user gets the generation prompt, as before.
    text = cc.chat_prompt(tok, messages[:2])
    assert text.endswith("<|user|>Q<|end|>\n<|assistant|>")
    # Without a chat template, the plain transcript ends inside the prefill.
    plain = cc.chat_prompt(tiny_tokenizer(CORPUS, chat_template=False), messages)
    assert plain == f"System: S\nUser: Q\nAssistant: {PREFILL}"


def test_checkpoint_conductor_continues_its_prefill(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """A tiny model overfit to continue the prefill: the run parses prefill + continuation
    and the checkpoint's inline chat template and sampling settings are used."""
    import asyncio

    cc.unload_all()
    tok = tiny_tokenizer(CORPUS)
    model = tiny_llama(tok, seed=3)
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": PREFILL}]
    prompt = cc.chat_prompt(tok, messages)
    overfit(model, tok, [(prompt, CONTINUATION)], steps=150, stop_below=0.02)
    directory = tmp_path / "ckpt"
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    meta = {
        "format_version": 1,
        "template": {"user": "${question}", "prefill": PREFILL},
        "sampling": {"temperature": 0, "max_tokens": 48},
    }
    (directory / META_FILE).write_text(json.dumps(meta))
    fake_server.script("w0", ["<answer>42</answer>"])
    base = fake_server.openai_base
    pool = load_pool_text(
        f"workers:\n  - {{id: w0, model: w0, client: openai, api_base: {base}}}\n"
        f"conductor: {{backend: checkpoint, model: {directory}, params: {{dtype: float32}}}}\n"
    )
    conductor = resolve_conductor(pool)

    async def go() -> RunRecord:
        async with Orchestrator(pool, conductor) as orch:
            return await orch.run(QUESTION, RunSettings())

    try:
        record = asyncio.run(go())
    finally:
        cc.unload_all()
    call = record.rounds[0].conductor_calls[0]
    assert call.messages[-1] == {"role": "assistant", "content": PREFILL}
    assert call.response == CONTINUATION and call.prefill == PREFILL
    assert record.status == "ok", record.error
    assert record.rounds[0].workflow == {
        "model_id": [0],
        "subtasks": ["Multiply"],
        "access_list": [[]],
    }
    assert record.conductor["sampling"] == {"temperature": 0, "max_tokens": 48, "top_p": None}
    assert record.final_answer == "<answer>42</answer>"


# ------------------------------------------------------------------ from the CLI


def test_cli_ask_with_a_chat_template(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    import os
    import subprocess
    import sys

    def ask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "conductor", "ask", QUESTION, *args],
            capture_output=True,
            text=True,
            timeout=scaled(120),
            env={**os.environ, "COLUMNS": "120"},
        )

    data = pool_dict(fake_server, [worker(fake_server, "w0"), worker(fake_server, "w1")])
    data["conductor"].update(temperature=0.2, max_tokens=1024)
    pool = write_pool(tmp_path / "pool.yaml", data)
    bad = chat_file(tmp_path, "user: |\n  Q: ${question}\n  ${max_step}\n", "bad.yaml")
    done = ask("--pool", str(pool), "--template", str(bad), "--no-cache")
    assert done.returncode == 2
    assert f"{bad}:3:" in done.stderr and "${max_step}" in done.stderr
    assert fake_server.requests == []

    fake_server.script(CONDUCTOR_MODEL, [REPLY])
    fake_server.script("w1", ["<answer>42</answer>"])
    template = chat_file(tmp_path)
    out = tmp_path / "run.json"
    done = ask("--pool", str(pool), "--template", str(template), "--no-cache", "--out", str(out))
    assert done.returncode == 0, done.stderr
    (sent,) = fake_server.requests_for(CONDUCTOR_MODEL)
    assert sent.body["continue_final_message"] is True and sent.body["temperature"] == 0.2
    record = read_record(out)
    assert record.final_answer == "<answer>42</answer>"
    assert record.conductor["template_form"] == "chat"
    assert record.conductor["sampling"]["max_tokens"] == 1024


def test_policy_prompt_leaves_a_prefill_open() -> None:
    """Training prompts with a prefill are rendered to text that ends inside the
    assistant turn (TRL would otherwise close it and open a new one)."""
    from kit.tinymodels import tiny_tokenizer

    from conductor.train.policy import policy_prompt

    tok = tiny_tokenizer(["model_id = [0]", "Plan it.", "What is 2 + 2?"])
    messages = [
        {"role": "system", "content": "Plan it."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "model_id = ["},
    ]
    text = policy_prompt(tok, messages, render=True)
    assert text.endswith("<|assistant|>model_id = [")
    assert policy_prompt(tok, messages, render=False) == messages
    # Without a prefill the generation prompt opens the reply, as TRL would.
    assert policy_prompt(tok, messages[:2], render=True).endswith("<|end|>\n<|assistant|>")
