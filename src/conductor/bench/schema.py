"""What a benchmark file may say: graders, answer formats, and the loaders with what
each reads (see :mod:`conductor.bench.spec` for the file itself).

Loaders, the ``fields`` keys they read (with their defaults) and the placeholders
their prompts may use:

* ``choice`` (multiple choice; default when ``grader: choice``).  Either a list column
  ``choices`` plus ``answer`` (an index or a letter), or one column per option:
  ``correct`` plus ``incorrect_1`` .. ``incorrect_N``.  Also ``question``, ``id`` and
  ``subject`` (optional).  Choices are shuffled per sample and seed.  Placeholders:
  ``question``, ``choices``, ``choices_text``.  Filters: ``subjects`` (a list).
* ``math`` (default when ``grader: math`` or ``grader: short``): ``question``,
  ``answer`` (or, without it, ``solution``: the answer is the solution's last
  ``\\boxed{}``, and rows without one are left out), ``id``, ``metadata``
  (comma-separated columns copied into the sample's metadata).  Placeholders:
  ``question``.  Filters: ``subjects``, ``levels`` (lists; need ``subject`` /
  ``level`` fields), ``max_answer_chars`` (drop longer answers, counted as the
  dataset stores them, spaces included).
* ``livecodebench``: ``release`` (``release_v1`` .. ``release_v6``, ``release_latest``,
  or ``v1`` .. ``v6`` for one release file), and columns ``question``
  (question_content), ``title``, ``id`` (question_id), ``starter_code``, ``date``
  (contest_date), ``public_tests``, ``private_tests``, ``metadata``, ``difficulty``,
  ``platform``.  Placeholders: ``question``, ``title``, ``starter_code``,
  ``starter_code_block``.  Filters: ``contest_date_from`` / ``contest_date_to``
  (inclusive, YYYY-MM-DD), ``difficulties``, ``platforms``.
* ``bigcodebench``: ``question`` (``complete_prompt`` or ``instruct_prompt``), ``id``,
  ``test``, ``entry_point``, ``code_prompt``, ``libs``.  Placeholders: ``question``,
  ``code_prompt``.

:class:`LoaderSections` reads the parts of a benchmark file whose contents depend on
its loader (``fields``, ``filters``, ``prompt``).
"""

from __future__ import annotations

import re
import string
from typing import Any

import yaml

from ..benchmark import (
    DEFAULT_LOADER,
    INCORRECT_RE,
    LOADER_FIELDS,
    LOADER_FILTERS,
    LOADER_INPUTS,
    LOADERS,
    lcb_release_files,
)
from ..bounds import LENGTH
from ..configfile import ConfigReader, did_you_mean, node_line, show_value
from ..errors import BenchmarkFileError

__all__ = ["LoaderSections", "template_placeholders"]

_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


class LoaderSections(ConfigReader):
    """The line-aware reader of the loader-dependent sections of a benchmark file.

    Benchmark prompts use ``${name}`` for the sample's fields, so ``${...}`` must reach
    the template untouched rather than be read as an environment variable.
    """

    error_class = BenchmarkFileError
    expands_variables = False
    what = "benchmark file"

    def fields(
        self,
        node: yaml.Node | None,
        loader: str,
        loader_node: yaml.Node | None,
        *,
        base: dict[str, str] | None = None,
        prefix: str = "fields",
    ) -> dict[str, str]:
        """The loader's fields: its defaults (or ``base``) with ``node``'s entries applied."""
        allowed = tuple(LOADER_FIELDS[loader])
        if base is not None:
            out = dict(base)
        else:
            out = {k: v for k, v in LOADER_FIELDS[loader].items() if v is not None}
        out["loader"] = loader
        if node is None:
            return out
        if not isinstance(node, yaml.MappingNode):
            raise self.error(
                f"{prefix} must be a mapping of names to dataset columns, "
                f"got {show_value(self.value(node, prefix))}",
                node,
                prefix,
            )
        for key, key_node, value_node in self.items(node, prefix):
            sub = f"{prefix}.{key}"
            if key == "loader":
                if base is not None:
                    raise self.error(
                        f"{sub}: a train_source is read by the benchmark's own loader "
                        f"({loader}); remove this key",
                        key_node,
                        sub,
                    )
                continue
            if key not in allowed and not (loader == "choice" and INCORRECT_RE.match(key)):
                hint = did_you_mean(key, allowed) or (
                    f"; the {loader} loader reads: {', '.join(allowed)}"
                )
                raise self.error(f'{prefix}: unknown key "{key}"{hint}', key_node, sub)
            value = self.value(value_node, sub)
            if value is None:
                out.pop(key, None)
                continue
            if not isinstance(value, str) or not value.strip():
                raise self.error(
                    f"{sub} must be a column name (text), got {show_value(value)}", value_node, sub
                )
            out[key] = value
        if loader == "choice":
            self._check_choice_fields(out, node)
        if loader == "math" and "answer" not in out and "solution" not in out:
            raise self.error(
                f"{prefix} must name the answer: answer (a column holding it) or solution "
                "(a worked solution ending in \\boxed{...})",
                node,
                f"{prefix}.answer",
            )
        if loader == "livecodebench":
            release = out["release"]
            if lcb_release_files(release) is None:
                where = dict((k, kn) for k, kn, _v in self.items(node, prefix))
                raise self.error(
                    f"{prefix}.release must be release_v1 .. release_v6, release_latest or "
                    f"v1 .. v6; got {show_value(release)}",
                    where.get("release", node),
                    f"{prefix}.release",
                )
        return out

    def _check_choice_fields(self, out: dict[str, str], node: yaml.Node) -> None:
        has_list = "choices" in out or "answer" in out
        has_cols = "correct" in out or any(INCORRECT_RE.match(k) for k in out)
        if has_list and has_cols:
            raise self.error(
                "fields: give either choices + answer (a list column and its answer) or "
                "correct + incorrect_1 .. incorrect_N (one column per option), not both",
                node,
                "fields",
            )
        if has_list and not ("choices" in out and "answer" in out):
            missing = "answer" if "choices" in out else "choices"
            raise self.error(f"fields needs {missing} too", node, f"fields.{missing}")
        if has_cols and not ("correct" in out and any(INCORRECT_RE.match(k) for k in out)):
            raise self.error(
                "fields needs correct and at least one incorrect_N column",
                node,
                "fields.correct",
            )
        if not has_list and not has_cols:
            raise self.error(
                "fields must say where the options are: choices + answer, or "
                "correct + incorrect_1 .. incorrect_N",
                node,
                "fields",
            )

    def filters(self, node: yaml.Node, loader: str, prefix: str = "filters") -> dict[str, Any]:
        allowed = LOADER_FILTERS[loader]
        keys = self.mapping(node, prefix, allowed) if allowed else None
        if keys is None:
            if isinstance(node, yaml.MappingNode) and node.value:
                first = node.value[0][0]
                raise self.error(f"{prefix}: the {loader} loader takes no filters", first, prefix)
            if not isinstance(node, yaml.MappingNode) and self.value(node, prefix) is not None:
                raise self.error(f"{prefix} must be a mapping", node, prefix)
            return {}
        out: dict[str, Any] = {}
        for key, (_kn, vn) in keys.items():
            sub = f"{prefix}.{key}"
            if key == "max_answer_chars":
                limit = self.integer(vn, sub, LENGTH)
                if limit is not None:
                    out[key] = limit
            elif key in ("contest_date_from", "contest_date_to"):
                value = self.value(vn, sub)
                if value is None:
                    continue
                if not isinstance(value, str) or not _DATE_RE.match(value):
                    raise self.error(
                        f"{sub} must be a date written YYYY-MM-DD, got {show_value(value)}", vn, sub
                    )
                out[key] = value
            else:
                if not isinstance(vn, yaml.SequenceNode):
                    raise self.error(
                        f"{sub} must be a list, got {show_value(self.value(vn, sub))}", vn, sub
                    )
                items = [self.plain(item, f"{sub}[{i}]") for i, item in enumerate(vn.value)]
                for i, item in enumerate(items):
                    if not isinstance(item, (str, int)) or isinstance(item, bool):
                        raise self.error(
                            f"{sub}[{i}] must be text or a number, got {show_value(item)}",
                            vn.value[i],
                            sub,
                        )
                out[key] = items
        lo, hi = out.get("contest_date_from"), out.get("contest_date_to")
        if lo and hi and lo > hi:
            raise self.error(
                f"{prefix}: contest_date_from ({lo}) is after contest_date_to ({hi})",
                node,
                prefix,
            )
        return out

    def prompt(self, node: yaml.Node, loader: str) -> str:
        text = self.required_string(node, "prompt")
        allowed = LOADER_INPUTS[loader]
        for name, pos in _template_names(text):
            line = node_line(node) + text[:pos].count("\n")
            if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
                line += 1  # block scalars start on the line after the indicator
            if name is None:
                raise self.error(
                    "prompt has a lone $ that is not a placeholder; write $$ for a literal "
                    "dollar sign, or ${name} for a field",
                    _AtLine(line),
                    "prompt",
                )
            if name not in allowed:
                raise self.error(
                    f"prompt uses ${{{name}}}, which the {loader} loader does not give"
                    f"{did_you_mean(name, allowed)}; "
                    f"it gives: {', '.join(allowed)}",
                    _AtLine(line),
                    "prompt",
                )
        return text

    def _check_filter_fields(
        self, filters: dict[str, Any], fields: dict[str, str], node: yaml.Node | None, prefix: str
    ) -> None:
        needs = {"subjects": "subject", "levels": "level"}
        for key, col in needs.items():
            if key in filters and col not in fields:
                raise self.error(
                    f"{prefix}.{key} needs fields.{col} (the dataset column holding it)",
                    node,
                    f"{prefix}.{key}",
                )

    def _loader(self, node: yaml.Node | None, grader: str) -> tuple[str, yaml.Node | None]:
        if isinstance(node, yaml.MappingNode):
            for key, _kn, vn in self.items(node, "fields"):
                if key == "loader":
                    value = self.choice(vn, "fields.loader", LOADERS)
                    if value is not None:
                        return value, vn
        if grader in DEFAULT_LOADER:
            return DEFAULT_LOADER[grader], None
        raise self.error(
            "fields.loader must say which loader reads a code benchmark: "
            "livecodebench or bigcodebench",
            node,
            "fields.loader",
        )


class _AtLine(yaml.Node):  # type: ignore[misc, unused-ignore]
    """A stand-in node that carries only a line number, for errors inside a text block."""

    def __init__(self, line: int) -> None:
        mark = yaml.Mark("", 0, line - 1, 0, None, 0)
        super().__init__("", "", mark, mark)


def _template_names(text: str) -> list[tuple[str | None, int]]:
    """(placeholder name or None for an invalid ``$``, offset) for each ``$`` use."""
    out: list[tuple[str | None, int]] = []
    for match in string.Template.pattern.finditer(text):
        if match.group("escaped") is not None:
            continue
        name = match.group("named") or match.group("braced")
        out.append((name, match.start()))
    return out


def template_placeholders(template: str) -> list[str]:
    """The distinct ``${name}`` / ``$name`` placeholders of a prompt template, in order."""
    seen: list[str] = []
    for name, _pos in _template_names(template):
        if name is not None and name not in seen:
            seen.append(name)
    return seen
