"""How fast this machine runs Python now, so that a time limit in a test means the same
on a busy machine as on an idle one.

A test waits under a limit of two kinds.  One only catches a hang: a request answered
in milliseconds, given 30 s; it stays as written.  The other is near enough to what the
work takes that a busy machine reaches it: a child ``python -m conductor`` run (seconds
on an idle core) given 180 s was killed at a load of 10-24 on two cores.  Limits of the
second kind are written ``scaled(SECONDS)``: SECONDS is the limit on an idle core of
the machine they were written on, multiplied here by how much slower a fixed
pure-Python loop (:func:`unit`) runs now than it ran there (never by less than 1: a
fast machine does not tighten a limit).

The loop is timed when a limit is first asked for and again when that measure is over
a minute old (a run of the whole suite lasts long enough for the load to change); one
measure is five runs of about 30 ms on an idle core, their median wall time.

``python tests/kit/clock.py`` prints the factor; CI judges the fast subset's time with
it (``python tests/kit/clock.py --judge SECONDS --before FACTOR``, :func:`judge`): the
factor is measured before and after the subset, and the larger is used, so that a
machine busy with something else during the run does not fail it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

#: Seconds of one :func:`unit` on an idle core of the machine the limits were written
#: on (an AMD EPYC core, CPython 3.11: the least of 40 runs' CPU time was 0.028 s).
REFERENCE_S = 0.030
#: How long a measure of the factor is used before the loop is timed again.
FRESH_S = 60.0
#: The fast subset's budget on two idle cores of that machine, and how far over it CI
#: lets a run go before it fails.
FAST_SUBSET_BUDGET_S = 240.0
FAST_SUBSET_SLACK = 1.5

_measured: tuple[float, float] | None = None  # (when, factor)


def unit() -> int:
    """A fixed piece of pure-Python work: integer arithmetic in a loop, no allocation
    that grows, no I/O (what the interpreter's speed and this process's share of a core
    decide alone)."""
    total = 0
    for i in range(900_000):
        total = (total * 31 + i) % 1_000_003
    return total


def measure(runs: int = 5) -> float:
    """How many times slower than on the reference core :func:`unit` runs now (the
    median wall time of ``runs`` runs; below 1 on a faster machine)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        unit()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / REFERENCE_S


def slowdown() -> float:
    """The factor limits are scaled by now: :func:`measure`, at least 1, measured again
    when the last measure is over :data:`FRESH_S` old."""
    global _measured
    now = time.monotonic()
    if _measured is None or now - _measured[0] > FRESH_S:
        _measured = (now, max(1.0, measure()))
    return _measured[1]


def scaled(seconds: float) -> float:
    """``seconds`` (a limit on an idle reference core) on this machine as it is now."""
    return seconds * slowdown()


def judge(took_s: float, factor: float) -> tuple[bool, str]:
    """Whether a fast-subset run of ``took_s`` seconds, on a machine ``factor`` times
    slower than the reference (:func:`measure`, not clamped: a faster machine gets a
    shorter budget), is within its budget and slack; and a line saying so."""
    budget = FAST_SUBSET_BUDGET_S * factor
    limit = budget * FAST_SUBSET_SLACK
    ok = took_s <= limit
    line = (
        f"the fast subset took {took_s:.0f} s; its budget here is {budget:.0f} s "
        f"({FAST_SUBSET_BUDGET_S:.0f} s on the reference machine x {factor:.2f}, this "
        f"machine's speed), {FAST_SUBSET_SLACK:g}x that is {limit:.0f} s: "
        + ("within it" if ok else "OVER IT")
    )
    return ok, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--judge",
        type=float,
        metavar="SECONDS",
        help="the fast subset's wall time: exit 1 if it is over its budget x slack",
    )
    parser.add_argument(
        "--before",
        type=float,
        default=0.0,
        metavar="FACTOR",
        help="the factor this printed before the run (the larger of it and now's is used)",
    )
    args = parser.parse_args(argv)
    factor = measure(runs=15)
    if args.judge is None:
        print(f"{factor:.3f}")
        return 0
    ok, line = judge(args.judge, max(factor, args.before))
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
