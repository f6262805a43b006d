"""`--fail-under`, `--junit FILE` and `--markdown FILE` on `bench` and `report`.

The JUnit file is checked three ways: a structural test with the standard library
(always), junitparser (a reader CI tools use) and the JUnit XSD that Jenkins'
xunit plugin publishes (validated with xmlschema).  The last two skip, saying why,
where those are not installed: ``pip install --target DIR junitparser xmlschema`` and
``CONDUCTOR_JUNIT_XSD=FILE`` (pytest's source distribution ships the XSD as
``testing/example_scripts/junit-10.xsd``) bring them in without touching the venv.
The Markdown is read back with markdown-it-py, the parser rich itself uses.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import boxed_number
from kit.poolkit import pool_dict, run_cli, worker, write_pool
from kit.records import SINGLE_G, TRIO_POOL, record, round_of, write_run

from conductor.cli._ci import parse_fail_under
from conductor.errors import UsageError
from conductor.render.junit import junit_xml
from conductor.render.markdown import markdown_cell, markdown_summary
from conductor.runs.summary import summarize_run
from conductor.testing import FakeLLMServer

#: Sample ids no one should have to see raw: XML's specials, a CDATA end, control
#: characters (not allowed in XML 1.0 at all), a lone surrogate, Markdown's specials.
HOSTILE_IDS = [
    "a<b>&\"c'",
    "]]><x/>",
    "ctrl\x01\x1b[31m\x7f",
    "surrogate\ud800end",
    "pipe|new\nline <i>*x*</i> [l](http://e) `c` $m$",
]


def verdict_run(tmp_path: Path, name: str = "r", strategy: str = "conductor", **kw: Any) -> Path:
    """Two epochs of three samples: correct, incorrect, and a failed run then a
    grader error; the ids are :data:`HOSTILE_IDS`' first three."""
    ids = kw.pop("ids", HOSTILE_IDS[:3])
    recs = []
    for epoch in range(2):
        recs.append(record(ids[0], epoch, "correct", [round_of(0, SINGLE_G)], wall=1.25))
        recs.append(record(ids[1], epoch, "incorrect", [round_of(0, SINGLE_G)], wall=2.0))
        status = None if epoch == 0 else "grader_error"
        recs.append(record(ids[2], epoch, status, [round_of(0, SINGLE_G)], wall=0.5, cost=None))
    return write_run(tmp_path / name, strategy, recs, epochs=2, **kw)


# --------------------------------------------------------------------------- --fail-under


@pytest.mark.parametrize(
    ("text", "value"), [("80", 80.0), ("62.5%", 62.5), (" 0 ", 0.0), ("100", 100.0), ("0.5%", 0.5)]
)
def test_fail_under_takes_percentages(text: str, value: float) -> None:
    assert parse_fail_under(text) == value


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0.8", "ambiguous: accuracy is in percent, so write 80 for 80%"),
        ("1", "ambiguous"),
        ("101", "from 0 to 100"),
        ("-5", "from 0 to 100"),
        ("nan", "give the accuracy to reach in percent"),
        ("inf", "give the accuracy to reach in percent"),
        ("eighty", "give the accuracy to reach in percent"),
        ("", "give the accuracy to reach in percent"),
    ],
)
def test_fail_under_refuses_what_is_not_a_clear_percentage(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=re.escape(why)):
        parse_fail_under(text)


@pytest.mark.process
def test_report_fail_under_exits_3_after_the_summary(tmp_path: Path) -> None:
    run = verdict_run(tmp_path)  # 2 of 6 right: 33.33%
    res = run_cli("report", str(run), "--fail-under", "40")
    assert res.returncode == 3, res.stderr
    assert "Bench runs" in res.stdout and "33.33" in res.stdout
    said = " ".join(res.stderr.split())
    assert re.search(r"r \(gpqa-diamond · conductor · trio\): accuracy 33\.33%, below "
                     r"--fail-under 40% \(exit 3\)", said), res.stderr  # fmt: skip
    res = run_cli("report", str(run), "--fail-under", "33%")
    assert res.returncode == 0 and "below" not in res.stderr, res.stderr
    # An accuracy just under the threshold is not rounded up to it in the sentence:
    # 2 of 3 is 66.667%, not "66.67%" below 66.67.
    two_of_three = write_run(tmp_path / "t", "moa", [
        record(f"q{i}", 0, "correct" if i else "incorrect", [round_of(0, SINGLE_G)], wall=1.0)
        for i in range(3)
    ])  # fmt: skip
    res = run_cli("report", str(two_of_three), "--fail-under", "66.67")
    assert res.returncode == 3 and "accuracy 66.667%, below" in res.stderr, res.stderr
    res = run_cli("report", str(run), "--fail-under", "0.4")
    assert res.returncode == 2 and "ambiguous" in res.stderr
    assert "Bench runs" not in res.stdout  # refused before anything is shown


@pytest.mark.process
def test_a_run_with_no_records_falls_short(tmp_path: Path) -> None:
    empty = write_run(tmp_path / "empty", "conductor", [])
    res = run_cli("report", str(empty), "--fail-under", "0")
    assert res.returncode == 3 and "no graded records" in res.stderr, res.stderr


# --------------------------------------------------------------------------- bench, piped


def bench_cli(tmp_path: Path, server: FakeLLMServer, *extra: str) -> list[str]:
    rows = [
        {"problem": f"What is {i} + 0?", "answer": str(i), "unique_id": f"p/{i}"} for i in range(4)
    ]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = write_pool(
        tmp_path / "pool.yaml", pool_dict(server, [worker(server, "solver", max_retries=0)])
    )
    return [
        "bench", "math500", "--pool", str(pool), "--data", str(tmp_path / "math.jsonl"),
        "--strategy", "single:solver", "--no-cache", "--out", str(tmp_path / "run"), *extra,
    ]  # fmt: skip


def boxed_half(request: object) -> str:
    """Right for 0 and 1, wrong from 2 on."""
    right = boxed_number(request)
    n = int(right.removeprefix("\\boxed{").removesuffix("}"))
    return right if n < 2 else f"\\boxed{{{n + 1}}}"


@pytest.mark.process
def test_bench_fail_under_junit_and_markdown(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("solver", boxed_half)
    junit, md = tmp_path / "ci" / "junit.xml", tmp_path / "ci" / "summary.md"
    args = bench_cli(tmp_path, fake_server, "--fail-under", "75", "--junit", str(junit))
    res = run_cli(*args, "--markdown", str(md), columns=None)
    assert res.returncode == 3, res.stderr
    # The summary first, then the files, then the sentence (on stderr).
    assert res.stdout.index("Bench runs") < res.stdout.index("JUnit report (--junit) written to")
    assert str(junit) in res.stdout.splitlines() and str(md) in res.stdout.splitlines()
    assert "accuracy 50.00%, below --fail-under 75% (exit 3)" in " ".join(res.stderr.split())
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "4" and suite.get("failures") == "2"
    assert "| below 75% |" in md.read_text()
    # Reached: exit 0, same files rewritten.
    res = run_cli("report", str(tmp_path / "run"), "--fail-under", "50", "--junit", str(junit))
    assert res.returncode == 0, res.stderr
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["fail_under_percent"] == "50" and props["accuracy_percent"] == "50.0000"


@pytest.mark.process
def test_bench_that_fails_outright_exits_1_not_3(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    from conductor.testing import Fault

    fake_server.script("solver", [Fault(500)] * 8)
    res = run_cli(*bench_cli(tmp_path, fake_server, "--fail-under", "50"), columns=None)
    assert res.returncode == 1, res.stderr
    assert "below --fail-under 50%" in res.stderr


@pytest.mark.process
def test_bad_output_paths_are_refused_before_the_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    (tmp_path / "a-dir").mkdir()
    res = run_cli(*bench_cli(tmp_path, fake_server, "--junit", str(tmp_path / "a-dir")))
    assert res.returncode == 2 and "--junit" in res.stderr and "is a directory" in res.stderr
    same = str(tmp_path / "x.out")
    res = run_cli(*bench_cli(tmp_path, fake_server, "--junit", same, "--markdown", same))
    assert res.returncode == 2 and "give two files" in res.stderr
    (tmp_path / "a-file").write_text("")
    res = run_cli(
        *bench_cli(tmp_path, fake_server, "--markdown", str(tmp_path / "a-file" / "s.md"))
    )
    assert res.returncode == 2 and "is not a writable directory" in res.stderr
    assert fake_server.requests == [] and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- JUnit


def junit_of(*runs: Path, fail_under: float | None = None) -> str:
    return junit_xml([summarize_run(r) for r in runs], fail_under)


def test_junit_structure(tmp_path: Path) -> None:
    """Always runs: the standard library's parser on the file, every count checked."""
    a = verdict_run(tmp_path)
    b = write_run(tmp_path / "single", "single:gpt", [
        record("q1", 0, "correct", [round_of(0, SINGLE_G)], wall=1.0, cost=0.000046),
        record("q2", 0, "no_answer", [round_of(0, SINGLE_G)], wall=1.0),
    ])  # fmt: skip
    text = junit_of(a, b, fail_under=50)
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("8", "3", "2")
    one, two = root.findall("testsuite")
    assert one.get("name") == "gpqa-diamond · conductor · trio"
    assert (one.get("tests"), one.get("failures"), one.get("errors")) == ("6", "2", "2")
    assert one.get("time") == "7.500" and one.get("timestamp") == "2025-01-01T00:00:00Z"
    props = {p.get("name"): p.get("value") for p in one.iter("property")}
    assert props["accuracy_percent"] == "33.3333"
    assert props["accuracy_ci95_low_percent"] == "9.6769"  # Wilson, 2 of 6
    assert props["accuracy_ci95_high_percent"] == "70.0012"
    assert props["cost_is_lower_bound"] == "true" and props["fail_under_percent"] == "50"
    assert props["run_dir"] == str(a)
    cases = one.findall("testcase")
    # One per sample and epoch, named with the epoch, ids exactly as recorded but for
    # what XML cannot hold (written out as visible escapes).
    assert [c.get("name") for c in cases] == [
        f"{sid} [epoch {e}]"
        for e in (0, 1)
        for sid in ["a<b>&\"c'", "]]><x/>", "ctrl\\x01\\x1b[31m\\x7f"]
    ]
    kinds = [[(x.tag, x.get("type")) for x in c] for c in cases]
    assert kinds == [[], [("failure", "incorrect")], [("error", "run_failed")],
                     [], [("failure", "incorrect")], [("error", "grader_error")]]  # fmt: skip
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "incorrect"
    assert f"conductor trace {a} --sample ]]><x/>" in (failure.text or "")
    assert [c.get("time") for c in cases[:3]] == ["1.250", "2.000", "0.500"]
    # A run of one epoch names its cases by sample id alone.
    assert [c.get("name") for c in two.findall("testcase")] == ["q1", "q2"]
    assert two.find("testcase[@name='q2']/failure").get("type") == "no_answer"  # type: ignore[union-attr]
    # Plain UTF-8, no raw control character anywhere.
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text)


def test_junit_survives_every_hostile_id(tmp_path: Path) -> None:
    recs = [record(sid, 0, "incorrect", [round_of(0, SINGLE_G)], wall=1.0) for sid in HOSTILE_IDS]
    pool = {**TRIO_POOL, "name": "pool <&> \x00"}
    run = write_run(tmp_path / "h", "single:x\x1b]0;t\x07", recs, pool=pool)
    text = junit_of(run)
    text.encode("utf-8")  # no lone surrogate left
    root = ET.fromstring(text.encode("utf-8"))
    names = [c.get("name") for c in root.iter("testcase")]
    assert names[0] == "a<b>&\"c'" and names[3] == "surrogate\\ud800end"
    assert names[4] == "pipe|new\nline <i>*x*</i> [l](http://e) `c` $m$"
    assert (
        root.find("testsuite").get("name")
        == "gpqa-diamond · single:x\\x1b]0;t\\x07 · pool <&> \\x00"
    )  # type: ignore[union-attr]


def test_junit_reads_in_junitparser(tmp_path: Path) -> None:
    junitparser = pytest.importorskip(
        "junitparser", reason="junitparser is not installed (pip install --target DIR junitparser)"
    )
    path = tmp_path / "j.xml"
    path.write_text(junit_of(verdict_run(tmp_path)), encoding="utf-8")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1
    suite = suites[0]
    assert (suite.tests, suite.failures, suite.errors) == (6, 2, 2)
    results = {case.name: [type(r).__name__ for r in case.result] for case in suite}
    assert results["]]><x/> [epoch 0]"] == ["Failure"]
    assert results["ctrl\\x01\\x1b[31m\\x7f [epoch 1]"] == ["Error"]
    assert results["a<b>&\"c' [epoch 0]"] == []
    props = {p.name: p.value for p in suite.properties()}
    assert props["accuracy_percent"] == "33.3333"


def test_junit_validates_against_the_published_xsd(tmp_path: Path) -> None:
    xmlschema = pytest.importorskip(
        "xmlschema", reason="xmlschema is not installed (pip install --target DIR xmlschema)"
    )
    xsd = os.environ.get("CONDUCTOR_JUNIT_XSD")
    if not xsd or not Path(xsd).is_file():
        pytest.skip("set CONDUCTOR_JUNIT_XSD to Jenkins' junit-10.xsd to validate against it")
    schema = xmlschema.XMLSchema(xsd)
    recs = [record(sid, 0, "incorrect", [round_of(0, SINGLE_G)], wall=1.0) for sid in HOSTILE_IDS]
    for text in (junit_of(verdict_run(tmp_path), fail_under=10),
                 junit_of(write_run(tmp_path / "h", "single:x", recs)),
                 junit_of(write_run(tmp_path / "empty", "moa", [])),
                 junit_xml([])):  # fmt: skip
        path = tmp_path / "check.xml"
        path.write_text(text, encoding="utf-8")
        schema.validate(str(path))


# --------------------------------------------------------------------------- Markdown


def md_tables(text: str) -> list[list[list[str]]]:
    """Each table of ``text`` as rows of cell texts, as markdown-it reads them."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    tables: list[list[list[str]]] = []
    row: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.type == "table_open":
            tables.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type in ("th_open", "td_open"):
            inline = tokens[i + 1]
            kinds = {c.type for c in inline.children or []}
            # Nothing but text: no emphasis, code, link, image, HTML or line break.
            assert kinds <= {"text"}, (inline.content, kinds)
            row.append("".join(c.content for c in inline.children or []))
        elif tok.type == "tr_close":
            tables[-1].append(row)
    return tables


def test_markdown_is_a_table_markdown_it_reads(tmp_path: Path) -> None:
    a = verdict_run(tmp_path)
    singles = [
        write_run(tmp_path / f"s{i}", f"single:w{i}", [
            record("q", 0, "correct" if i else "incorrect", [round_of(0, SINGLE_G)], wall=1.0,
                   cost=0.000046),
        ])
        for i in range(2)
    ]  # fmt: skip
    text = markdown_summary([summarize_run(d) for d in [a, *singles]], fail_under=50)
    (table,) = md_tables(text)
    header, *rows = table
    assert header[:3] == ["run", "accuracy % ± SE", "95% interval"]
    assert header[-2:] == ["paper", "--fail-under 50%"]
    assert len({len(r) for r in table}) == 1  # every row as wide as the header
    col = {name: i for i, name in enumerate(header)}
    by_run = {r[0]: r for r in rows}
    assert list(by_run) == [
        "conductor · trio", "single:w0 · trio", "single:w1 · trio", "oracle-best = single:w1 · trio"
    ]  # fmt: skip
    cond = by_run["conductor · trio"]
    assert cond[col["accuracy % ± SE"]] == "33.33 ± 33.33"  # SE over the 3 samples
    assert cond[col["95% interval"]] == "9.7-70.0"
    assert cond[col["samples × epochs"]] == "3 × 2 (6 records)"
    assert cond[col["errors"]] == "run 1 · grader 1 · time limit 0"
    assert cond[col["--fail-under 50%"]] == "below 50%"
    assert cond[col["paper"]].startswith("87.5 Conductor (Table 1, unconstrained); ")
    assert by_run["single:w1 · trio"][col["cost / question"]] == "$0.000046"
    assert by_run["single:w1 · trio"][col["--fail-under 50%"]] == "pass"
    assert by_run["oracle-best = single:w1 · trio"][col["--fail-under 50%"]] == "-"
    below = "gpqa-diamond · conductor · trio, gpqa-diamond · single:w0 · trio."
    assert f"**Below --fail-under 50%:** {below}" in text


def test_markdown_cells_hold_hostile_names_as_text(tmp_path: Path) -> None:
    hostile = "x|y\nz <img src=q> *em* [l](http://e) ![i](j) `c` $m$ ~~s~~ &amp; \\| \x1b[1m"
    pool = {**TRIO_POOL, "name": hostile}
    run = verdict_run(tmp_path, pool=pool, strategy="single:a|b")
    (table,) = md_tables(markdown_summary([summarize_run(run)]))
    name = table[1][0]
    assert name == (
        "single:a|b · x|y z <img src=q> *em* [l](http://e) ![i](j) `c` $m$ ~~s~~ &amp; \\| \\x1b[1m"
    )
    assert markdown_cell("") == " " and markdown_cell("a\r\nb\tc") == "a b c"
