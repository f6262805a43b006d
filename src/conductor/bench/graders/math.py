"""The math grader: is the reply's final answer mathematically equal to the gold?

Equivalence is decided by math-verify (``1/2`` = ``0.5`` = ``\\frac{1}{2}``,
``2\\sqrt{2}`` = ``\\sqrt{8}``, ``{1,2}`` = ``{2,1}``, ``x=3`` = ``3``,
``1,000,000`` = ``1000000``, ``30^\\circ`` = ``30``).  Note that math-verify treats a
percentage loosely: ``10\\%`` matches both ``0.1`` and ``10``.

math-verify's own time limits use ``signal.alarm``, which works only on a process's main
thread, and graders run in worker threads.  So every comparison runs in a small pool of
child processes (fresh interpreters started with :mod:`subprocess`, speaking JSON lines
over their standard streams: nothing is inherited and the caller's main script is not
re-run, unlike multiprocessing's spawn) with math-verify's time limits off.  The parent
waits at most ``timeout_s`` for the answer and otherwise kills that child (a new one is
started for the next comparison) and returns a ``time_limit`` verdict.

The children are started in the background when a grader is built, so the first
answer that needs one does not wait for sympy to load.  Most answers never need one:
answers equal as normalised strings are accepted, and plainly numeric answers (integers,
decimals, fractions ``a/b`` or ``\\frac{a}{b}``) are compared exactly in this process:
equal values are correct, and clearly different values (all integers, or more than
0.1% apart) are incorrect.  Only numbers close but not equal go to math-verify, whose
rounding decides them.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from conductor.bench.graders.extract import MAX_RESPONSE_CHARS, clip_tail, extract_math_answer
from conductor.bench.types import Sample, Verdict
from conductor.errors import MissingDependencyError

__all__ = ["DEFAULT_TIMEOUT_S", "MathGrader", "normalise_answer", "plain_number"]

log = logging.getLogger("conductor")

#: How long one comparison may take before the child is killed.
DEFAULT_TIMEOUT_S = 5.0
# Child processes kept warm; each comparison takes one for itself.
_MAX_WORKERS = 2
# Starting a child imports sympy and math-verify: slow on a busy machine, and not part
# of any comparison's time limit.
_START_TIMEOUT_S = 120.0

# LaTeX spacing and sizing that never changes a value.
_SPACING = re.compile(r"\\[,!;: ]|\\(?:left|right|displaystyle)(?![A-Za-z])|\s+")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# A plain number after normalising: an integer or decimal, ``a/b``, or ``\frac{a}{b}``
# (``\frac12`` too), with an optional sign.  Anything else (commas, units, percent
# signs, exponents) is left to math-verify.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_FRACTION = re.compile(
    r"([+-]?)(?:(\d+)/(\d+)|\\frac(?:\{(\d+)\}\{(\d+)\}|(\d)(\d)|\{(\d+)\}(\d)|(\d)\{(\d+)\}))"
)
# Values this close (relative) are left to math-verify, which rounds before comparing.
_CLOSE = Fraction(1, 1000)


def normalise_answer(answer: str) -> str:
    """A canonical spelling for the exact-match fast path.

    Removes math delimiters, whitespace and LaTeX spacing / sizing commands, spells
    ``\\dfrac`` and ``\\tfrac`` as ``\\frac`` and drops a trailing full stop.  Two
    answers with equal normal forms are equal; unequal ones may still be equivalent.
    """
    value = answer.strip()
    for opening, closing in _DELIMITERS:
        if len(value) > len(opening) + len(closing) and (
            value.startswith(opening) and value.endswith(closing)
        ):
            value = value[len(opening) : -len(closing)].strip()
            break
    value = _SPACING.sub("", value)
    value = _FRAC_VARIANTS.sub(r"\\frac", value)
    return value.rstrip(".")


def plain_number(answer: str) -> tuple[Fraction, bool] | None:
    """``(value, is_integer_literal)`` of an answer written as a plain number, else None.

    ``1/2``, ``0.5``, ``\\frac{1}{2}`` and ``$-3$`` are plain numbers; ``1,000``,
    ``10\\%``, ``1e3`` and ``x=3`` are not (math-verify reads those).
    """
    value = normalise_answer(answer)
    for opening, closing in _DELIMITERS:  # "$42$." loses its full stop first
        if len(value) > len(opening) + len(closing) and (
            value.startswith(opening) and value.endswith(closing)
        ):
            value = value[len(opening) : -len(closing)]
            break
    if len(value) > 100:
        return None
    if _NUMBER.fullmatch(value):
        return Fraction(value), "." not in value
    match = _FRACTION.fullmatch(value)
    if match is None:
        return None
    sign, *parts = match.groups()
    numerator, denominator = (p for p in parts if p is not None)
    if int(denominator) == 0:
        return None
    fraction = Fraction(int(numerator), int(denominator))
    return (-fraction if sign == "-" else fraction), False


def _numeric_verdict(golds: list[str], predicted: str) -> tuple[bool, str] | None:
    """``(equal, gold)`` when plain numbers settle the comparison without math-verify;
    ``None`` when the answer or a gold is not a plain number, or the values are close."""
    answer = plain_number(predicted)
    if answer is None:
        return None
    values = [plain_number(gold) for gold in golds]
    for gold, value in zip(golds, values, strict=True):
        if value is not None and value[0] == answer[0]:
            return True, gold
    for value in values:
        if value is None:
            return None
        both_integers = value[1] and answer[1]
        scale = max(abs(value[0]), abs(answer[0]))
        if not both_integers and abs(value[0] - answer[0]) <= _CLOSE * scale:
            return None
    return False, golds[0]


# --- the child process side ---------------------------------------------------------


def _as_latex(value: str) -> str:
    """Wrap a bare answer in ``$...$`` so math-verify reads it as LaTeX."""
    value = value.strip()
    if any(mark in value for mark in ("$", "\\(", "\\[", "\\boxed")):
        return value
    return f"${value}$"


def _compare(golds: list[str], predicted: str) -> dict[str, Any]:
    """Runs in the child: parse both sides with math-verify and compare.

    Returns ``{"equal": bool, ...}``; ``{"error": text}`` when a gold answer cannot
    be read as math (a problem with the data, not the reply; replies identical to such
    a gold were already accepted by the exact-match fast path).
    """
    from math_verify import parse, verify

    # Time limits off: they would use signal.alarm; the parent enforces the limit.
    parsed_pred = parse(_as_latex(predicted), parsing_timeout=None)
    if not parsed_pred:
        parsed_pred = parse(predicted, parsing_timeout=None)
    for gold in golds:
        parsed_gold = parse(_as_latex(gold), parsing_timeout=None)
        # Only the raw string came back: math-verify could not read the gold, and a
        # string comparison would silently fail every equivalent (not identical) reply.
        if all(isinstance(item, str) for item in parsed_gold):
            return {"error": f"the gold answer {gold!r} could not be read as math"}
        if parsed_pred and verify(parsed_gold, parsed_pred, timeout_seconds=None):
            return {"equal": True, "gold": gold}
    return {"equal": False, "parsed": bool(parsed_pred)}


def _child_main() -> None:
    """The child's loop: one JSON request per stdin line, one JSON reply per line.

    Requests are ``{"golds": [...], "predicted": "..."}``; an empty line or end of
    input stops the loop.  The protocol uses the original stdout; anything a library
    prints goes to stderr instead.
    """
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr

    def send(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        # math-verify warns once that its time limits are off; that is on purpose.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        # One comparison now loads the LaTeX grammar, which the first real one would wait for.
        _compare(["\\frac{1}{2}"], "\\sqrt{2}")
    except BaseException as exc:  # report anything, then stop
        send({"error": f"cannot load math-verify: {type(exc).__name__}: {exc}"})
        return
    send({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            return
        try:
            request = json.loads(line)
            reply = _compare(list(request["golds"]), str(request["predicted"]))
        except Exception as exc:
            reply = {"error": f"math-verify failed: {type(exc).__name__}: {exc}"}
        send(reply)


# --- the parent side ----------------------------------------------------------------

# Runs the child without re-running the caller's main script (which multiprocessing's
# spawn would do, breaking scripts without an ``if __name__ == "__main__"`` guard).
_CHILD_CODE = "from conductor.bench.graders.math import _child_main; _child_main()"


class _ChildFailed(Exception):
    """A child process could not start or died during a comparison."""


class _Child:
    """One comparison process, its pipes, and a thread that reads its replies."""

    def __init__(self) -> None:
        env = dict(os.environ)
        # The child must import this very copy of conductor, wherever it came from.
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                text=True,
                encoding="utf-8",
            )
        except OSError as exc:  # the interpreter cannot be run (permissions, resources)
            raise _ChildFailed(
                f"cannot start the comparison process ({sys.executable}): {exc.strerror or exc}"
            ) from None
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # A reader thread turns the blocking pipe into a queue that can be waited on
        # with a time-out, on every platform.
        threading.Thread(
            target=self._read, name="conductor-math-verify-reader", daemon=True
        ).start()
        reply = self._receive(_START_TIMEOUT_S)
        if reply is None:
            self.kill()
            raise _ChildFailed(f"the comparison process did not start in {_START_TIMEOUT_S:g} s")
        if "error" in reply:
            self.kill()
            raise _ChildFailed(str(reply["error"]))

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            for line in stdout:
                try:
                    self._replies.put(json.loads(line))
                except ValueError:
                    continue  # not a protocol line
        except (OSError, ValueError):
            pass
        self._replies.put(None)  # end of output: the child is gone

    def _receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply, or ``None`` if none came within ``timeout_s``."""
        try:
            reply = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if reply is None:
            code = self.process.poll()
            raise _ChildFailed(f"the comparison process died (exit code {code})")
        return reply

    def compare(self, golds: list[str], predicted: str, timeout_s: float) -> dict[str, Any] | None:
        """Send one comparison; its reply, or ``None`` when it ran out of time."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps({"golds": golds, "predicted": predicted}) + "\n")
            stdin.flush()
        except (OSError, ValueError) as exc:
            raise _ChildFailed(f"the comparison process is gone: {exc}") from exc
        return self._receive(timeout_s)

    def kill(self) -> None:
        """Stop the process now and release its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("math grader: child process %s did not exit", self.process.pid)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()

    def stop(self) -> None:
        """Ask the process to finish (an empty line), killing it if it does not."""
        stdin = self.process.stdin
        with contextlib.suppress(OSError, ValueError):
            if stdin is not None:
                stdin.write("\n")
                stdin.flush()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1)
        self.kill()


class _ChildPool:
    """Up to ``max_workers`` warm children, each used by one comparison at a time."""

    def __init__(self, max_workers: int) -> None:
        self._max_workers = max_workers
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Condition()
        self._idle: list[_Child] = []
        # Children being started in the background (by :meth:`warm`), and all children
        # alive (idle, comparing or starting): warming never exceeds ``max_workers``.
        self._starting = 0
        self._alive = 0
        self._pid = os.getpid()

    def warm(self) -> None:
        """Start children in the background until ``max_workers`` are alive."""
        with self._lock:
            self._forget_if_forked()
            missing = self._max_workers - self._alive
            self._starting += missing
            self._alive += missing
        if missing > 0:
            threading.Thread(
                target=self._start, args=(missing,), name="conductor-math-verify-warm", daemon=True
            ).start()

    def _start(self, count: int) -> None:
        # One after the other: the first is ready sooner than if all shared the CPU.
        for _ in range(count):
            try:
                child: _Child | None = _Child()
            except Exception as exc:  # nothing may escape a background thread
                # A comparison that needs a child starts one itself and reports why not.
                log.debug("math grader: warming a child failed: %s", exc)
                child = None
            with self._lock:
                self._starting -= 1
                if child is None:
                    self._alive -= 1
                else:
                    self._idle.append(child)
                self._lock.notify_all()

    def _forget_if_forked(self) -> None:
        if self._pid != os.getpid():
            # A forked copy of this process: the children belong to the parent.
            self._idle = []
            self._starting = 0
            self._alive = 0
            self._pid = os.getpid()

    def compare(self, golds: list[str], predicted: str, timeout_s: float) -> dict[str, Any] | None:
        """Run one comparison; ``None`` when it ran out of time.

        Raises :class:`_ChildFailed` when no child could start or the child died.
        """
        with self._slots:
            child = self._take()
            try:
                reply = child.compare(golds, predicted, timeout_s)
            except BaseException:
                self._discard(child)
                raise
            if reply is None:
                # Still computing: the only way to stop sympy is to end the process.
                self._discard(child)
                return None
            with self._lock:
                self._idle.append(child)
            return reply

    def _discard(self, child: _Child) -> None:
        child.kill()
        with self._lock:
            self._alive = max(self._alive - 1, 0)

    def _take(self) -> _Child:
        with self._lock:
            self._forget_if_forked()
            while True:
                while self._idle:
                    child = self._idle.pop()
                    if child.process.poll() is None:
                        return child
                    # Died while idle (e.g. the OOM killer): just replace it.
                    child.kill()
                    self._alive = max(self._alive - 1, 0)
                if not self._starting:
                    break
                # One is being warmed: waiting for it beats starting yet another.
                self._lock.wait()
            self._alive += 1
        try:
            return _Child()
        except BaseException:
            with self._lock:
                self._alive = max(self._alive - 1, 0)
            raise

    def close(self) -> None:
        """Stop every idle child (called at interpreter exit)."""
        with self._lock:
            idle, self._idle = self._idle, []
            mine = self._pid == os.getpid()
            if mine:
                self._alive = max(self._alive - len(idle), 0)
        if mine:
            for child in idle:
                child.stop()


_POOL = _ChildPool(_MAX_WORKERS)
atexit.register(_POOL.close)


class MathGrader:
    """Grades math answers by equivalence (math-verify), with a hard time limit.

    The answer is read with :func:`~conductor.bench.graders.extract.extract_math_answer`
    (``<answer>`` tag, last ``\\boxed{}``, ``ANSWER:`` line).  The gold is a string (a
    number or LaTeX, without ``$``), or a list of acceptable answers.  Building one
    starts the comparison processes in the background (``warm=False`` does not).
    """

    name = "math"
    version = "2"

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_chars: int = MAX_RESPONSE_CHARS,
        warm: bool = True,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if max_chars <= 0:
            raise ValueError("max_chars must be positive")
        if importlib.util.find_spec("math_verify") is None:
            raise MissingDependencyError(
                "the math grader needs math-verify: pip install 'math-verify[antlr4_13_2]'"
            )
        self.timeout_s = float(timeout_s)
        self.max_chars = max_chars
        if warm:
            _POOL.warm()

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Extract the final answer from ``response`` and compare it with the gold."""
        golds = _gold_answers(sample.gold)
        if not golds:
            return Verdict(
                "grader_error", f"the sample has no usable gold answer ({sample.gold!r})"
            )
        truncated = bool(response) and len(response or "") > self.max_chars
        extracted = extract_math_answer(clip_tail(response, self.max_chars)) if response else None
        detail: dict[str, Any] = {"gold": golds[0] if len(golds) == 1 else golds}
        if truncated:
            detail["truncated"] = True
        if extracted is None:
            return Verdict(
                "no_answer",
                "no answer could be read (no <answer> tag, \\boxed{} or ANSWER: line)",
                detail=detail,
            )

        normal = normalise_answer(extracted)
        for gold in golds:
            if normal and normal == normalise_answer(gold):
                detail["method"] = "exact"
                return Verdict(
                    "correct", f"{extracted!r} equals the gold answer", extracted, detail
                )

        settled = _numeric_verdict(golds, extracted)
        if settled is not None:
            detail["method"] = "numeric"
            equal, gold = settled
            if equal:
                return Verdict("correct", f"{extracted!r} equals {gold!r}", extracted, detail)
            shown = golds[0] if len(golds) == 1 else golds
            return Verdict(
                "incorrect",
                f"{extracted!r} is not equal to the gold answer {shown!r}",
                extracted,
                detail,
            )

        detail["method"] = "math_verify"
        started = time.monotonic()
        try:
            reply = _POOL.compare(golds, extracted, self.timeout_s)
        except _ChildFailed as exc:
            return Verdict("grader_error", str(exc), extracted, detail)
        detail["elapsed_s"] = round(time.monotonic() - started, 3)
        if reply is None:
            return Verdict(
                "time_limit",
                f"comparing {extracted[:80]!r} with the gold took over {self.timeout_s:g} s",
                extracted,
                detail,
            )
        if "error" in reply:
            return Verdict("grader_error", str(reply["error"]), extracted, detail)
        if reply.get("equal"):
            return Verdict(
                "correct", f"{extracted!r} is equivalent to {reply['gold']!r}", extracted, detail
            )
        shown = golds[0] if len(golds) == 1 else golds
        why = (
            "is not equivalent to"
            if reply.get("parsed")
            else "could not be read as math, nor equals"
        )
        return Verdict(
            "incorrect", f"{extracted!r} {why} the gold answer {shown!r}", extracted, detail
        )


def _gold_answers(gold: object) -> list[str]:
    """The gold as a list of non-empty strings (a list gold means several are accepted)."""
    items = gold if isinstance(gold, (list, tuple)) else [gold]
    answers: list[str] = []
    for item in items:
        if item is None or isinstance(item, bool):
            continue
        text = str(item).strip()
        if text:
            answers.append(text)
    return answers
