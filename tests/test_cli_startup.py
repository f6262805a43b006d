"""What ``--help`` costs: every command's help is shown before any library it runs on is
imported (checked from ``python -X importtime``, the interpreter's own record of every
import, in a fresh process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Not one of these is needed to print help.  The help is plain click text
#: (``rich_markup_mode=None``), so rich is only for what commands print.
HEAVY = (
    "aiohttp",
    "anthropic",
    "asyncio",
    "datasets",
    "diskcache",
    "google.genai",
    "httpx",
    "litellm",
    "llama_cpp",
    "numpy",
    "openai",
    "pydantic",
    "rich",
    "torch",
    "transformers",
    "yaml",
)


def imported_modules(importtime: str) -> set[str]:
    """The modules named in ``-X importtime`` output."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and line.count("|") == 2 and "[us]" not in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules))


def every_command() -> list[tuple[str, ...]]:
    """Every command path of the app, groups included: (), ("ask",), ("pools", "check")..."""
    import typer

    from conductor.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


def test_the_reader_names_every_module_and_no_header() -> None:
    sample = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       100 |        100 |     pydantic_core._pydantic_core\n"
        "import time:       300 |        900 |   pydantic.main\n"
        "import time:        50 |         50 | yamlish\n"
    )
    modules = imported_modules(sample)
    assert modules == {"pydantic_core._pydantic_core", "pydantic.main", "yamlish"}
    assert heavy_among(modules) == ["pydantic"]  # pydantic_core and yamlish are not it


def test_every_command_is_walked() -> None:
    commands = every_command()
    assert () in commands and ("bench",) in commands and ("ask",) in commands
    assert ("pools", "check") in commands and ("cache",) in commands
    assert len(commands) == len(set(commands))


@pytest.mark.process
def test_no_help_imports_a_heavy_library() -> None:
    loaded = {}
    for command in every_command():
        res = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "conductor", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, (command, res.stderr[-2000:])
        assert "Usage:" in res.stdout, command
        heavy = heavy_among(imported_modules(res.stderr))
        if heavy:
            loaded[" ".join(command) or "(root)"] = heavy
    assert loaded == {}
