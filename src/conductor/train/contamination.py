"""Held-out questions: the one place that says when two questions are the same.

Training on a benchmark's evaluation questions makes every later score on that
benchmark meaningless, and nothing in a checkpoint shows it.  This module owns the
question identity used everywhere that matters:

* :func:`check_training_data`: before ``conductor train`` loads a model, the training
  questions (read as :func:`conductor.train.dataset.build_rows` reads them) are compared
  with every question they must not include: the evaluation split of each benchmark in
  the mix, of every shipped benchmark whose evaluation questions are cut from the rows a
  mix entry draws from (a training-only benchmark too: RLPR's training split holds the
  ``rlpr-paper`` test questions), and every set listed under the config's ``holdout:``.
  An overlap stops the run (:class:`ContaminationError`, exit 2, naming the paper set's
  training part where that is the fix) unless ``allow_holdout_overlap: true``.  A
  held-out set that is not on this machine (a Hub dataset not cached, offline) stops it
  too (:class:`HoldoutUnavailableError`, with the command that fetches it) unless
  ``accept_unchecked_holdout: true``: the guard never passes without comparing.
* optionally (``holdout_ngram: {n: 13, threshold: 0.5}``) a training question that
  shares at least ``threshold`` of its word ``n``-grams with a held-out question (of
  the shorter one's n-grams, as in the GPT-3 / lm-eval decontamination) is reported
  and stops the run as an overlap does: reworded copies that no normalisation catches.
* the trained checkpoint keeps the hashes of its training questions and what the check
  compared (:func:`conductor.conductors.checkpoint.write_training_questions`), and ``conductor
  bench`` counts, or with ``--exclude-trained`` skips, the samples the Conductor was
  trained on (:func:`trained_questions_of`, :class:`TrainedQuestions`).

The question identity itself (normalisation, keys) is :mod:`conductor.datasets.questions`;
what a checkpoint was trained on, as ``conductor bench`` reads it, is
:mod:`conductor.bench.trained`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..datasets.questions import NORMALISATION, QuestionKey, question_key, sample_key
from ..errors import UsageError

if TYPE_CHECKING:
    from ..benchmark import BenchmarkSpec
    from .settings import NgramSettings, TrainConfig

__all__ = [
    "PLAIN_QUESTION_COLUMNS",
    "ContaminationError",
    "GuardResult",
    "HoldoutUnavailableError",
    "NearPair",
    "check_training_data",
]

log = logging.getLogger("conductor")

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


class ContaminationError(UsageError):
    """Training questions overlap questions held out from training, or could not be
    compared with them (CLI exit code 2)."""


class HoldoutUnavailableError(ContaminationError):
    """A held-out set cannot be read on this machine, so the training questions cannot
    be compared with it (CLI exit code 2); the message says how to make it available."""


# -- normalisation ------------------------------------------------------------------------


def _grams(words: tuple[str, ...], n: int) -> frozenset[int]:
    """The word ``n``-grams of ``words`` (hashed: only compared within one run); a
    question shorter than ``n`` words is one gram of all of them."""
    if len(words) < n:
        return frozenset({hash(words)}) if words else frozenset()
    return frozenset(hash(words[i : i + n]) for i in range(len(words) - n + 1))


# -- the guard ------------------------------------------------------------------------


@dataclass(frozen=True)
class NearPair:
    """A training question that is not the same as a held-out one by its key but
    shares ``overlap`` of its word n-grams with it (of the shorter one's)."""

    training: str
    training_question: str
    held_out: str
    held_out_question: str
    held_out_set: str
    overlap: float


@dataclass(frozen=True)
class GuardResult:
    """What :func:`check_training_data` found.

    ``training_hashes``: the ``full`` keys of every training question (what the
    checkpoint records); ``checked`` / ``unchecked``: the held-out sets compared, and
    those that could not be read (non-empty only with ``accept_unchecked_holdout``);
    ``overlap``: how many distinct training questions are also held out, and ``near``
    the n-gram near-duplicates (both non-empty only with ``allow_holdout_overlap``);
    ``ngram``: the n-gram settings used, if any.
    """

    training_hashes: frozenset[str]
    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    overlap: int
    near: tuple[NearPair, ...] = ()
    ngram: NgramSettings | None = None
    accepted_unchecked: bool = False
    allowed_overlap: bool = False

    def record(self) -> dict[str, Any]:
        """What the checkpoint keeps about the check (``training_questions.json``
        ``guard``), so that a later reader knows what was and was not compared."""
        return {
            "normalisation": NORMALISATION,
            "checked": list(self.checked),
            "unchecked": list(self.unchecked),
            "accept_unchecked_holdout": self.accepted_unchecked,
            "allow_holdout_overlap": self.allowed_overlap,
            "overlap": self.overlap,
            "ngram": (
                {"n": self.ngram.n, "threshold": self.ngram.threshold, "near": len(self.near)}
                if self.ngram is not None
                else None
            ),
        }


@dataclass(frozen=True)
class _Example:
    where: str
    question: str


@dataclass(frozen=True)
class _Item:
    """One held-out question: its key, whether it is compared with its options (a
    plain file's question without options matches by text), where it is, its text."""

    key: QuestionKey
    with_options: bool
    where: str
    question: str


@dataclass(frozen=True)
class _HeldOut:
    """One held-out set: a label for messages, how to read its questions, whether its
    data comes from the network (a Hub dataset or a URL) rather than a local file, and
    for such a set how to make it available on this machine."""

    label: str
    items: Callable[[], Iterator[_Item]]
    remote: bool
    fetch: str = ""
    #: How to train without this set's questions, where there is a better way than
    #: dropping them (a paper set's own training part).
    fix: str = ""


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXAMPLE_CHARS else flat[: EXAMPLE_CHARS - 3] + "..."


def _training_questions(config: TrainConfig) -> Iterator[tuple[QuestionKey, _Example]]:
    """Every training question: the questions of the very rows the trainer builds
    (:func:`~conductor.train.dataset.build_rows`, same seed), so that the guard and the
    checkpoint's record see exactly what is trained on, however the mix is sampled."""
    from ..grading.types import Sample
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


def _fetch_hint(ref: str, spec: BenchmarkSpec) -> str:
    """How to put ``spec``'s evaluation split on this machine: the command that reads
    it once with network access (into the cache the guard reads), or a local copy."""
    source = spec.source
    where = (
        f"{source.id} (split {source.split}, revision {source.revision})"
        if source.kind == "hf"
        else str(source.url)
    )
    command = (
        'python -c "from conductor.datasets.samples import iter_samples; '
        "from conductor.bench.spec import load_benchmark; "
        f'next(iter_samples(load_benchmark({ref!r})))"'
    )
    from ..datasets.columns import data_columns

    columns = data_columns(spec).describe()
    return (
        f"fetch {where} once with network access: {command}; or list a local copy under "
        f"holdout: as {{benchmark: {ref}, file: PATH}} (a file with {columns})"
    )


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


def _benchmark_items(spec: BenchmarkSpec, data_file: str | None, seed: int) -> Iterator[_Item]:
    from ..datasets.samples import iter_samples
    from ..datasets.sources import DatasetError, url_cache_path

    source = spec.source
    url = source.url if data_file is None and source.kind == "url" else None
    if url is not None and not url_cache_path(url).is_file():
        raise _NotCached()
    hub = data_file is None and source.kind == "hf"
    started = False
    with _hub_cache_only() if hub else contextlib.nullcontext():
        try:
            for sample in iter_samples(spec, data_file=data_file, seed=seed):
                started = True
                question = str(sample.input.get("question") or "")
                yield _Item(sample_key(sample), True, sample.id, question)
        except DatasetError:
            if hub and not started:
                raise _NotCached() from None  # offline, the Hub answers "not found"
            raise


def _plain_items(path: Path) -> Iterator[_Item]:
    """Questions of a plain data file: a question column (see
    :data:`PLAIN_QUESTION_COLUMNS`) and, optionally, a ``choices`` list or mapping."""
    from ..datasets.samples import MAX_ROW_BYTES
    from ..datasets.sources import DataFileError, file_rows

    for where, row in file_rows(path, MAX_ROW_BYTES):
        column = next((c for c in PLAIN_QUESTION_COLUMNS if isinstance(row.get(c), str)), None)
        if column is None:
            raise DataFileError(
                f"{where}: a held-out row needs a text column named one of "
                f"{', '.join(PLAIN_QUESTION_COLUMNS)}"
            )
        choices = row.get(PLAIN_CHOICES_COLUMN)
        given = choices if isinstance(choices, (list, tuple, Mapping)) and choices else None
        key = question_key(row[column], given)
        # Without options (given or written in), the question matches by text alone.
        yield _Item(key, key.has_options, where, row[column])


def _sharing_data(mix_spec: BenchmarkSpec) -> list[str]:
    """The shipped benchmarks whose evaluation questions are cut from the rows a mix
    entry reads (``mix_spec``: the source it trains from).

    A training-only benchmark has no evaluation split of its own, yet its rows can hold
    another benchmark's test questions: RLPR's whole training split holds the authors'
    test fifth (``rlpr-paper``).  Comparing every evaluation set on the same rows, not
    only the mix benchmark's own split, makes any way of reaching those rows checked.
    """
    from ..bench.spec import list_benchmarks, load_benchmark

    key = mix_spec.source.dataset_key()
    names = []
    for name in list_benchmarks():
        spec = load_benchmark(name)
        if not spec.training_only and spec.source.dataset_key() == key:
            names.append(name)
    return names


def _held_out_sets(config: TrainConfig) -> list[_HeldOut]:
    """The evaluation split of each benchmark in the mix and of every shipped benchmark
    cut from the same rows as a mix entry (:func:`_sharing_data`), then the
    ``holdout:`` sets, each once.  A benchmark's split that ``holdout:`` gives as a
    local file (``{benchmark: NAME, file: PATH}``) is read from that file only."""
    from ..bench.spec import load_benchmark, training_spec

    sets: list[_HeldOut] = []
    seen: set[tuple[str, str | None]] = set()

    def ident(spec: BenchmarkSpec) -> str:
        return str(spec.path or spec.name)

    copies = [
        (load_benchmark(e.benchmark), e.file)
        for e in config.holdout
        if e.benchmark is not None and e.file is not None
    ]
    local_copies = {ident(spec) for spec, _file in copies}
    # A local copy of one set's rows is a copy of every set cut from those rows (each
    # reads its own part of it): the whole of MATH-500 for math500 and math500-paper.
    copy_of_rows = {spec.source.dataset_key(): file for spec, file in reversed(copies)}

    def add_benchmark(name: str, data_file: str | None) -> None:
        spec = load_benchmark(name)
        # A training-only benchmark (one without an evaluation split, e.g. RLPR) reads
        # its training questions as its source: that source is not held out; the
        # evaluation sets cut from the same rows are (added through _sharing_data).
        if data_file is None and spec.training_only:
            return
        if data_file is None and ident(spec) in local_copies:
            return  # the holdout: entry adds it, read from its file
        if data_file is None:
            data_file = copy_of_rows.get(spec.source.dataset_key())
        key = (ident(spec), data_file)
        if key in seen:
            return
        seen.add(key)
        remote = data_file is None and spec.source.kind in ("hf", "url")
        fix = (
            f"train on {spec.name}'s training part instead ({{benchmark: {name}, split: train}})"
            if spec.train_source is not None and spec.train_source.select is not None
            else ""
        )
        sets.append(
            _HeldOut(
                label=_split_label(spec, data_file),
                items=lambda: _benchmark_items(spec, data_file, config.seed),
                remote=remote,
                fetch=_fetch_hint(name, spec) if remote else "",
                fix=fix,
            )
        )

    for mix in config.data:
        add_benchmark(mix.benchmark, None)
        # The rows the entry is drawn from as its benchmark declares them (a data file
        # given instead stands for those rows, in that benchmark's schema).
        mixed = load_benchmark(mix.benchmark)
        train = training_spec(mixed) if mix.split == "train" else None
        for name in _sharing_data(train or mixed):
            add_benchmark(name, None)
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


#: An n-gram found in more training questions than this is a template's boilerplate
#: ("which of the following statements is true about"), not evidence of a copy: it is
#: not counted as shared (it still counts in the question's n-grams), which also keeps
#: one held-out question from being compared with most of the training set.
MAX_NGRAM_POSTINGS = 200


class _NgramIndex:
    """The training questions' word n-grams, to find each held-out question's closest
    training question by containment (shared n-grams over the shorter one's count)."""

    def __init__(self, settings: NgramSettings) -> None:
        self.settings = settings
        self.sizes: list[int] = []
        self.postings: dict[int, list[int]] = {}

    def add(self, words: tuple[str, ...]) -> None:
        grams = _grams(words, self.settings.n)
        index = len(self.sizes)
        self.sizes.append(len(grams))
        for gram in grams:
            self.postings.setdefault(gram, []).append(index)

    def closest(self, words: tuple[str, ...]) -> tuple[int, float] | None:
        """The training question (its position) sharing the most of its n-grams with
        ``words``, if at least the threshold."""
        grams = _grams(words, self.settings.n)
        shared: dict[int, int] = {}
        for gram in grams:
            postings = self.postings.get(gram, ())
            if len(postings) > MAX_NGRAM_POSTINGS:
                continue
            for index in postings:
                shared[index] = shared.get(index, 0) + 1
        best: tuple[int, float] | None = None
        for index, count in shared.items():
            ratio = count / min(len(grams), self.sizes[index])
            if ratio >= self.settings.threshold and (best is None or ratio > best[1]):
                best = (index, ratio)
        return best


def check_training_data(config: TrainConfig) -> GuardResult:
    """Compare the training questions of ``config`` with every held-out question.

    Held out: the evaluation split of each benchmark in the mix, read from the local
    Hugging Face cache (or its file, or the local copy ``holdout:`` gives for it), and
    each set under ``holdout:``.  Any overlap, and with ``holdout_ngram`` any training
    question sharing at least its threshold of word n-grams with a held-out one, raises
    :class:`ContaminationError` giving the counts and examples, unless
    ``config.allow_holdout_overlap`` (then one warning).  A set that cannot be read
    here (not cached, offline) raises :class:`HoldoutUnavailableError` saying how to
    make it available, unless ``config.accept_unchecked_holdout`` (then one warning;
    the checkpoint records it).  Returns the training keys and what was compared.
    Reads data only; loads no model.
    """
    from ..datasets.sources import DatasetError

    by_full: dict[str, _Example] = {}
    by_text: dict[str, str] = {}
    ngrams = _NgramIndex(config.holdout_ngram) if config.holdout_ngram is not None else None
    order: list[str] = []  # training full keys in n-gram index order
    for key, example in _training_questions(config):
        if key.full in by_full:
            continue
        by_full[key.full] = example
        by_text.setdefault(key.text, key.full)
        if ngrams is not None:
            ngrams.add(key.words)
            order.append(key.full)

    checked: list[str] = []
    unchecked: list[_HeldOut] = []
    hits: dict[str, str] = {}  # training full key -> the held-out item it matched
    near: dict[str, NearPair] = {}
    per_set: dict[str, int] = {}
    fixes: list[str] = []
    for held in _held_out_sets(config):
        found: dict[str, str] = {}
        close: list[tuple[str, NearPair]] = []
        try:
            for item in held.items():
                full = item.key.full if item.with_options else by_text.get(item.key.text)
                if full is not None and full in by_full:
                    found.setdefault(full, item.where)
                elif ngrams is not None:
                    best = ngrams.closest(item.key.words)
                    if best is not None:
                        train = order[best[0]]
                        pair = NearPair(
                            training=by_full[train].where,
                            training_question=by_full[train].question,
                            held_out=item.where,
                            held_out_question=item.question,
                            held_out_set=held.label,
                            overlap=best[1],
                        )
                        close.append((train, pair))
        except (_NotCached, DatasetError) as exc:
            if not held.remote:
                raise  # a local file the config names must be readable
            why = (
                "is not in the local dataset cache"
                if isinstance(exc, _NotCached)
                else f"cannot be read here ({_clip_reason(str(exc))})"
            )
            unchecked.append(_HeldOut(f"{held.label} {why}", held.items, True, held.fetch))
            continue
        checked.append(held.label)
        if found:
            per_set[held.label] = len(found)
            if held.fix:
                fixes.append(held.fix)
            for full, where in found.items():
                hits.setdefault(full, where)
        for train, pair in close:
            if train not in found and (train not in near or near[train].overlap < pair.overlap):
                near[train] = pair
    for full in hits:
        near.pop(full, None)  # the same question elsewhere: counted as an overlap

    result = GuardResult(
        training_hashes=frozenset(by_full),
        checked=tuple(checked),
        unchecked=tuple(u.label for u in unchecked),
        overlap=len(hits),
        near=tuple(near.values()),
        ngram=config.holdout_ngram,
        accepted_unchecked=bool(unchecked) and config.accept_unchecked_holdout,
        allowed_overlap=bool(hits or near) and config.allow_holdout_overlap,
    )
    where = f"{config.path}: " if getattr(config, "path", None) else ""
    if hits or near:
        message = where + _overlap_message(config, by_full, hits, per_set, list(near.values()))
        if not config.allow_holdout_overlap:
            better = "".join(f"{fix}, or " for fix in fixes)
            raise ContaminationError(
                f"{message}; {better}remove them from the training data, or set "
                "allow_holdout_overlap: true to train on them anyway"
            )
        log.warning("%s (allow_holdout_overlap: true, so training goes on)", message)
    if unchecked:
        sets = "; ".join(f"{u.label}: {u.fetch}" for u in unchecked)
        noun = "set" if len(unchecked) == 1 else "sets"
        if not config.accept_unchecked_holdout:
            raise HoldoutUnavailableError(
                f"{where}the training questions cannot be compared with {len(unchecked)} "
                f"held-out {noun}, so the guard would pass without checking: {sets}; or set "
                "accept_unchecked_holdout: true to train without comparing them (the "
                "checkpoint records it)"
            )
        log.warning(
            "contamination check: %d held-out %s not compared with the training questions "
            "(accept_unchecked_holdout: true, recorded in the checkpoint): %s",
            len(unchecked),
            noun,
            "; ".join(u.label for u in unchecked),
        )
    if not hits and not near:
        log.info(
            "contamination check: %d training questions, no overlap with %s",
            len(by_full),
            ", ".join(checked) or "any held-out set (none could be read)",
        )
    return result


def _clip_reason(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."


def _overlap_message(
    config: TrainConfig,
    by_full: Mapping[str, _Example],
    hits: Mapping[str, str],
    per_set: Mapping[str, int],
    near: list[NearPair],
) -> str:
    parts = []
    if hits:
        n = len(hits)
        sets = "; ".join(f"{count} in {label}" for label, count in per_set.items())
        examples = "; ".join(
            f'"{_clip(by_full[full].question)}" ({by_full[full].where}, also {item})'
            for full, item in list(hits.items())[:MAX_EXAMPLES]
        )
        noun = "question is" if n == 1 else "questions are"
        parts.append(f"{n} training {noun} also held out ({sets}), e.g. {examples}")
    if near:
        settings = config.holdout_ngram
        assert settings is not None
        ranked = sorted(near, key=lambda p: -p.overlap)
        pairs = "; ".join(
            f'"{_clip(p.training_question)}" ({p.training}) ~ "{_clip(p.held_out_question)}" '
            f"({p.held_out} in {p.held_out_set}, {p.overlap:.0%})"
            for p in ranked[:MAX_EXAMPLES]
        )
        noun = "question shares" if len(near) == 1 else "questions share"
        parts.append(
            f"{len(near)} training {noun} at least {settings.threshold:.0%} of "
            f"{settings.n}-word n-grams with a held-out question (holdout_ngram), e.g. {pairs}"
        )
    return "; ".join(parts)
