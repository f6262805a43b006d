"""Benchmark files (``benchmarks/*.yaml``): schema, loading and validation.

A benchmark is a YAML file, not Python.  Schema (every key but ``source``, ``prompt``
and ``grader`` is optional)::

    name: gpqa-diamond              # default: the file's stem; used to prefix sample ids
    description: one line for humans
    paper_key: GPQA-D               # the column name in the paper's result tables
    paper_set: true                 # these are the questions that column was measured on
                                    #   (see conductor.bench.paper: for MATH500, MMLU,
                                    #   RLPR and LCB the report shows the paper's figures
                                    #   only beside a benchmark saying so)
    source:                         # exactly one of hf / url / file:
      hf: Idavidrein/gpqa           #   a Hugging Face dataset ...
      revision: 90b8e5be...         #   ... at a pinned commit of the Hub repository
      config: gpqa_diamond          #   optional dataset config (subset)
      split: train                  #   default: test
      # url: https://.../data.jsonl #   or a file on the web (.jsonl/.json/.csv/.parquet)
      # file: data/mine.jsonl       #   or a local file, relative to this YAML file
      # row: train                  #   optional: each row is nested under this column
      # select:                     #   optional: a seeded part of the rows (after filters)
      #   shuffle: python           #     python: random.Random(seed).shuffle of positions;
      #                             #     numpy: default_rng(seed).permutation (datasets'
      #                             #     Dataset.shuffle)
      #   seed: 42
      #   cut: {test: 0.2, valid: 0.2}  # parts cut in order: int(n * f) each, or a count
      #   part: test                #     the part read: a cut one, or rest (what is left)
      #   take: 2000                #     optional: only the part's first N, shuffled order
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

The loaders, the ``fields`` keys each reads and the placeholders its prompts may use
are in :mod:`conductor.bench.schema`; the columns a data file needs for a benchmark in
:mod:`conductor.datasets.columns` (``python -m conductor.bench.spec --readme-table``
prints the README's table of them).

Every mistake raises :class:`BenchmarkFileError` (a
:class:`~conductor.errors.ConfigFileError`) whose message starts ``FILE:LINE:`` and
names the field.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import yaml

from ..benchmark import (
    ANSWER_FORMATS,
    BALANCE_FIELDS,
    DATA_FORMATS,
    GRADERS,
    LCB_RELEASE_FILES,
    LOADER_FIELDS,
    LOADER_FILTERS,
    LOADER_INPUTS,
    LOADERS,
    SELECT_SHUFFLES,
    BenchmarkSpec,
    DataSource,
    Selection,
    lcb_release_files,
    loader_of,
)
from ..bounds import EPOCHS, SEED
from ..configfile import compose_yaml, read_config_file, show_value
from ..datasets.columns import DataColumns, data_columns
from ..datasets.selection import REST
from ..errors import BenchmarkFileError
from ..shipped import resolve_shipped, shipped_dir, shipped_names
from .schema import LoaderSections, template_placeholders

# The vocabulary (.schema) and the data columns (.columns) are importable from here too.
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
    "lcb_release_files",
    "list_benchmarks",
    "load_benchmark",
    "load_benchmark_text",
    "loader_of",
    "resolve_benchmark_path",
    "template_placeholders",
    "training_spec",
]

_TOP_KEYS = (
    "name",
    "description",
    "paper_key",
    "paper_set",
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
_SOURCE_KEYS = ("hf", "revision", "config", "split", "url", "file", "row", "select")
_SELECT_KEYS = ("shuffle", "seed", "cut", "part", "take")
#: The keys a ``select`` must have (``take`` is optional).
_SELECT_REQUIRED = ("shuffle", "seed", "cut", "part")
#: A train_source may also re-map fields, filter its own rows and name what to balance.
_TRAIN_SOURCE_KEYS = (*_SOURCE_KEYS, "fields", "filters", "balance")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_SHA_RE = re.compile(r"[0-9a-f]{40}\Z")


class _BenchReader(LoaderSections):
    """The line-aware reader with the sections of a benchmark file."""

    def data_source(
        self, node: yaml.Node, field: str, base: Path | None, *, train: bool = False
    ) -> DataSource:
        allowed = _TRAIN_SOURCE_KEYS if train else _SOURCE_KEYS
        keys = self.mapping(node, field, allowed, "a mapping with hf, url or file")
        get = {k: vn for k, (_kn, vn) in keys.items()}
        row = self.string(get["row"], f"{field}.row") if "row" in get else None
        select = self._select(get["select"], f"{field}.select") if "select" in get else None
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
                    f"got {show_value(dataset_id)}",
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
                kind="hf",
                id=dataset_id,
                revision=revision,
                config=config,
                split=split,
                row=row,
                select=select,
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
                    f"{field}.url must start with http://, https:// or file://, "
                    f"got {show_value(url)}",
                    get["url"],
                    f"{field}.url",
                )
            self._suffix(url.split("?", 1)[0], get["url"], f"{field}.url")
            return DataSource(
                kind="url", url=url, config=config, split=split, row=row, select=select
            )
        raw = self.required_string(get["file"], f"{field}.file").strip()
        self._suffix(raw, get["file"], f"{field}.file")
        path = Path(raw).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        return DataSource(
            kind="file", path=str(path), config=config, split=split, row=row, select=select
        )

    def _select(self, node: yaml.Node, field: str) -> Selection:
        """A source's ``select``: shuffle, seed, the parts to cut and the one to read."""
        keys = self.mapping(
            node, field, _SELECT_KEYS, "a mapping with shuffle, seed, cut, part (and take)"
        )
        get = {k: vn for k, (_kn, vn) in keys.items()}
        for key in _SELECT_REQUIRED:
            if key not in get:
                raise self.error(f"{field} needs {key}", node, f"{field}.{key}")
        shuffle = self.choice(get["shuffle"], f"{field}.shuffle", SELECT_SHUFFLES)
        seed = self.integer(get["seed"], f"{field}.seed", SEED)
        if shuffle is None or seed is None:
            raise self.error(f"{field} needs shuffle and seed", node, field)
        cut_field = f"{field}.cut"
        cut_node = get["cut"]
        if not isinstance(cut_node, yaml.MappingNode) or not cut_node.value:
            raise self.error(
                f"{cut_field} must map part names to sizes (a fraction such as 0.2, or a "
                "count), in the order they are cut",
                cut_node,
                cut_field,
            )
        cut: list[tuple[str, float | int]] = []
        total = 0.0
        for name, _kn, vn in self.items(cut_node, cut_field):
            sub = f"{cut_field}.{name}"
            if name == REST or name in dict(cut):
                raise self.error(f"{sub}: {name!r} cannot name a cut part", _kn, sub)
            size = self.value(vn, sub)
            if isinstance(size, bool) or not isinstance(size, (int, float)):
                raise self.error(
                    f"{sub} must be a fraction (0 < f <= 1) or a count, got {show_value(size)}",
                    vn,
                    sub,
                )
            if isinstance(size, float):
                if not 0.0 < size <= 1.0:
                    raise self.error(
                        f"{sub} must be a fraction in (0, 1] or a count, got {size}", vn, sub
                    )
                total += size
            elif size < 1:
                raise self.error(f"{sub} must be a count of at least 1, got {size}", vn, sub)
            cut.append((name, size))
        if total > 1.0 + 1e-9:
            raise self.error(
                f"{cut_field}: the fractions add up to more than 1", cut_node, cut_field
            )
        part = self.required_string(get["part"], f"{field}.part").strip()
        names = [name for name, _size in cut] + [REST]
        if part not in names:
            raise self.error(
                f"{field}.part must be one of {', '.join(names)}, got {show_value(part)}",
                get["part"],
                f"{field}.part",
            )
        take: int | None = None
        if "take" in get:
            value = self.value(get["take"], f"{field}.take")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.error(
                    f"{field}.take must be a count of at least 1 (the first rows of the "
                    f"part, in the shuffled order), got {show_value(value)}",
                    get["take"],
                    f"{field}.take",
                )
            take = value
        kind: Literal["python", "numpy"] = "python" if shuffle == "python" else "numpy"
        return Selection(shuffle=kind, seed=seed, cut=tuple(cut), part=part, take=take)

    def _revision(self, node: yaml.Node, field: str) -> str:
        value = self.value(node, field)
        if isinstance(value, int) and not isinstance(value, bool):
            # An all-digit short SHA is read by YAML as a number; say how to write it.
            raise self.error(f"{field} must be quoted text, got {show_value(value)}", node, field)
        return self.required_string(node, field).strip()

    def _suffix(self, text: str, node: yaml.Node, field: str) -> None:
        if not text.lower().endswith(DATA_FORMATS):
            raise self.error(
                f"{field} must name a .jsonl, .json, .csv or .parquet file, got {show_value(text)}",
                node,
                field,
            )

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
                    f"name may hold only letters, digits, '.', '_' and '-', got {show_value(name)}",
                    get["name"],
                    "name",
                )
        base = path.parent if path is not None else None
        source = self.data_source(get["source"], "source", base) if "source" in get else None
        grader = self.required_choice(get["grader"], "grader", GRADERS)
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
            epochs = self.integer(get["epochs"], "epochs", EPOCHS) or 1
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
        paper_set = (
            bool(self.boolean(get["paper_set"], "paper_set")) if "paper_set" in get else False
        )
        if paper_set and not paper_key:
            raise self.error(
                "paper_set says these are the questions of a paper column: name it with paper_key",
                get["paper_set"],
                "paper_set",
            )
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
            paper_set=paper_set,
            path=path,
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
                f"got {show_value(value)}",
                node,
                sub,
            )
        for name in items:
            if name not in BALANCE_FIELDS:
                raise self.error(
                    f"{sub}: cannot balance over {show_value(name)}; "
                    f"use {', '.join(BALANCE_FIELDS)}",
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
                f"got {show_value(end)}",
                node,
                "train_source.filters.contest_date_to",
            )


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
    """The folder of shipped benchmark files (see :func:`conductor.shipped.shipped_dir`)."""
    return shipped_dir("benchmark")


def list_benchmarks() -> list[str]:
    """The names of the shipped benchmarks, sorted."""
    return shipped_names("benchmark")


def resolve_benchmark_path(name_or_path: str) -> Path:
    """An existing benchmark file, or the shipped benchmark called ``name_or_path``."""
    return resolve_shipped("benchmark", name_or_path)


def load_benchmark(name_or_path: str | Path) -> BenchmarkSpec:
    """Load and validate a benchmark by shipped name (``gpqa-diamond``) or file path."""
    path = resolve_benchmark_path(str(name_or_path))
    text = read_config_file(path, "benchmark file", BenchmarkFileError)
    return load_benchmark_text(text, source=str(path), path=path.resolve())


def _md_code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def data_columns_table(folder: Path | None = None) -> str:
    """The README's ``--data`` table, one row per benchmark file in ``folder`` (default:
    the shipped ones), with the formats a data file may have.  ``python -m
    conductor.bench.spec --readme-table`` prints it."""

    folder = shipped_dir("benchmark") if folder is None else folder
    formats = ", ".join(f"`{f}`" for f in DATA_FORMATS)
    lines = [
        f"Formats: {formats} (a `.json` file holds a list of rows;",
        "in a `.csv` file a list column holds JSON text).",
        "",
        "| Benchmark | Required columns | Optional columns |",
        "| --- | --- | --- |",
    ]
    # Sorted by name, as list_benchmarks is ("math500" before "math500-paper"; sorting
    # the file names would put "-" before ".").
    for path in sorted(folder.glob("*.yaml"), key=lambda p: p.stem):
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
