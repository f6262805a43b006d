"""Benchmark files (``benchmarks/*.yaml``): schema, loading and validation.

A benchmark is a YAML file, not Python.  Schema (every key but ``source``, ``prompt``
and ``grader`` is optional)::

    name: gpqa-diamond              # default: the file's stem; used to prefix sample ids
    description: one line for humans
    paper_key: GPQA-D               # the column name in the paper's result tables
    source:                         # exactly one of hf / url / file:
      hf: Idavidrein/gpqa           #   a Hugging Face dataset ...
      revision: 56686c06...         #   ... at a pinned commit (``main`` = not pinned yet)
      config: gpqa_diamond          #   optional dataset config (subset)
      split: train                  #   default: test
      # url: https://.../data.jsonl #   or a file on the web (.jsonl/.json/.csv/.parquet)
      # file: data/mine.jsonl       #   or a local file, relative to this YAML file
      # row: train                  #   optional: each row is nested under this column
    train_source:                   # optional: held-out questions for `conductor train`
      hf: ...                       #   same keys as source, plus:
      fields: {answer: null, solution: solution}   # overrides of `fields` below
      filters: {...}                #   its own filters (the evaluation filters never apply)
      balance: [subject, level]     #   groups a training sample is spread evenly over
    fields:                         # dataset column names, plus loader-specific keys
      loader: choice                # choice | math | livecodebench | bigcodebench
      question: Question            # a column, or a path into nested values:
      ...                           # reward_model.ground_truth, prompt[role=user].content

A benchmark with a ``train_source`` and no ``source`` is for training only (RLPR):
``conductor bench`` then needs ``--data FILE``.  For LiveCodeBench, a train_source must
end (``filters.contest_date_to``) before the evaluation window starts.
    prompt: |                       # string.Template text over the sample's input:
      ${question}                   # ${name} or $name; write $$ for a literal dollar
      ${choices_text}
    answer_format: letter           # letter | math | code | short
    grader: choice                  # choice | math | code | short
    grader_options: {}              # passed to the grader as they are
    epochs: 1                       # default number of repeats of each sample
    filters: {...}                  # loader-specific, see below

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
  ``level`` fields), ``max_answer_chars`` (drop longer answers).
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

Every mistake raises :class:`BenchmarkFileError` (a :class:`~conductor.errors.UsageError`)
whose message starts ``FILE:LINE:`` and names the field.

:func:`data_columns` says which columns a data file (``--data FILE``) needs for a spec;
``python -m conductor.bench.spec --readme-table`` prints the README's table of them.
"""

from __future__ import annotations

import argparse
import difflib
import re
import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import PoolError
from ..pool import _line, _Reader, _show, compose_yaml, read_config_file
from .types import BenchmarkSpec, DataSource

__all__ = [
    "ANSWER_FORMATS",
    "GRADERS",
    "LOADERS",
    "LOADER_FIELDS",
    "LOADER_FILTERS",
    "LOADER_INPUTS",
    "LCB_RELEASE_FILES",
    "BALANCE_FIELDS",
    "BenchmarkFileError",
    "DATA_FORMATS",
    "DataColumns",
    "builtin_benchmarks_dir",
    "data_columns",
    "data_columns_table",
    "is_pinned",
    "lcb_release_files",
    "list_benchmarks",
    "load_benchmark",
    "load_benchmark_text",
    "loader_of",
    "resolve_benchmark_path",
    "template_placeholders",
    "training_spec",
]

ANSWER_FORMATS: tuple[str, ...] = ("letter", "math", "code", "short")
GRADERS: tuple[str, ...] = ("choice", "math", "code", "short")
LOADERS: tuple[str, ...] = ("choice", "math", "livecodebench", "bigcodebench")

#: The ``fields`` keys each loader reads, with the column each defaults to (None: unset).
LOADER_FIELDS: dict[str, dict[str, str | None]] = {
    "choice": {
        "question": "question",
        "id": None,
        "subject": None,
        "choices": None,
        "answer": None,
        "correct": None,
        # incorrect_1 .. incorrect_N are accepted too (see _INCORRECT_RE).
    },
    "math": {
        "question": "problem",
        "answer": "answer",
        "id": None,
        "subject": None,
        "level": None,
        "metadata": None,
        # A worked solution whose last \\boxed{} is the answer (MATH's train split has
        # no answer column); used when ``answer`` is unset.
        "solution": None,
    },
    "livecodebench": {
        "release": "release_v6",
        "question": "question_content",
        "title": "question_title",
        "id": "question_id",
        "starter_code": "starter_code",
        "date": "contest_date",
        "public_tests": "public_test_cases",
        "private_tests": "private_test_cases",
        "metadata": "metadata",
        "difficulty": "difficulty",
        "platform": "platform",
        "contest_id": "contest_id",
    },
    "bigcodebench": {
        "question": "complete_prompt",
        "id": "task_id",
        "test": "test",
        "entry_point": "entry_point",
        "code_prompt": "code_prompt",
        "libs": "libs",
    },
}

#: The sample-input keys a prompt template may name, per loader.
LOADER_INPUTS: dict[str, tuple[str, ...]] = {
    "choice": ("question", "choices", "choices_text"),
    "math": ("question",),
    "livecodebench": ("question", "title", "starter_code", "starter_code_block"),
    "bigcodebench": ("question", "code_prompt"),
}

#: The filters each loader understands.
LOADER_FILTERS: dict[str, tuple[str, ...]] = {
    "choice": ("subjects",),
    "math": ("subjects", "levels", "max_answer_chars"),
    "livecodebench": ("contest_date_from", "contest_date_to", "difficulties", "platforms"),
    "bigcodebench": (),
}

#: LiveCodeBench publishes one JSONL file per release; ``release_vN`` is all of the
#: files up to N (that is how the dataset's own ``version_tag`` works), ``vN`` only N's.
LCB_RELEASE_FILES: tuple[str, ...] = (
    "test.jsonl",
    "test2.jsonl",
    "test3.jsonl",
    "test4.jsonl",
    "test5.jsonl",
    "test6.jsonl",
)

_TOP_KEYS = (
    "name",
    "description",
    "paper_key",
    "source",
    "train_source",
    "fields",
    "prompt",
    "answer_format",
    "grader",
    "grader_options",
    "epochs",
    "filters",
)
_SOURCE_KEYS = ("hf", "revision", "config", "split", "url", "file", "row")
#: A train_source may also re-map fields, filter its own rows and name what to balance.
_TRAIN_SOURCE_KEYS = (*_SOURCE_KEYS, "fields", "filters", "balance")
#: The fields a training sample may be balanced over (their values form the groups).
BALANCE_FIELDS: tuple[str, ...] = ("subject", "level", "difficulty", "platform")
_DEFAULT_LOADER = {"choice": "choice", "math": "math", "short": "math"}
_INCORRECT_RE = re.compile(r"incorrect_[1-9][0-9]?\Z")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
_SHA_RE = re.compile(r"[0-9a-f]{40}\Z")
#: The data files a ``file:`` / ``url:`` source or ``--data FILE`` may name.
DATA_FORMATS: tuple[str, ...] = (".jsonl", ".json", ".csv", ".parquet")
_DATA_SUFFIXES = DATA_FORMATS


class BenchmarkFileError(PoolError):
    """A benchmark file is invalid.  Formatted like a pool error: ``FILE:LINE: msg``."""


class _BenchReader(_Reader):
    """The pool loader's line-aware YAML walker, minus environment expansion.

    Benchmark prompts use ``${name}`` for the sample's fields, so ``${...}`` must reach
    the template untouched rather than be read as an environment variable.
    """

    def scalar(self, node: yaml.ScalarNode, field: str) -> Any:
        return self.construct(node, field)

    error_class = BenchmarkFileError

    # ---------------------------------------------------------------- benchmark parts

    def data_source(
        self, node: yaml.Node, field: str, base: Path | None, *, train: bool = False
    ) -> DataSource:
        allowed = _TRAIN_SOURCE_KEYS if train else _SOURCE_KEYS
        keys = self.mapping(node, field, allowed, "a mapping with hf, url or file")
        get = {k: vn for k, (_kn, vn) in keys.items()}
        row = self.string(get["row"], f"{field}.row") if "row" in get else None
        given = [k for k in ("hf", "url", "file") if k in get]
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise self.error(
                f"{field} needs exactly one of hf, url or file (got {what})", node, field
            )
        kind = given[0]
        split = "test"
        if "split" in get:
            split = self.required_string(get["split"], f"{field}.split").strip()
        config = self.string(get["config"], f"{field}.config") if "config" in get else None
        if kind == "hf":
            dataset_id = self.required_string(get["hf"], f"{field}.hf").strip()
            if dataset_id.count("/") != 1 or any(c.isspace() for c in dataset_id):
                raise self.error(
                    f'{field}.hf must be a Hugging Face dataset id like "org/name", '
                    f"got {_show(dataset_id)}",
                    get["hf"],
                    f"{field}.hf",
                )
            if "revision" not in get:
                raise self.error(
                    f"{field} needs a revision: a commit SHA of {dataset_id} "
                    "(or main, which is not reproducible)",
                    node,
                    f"{field}.revision",
                )
            revision = self._revision(get["revision"], f"{field}.revision")
            return DataSource(
                kind="hf", id=dataset_id, revision=revision, config=config, split=split, row=row
            )
        for extra in ("revision",):
            if extra in get:
                raise self.error(
                    f"{field}.{extra} only applies to an hf source", keys[extra][0], field
                )
        if kind == "url":
            url = self.required_string(get["url"], f"{field}.url").strip()
            if not re.match(r"(https?|file)://", url):
                raise self.error(
                    f"{field}.url must start with http://, https:// or file://, got {_show(url)}",
                    get["url"],
                    f"{field}.url",
                )
            self._suffix(url.split("?", 1)[0], get["url"], f"{field}.url")
            return DataSource(kind="url", url=url, config=config, split=split, row=row)
        raw = self.required_string(get["file"], f"{field}.file").strip()
        self._suffix(raw, get["file"], f"{field}.file")
        path = Path(raw).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return DataSource(kind="file", path=str(path), config=config, split=split, row=row)

    def _revision(self, node: yaml.Node, field: str) -> str:
        value = self.value(node, field)
        if isinstance(value, int) and not isinstance(value, bool):
            # An all-digit short SHA is read by YAML as a number; say how to write it.
            raise self.error(f"{field} must be quoted text, got {_show(value)}", node, field)
        return self.required_string(node, field).strip()

    def _suffix(self, text: str, node: yaml.Node, field: str) -> None:
        if not text.lower().endswith(_DATA_SUFFIXES):
            raise self.error(
                f"{field} must name a .jsonl, .json, .csv or .parquet file, got {_show(text)}",
                node,
                field,
            )

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
                f"got {_show(self.value(node, prefix))}",
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
            if key not in allowed and not (loader == "choice" and _INCORRECT_RE.match(key)):
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = (
                    f' (did you mean "{close[0]}"?)'
                    if close
                    else f"; the {loader} loader reads: {', '.join(allowed)}"
                )
                raise self.error(f'{prefix}: unknown key "{key}"{hint}', key_node, sub)
            value = self.value(value_node, sub)
            if value is None:
                out.pop(key, None)
                continue
            if not isinstance(value, str) or not value.strip():
                raise self.error(
                    f"{sub} must be a column name (text), got {_show(value)}", value_node, sub
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
                    f"v1 .. v6; got {_show(release)}",
                    where.get("release", node),
                    f"{prefix}.release",
                )
        return out

    def _check_choice_fields(self, out: dict[str, str], node: yaml.Node) -> None:
        has_list = "choices" in out or "answer" in out
        has_cols = "correct" in out or any(_INCORRECT_RE.match(k) for k in out)
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
        if has_cols and not ("correct" in out and any(_INCORRECT_RE.match(k) for k in out)):
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
                limit = self.integer(vn, sub, 1)
                if limit is not None:
                    out[key] = limit
            elif key in ("contest_date_from", "contest_date_to"):
                value = self.value(vn, sub)
                if value is None:
                    continue
                if not isinstance(value, str) or not _DATE_RE.match(value):
                    raise self.error(
                        f"{sub} must be a date written YYYY-MM-DD, got {_show(value)}", vn, sub
                    )
                out[key] = value
            else:
                if not isinstance(vn, yaml.SequenceNode):
                    raise self.error(
                        f"{sub} must be a list, got {_show(self.value(vn, sub))}", vn, sub
                    )
                items = [self.plain(item, f"{sub}[{i}]") for i, item in enumerate(vn.value)]
                for i, item in enumerate(items):
                    if not isinstance(item, (str, int)) or isinstance(item, bool):
                        raise self.error(
                            f"{sub}[{i}] must be text or a number, got {_show(item)}",
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
            line = _line(node) + text[:pos].count("\n")
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
                close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                raise self.error(
                    f"prompt uses ${{{name}}}, which the {loader} loader does not give{hint}; "
                    f"it gives: {', '.join(allowed)}",
                    _AtLine(line),
                    "prompt",
                )
        return text

    def benchmark(
        self, root: yaml.Node | None, default_name: str, path: Path | None
    ) -> BenchmarkSpec:
        get = self.document(
            root,
            _TOP_KEYS,
            empty="the benchmark file is empty; it needs at least source, prompt and grader",
            required=("prompt", "grader"),
        )
        if "source" not in get and "train_source" not in get:
            raise self.error(
                'missing required key "source" (or train_source, for a benchmark used only '
                "for training)",
                root,
                "source",
            )
        name = default_name
        if "name" in get:
            name = self.required_string(get["name"], "name").strip()
            if not _NAME_RE.match(name):
                raise self.error(
                    f"name may hold only letters, digits, '.', '_' and '-', got {_show(name)}",
                    get["name"],
                    "name",
                )
        base = path.parent if path is not None else None
        source = self.data_source(get["source"], "source", base) if "source" in get else None
        grader = self.choice(get["grader"], "grader", GRADERS)
        assert grader is not None
        answer_format = {"choice": "letter", "math": "math", "code": "code", "short": "short"}[
            grader
        ]
        if "answer_format" in get:
            answer_format = self.choice(get["answer_format"], "answer_format", ANSWER_FORMATS) or (
                answer_format
            )
        loader, loader_node = self._loader(get.get("fields"), grader)
        fields = self.fields(get.get("fields"), loader, loader_node)
        if loader == "choice" and answer_format != "letter":
            raise self.error(
                "answer_format must be letter for a multiple-choice benchmark",
                get.get("answer_format", root),
                "answer_format",
            )
        prompt = self.prompt(get["prompt"], loader)
        grader_options: dict[str, Any] = {}
        if "grader_options" in get:
            node = get["grader_options"]
            if not isinstance(node, yaml.MappingNode):
                if self.value(node, "grader_options") is not None:
                    raise self.error("grader_options must be a mapping", node, "grader_options")
            else:
                grader_options = self.plain(node, "grader_options")
        epochs = 1
        if "epochs" in get:
            epochs = self.integer(get["epochs"], "epochs", 1) or 1
        filters = self.filters(get["filters"], loader) if "filters" in get else {}
        self._check_filter_fields(filters, fields, get.get("filters"), "filters")
        train_source = None
        if "train_source" in get and self.value(get["train_source"], "train_source") is not None:
            train_source = self.train_source(get["train_source"], base, loader, fields, filters)
        if source is None:
            if train_source is None:
                raise self.error(
                    "train_source is empty, and there is no source", get["train_source"], "source"
                )
            # Training-only: the train_source stands in where an evaluation source is read.
            source = train_source
        description = (
            self.string(get["description"], "description") if "description" in get else None
        )
        paper_key = self.string(get["paper_key"], "paper_key") if "paper_key" in get else None
        return BenchmarkSpec(
            name=name,
            source=source,
            fields=fields,
            prompt=prompt,
            grader=grader,
            answer_format=answer_format,
            epochs=epochs,
            description=description,
            grader_options=grader_options,
            filters=filters,
            train_source=train_source,
            training_only="source" not in get,
            paper_key=paper_key,
            path=path,
        )

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

    def train_source(
        self,
        node: yaml.Node,
        base: Path | None,
        loader: str,
        fields: dict[str, str],
        eval_filters: dict[str, Any],
    ) -> DataSource:
        """The train_source: where it is, its fields (the benchmark's, re-mapped), its own
        filters (the evaluation filters never apply to it) and its balance fields."""
        source = self.data_source(node, "train_source", base, train=True)
        get = {
            k: vn for k, (_kn, vn) in self.mapping(node, "train_source", _TRAIN_SOURCE_KEYS).items()
        }
        train_fields = self.fields(
            get.get("fields"), loader, None, base=fields, prefix="train_source.fields"
        )
        train_filters: dict[str, Any] = {}
        if "filters" in get:
            train_filters = self.filters(get["filters"], loader, "train_source.filters")
            self._check_filter_fields(
                train_filters, train_fields, get["filters"], "train_source.filters"
            )
        balance: tuple[str, ...] = ()
        if "balance" in get:
            balance = self._balance(get["balance"], train_fields)
        self._check_lcb_disjoint(eval_filters, train_filters, get.get("filters", node))
        return replace(source, fields=train_fields, filters=train_filters, balance=balance)

    def _balance(self, node: yaml.Node, fields: dict[str, str]) -> tuple[str, ...]:
        sub = "train_source.balance"
        value = self.plain(node, sub)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise self.error(
                f"{sub} must be a field name or a list of them ({', '.join(BALANCE_FIELDS)}), "
                f"got {_show(value)}",
                node,
                sub,
            )
        for name in items:
            if name not in BALANCE_FIELDS:
                raise self.error(
                    f"{sub}: cannot balance over {_show(name)}; use {', '.join(BALANCE_FIELDS)}",
                    node,
                    sub,
                )
            if name not in fields:
                raise self.error(
                    f"{sub}: {name} needs fields.{name} (the column holding it)", node, sub
                )
        return tuple(dict.fromkeys(items))

    def _check_lcb_disjoint(
        self, eval_filters: dict[str, Any], train_filters: dict[str, Any], node: yaml.Node
    ) -> None:
        # Training on contests inside the evaluation window would score training questions.
        start = eval_filters.get("contest_date_from")
        if start is None:
            return
        end = train_filters.get("contest_date_to")
        if end is None or end >= start:
            raise self.error(
                "train_source.filters.contest_date_to must be before the evaluation window's "
                f"contest_date_from ({start}) so that no training problem is evaluated; "
                f"got {_show(end)}",
                node,
                "train_source.filters.contest_date_to",
            )

    def _loader(self, node: yaml.Node | None, grader: str) -> tuple[str, yaml.Node | None]:
        if isinstance(node, yaml.MappingNode):
            for key, _kn, vn in self.items(node, "fields"):
                if key == "loader":
                    value = self.choice(vn, "fields.loader", LOADERS)
                    if value is not None:
                        return value, vn
        if grader in _DEFAULT_LOADER:
            return _DEFAULT_LOADER[grader], None
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


def loader_of(spec: BenchmarkSpec) -> str:
    """The loader that reads ``spec``'s data (``choice``, ``math``, ...)."""
    return spec.fields.get("loader") or _DEFAULT_LOADER.get(spec.grader, "math")


def lcb_release_files(release: str) -> tuple[str, ...] | None:
    """The LiveCodeBench JSONL files making up ``release``; None if it is unknown."""
    if release == "release_latest":
        return LCB_RELEASE_FILES
    match = re.fullmatch(r"(release_)?v([1-9])", release)
    if match is None or int(match.group(2)) > len(LCB_RELEASE_FILES):
        return None
    n = int(match.group(2))
    return LCB_RELEASE_FILES[:n] if match.group(1) else (LCB_RELEASE_FILES[n - 1],)


def training_spec(spec: BenchmarkSpec) -> BenchmarkSpec | None:
    """``spec`` reading its train_source (its fields and filters), or None without one."""
    train = spec.train_source
    if train is None:
        return None
    return replace(
        spec,
        source=train,
        fields=dict(train.fields if train.fields is not None else spec.fields),
        filters=dict(train.filters or {}),
    )


def is_pinned(source: DataSource) -> bool:
    """Whether an hf source names a full commit SHA (always true for url / file)."""
    if source.kind != "hf":
        return True
    return bool(source.revision and _SHA_RE.match(source.revision))


def load_benchmark_text(
    text: str, *, source: str = "<string>", path: Path | None = None
) -> BenchmarkSpec:
    """Parse and validate benchmark YAML held in a string.

    ``source`` is the name errors start with; ``path`` (the file, when there is one)
    anchors relative ``file:`` sources and is kept in the spec.
    """
    root = compose_yaml(text, source, BenchmarkFileError)
    default_name = "benchmark" if source.startswith("<") else Path(source).stem
    reader = _BenchReader(source, {})
    try:
        return reader.benchmark(root, default_name, path)
    finally:
        reader.close()


def builtin_benchmarks_dir() -> Path:
    """The folder of shipped benchmark files (``conductor/benchmarks``, a symlink to the
    repository's ``benchmarks/`` in a checkout; else the repository's own folder)."""
    here = Path(__file__).resolve().parent.parent
    packaged = here / "benchmarks"
    if packaged.is_dir():
        return packaged
    return here.parent.parent / "benchmarks"


def list_benchmarks() -> list[str]:
    """The names of the shipped benchmarks, sorted."""
    folder = builtin_benchmarks_dir()
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if p.is_file())


def resolve_benchmark_path(name_or_path: str) -> Path:
    """An existing benchmark file, or the shipped benchmark called ``name_or_path``."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
    folder = builtin_benchmarks_dir()
    if "/" not in name_or_path and stem in list_benchmarks():
        return folder / f"{stem}.yaml"
    names = list_benchmarks()
    close = difflib.get_close_matches(stem, names, n=1, cutoff=0.6)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    raise BenchmarkFileError(
        f'no benchmark file or shipped benchmark named "{name_or_path}"{hint}; '
        f"shipped: {', '.join(names) or 'none'}"
    )


def load_benchmark(name_or_path: str | Path) -> BenchmarkSpec:
    """Load and validate a benchmark by shipped name (``gpqa-diamond``) or file path."""
    path = resolve_benchmark_path(str(name_or_path))
    text = read_config_file(path, "benchmark file", BenchmarkFileError)
    return load_benchmark_text(text, source=str(path), path=path.resolve())


# --------------------------------------------------------------------------- --data columns


@dataclass(frozen=True)
class DataColumns:
    """The columns a data file for one benchmark holds, named as its ``fields`` name
    them (a nested path such as ``prompt[role=user].content`` is one column here).

    ``required``: a row without one is refused (the question's column first);
    ``optional``: read when present (ids, metadata, tests...)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]

    def describe(self) -> str:
        """One clause for an error message: ``columns a, b (optional: c, d)``."""
        text = "columns " + ", ".join(self.required)
        if self.optional:
            text += f" (optional: {', '.join(self.optional)})"
        return text


#: The field keys whose filter makes the column required (a row is tested on it).
_FILTER_FIELDS: dict[str, str] = {
    "subjects": "subject",
    "levels": "level",
    "contest_date_from": "date",
    "contest_date_to": "date",
    "difficulties": "difficulty",
    "platforms": "platform",
}


def data_columns(spec: BenchmarkSpec) -> DataColumns:
    """The columns a ``--data`` file (or the benchmark's own source) needs for ``spec``.

    The one statement of what each loader reads: the loaders check rows against
    ``required``, the missing-data error names both lists, and the README's table is
    made from them (:func:`data_columns_table`)."""
    fields = spec.fields
    loader = loader_of(spec)
    if loader == "choice":
        if "choices" in fields:
            keys = ["question", "choices", "answer"]
        else:
            wrong = sorted((k for k in fields if _INCORRECT_RE.match(k)), key=lambda k: int(k[10:]))
            keys = ["question", "correct", *wrong]
    elif loader == "math":
        keys = ["question", "answer" if "answer" in fields else "solution"]
    elif loader == "bigcodebench":
        keys = ["question", "test", "entry_point"]
    else:
        keys = ["question"]
    keys += [_FILTER_FIELDS[f] for f in spec.filters if f in _FILTER_FIELDS]
    required = list(dict.fromkeys(fields[k] for k in keys if k in fields))
    # Keys that name no column: the loader's name, LiveCodeBench's release, and (for
    # math) the unused one of answer / solution; the choice keys of the other layout.
    skip = {"loader", "release", *keys}
    if loader == "math":
        skip |= {"solution" if "answer" in fields else "answer", "metadata"}
    if loader == "choice":
        skip |= (
            {"correct", *(k for k in fields if _INCORRECT_RE.match(k))}
            if "choices" in fields
            else {"choices", "answer"}
        )
    optional = [fields[k] for k in fields if k not in skip]
    if loader == "math":
        # math's metadata is a comma-separated list of columns copied into the sample.
        optional += [c.strip() for c in fields.get("metadata", "").split(",") if c.strip()]
    return DataColumns(
        required=tuple(required),
        optional=tuple(c for c in dict.fromkeys(optional) if c not in required),
    )


def _md_code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def data_columns_table(folder: Path | None = None) -> str:
    """The README's ``--data`` table, one row per benchmark file in ``folder`` (default:
    the shipped ones), with the formats a data file may have.  ``python -m
    conductor.bench.spec --readme-table`` prints it."""
    folder = builtin_benchmarks_dir() if folder is None else folder
    formats = ", ".join(f"`{f}`" for f in DATA_FORMATS)
    lines = [
        f"Formats: {formats} (a `.json` file holds a list of rows;",
        "in a `.csv` file a list column holds JSON text).",
        "",
        "| Benchmark | Required columns | Optional columns |",
        "| --- | --- | --- |",
    ]
    for path in sorted(folder.glob("*.yaml")):
        spec = load_benchmark(path)
        columns = data_columns(spec)
        optional = ", ".join(map(_md_code, columns.optional)) or "-"
        # The file's stem: what `conductor bench NAME` takes.
        lines.append(
            f"| `{path.stem}` | {', '.join(map(_md_code, columns.required))} | {optional} |"
        )
    return "\n".join(lines) + "\n"


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m conductor.bench.spec", description="Benchmark file tools."
    )
    parser.add_argument(
        "--readme-table",
        action="store_true",
        help="print the README's table of the columns --data needs per benchmark",
    )
    args = parser.parse_args(argv)
    if not args.readme_table:
        parser.error("nothing to do; pass --readme-table")
    print(data_columns_table(), end="")


if __name__ == "__main__":
    _main()
