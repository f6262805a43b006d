"""Where the JSON checks of a request run, and the time they may take: worker processes
(:class:`CheckerPool`) or the calling thread (:class:`InlineRunner`), one request's
checks drawing on one budget (:class:`RequestChecks`).

Why processes.  A check (:mod:`conductor.llm.schema_checks`) is pure-Python work over a
client's schema and a worker's reply.  On a server's event loop it holds every request
for as long as it runs: the deadline it checks as it walks bounds that, but a server
whose ``/health`` must answer within half a second cannot give one request seconds of
its loop.  A thread does not help: CPython's threads take the GIL in turns (the loop
gets it back only every few milliseconds, and not at all during one long C call such as
``json.loads`` or a pattern's compilation), and a thread cannot be stopped from outside,
so a check past its budget, or one whose client has gone, could only be asked to stop.
A process has neither problem: the loop only writes the job and waits on a pipe, and a
check past its budget, or whose request was cancelled (its client left), is ended with
SIGKILL at once, whatever it was doing.  The workers stay up between checks (a fresh
interpreter with jsonschema costs a few hundred milliseconds), at most ``size`` at once;
each limits its own memory (``RLIMIT_AS``) and its CPU per check (``RLIMIT_CPU``, a
backstop that also ends a worker whose server died mid-check), and runs at a lower
priority (``nice``), so that on a machine short of cores the server's loop comes first.

The wire between them: a job is one JSON line (``op``: ``reply`` or ``schema``, the
schema, ``need_object``, ``budget_s`` and the ``size`` of the text) followed by the
reply's text as UTF-8 bytes; the answer is one JSON line (``null``, or a problem's
``kind`` and ``detail``).  A worker says ``ready`` once it has imported what it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .schema_checks import CheckTimeout, Problem, check_reply, check_schema, timed_out
from .schema_limits import LIMITS

__all__ = [
    "CheckRunner",
    "CheckerPool",
    "InlineRunner",
    "RequestChecks",
    "run_job",
]

#: How long past its budget a worker has to answer before it is killed (the job's
#: bytes and the answer's travel, and the last keyword's work before its deadline).
GRACE_S = 0.5
#: How long a new worker may take to import what it needs and say it is ready.
START_TIMEOUT_S = 60.0
#: How much less CPU a worker is given than the server when both want it (nice(2)).
WORKER_NICENESS = 10
#: The longest text checked as JSON without a schema in the caller's own thread.
INLINE_CHARS = 64 << 10
#: The memory a worker may map (``RLIMIT_AS``): a reply of the largest size checked,
#: parsed, and its canonical forms fit several times over.
WORKER_MEMORY = 2 << 30


@dataclass(frozen=True)
class Job:
    """One check: of a request's ``schema`` (``op`` ``schema``), or of a reply's
    ``text`` against it (``op`` ``reply``; ``schema`` ``None`` for JSON alone)."""

    op: str
    schema: dict[str, Any] | None
    text: str = ""
    need_object: bool = False


def run_job(job: Job, budget_s: float) -> Problem | None:
    """Make the check ``job`` here and now, under ``budget_s``: what a worker process
    runs, and what :class:`InlineRunner` runs in the calling thread."""
    if job.op == "schema":
        assert job.schema is not None
        try:
            found = check_schema(job.schema, budget_s)
        except CheckTimeout:
            return timed_out(budget_s)
        except MemoryError:
            return Problem("unchecked", "checking it needed more memory than the checker has")
        return Problem("mismatch", found) if found else None
    return check_reply(job.text, job.schema, need_object=job.need_object, budget_s=budget_s)


class CheckRunner(Protocol):
    """Runs one check under a budget (see :class:`RequestChecks`)."""

    async def run(self, job: Job, budget_s: float, encoded_schema: bytes) -> Problem | None:
        """The check's problem, or ``None``; a ``timeout`` problem when it took over
        ``budget_s``.  ``encoded_schema`` is ``job.schema`` as JSON."""
        ...

    async def aclose(self) -> None:
        """Stop what the runner started."""
        ...


class InlineRunner:
    """Checks in the calling thread: bounded by each check's deadline, but holding the
    thread (an event loop's too) while they run.  For a run outside a server (``ask``,
    a library call) and for tests that show what the worker processes prevent."""

    async def run(self, job: Job, budget_s: float, encoded_schema: bytes) -> Problem | None:
        return run_job(job, budget_s)

    async def aclose(self) -> None:
        return None


#: The checks a run outside a server makes, in its own thread.
INLINE = InlineRunner()


class _WorkerGone(Exception):
    """The worker process ended or broke the wire."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _Worker:
        # The worker imports this very package, wherever this process found it.
        root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "conductor.llm.check_workers",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        worker = cls(proc)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
            if json.loads(line or b"null") != {"ready": True}:
                raise _WorkerGone
        except BaseException:
            worker.kill()
            raise
        return worker

    async def ask(self, job: Job, budget_s: float, encoded_schema: bytes) -> Problem | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        text = job.text.encode("utf-8", "surrogatepass")
        head = {
            "op": job.op,
            "need_object": job.need_object,
            "budget_s": budget_s,
            "size": len(text),
        }
        try:
            # The schema's JSON goes in as it is: encoded once per request (json.dumps
            # of the header around it would encode it again on the loop for each check).
            line = json.dumps(head).encode()[:-1] + b', "schema": ' + encoded_schema + b"}\n"
            self.proc.stdin.write(line)
            self.proc.stdin.write(text)
            await self.proc.stdin.drain()
            answer = await self.proc.stdout.readline()
        except (OSError, ValueError) as exc:
            raise _WorkerGone from exc
        if not answer.endswith(b"\n"):
            raise _WorkerGone
        found = json.loads(answer)
        return None if found is None else Problem(found["kind"], found["detail"])

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


class CheckerPool:
    """Up to ``size`` worker processes, started when first needed and kept between
    checks; a check waits for a free one.  A worker past a check's budget (and a
    little grace), or whose check was cancelled, is killed, and a new one started for
    the next check."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size if size is not None else max(2, min(4, (os.cpu_count() or 2) // 2))
        self._free = asyncio.Semaphore(self.size)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._reaping: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: Workers killed at a budget or a cancellation (for tests and measurements).
        self.killed = 0

    async def run(self, job: Job, budget_s: float, encoded_schema: bytes) -> Problem | None:
        async with self._free:
            worker = self._idle.pop() if self._idle else await self._start()
            healthy = False
            try:
                found = await asyncio.wait_for(
                    worker.ask(job, budget_s, encoded_schema), budget_s + GRACE_S
                )
                healthy = True
                return found
            except asyncio.TimeoutError:  # not the builtin before Python 3.11
                return timed_out(budget_s)
            except _WorkerGone:
                return Problem("unchecked", "the checker process ended unexpectedly")
            finally:
                if healthy and not self._closed:
                    self._idle.append(worker)
                else:
                    self._retire(worker)

    async def _start(self) -> _Worker:
        worker = await _Worker.start()
        self._all.add(worker)
        if self._closed:
            self._retire(worker)
            raise _WorkerGone
        return worker

    def _retire(self, worker: _Worker) -> None:
        """Kill ``worker`` (if it still runs) and reap it in the background."""
        if worker.proc.returncode is None:
            self.killed += 1
        worker.kill()
        self._all.discard(worker)
        task = asyncio.ensure_future(worker.proc.wait())
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def aclose(self) -> None:
        """Kill every worker, busy or idle, and wait for them to end."""
        self._closed = True
        for worker in list(self._all):
            self._retire(worker)
        self._idle.clear()
        if self._reaping:
            await asyncio.wait(self._reaping, timeout=10)


class RequestChecks:
    """One request's checks: its schemas when it arrives, then each reply of each of
    its runs, made by ``runner`` one at a time, all drawing on one budget of
    ``budget_s`` seconds (time spent waiting for a free worker is not counted).  Once the
    budget is spent every further check is ``unchecked`` at once, and :meth:`refusal`
    says so, so that no more calls are made whose replies could not be checked."""

    def __init__(self, runner: CheckRunner, budget_s: float = LIMITS.check_s) -> None:
        self.runner = runner
        self.budget_s = budget_s
        self.left = budget_s
        self._one_at_a_time = asyncio.Lock()
        self._encoded: dict[int, tuple[Any, bytes]] = {}

    def refusal(self) -> str | None:
        """Why no more replies of this request can be checked, or ``None``."""
        if self.left > 0:
            return None
        return f"the request's checks took their limit of {self.budget_s:g} s"

    async def schema(self, schema: dict[str, Any]) -> Problem | None:
        """Why ``schema`` cannot be used (``mismatch``, its detail saying why), or
        ``unchecked`` (out of time), or ``None``."""
        return await self._run(Job("schema", schema))

    async def reply(
        self, text: str, schema: dict[str, Any] | None, *, need_object: bool
    ) -> Problem | None:
        """How ``text`` fails (see :func:`~conductor.llm.schema_checks.check_reply`)."""
        if schema is None and len(text) <= INLINE_CHARS:
            # One json.loads of a short text (a tool call's arguments): a few
            # microseconds here, less than the trip to a worker.
            return check_reply(text, None, need_object=need_object)
        return await self._run(Job("reply", schema, text, need_object))

    async def _run(self, job: Job) -> Problem | None:
        async with self._one_at_a_time:
            refused = self.refusal()
            if refused is not None:
                return Problem("unchecked", refused)
            started = time.monotonic()
            try:
                found = await self.runner.run(job, self.left, self._encode(job.schema))
            finally:
                self.left -= time.monotonic() - started
            if found is not None and found.kind == "timeout":
                self.left = 0.0
                return Problem("unchecked", f"checking it took over the request's limit of "
                               f"{self.budget_s:g} s for schema checks")  # fmt: skip
            return found

    def _encode(self, schema: dict[str, Any] | None) -> bytes:
        """``schema`` as JSON, encoded once per request (the entry keeps the schema
        alive, so its id is not reused)."""
        if schema is None:
            return b"null"
        kept = self._encoded.get(id(schema))
        if kept is None:
            kept = self._encoded[id(schema)] = (schema, json.dumps(schema).encode())
        return kept[1]


# -- the worker process -----------------------------------------------------------------


def _limit_self(budget_s: float) -> None:
    """This worker may use ``budget_s`` more CPU seconds (and a little more) before the
    kernel ends it: a backstop to the parent's kill, which also holds when the parent
    has died mid-check."""
    import resource

    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used + budget_s + 2 * GRACE_S) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main() -> None:
    """A worker: read jobs from stdin, answer each on stdout, until stdin closes."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    # A check is background work: on a busy machine the server's own process (its
    # event loop, /health) comes first.
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICENESS)
    # The wire is a copy of fd 1; fd 1 itself goes to stderr, so that nothing a library
    # prints can break it.
    wire = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    jobs = sys.stdin.buffer
    import jsonschema  # noqa: F401  (imported before "ready": a check's time is its own)
    import referencing  # noqa: F401
    import regex  # noqa: F401

    wire.write(b'{"ready": true}\n')
    wire.flush()
    while True:
        line = jobs.readline()
        if not line:
            return
        head = json.loads(line)
        text = jobs.read(head["size"]).decode("utf-8", "surrogatepass")
        budget_s = float(head["budget_s"])
        _limit_self(budget_s)
        job = Job(head["op"], head["schema"], text, bool(head["need_object"]))
        found = run_job(job, budget_s)
        answer = None if found is None else {"kind": found.kind, "detail": found.detail}
        wire.write(json.dumps(answer).encode() + b"\n")
        wire.flush()


if __name__ == "__main__":
    main()
