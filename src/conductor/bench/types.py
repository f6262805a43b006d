"""Types shared by the benchmark pieces: samples, verdicts, benchmark specs.

A benchmark reads top to bottom as prompt -> sample -> extract -> score:
:class:`BenchmarkSpec` says where the data is and how to prompt and grade it, each
:class:`Sample` is one question with its gold answer, and a grader turns the final
answer into a :class:`Verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "BenchmarkSpec",
    "DataSource",
    "Sample",
    "Verdict",
    "VerdictStatus",
]

#: correct / incorrect: graded; no_answer: nothing could be extracted;
#: grader_error: the grader itself failed; time_limit: the grader (or the code under
#: test) ran out of time.  Code graders refine "incorrect" in ``detail``
#: (wrong answer, runtime error, compile error).
VerdictStatus = Literal["correct", "incorrect", "no_answer", "grader_error", "time_limit"]


@dataclass(frozen=True)
class Verdict:
    """A grader's judgement of one answer, with the reason."""

    status: VerdictStatus
    reason: str
    extracted: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def score(self) -> float:
        return 1.0 if self.status == "correct" else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form kept in a run record's ``grade``."""
        return {
            "status": self.status,
            "score": self.score,
            "reason": self.reason,
            "extracted": self.extracted,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Sample:
    """One benchmark item.

    ``id`` is stable across runs (taken from the data, or a hash of the content).
    ``input`` holds the fields the prompt template uses (question, choices, ...);
    ``gold`` is what the grader compares against; ``metadata`` anything else worth
    keeping (e.g. a LiveCodeBench problem's tests or a release date).
    """

    id: str
    input: dict[str, Any]
    gold: Any
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataSource:
    """Where the items come from: a Hugging Face dataset at a pinned revision, a URL or
    a local file (JSON, JSONL, CSV or Parquet)."""

    kind: Literal["hf", "url", "file"]
    id: str | None = None
    revision: str | None = None
    config: str | None = None
    split: str = "test"
    path: str | None = None
    url: str | None = None
    #: A column whose value is the row itself (some datasets nest each row under one key).
    row: str | None = None
    #: Training sources only: the benchmark's ``fields`` with the train_source's overrides
    #: applied, its own ``filters`` and the field names to balance a sample over.
    fields: dict[str, str] | None = field(default=None, compare=False)
    filters: dict[str, Any] | None = field(default=None, compare=False)
    balance: tuple[str, ...] = ()


@dataclass(frozen=True)
class BenchmarkSpec:
    """A benchmark file (``benchmarks/NAME.yaml``), validated."""

    name: str
    source: DataSource
    fields: dict[str, str]
    prompt: str
    grader: str
    answer_format: str
    epochs: int = 1
    description: str | None = None
    grader_options: dict[str, Any] = field(default_factory=dict)
    filters: dict[str, Any] = field(default_factory=dict)
    train_source: DataSource | None = None
    #: No evaluation source: the benchmark exists for training mixes (``source`` is then
    #: the train_source, and ``conductor bench`` needs ``--data FILE``).
    training_only: bool = False
    paper_key: str | None = None
    path: Path | None = None
