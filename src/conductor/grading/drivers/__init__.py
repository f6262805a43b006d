"""The code grader's job drivers: the part of grading that runs inside the sandbox.

Each is a :class:`~conductor.sandbox.JobDriver`, files of standard-library Python that
the sandbox assembles with its own driver (:mod:`conductor.sandbox.inside`) into the one
program its first process runs; there they call the sandbox's functions by name and
register their job kinds.  The sandbox itself knows no benchmark (as inspect_ai's does
not): what a test is, how it runs and what comes back of it is here.

* :data:`LIVECODEBENCH` (:mod:`.lcb`, job kind ``lcb``): runs a sample's stdin tests
  each in a fresh child, or a call-based sample's tests in one child, and forwards raw
  outputs; the verdicts are the grader's (:mod:`conductor.grading.code`);
* :data:`BIGCODEBENCH` (:mod:`.bcb`, job kind ``bcb``, with :mod:`.bcb_judge` and
  :mod:`.bcb_values`): runs each test method in a fresh child whose judge thread writes
  its verdict.

The files import nothing from ``conductor`` at run time (inside, it is not there); the
sandbox driver's names they use are imported for the type checker only
(tests/test_layering.py checks both).
"""

from __future__ import annotations

from pathlib import Path

from conductor.sandbox import JobDriver

__all__ = ["BIGCODEBENCH", "LIVECODEBENCH"]

_HERE = Path(__file__).resolve().parent

#: LiveCodeBench's tests (job kind ``lcb``).
LIVECODEBENCH = JobDriver.of(_HERE / "lcb.py")
#: BigCodeBench's tests and their judge (job kind ``bcb``).
BIGCODEBENCH = JobDriver.of(_HERE / "bcb_values.py", _HERE / "bcb_judge.py", _HERE / "bcb.py")
