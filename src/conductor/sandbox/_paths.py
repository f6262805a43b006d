"""Which host directories a sandboxed interpreter needs, asked of that interpreter.

The allow-list the bubblewrap engine binds read-only: the interpreter's prefixes (a
venv's and the installation it was made from), its standard library and its
site-packages, each as the interpreter itself reports them (``python -I``: no
``PYTHONPATH``, no user site-packages).  Entries of ``sys.path`` that come from
``PYTHONPATH`` or ``.pth`` files of editable installs (a source checkout, this project
included) are not on it: graded code has no use for them, and they sit next to run
directories and data files.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

__all__ = ["interpreter_dirs"]

_ASK = (
    "import json, site, sys, sysconfig\n"
    "p = sysconfig.get_paths()\n"
    "dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]\n"
    "dirs += [p.get(k) for k in ('stdlib', 'platstdlib', 'purelib', 'platlib')]\n"
    "dirs += site.getsitepackages()\n"
    "print(json.dumps({'dirs': [d for d in dirs if d], 'exe': sys.executable}))\n"
)


@functools.lru_cache(maxsize=8)
def interpreter_dirs(python: str) -> tuple[str, ...]:
    """The directories ``python`` needs (absolute, existing, none inside another),
    with the real directory of each symlinked one as well.  Raises :class:`OSError`
    when the interpreter cannot be asked."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", _ASK],
            capture_output=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OSError(f"cannot ask {python} for its directories: {exc}") from None
    if done.returncode != 0:
        raise OSError(f"cannot ask {python} for its directories: {done.stderr[-300:]!r}")
    data = json.loads(done.stdout)
    found: set[str] = set()
    for path in [*data["dirs"], os.path.dirname(os.path.abspath(python))]:
        for p in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(p) and p != "/":
                found.add(p)
    # the interpreter binary may be a symlink into another installation
    exe = os.path.realpath(python)
    if os.path.dirname(os.path.dirname(exe)) != "/":
        found.add(os.path.dirname(os.path.dirname(exe)))
    ordered = sorted(found)
    return tuple(p for p in ordered if not any(_inside(p, q) for q in ordered if q != p))


def _inside(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")
