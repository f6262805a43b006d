"""Benchmarks: their files, the bench runner and what a run directory goes through.

The benchmark files (:mod:`.spec`, their loader sections in :mod:`.schema`), the runner
and its sample loop (:mod:`.runner`) over a typed session (:mod:`.session`), taking a
run directory (:mod:`.claim`, :mod:`.runconfig`), stop reasons (:mod:`.faults`),
replaying graded samples (:mod:`.samplecache`), merging shards (:mod:`.merge`), a
batched run's setup (:mod:`.batchrun`), what a run will cost (:mod:`.estimate`), what
a trained Conductor was trained on (:mod:`.trained`) and the paper's figures
(:mod:`.paper`).  A benchmark's items are read by :mod:`conductor.datasets` and graded
by :mod:`conductor.grading`.
"""

from __future__ import annotations

__all__: list[str] = []
