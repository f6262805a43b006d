"""Held-out questions: the one place that says when two questions are the same.

Training on a benchmark's evaluation questions makes every later score on that
benchmark meaningless, and nothing in a checkpoint shows it.  This module owns the
question identity used everywhere that matters:

* :func:`check_training_data`: before ``conductor train`` loads a model, the training
  questions (read as :func:`conductor.train.dataset.build_rows` reads them) are compared
  with every question they must not include: the evaluation split of each benchmark in
  the mix and every set listed under the config's ``holdout:``.  An overlap stops the
  run (:class:`ContaminationError`, exit 2) unless ``allow_holdout_overlap: true``.
* the trained checkpoint keeps the hashes of its training questions
  (:func:`conductor.checkpoint_meta.write_training_questions`), and ``conductor bench``
  counts, or with ``--exclude-trained`` skips, the samples the Conductor was trained on
  (:func:`trained_questions_of`, :class:`TrainedQuestions`).

**Normalisation** (:func:`normalise_question`, identifier :data:`NORMALISATION`).  The
same question often reaches two datasets with different formatting, so before hashing:

1. Unicode NFKC (full-width digits, ligatures, non-breaking spaces become plain text);
2. LaTeX that changes only the look is dropped: the spacing commands ``\\,`` ``\\;``
   ``\\:`` ``\\!`` ``\\ `` ``\\quad`` ``\\qquad``, ``\\left`` / ``\\right``,
   ``\\displaystyle`` / ``\\textstyle``, and math delimiters ``$``, ``\\(``, ``\\)``,
   ``\\[``, ``\\]``; ``\\dfrac`` and ``\\tfrac`` become ``\\frac``;
3. case folding (``str.casefold``);
4. every whitespace and invisible format character (zero-width space, soft hyphen,
   byte-order mark) is removed, not just collapsed: ``x+1`` and ``x + 1`` or a
   re-wrapped line must not hide an overlap, and two different questions of benchmark
   length never become equal by losing their spaces alone.

**Keys.**  A question's key is the SHA-256 (hex) of its normalised text.  A
multiple-choice item's key also covers its options, normalised and sorted (so the
per-seed shuffle does not matter): MMLU-style stems such as "Which of the following
is true?" recur with other options and are other questions.  A plain held-out file
that gives no options matches a training question by its text alone.  What is
hashed is the sample's question field, before any prompt template: the same question
rendered by two benchmark files with different prompt wording is still the same.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ..bench.types import BenchmarkSpec, Sample
    from ..conductors.spec import Conductor
    from .settings import TrainConfig

__all__ = [
    "NORMALISATION",
    "PLAIN_QUESTION_COLUMNS",
    "ContaminationError",
    "GuardResult",
    "QuestionKey",
    "TrainedQuestions",
    "check_training_data",
    "normalise_question",
    "question_key",
    "sample_key",
    "trained_questions_of",
]

log = logging.getLogger("conductor")

#: Names this version's normalisation and keys; recorded with a checkpoint's hashes, so
#: hashes made another way are never compared with these.
NORMALISATION = "conductor-question-v1"
#: Columns a plain held-out file may hold its question in (the first one present wins),
#: and the optional list column of its options.
PLAIN_QUESTION_COLUMNS: tuple[str, ...] = (
    "question",
    "problem",
    "prompt",
    "question_content",
    "Question",
)
PLAIN_CHOICES_COLUMN = "choices"
#: How much of a question an error message quotes.
EXAMPLE_CHARS = 80
#: How many overlapping questions an error message quotes.
MAX_EXAMPLES = 3

_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_LOOK_ONLY = re.compile(
    r"\\(?:[,;:! ]|(?:q?quad|left|right|displaystyle|textstyle)(?![A-Za-z]))|\$|\\[()\[\]]"
)
_SPACE = re.compile(r"\s+")


class ContaminationError(UsageError):
    """Training questions overlap questions held out from training (CLI exit code 2)."""


# -- keys -----------------------------------------------------------------------------


def normalise_question(text: str) -> str:
    """``text`` normalised as the module docstring says (NFKC, look-only LaTeX dropped,
    case-folded, no whitespace)."""
    text = unicodedata.normalize("NFKC", text)
    text = _FRAC.sub(r"\\frac", text)
    text = _LOOK_ONLY.sub(" ", text)
    text = _SPACE.sub("", text.casefold())
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class QuestionKey:
    """The identity of one question.

    ``full`` covers the question and, for a multiple-choice item, its options; ``text``
    the question alone (equal to ``full`` when there are no options).  Only ``full``
    is ever stored (in checkpoints) or compared with a benchmark's items.
    """

    full: str
    text: str


def question_key(question: str, choices: Iterable[Any] | None = None) -> QuestionKey:
    """The key of ``question`` with its ``choices`` (any order), if it has any."""
    text = normalise_question(question)
    options = sorted(normalise_question(str(c)) for c in choices or ())
    text_hash = _sha(text)
    if not options:
        return QuestionKey(full=text_hash, text=text_hash)
    # Separators that NFKC text cannot hold after normalisation keep the parts apart.
    return QuestionKey(full=_sha(text + "\x1f" + "\x1e".join(options)), text=text_hash)


def sample_key(sample: Sample) -> QuestionKey:
    """The key of a benchmark sample: its ``question`` input and, when the sample is
    multiple-choice, its ``choices`` (whatever order the seed shuffled them into)."""
    choices = sample.input.get("choices")
    options = choices if isinstance(choices, (list, tuple)) else None
    return question_key(str(sample.input.get("question") or ""), options)


# -- what a checkpoint was trained on ---------------------------------------------------


@dataclass(frozen=True)
class TrainedQuestions:
    """The training-question keys a checkpoint records, and where they were read."""

    source: str
    hashes: frozenset[str]

    def contains(self, sample: Sample) -> bool:
        """Whether ``sample`` is one of the questions the checkpoint was trained on."""
        return sample_key(sample).full in self.hashes


def trained_questions_of(conductor: Conductor) -> TrainedQuestions | None:
    """The training questions recorded by ``conductor``'s checkpoint, if it is a
    checkpoint that records them (``conductor.json`` ``training_questions``).

    Raises :class:`~conductor.errors.UsageError` when the record was made with another
    normalisation than this version's (the hashes would not be comparable).
    """
    from ..checkpoint_meta import read_training_questions

    if conductor.backend != "checkpoint":
        return None
    directory = Path(conductor.target.model)
    found = read_training_questions(directory)
    if found is None:
        return None
    normalisation, hashes = found
    if normalisation != NORMALISATION:
        raise UsageError(
            f"{directory}: its training questions were hashed with {normalisation!r}, "
            f"which this conductor does not know (it uses {NORMALISATION!r}); upgrade "
            "conductor to compare them"
        )
    return TrainedQuestions(source=str(directory), hashes=hashes)


# -- the guard ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardResult:
    """What :func:`check_training_data` found.

    ``training_hashes``: the ``full`` keys of every training question (what the
    checkpoint records); ``checked`` / ``unchecked``: the held-out sets compared, and
    those that could not be read (with why); ``overlap``: how many distinct training
    questions are also held out (non-zero only with ``allow_holdout_overlap``).
    """

    training_hashes: frozenset[str]
    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    overlap: int


@dataclass(frozen=True)
class _Example:
    where: str
    question: str


@dataclass(frozen=True)
class _HeldOut:
    """One held-out set: a label for messages, how to read its questions (a callable
    giving ``(key, compare_with_options, item_id)`` triples), and whether its data
    comes from the network (a Hub dataset or a URL) rather than a local file."""

    label: str
    items: Callable[[], Iterator[tuple[QuestionKey, bool, str]]]
    remote: bool


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXAMPLE_CHARS else flat[: EXAMPLE_CHARS - 3] + "..."


def _training_questions(config: TrainConfig) -> Iterator[tuple[QuestionKey, _Example]]:
    """Every training question: the questions of the very rows the trainer builds
    (:func:`~conductor.train.dataset.build_rows`, same seed), so that the guard and the
    checkpoint's record see exactly what is trained on, however the mix is sampled."""
    from ..bench.types import Sample
    from .dataset import build_rows
    from .pools import load_train_pool, training_conductor

    pool = load_train_pool(config)
    rows = build_rows(config, pool, training_conductor(config, pool), rng_seed=config.seed)
    for row in rows:
        inputs = json.loads(row["sample"])["input"]
        sample = Sample(id=str(row["sample_id"]), input=inputs, gold=None)
        yield sample_key(sample), _Example(sample.id, str(inputs.get("question") or ""))


def _split_label(spec: BenchmarkSpec, data_file: str | None = None) -> str:
    if data_file is not None:
        return f"{spec.name} ({data_file})"
    source = spec.source
    where = {
        "hf": f"{source.id} {source.split}",
        "url": source.url,
        "file": source.path,
    }[source.kind]
    return f"{spec.name} evaluation split ({where})"


@contextlib.contextmanager
def _hub_cache_only() -> Iterator[None]:
    """Read Hugging Face datasets and files from the local cache only.

    The guard must not download an evaluation set (LiveCodeBench's are gigabytes) just
    to compare questions.  ``datasets`` and ``huggingface_hub`` read their offline
    switches (``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``) once at import, so the
    switches are turned on in the loaded modules for the duration and restored after.
    """
    switches: list[tuple[Any, str]] = []
    with contextlib.suppress(ImportError):
        import huggingface_hub.constants as hub_constants

        switches.append((hub_constants, "HF_HUB_OFFLINE"))
    with contextlib.suppress(ImportError):
        import datasets.config as datasets_config

        switches += [(datasets_config, "HF_HUB_OFFLINE"), (datasets_config, "HF_DATASETS_OFFLINE")]
    saved = [(module, name, getattr(module, name, None)) for module, name in switches]
    try:
        for module, name in switches:
            if hasattr(module, name):
                setattr(module, name, True)
        yield
    finally:
        for module, name, value in saved:
            if value is not None:
                setattr(module, name, value)


class _NotCached(Exception):
    """A held-out set whose data is not on this machine."""


def _benchmark_items(
    spec: BenchmarkSpec, data_file: str | None, seed: int
) -> Iterator[tuple[QuestionKey, bool, str]]:
    from ..bench.data import iter_samples
    from ..bench.sources import DatasetError, _url_cache_path

    source = spec.source
    url = source.url if data_file is None and source.kind == "url" else None
    if url is not None and not _url_cache_path(url).is_file():
        raise _NotCached()
    hub = data_file is None and source.kind == "hf"
    started = False
    with _hub_cache_only() if hub else contextlib.nullcontext():
        try:
            for sample in iter_samples(spec, data_file=data_file, seed=seed):
                started = True
                yield sample_key(sample), True, sample.id
        except DatasetError:
            if hub and not started:
                raise _NotCached() from None  # offline, the Hub answers "not found"
            raise


def _plain_items(path: Path) -> Iterator[tuple[QuestionKey, bool, str]]:
    """Questions of a plain data file: a question column (see
    :data:`PLAIN_QUESTION_COLUMNS`) and, optionally, a ``choices`` list."""
    from ..bench.data import MAX_ROW_BYTES
    from ..bench.sources import DataFileError, _file_rows

    for where, row in _file_rows(path, MAX_ROW_BYTES):
        column = next((c for c in PLAIN_QUESTION_COLUMNS if isinstance(row.get(c), str)), None)
        if column is None:
            raise DataFileError(
                f"{where}: a held-out row needs a text column named one of "
                f"{', '.join(PLAIN_QUESTION_COLUMNS)}"
            )
        choices = row.get(PLAIN_CHOICES_COLUMN)
        if isinstance(choices, (list, tuple)) and choices:
            yield question_key(row[column], choices), True, where
        else:
            yield question_key(row[column]), False, where


def _held_out_sets(config: TrainConfig) -> list[_HeldOut]:
    """The evaluation split of each benchmark in the mix, then the ``holdout:`` sets,
    each once."""
    from ..bench.spec import load_benchmark

    sets: list[_HeldOut] = []
    seen: set[tuple[str, str | None]] = set()

    def add_benchmark(name: str, data_file: str | None) -> None:
        spec = load_benchmark(name)
        ident = (str(spec.path or spec.name), data_file)
        # A training-only benchmark (one without an evaluation split, e.g. RLPR) reads
        # its training questions as its source: there is nothing held out to compare.
        if ident in seen or (data_file is None and spec.training_only):
            return
        seen.add(ident)
        sets.append(
            _HeldOut(
                label=_split_label(spec, data_file),
                items=lambda: _benchmark_items(spec, data_file, config.seed),
                remote=data_file is None and spec.source.kind in ("hf", "url"),
            )
        )

    for mix in config.data:
        add_benchmark(mix.benchmark, None)
    for entry in config.holdout:
        if entry.benchmark is not None:
            add_benchmark(entry.benchmark, entry.file)
        elif entry.file is not None and ("", entry.file) not in seen:
            seen.add(("", entry.file))
            path = Path(entry.file)
            sets.append(
                _HeldOut(label=str(path), items=functools.partial(_plain_items, path), remote=False)
            )
    return sets


def check_training_data(config: TrainConfig) -> GuardResult:
    """Compare the training questions of ``config`` with every held-out question.

    Held out: the evaluation split of each benchmark in the mix, read from the local
    Hugging Face cache (or its file) when it is there, and each set under ``holdout:``.
    A Hub dataset that is not cached is skipped with one warning naming it.  Any
    overlap raises :class:`ContaminationError` giving the count and up to three
    examples, unless ``config.allow_holdout_overlap``, when it is one warning instead.
    Returns the training keys and what was compared.  Reads data only; loads no model.
    """
    from ..bench.sources import DatasetError

    by_full: dict[str, _Example] = {}
    by_text: dict[str, str] = {}
    for key, example in _training_questions(config):
        by_full.setdefault(key.full, example)
        by_text.setdefault(key.text, key.full)

    checked: list[str] = []
    unchecked: list[str] = []
    hits: dict[str, str] = {}  # training full key -> the held-out item it matched
    per_set: dict[str, int] = {}
    for held in _held_out_sets(config):
        found: dict[str, str] = {}
        try:
            for key, with_options, item in held.items():
                full = key.full if with_options else by_text.get(key.text)
                if full is not None and full in by_full and full not in found:
                    found[full] = item
        except (_NotCached, DatasetError) as exc:
            if not held.remote:
                raise  # a local file the config names must be readable
            why = (
                "is not in the local dataset cache"
                if isinstance(exc, _NotCached)
                else f"cannot be read ({_clip_reason(str(exc))})"
            )
            log.warning(
                "contamination check: %s %s, so the training questions were not compared with it",
                held.label,
                why,
            )
            unchecked.append(held.label)
            continue
        checked.append(held.label)
        if found:
            per_set[held.label] = len(found)
            for full, item in found.items():
                hits.setdefault(full, item)

    result = GuardResult(
        training_hashes=frozenset(by_full),
        checked=tuple(checked),
        unchecked=tuple(unchecked),
        overlap=len(hits),
    )
    if not hits:
        log.info(
            "contamination check: %d training questions, no overlap with %s",
            len(by_full),
            ", ".join(checked) or "any held-out set (none could be read)",
        )
        return result
    message = _overlap_message(config, by_full, hits, per_set)
    if not config.allow_holdout_overlap:
        raise ContaminationError(
            f"{message}; remove them from the training data, or set "
            "allow_holdout_overlap: true to train on them anyway"
        )
    log.warning("%s (allow_holdout_overlap: true, so training goes on)", message)
    return result


def _clip_reason(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _overlap_message(
    config: TrainConfig,
    by_full: Mapping[str, _Example],
    hits: Mapping[str, str],
    per_set: Mapping[str, int],
) -> str:
    where = f"{config.path}: " if getattr(config, "path", None) else ""
    n = len(hits)
    sets = "; ".join(f"{count} in {label}" for label, count in per_set.items())
    examples = "; ".join(
        f'"{_clip(by_full[full].question)}" ({by_full[full].where}, also {item})'
        for full, item in list(hits.items())[:MAX_EXAMPLES]
    )
    noun = "question is" if n == 1 else "questions are"
    return f"{where}{n} training {noun} also held out ({sets}), e.g. {examples}"
