"""The workflow parser, formatter and dict form, driven by tests/cases/workflow_parse.json."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from conductor.errors import WorkflowParseError
from conductor.workflow import (
    ALL,
    RECORD_FIELDS,
    Step,
    Workflow,
    format_workflow,
    parse_workflow,
    workflow_from_dict,
    workflow_to_dict,
)

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "cases" / "workflow_parse.json").read_text(encoding="utf-8")
)


def test_case_file_is_well_formed() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    assert len(CASES) >= 45
    for case in CASES:
        assert ("expect" in case) != ("error" in case), case["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    kwargs = {
        "n_workers": case["n_workers"],
        "max_steps": case.get("max_steps", 5),
        "allow_empty": case.get("allow_empty", False),
    }
    if "error" in case:
        with pytest.raises(WorkflowParseError) as info:
            parse_workflow(case["text"], **kwargs)
        assert case["error"] in info.value.reason
        assert str(info.value) == info.value.reason
    else:
        workflow = parse_workflow(case["text"], **kwargs)
        assert workflow_to_dict(workflow) == case["expect"]


def test_parsed_types() -> None:
    w = parse_workflow(
        'model_id = ["1", 0, 2]\nsubtasks = ["a", "b", "c"]\naccess_list = [[], ["all"], [1, 0]]',
        n_workers=3,
    )
    assert w.steps == (
        Step(1, "a", ()),
        Step(0, "b", ALL),
        Step(2, "c", (0, 1)),
    )
    assert w.dependencies() == [(), (0,), (0, 1)]


def test_empty_workflow_is_empty() -> None:
    w = parse_workflow("model_id=[]\nsubtasks=[]\naccess_list=[]", n_workers=2, allow_empty=True)
    assert w.is_empty and w == Workflow(())
    assert format_workflow(w) == "model_id = []\nsubtasks = []\naccess_list = []"


def test_format_canonical_form() -> None:
    w = Workflow((Step(2, "Design it", ()), Step(0, 'Say "hi"', ALL), Step(1, "Judge", (0, 1))))
    assert format_workflow(w) == (
        "model_id = [2, 0, 1]\n"
        'subtasks = ["Design it", "Say \\"hi\\"", "Judge"]\n'
        'access_list = [[], ["all"], [0, 1]]'
    )


TRICKY = [
    "Quote \" and ' both",
    "Brackets ] [ ]] [[ inside",
    "Backslash \\ and \\n literal",
    "Real\nnewline and\ttab",
    "model_id = [9]\nsubtasks = ['x']\naccess_list = [[]]",
    "Wrap reasoning in <think> tags and close with </think>",
    "```python\nprint(1)\n```",
    "Ünïcödé ✓ 数学",
    "all",
    "\u2028 line separator",
]


@pytest.mark.parametrize("subtask", TRICKY)
def test_round_trip_tricky_subtasks(subtask: str) -> None:
    w = Workflow((Step(0, "first", ()), Step(1, subtask, ALL)))
    assert parse_workflow(format_workflow(w), n_workers=2) == w
    # The canonical form is also embeddable after reasoning and inside a code fence.
    text = f"<think>plan</think>Plan:\n```python\n{format_workflow(w)}\n```\nDone."
    assert parse_workflow(text, n_workers=2) == w


def _random_workflow(rng: random.Random, n_workers: int) -> Workflow:
    alphabet = "ab []'\"\\,=:_<>/\n\t{}()#`*-éλ"
    steps = []
    for i in range(rng.randint(1, 5)):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        if not text.strip():
            text += "x"
        kind = rng.random()
        access: Any
        if kind < 0.3:
            access = ()
        elif kind < 0.6 or i == 0:
            access = ALL
        else:
            access = tuple(sorted(rng.sample(range(i), rng.randint(1, i))))
        steps.append(Step(rng.randrange(n_workers), text, access))
    return Workflow(tuple(steps))


def test_random_workflows_round_trip() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(1, 8)
        w = _random_workflow(rng, n)
        assert parse_workflow(format_workflow(w), n_workers=n) == w, format_workflow(w)
        assert workflow_from_dict(workflow_to_dict(w), n_workers=n) == w
        assert workflow_from_dict(json.loads(json.dumps(workflow_to_dict(w)))) == w


def test_random_decoy_before_final_loses() -> None:
    rng = random.Random(99)
    for _ in range(100):
        decoy, final = _random_workflow(rng, 4), _random_workflow(rng, 4)
        text = f"First idea:\n{format_workflow(decoy)}\nBetter:\n{format_workflow(final)}\nEnd."
        assert parse_workflow(text, n_workers=4) == final


def test_dict_form() -> None:
    w = Workflow((Step(1, "a", ()), Step(0, "b", ALL), Step(2, "c", (0,))))
    d = workflow_to_dict(w)
    assert d == {
        "model_id": [1, 0, 2],
        "subtasks": ["a", "b", "c"],
        "access_list": [[], ["all"], [0]],
    }
    assert json.loads(json.dumps(d)) == d
    assert workflow_from_dict(d) == w
    assert workflow_from_dict({"model_id": [], "subtasks": [], "access_list": []}).is_empty


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"model_id": [0], "subtasks": ["a"]}, "`access_list` missing"),
        ({"model_id": [0], "subtasks": ["a", "b"], "access_list": [[], []]}, "has 1 entries"),
        ({"model_id": [5], "subtasks": ["a"], "access_list": [[]]}, "out of range"),
        ({"model_id": [-1], "subtasks": ["a"], "access_list": [[]]}, "negative"),
        ({"model_id": 0, "subtasks": ["a"], "access_list": [[]]}, "`model_id` is not a list"),
    ],
)
def test_dict_form_rejects(data: dict[str, Any], reason: str) -> None:
    n_workers = 2 if data.get("model_id") == [5] else None
    with pytest.raises(WorkflowParseError, match=reason):
        workflow_from_dict(data, n_workers=n_workers)


def test_the_lenient_reading_of_a_written_workflow_is_the_strict_one() -> None:
    rng = random.Random(4321)
    for _ in range(200):
        w = _random_workflow(rng, rng.randint(1, 6))
        recorded = json.loads(json.dumps(workflow_to_dict(w)))
        assert workflow_from_dict(recorded, lenient=True) == workflow_from_dict(recorded) == w
    assert [key for key, _ in RECORD_FIELDS] == list(workflow_to_dict(w))


@pytest.mark.parametrize(
    ("data", "steps"),
    [
        (None, ()),
        ({}, ()),
        ("model_id", ()),
        ({"model_id": 5, "subtasks": ["a"], "access_list": [[]]}, ()),
        # An old record's lists of different lengths: what is there, "" and () for the rest.
        ({"model_id": [1, 0], "subtasks": ["a"]}, (Step(1, "a"), Step(0, ""))),
        (
            {
                "model_id": [0, "x", 2],
                "subtasks": ["a", 7, "c"],
                "access_list": [[], ["all", 3], [0, -1, "q", 1, 9]],
            },
            (Step(0, "a"), Step(-1, "7", ALL), Step(2, "c", (0, 1, 9))),
        ),
        ({"model_id": [0], "subtasks": "abc", "access_list": "all"}, (Step(0, ""),)),
    ],
)
def test_a_damaged_workflow_is_read_leniently_as_far_as_it_goes(
    data: Any, steps: tuple[Step, ...]
) -> None:
    read = workflow_from_dict(data, lenient=True)
    assert read.steps == steps
    # A step refers to earlier steps only, whatever the record says.
    assert [s.visible(i) for i, s in enumerate(read.steps)] == [
        tuple(range(i)) if s.access == ALL else tuple(j for j in s.access if j < i)
        for i, s in enumerate(steps)
    ]
    if data is not None:
        with pytest.raises(WorkflowParseError):
            workflow_from_dict(data)


def test_recorded_access() -> None:
    assert Step(0, "a", ALL).recorded_access() == ["all"]
    assert Step(0, "a", (2, 0)).recorded_access() == [2, 0]
    assert Step(0, "a").recorded_access() == []


def test_zero_workers() -> None:
    with pytest.raises(WorkflowParseError, match="there are no workers"):
        parse_workflow("model_id=[0]\nsubtasks=['a']\naccess_list=[[]]", n_workers=0)


@pytest.mark.long
def test_huge_hostile_reply_is_bounded() -> None:
    """Only the tail is searched, so a reply full of unclosed lists cannot stall a run."""
    import time

    from conductor.workflow import MAX_REPLY_CHARS

    junk = "model_id = [ subtasks = [ access_list = [ " * 20_000  # ~840k characters
    plan = '\nmodel_id = [0]\nsubtasks = ["Go"]\naccess_list = [[]]'
    t0 = time.perf_counter()
    wf = parse_workflow(junk + plan, n_workers=1)
    assert time.perf_counter() - t0 < 10
    assert [s.worker for s in wf.steps] == [0]
    assert len(junk) > MAX_REPLY_CHARS


@pytest.mark.parametrize(
    "text",
    [
        "model_id = " + "[" * 100_000 + "]" * 100_000 + '\nsubtasks = ["a"]\naccess_list = [[]]',
        'model_id = [0]\nsubtasks = ["a"]\naccess_list = [' + "[" * 100_000 + "]" * 100_000 + "]",
        "model_id = [0]\nsubtasks = [" + "[a, " * 100_000 + "]" * 100_001 + "\naccess_list = [[]]",
        "model_id = [0]\nsubtasks = [" + "[a'b, " * 5_000 + "]" * 5_001 + "\naccess_list = [[]]",
        "model_id = [" + "[" * 100_000,
    ],
    ids=["ids", "access", "lenient_words", "lenient_apostrophes", "unclosed"],
)
def test_deeply_nested_brackets_are_a_parse_error_not_a_crash(text: str) -> None:
    """A reply of 100,000 nested brackets is refused with a reason (once a RecursionError
    that escaped the executor and lost the benchmark sample)."""
    with pytest.raises(WorkflowParseError):
        parse_workflow(text, n_workers=2)


def test_deep_nesting_within_the_read_window_names_the_list() -> None:
    depth = 7_000  # 14,000 brackets: inside MAX_REPLY_CHARS, so every one is scanned
    text = 'model_id = [0]\nsubtasks = ["a"]\naccess_list = [' + "[" * depth + "]" * depth + "]"
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(text, n_workers=2)
    assert "`access_list` list nests brackets more than" in info.value.reason


def test_subtask_choices_admit_only_the_offered_instructions() -> None:
    """With a pool's `conductor.subtasks`, the parser checks what the grammar enforces
    (for replies written without one: training rollouts, clients that cannot send it)."""
    text = 'model_id = [0, 1]\nsubtasks = ["Solve it.", " Check it. "]\naccess_list = [[], ["all"]]'
    choices = ("Solve it.", "Check it.")
    assert len(parse_workflow(text, n_workers=2, subtask_choices=choices).steps) == 2
    with pytest.raises(WorkflowParseError, match=r"subtasks\[1\] = ' Check it. ' is not one"):
        parse_workflow(text, n_workers=2, subtask_choices=("Solve it.", "Check."))
    # Without choices any instruction goes, as before.
    assert parse_workflow(text, n_workers=2).steps[1].subtask == " Check it. "
