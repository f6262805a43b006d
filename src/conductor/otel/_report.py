"""What a tracer did, as the command that held it reports it (no OpenTelemetry here:
the run's process reads it back from the exporter's)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceReport"]


@dataclass
class TraceReport:
    """What a tracer did: spans made, sent, refused or unreachable (``failed``), and
    dropped (the queue was full, or still held spans when closing gave up)."""

    where: str
    records: int = 0
    spans: int = 0
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    #: Records that could not be made into spans at all (a defect, or a record no
    #: reader should have let through).
    unplanned: int = 0
    reason: str | None = None

    def problem(self) -> str | None:
        """One sentence when spans were lost, else ``None``."""
        lost = self.failed + self.dropped
        why = f": {self.reason}" if self.reason else ""
        if self.unplanned:
            return f"{self.unplanned} of {self.records} records were not sent{why}"
        if not lost:
            return None
        return f"{lost} of {self.spans} spans could not be sent to {self.where}{why}"
