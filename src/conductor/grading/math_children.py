"""math-verify out of process: both sides of the pipe to a comparison child.

The child (:func:`child_main`, started as a fresh interpreter) reads one JSON request
per line, compares with math-verify's time limits off and answers one JSON line; the
parent keeps a few children warm (:class:`ChildPool`), enforces each comparison's time
limit and kills a child that overruns.  See :mod:`conductor.grading.math` for why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["ChildFailed", "ChildPool", "child_main"]

log = logging.getLogger("conductor")

# Starting a child imports sympy and math-verify: slow on a busy machine, and not part
# of any comparison's time limit.
_START_TIMEOUT_S = 120.0

# --- the child process side ---------------------------------------------------------


# A math delimiter: ``$``, ``\\(`` or ``\\[`` (or a box), but not the escaped dollar ``\\$``
# of an amount such as ``\\$18.90``, which is text inside the math.
_DELIMITER = re.compile(r"(?<!\\)\$|\\[(\[]|\\boxed")

#: The extraction targets of the reference harness's MATH-500 metric (lighteval's
#: ``pass_at_k_math``: plain expressions, then LaTeX, for the reply and the gold alike),
#: and its rounding of floats before comparing.
_FLOAT_ROUNDING = 6


def _as_latex(value: str) -> str:
    """Wrap a bare answer in ``$...$`` so math-verify reads it as LaTeX."""
    value = value.strip()
    if _DELIMITER.search(value):
        return value
    return f"${value}$"


def _targets() -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [ExprExtractionConfig(), LatexExtractionConfig()]


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    # Time limits off: they would use signal.alarm; the parent enforces the limit.
    return list(parse(text, _targets(), parsing_timeout=None))


def _equal(gold: list[Any], pred: list[Any]) -> bool:
    from math_verify import verify

    return bool(verify(gold, pred, float_rounding=_FLOAT_ROUNDING, timeout_seconds=None))


def _compare(golds: list[str], predicted: str) -> dict[str, Any]:
    """Runs in the child: compare an answer already extracted with the golds.

    Returns ``{"equal": bool, ...}``; ``{"error": text}`` when a gold answer cannot
    be read as math (a problem with the data, not the reply; replies identical to such
    a gold were already accepted by the exact-match fast path).
    """
    parsed_pred = _parse(_as_latex(predicted))
    if not parsed_pred:
        parsed_pred = _parse(predicted)
    for gold in golds:
        parsed_gold = _parse(_as_latex(gold))
        # Only the raw string came back: math-verify could not read the gold, and a
        # string comparison would silently fail every equivalent (not identical) reply.
        if all(isinstance(item, str) for item in parsed_gold):
            return {"error": f"the gold answer {gold!r} could not be read as math"}
        if parsed_pred and _equal(parsed_gold, parsed_pred):
            return {"equal": True, "gold": gold}
    return {"equal": False, "parsed": bool(parsed_pred)}


def _grade_reply(golds: list[str], reply: str) -> dict[str, Any]:
    """Runs in the child: the reference harness's verdict on a whole reply.

    math-verify finds the answer in ``reply`` itself (its priorities: "final answer
    is ...", then ``\\boxed{}``, "answer: ..." and the last expression or LaTeX span),
    as lighteval's MATH-500 metric has it.  A gold it cannot read is compared as the
    raw string, as lighteval does.  Returns ``{"equal": bool, "extracted": text or
    None, "gold": ...}``; ``extracted`` is ``None`` when nothing could be found.
    """
    parsed_pred = _parse(reply)
    texts = [item for item in parsed_pred if isinstance(item, str)]
    extracted = texts[-1] if texts else (str(parsed_pred[0]) if parsed_pred else None)
    for gold in golds:
        parsed_gold = _parse(_as_latex(gold)) or [gold]
        if parsed_pred and _equal(parsed_gold, parsed_pred):
            return {"equal": True, "gold": gold, "extracted": extracted}
    return {"equal": False, "extracted": extracted}


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """One request: ``{"golds", "reply"}`` (find the answer) or ``{"golds", "predicted"}``."""
    golds = [str(gold) for gold in request["golds"]]
    if "reply" in request:
        return _grade_reply(golds, str(request["reply"]))
    return _compare(golds, str(request["predicted"]))


def child_main() -> None:
    """The child's loop: one JSON request per stdin line, one JSON reply per line.  What
    the parent's child process runs (public: a fresh interpreter imports it by name).

    Requests are ``{"golds": [...], "predicted": "..."}`` or ``{"golds": [...],
    "reply": "..."}`` (see :func:`_answer`); an empty line or end of
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
            reply = _answer(json.loads(line))
        except Exception as exc:
            reply = {"error": f"math-verify failed: {type(exc).__name__}: {exc}"}
        send(reply)


# --- the parent side ----------------------------------------------------------------

# Runs the child without re-running the caller's main script (which multiprocessing's
# spawn would do, breaking scripts without an ``if __name__ == "__main__"`` guard).
_CHILD_CODE = "from conductor.grading.math_children import child_main; child_main()"


class ChildFailed(Exception):
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
            raise ChildFailed(
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
            raise ChildFailed(f"the comparison process did not start in {_START_TIMEOUT_S:g} s")
        if "error" in reply:
            self.kill()
            raise ChildFailed(str(reply["error"]))

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
            raise ChildFailed(f"the comparison process died (exit code {code})")
        return reply

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send one request (see :func:`_answer`); its reply, or ``None`` when it ran out
        of time."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
        except (OSError, ValueError) as exc:
            raise ChildFailed(f"the comparison process is gone: {exc}") from exc
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


class ChildPool:
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

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Run one request (see :func:`_answer`); ``None`` when it ran out of time.

        Raises :class:`ChildFailed` when no child could start or the child died.
        """
        with self._slots:
            child = self._take()
            try:
                reply = child.ask(request, timeout_s)
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
