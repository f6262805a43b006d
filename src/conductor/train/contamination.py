"""Held-out questions: the one place that says when two questions are the same.

Training on a benchmark's evaluation questions makes every later score on that
benchmark meaningless, and nothing in a checkpoint shows it.  This module owns the
question identity used everywhere that matters:

* :func:`check_training_data`: before ``conductor train`` loads a model, the training
  questions (read as :func:`conductor.train.dataset.build_rows` reads them) are compared
  with every question they must not include: the evaluation split of each benchmark in
  the mix and every set listed under the config's ``holdout:``.  An overlap stops the
  run (:class:`ContaminationError`, exit 2) unless ``allow_holdout_overlap: true``.  A
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

**Normalisation** (:func:`normalise_question`, identifier :data:`NORMALISATION`).  The
same question often reaches two datasets with different formatting, so before hashing:

1. Unicode: superscript / subscript digits become ``^{..}`` / ``_{..}``, then NFKC
   (full-width digits, ligatures, non-breaking spaces become plain text); the minus
   sign and dashes become ``-``, curly quotes straight ones, and ``× · ÷ ≤ ≥ ≠ ≈ ± ∞ π
   √ ° →`` their LaTeX commands;
2. LaTeX is written one way: math delimiters (``$``, ``\\(``, ``\\)``, ``\\[``,
   ``\\]``) and everything that changes only the look (spacing commands, ``\\left`` /
   ``\\right``, sizes, ``\\displaystyle``) are dropped; font wrappers (``\\text{..}``,
   ``\\mathrm``, ``\\textbf``, ``\\operatorname``...) are unwrapped; synonyms are one
   command (``\\dfrac`` / ``\\tfrac`` → ``\\frac``, ``\\leq`` → ``\\le``, ``\\neq`` →
   ``\\ne``, ``\\ldots`` → ``...``); ``\\sin`` is ``sin``; arguments without braces get
   them (``\\frac12`` → ``\\frac{1}{2}``, ``\\sqrt2`` → ``\\sqrt{2}``, ``x^2`` →
   ``x^{2}``, ``2^10`` → ``2^{10}``, ``x^(n+1)`` → ``x^{n+1}``).  ``\\cdot`` and
   ``\\times`` stay apart (a dot and a cross product are different questions);
3. case folding (``str.casefold``);
4. the instructions that datasets and harnesses put around a question are dropped
   ("Put your final answer within \\boxed{}.", "Answer with the letter...", "The
   following are multiple choice questions (with answers) about ...", "Question:",
   "Answer:", ...), patterns written after lm-evaluation-harness, lighteval,
   simple-evals and the usual math prompts;
5. every whitespace and invisible format character (zero-width space, soft hyphen,
   byte-order mark) is removed, not just collapsed: ``x+1`` and ``x + 1`` or a
   re-wrapped line must not hide an overlap, and two different questions of benchmark
   length never become equal by losing their spaces alone.

**Keys.**  A question's key is the SHA-256 (hex) of its normalised text.  A
multiple-choice item's key also covers its options, normalised and sorted (so the
per-seed shuffle does not matter): MMLU-style stems such as "Which of the following
is true?" recur with other options and are other questions.  Options may be given as
a list, a label-to-text mapping, or written into the question (``(A) 3 (B) 4`` inline
or ``A. 3`` per line): all three give the same key.  A plain held-out file that gives
no options matches a training question by its text alone.  What is hashed is the
sample's question field, before any prompt template: the same question rendered by
two benchmark files with different prompt wording is still the same.

Checkpoints recorded with ``conductor-question-v1`` (before the LaTeX, instruction and
option rules) are still read: their hashes are compared with v1 keys.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ..benchmark import BenchmarkSpec
    from ..conductors.spec import Conductor
    from ..grading.types import Sample
    from .settings import NgramSettings, TrainConfig

__all__ = [
    "NORMALISATION",
    "NORMALISATION_V1",
    "PLAIN_QUESTION_COLUMNS",
    "ContaminationError",
    "GuardResult",
    "HoldoutUnavailableError",
    "NearPair",
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
NORMALISATION = "conductor-question-v2"
#: The normalisation before v2, still read from older checkpoints.
NORMALISATION_V1 = "conductor-question-v1"
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

# v1's patterns (see _normalise_v1); v2 writes LaTeX one way instead.
_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_LOOK_ONLY = re.compile(
    r"\\(?:[,;:! ]|(?:q?quad|left|right|displaystyle|textstyle)(?![A-Za-z]))|\$|\\[()\[\]]"
)
_SPACE = re.compile(r"\s+")


class ContaminationError(UsageError):
    """Training questions overlap questions held out from training, or could not be
    compared with them (CLI exit code 2)."""


class HoldoutUnavailableError(ContaminationError):
    """A held-out set cannot be read on this machine, so the training questions cannot
    be compared with it (CLI exit code 2); the message says how to make it available."""


# -- normalisation ------------------------------------------------------------------------


def _normalise_v1(text: str) -> str:
    """``conductor-question-v1``, kept unchanged so that checkpoints recorded with it
    are still compared (with their own normalisation) by ``bench``."""
    text = unicodedata.normalize("NFKC", text)
    text = _FRAC.sub(r"\\frac", text)
    text = _LOOK_ONLY.sub(" ", text)
    text = _SPACE.sub("", text.casefold())
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return text


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUBSCRIPTS = str.maketrans("₀₁₂₃₄₅₆₇₈₉₋₊", "0123456789-+")
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
_SUBSCRIPT_RUN = re.compile("[₀₁₂₃₄₅₆₇₈₉₋₊]+")
#: Characters that NFKC leaves alone but that are only another way of writing a symbol.
#: The multiplication sign and the middle dot keep their own commands: ``u \\times v``
#: (a cross product) and ``u \\cdot v`` (a dot product) are different questions.
_SYMBOLS = str.maketrans(
    {
        "\u2212": "-",  # minus sign
        "\u2010": "-",  # hyphen
        "\u2011": "-",  # non-breaking hyphen
        "\u2012": "-",  # figure dash
        "\u2013": "-",  # en dash
        "\u2014": "-",  # em dash
        "\u2015": "-",  # horizontal bar
        "\u2043": "-",  # hyphen bullet
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",  # prime: f′(x) is f'(x)
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
        "\u00d7": r" \times ",
        "\u22c5": r" \cdot ",
        "\u00b7": r" \cdot ",
        "\u00f7": r" \div ",
        "\u2264": r" \le ",
        "\u2265": r" \ge ",
        "\u2260": r" \ne ",
        "\u2248": r" \approx ",
        "\u00b1": r" \pm ",
        "\u221e": r" \infty ",
        "\u03c0": r" \pi ",
        "\u221a": r" \sqrt ",
        "\u00b0": r"^\circ ",
        "\u2192": r" \rightarrow ",
        "~": " ",  # LaTeX's non-breaking space
    }
)
#: Escaped characters that read as the character itself.
_ESCAPED = re.compile(r"\\([$%&#_])")
_MATH_DELIMITERS = re.compile(r"\$|\\[()\[\]]")
_SPACING = re.compile(r"\\[,;:! ]")
#: Wrappers that change only the font: ``\\text{if }x`` is ``if x``.  ``\\mathbb`` and
#: ``\\mathcal`` stay (ℝ is not R to a reader, though NFKC makes it so).
_WRAPPERS = (
    "text|textrm|textnormal|textbf|textit|textsf|texttt|textup|emph|mbox|hbox|"
    "mathrm|mathbf|mathit|mathsf|mathtt|mathnormal|boldsymbol|bm|operatorname"
)
#: A brace group up to three levels deep (questions do not nest further in practice).
_GROUP = r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}"
_UNWRAP = re.compile(rf"\\(?:{_WRAPPERS})\*?\s*({_GROUP})")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
#: Commands that only change the look (spacing, sizes, styles): dropped.
_LOOK_COMMANDS = frozenset(
    [
        "quad",
        "qquad",
        "enspace",
        "thinspace",
        "medspace",
        "thickspace",
        "negthinspace",
        "left",
        "right",
        "middle",
        "displaystyle",
        "textstyle",
        "scriptstyle",
        "limits",
        "nolimits",
        "big",
        "Big",
        "bigg",
        "Bigg",
        "bigl",
        "Bigl",
        "biggl",
        "Biggl",
        "bigr",
        "Bigr",
        "biggr",
        "Biggr",
        "bigm",
        "Bigm",
    ]
)
#: Synonymous commands, each written one way.
_SAME_COMMAND: dict[str, str] = {
    "dfrac": r"\frac",
    "tfrac": r"\frac",
    "cfrac": r"\frac",
    "dbinom": r"\binom",
    "tbinom": r"\binom",
    "leq": r"\le",
    "leqslant": r"\le",
    "geq": r"\ge",
    "geqslant": r"\ge",
    "neq": r"\ne",
    "to": r"\rightarrow",
    "gets": r"\leftarrow",
    "lbrace": r"\{",
    "rbrace": r"\}",
    "lvert": "|",
    "rvert": "|",
    "vert": "|",
    "mid": "|",
    "ldots": "...",
    "cdots": "...",
    "dots": "...",
    "dotsc": "...",
    "dotsb": "...",
    "lnot": r"\neg",
    "land": r"\wedge",
    "lor": r"\vee",
    "colon": ":",
    "bmod": "mod",
    "pmod": "mod",
}
#: Operator names that plain-text datasets write without the backslash (``sin(x)``).
_OPERATORS = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "arcsin",
        "arccos",
        "arctan",
        "sinh",
        "cosh",
        "tanh",
        "log",
        "ln",
        "lg",
        "exp",
        "gcd",
        "lcm",
        "max",
        "min",
        "sup",
        "inf",
        "lim",
        "det",
        "deg",
        "dim",
        "ker",
    ]
)
_ONE = r"\\[A-Za-z]+|\\[^A-Za-z\s]|[^\s{}\\]"
#: A super- or subscript without braces: LaTeX takes one character, but a plain-text
#: ``2^10`` or ``10^-3`` means the whole number, and LaTeX ``2^10`` (``2^{1}0``) is
#: never what a question means.
_SCRIPT_ONE = r"-?\d+|\\[A-Za-z]+|\\[^A-Za-z\s]|[^\s{}\\^_]"
_FIRST_ARG = re.compile(rf"\\(frac|binom)\s*({_ONE})")
_SECOND_ARG = re.compile(rf"\\(frac|binom)\s*({_GROUP})\s*({_ONE})")
_SQRT_PARENS = re.compile(r"\\sqrt\s*(\[[^\]]*\])?\s*\(([^()]*)\)")
_SQRT_ARG = re.compile(rf"\\sqrt\s*(\[[^\]]*\])?\s*({_ONE})")
_SCRIPT_PARENS = re.compile(r"(?<!\\)([\^_])\s*\(([^()]*)\)")
_SCRIPT_ARG = re.compile(rf"(?<!\\)([\^_])\s*({_SCRIPT_ONE})")


def _command(match: re.Match[str]) -> str:
    name = match[1]
    if name in _LOOK_COMMANDS:
        return " "
    if name in _OPERATORS:
        return f" {name} "
    return _SAME_COMMAND.get(name, match[0])


def _until_stable(pattern: re.Pattern[str], repl: Any, text: str) -> str:
    # Nested forms (\frac{\frac12}3, \text{\textbf{x}}) need more than one pass.
    for _ in range(8):
        new = pattern.sub(repl, text)
        if new == text:
            break
        text = new
    return text


def _braced(arg: str) -> str:
    return arg if arg.startswith("{") else "{" + arg + "}"


def _canonical(text: str) -> str:
    """The text with Unicode and LaTeX written one way, case-folded, spaces collapsed
    (word boundaries are kept: options and instructions are found by them)."""
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + m[0].translate(_SUPERSCRIPTS) + "}", text)
    text = _SUBSCRIPT_RUN.sub(lambda m: "_{" + m[0].translate(_SUBSCRIPTS) + "}", text)
    text = unicodedata.normalize("NFKC", text).translate(_SYMBOLS)
    text = _ESCAPED.sub(r"\1", text)  # \$5 is $5, then both lose the $ below
    text = _MATH_DELIMITERS.sub(" ", text)
    text = _SPACING.sub(" ", text)
    text = _until_stable(_UNWRAP, lambda m: " " + m[1][1:-1] + " ", text)
    text = _COMMAND.sub(_command, text)
    text = _until_stable(_FIRST_ARG, lambda m: f"\\{m[1]}{_braced(m[2])}", text)
    text = _until_stable(_SECOND_ARG, lambda m: f"\\{m[1]}{m[2]}{_braced(m[3])}", text)
    text = _SQRT_PARENS.sub(lambda m: f"\\sqrt{m[1] or ''}{{{m[2]}}}", text)
    text = _until_stable(_SQRT_ARG, lambda m: f"\\sqrt{m[1] or ''}{_braced(m[2])}", text)
    text = _SCRIPT_PARENS.sub(lambda m: f"{m[1]}{{{m[2]}}}", text)
    text = _SCRIPT_ARG.sub(lambda m: f"{m[1]}{_braced(m[2])}", text)
    text = text.casefold()
    if not text.isascii():
        text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return _SPACE.sub(" ", text).strip()


# Instructions that datasets and evaluation harnesses put around a question (written
# here after the patterns of lm-evaluation-harness, lighteval, simple-evals and the
# MATH / Qwen / DeepSeek prompts), matched on the canonical text: case-folded, one
# space between words, LaTeX delimiters gone.
_BOXED = r"\\boxed ?\{ ?\}"
_PREFIXES = (
    r"the following (?:is|are) (?:an? )?multiple[- ]choice questions?(?: \(with answers\))?"
    r"(?: about [^.:]{1,80})?[.:]",
    r"answer the following multiple[- ]choice questions?[^.:]{0,40}[.:]",
    r"the last line of your response should be [^\n]{0,240}?"
    r"(?:think step by step before answering|is the answer to the problem)\.",
    r"(?:solve|answer) the following (?:math |mathematics |maths )?(?:problem|question)s?"
    r"(?: step by step)?[.:]",
    r"(?:please )?(?:read|consider) the following (?:question|problem)[^.:]{0,40}[.:]",
    r"what is the correct answer to this question ?:",
    r"(?:question|problem|q) ?\d* ?:",
)
_SUFFIXES = (
    rf"(?:please )?(?:reason|think) step by step,? and put your final answer "
    rf"(?:with)?in {_BOXED}\.?",
    rf"(?:please )?put your (?:final )?answer (?:with)?in(?:side)? (?:a )?{_BOXED}\.?",
    rf"(?:the )?final answer should be (?:put |written )?in {_BOXED}\.?",
    r"remember to put your answer on its own line after [^\n]{0,160}",
    r"return your final (?:response|answer) as [^\n]{0,240}",
    r"format your response as follows ?: [^\n]{0,160}",
    r"(?:please )?(?:answer|respond|reply) with (?:only |just )?(?:the )?(?:option'?s? )?"
    r"letter\b[^.]{0,100}\.?",
    r"(?:let's|let us|please) think step by step\.?",
    r"think step by step(?: before answering)?\.?",
    r"(?:your |the |final )?answer ?:",
    r"solution ?:",
)
_PREFIX = re.compile(r"^(?:" + "|".join(_PREFIXES) + r") ?")
# A suffix starts a word (not "reanswer:"); it is looked for in the text's last
# SUFFIX_WINDOW characters only, which keeps a long code question cheap.
_SUFFIX = re.compile(r"(?<!\S)(?:" + "|".join(_SUFFIXES) + r")$")
SUFFIX_WINDOW = 400
_OPTIONS_HEADING = re.compile(r" ?(?:answer )?(?:choices|options) ?:?$")


def _strip_instructions(text: str) -> str:
    """``text`` (canonical) without the instructions before and after the question;
    unchanged if nothing else would be left."""
    while True:
        stripped = _PREFIX.sub("", text)
        suffix = _SUFFIX.search(stripped, max(0, len(stripped) - SUFFIX_WINDOW))
        if suffix is not None:
            stripped = stripped[: suffix.start()]
        stripped = stripped.strip()
        if stripped == text or not stripped:
            return text
        text = stripped


def _squash(text: str) -> str:
    # Every space goes: "x+1" and "x + 1", or a re-wrapped line, must not hide an
    # overlap, and two different questions never become equal by losing spaces alone.
    return _SPACE.sub("", text)


def normalise_question(text: str) -> str:
    """``text`` normalised as the module docstring says (canonical Unicode and LaTeX,
    the harness instructions around it dropped, case-folded, no whitespace).  Options
    written into the text are not taken apart here: :func:`question_key` does that."""
    return _squash(_strip_instructions(_canonical(text)))


# Option labels: "(A)", "[A]", "A.", "A)", "A:" (case-folded), at the start or after a
# space.  Ten labels are enough for every benchmark shipped (MMLU-Pro has ten).
_LABEL = re.compile(r"(?:^|(?<= ))(?:\(([a-j])\)|\[([a-j])\]|([a-j])[.):](?= |$))")


def _split_options(text: str) -> tuple[str, list[str]]:
    """A canonical question text with its options written in, ``"q? (a) 3 (b) 4"`` or
    ``"q? a. 3 b. 4"`` (lines are one space here), as the stem and the option texts;
    ``(text, [])`` when it has none.  The options are the last run of labels
    ``a``, ``b``, ``c``... in order, at least two, that runs to the end."""
    marks = [(m.start(), m.end(), m[1] or m[2] or m[3]) for m in _LABEL.finditer(text)]
    chain: list[tuple[int, int, str]] = []
    for i, mark in enumerate(marks):
        if mark[2] != "a":
            continue
        run = [mark]
        for later in marks[i + 1 :]:
            if later[2] == chr(ord(run[-1][2]) + 1):
                run.append(later)
        if len(run) >= 2:
            chain = run
    if not chain:
        return text, []
    ends = [m[0] for m in chain[1:]] + [len(text)]
    options = [text[m[1] : end].strip() for m, end in zip(chain, ends, strict=True)]
    if any(not option for option in options):
        return text, []
    stem = _OPTIONS_HEADING.sub("", text[: chain[0][0]].strip()).strip()
    return _strip_instructions(stem), options


def _choice_texts(choices: Iterable[Any] | Mapping[Any, Any]) -> list[str]:
    """The option texts of ``choices``: a list, a mapping of label to text (in label
    order), or ARC's ``{"text": [...], "label": [...]}``."""
    if isinstance(choices, Mapping):
        texts = choices.get("text")
        if isinstance(texts, (list, tuple)):
            return [str(t) for t in texts]
        return [str(choices[k]) for k in sorted(choices, key=str)]
    return [str(c) for c in choices]


def _unlabelled(options: list[str]) -> list[str]:
    """Canonical options without their labels when every one carries its own in order
    (``["a. 3", "b. 4"]``); otherwise unchanged."""
    stripped = []
    for i, option in enumerate(options):
        match = _LABEL.match(option)
        if match is None or (match[1] or match[2] or match[3]) != chr(ord("a") + i):
            return options
        stripped.append(option[match.end() :].strip())
    return stripped if all(stripped) else options


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class QuestionKey:
    """The identity of one question.

    ``full`` covers the question and, for a multiple-choice item, its options; ``text``
    the question alone (equal to ``full`` when there are no options).  Only ``full``
    is ever stored (in checkpoints) or compared with a benchmark's items.
    ``has_options`` says whether options were given or found written in the text;
    ``words`` are the canonical words of the stem and the options, for n-gram overlap.
    """

    full: str
    text: str
    has_options: bool = False
    words: tuple[str, ...] = field(default=(), compare=False, repr=False)


def question_key(
    question: str, choices: Iterable[Any] | Mapping[Any, Any] | None = None
) -> QuestionKey:
    """The key of ``question`` with its ``choices`` (any order), if it has any.

    Options written into the question (``"... (A) 3 (B) 4"`` or one ``A. 3`` per
    line) count as its options when no ``choices`` are given; given ``choices`` (a
    list, a label-to-text mapping, or ARC's ``{"text", "label"}``) are the options,
    and the same options written into the text are then left out of the stem."""
    canonical = _strip_instructions(_canonical(question))
    stem, written = _split_options(canonical)
    given = _unlabelled([_canonical(t) for t in _choice_texts(choices)]) if choices else []
    if given:
        same = sorted(map(_squash, written)) == sorted(map(_squash, given))
        options, stem = given, stem if same else canonical
    else:
        options = written
    squashed = sorted(_squash(o) for o in options)
    text = _squash(stem)
    text_hash = _sha(text)
    words = tuple(_WORD.findall(" ".join([stem, *sorted(options, key=_squash)])))
    if not squashed:
        return QuestionKey(full=text_hash, text=text_hash, words=words)
    # Separators that NFKC text cannot hold after normalisation keep the parts apart.
    full = _sha(text + "\x1f" + "\x1e".join(squashed))
    return QuestionKey(full=full, text=text_hash, has_options=True, words=words)


def _sample_parts(sample: Sample) -> tuple[str, Any]:
    choices = sample.input.get("choices")
    options = choices if isinstance(choices, (list, tuple, Mapping)) else None
    return str(sample.input.get("question") or ""), options


def sample_key(sample: Sample) -> QuestionKey:
    """The key of a benchmark sample: its ``question`` input and, when the sample is
    multiple-choice, its ``choices`` (whatever order the seed shuffled them into)."""
    return question_key(*_sample_parts(sample))


def _sample_key_v1(sample: Sample) -> str:
    """A sample's ``full`` key as ``conductor-question-v1`` made it."""
    question, choices = _sample_parts(sample)
    text = _normalise_v1(question)
    if not isinstance(choices, (list, tuple)) or not choices:
        return _sha(text)
    options = sorted(_normalise_v1(str(c)) for c in choices)
    return _sha(text + "\x1f" + "\x1e".join(options))


#: Each normalisation this version can compare a checkpoint's record with, and the
#: ``full`` key it gives a benchmark sample.
_SAMPLE_KEYS: dict[str, Callable[[Sample], str]] = {
    NORMALISATION_V1: _sample_key_v1,
    NORMALISATION: lambda sample: sample_key(sample).full,
}


def _grams(words: tuple[str, ...], n: int) -> frozenset[int]:
    """The word ``n``-grams of ``words`` (hashed: only compared within one run); a
    question shorter than ``n`` words is one gram of all of them."""
    if len(words) < n:
        return frozenset({hash(words)}) if words else frozenset()
    return frozenset(hash(words[i : i + n]) for i in range(len(words) - n + 1))


# -- what a checkpoint was trained on ---------------------------------------------------


@dataclass(frozen=True)
class TrainedQuestions:
    """The training-question keys a checkpoint records, where they were read, how they
    were made, and the held-out sets training could not compare them with."""

    source: str
    hashes: frozenset[str]
    normalisation: str = NORMALISATION
    unchecked: tuple[str, ...] = ()

    def contains(self, sample: Sample) -> bool:
        """Whether ``sample`` is one of the questions the checkpoint was trained on."""
        return _SAMPLE_KEYS[self.normalisation](sample) in self.hashes


def trained_questions_of(conductor: Conductor) -> TrainedQuestions | None:
    """The training questions recorded by ``conductor``'s checkpoint, if it is a
    checkpoint that records them (``conductor.json`` ``training_questions``).

    A record made with ``conductor-question-v1`` is compared with v1 keys.  Raises
    :class:`~conductor.errors.UsageError` when the record was made with a
    normalisation this version does not know (the hashes would not be comparable).
    Warns when the checkpoint was trained without comparing its questions with some
    held-out set (``accept_unchecked_holdout``).
    """
    from ..conductors.checkpoint import read_training_guard, read_training_questions

    if conductor.backend != "checkpoint":
        return None
    directory = Path(conductor.target.model)
    found = read_training_questions(directory)
    if found is None:
        return None
    normalisation, hashes = found
    if normalisation not in _SAMPLE_KEYS:
        raise UsageError(
            f"{directory}: its training questions were hashed with {normalisation!r}, "
            f"which this conductor does not know (it knows {', '.join(map(repr, _SAMPLE_KEYS))}); "
            "upgrade conductor to compare them"
        )
    guard = read_training_guard(directory) or {}
    listed = guard.get("unchecked")
    unchecked = tuple(str(u) for u in listed) if isinstance(listed, list) else ()
    if unchecked:
        log.warning(
            "%s was trained without comparing its training questions with %s "
            "(accept_unchecked_holdout: true); scores on those may include trained questions",
            directory,
            "; ".join(unchecked),
        )
    return TrainedQuestions(
        source=str(directory), hashes=hashes, normalisation=normalisation, unchecked=unchecked
    )


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
    from ..datasets.sources import DatasetError, _url_cache_path

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
    from ..datasets.sources import DataFileError, _file_rows

    for where, row in _file_rows(path, MAX_ROW_BYTES):
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


def _held_out_sets(config: TrainConfig) -> list[_HeldOut]:
    """The evaluation split of each benchmark in the mix, then the ``holdout:`` sets,
    each once.  A mix benchmark's split that ``holdout:`` gives as a local file
    (``{benchmark: NAME, file: PATH}``) is read from that file only."""
    from ..bench.spec import load_benchmark

    sets: list[_HeldOut] = []
    seen: set[tuple[str, str | None]] = set()

    def ident(spec: BenchmarkSpec) -> str:
        return str(spec.path or spec.name)

    local_copies = {
        ident(load_benchmark(e.benchmark))
        for e in config.holdout
        if e.benchmark is not None and e.file is not None
    }

    def add_benchmark(name: str, data_file: str | None) -> None:
        spec = load_benchmark(name)
        key = (ident(spec), data_file)
        # A training-only benchmark (one without an evaluation split, e.g. RLPR) reads
        # its training questions as its source: there is nothing held out to compare.
        if key in seen or (data_file is None and spec.training_only):
            return
        if data_file is None and key[0] in local_copies:
            return
        seen.add(key)
        remote = data_file is None and spec.source.kind in ("hf", "url")
        sets.append(
            _HeldOut(
                label=_split_label(spec, data_file),
                items=lambda: _benchmark_items(spec, data_file, config.seed),
                remote=remote,
                fetch=_fetch_hint(name, spec) if remote else "",
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
            raise ContaminationError(
                f"{message}; remove them from the training data, or set "
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
