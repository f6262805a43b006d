"""The one owner of ``batches.jsonl``: the provider batches a ``bench --batch`` run
submitted, so that a resumed run polls them instead of paying for them twice.

Each line is one event, appended (unbuffered) as it happens::

    {"event": "intent", "label": L, "target": ..., "model": ..., "wave": 2,
     "custom_ids": [...], "at": ...}          before the batch is sent
    {"event": "submitted", "label": L, "batch_id": "batch_...", "at": ...}
    {"event": "collected", "label": L, "state": "ended", "succeeded": 998,
     "failed": 2, "at": ...}                 its answers are in the call cache
    {"event": "abandoned", "label": L, "reason": ..., "at": ...}
                                             the submission failed: nothing was sent

``label`` is ours (unique per submission), sent with the batch where the provider keeps
one, so that a batch whose id was never written down (a process killed between
sending it and writing the answer) can still be found.  A custom id is the call's cache
key.  A batch with an ``intent`` and no ``collected`` or ``abandoned`` is in flight
(:meth:`BatchJournal.in_flight`).  A torn last line (a process killed mid-write) is cut
off when the journal is opened; a line that cannot be read otherwise is skipped with a
warning, as :mod:`conductor.runs.rundir` does for records.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..private import open_private
from ..record import MAX_RECORD_BYTES, now_iso
from ..userfiles import bounded_lines, open_regular
from .rundir import BATCHES, record_line, repair_tail, write_line

__all__ = ["BatchJournal", "JournalBatch"]

log = logging.getLogger("conductor")


@dataclass
class JournalBatch:
    """One submission as the journal tells it."""

    label: str
    target: str
    model: str
    wave: int
    custom_ids: tuple[str, ...]
    batch_id: str | None = None
    #: ``collected`` or ``abandoned``: the batch needs nothing more; ``None``: in flight.
    closed: str | None = None
    state: str | None = None


class BatchJournal:
    """``DIR/batches.jsonl``, read when opened and appended to as batches move.

    :meth:`intent` must be written before a batch is sent and :meth:`submitted` as soon
    as its id is known; :meth:`collected` only once the batch's answers are durable in
    the call cache.  Writes raise ``OSError`` (the caller stops the run: a batch that
    cannot be written down must not be sent).
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / BATCHES
        self._batches: dict[str, JournalBatch] = {}
        self._fh: IO[bytes] | None = None
        self._read()

    def _read(self) -> None:
        if not os.path.lexists(self.path):
            return
        with open_regular(self.path, "batch journal") as fh:
            repair_tail(self.path)
            for number, raw in bounded_lines(fh, MAX_RECORD_BYTES):
                if raw is None:
                    log.warning(
                        "%s:%d: a line too long to be an event was skipped", self.path, number
                    )
                    continue
                if not raw.strip():
                    continue
                try:
                    event = json.loads(raw)
                    self._apply(event)
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning(
                        "%s:%d: a line that cannot be read was skipped (%s)", self.path, number, exc
                    )

    def _apply(self, event: dict[str, Any]) -> None:
        kind, label = event["event"], str(event["label"])
        if kind == "intent":
            ids = event["custom_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise TypeError("custom_ids is not a list of strings")
            self._batches[label] = JournalBatch(
                label, str(event["target"]), str(event["model"]), int(event["wave"]), tuple(ids)
            )
            return
        batch = self._batches[label]
        if kind == "submitted":
            batch.batch_id = str(event["batch_id"])
        elif kind in ("collected", "abandoned"):
            batch.closed = kind
            batch.state = event.get("state")
        else:
            raise KeyError(f"unknown event {kind!r}")

    # -- reading ---------------------------------------------------------------------

    def batches(self) -> list[JournalBatch]:
        """Every submission, in the order they were made."""
        return list(self._batches.values())

    def in_flight(self) -> list[JournalBatch]:
        """The submissions not yet collected nor abandoned."""
        return [b for b in self._batches.values() if b.closed is None]

    @property
    def waves(self) -> int:
        """How many waves the run's submissions span (0 without any)."""
        return max((b.wave for b in self._batches.values()), default=-1) + 1

    # -- writing ---------------------------------------------------------------------

    def intent(self, label: str, target: str, model: str, wave: int, ids: list[str]) -> None:
        event = {"target": target, "model": model, "wave": wave, "custom_ids": ids}
        self._write("intent", label, event)

    def submitted(self, label: str, batch_id: str) -> None:
        self._write("submitted", label, {"batch_id": batch_id})

    def collected(self, label: str, state: str, succeeded: int, failed: int) -> None:
        self._write("collected", label, {"state": state, "succeeded": succeeded, "failed": failed})

    def abandoned(self, label: str, reason: str) -> None:
        self._write("abandoned", label, {"reason": reason})

    def _write(self, kind: str, label: str, fields: dict[str, Any]) -> None:
        event = {"event": kind, "label": label, **fields, "at": now_iso()}
        if self._fh is None:
            self._fh = open_private(self.path, "ab", buffering=0)
        write_line(self._fh, record_line(event))
        self._apply(event)

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            fh.close()
