"""Question identity: the one place that says when two questions are the same.

Training on a benchmark's evaluation questions makes every later score on that
benchmark meaningless; the training guard (:mod:`conductor.train.contamination`) and
``conductor bench --exclude-trained`` (:mod:`conductor.bench.trained`) both compare
questions by the key made here.

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

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..grading.types import Sample

__all__ = [
    "NORMALISATION",
    "NORMALISATION_V1",
    "SAMPLE_KEYS",
    "QuestionKey",
    "normalise_question",
    "question_key",
    "sample_key",
]

#: Names this version's normalisation and keys; recorded with a checkpoint's hashes, so
#: hashes made another way are never compared with these.
NORMALISATION = "conductor-question-v2"
#: The normalisation before v2, still read from older checkpoints.
NORMALISATION_V1 = "conductor-question-v1"
# v1's patterns (see _normalise_v1); v2 writes LaTeX one way instead.
_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_LOOK_ONLY = re.compile(
    r"\\(?:[,;:! ]|(?:q?quad|left|right|displaystyle|textstyle)(?![A-Za-z]))|\$|\\[()\[\]]"
)
_SPACE = re.compile(r"\s+")


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
SAMPLE_KEYS: dict[str, Callable[[Sample], str]] = {
    NORMALISATION_V1: _sample_key_v1,
    NORMALISATION: lambda sample: sample_key(sample).full,
}
