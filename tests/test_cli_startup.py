"""What starting costs: every command's help is shown before any library it runs on is
imported, and a fully cached ``bench`` rerun imports none of what it never uses
(checked from ``python -X importtime``, the interpreter's own record of every import,
in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit.clock import scaled

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
            timeout=scaled(60),
        )
        assert res.returncode == 0, (command, res.stderr[-2000:])
        assert "Usage:" in res.stdout, command
        heavy = heavy_among(imported_modules(res.stderr))
        if heavy:
            loaded[" ".join(command) or "(root)"] = heavy
    assert loaded == {}


#: What a fully cached ``bench`` rerun has no use for: every sample is replayed from the
#: sample cache, so no model is called (no SDK, no HTTP client), nothing is graded (no
#: math-verify or sandbox), nothing is downloaded, and a Conductor that is not a
#: checkpoint has no training questions to compare.
NOT_FOR_A_CACHED_RERUN = (
    *(h for h in HEAVY if h not in ("asyncio", "diskcache", "pydantic", "rich", "yaml")),
    "conductor.datasets.questions",
    "conductor.conductors.checkpoint",
    "conductor.grading.lcb_tests",
    "conductor.llm.http_client",
    "conductor.llm.openai_client",
    "conductor.render.calls",
    "conductor.sandbox",
    "http.client",
    "math_verify",
    "sympy",
    "urllib.request",
)


@pytest.mark.process
def test_a_cached_bench_rerun_imports_nothing_it_does_not_use(tmp_path: Path) -> None:
    from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

    from conductor.testing import FakeLLMServer

    data = tmp_path / "math.jsonl"
    rows = [{"problem": f"Q{i}", "answer": "1", "unique_id": f"t/{i}"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    with FakeLLMServer() as server:
        server.script(CONDUCTOR_MODEL, lists([0], ["Solve the problem."], [[]]))
        server.script("w0", "\\boxed{1}")
        pool = write_pool(tmp_path / "pool.yaml", pool_dict(server, [worker(server, "w0")]))
        bench = ["bench", "math500", "--pool", str(pool), "--data", str(data)]

        def run(out: str, *flags: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, *flags, "-m", "conductor", *bench, "--out", str(tmp_path / out)]
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=scaled(120), env=env
            )

        cold = run("cold")
        assert cold.returncode == 0, cold.stderr[-2000:]
        calls = len(server.requests)
        rerun = run("rerun", "-X", "importtime")
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert len(server.requests) == calls  # every sample replayed
    modules = imported_modules(rerun.stderr)
    assert "conductor.bench.runner" in modules  # the reader saw the run itself
    loaded = sorted(
        name
        for name in NOT_FOR_A_CACHED_RERUN
        if any(m == name or m.startswith(name + ".") for m in modules)
    )
    assert loaded == []
