"""The paper's reference figures, as data, for ``conductor report``'s "paper" column.

Numbers are copied from the paper's tables (arXiv 2512.04388, which the README cites):
Table 1 (unconstrained budgets), Table 7 (constrained, train domains), Table 8
(constrained, out of domain) and Table 6 (cost, averaged over the four train tasks).
Each number keeps the text the paper prints (``"37.8"`` stays ``"37.8"``, not
``"37.80"``) beside its float value, so a report shows exactly what the paper says.

Column keys are the benchmarks' ``paper_key`` values: ``MATH500``, ``MMLU``, ``RLPR``,
``LCB``, ``AIME25``, ``BCB``, ``GPQA-D`` (and ``avg`` for a table's average column).

The four training columns were measured on sets the authors chose (their held-out
fifth of MATH-500 and of RLPR-Train, 1,531 of MMLU's test questions, LiveCodeBench's
test6 file; :data:`AUTHORS_SETS`): their figures stand beside a run only when its
benchmark says it is that set (``paper_set: true``); beside any other run on those
columns (the whole of MATH-500, say) the report says where the figures were measured
instead (:func:`paper_note`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AUTHORS_SETS",
    "PAPER_FIGURES",
    "TRAIN_KEYS",
    "PaperFigure",
    "PaperMetric",
    "paper_note",
    "paper_reference",
]

#: What a figure measures: accuracy in %, tokens per question, or USD per question.
PaperMetric = Literal["accuracy", "tokens_per_question", "cost_per_question_usd"]

#: The paper's training domains; Table 6's cost figures average over these four.
TRAIN_KEYS: tuple[str, ...] = ("MATH500", "MMLU", "RLPR", "LCB")

#: The columns measured on a part of a dataset the authors chose, and the shipped
#: benchmark that selects the same questions.  The out-of-domain columns (AIME25,
#: BCB, GPQA-D) are whole datasets, comparable with any run on them.
AUTHORS_SETS: dict[str, str] = {
    "MATH500": "math500-paper",
    "MMLU": "mmlu-paper",
    "RLPR": "rlpr-paper",
    "LCB": "lcb-v6",
}


@dataclass(frozen=True)
class PaperFigure:
    """One number from the paper, with where it comes from.

    ``text`` is the number as printed in the paper; ``value`` the same as a float.
    """

    table: str
    setting: str
    method: str
    paper_key: str
    metric: PaperMetric
    value: float
    text: str

    @property
    def label(self) -> str:
        """E.g. ``Table 8 (constrained, out of domain): recursive Conductor``."""
        return f"{self.table} ({self.setting}): {self.method}"


_UNCONSTRAINED = "unconstrained"
_TRAIN = "constrained, train domains"
_OOD = "constrained, out of domain"
_COST = "average over MATH500/MMLU/RLPR/LCB"

_T1_KEYS = ("MATH500", "MMLU", "RLPR", "LCB", "AIME25", "BCB", "GPQA-D", "avg")
_T1 = {
    "Claude Sonnet 4": ("96.0", "91.4", "36.70", "46.54", "74.3", "37.16", "77.7", "65.69"),
    "Gemini 2.5 Pro": ("96.0", "92.4", "40.55", "67.24", "78.3", "37.51", "84.8", "70.97"),
    "GPT-5": ("99.0", "93.5", "42.20", "82.90", "90.8", "32.75", "82.3", "74.78"),
    "Conductor": ("99.4", "94.1", "44.75", "83.93", "93.3", "37.86", "87.5", "77.27"),
}

_T7_KEYS = ("MATH500", "MMLU", "RLPR", "LCB", "avg")
_BEST_SINGLE = "best single worker (Gemini)"
_MOA = "Mixture-of-Agents"
_T7 = {
    _BEST_SINGLE: ("85.30", "91.53", "39.57", "40.14", "64.14"),
    _MOA: ("83.10", "88.46", "38.37", "38.57", "62.13"),
    "MASRouter": ("80.60", "86.28", "32.80", "27.86", "56.89"),
    "RouterDC": ("59.25", "87.52", "27.53", "35.33", "52.41"),
    "Conductor": ("89.33", "93.14", "42.63", "64.29", "72.35"),
}

_T8_KEYS = ("AIME25", "BCB", "GPQA-D")
_RECURSIVE = "recursive Conductor"
_T8 = {
    "Conductor": ("66.67", "37.8", "81.31"),
    _BEST_SINGLE: ("46.67", "35.1", "75.25"),
    _RECURSIVE: ("66.67", "40.0", "82.32"),
}

# Table 6: tokens and USD per question, averaged over the four train tasks.
_T6 = {
    "Conductor": ("1,820", "$0.0238"),
    _MOA: ("11,203", "$0.0486"),
}


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("$", ""))


def _build() -> tuple[PaperFigure, ...]:
    out: list[PaperFigure] = []
    for table, setting, keys, rows in (
        ("Table 1", _UNCONSTRAINED, _T1_KEYS, _T1),
        ("Table 7", _TRAIN, _T7_KEYS, _T7),
        ("Table 8", _OOD, _T8_KEYS, _T8),
    ):
        for method, texts in rows.items():
            for key, text in zip(keys, texts, strict=True):
                out.append(
                    PaperFigure(table, setting, method, key, "accuracy", _number(text), text)
                )
    # Table 6 is one average over the train tasks; it is listed under each of them so
    # a run on any train benchmark can show it (the label says it is an average).
    for method, (tokens, cost) in _T6.items():
        for key in TRAIN_KEYS:
            out.append(
                PaperFigure(
                    "Table 6", _COST, method, key, "tokens_per_question", _number(tokens), tokens
                )
            )
            out.append(
                PaperFigure(
                    "Table 6", _COST, method, key, "cost_per_question_usd", _number(cost), cost
                )
            )
    return tuple(out)


#: Every figure this module knows, in table order.
PAPER_FIGURES: tuple[PaperFigure, ...] = _build()

_SINGLE_TABLE1 = {"claude": "Claude Sonnet 4", "gemini": "Gemini 2.5 Pro", "gpt-5": "GPT-5"}


def _single_methods(worker: str) -> set[str]:
    """The single-worker rows that fit ``worker``; every such row when none does."""
    w = worker.lower().replace("gpt5", "gpt-5")
    for needle, method in _SINGLE_TABLE1.items():
        if needle in w:
            return {method, _BEST_SINGLE} if needle == "gemini" else {method}
    return {*_SINGLE_TABLE1.values(), _BEST_SINGLE}


def paper_reference(paper_key: str | None, strategy: str, *, paper_set: bool) -> list[PaperFigure]:
    """The paper's figures comparable with a run of ``strategy`` on ``paper_key``;
    ``paper_set`` says whether the run's benchmark is the set the paper measured that
    column on (for a column of :data:`AUTHORS_SETS`, none are comparable otherwise).

    ``conductor`` gives the Conductor rows (Tables 1, 7, 8 incl. the recursive
    Conductor, and Table 6's cost); ``moa`` the Mixture-of-Agents rows; ``single:W``
    the single-worker rows (only W's own when W names Claude, Gemini or GPT-5);
    ``oracle-best`` the best-single-worker rows and Table 1's best single model.
    Other strategies, or a benchmark the paper does not report, give ``[]``.
    """
    if not paper_key or (paper_key in AUTHORS_SETS and not paper_set):
        return []
    return _figures(paper_key, strategy)


def paper_note(paper_key: str | None, strategy: str, *, paper_set: bool) -> str | None:
    """Where the paper's figures for a run of ``strategy`` on ``paper_key`` were
    measured, when that is another set than the run's (None when the figures are
    comparable, or when the paper has none for that strategy)."""
    if not paper_key or paper_set or paper_key not in AUTHORS_SETS:
        return None
    if not _figures(paper_key, strategy):
        return None
    return f"the paper's figures are on another set: benchmark {AUTHORS_SETS[paper_key]}"


def _figures(paper_key: str, strategy: str) -> list[PaperFigure]:
    figures = [f for f in PAPER_FIGURES if f.paper_key == paper_key]
    if strategy == "conductor":
        methods = {"Conductor", _RECURSIVE}
    elif strategy == "moa":
        methods = {_MOA}
    elif strategy.startswith("single:"):
        methods = _single_methods(strategy.removeprefix("single:"))
    elif strategy == "oracle-best":
        singles = [
            f for f in figures if f.table == "Table 1" and f.method in _SINGLE_TABLE1.values()
        ]
        best = max(singles, key=lambda f: f.value, default=None)
        return [f for f in figures if f is best or f.method == _BEST_SINGLE]
    else:
        return []
    return [f for f in figures if f.method in methods]
