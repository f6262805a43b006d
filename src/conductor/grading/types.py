"""What a grader reads and writes: :class:`Sample` (one benchmark item with its gold
answer) and :class:`Verdict` (the judgement of one answer, with the reason).

A benchmark reads top to bottom as prompt -> sample -> extract -> score: the
benchmark file (:class:`~conductor.benchmark.BenchmarkSpec`) says where the data is
and how to prompt and grade it, the dataset pipeline (:mod:`conductor.datasets`)
turns rows into samples, and a grader (:mod:`conductor.grading`) turns the final
answer into a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
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
