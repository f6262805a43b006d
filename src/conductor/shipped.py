"""The files that ship with conductor: pools, benchmarks and Conductor prompt templates.

One function lists each kind (:func:`shipped`) and one finds a file by shipped name or
by path (:func:`resolve_shipped`), so that ``--pool NAME``, ``conductor bench NAME``
and ``template: NAME`` read names alike and fail alike: a did-you-mean, then every
shipped name.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import BenchmarkFileError, ConfigFileError, PoolError, TemplateFileError
from .userfiles import is_regular

__all__ = [
    "ShippedKind",
    "is_shipped",
    "resolve_shipped",
    "shipped",
    "shipped_dir",
    "shipped_names",
]

ShippedKind = Literal["pool", "benchmark", "template"]


@dataclass(frozen=True)
class _Kind:
    folder: str
    suffixes: tuple[str, ...]
    error: type[ConfigFileError]
    #: Names that are found but not listed or offered (the revision text, which is
    #: part of every text template rather than a template of its own).
    hidden: frozenset[str] = frozenset()
    #: Whether a shipped name wins over a file of the same name in the current folder
    #: (a checkpoint that names the ``default`` template must get the one it was
    #: trained with).
    names_first: bool = False


_KINDS: dict[ShippedKind, _Kind] = {
    "pool": _Kind("pools", (".yaml",), PoolError),
    "benchmark": _Kind("benchmarks", (".yaml",), BenchmarkFileError),
    "template": _Kind(
        "prompts",
        (".txt", ".yaml", ".yml"),
        TemplateFileError,
        hidden=frozenset({"revise"}),
        names_first=True,
    ),
}


def shipped_dir(kind: ShippedKind) -> Path:
    """The folder of shipped files of ``kind``.

    Installed, it is inside the package (``conductor/pools``, a symlink to the
    repository's ``pools/`` in a checkout); otherwise the repository's top-level folder.
    """
    here = Path(__file__).resolve().parent
    folder = _KINDS[kind].folder
    packaged = here / folder
    if packaged.is_dir():
        return packaged
    return here.parent.parent / folder


def _by_name(kind: ShippedKind) -> dict[str, Path]:
    """Every shipped file of ``kind`` by name (its stem); where two files share a stem
    the earlier suffix wins."""
    folder = shipped_dir(kind)
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    for suffix in _KINDS[kind].suffixes:
        for path in sorted(folder.glob(f"*{suffix}")):
            if path.is_file():
                found.setdefault(path.stem, path)
    return found


def shipped(kind: ShippedKind) -> list[Path]:
    """The shipped files of ``kind`` a user may name, sorted by name."""
    hidden = _KINDS[kind].hidden
    return [path for name, path in sorted(_by_name(kind).items()) if name not in hidden]


def shipped_names(kind: ShippedKind) -> list[str]:
    """The names (``frontier``, ``gpqa-diamond``, ``default``) of :func:`shipped`."""
    return [path.stem for path in shipped(kind)]


def is_shipped(kind: ShippedKind, path: Path) -> bool:
    """Whether ``path`` is one of the shipped files of ``kind`` (a file to copy before
    editing: an upgrade replaces it)."""
    try:
        return path.resolve().parent == shipped_dir(kind).resolve()
    except OSError:
        return False


def resolve_shipped(kind: ShippedKind, name_or_path: str) -> Path:
    """An existing file at ``name_or_path``, or the shipped file of ``kind`` it names.

    ``"frontier"`` (or ``"frontier.yaml"``) finds the shipped pool ``frontier``; a value
    with a path separator is only ever a path.  Otherwise raises the kind's
    :class:`~conductor.errors.ConfigFileError` naming up to three close shipped names
    and listing all of them.
    """
    spec = _KINDS[kind]
    is_path = "/" in name_or_path or os.sep in name_or_path
    by_name = {} if is_path else _by_name(kind)
    if spec.names_first and name_or_path in by_name:
        return by_name[name_or_path]
    candidate = Path(name_or_path).expanduser()
    if is_regular(candidate):
        return candidate
    stem = next(
        (name_or_path[: -len(s)] for s in spec.suffixes if name_or_path.endswith(s)),
        name_or_path,
    )
    if stem in by_name:
        return by_name[stem]
    if os.path.lexists(candidate):
        # Something is there but not a file (a directory, a FIFO, a device, a looping
        # link): its reader refuses it, saying what it is, rather than "no such file".
        return candidate
    names = shipped_names(kind)
    listed = ", ".join(names) or "none"
    # A path is matched by its file name: "./pools/frontir.yaml" still means frontier.
    close = difflib.get_close_matches(candidate.stem if is_path else stem, names, n=3)
    if is_path:
        hint = f" (did you mean the shipped {kind} {_either(close)}?)" if close else ""
        raise spec.error(
            f'no {kind} file "{name_or_path}": no such file{hint}; '
            f"give an existing {kind} file, or a shipped {kind} by name: {listed}"
        )
    hint = f" (did you mean {_either(close)}?)" if close else ""
    raise spec.error(
        f'no {kind} file or shipped {kind} named "{name_or_path}"{hint}; '
        f"shipped {kind}s: {listed}; give one of those names or a {kind} file's path"
    )


def _either(names: list[str]) -> str:
    """``"a"``, ``"a" or "b"``, ``"a", "b" or "c"``."""
    quoted = [f'"{n}"' for n in names]
    if len(quoted) == 1:
        return quoted[0]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"
