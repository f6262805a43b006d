"""conductor: run and evaluate Conductor orchestrations.

A Conductor model reads a question and a numbered pool of worker LLMs and writes a
workflow (which worker does which subtask, seeing which earlier answers); the
workflow runs and the last answer is the answer.  This module is the public API; the
submodules it re-exports from are private in spirit and may move.

Every name but the errors is imported on first use, so ``import conductor`` (which
``python -m conductor --help`` runs first) loads neither the model clients nor the YAML
and record readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    AuthenticationError,
    BadRequestError,
    ConductorError,
    ConfigFileError,
    ConnectionFailedError,
    MissingDependencyError,
    ModelCallError,
    PoolError,
    RateLimitError,
    RecordError,
    RequestTimeoutError,
    RetryableError,
    ServerError,
    UsageError,
    WorkflowParseError,
)

if TYPE_CHECKING:
    from .conductors.spec import Conductor, resolve_conductor
    from .execute import Orchestrator, RunSettings, ask
    from .llm.cache import ResponseCache
    from .pool import Pool, load_pool
    from .record import RunRecord, read_record, write_record
    from .targets import ConductorConfig, Price, Worker
    from .workflow import ALL, Step, Workflow, parse_workflow

__version__ = "0.1.0"

__all__ = [
    "ALL",
    "AuthenticationError",
    "BadRequestError",
    "Conductor",
    "ConductorConfig",
    "ConductorError",
    "ConfigFileError",
    "ConnectionFailedError",
    "MissingDependencyError",
    "ModelCallError",
    "Orchestrator",
    "Pool",
    "PoolError",
    "Price",
    "RateLimitError",
    "RecordError",
    "RequestTimeoutError",
    "ResponseCache",
    "RetryableError",
    "RunRecord",
    "RunSettings",
    "ServerError",
    "Step",
    "UsageError",
    "Worker",
    "Workflow",
    "WorkflowParseError",
    "__version__",
    "ask",
    "load_pool",
    "parse_workflow",
    "read_record",
    "resolve_conductor",
    "write_record",
]

_LAZY = {
    "ALL": ("workflow", "ALL"),
    "ConductorConfig": ("targets", "ConductorConfig"),
    "Pool": ("pool", "Pool"),
    "Price": ("targets", "Price"),
    "RunRecord": ("record", "RunRecord"),
    "Step": ("workflow", "Step"),
    "Worker": ("targets", "Worker"),
    "Workflow": ("workflow", "Workflow"),
    "read_record": ("record", "read_record"),
    "write_record": ("record", "write_record"),
    "ResponseCache": ("llm.cache", "ResponseCache"),
    "Conductor": ("conductors.spec", "Conductor"),
    "resolve_conductor": ("conductors.spec", "resolve_conductor"),
    "Orchestrator": ("execute", "Orchestrator"),
    "RunSettings": ("execute", "RunSettings"),
    "ask": ("execute", "ask"),
    "load_pool": ("pool", "load_pool"),
    "parse_workflow": ("workflow", "parse_workflow"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'conductor' has no attribute {name!r}")
