"""The sandbox that runs model-written code, under its older name: it is the package
:mod:`conductor.sandbox` now (this module only re-exports it for existing callers)."""

from __future__ import annotations

from conductor.sandbox import DEFAULT_OUTPUT_LIMIT, SandboxResult, run_job, run_sandboxed

__all__ = ["DEFAULT_OUTPUT_LIMIT", "SandboxResult", "run_job", "run_sandboxed"]
