"""The range of every count a user gives: one table, read by the command line's options
and by every configuration file's reader.

A count with no upper bound is a run without end (``epochs:
99999999999999999999999999999`` was accepted and ran on) or a traceback (a 5,000-digit
``max_concurrency``: ``int()`` refuses numbers that long).  Every integer a user gives
is therefore read against a :class:`Bound`, and the configuration files' reader
(:meth:`conductor.configfile.ConfigReader.integer`) takes one as a required argument, so
that no count can be added without stating its range.  The ranges are far beyond any
real use and small enough that the largest of them still ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import UsageError

__all__ = [
    "BATCH",
    "BODY_BYTES",
    "CALLS",
    "CHARS",
    "CONCURRENCY",
    "CONTEXT_TOKENS",
    "EPOCHS",
    "GPU_LAYERS",
    "GROUP_SIZE",
    "LENGTH",
    "NGRAM",
    "POOL_SIZE",
    "QUEUE",
    "RETRIES",
    "ROUNDS",
    "SAMPLES",
    "SEED",
    "SHARDS",
    "STEPS",
    "THREADS",
    "TOKENS",
    "TRAIN_STEPS",
    "STALENESS",
    "VOTES",
    "Bound",
    "parse_count",
    "shown_number",
]


@dataclass(frozen=True)
class Bound:
    """The integers from ``low`` to ``high``, both included."""

    low: int
    high: int

    def __contains__(self, value: object) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
        )

    def describe(self) -> str:
        """``an integer from 1 to 1,000``, as a message states the range."""
        return f"an integer from {self.low:,} to {self.high:,}"


#: Repeats of each sample of a benchmark (``epochs``, ``--epochs``).
EPOCHS = Bound(1, 1_000)
#: How many samples or rows are read (``--limit``, a data mix's ``limit``).
SAMPLES = Bound(1, 1_000_000_000)
#: Steps of one workflow (``max_steps``, ``--max-steps``).
STEPS = Bound(1, 1_000)
#: Conductor rounds (``--rounds``).
ROUNDS = Bound(1, 100)
#: Model calls of one question (``--max-calls``).
CALLS = Bound(1, 1_000_000)
#: Model calls of an API key's budget (a keys file's ``max_calls``), over its life.
KEY_CALLS = Bound(1, 1_000_000_000_000)
#: Calls, samples or requests in flight at once (``max_concurrency``, ``--concurrency``).
CONCURRENCY = Bound(1, 100_000)
#: Requests waiting for a slot.
QUEUE = Bound(0, 1_000_000)
#: The K of ``vote:K:W`` and ``reflect:K:W``: runs of one question.
VOTES = Bound(1, 1_000)
#: The largest request body a server accepts.
BODY_BYTES = Bound(1, 1 << 31)
#: Retries of a failed call or of a reply that did not parse.
RETRIES = Bound(0, 1_000)
#: Tokens of one reply (``max_tokens``, ``worker_max_tokens``).
TOKENS = Bound(1, 100_000_000)
#: A model's context window (``n_ctx``).
CONTEXT_TOKENS = Bound(1, 100_000_000)
#: Characters of a text limit that may be 0 (reasoning kept).
CHARS = Bound(0, 1_000_000_000)
#: Characters a text must have at least, or may have at most (subtasks, an answer).
LENGTH = Bound(1, 1_000_000_000)
#: Threads of a local model.
THREADS = Bound(1, 65_536)
#: Layers of a local model put on the GPU (-1: all of them).
GPU_LAYERS = Bound(-1, 1_000_000)
#: A random seed: what numpy and Python's ``random`` both take whole.
SEED = Bound(0, 2**64 - 1)
#: The N of ``--shard I/N``.
SHARDS = Bound(1, 1_000_000)
#: Workers drawn into a randomised pool.
POOL_SIZE = Bound(1, 10_000)
#: Completions per question of a GRPO group.
GROUP_SIZE = Bound(2, 10_000)
#: A batch of a training run (questions per step, a device's batch, accumulation).
BATCH = Bound(1, 1_000_000)
#: Optimizer steps, and the other step counts of a training run.
TRAIN_STEPS = Bound(1, 100_000_000)
#: Optimizer steps a GRPO batch may wait between its generation and its update
#: (``grpo.max_staleness``): each step of it holds one more generated batch in memory.
STALENESS = Bound(1, 16)
#: The n of the held-out guard's n-grams.
NGRAM = Bound(1, 1_000)

_DIGITS = re.compile(r"[0-9]+")


def shown_number(value: object) -> str:
    """``value`` as an error message quotes it: a number of more than 30 digits is named
    by its length (a 5,000-digit number would fill the screen)."""
    text = str(value)
    digits = text.lstrip("+-")
    if digits.isdigit() and len(digits) > 30:
        return f"a number of {len(digits):,} digits"
    return text


def parse_count(text: str, bound: Bound, what: str) -> int:
    """The count ``text`` (ASCII digits, surrounding blanks allowed) within ``bound``;
    anything else is a :class:`UsageError` naming ``what`` and the range.  The digits
    are counted before ``int()`` reads them, so any length of input is refused in one
    sentence."""
    digits = text.strip()
    negative = digits.startswith("-") and bound.low < 0
    if negative:
        digits = digits[1:]
    widest = len(str(max(abs(bound.low), bound.high)))
    if not _DIGITS.fullmatch(digits) or len(digits.lstrip("0")) > widest:
        raise UsageError(f"{what} must be {bound.describe()}, got {shown_number(text.strip())}")
    value = -int(digits) if negative else int(digits)
    if value not in bound:
        raise UsageError(f"{what} must be {bound.describe()}, got {value:,}")
    return value
