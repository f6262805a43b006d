"""Benchmarks: definition files, dataset loading, graders and the bench runner."""

from __future__ import annotations

__all__: list[str] = []
