"""Many ``conductor bench`` processes on one run (``--state``): who runs which pair,
and how its record reaches ``samples.jsonl`` once.

Joining: the run directory's ``.lock`` is taken exclusively by the process that finds
no other (it claims the directory as a run without ``--state`` does: ``--resume`` and
``--overwrite`` mean what they mean there, it writes ``config.json``, draws the session
token, opens the session on the server) and then shared; a process that finds it held
shared *joins*: its run must be the same run (``check_same_run``), and it may not
``--overwrite`` what the others are writing.  A process without ``--state`` still
takes the lock exclusively, so the two kinds never write one directory together.

Each pair is claimed on the server before it starts (:class:`RunClaims`); pairs
another live process holds are tried again until they are done, so those of a process
that died are taken up once its leases lapse.

The record protocol, one of a kind (:meth:`RunShare.write`):

1. ``confirm``: the lease is renewed and must still be ours, else nothing is written;
2. the line is appended to ``samples.jsonl`` in ONE ``write`` on an ``O_APPEND``
   descriptor, preceded by a newline (so a line torn by a process killed in the middle
   of its write is ended there, and the next record starts on a line of its own), then
   ``fsync``-ed;
3. ``finish``: the pair is marked done, a compare-and-set that succeeds only while the
   lease is ours.

A process killed between 2 and 3 leaves a record whose pair is not done: whoever takes
the lapsed lease finds the record (a retaken pair is looked up in ``samples.jsonl``)
and marks it done instead of running it again.

So a pair is marked done only once its line is durable, and written only by the
holder of a live lease with a full lease left for the write.  This needs a file system
whose appends are atomic (local disks, and cluster file systems that honour
``O_APPEND``; NFS does not).

Fail closed: the state server out of reach, or restarted without the run's session,
stops the run at once (samples in flight are abandoned: their spend could not be
counted) with one sentence that says how to resume.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from ..errors import UsageError
from ..grading.types import Sample
from ..private import write_private
from ..runs.rundir import STATE_TOKEN
from ..state.claims import LEASE_S, RunClaims, StateLost, is_token, new_token
from ..state.url import StateURL
from ..text import plural
from ..userfiles import UnreadableFileError, read_regular
from .claim import recorded_keys
from .faults import BenchStopped

__all__ = ["LEASE_ENV", "RunShare", "state_stop"]

log = logging.getLogger("conductor")

#: Seconds a lease lasts unless renewed (the heartbeat renews at a third of it).
LEASE_ENV = "CONDUCTOR_STATE_LEASE_S"


def state_stop(lost: StateLost, out: Path, url: StateURL, written: int) -> BenchStopped:
    """The stop of a run whose state server was lost, after ``written`` records."""
    return BenchStopped(
        f"stopped: {lost}, so no spend could be counted; no more samples were started, "
        f"those in flight were abandoned, and the {plural(written, 'record')} written "
        f"this time are kept; once the server is back, continue with "
        f"`conductor bench --resume {out} --state {url.public}`"
    )


def _lease_s() -> float:
    raw = os.environ.get(LEASE_ENV)
    if not raw:
        return LEASE_S
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"${LEASE_ENV} must be a number of seconds, got {raw!r}") from None
    if not 0.1 <= value <= 3600:
        raise UsageError(f"${LEASE_ENV} must be between 0.1 and 3600 seconds, got {raw}")
    return value


class RunShare:
    """This process's part in a run shared through the state server at ``url``."""

    def __init__(self, url: StateURL, out: Path) -> None:
        self.url, self.out = url, out
        self.lease_s = _lease_s()
        self.claims: RunClaims | None = None
        #: The pairs handed out and not settled yet, and those whose lease another
        #: process took before their record was written (to be watched until done).
        self._open: dict[tuple[str, int], tuple[Sample, int]] = {}
        self._again: list[tuple[Sample, int]] = []

    def start(self, spent_usd: float) -> None:
        """Open the run's session (the first process): a fresh token, kept beside the
        records for the joiners."""
        token = new_token()
        write_private(self.out / STATE_TOKEN, token + "\n")
        self.claims = RunClaims(self.url, token, lease_s=self.lease_s)
        self._guard(lambda c: c.start(spent_usd))

    def join(self) -> None:
        """Join the session the first process opened."""
        try:
            # Read as what it must be: a small regular file holding a token we draw.
            raw = read_regular(self.out / STATE_TOKEN, "state token", 256)
        except (UnreadableFileError, OSError):
            raw = b""
        token = raw.decode("ascii", "replace").strip()
        if not is_token(token):
            raise UsageError(
                f"{self.out} is run by other conductor processes, but holds no readable "
                f"{STATE_TOKEN} to join them by: were they started without --state?"
            )
        self.claims = RunClaims(self.url, token, lease_s=self.lease_s)
        self._guard(lambda c: c.join())

    def _guard(self, step: Callable[[RunClaims], None]) -> None:
        """Take ``step`` on the server; a server lost already is the run's stop."""
        assert self.claims is not None
        try:
            step(self.claims)
        except StateLost as exc:
            raise state_stop(exc, self.out, self.url, 0) from None

    @property
    def lost(self) -> StateLost | None:
        return self.claims.lost if self.claims is not None else None

    def stop(self, written: int) -> BenchStopped | None:
        """The run's stop when the server was lost, else ``None``."""
        lost = self.lost
        return state_stop(lost, self.out, self.url, written) if lost is not None else None

    def close(self) -> None:
        if self.claims is not None:
            self.claims.close()

    # -- the work ----------------------------------------------------------------

    async def claimed(
        self, work: Iterator[tuple[Sample, int]], halted: Callable[[], bool]
    ) -> AsyncIterator[tuple[Sample, int]]:
        """The pairs of ``work`` this process gets to run: those no one holds, then,
        again and again, those another process holds (or took from this one), until
        each is done somewhere, or the run is ``halted``, or the server lost.  It ends
        only once every pair it handed out is settled (:meth:`settle`): one whose lease
        was taken before its record was written is watched again, never dropped."""
        waiting: list[tuple[Sample, int]] = []
        try:
            for pair in work:
                if self._take(pair, waiting):
                    yield pair
            while (waiting or self._open or self._again) and not halted():
                # A held lease ends when its holder finishes, or lapses if it died.
                await asyncio.sleep(min(1.0, self.lease_s / 4))
                pending, waiting = [*waiting, *self._again], []
                self._again.clear()
                for pair in pending:
                    if halted():
                        return
                    if self._take(pair, waiting):
                        yield pair
        except StateLost:
            return  # ``lost`` is set: the runner stops

    def _take(self, pair: tuple[Sample, int], waiting: list[tuple[Sample, int]]) -> bool:
        """Claim ``pair``: ``True`` when it is this process's to run; one held by
        another goes on ``waiting``."""
        assert self.claims is not None
        sample, epoch = pair
        got = self.claims.claim(sample.id, epoch)
        if got == "retaken" and (sample.id, epoch) in recorded_keys(self.out):
            # Its holder wrote the record, then died (or stalled) before marking it
            # done: marked now, never run (and recorded) twice.  Rare: a file read each.
            self.claims.finish(sample.id, epoch)
            return False
        if got in ("claimed", "retaken"):
            self._open[(sample.id, epoch)] = pair
            return True
        if got == "held":
            waiting.append(pair)
        return False

    def settle(self, sample_id: str, epoch: int) -> None:
        """The pair handed out has ended here (written, failed or abandoned)."""
        self._open.pop((sample_id, epoch), None)

    # -- the record --------------------------------------------------------------

    def write(self, fd: int, sample_id: str, epoch: int, line: str) -> bool:
        """Append ``line`` by the protocol above; ``False`` when the lease was lost
        (nothing written).  Raises :class:`StateLost` and ``OSError``."""
        claims = self.claims
        assert claims is not None
        if not claims.confirm(sample_id, epoch):
            pair = self._open.pop((sample_id, epoch), None)
            if pair is not None:
                self._again.append(pair)  # watched until its new holder is done
            log.warning(
                "%s (epoch %d): its lease lapsed and another process took it; its record "
                "is not written here",
                sample_id,
                epoch,
            )
            return False
        data = ("\n" + line).encode("utf-8")
        written = os.write(fd, data)
        if written != len(data):
            # Torn: the next record's leading newline ends it, and the pair stays
            # unfinished, so it runs again.
            claims.release(sample_id, epoch)
            raise OSError(5, f"short write ({written} of {len(data)} bytes)")
        os.fsync(fd)
        if not claims.finish(sample_id, epoch):
            log.warning(
                "%s (epoch %d): written, but its lease lapsed during the write: another "
                "process may record it too (readers keep one)",
                sample_id,
                epoch,
            )
        return True
