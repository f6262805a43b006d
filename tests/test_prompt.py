"""The Conductor's prompt: ordinal listing, descriptions, templates, revision rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor.conductors.prompt import (
    PreviousRound,
    build_conductor_messages,
    builtin_templates,
    load_template,
)
from conductor.conductors.spec import parse_conductor_spec
from conductor.errors import TemplateFileError, UsageError
from conductor.targets import Worker

WORKERS = [
    Worker("gpt-5", "openai/gpt-5", description="strong at code"),
    Worker("claude", "anthropic/claude-sonnet-4-20250514", description="careful writer"),
]


def text(**kw: object) -> str:
    messages = build_conductor_messages("What is 2 + 2?", WORKERS, **kw)  # type: ignore[arg-type]
    assert len(messages) == 1 and messages[0]["role"] == "user"
    return messages[0]["content"]


def test_workers_are_listed_by_ordinal_with_names_hidden() -> None:
    prompt = text()
    assert "- Model 0\n- Model 1" in prompt
    for hidden in ("gpt-5", "claude", "anthropic", "strong at code"):
        assert hidden not in prompt
    assert prompt.rstrip().endswith("Question: What is 2 + 2?")
    assert "at most 5 steps" in prompt


def test_descriptions_only_when_enabled() -> None:
    prompt = text(show_descriptions=True)
    assert "- Model 0: strong at code\n- Model 1: careful writer" in prompt
    assert "gpt-5" not in prompt  # ids stay hidden even then


def test_max_steps_and_builtin_templates() -> None:
    assert {"default", "compact"} <= set(builtin_templates())
    assert "at most 3 steps" in text(max_steps=3, template="compact")


def test_user_template_file(tmp_path: Path) -> None:
    path = tmp_path / "trained.txt"
    path.write_text("POOL:\n${workers}\nQ: ${question}\nSTEPS: ${max_steps}\n")
    assert text(template=str(path), max_steps=4) == (
        "POOL:\n- Model 0\n- Model 1\nQ: What is 2 + 2?\nSTEPS: 4\n"
    )
    assert load_template(str(path)).startswith("POOL:")


def test_bad_templates_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match='no template file or shipped template named "no-such'):
        load_template("no-such-template")
    # Named like --pool and bench: a did-you-mean, then every shipped name.
    with pytest.raises(TemplateFileError) as info:
        load_template("compakt")
    message = str(info.value)
    assert '(did you mean "compact"?)' in message
    assert "shipped templates: chat, choose, compact, default, paper;" in message
    bad = tmp_path / "bad.txt"
    bad.write_text("Question:\n${question} and ${nonsense}")
    # Refused when read, naming the line, not when first filled.
    with pytest.raises(
        TemplateFileError, match=r"bad.txt:2: uses an unknown placeholder \$\{nonsense\}"
    ):
        text(template=str(bad))


def test_revision_round_shows_plan_and_answer() -> None:
    plan = 'model_id = [1]\nsubtasks = ["Add them"]\naccess_list = [[]]'
    prompt = text(previous=PreviousRound(plan, "ANSWER: 4"))
    assert plan in prompt and "ANSWER: 4" in prompt
    assert "model_id = []\nsubtasks = []\naccess_list = []" in prompt


@pytest.mark.parametrize(
    ("spec", "backend", "model", "api_base"),
    [
        (
            "http://localhost:8001/v1#conductor-7b",
            "endpoint",
            "conductor-7b",
            "http://localhost:8001/v1",
        ),
        ("https://host/v1", "endpoint", None, "https://host/v1"),
        ("prompted:gpt-5", "prompted", "gpt-5", None),
        ("local", "local", "smollm2", None),
        ("hf:org/name", "checkpoint", "hf:org/name", None),
    ],
)
def test_conductor_spec_shorthand(
    spec: str, backend: str, model: str | None, api_base: str | None
) -> None:
    cfg = parse_conductor_spec(spec)
    assert (cfg.backend, cfg.model, cfg.api_base) == (backend, model, api_base)


def test_bad_conductor_spec() -> None:
    with pytest.raises(UsageError, match="not understood"):
        parse_conductor_spec("gpt-5")


def test_workers_by_id_lists_the_pool_as_the_authors_do(tmp_path: Path) -> None:
    """${workers_by_id}: one "Model id i" line per worker, no bullet; with descriptions
    on, ": <description>" after it (the authors' list, dataset_utils.format_models_list)."""
    path = tmp_path / "theirs.txt"
    path.write_text("MODELS:\n${workers_by_id}\nQ: ${question}")
    assert text(template=str(path)) == "MODELS:\nModel id 0\nModel id 1\nQ: What is 2 + 2?"
    shown = text(template=str(path), show_descriptions=True)
    assert "MODELS:\nModel id 0: strong at code\nModel id 1: careful writer\nQ:" in shown
    assert "gpt-5" not in shown and "- Model" not in shown
    # Both forms may share a template; ${workers} keeps its bullets.
    both = tmp_path / "both.txt"
    both.write_text("${workers}|${workers_by_id}|${question}")
    assert text(template=str(both)).startswith("- Model 0\n- Model 1|Model id 0\nModel id 1|")
