"""Placement: where a run's work is done when one machine is not enough.

:mod:`conductor.placement.raycluster` sends work to the nodes of a Ray cluster: code
grading as tasks that need the ``sandbox`` resource (declared only by nodes where
bubblewrap runs), and whole samples as tasks that run one sample's strategy on a node.
Ray is an optional extra (``pip install 'conductor-orchestrate[ray]'``), imported only
when a cluster is named.  The driver stays the only writer of a run directory: tasks
return verdicts and records, never write files.

This floor sits above the strategies and the graders it runs and below the benchmark
runner that places its work here; it knows no run directory.
"""

from __future__ import annotations
