"""Constrained decoding for the Conductor: a GBNF grammar and a JSON schema.

:func:`workflow_grammar` writes a `GBNF <https://github.com/ggml-org/llama.cpp/blob/master/grammars/README.md>`_
grammar for llama.cpp that only admits replies of the form::

    <free reasoning, no square brackets>
    model_id = [2, 0]
    subtasks = ["Plan the proof ...", "Check the plan ..."]
    access_list = [[], ["all"]]

so even a very small model always writes a workflow that
:func:`conductor.workflow.parse_workflow` accepts: the three lists have the same
length (one grammar alternative per length locks them together), ids are in range,
subtasks are non-empty single-line strings, and every access entry is legal for its
position.  The reasoning is bounded in characters so that a small model cannot spend
its whole ``max_tokens`` budget before reaching the lists; it holds no brackets so it
cannot contain decoy lists either.

:func:`workflow_response_format` is the same idea for OpenAI-compatible servers with
guided decoding (vLLM, SGLang, llama.cpp's server); JSON schema cannot tie the three
lengths together, so the parser still has the last word there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "workflow_grammar",
    "workflow_json_schema",
    "workflow_max_chars",
    "workflow_response_format",
]

# Reasoning may hold any character except square brackets (no decoy lists) and control
# characters other than tab and newline.
_REASONING_CHAR = r"[^\[\]\x00-\x08\x0b-\x1f]"
# A subtask is a double-quoted, single-line string.  Its first character is visible and
# not punctuation (tiny models otherwise write subtasks like ","), so a subtask is never
# empty or blank; later characters may be anything but
# a quote, a backslash or a control character, or one of a few escapes that
# ``ast.literal_eval`` and ``json.loads`` both read the same way.
_SUBTASK_FIRST = r'[^"\\\x00-\x20,.;:!?()\[\]{}]'
_SUBTASK_CHAR = r'[^"\\\x00-\x1f] | "\\" ["\\nt]'
_EMPTY_WORKFLOW = "model_id = []\nsubtasks = []\naccess_list = []"


def _check_bounds(n_workers: int, max_steps: int) -> None:
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, not {n_workers}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, not {max_steps}")


def _lit(text: str) -> str:
    """``text`` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _join(parts: list[str], sep: str = '", "') -> str:
    """GBNF sequence of rule names ``parts`` separated by the literal ``sep``."""
    return f" {sep} ".join(parts)


def workflow_grammar(
    n_workers: int,
    max_steps: int,
    *,
    allow_empty: bool = False,
    allow_indices: bool = False,
    max_reasoning_chars: int = 600,
    max_subtask_chars: int = 300,
    min_subtask_chars: int = 1,
    subtask_choices: Sequence[str] = (),
) -> str:
    """A GBNF grammar (root rule ``root``) admitting only valid workflow replies.

    ``n_workers``: worker ids range over ``0 .. n_workers - 1``.  ``max_steps``: the
    workflow has 1 to ``max_steps`` steps (or none, with ``allow_empty``, as a recursive
    round's "keep the previous answer").  ``allow_indices`` also admits explicit access
    lists of earlier steps (``[0, 2]``, ascending, each below the step's own index)
    besides ``[]`` and ``["all"]``.  ``max_reasoning_chars`` bounds the free text before
    the lists (0 forbids it); ``min_subtask_chars`` and ``max_subtask_chars`` bound each
    subtask's length.  ``subtask_choices``, when given, are the only subtasks admitted
    (the length bounds then do not apply): a small model keeps to instructions that say
    what to do and cannot rewrite the question in them.
    """
    _check_bounds(n_workers, max_steps)
    if max_subtask_chars < 1:
        raise ValueError(f"max_subtask_chars must be at least 1, not {max_subtask_chars}")
    if max_reasoning_chars < 0:
        raise ValueError(f"max_reasoning_chars must not be negative, not {max_reasoning_chars}")

    rules: list[str] = []
    lengths = [f"wf{n}" for n in range(1, max_steps + 1)]
    if allow_empty:
        lengths.insert(0, "wf0")
    if max_reasoning_chars > 0:
        rules.append('root ::= reasoning "\\n" workflow')
        rules.append(f"reasoning ::= rchar{{0,{max_reasoning_chars}}}")
        rules.append(f"rchar ::= {_REASONING_CHAR}")
    else:
        rules.append("root ::= workflow")
    rules.append(f"workflow ::= {' | '.join(lengths)}")

    # One alternative per length: once the model has written n ids it must write exactly
    # n subtasks and n access entries, which is how the lengths are locked together.
    if allow_empty:
        rules.append("wf0 ::= " + _lit(_EMPTY_WORKFLOW))
    for n in range(1, max_steps + 1):
        ids = _join(["id"] * n)
        subtasks = _join(["subtask"] * n)
        access = _join([f"acc{i}" for i in range(n)])
        rules.append(
            f'wf{n} ::= "model_id = [" {ids} "]\\nsubtasks = [" {subtasks} '
            f'"]\\naccess_list = [" {access} "]"'
        )

    rules.append("id ::= " + " | ".join(f'"{i}"' for i in range(n_workers)))
    if subtask_choices:
        for choice in subtask_choices:
            if not choice or any(c in '"\\' or c < " " for c in choice):
                raise ValueError(f"a subtask choice must be one line without quotes: {choice!r}")
        quoted = " | ".join(_lit(f'"{choice}"') for choice in subtask_choices)
        rules.append(f"subtask ::= {quoted}")
    else:
        low = max(0, min(min_subtask_chars, max_subtask_chars) - 1)
        rules.append(f'subtask ::= "\\"" sfirst schar{{{low},{max_subtask_chars - 1}}} "\\""')
        rules.append(f"sfirst ::= {_SUBTASK_FIRST}")
        rules.append(f"schar ::= {_SUBTASK_CHAR}")

    # Access entries: step i may see nothing, everything, or (with allow_indices) an
    # ascending list of earlier steps.  Step 0 has no earlier steps, so only [] or ["all"].
    for i in range(max_steps):
        alternatives = ['"[]"', '"[\\"all\\"]"']
        if allow_indices and i > 0:
            alternatives.append('"[" (' + " | ".join(f"idx{i}from{j}" for j in range(i)) + ') "]"')
        rules.append(f"acc{i} ::= " + " | ".join(alternatives))
    if allow_indices:
        # idx{i}from{j}: an ascending run of indices below i that starts at j.
        for i in range(1, max_steps):
            for j in range(i):
                later = " | ".join(f"idx{i}from{k}" for k in range(j + 1, i))
                tail = f' (", " ({later}))?' if later else ""
                rules.append(f'idx{i}from{j} ::= "{j}"{tail}')
    return "\n".join(rules) + "\n"


def workflow_max_chars(
    n_workers: int,
    max_steps: int,
    *,
    allow_indices: bool = False,
    max_reasoning_chars: int = 600,
    max_subtask_chars: int = 300,
) -> int:
    """The longest reply :func:`workflow_grammar` admits, in characters.

    Use it to choose ``max_tokens`` (or the bounds) so that a reply always fits: a reply
    cut off by ``max_tokens`` before its last bracket does not parse.  Escapes count as
    two characters, as written.
    """
    _check_bounds(n_workers, max_steps)
    n = max_steps
    id_width = len(str(n_workers - 1))
    seps = 2 * (n - 1)  # ", " between items of each list
    model_line = len("model_id = []") + n * id_width + seps
    # An escape is two characters, so the worst case is every character escaped.
    subtask_line = len("\nsubtasks = []") + n * (2 + 1 + 2 * (max_subtask_chars - 1)) + seps
    if allow_indices:
        # Step i's longest entry lists every earlier index.
        entries = [
            max(len('["all"]'), 2 + sum(len(str(k)) for k in range(i)) + 2 * max(i - 1, 0))
            for i in range(n)
        ]
    else:
        entries = [len('["all"]')] * n
    access_line = len("\naccess_list = []") + sum(entries) + seps
    reasoning = max_reasoning_chars + 1 if max_reasoning_chars > 0 else 0
    return reasoning + model_line + subtask_line + access_line


def workflow_json_schema(
    n_workers: int,
    max_steps: int,
    *,
    allow_empty: bool = False,
    allow_indices: bool = False,
    max_reasoning_chars: int = 600,
    max_subtask_chars: int = 300,
) -> dict[str, Any]:
    """A JSON schema for a workflow object, for servers with guided decoding.

    The object has ``reasoning`` (a bounded string, first so that the model thinks
    before it plans), then ``model_id``, ``subtasks`` and ``access_list`` arrays of 1 to
    ``max_steps`` items (0 allowed with ``allow_empty``).  JSON schema cannot say that
    the three arrays have the *same* length, nor that an explicit access index is
    below its own step's index, so :func:`conductor.workflow.parse_workflow` still
    validates the reply (it reads the ``"model_id": [...]`` labels of this JSON form).
    """
    _check_bounds(n_workers, max_steps)
    min_items = 0 if allow_empty else 1
    access_options: list[dict[str, Any]] = [
        {"type": "array", "maxItems": 0},
        {
            "type": "array",
            "items": {"type": "string", "enum": ["all"]},
            "minItems": 1,
            "maxItems": 1,
        },
    ]
    if allow_indices and max_steps > 1:
        access_options.append(
            {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": max_steps - 2},
                "minItems": 1,
                "maxItems": max_steps - 1,
                "uniqueItems": True,
            }
        )

    def bounded(items: dict[str, Any]) -> dict[str, Any]:
        return {"type": "array", "items": items, "minItems": min_items, "maxItems": max_steps}

    properties: dict[str, Any] = {}
    if max_reasoning_chars > 0:
        properties["reasoning"] = {"type": "string", "maxLength": max_reasoning_chars}
    properties["model_id"] = bounded({"type": "integer", "minimum": 0, "maximum": n_workers - 1})
    properties["subtasks"] = bounded(
        {"type": "string", "minLength": 1, "maxLength": max_subtask_chars}
    )
    properties["access_list"] = bounded({"anyOf": access_options})
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def workflow_response_format(
    n_workers: int,
    max_steps: int,
    *,
    allow_empty: bool = False,
    allow_indices: bool = False,
    max_reasoning_chars: int = 600,
    max_subtask_chars: int = 300,
) -> dict[str, Any]:
    """:func:`workflow_json_schema` wrapped as an OpenAI ``response_format`` value.

    Pass it as :attr:`conductor.llm.types.ModelRequest.response_format`.  ``strict`` is
    left off because OpenAI's strict mode rejects ``minItems`` / ``maxLength``; servers
    with guided decoding (vLLM, SGLang) enforce them.
    """
    schema = workflow_json_schema(
        n_workers,
        max_steps,
        allow_empty=allow_empty,
        allow_indices=allow_indices,
        max_reasoning_chars=max_reasoning_chars,
        max_subtask_chars=max_subtask_chars,
    )
    return {"type": "json_schema", "json_schema": {"name": "workflow", "schema": schema}}
