"""The ``program`` job (:func:`conductor.sandbox.run_sandboxed`'s): run ``main.py`` as
``__main__`` in one child, its standard streams the sandbox's own (standard library
only; part of the sandbox's driver, :mod:`conductor.sandbox.inside`)."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # the driver and the guard: this file is assembled with them into one namespace
    from conductor.sandbox.inside.driver import (
        CFG,
        fork_child,
        memfd,
        read_fd,
        report,
        status_json,
        wait_child,
    )
    from conductor.sandbox.inside.guard import install_guard


def job_program() -> None:
    """Run ``main.py`` as ``__main__``; its stdio are the launcher's."""
    work = CFG["workdir"]
    main_path = os.path.join(work, "main.py")
    with open(main_path, "rb") as fh:
        code = compile(fh.read(), main_path, "exec")

    def body() -> int:
        import types

        # the guard reports on stderr's neighbour: a private dup of the report channel
        install_guard(work, CFG["allow_subprocess"], guard_fd)
        sys.argv = [main_path, *CFG["args"]]
        sys.path.insert(0, work)
        module = types.ModuleType("__main__")
        module.__file__ = main_path
        sys.modules["__main__"] = module
        exec(code, module.__dict__)
        return 0

    guard_fd = memfd("guard")
    pid = fork_child(body)
    status, _ = wait_child(pid, 1e9)
    blocked, _ = read_fd(guard_fd, 1 << 20)
    for line in blocked.decode("utf-8", "replace").splitlines()[:100]:
        report("B", line[2:] if line.startswith("B ") else line)
    report("S", json.dumps(status_json(status)))
