"""What a benchmark is, typed, and the names a benchmark file may use.

:class:`BenchmarkSpec` is a benchmark file (``benchmarks/NAME.yaml``) once validated
(the reader is :mod:`conductor.bench.spec`), :class:`DataSource` where its rows come
from.  The vocabulary below (graders, answer formats, loaders and what each reads) is
data, shared by the benchmark file reader, the dataset pipeline and the graders; it
lives here, below all three, so that none of them imports another's room for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ANSWER_FORMATS",
    "BALANCE_FIELDS",
    "DATA_FORMATS",
    "DEFAULT_LOADER",
    "GRADERS",
    "INCORRECT_RE",
    "LCB_RELEASE_FILES",
    "LOADERS",
    "LOADER_FIELDS",
    "LOADER_FILTERS",
    "LOADER_INPUTS",
    "SELECT_SHUFFLES",
    "BenchmarkSpec",
    "DataSource",
    "Selection",
    "is_pinned",
    "lcb_release_files",
    "loader_of",
]


#: How a :class:`Selection` orders the rows before cutting them: ``python`` is
#: ``random.Random(seed).shuffle`` of the row positions, ``numpy`` is
#: ``numpy.random.default_rng(seed).permutation`` (what ``datasets.Dataset.shuffle(seed=...)``
#: does).  The paper authors' code uses the one for its splits, the other for MMLU.
SELECT_SHUFFLES: tuple[str, ...] = ("python", "numpy")


@dataclass(frozen=True)
class Selection:
    """A seeded part of a source's rows (after its filters): the row positions are
    shuffled (``shuffle``, ``seed``), then cut, in order, into the ``cut`` parts - each
    ``int(n * size)`` positions for a fraction, ``size`` for a count (an int) - and
    ``rest``, what is left; the benchmark reads part ``part``, or with ``take`` only the
    first ``take`` positions of that part in the shuffled order (the paper authors
    scored the first 2,000 of their shuffled RLPR test part: ``eval_max_samples``).

    The same rule on the same rows always gives the same positions; rows are read in
    dataset order (the selection is a set, not an order).
    """

    shuffle: Literal["python", "numpy"]
    seed: int
    cut: tuple[tuple[str, float | int], ...]
    part: str
    take: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The rule as a run record keeps it (``take`` only when set, so that the
        records of the rules without one stay as they were)."""
        rule: dict[str, Any] = {
            "shuffle": self.shuffle,
            "seed": self.seed,
            "cut": dict(self.cut),
            "part": self.part,
        }
        if self.take is not None:
            rule["take"] = self.take
        return rule


@dataclass(frozen=True)
class DataSource:
    """Where the items come from: a Hugging Face dataset at a pinned revision, a URL or
    a local file (JSON, JSONL, CSV or Parquet)."""

    kind: Literal["hf", "url", "file"]
    id: str | None = None
    revision: str | None = None
    config: str | None = None
    split: str = "test"
    path: str | None = None
    url: str | None = None
    #: A column whose value is the row itself (some datasets nest each row under one key).
    row: str | None = None
    #: Training sources only: the benchmark's ``fields`` with the train_source's overrides
    #: applied, its own ``filters`` and the field names to balance a sample over.
    fields: dict[str, str] | None = field(default=None, compare=False)
    filters: dict[str, Any] | None = field(default=None, compare=False)
    balance: tuple[str, ...] = ()
    #: A seeded part of the rows (e.g. the paper authors' held-out fifth), else all.
    select: Selection | None = None

    def dataset_key(self) -> tuple[str, ...]:
        """Which rows this source is cut from, whatever part it selects or revision it
        pins: two sources with one key hold the same questions (RLPR's whole training
        split and the authors' test fifth of it), so a question trained on from the one
        may be a question evaluated on from the other."""
        if self.kind == "hf":
            return ("hf", str(self.id), self.config or "", self.split, self.row or "")
        if self.kind == "url":
            return ("url", str(self.url), self.row or "")
        return ("file", str(self.path), self.row or "")


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark file (``benchmarks/NAME.yaml``), validated."""

    name: str
    source: DataSource
    fields: dict[str, str]
    prompt: str
    grader: str
    answer_format: str
    epochs: int = 1
    description: str | None = None
    grader_options: dict[str, Any] = field(default_factory=dict)
    filters: dict[str, Any] = field(default_factory=dict)
    train_source: DataSource | None = None
    #: No evaluation source: the benchmark exists for training mixes (``source`` is then
    #: the train_source, and ``conductor bench`` needs ``--data FILE``).
    training_only: bool = False
    paper_key: str | None = None
    #: Whether these are the questions the paper measured its ``paper_key`` column on
    #: (for the columns whose set the authors chose: see :mod:`conductor.bench.paper`).
    paper_set: bool = False
    path: Path | None = None


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
        # incorrect_1 .. incorrect_N are accepted too (see INCORRECT_RE).
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

#: The fields a training sample may be balanced over (their values form the groups).
BALANCE_FIELDS: tuple[str, ...] = ("subject", "level", "difficulty", "platform")
#: The data files a ``file:`` / ``url:`` source or ``--data FILE`` may name.
DATA_FORMATS: tuple[str, ...] = (".jsonl", ".json", ".csv", ".parquet")
#: The loader of a benchmark that names none, by grader (code graders must name one).
DEFAULT_LOADER = {"choice": "choice", "math": "math", "short": "math"}
#: The per-option columns of a multiple-choice benchmark besides ``correct``.
INCORRECT_RE = re.compile(r"incorrect_[1-9][0-9]?\Z")
_SHA_RE = re.compile(r"[0-9a-f]{40}\Z")


def loader_of(spec: BenchmarkSpec) -> str:
    """The loader that reads ``spec``'s data (``choice``, ``math``, ...)."""
    return spec.fields.get("loader") or DEFAULT_LOADER.get(spec.grader, "math")


def lcb_release_files(release: str) -> tuple[str, ...] | None:
    """The LiveCodeBench JSONL files making up ``release``; None if it is unknown."""
    if release == "release_latest":
        return LCB_RELEASE_FILES
    match = re.fullmatch(r"(release_)?v([1-9])", release)
    if match is None or int(match.group(2)) > len(LCB_RELEASE_FILES):
        return None
    n = int(match.group(2))
    return LCB_RELEASE_FILES[:n] if match.group(1) else (LCB_RELEASE_FILES[n - 1],)


def is_pinned(source: DataSource) -> bool:
    """Whether an hf source names a full commit SHA (always true for url / file)."""
    if source.kind != "hf":
        return True
    return bool(source.revision and _SHA_RE.match(source.revision))
