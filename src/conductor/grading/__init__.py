"""Graders: turn a model's final answer into a :class:`~conductor.grading.types.Verdict`.

A grader is looked up by the name a benchmark file gives (``grader: math``) with
:func:`get_grader`.  Grader modules are imported only when asked for, so this package
stays cheap to import and a grader whose module (or optional dependency) is missing
breaks only the benchmarks that use it.

Every grader bounds its work: a response longer than ``max_chars`` (64k by default) is
cut to its tail before extraction (answers live at the end), and grading time is capped.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol, runtime_checkable

from conductor.errors import MissingDependencyError, UsageError
from conductor.grading.types import Sample, Verdict

__all__ = ["GRADER_NAMES", "Grader", "get_grader", "warm_grader"]


@runtime_checkable
class Grader(Protocol):
    """What every grader offers.

    ``grade`` is synchronous and may block (a comparison in a child process, code under
    test); async callers run it in a thread (``asyncio.to_thread``).  It never raises for
    a bad answer: failures of the grader itself come back as ``grader_error`` verdicts.
    """

    name: str
    version: str

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Judge ``response`` (the final answer text, ``None`` when there was none)."""
        ...


# name -> (module relative to this package, class name).  Imported on first use only.
_REGISTRY: dict[str, tuple[str, str]] = {
    "choice": (".choice", "ChoiceGrader"),
    "math": (".math", "MathGrader"),
    "code": (".code", "CodeGrader"),
    "short": (".short", "ShortAnswerGrader"),
}

#: The grader names a benchmark file may use.
GRADER_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))


def get_grader(name: str, options: dict[str, Any] | None = None, *, warm: bool = True) -> Grader:
    """Return a new grader called ``name``, built with ``options`` as keyword arguments.

    A grader that keeps helpers ready (the math grader's comparison processes) starts
    them as it is built; with ``warm=False`` it starts them on its first grade or on
    :func:`warm_grader`, so that a run which grades nothing (every sample replayed from
    the cache) never pays for them.

    Raises :class:`~conductor.errors.UsageError` for an unknown name or option (the
    message lists the valid ones) and :class:`~conductor.errors.MissingDependencyError`
    when the grader needs a package that is not installed.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        valid = ", ".join(GRADER_NAMES)
        raise UsageError(f"unknown grader {name!r}; valid graders are: {valid}")
    module_name, class_name = entry
    try:
        module = importlib.import_module(module_name, __name__)
    except ModuleNotFoundError as exc:
        own = f"{__name__}{module_name}"
        if exc.name == own:
            raise UsageError(
                f"grader {name!r} is not available in this installation ({own} is missing)"
            ) from exc
        raise MissingDependencyError(
            f"grader {name!r} needs the package {exc.name!r}, which is not installed"
        ) from exc
    cls = getattr(module, class_name)
    opts = dict(options or {})
    accepted = _keyword_parameters(cls)
    if accepted is not None:
        unknown = sorted(set(opts) - accepted)
        if unknown:
            valid = ", ".join(sorted(accepted)) or "none"
            raise UsageError(
                f"grader {name!r} has no option {unknown[0]!r}; valid options are: {valid}"
            )
    if not warm and accepted is not None and "warm" in accepted:
        opts["warm"] = False
    try:
        grader: Grader = cls(**opts)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"bad options for grader {name!r}: {exc}") from exc
    return grader


def warm_grader(grader: Grader) -> None:
    """Start, in the background, what ``grader`` keeps ready (see :func:`get_grader`);
    nothing for a grader that keeps nothing."""
    warm = getattr(grader, "warm", None)
    if callable(warm):
        warm()


def _keyword_parameters(cls: type) -> set[str] | None:
    """The keyword names ``cls`` accepts, or ``None`` when it takes ``**kwargs``."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    names: set[str] = set()
    for param in params:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.add(param.name)
    return names
