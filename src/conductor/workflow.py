"""Workflows: the Conductor's plan, as steps over the worker pool.

A reply from the Conductor ends with three Python lists of equal length::

    model_id = [2, 0]
    subtasks = ["Design an algorithm that ...", "Implement it in Python"]
    access_list = [[], ["all"]]

:func:`parse_workflow` turns such a reply into a :class:`Workflow` or raises
:class:`~conductor.errors.WorkflowParseError` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

from .errors import WorkflowParseError

__all__ = [
    "ALL",
    "Access",
    "Step",
    "Workflow",
    "WorkflowParseError",
    "format_workflow",
    "parse_workflow",
]

ALL: Literal["all"] = "all"
#: ``"all"`` (every earlier step), or the explicit indices of earlier steps
#: (the empty tuple means the step sees no earlier step).
Access = Union[Literal["all"], tuple[int, ...]]


@dataclass(frozen=True)
class Step:
    """One step: which worker (by its ordinal in the pool as listed to the
    Conductor), the instruction written for it, and which earlier steps it sees."""

    worker: int
    subtask: str
    access: Access = ()

    def visible(self, index: int) -> tuple[int, ...]:
        """Indices of the earlier steps (of the same round) visible to step ``index``."""
        if self.access == ALL:
            return tuple(range(index))
        assert not isinstance(self.access, str)
        return tuple(i for i in self.access if i < index)


@dataclass(frozen=True)
class Workflow:
    """An ordered list of steps.  Empty only in a recursive round ("keep the answer")."""

    steps: tuple[Step, ...]

    @property
    def is_empty(self) -> bool:
        return not self.steps

    def dependencies(self) -> list[tuple[int, ...]]:
        """For each step, the earlier steps it must wait for."""
        return [s.visible(i) for i, s in enumerate(self.steps)]
