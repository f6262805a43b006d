"""The Conductor's prompt: a template filled with the pool listing and the question.

A template comes in one of two forms:

- **text** (a ``.txt`` file): one user message.  Placeholders (``string.Template``):
  ``${workers}``, ``${workers_by_id}``, ``${question}``, ``${max_steps}`` and
  ``${subtasks}`` (the instructions a Conductor with ``subtasks:`` chooses from, one
  quoted per line; empty otherwise).  A recursive round appends the
  revision text (``revise.txt``, with ``${previous_workflow}`` and ``${previous_answer}``)
  to that same message.
- **chat** (a ``.yaml`` / ``.yml`` file, or a checkpoint's inline template): a
  conversation, the shape a trained checkpoint may need::

      system: ...        # optional
      user: ...          # required; must use ${question}
      prefill: ...       # optional: the assistant's reply begins with this text
      revise:            # optional: the recursion round, continuing the conversation
        user: ...        #   required in `revise`; also ${previous_workflow}, ${previous_answer}
        prefill: ...     #   optional

  A revision round is the round-1 conversation continued: the round-1 reply (prefill
  included) as an assistant turn, then ``revise.user`` (the built-in revision text when
  the template has no ``revise``), then ``revise.prefill``.  A reply that begins with a
  prefill is sent as a final assistant message that the model continues (see
  :mod:`conductor.llm.prefill`), and the workflow parser reads the prefill and the
  continuation together.

The pool is listed in one of two forms, one line per worker, by ordinal (names stay
hidden; a worker's ``description`` follows a colon only when the Conductor has
``show_descriptions``):

- ``${workers}``: ``- Model 0``, ``- Model 1``, ... (the built-in templates' form);
- ``${workers_by_id}``: ``Model id 0``, ``Model id 1``, ... with no bullet, the form the
  paper's authors list their pool in (``Model id 0: <description>`` with descriptions).

A built-in template is named by its file stem (``default``); anything else is read as a
path, because a trained checkpoint needs exactly the template it was trained with.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, NoReturn

import yaml

from ..configfile import ConfigReader, compose_yaml, node_line, read_config_file
from ..errors import TemplateFileError, UsageError
from ..llm.prefill import continuation, prefill_message
from ..llm.prefill_rules import ends_with_prefill, prefill_of
from ..llm.types import Message
from ..shipped import resolve_shipped, shipped_names
from ..targets import Worker

__all__ = [
    "CHAT_KEYS",
    "PLACEHOLDERS",
    "REASK_REASON_CHARS",
    "REASK_REPLY_CHARS",
    "REVISE_KEYS",
    "REVISE_PLACEHOLDERS",
    "WORKER_LIST_FORMS",
    "ChatTemplate",
    "ConductorTemplate",
    "PreviousRound",
    "build_conductor_messages",
    "build_reask_messages",
    "builtin_templates",
    "check_cost_weight",
    "chat_template_from_dict",
    "describe_workers",
    "load_conductor_template",
    "load_template",
    "conductor_prefill",
    "cost_weight_line",
    "fit_prefill",
]

#: File suffixes read as chat templates; everything else is a text template.
CHAT_SUFFIXES = (".yaml", ".yml")
#: The keys of a chat template, and of its ``revise`` section.
CHAT_KEYS = ("system", "user", "prefill", "revise")
REVISE_KEYS = ("user", "prefill")
#: The placeholders of a first round, and those a revision round adds.
PLACEHOLDERS = ("workers", "workers_by_id", "question", "max_steps", "subtasks")
#: The pool listing's forms: the line prefix of worker ``i`` under each placeholder.
WORKER_LIST_FORMS: dict[str, str] = {"workers": "- Model {i}", "workers_by_id": "Model id {i}"}
REVISE_PLACEHOLDERS = (*PLACEHOLDERS, "previous_workflow", "previous_answer")


@dataclass(frozen=True)
class ChatTemplate:
    """A template in chat form (see the module docstring); empty parts are ``None``."""

    user: str
    system: str | None = None
    prefill: str | None = None
    revise_user: str | None = None
    revise_prefill: str | None = None

    @property
    def has_prefill(self) -> bool:
        """Whether either round begins the Conductor's reply with a prefill."""
        return bool(self.prefill or self.revise_prefill)

    def to_dict(self) -> dict[str, Any]:
        """The file / ``conductor.json`` form, without unset parts."""
        out: dict[str, Any] = {}
        if self.system is not None:
            out["system"] = self.system
        out["user"] = self.user
        if self.prefill is not None:
            out["prefill"] = self.prefill
        revise: dict[str, str] = {}
        if self.revise_user is not None:
            revise["user"] = self.revise_user
        if self.revise_prefill is not None:
            revise["prefill"] = self.revise_prefill
        if revise:
            out["revise"] = revise
        return out


@dataclass(frozen=True)
class ConductorTemplate:
    """A loaded template: its name as given, its file's text (hashed into records) and,
    for the chat form, its parts."""

    name: str
    text: str
    chat: ChatTemplate | None = None

    @property
    def form(self) -> Literal["text", "chat"]:
        return "text" if self.chat is None else "chat"


def builtin_templates() -> list[str]:
    """Names of the templates shipped with conductor."""
    return shipped_names("template")


@lru_cache(maxsize=32)
def load_template(name_or_path: str) -> str:
    """The text of a built-in template (by name) or of a template file (by path)."""
    # Either form is read alike: a regular file, bounded, UTF-8 (a bad byte is named
    # by its line).
    return read_config_file(
        resolve_shipped("template", name_or_path), "template file", TemplateFileError
    )


@lru_cache(maxsize=32)
def load_conductor_template(name_or_path: str) -> ConductorTemplate:
    """The template ``name_or_path``, parsed: a chat template is checked in full here
    (keys, strings, placeholders), and a mistake raises :class:`TemplateFileError`
    naming the file and line."""
    path = resolve_shipped("template", name_or_path)
    text = load_template(name_or_path)
    if path.suffix not in CHAT_SUFFIXES:
        # Checked here, not when it is first filled, so that a mistake names its line.
        problem = _placeholder_problem(text, PLACEHOLDERS)
        if problem is not None:
            line = text.count("\n", 0, problem[1]) + 1
            raise TemplateFileError(problem[0], path=str(path), line=line)
        return ConductorTemplate(name_or_path, text)
    return ConductorTemplate(name_or_path, text, _read_chat_yaml(text, str(path)))


# ------------------------------------------------------------------ chat templates


def _placeholder_problem(text: str, allowed: tuple[str, ...]) -> tuple[str, int] | None:
    """What is wrong with the ``${...}`` placeholders of ``text`` and where (a character
    offset), or ``None``."""
    pattern = string.Template.pattern
    for match in pattern.finditer(text):
        named = match.group("named") or match.group("braced")
        if match.group("invalid") is not None:
            return (
                "has a '$' that starts no placeholder (write $$ for a literal dollar sign)",
                match.start(),
            )
        if named is not None and named not in allowed:
            names = ", ".join(f"${{{n}}}" for n in allowed)
            return (f"uses an unknown placeholder ${{{named}}} (known: {names})", match.start())
    return None


def chat_template_from_dict(
    data: Any, fail: Callable[[str, str, int | None], NoReturn]
) -> ChatTemplate:
    """A :class:`ChatTemplate` from its plain form (a YAML file's or ``conductor.json``'s).

    ``fail(field, message, offset)`` raises the caller's error for ``field`` (``user``,
    ``revise.prefill``, ...; ``""`` for the whole template), ``offset`` being where in the
    field's text the problem is, when known.
    """
    if not isinstance(data, Mapping):
        fail("", "a chat template must be a mapping with at least `user`", None)

    def check_keys(mapping: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in mapping:
            if key not in allowed:
                field = f"{where}.{key}" if where else str(key)
                fail(field, f"unknown key {key!r} (allowed: {', '.join(allowed)})", None)

    def text(
        mapping: Mapping[str, Any], key: str, where: str, allowed: tuple[str, ...]
    ) -> str | None:
        field = f"{where}.{key}" if where else key
        value = mapping.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            fail(field, f"must be text, got {type(value).__name__}", None)
        if not value.strip():
            return None
        problem = _placeholder_problem(value, allowed)
        if problem is not None:
            fail(field, problem[0], problem[1])
        return value

    check_keys(data, CHAT_KEYS, "")
    user = text(data, "user", "", PLACEHOLDERS)
    if user is None:
        fail("user" if "user" in data else "", "a chat template needs a non-empty `user`", None)
    system = text(data, "system", "", PLACEHOLDERS)
    if "${question}" not in user and "${question}" not in (system or ""):
        fail("user", "never shows the question: use ${question} in `user`", None)
    revise = data.get("revise")
    revise_user = revise_prefill = None
    if revise is not None:
        if not isinstance(revise, Mapping):
            fail("revise", "must be a mapping with `user` (and optionally `prefill`)", None)
        check_keys(revise, REVISE_KEYS, "revise")
        revise_user = text(revise, "user", "revise", REVISE_PLACEHOLDERS)
        if revise_user is None:
            fail("revise", "`revise` needs a non-empty `user`", None)
        revise_prefill = text(revise, "prefill", "revise", REVISE_PLACEHOLDERS)
    return ChatTemplate(
        user=user,
        system=system,
        prefill=text(data, "prefill", "", PLACEHOLDERS),
        revise_user=revise_user,
        revise_prefill=revise_prefill,
    )


class _TemplateReader(ConfigReader):
    """The line-aware reader, minus environment expansion: templates use ``${name}``
    for their own placeholders."""

    error_class = TemplateFileError
    expands_variables = False
    what = "template file"


def _read_chat_yaml(text: str, source: str) -> ChatTemplate:
    root = compose_yaml(text, source, TemplateFileError)
    reader = _TemplateReader(source, {})
    try:
        if root is None:
            raise reader.error("the template file is empty; it needs at least `user`", None, None)
        if not isinstance(root, yaml.MappingNode):
            raise reader.error("the top level must be a mapping with at least `user`", root, None)
        data = reader.plain(root, "")
        nodes: dict[str, yaml.Node] = {}
        for key, _kn, value in reader.items(root, ""):
            nodes[key] = value
            if key == "revise" and isinstance(value, yaml.MappingNode):
                for sub, _skn, sub_value in reader.items(value, "revise"):
                    nodes[f"revise.{sub}"] = sub_value
    finally:
        reader.close()

    def fail(field: str, message: str, offset: int | None) -> NoReturn:
        node = nodes.get(field) or nodes.get(field.split(".")[0]) or root
        line = node_line(node)
        if offset is not None and isinstance(node, yaml.ScalarNode) and node.style == "|":
            # A literal block's text starts on the line after its `|`, line for line.
            line += 1 + str(node.value)[:offset].count("\n")
        raise TemplateFileError(
            f"{field}: {message}" if field else message, path=source, line=line, field=field
        )

    return chat_template_from_dict(data, fail)


# ------------------------------------------------------------------ messages


def describe_workers(
    workers: Sequence[Worker], *, show_descriptions: bool = False, form: str = "workers"
) -> str:
    """The pool as the Conductor sees it: ordinals only, names hidden, one line per
    worker in ``form`` (a key of :data:`WORKER_LIST_FORMS`: the placeholder it fills).

    Descriptions are shown only when enabled, because a trained Conductor learns each
    worker's skills from reward, not from what a pool author says about it.
    """
    prefix = WORKER_LIST_FORMS[form]
    lines = []
    for i, w in enumerate(workers):
        line = prefix.format(i=i)
        if show_descriptions and w.description:
            line += f": {w.description.strip()}"
        lines.append(line)
    return "\n".join(lines)


@dataclass(frozen=True)
class PreviousRound:
    """What a recursive round is shown of the round before it.

    ``reply`` is the Conductor's whole round-1 reply (its prefill included): a chat
    template's revision round keeps it as the assistant turn.  Without it, the
    workflow's canonical lists stand in for it.
    """

    workflow_text: str
    final_answer: str
    reply: str | None = None


def check_cost_weight(weight: float, what: str = "--cost-weight") -> float:
    """``weight`` as a float, or :class:`UsageError` naming ``what`` when it is not a
    finite number >= 0 (a negative weight would pay the Conductor for spending)."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise UsageError(f"{what} must be a number, got {weight!r}")
    value = float(weight)
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what} must be a finite number >= 0 (per US dollar), got {weight!r}")
    return value


def cost_weight_line(weight: float) -> str:
    """The sentence that tells a cost-conditioned Conductor its cost weight.

    The one owner of this wording: training rows (:func:`conductor.train.dataset.
    build_rows`) and every prompt at inference (:func:`build_conductor_messages` with
    ``cost_weight``) get exactly this line, so a checkpoint trained on it reads the
    same words when ``--cost-weight`` picks a point on its accuracy-cost front.  The
    number is written with ``:g`` (``150``, not ``150.0``) so that equal weights give
    equal tokens whichever type they arrived as.
    """
    w = f"{check_cost_weight(weight, 'the cost weight'):g}"
    return (
        f"Cost weight: {w} per US dollar. A correct answer scores 1, and every US dollar "
        f"the workers' calls cost subtracts {w} from the score."
    )


def _with_cost_line(content: str, cost_weight: float | None) -> str:
    """The first round's user message with the cost line after it (none without)."""
    if cost_weight is None:
        return content
    body = content.rstrip()
    # The template's own trailing whitespace stays last (a revision round follows it).
    return f"{body}\n\n{cost_weight_line(cost_weight)}{content[len(body) :]}"


def _fill(text: str, values: Mapping[str, str], name: str) -> str:
    try:
        return string.Template(text).substitute(values)
    except (KeyError, ValueError) as exc:
        raise UsageError(f"template {name!r} has a bad placeholder: {exc}") from None


def build_conductor_messages(
    question: str,
    workers: Sequence[Worker],
    *,
    max_steps: int = 5,
    template: str = "default",
    show_descriptions: bool = False,
    previous: PreviousRound | None = None,
    subtasks: Sequence[str] = (),
    cost_weight: float | None = None,
) -> list[Message]:
    """The messages that ask the Conductor for a workflow.

    A text template gives one user message; a chat template gives its conversation,
    ending in an assistant message (the prefill) when the round has one.  With
    ``cost_weight`` (a cost-conditioned Conductor), :func:`cost_weight_line` closes the
    first round's user message; without it the messages are exactly those of a
    Conductor that never heard of cost weights.
    """
    values = {
        form: describe_workers(workers, show_descriptions=show_descriptions, form=form)
        for form in WORKER_LIST_FORMS
    }
    values |= {
        "question": question.strip(),
        "max_steps": str(max_steps),
        "subtasks": "\n".join(f'- "{choice}"' for choice in subtasks),
    }
    loaded = load_conductor_template(template)
    chat = loaded.chat
    if chat is None:
        text = _with_cost_line(_fill(loaded.text, values, template), cost_weight)
        if previous is not None:
            text += string.Template(load_template("revise")).safe_substitute(
                previous_workflow=previous.workflow_text,
                previous_answer=previous.final_answer,
                max_steps=str(max_steps),
            )
        return [{"role": "user", "content": text}]

    messages: list[Message] = []
    if chat.system is not None:
        messages.append({"role": "system", "content": _fill(chat.system, values, template)})
    user = _with_cost_line(_fill(chat.user, values, template), cost_weight)
    messages.append({"role": "user", "content": user})
    if previous is None:
        if chat.prefill is not None:
            messages.append({"role": "assistant", "content": _fill(chat.prefill, values, template)})
        return messages
    revise_values = {
        **values,
        "previous_workflow": previous.workflow_text,
        "previous_answer": previous.final_answer,
    }
    revise_user = chat.revise_user
    if revise_user is None:
        revise_user = load_template("revise").strip()
    messages.append({"role": "assistant", "content": previous.reply or previous.workflow_text})
    messages.append({"role": "user", "content": _fill(revise_user, revise_values, template)})
    if chat.revise_prefill is not None:
        messages.append(
            {"role": "assistant", "content": _fill(chat.revise_prefill, revise_values, template)}
        )
    return messages


def conductor_prefill(messages: Sequence[Message]) -> str | None:
    """The prefill the Conductor's reply to ``messages`` begins with, or ``None``."""
    return prefill_of(messages) if ends_with_prefill(messages) else None


def fit_prefill(messages: list[Message], target: Worker) -> list[Message]:
    """``messages`` with their prefill as ``target`` is sent it (Anthropic refuses one
    ending in whitespace, so that is dropped), so that the record shows what was sent
    and prefill + continuation is the reply as the model wrote it."""
    if not ends_with_prefill(messages) or continuation(target) != "anthropic":
        return messages
    fitted = prefill_message(target, prefill_of(messages))
    return [*messages[:-1], *([fitted] if fitted is not None else [])]


#: How much of a Conductor reply that did not parse is quoted back when re-asking: its
#: end, where the lists belong.  A huge or hostile reply is not resent whole with every
#: try (the parser itself reads only the last ``MAX_REPLY_CHARS``).
REASK_REPLY_CHARS = 4_000
#: How much of the parse error is quoted (a reason may quote a bad value).
REASK_REASON_CHARS = 500


def _tail(text: str, limit: int, unit: str) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit:,} earlier {unit} left out ...]\n{text[-limit:]}"


def build_reask_messages(messages: Sequence[Message], reply: str, reason: str) -> list[Message]:
    """``messages`` followed by the reply that did not parse (its end only) and a request
    to write the plan again, naming ``reason``.

    ``reply`` is what the model wrote after the prefill ``messages`` end with, if any:
    the conversation then keeps the whole reply as the assistant's turn and ends with
    the same prefill again, so the model answers the re-ask in its trained shape.
    """
    if len(reason) > REASK_REASON_CHARS:
        reason = reason[:REASK_REASON_CHARS] + " ..."
    prefill = conductor_prefill(messages)
    earlier = list(messages[:-1]) if prefill is not None else list(messages)
    out: list[Message] = [
        *earlier,
        {
            "role": "assistant",
            "content": _tail((prefill or "") + reply, REASK_REPLY_CHARS, "characters"),
        },
        {
            "role": "user",
            "content": (
                f"That reply could not be used: {reason}. Write your plan "
                "again and end it with the three lists model_id, subtasks and "
                "access_list, of equal length, as described above."
            ),
        },
    ]
    if prefill is not None:
        out.append({"role": "assistant", "content": prefill})
    return out
