"""What one sandboxed run may use: :class:`SandboxLimits`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_DISK_MB", "DEFAULT_LIMITS", "DEFAULT_OUTPUT_LIMIT", "SandboxLimits"]

#: Default cap on captured stdout / stderr, in bytes.
DEFAULT_OUTPUT_LIMIT = 1_000_000
#: Default size of the bubblewrap sandbox's tmpfs (work dir, /tmp, /dev/shm), in MiB.
DEFAULT_DISK_MB = 256


@dataclass(frozen=True)
class SandboxLimits:
    """What one sandboxed run may use, and what comes back of it.

    Per process the driver starts (resource limits, set before model code runs):
    ``cpu_time_s`` (``RLIMIT_CPU``), ``memory_mb`` (``RLIMIT_AS``: what a process maps,
    heap and shared mappings included), ``max_file_mb`` (``RLIMIT_FSIZE``);
    ``max_processes`` (``RLIMIT_NPROC``, threads included: tasks of the run at once) and
    ``allow_subprocess`` (whether model code may start processes at all: without it a
    seccomp filter refuses ``fork``, ``clone`` of a process and ``execve``).

    Per run: ``wall_time_s``, from when the job is sent, after which every process of
    the run is killed; ``disk_mb``, the bubblewrap sandbox's one writable file system
    (a tmpfs holding the work directory, ``/tmp`` and ``/dev/shm``); ``output_limit``,
    the bytes of the first process's stdout and of its stderr kept (the rest is read
    and dropped); ``report_limit``, the bytes of result frames kept in all;
    ``frame_limit``, the longest result frame kept (a longer one is dropped as it
    streams, and a note says so; None: ``13 * output_limit + 1 MiB``, room for two
    outputs of ``output_limit`` bytes JSON-escaped at up to 6 bytes a byte).

    Which limits bound a sample's memory as a whole, and which do not, is
    :mod:`conductor.sandbox`'s doc ("Memory and processes").
    """

    cpu_time_s: float = 10.0
    wall_time_s: float = 20.0
    memory_mb: int = 1024
    max_file_mb: int = 64
    max_processes: int = 64
    allow_subprocess: bool = False
    disk_mb: int = DEFAULT_DISK_MB
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    report_limit: int = 64 * DEFAULT_OUTPUT_LIMIT
    frame_limit: int | None = None

    def longest_frame(self) -> int:
        """The longest report line kept (:attr:`frame_limit`, or its default)."""
        if self.frame_limit is not None:
            return int(self.frame_limit)
        return 13 * int(self.output_limit) + (1 << 20)


#: The limits of a run that names none.
DEFAULT_LIMITS = SandboxLimits()
