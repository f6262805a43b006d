"""Bench runs as a JUnit XML report, the file CI systems read test results from
(``conductor bench --junit FILE``, ``conductor report --junit FILE``).

One ``<testsuite>`` per run, named after it (``benchmark · strategy · pool``), with
the run's figures as properties (accuracy and its standard error in percent, its 95%
Wilson interval, cost per question in USD, the run directory, ``--fail-under``); one
``<testcase>`` per sample and epoch (the last record of each, as the report counts
them): a correct answer passes, a wrong, unreadable or timed-out one is a
``<failure>``, a run that failed or a grader that failed is an ``<error>``.  Its
message is the grader's reason (which may quote the gold answer: keep the file out of
public artefacts for benchmarks that ask not to be published) and its body says how
to see the sample whole (``conductor trace``).

Text from records and run names is made XML-safe here: characters XML 1.0 cannot hold
(control characters, lone surrogates) are written out as visible escapes, and the
rest is escaped as element text or attribute value.  The layout follows the schema
Jenkins, GitLab and GitHub's test reporters read (``testsuites`` > ``testsuite`` >
``properties``, ``testcase`` > ``failure`` | ``error``; times in seconds with three
decimals).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from ..record import RunRecord
from ..runs.rundir import SAMPLES, SampleLines, latest_lines, numbered_records
from ..runs.stats import wilson_interval
from ..runs.summary import RunSummary
from ..text import printable

__all__ = ["junit_xml"]

#: Verdicts that are a wrong answer (a ``<failure>``); ``correct`` passes and the
#: rest (``run_failed``, ``grader_error``) are an ``<error>``.
WRONG = frozenset({"incorrect", "no_answer", "time_limit"})

#: A failure's message attribute is one line of at most this many characters (the
#: element's text holds the whole reason).
MESSAGE_CHARS = 500

# What XML 1.0 cannot carry even as a character reference, beyond what printable()
# already writes out: lone surrogates (from a JSON "\ud800") and U+FFFE, U+FFFF.
_NOT_XML = re.compile("[\ud800-\udfff\ufffe\uffff]")


def _safe(text: object) -> str:
    shown = printable(str(text))
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group(0)):04x}", shown)


def _attr(text: object) -> str:
    return quoteattr(_safe(text))


def _text(text: object) -> str:
    return escape(_safe(text))


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MESSAGE_CHARS else flat[: MESSAGE_CHARS - 1] + "…"


def _seconds(s: float) -> str:
    return f"{max(0.0, s):.3f}"


def _property(name: str, value: object) -> str:
    return f"      <property name={_attr(name)} value={_attr(value)}/>"


def _properties(summary: RunSummary, fail_under: float | None) -> list[str]:
    props: list[tuple[str, object]] = [
        ("run_dir", summary.run_dir),
        ("benchmark", summary.benchmark),
        ("strategy", summary.strategy),
        ("pool", summary.pool_name),
        ("records", summary.n_records),
    ]
    if summary.accuracy is not None:
        props.append(("accuracy_percent", f"{summary.accuracy:.4f}"))
    if summary.stderr is not None:
        props.append(("accuracy_stderr_percent", f"{summary.stderr:.4f}"))
    if summary.n_records:
        correct = summary.status_counts.get("correct", 0)
        lo, hi = wilson_interval(correct, summary.n_records)
        props += [("accuracy_ci95_low_percent", f"{100 * lo:.4f}")]
        props += [("accuracy_ci95_high_percent", f"{100 * hi:.4f}")]
    if summary.cost_per_question is not None:
        props.append(("cost_per_question_usd", f"{summary.cost_per_question:.10g}"))
    props.append(("cost_is_lower_bound", str(summary.cost_is_lower_bound).lower()))
    if fail_under is not None:
        props.append(("fail_under_percent", f"{fail_under:g}"))
    return ["    <properties>", *(_property(k, v) for k, v in props), "    </properties>"]


def _case(rec: RunRecord, number: int, suite: str, run_dir: str, epochs: int) -> tuple[str, str]:
    """The ``<testcase>`` of one record, and its verdict."""
    sample = rec.sample_id if rec.sample_id is not None else f"line {number}"
    name = f"{sample} [epoch {rec.epoch or 0}]" if epochs > 1 else sample
    verdict = rec.verdict
    head = (
        f"    <testcase classname={_attr(suite)} name={_attr(name)} "
        f"time={_attr(_seconds(rec.totals.wall_s))}"
    )
    if verdict == "correct":
        return head + "/>", verdict
    grade = rec.grade or {}
    reason = str(grade.get("reason") or rec.error or verdict)
    body = [reason]
    if grade.get("extracted") is not None:
        body.append(f"extracted answer: {grade['extracted']}")
    body.append(f"see it whole: conductor trace {run_dir} --sample {sample}")
    tag = "failure" if verdict in WRONG else "error"
    element = (
        f"      <{tag} type={_attr(verdict)} message={_attr(_one_line(reason))}>"
        f"{_text(chr(10).join(body))}</{tag}>"
    )
    return f"{head}>\n{element}\n    </testcase>", verdict


def _suite(summary: RunSummary, fail_under: float | None) -> tuple[list[str], dict[str, float]]:
    """One run's ``<testsuite>`` lines, and its counts (tests, failures, errors, time)."""
    cases: list[str] = []
    counts = {"tests": 0, "failures": 0, "errors": 0, "time": 0.0}
    lines = SampleLines(Path(summary.run_dir) / SAMPLES)
    for number, rec in numbered_records(lines, latest_lines(lines)):
        case, verdict = _case(rec, number, summary.label, summary.run_dir, summary.epochs)
        cases.append(case)
        counts["tests"] += 1
        counts["failures"] += verdict in WRONG
        counts["errors"] += verdict not in WRONG and verdict != "correct"
        counts["time"] += max(0.0, rec.totals.wall_s)
    when = f" timestamp={_attr(summary.created_at)}" if summary.created_at else ""
    head = (
        f'  <testsuite name={_attr(summary.label)} tests="{counts["tests"]}" '
        f'failures="{counts["failures"]}" errors="{counts["errors"]}" skipped="0" '
        f'time="{_seconds(counts["time"])}"{when}>'
    )
    return [head, *_properties(summary, fail_under), *cases, "  </testsuite>"], counts


def _document(summaries: Iterable[RunSummary], fail_under: float | None) -> Iterator[str]:
    suites: list[str] = []
    total = {"tests": 0.0, "failures": 0.0, "errors": 0.0, "time": 0.0}
    for summary in summaries:
        lines, counts = _suite(summary, fail_under)
        suites += lines
        for key in total:
            total[key] += counts[key]
    yield '<?xml version="1.0" encoding="UTF-8"?>'
    yield (
        f'<testsuites name="conductor bench" tests="{int(total["tests"])}" '
        f'failures="{int(total["failures"])}" errors="{int(total["errors"])}" '
        f'time="{_seconds(total["time"])}">'
    )
    yield from suites
    yield "</testsuites>"


def junit_xml(summaries: Iterable[RunSummary], fail_under: float | None = None) -> str:
    """The JUnit XML document of the runs ``summaries`` describe (their records are
    read from each run directory's ``samples.jsonl``)."""
    return "\n".join(_document(summaries, fail_under)) + "\n"
