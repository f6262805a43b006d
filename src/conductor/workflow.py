"""Workflows: the Conductor's plan, as steps over the worker pool.

A reply from the Conductor ends with three Python lists of equal length::

    model_id = [2, 0]
    subtasks = ["Design an algorithm that ...", "Implement it in Python"]
    access_list = [[], ["all"]]

:func:`parse_workflow` turns such a reply into a :class:`Workflow` or raises
:class:`~conductor.errors.WorkflowParseError` with a short reason the Conductor can be
told when it is asked again.  :func:`format_workflow` writes the canonical form back,
and :func:`workflow_to_dict` / :func:`workflow_from_dict` are the one writer and reader
of the JSON form a run record keeps of each round's plan (``RoundRecord.workflow``).

It is kept whole (under 600 lines) because it is the one owner of one format:
the lenient list reader, the parser's rules and the canonical writer must agree on what
the three lists look like, and splitting them would put that agreement in two places.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import WorkflowParseError
from .text import plural, strip_think

__all__ = [
    "ALL",
    "MAX_NESTING",
    "MAX_REPLY_CHARS",
    "RECORD_FIELDS",
    "Access",
    "Step",
    "Workflow",
    "WorkflowParseError",
    "format_workflow",
    "parse_workflow",
    "step_spans",
    "workflow_from_dict",
    "workflow_to_dict",
]

ALL: Literal["all"] = "all"
#: Only this many characters at the end of a reply (after reasoning blocks are removed)
#: are searched for the lists.
MAX_REPLY_CHARS = 16_000
#: Lists nested deeper than this are refused: a workflow needs two levels, and a bound
#: keeps every reader below (``ast``, ``json``, the lenient reader, ``repr`` in error
#: messages) far from Python's recursion limit whatever the reply holds.
MAX_NESTING = 32
#: ``"all"`` (every earlier step), or the explicit indices of earlier steps
#: (the empty tuple means the step sees no earlier step).
Access = Literal["all"] | tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One step: which worker (by its ordinal in the pool as listed to the
    Conductor), the instruction written for it, and which earlier steps it sees."""

    worker: int
    subtask: str
    access: Access = ()

    def visible(self, index: int) -> tuple[int, ...]:
        """Indices of the earlier steps (of the same round) visible to step ``index``."""
        if self.access == ALL:
            return tuple(range(index))
        assert not isinstance(self.access, str)
        return tuple(i for i in self.access if i < index)

    def recorded_access(self) -> list[int | str]:
        """The access as a record (and the canonical text form) writes it: ``["all"]``,
        or the indices of the earlier steps seen."""
        return [ALL] if self.access == ALL else list(self.access)


@dataclass(frozen=True)
class Workflow:
    """An ordered list of steps.  Empty only in a recursive round ("keep the answer")."""

    steps: tuple[Step, ...]

    @property
    def is_empty(self) -> bool:
        return not self.steps

    def dependencies(self) -> list[tuple[int, ...]]:
        """For each step, the earlier steps it must wait for."""
        return [s.visible(i) for i, s in enumerate(self.steps)]


# --------------------------------------------------------------------------- parsing

_MODEL, _SUBTASKS, _ACCESS = "model_id", "subtasks", "access_list"
_KINDS = (_MODEL, _SUBTASKS, _ACCESS)

# A label, optionally quoted / backticked / bold, then an optional ``:`` or ``=`` and the
# opening bracket of its list.  Label spellings vary between checkpoints and prompted
# models ("model id", "Model_IDs", "subtask list", "access lists", ...).
_LABEL = re.compile(
    r"(?<![A-Za-z0-9_])"
    r"(?:(?P<model_id>model[ _-]?ids?(?:[ _-]?list)?)"
    r"|(?P<subtasks>sub[ _-]?tasks?(?:[ _-]?list)?)"
    r"|(?P<access_list>access[ _-]?lists?))"
    r"[\"'`*]*[ \t]*(?::=|[:=])?[ \t]*[*`]*\s*(?=\[)",
    re.IGNORECASE,
)
# A line that is only a markdown code fence (```python, ```, ~~~).
_FENCE = re.compile(r"^[ \t]*(?:```|~~~)[\w+.-]*[ \t]*$", re.MULTILINE)
_INT_TEXT = re.compile(r"[+-]?\d+")
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"


@dataclass
class _Found:
    """One labelled list found in the reply."""

    kind: str
    value: list[Any] | None  # None when its brackets never close or nest too deep
    start: int
    too_deep: bool = False
    #: The list's text is ``text[bracket:end]`` (both -1 when it never closed).
    bracket: int = -1
    end: int = -1


# The characters that matter when matching brackets; the scan jumps between them.
# Parentheses and braces do not close a list but count towards its nesting, since the
# literal and JSON readers nest through them too.
_BRACKET_OR_QUOTE = re.compile(r"[\[\](){}\"'\\]")
_BRACKET = re.compile(r"[\[\](){}]")


def _balanced_end(text: str, start: int, *, honour_strings: bool) -> tuple[int | None, int]:
    """Index just past the bracket that closes the ``[`` at ``start`` (or None), and
    the deepest nesting of brackets, parentheses and braces seen on the way.

    With ``honour_strings`` brackets inside quoted strings do not count and backslash
    escapes are honoured (the normal case); without it quotes are ignored, which rescues
    lenient lists such as ``[Check Bob's proof]`` whose apostrophe opens no string.
    """
    depth = 0
    nesting = 0
    deepest = 0
    quote: str | None = None
    pattern = _BRACKET_OR_QUOTE if honour_strings else _BRACKET
    pos = start
    while (match := pattern.search(text, pos)) is not None:
        ch = match.group()
        pos = match.end()
        if quote is not None:
            if ch == "\\":
                pos += 1  # the escaped character never ends the string
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "[({":
            depth += ch == "["
            nesting += 1
            deepest = max(deepest, nesting)
        elif ch in "])}":
            nesting = max(0, nesting - 1)
            if ch == "]":
                depth -= 1
                if depth == 0:
                    return pos, deepest
    return None, deepest


def _top_level_spans(inner: str) -> list[tuple[int, int]]:
    """The (start, end) offsets in ``inner`` of its items split at commas that are not
    nested or quoted, surrounding spaces excluded and empty items dropped."""
    spans: list[tuple[int, int]] = []
    depth = 0
    quote: str | None = None
    begin = 0
    blank = True  # nothing but spaces since ``begin``
    i = 0

    def close(end: int) -> None:
        item = inner[begin:end]
        stripped = item.strip()
        if stripped:
            first = begin + len(item) - len(item.lstrip())
            spans.append((first, first + len(stripped)))

    while i < len(inner):
        ch = inner[i]
        if quote is not None:
            if ch == "\\" and i + 1 < len(inner):
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'" and blank:
            # Only a quote that starts an item opens a string, so an apostrophe inside
            # unquoted words ("Bob's") does not swallow the rest of the list.
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            close(i)
            begin, blank = i + 1, True
            i += 1
            continue
        if not ch.isspace():
            blank = False
        i += 1
    close(len(inner))
    return spans


def _split_top_level(inner: str) -> list[str]:
    """Split the inside of a list at commas that are not nested or quoted."""
    return [inner[a:b] for a, b in _top_level_spans(inner)]


def _lenient_list(source: str, depth: int) -> list[Any]:
    """Last resort: read ``[a, b, [c]]`` item by item, unquoted words as strings.

    ``depth`` counts the enclosing lists; past :data:`MAX_NESTING` an inner list is kept
    as its text, so no input can drive the reader into deep recursion.
    """
    items: list[Any] = []
    for part in _split_top_level(source.strip()[1:-1]):
        if part.startswith("[") and part.endswith("]") and depth < MAX_NESTING:
            items.append(_read_list(part, depth + 1))
            continue
        try:
            items.append(ast.literal_eval(part))
            continue
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
        if len(part) >= 2 and part[0] in _QUOTES and part[-1] in _QUOTES:
            part = part[1:-1]
        items.append(part)
    return items


def _read_list(source: str, depth: int = 1) -> list[Any]:
    """Read a bracketed list: as a Python literal, then as JSON, then leniently.

    Callers pass only lists whose brackets nest at most :data:`MAX_NESTING` deep, so
    the literal and JSON readers never meet deep input."""
    try:
        value = ast.literal_eval(source)
        if isinstance(value, list):
            return value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        # strict=False lets raw newlines inside strings through, which models do write.
        value = json.loads(source, strict=False)
        if isinstance(value, list):
            return value
    except (ValueError, RecursionError):
        pass
    return _lenient_list(source, depth)


def _find_lists(text: str) -> list[_Found]:
    """Every labelled list, in text order.

    Scanning resumes after the end of each list found, so a label quoted inside a
    subtask ("print the model_id = [..] field") is never taken for a list of its own.
    """
    found: list[_Found] = []
    pos = 0
    while True:
        match = _LABEL.search(text, pos)
        if match is None:
            return found
        kind = match.lastgroup or _MODEL
        bracket = match.end()
        end, deepest = _balanced_end(text, bracket, honour_strings=True)
        if end is None:
            end, deepest = _balanced_end(text, bracket, honour_strings=False)
        if end is None or deepest > MAX_NESTING:
            too_deep = end is not None
            found.append(_Found(kind, None, match.start(), too_deep=too_deep))
            pos = bracket + 1 if end is None else end
            continue
        found.append(
            _Found(kind, _read_list(text[bracket:end]), match.start(), bracket=bracket, end=end)
        )
        pos = end


def _group(found: list[_Found]) -> list[dict[str, _Found]]:
    """Group the lists into candidate triples, each starting at a ``model_id`` list.

    The first ``subtasks`` and ``access_list`` after a ``model_id`` belong to it; later
    repeats (e.g. an explanation quoting the access list) are ignored.
    """
    groups: list[dict[str, _Found]] = []
    for item in found:
        if item.kind == _MODEL:
            groups.append({_MODEL: item})
        elif groups and item.kind not in groups[-1]:
            groups[-1][item.kind] = item
    return groups


def _group_any_order(found: list[_Found]) -> list[dict[str, _Found]]:
    """Fallback grouping for replies whose lists come in another order (e.g. a JSON
    object with ``subtasks`` first): a new group starts whenever a kind repeats."""
    groups: list[dict[str, _Found]] = [{}]
    for item in found:
        if item.kind in groups[-1]:
            groups.append({})
        groups[-1][item.kind] = item
    return groups


def _complete(group: dict[str, _Found]) -> bool:
    return all(k in group and group[k].value is not None for k in _KINDS)


def _as_int(value: Any) -> int | None:
    """An int, or a string of digits; never a bool or a float."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _is_all(value: Any) -> bool:
    return isinstance(value, str) and value.strip().strip(_QUOTES).lower() == ALL


def _access(entry: Any, index: int) -> Access:
    """Validate ``access_list[index]``."""
    if _is_all(entry):
        return ALL
    if not isinstance(entry, (list, tuple)):
        raise WorkflowParseError(
            f'access_list[{index}] = {entry!r} is not [], ["all"] or a list of earlier step indices'
        )
    if any(_is_all(item) for item in entry):
        return ALL
    indices: set[int] = set()
    for item in entry:
        j = _as_int(item)
        if j is None:
            raise WorkflowParseError(
                f'access_list[{index}] = {list(entry)!r} is not [], ["all"] or a list of '
                "earlier step indices"
            )
        if not 0 <= j < index:
            allowed = f"0-{index - 1}" if index > 0 else "none: it is the first step"
            raise WorkflowParseError(
                f"access_list[{index}] refers to step {j}, but a step may only see earlier "
                f"steps ({allowed})"
            )
        indices.add(j)
    return tuple(sorted(indices))


def _build(
    model_ids: Any,
    subtasks: Any,
    access: Any,
    *,
    n_workers: int | None,
    max_steps: int | None,
    allow_empty: bool,
) -> Workflow:
    """Validate three raw lists and build the workflow (shared by parse and from_dict)."""
    for name, value in ((_MODEL, model_ids), (_SUBTASKS, subtasks), (_ACCESS, access)):
        if not isinstance(value, (list, tuple)):
            raise WorkflowParseError(f"`{name}` is not a list")
    if len(model_ids) != len(subtasks):
        raise WorkflowParseError(
            f"model_id has {len(model_ids)} entries but subtasks has {len(subtasks)}"
        )
    if len(model_ids) != len(access):
        raise WorkflowParseError(
            f"model_id has {len(model_ids)} entries but access_list has {len(access)}"
        )
    if not model_ids:
        if allow_empty:
            return Workflow(())
        raise WorkflowParseError(
            "the workflow is empty; an empty workflow is only allowed when revising"
        )
    if max_steps is not None and len(model_ids) > max_steps:
        raise WorkflowParseError(
            f"the workflow has {len(model_ids)} steps but at most {max_steps} are allowed"
        )
    steps: list[Step] = []
    for i, (raw_id, subtask, entry) in enumerate(zip(model_ids, subtasks, access, strict=True)):
        worker = _as_int(raw_id)
        if worker is None:
            raise WorkflowParseError(f"model_id[{i}] = {raw_id!r} is not an integer")
        if n_workers is not None and not 0 <= worker < n_workers:
            pool = (
                f"{plural(n_workers, 'worker')} (0-{n_workers - 1})"
                if n_workers > 0
                else "no workers"
            )
            raise WorkflowParseError(f"model_id[{i}] = {worker} is out of range: there are {pool}")
        if worker < 0:
            raise WorkflowParseError(f"model_id[{i}] = {worker} is negative")
        if not isinstance(subtask, str):
            raise WorkflowParseError(f"subtasks[{i}] = {subtask!r} is not a string")
        if not subtask.strip():
            raise WorkflowParseError(f"subtasks[{i}] is empty")
        steps.append(Step(worker=worker, subtask=subtask, access=_access(entry, i)))
    return Workflow(tuple(steps))


def parse_workflow(
    text: str,
    *,
    n_workers: int,
    max_steps: int = 5,
    allow_empty: bool = False,
    subtask_choices: Sequence[str] = (),
) -> Workflow:
    """Read the workflow at the end of a Conductor reply.

    Reasoning blocks (``<think>``) are dropped first (decoy plans live there), then
    code-fence lines.  Labelled lists are found anywhere in the rest (labels in any
    case, with spaces/underscores, plural or not, quoted, backticked or bold, after a
    ``-`` bullet, followed by ``=``, ``:`` or nothing); each is cut out by balanced
    brackets (brackets inside strings do not count) and read as a Python literal, then
    as JSON, then leniently (``[all]`` and other unquoted words become strings).  The
    *last* complete ``model_id``/``subtasks``/``access_list`` triple wins, so drafts
    earlier in the reasoning lose to the final plan; an incomplete later triple does not
    hide an earlier complete one.  Text after the lists is ignored.

    Accepted values: ``model_id`` entries are ints or strings of digits (a model may
    quote them; ``True`` and ``2.0`` are rejected) in ``0..n_workers-1``; subtasks are
    non-empty strings; an access entry is ``[]``, ``"all"`` or any list holding
    ``"all"`` (any case) for every earlier step, or a list of earlier step indices.
    Three empty lists give the empty workflow when ``allow_empty`` (a recursive round
    accepting the previous answer).  With ``subtask_choices`` (a pool's
    ``conductor.subtasks``), every subtask must be one of them (surrounding spaces
    aside): what the grammar enforces while decoding, checked for a reply written
    without it (a training rollout, a client that cannot send a grammar).

    Raises :class:`WorkflowParseError` whose ``reason`` is a short sentence to show the
    Conductor when asking it again.
    """
    cleaned = strip_think(text.replace("\r\n", "\n").replace("\r", "\n"))
    cleaned = _FENCE.sub("", cleaned)
    if len(cleaned) > MAX_REPLY_CHARS:
        # The plan is at the end; bounding the text bounds the list search, whose worst
        # case (many unclosed brackets) grows with the square of the length.
        cleaned = cleaned[-MAX_REPLY_CHARS:]
    found = _find_lists(cleaned)
    if not found:
        raise WorkflowParseError(
            "no workflow found: end the reply with `model_id = [...]`, "
            "`subtasks = [...]` and `access_list = [...]`"
        )
    complete = [g for g in _group(found) if _complete(g)]
    if not complete:
        complete = [g for g in _group_any_order(found) if _complete(g)]
    if not complete:
        raise WorkflowParseError(_why_incomplete(found))
    chosen = complete[-1]
    workflow = _build(
        chosen[_MODEL].value,
        chosen[_SUBTASKS].value,
        chosen[_ACCESS].value,
        n_workers=n_workers,
        max_steps=max_steps,
        allow_empty=allow_empty,
    )
    if subtask_choices:
        allowed = {choice.strip() for choice in subtask_choices}
        for i, step in enumerate(workflow.steps):
            if step.subtask.strip() not in allowed:
                shown = step.subtask if len(step.subtask) <= 80 else step.subtask[:80] + "..."
                raise WorkflowParseError(
                    f"subtasks[{i}] = {shown!r} is not one of the instructions you can "
                    "give; copy one of them exactly"
                )
    return workflow


def step_spans(text: str, n_steps: int) -> list[list[tuple[int, int]]] | None:
    """Where each step of the plan at the end of ``text`` is written: for step ``i``, the
    (start, end) character offsets in ``text`` of its ``model_id``, ``subtasks`` and
    ``access_list`` entries.

    The lists are those :func:`parse_workflow` takes (the last complete triple), found in
    ``text`` itself so that the offsets are the reply's own; None when that triple cannot
    be located there with ``n_steps`` entries in each list (a plan inside a fence or after
    a reasoning block is found all the same, a reply cut to its last
    :data:`MAX_REPLY_CHARS` characters is not).  Training weights each step's tokens by
    its credit through these spans (:mod:`conductor.train.credit`).
    """
    if len(text) > MAX_REPLY_CHARS:
        return None
    complete = [g for g in _group(_find_lists(text)) if _complete(g)]
    if not complete:
        return None
    chosen = complete[-1]
    spans: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
    for kind in _KINDS:
        found = chosen[kind]
        # Inside the brackets: the offsets of the items, shifted back into ``text``.
        inner_start = found.bracket + 1
        items = _top_level_spans(text[inner_start : found.end - 1])
        if len(items) != n_steps:
            return None
        for i, (a, b) in enumerate(items):
            spans[i].append((inner_start + a, inner_start + b))
    return spans


def _why_incomplete(found: list[_Found]) -> str:
    """The reason when no complete triple exists, about the last attempt at one."""
    unreadable = [f for f in found if f.value is None]
    if unreadable and unreadable[-1].too_deep:
        return (
            f"the `{unreadable[-1].kind}` list nests brackets more than {MAX_NESTING} deep; "
            "write flat lists as described"
        )
    unclosed = unreadable
    if unclosed:
        return f"the `{unclosed[-1].kind}` list is never closed (unbalanced brackets)"
    groups = _group(found)
    if not groups:
        return "no `model_id` found"
    missing = [k for k in _KINDS if k not in groups[-1]]
    return " or ".join(f"no `{k}`" for k in missing) + " found after the `model_id` list"


# ------------------------------------------------------------------------ formatting

# A think tag inside a subtask would be taken for reasoning when the text is parsed
# again; writing its "<" as a \u escape keeps the string's value and hides the tag.
_TAG_START = re.compile(r"<(?=\s*/?\s*think)", re.IGNORECASE)


def _quote(text: str) -> str:
    """A double-quoted literal valid both as Python and as JSON."""
    return _TAG_START.sub(r"\\u003c", json.dumps(text, ensure_ascii=False))


def format_workflow(workflow: Workflow) -> str:
    """The canonical three-line form of ``workflow``, which :func:`parse_workflow` reads
    back to an equal workflow::

        model_id = [2, 0]
        subtasks = ["Design an algorithm ...", "Implement it"]
        access_list = [[], ["all"]]
    """
    ids = ", ".join(str(s.worker) for s in workflow.steps)
    subtasks = ", ".join(_quote(s.subtask) for s in workflow.steps)
    access = ", ".join(json.dumps(s.recorded_access()) for s in workflow.steps)
    return f"model_id = [{ids}]\nsubtasks = [{subtasks}]\naccess_list = [{access}]"


#: The recorded form's three lists, each with the type of its entries: what a record
#: reader checks of a round's ``workflow`` before anything reads it.
RECORD_FIELDS: tuple[tuple[str, Any], ...] = (
    (_MODEL, int),
    (_SUBTASKS, str),
    (_ACCESS, list[int | str]),
)


def workflow_to_dict(workflow: Workflow) -> dict[str, list[Any]]:
    """The JSON-ready form: ``{"model_id": [...], "subtasks": [...], "access_list":
    [...]}`` with ``"all"`` written as ``["all"]``."""
    return {
        _MODEL: [s.worker for s in workflow.steps],
        _SUBTASKS: [s.subtask for s in workflow.steps],
        _ACCESS: [s.recorded_access() for s in workflow.steps],
    }


def workflow_from_dict(
    data: Mapping[str, Any], *, n_workers: int | None = None, lenient: bool = False
) -> Workflow:
    """Inverse of :func:`workflow_to_dict`.  The same checks as :func:`parse_workflow`
    apply, except that the step count is not capped, an empty workflow is allowed, and
    worker ids are range-checked only when ``n_workers`` is given.  Raises
    :class:`WorkflowParseError` for a malformed dict.

    ``lenient`` reads what a view shows of an old or damaged record instead, and never
    raises: one step per ``model_id`` entry (none when it is missing or no list), a
    worker that is no integer as ``-1``, a missing subtask as ``""``, and of an access
    entry ``["all"]`` where it holds ``"all"``, else its indices of earlier steps (other
    items dropped).  Such a workflow is for display only: it may break the rules the
    strict reading checks."""
    if lenient:
        return _lenient(data)
    if not isinstance(data, Mapping):
        raise WorkflowParseError("a workflow must be a mapping")
    missing = [k for k in _KINDS if k not in data]
    if missing:
        raise WorkflowParseError(", ".join(f"`{k}`" for k in missing) + " missing")
    return _build(
        data[_MODEL],
        data[_SUBTASKS],
        data[_ACCESS],
        n_workers=n_workers,
        max_steps=None,
        allow_empty=True,
    )


def _lenient(data: Any) -> Workflow:
    def listed(key: str) -> list[Any]:
        value = data.get(key) if isinstance(data, Mapping) else None
        return list(value) if isinstance(value, list) else []

    ids, subtasks, access = listed(_MODEL), listed(_SUBTASKS), listed(_ACCESS)
    steps: list[Step] = []
    for i, raw in enumerate(ids):
        entry = access[i] if i < len(access) and isinstance(access[i], list) else []
        seen: Access = (
            ALL if ALL in entry else tuple(j for j in entry if isinstance(j, int) and j >= 0)
        )
        worker = int(raw) if isinstance(raw, int) else -1
        subtask = str(subtasks[i]) if i < len(subtasks) else ""
        steps.append(Step(worker, subtask, seen))
    return Workflow(tuple(steps))
