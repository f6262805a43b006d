"""Which host paths a sandboxed interpreter sees, asked of that interpreter as the user
runs it, and where a module the sandbox did not see lives outside.

:func:`python_paths` asks the grading interpreter (with the caller's ``PYTHONPATH``,
``PYTHONUSERBASE``, ``PYTHONNOUSERSITE`` and ``HOME``, nothing else of its environment)
for its prefixes, standard library, site-packages, user site-packages and full
``sys.path`` (``PYTHONPATH`` and ``.pth`` entries, and the package directories of
setuptools' editable finders), and sorts them:

* **install directories** (prefixes, standard library, every ``site-packages`` /
  ``dist-packages``, the user's site-packages) are bound whole, read-only;
* **other ``sys.path`` entries** (``PYTHONPATH``, a ``.pth`` line, an editable finder's
  package) are bound item by item: only what Python could import from them (packages,
  modules, extension files, their ``__pycache__`` and metadata), so that a project
  directory on ``PYTHONPATH`` does not bring its run directories and data files in;
* **this project's own source checkout** (where the running ``conductor`` package
  comes from, when that is not an install directory) is never bound: graded code has
  no use for it;
* the current directory (``''``, which the interpreter puts first) is dropped.

Inside, the driver puts the same ``sys.path`` back (``python -I`` leaves ``PYTHONPATH``
and the user's site out) and processes the user's site-packages' ``.pth`` files.

:func:`missing_module` is the grader's check for an import that failed inside: a module
the interpreter finds outside, somewhere the sandbox does not show, is the sandbox's
fault (a ``grader_error`` naming the path), not the solution's.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PythonPaths", "missing_module", "python_paths"]

_ASK = r"""
import json, os, site, sys, sysconfig
p = sysconfig.get_paths()
install = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
install += [p.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
install += site.getsitepackages()
user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
finders = []
for f in sys.meta_path:
    mapping = getattr(sys.modules.get(type(f).__module__), "MAPPING", None)
    if isinstance(mapping, dict):
        finders += [v for v in mapping.values() if isinstance(v, str)]
print(json.dumps({"install": [d for d in install if d], "user": user,
                  "path": [q for q in sys.path if q], "finders": finders}))
"""

_FIND = r"""
import importlib.util, json, sys
try:
    spec = importlib.util.find_spec(sys.argv[1])
except Exception:
    spec = None
where = None
if spec is not None:
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    if where is None and spec.submodule_search_locations:
        where = list(spec.submodule_search_locations)[0]
print(json.dumps(where))
"""

# What the interpreter reads of the caller's environment to build its sys.path.
_ENV_KEYS = ("PYTHONPATH", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "HOME", "PYTHONHOME")
_IMPORTABLE = (".py", ".pyc", ".so", ".pyd", ".pth", ".zip", ".egg")
_METADATA = (".dist-info", ".egg-info")
_MISSING = re.compile(r"No module named '([A-Za-z_][\w.]*)'")


@dataclass(frozen=True)
class PythonPaths:
    """What a sandbox binds for an interpreter and the ``sys.path`` it uses inside.

    ``bind``: host paths bound read-only at the same place (absolute, existing, none
    inside another); ``sys_path``: the interpreter's ``sys.path`` without the current
    directory or the hidden entries; ``site_dirs``: directories whose ``.pth`` files the
    driver processes (the user's site-packages); ``hidden``: entries deliberately not
    bound (this project's own checkout)."""

    bind: tuple[str, ...]
    sys_path: tuple[str, ...]
    site_dirs: tuple[str, ...]
    hidden: tuple[str, ...]

    def shows(self, path: str) -> bool:
        """Whether ``path`` is visible inside (it is, or is under, a bound path)."""
        real = os.path.realpath(path)
        return any(p == q or _inside(p, q) for p in (path, real) for q in self.bind)


def _env() -> tuple[tuple[str, str], ...]:
    return tuple((k, os.environ[k]) for k in _ENV_KEYS if k in os.environ)


def _own_checkout() -> str:
    """The directory the running ``conductor`` package was imported from."""
    return str(Path(__file__).resolve().parents[2])


def _ask(python: str, env: tuple[tuple[str, str], ...], code: str, *args: str) -> str:
    try:
        done = subprocess.run(
            [python, "-c", code, *args],
            capture_output=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", **dict(env)},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OSError(f"cannot ask {python} for its paths: {exc}") from None
    if done.returncode != 0:
        raise OSError(f"cannot ask {python} for its paths: {done.stderr[-300:]!r}")
    return done.stdout.decode("utf-8", "replace")


def python_paths(python: str) -> PythonPaths:
    """The paths of interpreter ``python`` as the caller's environment sets it up (see
    the module's doc).  Raises :class:`OSError` when it cannot be asked."""
    return _python_paths(python, _env())


@functools.lru_cache(maxsize=16)
def _python_paths(python: str, env: tuple[tuple[str, str], ...]) -> PythonPaths:
    data = json.loads(_ask(python, env, _ASK))
    own = _own_checkout()
    install: set[str] = set()
    for path in [*data["install"], os.path.dirname(os.path.abspath(python))]:
        install.update(_existing_dirs(path))
    # the interpreter binary may be a symlink into another installation
    exe = os.path.realpath(python)
    if os.path.dirname(os.path.dirname(exe)) != "/":
        install.add(os.path.dirname(os.path.dirname(exe)))
    site_dirs: list[str] = []
    user = data.get("user")
    if isinstance(user, str) and os.path.isdir(user):
        install.update(_existing_dirs(user))
        site_dirs.append(user)
    entries = [p for p in data["path"] if os.path.isabs(p) and p != "/"]
    for path in entries:
        if os.path.basename(path.rstrip("/")) in ("site-packages", "dist-packages"):
            install.update(_existing_dirs(path))
    hidden: list[str] = []
    extra: set[str] = set()
    for path in [*entries, *data.get("finders", [])]:
        if not os.path.exists(path) or _covered(path, install):
            continue
        if _same_or_inside(os.path.realpath(path), own):
            hidden.append(path)
        elif os.path.isdir(path) and path in entries:
            extra.update(_importable(path))
        else:
            extra.add(os.path.abspath(path))
    found = sorted({*install, *extra})
    bind = tuple(p for p in found if not any(_inside(p, q) for q in found if q != p))
    sys_path = tuple(p for p in entries if p not in hidden)
    return PythonPaths(bind, sys_path, tuple(site_dirs), tuple(dict.fromkeys(hidden)))


def _existing_dirs(path: str) -> set[str]:
    """``path`` and its real path, where they are directories other than ``/``."""
    out = set()
    for p in (os.path.abspath(path), os.path.realpath(path)):
        if os.path.isdir(p) and p != "/":
            out.add(p)
    return out


def _importable(top: str) -> set[str]:
    """What Python could import from directory ``top`` (a ``PYTHONPATH`` or ``.pth``
    entry): packages, namespace packages, modules, extension files, ``__pycache__`` and
    package metadata; not data files or directories without Python in them."""
    out: set[str] = set()
    try:
        names = os.listdir(top)
    except OSError:
        return out
    for name in names:
        path = os.path.join(top, name)
        if os.path.isdir(path):
            if name.endswith(_METADATA) or name == "__pycache__" or _has_python(path):
                out.add(path)
        elif name.endswith(_IMPORTABLE):
            out.add(path)
    return out


def _has_python(path: str) -> bool:
    try:
        return any(n.endswith((".py", ".so", ".pyd")) for n in os.listdir(path))
    except OSError:
        return False


def _covered(path: str, dirs: set[str]) -> bool:
    return any(_same_or_inside(path, d) for d in dirs)


def _same_or_inside(path: str, top: str) -> bool:
    return path == top or _inside(path, top)


def _inside(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


@functools.lru_cache(maxsize=256)
def _where(python: str, env: tuple[tuple[str, str], ...], name: str) -> str | None:
    try:
        value = json.loads(_ask(python, env, _FIND, name))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def missing_module(text: str, python: str) -> str | None:
    """Why a failed import in ``text`` (a test's error or stderr) is the sandbox's
    fault, or None: a module named there (``No module named 'X'``) that ``python``
    imports outside, from a place the sandbox does not show.  A module found nowhere,
    or found where the sandbox shows it (the solution's own doing), or in this
    project's own checkout (hidden on purpose), is None."""
    names = dict.fromkeys(_MISSING.findall(text or ""))
    if not names:
        return None
    env = _env()
    try:
        paths = _python_paths(python, env)
    except OSError:
        return None
    for name in list(names)[:5]:
        where = _where(python, env, name)
        if where is None or paths.shows(where) or _covered(where, set(paths.hidden)):
            continue
        if _same_or_inside(os.path.realpath(where), _own_checkout()):
            continue
        return (
            f"module {name!r} is installed for {python} at {where}, which the sandbox "
            "does not show (install it in site-packages, the user site or a PYTHONPATH "
            "directory, or report this)"
        )
    return None
