"""The program a sandbox's first process runs: the sandbox's own driver
(:mod:`conductor.sandbox.inside`) and the caller's job driver, assembled into one source,
and that source compiled once per process.

Why one source from several files: the driver runs under ``python -I``, where
``conductor`` is not importable, and one file is all that enters the sandbox (no
directory of modules on the inner interpreter's path for the code it guards against to
reach); the files share one namespace, as one module's code does, so a job driver calls
the sandbox's functions by name and a judge that snapshots "the driver's globals" sees
all of it.  Each file is also a real module for linters and type checkers (the names it
takes from another are imported under ``TYPE_CHECKING`` only).

Why bytecode: Python compiles a script it is given on every start, and the driver's
1,900 lines took 43 ms to compile: a third of a LiveCodeBench sample's grading time.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._bwrap import DRIVER

__all__ = ["JobDriver", "driver_bytecode", "driver_source"]

_INSIDE = Path(__file__).resolve().parent / "inside"
#: The files of the sandbox's own driver, in the order they are assembled: the driver
#: (``main``), the guard, the ``program`` job (``job_program``).
PARTS: tuple[str, ...] = ("driver.py", "guard.py", "program.py")
# A __future__ import must open its module: the first file's holds for all.
_FUTURE = re.compile(rb"^from __future__ import annotations\n", re.MULTILINE)
# Started last, once every file has defined its names (the jobs among them).
# Everything was reported with os.write: the interpreter's orderly shutdown (every
# module torn down) would only delay the end of the run.
_ENTRY = b'\nif __name__ == "__main__":\n    os._exit(main(sys.argv))\n'


@dataclass(frozen=True)
class JobDriver:
    """Job kinds the sandbox does not know, brought by its caller (a grader).

    ``files``: Python files, standard library only, that run inside the sandbox as part
    of its driver: one namespace with :mod:`conductor.sandbox.inside`, whose functions
    they call by name (:func:`~conductor.sandbox.inside.driver.fork_child`,
    :func:`~conductor.sandbox.inside.guard.install_guard`, ...).  A job of kind ``K``
    is run by the function ``job_K`` the files define (``job_lcb``), called with no
    arguments once the job is in ``CFG["job"]``.
    """

    files: tuple[Path, ...]

    @classmethod
    def of(cls, *files: Path | str) -> JobDriver:
        """The job driver made of ``files`` (absolute paths), in this order."""
        return cls(tuple(Path(f).resolve() for f in files))


def driver_source(job_driver: JobDriver | None = None) -> bytes:
    """The driver program: the sandbox's :data:`PARTS`, then ``job_driver``'s files, then
    the call of ``main`` (read from the files each time, as the sandbox starts)."""
    files: Sequence[Path] = [_INSIDE / part for part in PARTS]
    if job_driver is not None:
        files = [*files, *job_driver.files]
    chunks = []
    for n, path in enumerate(files):
        text = path.read_bytes()
        chunks.append(_FUTURE.sub(b"", text, count=1) if n else text)
    return b"\n".join([*chunks, _ENTRY])


def driver_bytecode(interpreter: str, source: bytes) -> bytes | None:
    """``source`` compiled for ``interpreter`` (a ``.pyc`` file's bytes), or None where
    that interpreter is not this one (another version reads other bytecode)."""
    if os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        return None
    return _compiled(source)


# a few drivers a process uses (the program job's, each grader's): each compiled once
@functools.lru_cache(maxsize=8)
def _compiled(source: bytes) -> bytes:
    import importlib.util
    import marshal

    code = compile(source, DRIVER, "exec", dont_inherit=True)
    # PEP 552 header: magic, flags (1 = hash-based, not checked against a source), the
    # source's hash; a .pyc named on the command line is run after its 16-byte header.
    flags = (1).to_bytes(4, "little")
    header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
    return header + marshal.dumps(code)
