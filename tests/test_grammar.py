"""The workflow grammar: its rules, llama.cpp accepting it, and the real model obeying it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from conductor.errors import WorkflowParseError
from conductor.grammar import (
    workflow_grammar,
    workflow_json_schema,
    workflow_max_chars,
    workflow_response_format,
)
from conductor.targets import Worker
from conductor.workflow import ALL, parse_workflow


def _rules(grammar: str) -> dict[str, str]:
    """The grammar's rules as ``{name: body}``."""
    rules: dict[str, str] = {}
    for line in grammar.strip().splitlines():
        name, sep, body = line.partition(" ::= ")
        assert sep, f"not a rule: {line!r}"
        assert name not in rules, f"rule {name} defined twice"
        rules[name] = body
    return rules


@pytest.fixture(scope="module")
def embedded() -> Any:
    """The embedded model on the default llama.cpp runtime, in this process (a
    :class:`~conductor.localmodel.generate.Generator`)."""
    from kit.poolkit import embedded_model_or_skip

    from conductor.localmodel.generate import Generator
    from conductor.localmodel.runtime import LoadSettings
    from conductor.localmodel.runtimes import choose_runtime, load_runtime

    path = embedded_model_or_skip()
    model = load_runtime(choose_runtime()).load(
        LoadSettings(path=str(path), n_ctx=4096, n_threads=1)
    )
    yield Generator(model)
    model.close()


# ------------------------------------------------------------------------- rule shape


def test_one_alternative_per_length_locks_the_three_lists_together() -> None:
    rules = _rules(workflow_grammar(4, 3))
    assert rules["workflow"] == "wf1 | wf2 | wf3"
    for n in (1, 2, 3):
        body = rules[f"wf{n}"]
        model_part, subtasks_part, access_part = body.split("\\n")
        assert len(re.findall(r"\bid\b", model_part)) == n
        assert len(re.findall(r"\bsubtask\b", subtasks_part)) == n
        assert re.findall(r"\bacc\d\b", access_part) == [f"acc{i}" for i in range(n)]
    assert "wf0" not in rules and "wf4" not in rules


def test_ids_are_exactly_the_pool_ordinals() -> None:
    rules = _rules(workflow_grammar(12, 2))
    assert re.findall(r'"(\d+)"', rules["id"]) == [str(i) for i in range(12)]


def test_allow_empty_adds_the_three_empty_lists() -> None:
    rules = _rules(workflow_grammar(2, 2, allow_empty=True))
    assert rules["workflow"].split(" | ")[0] == "wf0"
    assert rules["wf0"] == '"model_id = []\\nsubtasks = []\\naccess_list = []"'


def test_access_entries_without_indices_are_none_or_all() -> None:
    rules = _rules(workflow_grammar(3, 3))
    for i in range(3):
        assert rules[f"acc{i}"] == '"[]" | "[\\"all\\"]"'
    assert not any(name.startswith("idx") for name in rules)


def test_access_indices_are_ascending_and_earlier() -> None:
    rules = _rules(workflow_grammar(3, 4, allow_indices=True))
    assert rules["acc0"] == '"[]" | "[\\"all\\"]"'  # step 0 has no earlier step
    assert "idx3from0 | idx3from1 | idx3from2" in rules["acc3"]
    assert rules["idx3from0"] == '"0" (", " (idx3from1 | idx3from2))?'
    assert rules["idx3from2"] == '"2"'  # the last earlier index ends the list
    assert "idx1from1" not in rules and "idx3from3" not in rules


def test_reasoning_and_subtasks_are_bounded_and_bracket_free() -> None:
    rules = _rules(workflow_grammar(2, 2, max_reasoning_chars=123, max_subtask_chars=45))
    assert rules["root"] == 'reasoning "\\n" workflow'
    assert rules["reasoning"] == "rchar{0,123}"
    assert rules["rchar"].startswith("[^\\[\\]")
    assert rules["subtask"] == '"\\"" sfirst schar{0,44} "\\""'
    assert _rules(workflow_grammar(2, 2, max_reasoning_chars=0))["root"] == "workflow"


def test_bad_bounds_are_rejected() -> None:
    with pytest.raises(ValueError):
        workflow_grammar(0, 3)
    with pytest.raises(ValueError):
        workflow_grammar(3, 0)
    with pytest.raises(ValueError):
        workflow_grammar(3, 3, max_subtask_chars=0)


def test_max_chars_grows_with_every_bound() -> None:
    base = workflow_max_chars(3, 3, max_reasoning_chars=100, max_subtask_chars=50)
    assert workflow_max_chars(3, 4, max_reasoning_chars=100, max_subtask_chars=50) > base
    assert workflow_max_chars(3, 3, max_reasoning_chars=200, max_subtask_chars=50) == base + 100
    assert workflow_max_chars(3, 3, max_reasoning_chars=100, max_subtask_chars=60) > base


def test_json_schema_bounds() -> None:
    schema = workflow_json_schema(3, 4, max_subtask_chars=80)
    props = schema["properties"]
    assert list(props) == ["reasoning", "model_id", "subtasks", "access_list"]
    assert schema["required"] == list(props) and schema["additionalProperties"] is False
    assert props["model_id"]["items"] == {"type": "integer", "minimum": 0, "maximum": 2}
    assert props["model_id"]["minItems"] == 1 and props["model_id"]["maxItems"] == 4
    assert props["subtasks"]["items"]["maxLength"] == 80
    assert len(props["access_list"]["items"]["anyOf"]) == 2
    with_indices = workflow_json_schema(3, 4, allow_empty=True, allow_indices=True)
    assert with_indices["properties"]["subtasks"]["minItems"] == 0
    assert with_indices["properties"]["access_list"]["items"]["anyOf"][2]["items"]["maximum"] == 2
    fmt = workflow_response_format(3, 4)
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["properties"]


def test_json_form_of_a_workflow_parses() -> None:
    reply = (
        '{"reasoning": "two steps", "model_id": [1, 0], "subtasks": ["Solve it.", '
        '"Check it."], "access_list": [[], ["all"]]}'
    )
    workflow = parse_workflow(reply, n_workers=3, max_steps=4)
    assert [s.worker for s in workflow.steps] == [1, 0]
    assert workflow.steps[1].access == ALL


# ------------------------------------------------------------------- llama.cpp side


@pytest.mark.isolated  # llama.cpp in this process
@pytest.mark.parametrize(
    ("n_workers", "max_steps", "empty", "indices"),
    [(1, 1, False, False), (3, 3, False, False), (7, 5, True, True), (12, 5, True, False)],
)
def test_llama_cpp_compiles_the_grammar(
    embedded: Any, n_workers: int, max_steps: int, empty: bool, indices: bool
) -> None:
    text = workflow_grammar(n_workers, max_steps, allow_empty=empty, allow_indices=indices)
    # llama.cpp's own parser builds a sampler from it (GrammarError if it cannot).
    embedded.model.sampler([("grammar", (text, "root"))]).close()


@pytest.mark.isolated  # llama.cpp in this process
def test_llama_cpp_refuses_a_broken_grammar(embedded: Any) -> None:
    from conductor.localmodel.runtime import GrammarError

    with pytest.raises(GrammarError, match="GBNF"):
        embedded.model.sampler([("grammar", ('root ::= "unterminated', "root"))])


# ------------------------------------------------------------------ the real model

QUESTIONS = [
    "What is 17 * 23?",
    "What is the capital of Australia?",
    "Write a Python function that reverses a string.",
    "Write a haiku about autumn rain.",
    "Who wrote Pride and Prejudice?",
    "Solve for x: 3x + 7 = 22.",
    "Explain why the sky is blue in two sentences.",
    "Is 221 a prime number?",
    "Translate 'good morning' into French and Spanish.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What is the derivative of x^3 * sin(x)?",
    "Write a SQL query that counts orders per customer.",
    "Which planet has the most moons?",
    "Give three tips for a job interview.",
    "How many minutes are there in a week?",
    "What causes inflation?",
    "Write a limerick about a cat who codes.",
    "Sort the list [5, 2, 9, 1] and explain the algorithm you used.",
    "What is the boiling point of water at the top of Mount Everest, roughly?",
    "Debug: why does `for i in range(10): print(i` fail in Python?",
]


def _conductor_messages(question: str, workers: list[Worker], max_steps: int) -> list[dict]:  # type: ignore[type-arg]
    from conductor.conductors.prompt import build_conductor_messages

    return [dict(m) for m in build_conductor_messages(question, workers, max_steps=max_steps)]


@pytest.mark.slow
def test_real_model_always_writes_a_valid_workflow_with_the_grammar(embedded: Any) -> None:
    """SmolLM2-135M as a prompted Conductor: 20/20 parse with the grammar, far fewer without.

    Measured without the grammar: 0/20 parse at max_tokens 150-180 (the model answers
    the question or rambles instead of ending with the three lists).
    """
    from conductor.llm.local_client import LocalClient
    from conductor.llm.types import ModelRequest

    n_workers, max_steps = 3, 3
    workers = [Worker(id=f"w{i}", model="smollm2", client="local") for i in range(n_workers)]
    grammar = workflow_grammar(n_workers, max_steps, max_reasoning_chars=100, max_subtask_chars=80)
    client = LocalClient(Worker(id="conductor", model="smollm2", client="local"))
    params = {"temperature": 0.3, "max_tokens": 150, "repeat_penalty": 1.1}

    async def run(use_grammar: bool) -> tuple[int, list[str]]:
        ok, failures = 0, []
        for index, question in enumerate(QUESTIONS):
            request = ModelRequest(
                messages=tuple(_conductor_messages(question, workers, max_steps)),  # type: ignore[arg-type]
                params=params,
                sample_index=index,
                grammar=grammar if use_grammar else None,
            )
            reply = await client.send(request, timeout_s=120)
            try:
                workflow = parse_workflow(reply.text, n_workers=n_workers, max_steps=max_steps)
            except WorkflowParseError as exc:
                failures.append(f"{question!r}: {exc.reason} <- {reply.text[-200:]!r}")
                continue
            assert 1 <= len(workflow.steps) <= max_steps
            assert all(0 <= s.worker < n_workers and s.subtask.strip() for s in workflow.steps)
            ok += 1
        return ok, failures

    with_grammar, failures = asyncio.run(run(True))
    without_grammar, _ = asyncio.run(run(False))
    assert with_grammar == len(QUESTIONS), "\n".join(failures)
    assert without_grammar < with_grammar, f"without the grammar {without_grammar}/20 parsed"


# ------------------------------------------------------------------- subtask choices

CHOICES = ("Answer the question.", "Check the answers above and give the final answer.")


def test_subtask_choices_are_the_only_subtasks_admitted() -> None:
    rules = _rules(workflow_grammar(3, 2, subtask_choices=CHOICES))
    assert rules["subtask"] == " | ".join(f'"\\"{c}\\""' for c in CHOICES)
    # No free-text subtask rules remain for a model to escape into.
    assert "schar" not in rules and "sfirst" not in rules


@pytest.mark.parametrize("bad", ["", 'Say "hi".', "two\nlines", "back\\slash"])
def test_a_subtask_choice_that_cannot_be_a_quoted_line_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="one line without quotes"):
        workflow_grammar(2, 2, subtask_choices=("Answer the question.", bad))


@pytest.mark.isolated  # llama.cpp in this process
def test_llama_cpp_keeps_the_model_to_the_subtask_choices(embedded: Any) -> None:
    from conductor.localmodel.runtime import SamplerSettings

    text = workflow_grammar(3, 2, max_reasoning_chars=40, subtask_choices=CHOICES)
    prompt = (
        "Write a plan for: What is 2 + 2? Use your own words for each subtask, such as "
        '"Add two and two".'
    )
    reply = embedded.generate(
        [{"role": "user", "content": prompt}],
        SamplerSettings(temperature=0.0),
        max_tokens=200,
        grammar=text,
    ).text
    workflow = parse_workflow(reply, n_workers=3, max_steps=2)
    assert workflow.steps
    assert {s.subtask for s in workflow.steps} <= set(CHOICES)


# ------------------------------------------- the reply check (conductor.llm.gbnf)


@pytest.mark.isolated  # llama.cpp in this process
@pytest.mark.parametrize(
    "options",
    [
        {"max_reasoning_chars": 60, "max_subtask_chars": 40},
        {"allow_empty": True, "allow_indices": True, "max_reasoning_chars": 30},
        {"max_reasoning_chars": 0, "subtask_choices": CHOICES},
    ],
)
def test_the_reply_check_admits_whatever_llama_cpp_decodes_with_the_grammar(
    embedded: Any, options: dict[str, Any]
) -> None:
    """llama.cpp's grammar sampler is the reference: every reply it lets through is a
    sentence of the grammar to :class:`GbnfMatcher` (or, cut off at the token limit,
    the beginning of one); the same model without the grammar writes replies the
    matcher refuses, so the check tells the two apart."""
    from conductor.llm.gbnf import GbnfMatcher
    from conductor.localmodel.runtime import SamplerSettings

    text = workflow_grammar(3, 3, **options)
    matcher = GbnfMatcher(text)
    refused = 0
    for index, question in enumerate(QUESTIONS[:6]):
        messages = [{"role": "user", "content": f"Plan how to answer: {question}"}]
        settings = SamplerSettings(temperature=1.0, seed=index)
        constrained = embedded.generate(messages, settings, max_tokens=160, grammar=text)
        found = matcher.match(constrained.text)
        assert found.complete or (found.viable and constrained.finish_reason == "length"), (
            constrained.text
        )
        free = embedded.generate(messages, settings, max_tokens=60)
        refused += not matcher.match(free.text).complete
    assert refused >= 3


@pytest.mark.parametrize(
    ("grammar", "text", "complete", "viable"),
    [
        ('root ::= "a"{2,3} "b"', "aab", True, True),
        ('root ::= "a"{2,3} "b"', "aaaab", False, False),
        ('root ::= "a"{2,3} "b"', "aa", False, True),
        ('root ::= [^"\\\\\\x00-\\x1f]+', 'tab\there"', False, False),
        ('root ::= [a-c]* ( x | y )?\nx ::= "\\u00e9"\ny ::= .', "abcé", True, True),
        ('root ::= item ("," item)*  # a list\nitem ::= [0-9]+', "1,22,333", True, True),
        ('root ::= item ("," item)*\nitem ::= [0-9]+', "1,,2", False, False),
        ('root ::= "[" [\\]\\[-] "]"', "[-]", True, True),
        ('root ::= "x"?  "y"*', "", True, True),
    ],
)
def test_the_matcher_reads_gbnf(grammar: str, text: str, complete: bool, viable: bool) -> None:
    from conductor.llm.gbnf import GbnfMatcher

    found = GbnfMatcher(grammar).match(text)
    assert (found.complete, found.viable) == (complete, viable)


def test_the_matcher_says_where_a_reply_left_the_workflow_grammar() -> None:
    from conductor.llm.gbnf import GbnfMatcher

    matcher = GbnfMatcher(workflow_grammar(2, 2))
    reply = 'Plan.\nmodel_id = [0, 1]\nsubtasks = ["Solve.", "Check."]\naccess_list = [[], ["all"]]'
    assert matcher.match(reply).complete
    assert matcher.match(reply + "\n").offset == len(reply)
    assert matcher.match(reply.replace("[0, 1]", "[0, 2]")).offset == reply.index("1]")
    assert matcher.match("Sure [x]").offset == 5


@pytest.mark.parametrize(
    ("grammar", "error"),
    [
        ('root ::= "open', "unterminated string"),
        ("root ::= other", "not defined"),
        ('start ::= "x"', "no 'root' rule"),
        ('root ::= "x"{3,1}', "below its minimum"),
        ('root ::= root "x" | "y"', "left-recursive"),
        ('root ::= "\\q"', "unknown escape"),
    ],
)
def test_the_matcher_refuses_what_it_cannot_read(grammar: str, error: str) -> None:
    from conductor.llm.gbnf import GbnfError, GbnfMatcher

    with pytest.raises(GbnfError, match=error):
        GbnfMatcher(grammar).match("yx")
