"""Pull the answer out of a model's reply.

Pure functions, no state.  Each one first cuts its input to the last
:data:`MAX_RESPONSE_CHARS` characters and then does a bounded amount of work (one or
two linear passes, no backtracking-prone patterns), so a huge or hostile reply cannot
stall a benchmark.  Reasoning blocks (``<think>...</think>``) are removed by the two
high-level extractors, :func:`extract_letter` and :func:`extract_math_answer`; the
low-level ones (:func:`last_boxed`, :func:`answer_tag`, :func:`answer_line`) read the
text they are given as it is.
"""

from __future__ import annotations

import bisect
import functools
import re
import string
from collections.abc import Callable, Hashable, Iterable
from typing import NamedTuple

from conductor.text import strip_think

__all__ = [
    "EXTRACTIONS",
    "MAX_RESPONSE_CHARS",
    "Part",
    "Recognise",
    "answer_line",
    "answer_places",
    "answer_tag",
    "check_extraction",
    "clip_tail",
    "extract_letter",
    "extract_math_answer",
    "hedge_in",
    "last_boxed",
    "letter_options",
    "letter_reading",
    "named_options",
    "official_letter",
    "strip_think",
]

#: Replies longer than this are cut to their tail before any extraction.
MAX_RESPONSE_CHARS = 64_000

_LETTERS = string.ascii_uppercase

#: How the math and choice graders read an answer (``grader_options: {extraction:
#: ...}``): ``official`` as the reference harness does (math-verify for math, lighteval's
#: letter rules for choices), ``conductor`` with this project's own extractors.
EXTRACTIONS = ("official", "conductor")


def check_extraction(value: str) -> str:
    """``value`` if it names one of :data:`EXTRACTIONS`; raises ``ValueError`` else."""
    if value not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {', '.join(EXTRACTIONS)}, not {value!r}")
    return value


def clip_tail(text: str, limit: int = MAX_RESPONSE_CHARS) -> str:
    """Return the last ``limit`` characters of ``text`` (answers sit at the end)."""
    if limit <= 0:
        return ""
    return text if len(text) <= limit else text[-limit:]


# --- \boxed{...} -------------------------------------------------------------------

# Box openers, escaped braces (literal set braces, skipped) and plain braces, in one
# alternation so that a single left-to-right pass can match every box.
_BRACE_TOKEN = re.compile(r"\\(?:boxed|fbox)\s*\{|\\[{}]|[{}]")
# ``\boxed 5``: the brace-less form some models write.
_BARE_BOX = re.compile(r"\\boxed[ \t]+([^\s{}$]+)")


def _boxes(text: str) -> list[tuple[int, int, int]]:
    """Every complete box in ``text`` as ``(start, content_start, content_end)``.

    Sorted so that the box ending last comes last (for nested boxes ending together,
    the outer one).  One pass with a stack of open braces; boxes left open (a truncated
    reply) are dropped.  Indices, not text: slicing every nested box of a hostile reply
    would copy quadratically many characters.
    """
    found: list[tuple[int, int, int]] = []
    # Each entry: (start of the box command, start of its content) for a box opener,
    # or None for an ordinary brace.
    stack: list[tuple[int, int] | None] = []
    for match in _BRACE_TOKEN.finditer(text):
        token = match.group(0)
        if token[0] == "\\" and len(token) == 2:
            continue  # \{ or \}: a literal brace, not grouping
        if token.endswith("{"):
            stack.append((match.start(), match.end()) if len(token) > 1 else None)
        elif stack:
            opener = stack.pop()
            if opener is not None:
                found.append((opener[0], opener[1], match.start()))
    for match in _BARE_BOX.finditer(text):
        found.append((match.start(), match.start(1), match.end(1)))
    found.sort(key=lambda box: (box[2], -box[0]))
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``), escaped
    braces ``\\{ \\}`` count as text, a box never closed is ignored, and the brace-less
    ``\\boxed 5`` is read too.  Returns the stripped content, or ``None`` when there is
    no complete, non-empty box.
    """
    text = clip_tail(text)
    for _start, content_start, content_end in reversed(_boxes(text)):
        content = text[content_start:content_end].strip()
        if content:
            return content
    return None


# --- <answer>...</answer> ----------------------------------------------------------

_ANSWER_TAG = re.compile(r"<\s*(/?)\s*answer\s*>", re.IGNORECASE)


def _answer_tags(text: str) -> list[tuple[int, str]]:
    """Every ``<answer>...</answer>`` pair as ``(start, content)``, in order.

    A closing tag pairs with the last opening tag before it; one linear pass.
    """
    pairs: list[tuple[int, str]] = []
    open_at: tuple[int, int] | None = None
    for match in _ANSWER_TAG.finditer(text):
        if not match.group(1):
            open_at = (match.start(), match.end())
        elif open_at is not None:
            pairs.append((open_at[0], text[open_at[1] : match.start()]))
            open_at = None
    return pairs


def answer_tag(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` (any case).

    Returns ``None`` when there is none or it is empty.
    """
    for _start, content in reversed(_answer_tags(clip_tail(text))):
        if content.strip():
            return content.strip()
    return None


# --- ANSWER: lines -----------------------------------------------------------------

# A line that starts (after list / quote / bold markers) with "Answer", "Final answer",
# "The answer", "Correct answer" ... and a colon.  Anchored at the line start, so the
# leading run of markers is the only repetition that can backtrack (linear per line).
_ANSWER_LINE = re.compile(
    r"^[\s>#*_\-]*(?:(?:the|my)\s+)?(?:(?:final|correct)\s+)?answer[\s*_]*[:：]\s*(.*)$",
    re.IGNORECASE,
)


# How many lines below a bare "Final answer:" label the answer may sit.
_LABEL_LOOKAHEAD = 4


def _strip_markup(value: str) -> str:
    """Remove surrounding whitespace and markdown bold / italic markers."""
    value = value.strip()
    while True:
        before = value
        for marker in ("**", "__"):
            if value.startswith(marker):
                value = value[len(marker) :].strip()
            if value.endswith(marker):
                value = value[: -len(marker)].strip()
        if value == before:
            return value


def _answer_lines(text: str) -> list[tuple[int, str]]:
    """Every answer line as ``(offset, content)``, in order.

    When the label stands alone (``Final answer:`` then the answer below), the content
    is the next non-empty line (within a few lines).
    """
    found: list[tuple[int, str]] = []
    lines = text.splitlines(keepends=True)
    offset = 0
    for index, line in enumerate(lines):
        match = _ANSWER_LINE.match(line.rstrip("\r\n"))
        if match:
            content = _strip_markup(match.group(1))
            if not content:
                # A few lines at most: many bare labels must not make this quadratic.
                for following in lines[index + 1 : index + 1 + _LABEL_LOOKAHEAD]:
                    if following.strip():
                        content = _strip_markup(following)
                        break
            if content:
                found.append((offset, content))
        offset += len(line)
    return found


def answer_line(text: str) -> str | None:
    """The content of the last ``ANSWER: ...`` line (case-insensitive).

    Also ``Answer: ...``, ``Final answer: ...``, ``**Answer:** ...``,
    ``**Final Answer**: ...`` and ``- Answer: ...``; bold markers around the content
    are removed.  A label alone on its line takes the next non-empty line.  Returns
    ``None`` when no such line has content.
    """
    found = _answer_lines(clip_tail(text))
    return found[-1][1] if found else None


# --- multiple-choice letters -------------------------------------------------------

# LaTeX wrappers a letter is often dressed in: \text{B}, \textbf{B}, \mathrm{B}, \boxed{B}.
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|boxed|fbox)\s*\{([^{}]*)\}")
# A letter at the start of an answer, with its optional bracket and what follows it.
_LEAD_LETTER = re.compile(r"(?:(?:option|choice)\s+)?[(\[]?\s*([A-Za-z])(?![A-Za-z0-9'])(.*)", re.I)
# Words after which a standalone "A" or "I" is still the answer, not an article/pronoun.
_AFTER_LETTER_WORDS = frozenset({"is", "and", "because", "since", "as", "which", "-", "--"})
# "the answer is B", "the correct option would be (C)", ...
_ANSWER_IS = re.compile(
    r"\b(?:answer|option|choice)\s+(?:is|would\s+be|should\s+be|will\s+be)\b\s*:?[ \t]*([^\n]*)",
    re.IGNORECASE,
)
# A box longer than this cannot hold just a letter (``\\boxed{\\textbf{(B)}}`` is short).
_MAX_LETTER_BOX = 200
# "... so, ANSWER: B" in the middle of a line (line-start labels are read as lines).
_INLINE_ANSWER = re.compile(r"\banswer[ \t*_]*[:：][ \t]*([^\n]*)", re.IGNORECASE)
# The loose forms, read from the final line only: "**B**", "(B)", "B.", "Option B".
_FINAL_LINE_LETTER = re.compile(
    r"^[*_]*\s*(?:(?:option|choice)\s+)?(?:\(([A-Z])\)|([A-Z]))[.):]?\s*[*_]*\s*\.?$",
    re.IGNORECASE,
)


def _clean_letter_text(value: str) -> str:
    """Strip markdown and LaTeX dressing around a short answer."""
    value = value.strip()
    # Unwrap innermost-first; bounded because each pass removes one wrapper.
    for _ in range(4):
        unwrapped = _WRAPPER.sub(r"\1", value)
        if unwrapped == value:
            break
        value = unwrapped
    for noise in ("$", "**", "__", "\\(", "\\)", "\\[", "\\]"):
        value = value.replace(noise, "")
    return value.strip()


def _letter_in(value: str, allowed: str) -> str | None:
    """The answer letter that ``value`` (an answer's content) starts with, if any.

    Accepted: the letter alone in any case (``b``, ``(B)``, ``B.``), or an upper-case
    letter followed by a delimiter and more text (``B) 42``, ``(C) Paris``,
    ``D: none``).  An upper-case letter followed by a space and a word counts unless it
    is "A" or "I" starting an ordinary sentence ("A car ..."): for those the next word
    must be one like "is" or "because".
    """
    value = _clean_letter_text(value)
    match = _LEAD_LETTER.match(value)
    if not match:
        return None
    letter, rest = match.group(1), match.group(2)
    upper = letter.upper()
    if upper not in allowed:
        return None
    rest_stripped = rest.strip()
    if not rest_stripped.strip(".:;,)]!*"):
        return upper  # the letter alone, punctuation aside
    if letter != upper:
        return None  # a lower-case letter followed by words: an article or a variable
    if rest[:1] in ")].:,;":
        return upper
    if not rest[:1].isspace():
        return None
    if upper not in "AI":
        return upper
    next_word = rest_stripped.split(maxsplit=1)[0].lower().strip(",.;:")
    return upper if next_word in _AFTER_LETTER_WORDS else None


def extract_letter(text: str, n_choices: int) -> str | None:
    """The multiple-choice letter a reply settles on, or ``None``.

    Only the first ``n_choices`` letters count.  Explicit forms come first and the last
    one in the text wins: ``ANSWER: X`` (``Answer: (B)``, ``**Final Answer:** C``, also
    mid-line), ``the answer is B``, ``\\boxed{B}`` / ``\\boxed{\\text{B}}`` and
    ``<answer>B</answer>``.  Only when there is none are loose forms read, from the
    final non-empty line alone: ``**B**``, ``(B)``, ``B.`` or ``Option B``.  A letter
    must stand on its own: the "A" of "A car" is not an answer.
    """
    return letter_reading(text, n_choices, "conductor")[0]


def _conductor_letter(body: str, allowed: str) -> tuple[str, str] | None:
    """:func:`extract_letter`'s reading of ``body``: ``(letter, the text it was read
    from)``, or ``None``."""
    explicit: list[tuple[int, str, str]] = []
    for offset, content in _answer_lines(body):
        letter = _letter_in(content, allowed)
        if letter:
            explicit.append((offset, letter, content))
    for match in _INLINE_ANSWER.finditer(body):
        letter = _letter_in(match.group(1), allowed)
        if letter:
            explicit.append((match.start(), letter, match.group(1)))
    for match in _ANSWER_IS.finditer(body):
        letter = _letter_in(match.group(1), allowed)
        if letter:
            explicit.append((match.start(), letter, match.group(1)))
    for start, content_start, content_end in _boxes(body):
        if content_end - content_start > _MAX_LETTER_BOX:
            continue  # far too long to be a letter; do not copy it
        content = body[content_start:content_end]
        letter = _letter_in(content, allowed)
        if letter:
            explicit.append((start, letter, content))
    for start, content in _answer_tags(body):
        letter = _letter_in(content, allowed)
        if letter:
            explicit.append((start, letter, content))
    if explicit:
        # max() keeps the first of equal offsets; all of them name the same spot.
        _offset, letter, content = max(explicit, key=lambda item: item[0])
        return letter, content

    lines = [line for line in body.splitlines() if line.strip()]
    if not lines:
        return None
    final = _FINAL_LINE_LETTER.match(lines[-1].strip())
    if not final:
        return None
    letter = final.group(1) or final.group(2)
    # Loose forms demand the capital letter unless it is in brackets: a lone "a" line
    # is more likely a stray word than an answer.
    if final.group(2) and not letter.isupper():
        return None
    return (letter.upper(), lines[-1]) if letter.upper() in allowed else None


def letter_reading(text: str, n_choices: int, extraction: str) -> tuple[str | None, str | None]:
    """The letter a reply settles on, read as ``extraction`` says (:data:`EXTRACTIONS`:
    :func:`official_letter` or :func:`extract_letter`), and the text it was read from
    (an answer's content, or the line holding the letter); ``(None, None)`` when no
    letter is read.  The text is where the hedge rule looks (:func:`hedge_in`)."""
    if n_choices <= 0:
        return None, None
    body = strip_think(clip_tail(text))
    found = (
        _official_letter(body, n_choices)
        if check_extraction(extraction) == "official"
        else _conductor_letter(body, _LETTERS[: min(n_choices, len(_LETTERS))])
    )
    return found if found is not None else (None, None)


# --- multiple-choice letters as the reference harness reads them -----------------


@functools.lru_cache(maxsize=8)
def _official_letter_patterns(n_choices: int) -> tuple[re.Pattern[str], ...]:
    """lighteval's English letter-extraction rules for ``n_choices`` options (its
    ``IndicesExtractionConfig("NativeLetters", try_extract_without_anchor=True)``, which
    its GPQA-Diamond and MMLU generative metrics use), most trusted first.

    A letter is a capital ``A`` .. or the same in brackets, ``(A)``; lower case never
    counts.  Each pattern holds one group, ``letter``.  The first
    :data:`_ANCHORED_PATTERNS` start at an answer phrase.
    """
    letters = _LETTERS[: min(n_choices, len(_LETTERS))]
    index = "(?P<letter>" + "|".join(f"{c}|\\({c}\\)" for c in letters) + ")"
    # What may follow a letter that stands alone: a full stop, a comma, a colon (maybe
    # after a space), a space, or the end of the text; bold markers around it are kept
    # out of the way.
    after = r"(?:\*\*)?(?:\.|,|\s?:| |$)"
    alone = rf"(?:^| )(?:\*\*)?{index}{after}"
    return tuple(
        re.compile(pattern)
        for pattern in (
            rf"(?i:final answer is):?\s*{index}\.?\s?I hope",
            rf"(?i:final answer.{{0,100}}?)\s+is:?\s*{index}",
            rf"(?i:answer)\s?:.{{0,50}}?{alone}",
            rf"(?i:answer).{{0,50}}?{alone}",
            rf"^(?:\*\*)?{index}{after}",
            rf"\n(?:\*\*)?{index}{after}",
            alone,
            # No anchor at all: any capital letter among the options, even inside a word.
            index,
        )
    )


# How many of _official_letter_patterns begin at an answer phrase ("final answer is",
# "answer:"); the others begin at the letter.
_ANCHORED_PATTERNS = 4


def official_letter(text: str, n_choices: int) -> str | None:
    """The letter the reference harness (lighteval) reads from a reply, or ``None``.

    The rules are tried in order (:func:`_official_letter_patterns`); the first that
    matches anywhere decides, and among its matches the one ending last (of those, the
    one starting first) wins.  The last resort is any capital option letter at all, so
    a reply with no answer but a word such as "After" still yields "A": that is the
    reference's behaviour, kept so that scores compare; ``extraction: conductor``
    (:func:`extract_letter`) refuses such replies.  Reasoning blocks are ignored.
    """
    return letter_reading(text, n_choices, "official")[0]


def _official_letter(body: str, n_choices: int) -> tuple[str, str] | None:
    """:func:`official_letter`'s reading of ``body``: ``(letter, the text it was read
    from)``: from the answer phrase to the end of its line for the anchored rules, the
    whole line holding the letter for the others."""
    for rank, pattern in enumerate(_official_letter_patterns(n_choices)):
        best: re.Match[str] | None = None
        for match in pattern.finditer(body):
            if best is None or match.end() > best.end():
                best = match
        if best is not None:
            at = best.start("letter")
            start = best.start() if rank < _ANCHORED_PATTERNS else body.rfind("\n", 0, at) + 1
            end = body.find("\n", at)
            clause = body[start : end if end >= 0 else len(body)]
            return best.group("letter").strip("()"), clause
    return None


# --- math answers ------------------------------------------------------------------


def extract_math_answer(text: str) -> str | None:
    """The final answer of a math reply, as written (LaTeX kept), or ``None``.

    Reasoning blocks are ignored.  Looks, in order, for the last
    ``<answer>...</answer>`` (a ``\\boxed{}`` inside it is unwrapped), the last
    ``\\boxed{...}``, then the last ``ANSWER: ...``: at the start of any line, or
    anywhere in a line of the final paragraph ("Therefore the final answer: 42.").
    """
    body = strip_think(clip_tail(text))
    tagged = answer_tag(body)
    if tagged is not None:
        return last_boxed(tagged) or tagged
    boxed = last_boxed(body)
    if boxed is not None:
        return boxed
    line = _last_answer(body)
    if line is not None:
        return last_boxed(line) or line
    return None


# The last "answer:" label of a line and what follows it (the greedy prefix finds the
# last one; a single match attempt per line keeps it linear).
_LAST_INLINE_ANSWER = re.compile(r".*\banswer[ \t*_]*[:：][ \t]*(.*)", re.IGNORECASE)
_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")


def _final_paragraph_start(text: str) -> int:
    """Where the last paragraph (the text after the last blank line) starts."""
    end = len(text.rstrip())
    start = 0
    for match in _BLANK_LINE.finditer(text, 0, end):
        start = match.end()
    return start


def _last_answer(text: str) -> str | None:
    """The last ``ANSWER: ...``: an answer line anywhere (see :func:`answer_line`), or
    an ``answer:`` label in the middle of a line of the final paragraph ("So the final
    answer: 42."), whichever comes last."""
    found = _answer_lines(text)
    start = _final_paragraph_start(text)
    offset = start
    for line in text[start:].splitlines(keepends=True):
        # Also on answer lines: "Answer: 3, no, the answer: 4" ends with 4.
        match = _LAST_INLINE_ANSWER.match(line)
        content = _strip_markup(match.group(1)) if match else ""
        if match and content:
            found.append((offset + match.start(1), content))
        offset += len(line)
    return max(found, key=lambda item: item[0])[1] if found else None


# --- hedges: answers that name several options ------------------------------------
#
# One rule for every grader: an answer that names two or more different options ("yes
# or no", "A/B", "\boxed{3} or \boxed{4}") is wrong.  This section finds where a reply
# states its answer (answer_places) and which options one stated answer names
# (named_options, hedge_in); what an option is (a letter, a value, a word) is the
# grader's, passed in as a Recognise function.


class Part(NamedTuple):
    """One alternative of an answer, as :func:`named_options` hands it to a grader.

    ``text`` is the alternative with the words around it that name nothing ("maybe",
    "I think", "the answer is", a leading "or") taken off; ``alternative`` says whether
    its sentence offers a choice with a word such as "or", "either", "both", "vs", or a
    slash.  A comma alone separates parts too, but "Paris, France" names one place: a
    grader of open-ended words counts a part only in a sentence that offers a choice.
    """

    text: str
    alternative: bool


#: Turns one :class:`Part` into the options it names (hashable keys that compare equal
#: for the same option, "3" and "3.0" alike); nothing for a part that names none.
Recognise = Callable[[Part], Iterable[Hashable]]

# Nesting deeper than this is read as plain text (bounds the recursion).
_MAX_DEPTH = 6

# Words that put alternatives side by side.  Each begins a new part (and is then taken
# off it, a denial such as "nor" marking the part as denied).
_JOINERS = frozenset((
    "or", "and", "either", "neither", "nor", "both", "vs", "versus", "unless", "but",
    "otherwise", "alternatively", "else",
))  # fmt: skip
# Joiners that make a list a choice between alternatives rather than an enumeration.
_ALTERNATION = _JOINERS - {"and", "but"}
# A part whose first word (after joiners and fillers) is one of these names nothing: it
# denies ("B, not A", "neither yes nor no", "B, rather than A").  "no" is no denial:
# it is an answer.
_NEGATIONS = frozenset((
    "not", "never", "isnt", "arent", "wasnt", "werent", "dont", "doesnt", "didnt",
    "neither", "nor", "except", "excluding", "without", "hardly", "cannot", "cant",
))  # fmt: skip
_NEGATION_PAIRS = frozenset({("rather", "than"), ("instead", "of"), ("other", "than")})
# Words around an option that name none (hedging, lead-ins, filler); compared in lower
# case without apostrophes.  None of them is an answer a grader reads.
_FILLERS = frozenset((
    "maybe", "perhaps", "possibly", "probably", "likely", "unlikely", "most", "more",
    "less", "least", "at", "very", "quite", "rather", "equivalently", "exactly", "just",
    "simply", "only", "definitely", "certainly", "surely", "presumably", "possible",
    "potentially", "also", "then", "so", "thus", "hence", "therefore", "ie", "eg",
    "actually", "really", "honestly", "approximately", "about", "around", "roughly",
    "nearly", "almost", "i", "id", "im", "ive", "think", "guess", "believe", "suppose",
    "say", "go", "with", "would", "could", "might", "may", "should", "will", "must", "can",
    "be", "been", "it", "its", "is", "was", "are", "were", "that", "thats", "this", "the",
    "an", "answer", "final", "my", "we", "get", "got", "ok", "okay", "well", "hmm", "um",
    "uh", "here", "there", "theres", "result", "value", "gives", "equals",
))  # fmt: skip
# LaTeX spellings of joiners: \text{ or }, \textrm{and}, \lor, \vee, and the spacing
# around them.
_LATEX_JOINER = re.compile(
    r"\\(?:text|textrm|textbf|textit|mathrm|mbox)\s*\{\s*([A-Za-z][A-Za-z ,]*?)\s*\}"
    r"|\\(?:lor|vee)(?![A-Za-z])|\\q?quad(?![A-Za-z])"
)
_ENVIRONMENT = re.compile(r"\\(begin|end)\s*\{[^{}]{0,40}\}")
_BOX_BEFORE = re.compile(r"\\(?:boxed|fbox)\s*$")
# Where a stated answer restates or settles ("3 or 4 apples: 3", "A or B? B").
_RESTATE = re.compile(r"(?<!\\)[:：?](?=\s|$)")
# Where a sentence ends (a full stop before a space: not a decimal point, not "e.g.").
_SENTENCE_END = re.compile(r"(?<!\.\w)(?<!\bvs)[.!](?=\s)")
# Where one part ends and the next begins: punctuation (not a thousands separator and
# not LaTeX spacing), a pipe between spaces, a slash between words (tested apart), or
# a joining or denying word (kept at the start of the next part, which it describes).
_SEPARATING_WORDS = sorted(_JOINERS) + [
    "not", "never", "cannot", "except", "excluding", "without", "hardly",
    r"(?:is|are|was|were|do|does|did|ca)n['’]?t", r"rather\s+than", r"instead\s+of",
    r"other\s+than",
]  # fmt: skip
_SEPARATOR = re.compile(
    r"(?<!\\)[;\n&]|(?<!\\),(?!\d{3}(?!\d))|\s\|\s|/"
    r"|(?<![\w\\])(?:" + "|".join(_SEPARATING_WORDS) + r")(?![\w'])",
    re.IGNORECASE,
)
# A plain word (not a LaTeX command), apostrophes inside kept.
_PLAIN_WORD = re.compile(r"(?<![\w\\])[A-Za-z]+(?:['’][A-Za-z]+)*(?!\w)")
# What may sit between the words taken off a part's ends: space, markup, punctuation.
_SKIPPABLE = re.compile(r"[\s*_`'\"~,;:.!?\-–—’“”]*")


def _word_key(word: str) -> str:
    return word.lower().replace("'", "").replace("’", "")


def _latex_joiner(match: re.Match[str]) -> str:
    """``\\text{ or }`` -> `` or ``; a ``\\text{}`` of other words (a unit) is kept."""
    words = match.group(1)
    if words is None:
        return " or " if "q" not in match.group(0) else " "
    if all(_word_key(w) in _JOINERS | _FILLERS for w in words.replace(",", " ").split()):
        return f" {words} "
    return match.group(0)


def _groups(text: str) -> list[tuple[int, int]]:
    """The outermost bracketed groups of ``text`` as ``(open, close)`` indices (the
    close is one past the closing bracket), in order.  Any of ``( [ {`` pairs with any
    of ``) ] }`` (``[1,3)`` is an interval) and ``\\begin{..}`` with ``\\end{..}``;
    a bracket never matched is plain text.  One pass with a stack."""
    stack: list[int] = []
    pairs: list[tuple[int, int]] = []
    environments = {m.start(): m for m in _ENVIRONMENT.finditer(text)}
    index = 0
    while index < len(text):
        env = environments.get(index)
        if env is not None:
            if env.group(1) == "begin":
                stack.append(index)
            elif stack:
                pairs.append((stack.pop(), env.end()))
            index = env.end()
            continue
        char = text[index]
        if char in "([{":
            stack.append(index)
        elif char in ")]}" and stack:
            pairs.append((stack.pop(), index + 1))
        index += 1
    # Openers left on the stack were never closed: the pairs inside them are outermost.
    outer: list[tuple[int, int]] = []
    reach = -1
    for start, end in sorted(pairs):
        if start >= reach:
            outer.append((start, end))
            reach = end
    return outer


def _mask(text: str, groups: list[tuple[int, int]]) -> str:
    """``text`` with everything inside ``groups`` blanked (same length), so that the
    separators found in it are those outside every bracket."""
    pieces: list[str] = []
    last = 0
    for start, end in groups:
        pieces.append(text[last:start])
        pieces.append(text[start] + "\0" * (end - start - 2) + text[end - 1])
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _spans(masked: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """``masked[start:end]`` cut at every match of ``pattern`` (the match dropped)."""
    spans: list[tuple[int, int]] = []
    at = start
    for match in pattern.finditer(masked, start, end):
        spans.append((at, match.start()))
        at = match.end()
    spans.append((at, end))
    return spans


def _separates(masked: str, match: re.Match[str]) -> bool:
    """Whether a separator match really separates: a slash only between words, and not
    between two lone lower-case letters (``a/b`` is a quotient)."""
    if match.group(0) != "/":
        return True
    before = masked[: match.start()].rstrip()
    after = masked[match.end() :].lstrip()
    if not (before[-1:].isalpha() and after[:1].isalpha()):
        return False
    lone_before = before[-1].islower() and not before[-2:-1].isalpha()
    lone_after = after[0].islower() and not after[1:2].isalpha()
    return not (lone_before and lone_after)


def _trim(text: str) -> tuple[str, bool]:
    """``(the part without the words around its option, whether it is a denial)``."""
    words = list(_PLAIN_WORD.finditer(text))
    start, end = 0, len(text)
    first, last = 0, len(words)
    denied = False
    while first < last:
        word = words[first]
        if not _SKIPPABLE.fullmatch(text, start, word.start()):
            break
        key = _word_key(word.group(0))
        following = _word_key(words[first + 1].group(0)) if first + 1 < last else ""
        if key in _NEGATIONS or (key, following) in _NEGATION_PAIRS:
            denied = True
            break
        # "I" alone may be a choice letter; "I think" is not.
        if key not in _JOINERS and (key not in _FILLERS or (key == "i" and not following)):
            break
        start = word.end()
        first += 1
    while last > first and not denied:
        word = words[last - 1]
        if not _SKIPPABLE.fullmatch(text, word.end(), end):
            break
        key = _word_key(word.group(0))
        if key not in _FILLERS or (key == "i" and last - 1 == first):
            break
        end = word.start()
        last -= 1
    core = text[start:end].strip()
    return core.strip("*_`~,;:.!?-–— \t"), denied


def _starts_with(text: str, words: frozenset[str]) -> bool:
    first = _PLAIN_WORD.search(text)
    return bool(
        first
        and _SKIPPABLE.fullmatch(text, 0, first.start())
        and _word_key(first.group(0)) in words
    )


# A later sentence joins the answer's first when it is this short ("Yes. No.", "A. Or B.")
_SHORT_SENTENCE = 3
_CONTINUATIONS = _JOINERS | frozenset(
    ["maybe", "perhaps", "possibly", "probably", "also", "could", "might", "may"]
)


def named_options(
    clause: str, recognise: Recognise, *, first_sentence: bool = False
) -> dict[Hashable, str]:
    """The options one stated answer names, each with the text that named it first.

    The answer is cut into alternatives at joining words ("or", "and", "either",
    "both", "neither", "nor", "vs", "unless", "but"), commas, semicolons, slashes
    between words, line breaks, sentence ends and ``\\\\boxed{}`` groups; a bracketed
    group that opens with such a word ("(or 4)", "(not A)") is an alternative of its
    own, any other bracket is part of the text around it (``(1, 2)`` is one tuple).
    From each alternative the words that name nothing are taken off ("maybe", "at
    least", "I think", "the answer is"); one that then begins with a denial ("not A",
    "rather than A", "neither ... nor ...") names nothing; ``recognise`` says which
    options each of the others names.

    A colon or question mark restates: when what follows it names only options named
    before it ("3 or 4 apples: 3", "A or B? B"), those are the answer's; otherwise both
    sides count ("not sure: B or D", "yes: no").  With ``first_sentence``, a later
    sentence counts only when it is short or opens with "or", "maybe", "also" and the
    like ("Answer: D. I ruled out A and B." names D alone).
    """
    return _clause_options(clause, recognise, first_sentence, 0)


def _clause_options(
    clause: str, recognise: Recognise, first_sentence: bool, depth: int
) -> dict[Hashable, str]:
    text = _LATEX_JOINER.sub(_latex_joiner, clause)
    groups = _groups(text) if depth < _MAX_DEPTH else []
    masked = _mask(text, groups)
    found: dict[Hashable, str] = {}
    for seg_start, seg_end in _spans(masked, _RESTATE, 0, len(masked)):
        named: dict[Hashable, str] = {}
        sentences = _spans(masked, _SENTENCE_END, seg_start, seg_end)
        for index, (start, end) in enumerate(sentences):
            sentence = text[start:end]
            if (
                first_sentence
                and index > 0
                and len(_PLAIN_WORD.findall(sentence)) + len(re.findall(r"\d+", sentence))
                > _SHORT_SENTENCE
                and not _starts_with(sentence, _CONTINUATIONS)
            ):
                continue
            _merge(named, _sentence_options(text, masked, groups, start, end, recognise, depth))
        if named and found and named.keys() <= found.keys():
            found = named  # a restatement settles on what it names
        else:
            _merge(found, named)
    return found


def _merge(into: dict[Hashable, str], more: dict[Hashable, str]) -> None:
    """Add ``more``'s options to ``into``, keeping the text that named each first."""
    for key, shown in more.items():
        into.setdefault(key, shown)


def _sentence_options(
    text: str,
    masked: str,
    groups: list[tuple[int, int]],
    start: int,
    end: int,
    recognise: Recognise,
    depth: int,
) -> dict[Hashable, str]:
    """The options named by the sentence ``text[start:end]``."""
    cuts: list[tuple[int, int]] = []  # (where a part ends, where the next begins)
    alternative = False
    for match in _SEPARATOR.finditer(masked, start, end):
        if not _separates(masked, match):
            continue
        token = match.group(0)
        if token[:1].isalpha():
            cuts.append((match.start(), match.start()))  # the word opens the next part
            alternative = alternative or token.lower() in _ALTERNATION
        else:
            cuts.append((match.start(), match.end()))
            alternative = alternative or token.strip() in ("/", "|")
    named: dict[Hashable, str] = {}
    at = start
    for part_end, next_start in [*cuts, (end, end)]:
        _merge(named, _part_options(text, groups, at, part_end, alternative, recognise, depth))
        at = next_start
    return named


def _part_options(
    text: str,
    groups: list[tuple[int, int]],
    start: int,
    end: int,
    alternative: bool,
    recognise: Recognise,
    depth: int,
) -> dict[Hashable, str]:
    """The options named by the part ``text[start:end]`` and by the groups in it that
    are alternatives of their own (a box's content, "(or 4)")."""
    own: list[str] = []
    nested: list[str] = []
    at = start
    # Only the groups inside this part (groups are in order and do not overlap).
    first = bisect.bisect_left(groups, (start, start))
    for g_start, g_end in groups[first:]:
        if g_end > end:
            break
        inner = text[g_start + 1 : g_end - 1]
        boxed = _BOX_BEFORE.search(text, at, g_start)
        if boxed is None and not _starts_with(inner, _JOINERS | _FILLERS | _NEGATIONS):
            continue
        own.append(text[at : boxed.start() if boxed else g_start])
        nested.append(inner)
        at = g_end
    own.append(text[at:end])
    core, denied = _trim(" ".join(own))
    if denied:
        return {}
    named: dict[Hashable, str] = {}
    if core:
        for key in recognise(Part(core, alternative)):
            named.setdefault(key, core)
    for inner in nested:
        _merge(named, _clause_options(inner, recognise, False, depth + 1))
    return named


def hedge_in(
    places: Iterable[Iterable[str]], recognise: Recognise, *, first_sentence: bool = False
) -> dict[Hashable, str] | None:
    """The options of the first place that names two or more different ones, or ``None``.

    A place is where a reply states its answer (:func:`answer_places`), as one or more
    texts read together (every ``\\\\boxed{}`` of a reply is one place); the options of
    each text are :func:`named_options`'.  This is the hedge rule every grader applies:
    an answer naming several options ("yes or no", "A/B", "3 or 4") is not an answer.
    """
    for place in places:
        named: dict[Hashable, str] = {}
        for clause in place:
            _merge(named, named_options(clause, recognise, first_sentence=first_sentence))
        if len(named) >= 2:
            return named
    return None


def _outer_boxes(text: str) -> list[str]:
    """The stripped, non-empty contents of the boxes of ``text`` not inside another."""
    contents: list[str] = []
    reach = -1
    for _start, content_start, content_end in sorted(_boxes(text), key=lambda b: (b[0], -b[2])):
        if content_end <= reach:
            continue  # inside the box before it
        reach = content_end
        content = text[content_start:content_end].strip()
        if content:
            contents.append(content)
    return contents


def answer_places(text: str) -> list[list[str]]:
    """Where a reply states its final answer, for the hedge rule (:func:`hedge_in`).

    The last ``<answer>`` tag's content, when there is one, is the only place (its
    boxes, if any, read together).  Otherwise: every ``\\\\boxed{}`` of the reply read
    together (math-verify reads several boxes as one set of answers, so boxes that
    disagree are a hedge even when the later one looks like a correction); the last
    ``ANSWER:`` label (as :func:`extract_math_answer` finds it); the last "the answer
    is ..." phrase; and, for a reply with none of these, its last non-empty line.
    Reasoning blocks are ignored.
    """
    body = strip_think(clip_tail(text))
    tagged = [content for _start, content in _answer_tags(body) if content.strip()]
    if tagged:
        boxes = _outer_boxes(tagged[-1])
        return [boxes] if boxes else [[tagged[-1].strip()]]
    places: list[list[str]] = []
    boxes = _outer_boxes(body)
    if boxes:
        places.append(boxes)
    label = _last_answer(body)
    if label:
        places.append([label])
    phrase: str | None = None
    for match in _ANSWER_IS.finditer(body):
        phrase = match.group(1).strip() or phrase
    if phrase:
        places.append([phrase])
    if not places:
        lines = [line for line in body.splitlines() if line.strip()]
        if lines:
            places.append([lines[-1]])
    return places


# A run of choice letters and nothing else: "A B C D", "A/B", "(A), (C)", "ABCD".
_LETTER_RUN = re.compile(r"[^\w\\]*(?:[A-Za-z][^\w\\]*)+")
# A letter that opens an option's text: "B) 42", "(C) Paris", "D: none".
_LETTER_LEAD = re.compile(r"[(\[]?([A-Z])[)\].:]\s+\S")
_LETTER_WORDS = re.compile(r"^(?:(?:option|choice|letter)s?\s+)+", re.IGNORECASE)


def letter_options(part: Part, n_choices: int) -> list[str]:
    """The choice letters one part of an answer names (a :data:`Recognise` for the
    choice grader): a letter on its own (``B``, ``(b)``, ``**B.**``, ``option B``,
    ``\\\\text{B}``), a run of letters and punctuation only (``A B C D``, ``A/B``,
    ``ABCD`` in capitals), or a capital letter that opens an option's text (``B) 42``).
    Only the first ``n_choices`` letters count."""
    allowed = _LETTERS[: min(max(n_choices, 0), len(_LETTERS))]
    value = _LETTER_WORDS.sub("", _clean_letter_text(part.text)).strip()
    letters: list[str] = []
    if _LETTER_RUN.fullmatch(value):
        words = re.findall(r"[A-Za-z]+", value)
        if all(len(word) == 1 for word in words):
            letters = [word.upper() for word in words]
        elif len(words) == 1 and words[0].isupper():
            letters = list(words[0])
    else:
        lead = _LETTER_LEAD.match(value)
        if lead:
            letters = [lead.group(1)]
    return [letter for letter in letters if letter in allowed]
