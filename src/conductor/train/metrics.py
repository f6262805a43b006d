"""Training metrics: one JSON line per logging step, and a rich table of the last steps.

:class:`MetricsLog` appends to ``OUTPUT_DIR/metrics.jsonl`` and flushes every line, so a
killed run keeps every step it logged.  :func:`summarise_rollouts` turns the reward
function's per-completion results into the rollout half of a line; the trainer adds
TRL's own values (loss, learning rate, ...).  :func:`metrics_table` renders the last
lines; the CLI shows it in a :class:`rich.live.Live` view (nothing in training prints).

Keys of a line (absent values are ``null``):

- ``step`` (optimizer step), ``elapsed_s`` (seconds since training started);
- ``reward_mean``, ``reward_std``: over every rollout (completion) since the last line;
- ``parse_rate``: share of completions whose workflow parsed;
- ``correct_rate``: share of completions whose final answer was graded correct;
- ``steps_per_workflow``: mean steps of the parsed workflows;
- ``worker_usage``: ``{worker id: steps}`` over the parsed workflows;
- ``last_worker_usage``: ``{worker id: workflows}`` counting the worker of each
  workflow's last step (the one whose answer is returned);
- ``calls_per_rollout``, ``cost_usd`` (total over the rollouts), ``rollouts``;
- ``revisions``: round-2 rollouts among them (recursion training), and
  ``revision_gain``: their mean reward minus that of the round-1 plan each revised;
- with a per-step ``credit``: ``calls_by_step`` and ``cached_by_step``, the worker calls
  made and the call-cache hits by step index (a counterfactual credit's re-runs
  included), and ``credit_by_step``, the mean credit of each step index; and from the
  trainer ``credit_token_share``, the share of completion tokens whose advantage a step
  credit changed;
- ``staleness``: the most optimizer steps a batch trained since the last line waited
  between its generation and its update (0 for synchronous GRPO; up to
  ``grpo.max_staleness`` with ``grpo.async_rollouts``);
- ``loss``, ``grad_norm`` (the gradient's norm before clipping, over every process),
  ``learning_rate``, ``completion_length``, ``kl`` (from TRL when it logs them).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..private import make_private_dir, open_private
from ..redact import masked_json
from ..userfiles import bounded_lines, open_regular

#: The longest line :func:`read_metrics` reads: a metrics line is a few hundred bytes.
_MAX_METRICS_LINE = 1 << 20

__all__ = [
    "METRIC_KEYS",
    "MetricsLine",
    "MetricsLog",
    "metrics_table",
    "read_metrics",
    "summarise_rollouts",
]

#: One line of ``metrics.jsonl`` as written: every :data:`METRIC_KEYS` key, ``None``
#: where a value is absent (the keys are listed in the module docstring).
MetricsLine = dict[str, Any]

#: The keys every metrics line carries, in display order.
METRIC_KEYS: tuple[str, ...] = (
    "step",
    "reward_mean",
    "reward_std",
    "parse_rate",
    "correct_rate",
    "steps_per_workflow",
    "worker_usage",
    "last_worker_usage",
    "calls_per_rollout",
    "cost_usd",
    "rollouts",
    "revisions",
    "revision_gain",
    "calls_by_step",
    "cached_by_step",
    "credit_by_step",
    "credit_token_share",
    "staleness",
    "loss",
    "grad_norm",
    "learning_rate",
    "completion_length",
    "kl",
    "elapsed_s",
)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class MetricsLog:
    """Appends one JSON object per line to ``path`` (created with its folder)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        make_private_dir(self.path.parent)
        self._fh = open_private(self.path, "a", encoding="utf-8")
        self.rows: list[MetricsLine] = []

    def append(self, row: dict[str, Any]) -> MetricsLine:
        """Write ``row`` (every :data:`METRIC_KEYS` key present, missing ones null)."""
        merged: dict[str, Any] = {key: None for key in METRIC_KEYS}
        merged.update(row)
        full: MetricsLine = _clean(merged)
        self._fh.write(masked_json(full, ensure_ascii=False) + "\n")
        # Flush per line: the file is the record of a run that may be killed at any time.
        self._fh.flush()
        self.rows.append(full)
        return full

    def close(self) -> None:
        """Close the file (idempotent)."""
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: Path | str) -> list[MetricsLine]:
    """The lines of a ``metrics.jsonl`` file (a torn last line, or one that is not
    JSON or longer than a metrics line could be, is skipped); a path that is not a
    regular file is refused (:func:`~conductor.userfiles.open_regular`)."""
    rows = []
    with open_regular(path, "metrics file") as fh:
        for _number, raw in bounded_lines(fh, _MAX_METRICS_LINE):
            if raw is None or not raw.strip():
                continue
            try:
                rows.append(json.loads(raw))
            except (ValueError, RecursionError):
                continue
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise_rollouts(results: Iterable[Any]) -> dict[str, Any]:
    """The rollout half of a metrics line from reward results (``RolloutResult``-like:
    ``reward``, ``parsed``, ``correct``, ``steps``, ``workers``, ``calls``, ``cost_usd``,
    optionally ``round``, ``round_reward`` and ``previous_reward``).  Rollouts without a
    reward (a revision slot whose first round left nothing to revise) are not counted."""
    results = [r for r in results if r.reward is not None]
    revisions = [r for r in results if getattr(r, "round", 1) > 1]
    gains = [
        float(r.round_reward) - float(r.previous_reward)
        for r in revisions
        if getattr(r, "round_reward", None) is not None
        and getattr(r, "previous_reward", None) is not None
    ]
    rewards = [float(r.reward) for r in results]
    parsed = [r for r in results if r.parsed]
    made: list[int] = []
    cached: list[int] = []
    credit_sums: list[float] = []
    credit_counts: list[int] = []
    for r in results:
        calls = getattr(r, "step_calls", None)
        if calls is not None:
            _add_into(made, calls.made)
            _add_into(cached, calls.cached)
        credits = getattr(r, "credits", None)
        if credits:
            _add_into(credit_sums, credits)
            _add_into(credit_counts, [1] * len(credits))
    usage: Counter[str] = Counter()
    last: Counter[str] = Counter()
    for r in parsed:
        usage.update(r.workers)
        if r.workers:
            last[r.workers[-1]] += 1
    return {
        "reward_mean": _mean(rewards),
        "reward_std": statistics.pstdev(rewards)
        if len(rewards) > 1
        else (0.0 if rewards else None),
        "parse_rate": len(parsed) / len(results) if results else None,
        "correct_rate": (sum(1 for r in results if r.correct) / len(results)) if results else None,
        "steps_per_workflow": _mean([float(r.steps) for r in parsed]),
        "worker_usage": dict(sorted(usage.items())),
        "last_worker_usage": dict(sorted(last.items())),
        "calls_per_rollout": _mean([float(r.calls) for r in results]),
        "cost_usd": sum(float(r.cost_usd or 0.0) for r in results) if results else None,
        "rollouts": len(results),
        "revisions": len(revisions),
        "revision_gain": _mean(gains),
        "calls_by_step": made or None,
        "cached_by_step": cached or None,
        "credit_by_step": [t / c for t, c in zip(credit_sums, credit_counts, strict=True)] or None,
    }


def _add_into(totals: list[Any], values: Sequence[Any]) -> None:
    """Add ``values`` into ``totals`` index by index, growing it as needed."""
    totals.extend([0] * (len(values) - len(totals)))
    for i, value in enumerate(values):
        totals[i] += value


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 1e-3:
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return str(value)


def _usage(value: Any) -> str:
    if not value:
        return "-"
    return " ".join(f"{k}:{v}" for k, v in value.items())


def metrics_table(rows: Sequence[MetricsLine], *, last: int = 12, title: str | None = None) -> Any:
    """A :class:`rich.table.Table` of the last ``last`` metrics lines."""
    from rich.table import Table

    table = Table(title=title or "GRPO training", title_justify="left")
    for name in ("step", "reward", "± std", "parsed", "correct", "steps", "calls", "cost $"):
        table.add_column(name, justify="right")
    table.add_column("loss", justify="right")
    table.add_column("lr", justify="right")
    table.add_column("last step by", justify="left")
    table.add_column("time", justify="right")
    for row in list(rows)[-last:]:
        table.add_row(
            _fmt(row.get("step")),
            _fmt(row.get("reward_mean")),
            _fmt(row.get("reward_std")),
            _fmt(row.get("parse_rate"), 2),
            _fmt(row.get("correct_rate"), 2),
            _fmt(row.get("steps_per_workflow"), 2),
            _fmt(row.get("calls_per_rollout"), 2),
            _fmt(row.get("cost_usd"), 4),
            _fmt(row.get("loss"), 4),
            _fmt(row.get("learning_rate")),
            _usage(row.get("last_worker_usage")),
            _fmt(row.get("elapsed_s"), 0) + "s" if row.get("elapsed_s") is not None else "-",
        )
    return table
