"""``conductor view`` and the static pictures: workflow graphs, charts.

The modules are imported by name (``conductor.view.data``, ``conductor.view.graph``,
``conductor.view.plots``, ...); this package imports none of them, so that importing
one never loads the others' dependencies (matplotlib, jinja2) and ``conductor --help``
stays instant.
"""

from __future__ import annotations

__all__: list[str] = []
