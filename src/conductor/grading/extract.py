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

import functools
import re
import string

from conductor.text import strip_think

__all__ = [
    "EXTRACTIONS",
    "MAX_RESPONSE_CHARS",
    "check_extraction",
    "answer_line",
    "answer_tag",
    "clip_tail",
    "extract_letter",
    "extract_math_answer",
    "last_boxed",
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
    mid-line),
        ``the answer is B``, ``\\boxed{B}`` / ``\\boxed{\\text{B}}`` and
        ``<answer>B</answer>``.  Only when there is none are loose forms read, from the
        final non-empty line alone: ``**B**``, ``(B)``, ``B.`` or ``Option B``.  A letter
        must stand on its own: the "A" of "A car" is not an answer.
    """
    if n_choices <= 0:
        return None
    allowed = _LETTERS[: min(n_choices, len(_LETTERS))]
    body = strip_think(clip_tail(text))

    explicit: list[tuple[int, str]] = []
    for offset, content in _answer_lines(body):
        letter = _letter_in(content, allowed)
        if letter:
            explicit.append((offset, letter))
    for match in _INLINE_ANSWER.finditer(body):
        letter = _letter_in(match.group(1), allowed)
        if letter:
            explicit.append((match.start(), letter))
    for match in _ANSWER_IS.finditer(body):
        letter = _letter_in(match.group(1), allowed)
        if letter:
            explicit.append((match.start(), letter))
    for start, content_start, content_end in _boxes(body):
        if content_end - content_start > _MAX_LETTER_BOX:
            continue  # far too long to be a letter; do not copy it
        letter = _letter_in(body[content_start:content_end], allowed)
        if letter:
            explicit.append((start, letter))
    for start, content in _answer_tags(body):
        letter = _letter_in(content, allowed)
        if letter:
            explicit.append((start, letter))
    if explicit:
        # max() keeps the first of equal offsets; all of them name the same spot.
        return max(explicit, key=lambda item: item[0])[1]

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
    return letter.upper() if letter.upper() in allowed else None


# --- multiple-choice letters as the reference harness reads them -----------------


@functools.lru_cache(maxsize=8)
def _official_letter_patterns(n_choices: int) -> tuple[re.Pattern[str], ...]:
    """lighteval's English letter-extraction rules for ``n_choices`` options (its
    ``IndicesExtractionConfig("NativeLetters", try_extract_without_anchor=True)``, which
    its GPQA-Diamond and MMLU generative metrics use), most trusted first.

    A letter is a capital ``A`` .. or the same in brackets, ``(A)``; lower case never
    counts.  Each pattern holds one group, ``letter``.
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


def official_letter(text: str, n_choices: int) -> str | None:
    """The letter the reference harness (lighteval) reads from a reply, or ``None``.

    The rules are tried in order (:func:`_official_letter_patterns`); the first that
    matches anywhere decides, and among its matches the one ending last (of those, the
    one starting first) wins.  The last resort is any capital option letter at all, so
    a reply with no answer but a word such as "After" still yields "A": that is the
    reference's behaviour, kept so that scores compare; ``extraction: conductor``
    (:func:`extract_letter`) refuses such replies.  Reasoning blocks are ignored.
    """
    if n_choices <= 0:
        return None
    body = strip_think(clip_tail(text))
    for pattern in _official_letter_patterns(n_choices):
        best: re.Match[str] | None = None
        for match in pattern.finditer(body):
            if best is None or match.end() > best.end():
                best = match
        if best is not None:
            return best.group("letter").strip("()")
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
