"""An option that ``ask``, ``bench`` and ``serve`` share is declared once
(``cli/_options.py``, the tracing options in ``cli/_tracing.py``): every command that
takes it spells, explains and bounds it the same way."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from conductor.cli.app import app

COMMANDS = ("ask", "bench", "serve")


def _options(root: Any, name: str) -> dict[str, Any]:
    command = root.commands[name]
    return {p.opts[0]: p for p in command.params if p.param_type_name == "option"}


def _shape(option: Any) -> tuple[Any, ...]:
    """What a user sees of an option: its spellings, help, type and range, flag or not."""
    kind = getattr(option, "type_descriptor", None)
    annotation = getattr(kind, "annotation", None)
    bounds = (getattr(option, "min", None), getattr(option, "max", None))
    return (tuple(option.opts), option.help, str(annotation), bounds, option.is_flag)


def _shared(root: Any) -> dict[str, list[tuple[str, tuple[Any, ...]]]]:
    found: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    for name in COMMANDS:
        for flag, option in _options(root, name).items():
            found.setdefault(flag, []).append((name, _shape(option)))
    return {flag: seen for flag, seen in found.items() if len(seen) > 1}


#: Options spelt alike that mean different things, and why.
NOT_SHARED = {"--out": "ask writes one record file there, bench a run directory"}


def _differing(root: Any) -> list[str]:
    """The shared options whose declarations differ between commands."""
    return [
        flag
        for flag, seen in _shared(root).items()
        if flag not in NOT_SHARED and len({shape for _name, shape in seen}) > 1
    ]


def test_a_shared_option_reads_the_same_in_every_command() -> None:
    root = typer.main.get_group(app)
    shared = set(_shared(root))
    # The options the three commands have in common, at the least.
    assert {"--pool", "--conductor", "--no-cache", "--otel", "--no-otel"} <= shared
    assert {"--strategy", "--max-steps", "--rounds", "--budget-usd", "--max-calls"} <= shared
    assert _differing(root) == []


def test_the_check_catches_an_option_declared_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: ``bench`` given its own ``--no-cache`` again (as it had, with
    another help text) is caught."""
    root = typer.main.get_group(app)
    option = _options(root, "bench")["--no-cache"]
    monkeypatch.setattr(option, "help", "Do not use the call cache.")
    assert _differing(root) == ["--no-cache"]
