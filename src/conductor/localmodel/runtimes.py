"""Which llama.cpp binding runs a local model: the registry of runtimes.

:data:`RUNTIMES` names each binding's adapter module (in order of preference), which
:func:`load_runtime` imports by name; :func:`installed_runtimes` and
:func:`choose_runtime` say which can run without importing any.  The registry is apart
from the seam the adapters are written against (:mod:`conductor.localmodel.runtime`),
so that the seam does not import the modules that import it.

``CONDUCTOR_LOCAL_RUNTIME`` picks one by name when both are installed; the choice is
made in the model's host process (:mod:`conductor.localmodel.host`), never in the
process that runs the orchestration.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import MissingDependencyError, UsageError, install_hint

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = [
    "RUNTIMES",
    "RUNTIME_ENV",
    "choose_runtime",
    "installed_runtimes",
    "load_runtime",
    "runtime_version",
]

#: Names a runtime: ``cyllama`` or ``llama-cpp-python``.
RUNTIME_ENV = "CONDUCTOR_LOCAL_RUNTIME"


@dataclass(frozen=True)
class _Entry:
    module: str  # this package's adapter module
    package: str  # the binding's import name, to see whether it is installed
    distribution: str  # its name on PyPI, for its version
    install: str  # the command that installs it


#: Each runtime by name, in order of preference.
RUNTIMES: dict[str, _Entry] = {
    "cyllama": _Entry(".runtime_cyllama", "cyllama", "cyllama", install_hint("local")),
    "llama-cpp-python": _Entry(
        ".runtime_llama_cpp",
        "llama_cpp",
        "llama-cpp-python",
        "pip install llama-cpp-python (a source build: a C/C++ compiler and CMake, minutes)",
    ),
}


def runtime_version(name: str) -> str:
    """The installed version of runtime ``name`` (no import), or ``?``."""
    try:
        return importlib.metadata.version(RUNTIMES[name].distribution)
    except (importlib.metadata.PackageNotFoundError, KeyError):
        return "?"


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def installed_runtimes() -> list[str]:
    """The runtimes whose binding is installed, in order of preference (no import)."""
    return [name for name, entry in RUNTIMES.items() if _installed(entry.package)]


def _requested(environ: dict[str, str] | os._Environ[str]) -> str | None:
    value = environ.get(RUNTIME_ENV, "").strip()
    if not value:
        return None
    if value not in RUNTIMES:
        raise UsageError(
            f"{RUNTIME_ENV}={value!r} names no local runtime "
            f"(expected {' or '.join(repr(name) for name in RUNTIMES)})"
        )
    return value


def choose_runtime(environ: dict[str, str] | os._Environ[str] | None = None) -> str:
    """The runtime a local model will use: ``CONDUCTOR_LOCAL_RUNTIME`` when set, else
    the first installed one; raises a one-sentence install hint when none is (or when
    the one asked for is not).  Imports nothing."""
    env = os.environ if environ is None else environ
    requested = _requested(env)
    if requested is not None:
        if not _installed(RUNTIMES[requested].package):
            raise MissingDependencyError(
                f"{RUNTIME_ENV} asks for {requested!r}, which is not installed: "
                f"{RUNTIMES[requested].install}"
            )
        return requested
    installed = installed_runtimes()
    if not installed:
        raise MissingDependencyError(
            f"the local extra is not installed (no llama.cpp runtime): {install_hint('local')}"
        )
    return installed[0]


def load_runtime(name: str) -> Runtime:
    """Import the adapter of runtime ``name`` (and with it the binding)."""
    entry = RUNTIMES[name]
    module = importlib.import_module(entry.module, __package__)
    factory: Callable[[], Runtime] = module.runtime
    return factory()
