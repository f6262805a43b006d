"""``conductor view``'s page in a real browser: headless Chromium opens the written file
from disk with scripts on, and the tests read the DOM it built (``--dump-dom``).  The
filters are driven through the page's deep links (``#verdict=wrong&q=tokyo``), which it
reads on load, and through its controls: typing, choosing, clicking and scrolling over
the DevTools protocol on a pipe (no websocket client needed).  Whether the page made a
request is read from Chromium's network log."""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.records import chain, fan, planned_record, write_bench

from conductor.record import RunRecord
from conductor.view.companion import DetailSpool, companion_dir
from conductor.view.data import load_run, load_runs
from conductor.view.page import write_view

# Every test here starts a child process.
pytestmark = pytest.mark.process

pytest.importorskip("jinja2")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    pytest.skip(
        "Chromium is not installed (apt-get install chromium); the page's browser tests need it"
    )


# Quiet, offline and without the browser's own background requests, so that the network
# log holds only what the page asked for; every host name resolves to nothing.
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    # A container's /dev/shm is often 64 MB, too small for the renderer's shared memory.
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # Wait for the page's asynchronous work too (a sample's details are unpacked so).
    "--virtual-time-budget=10000",
)


def browse(page: Path, *args: str, fragment: str = "") -> str:
    """Open ``page`` (with ``#fragment``) in headless Chromium; its stdout (the DOM with
    ``--dump-dom``)."""
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    res = subprocess.run(
        [_chromium(), *FLAGS, *args, url], capture_output=True, text=True, timeout=scaled(120)
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def dom(page: Path, fragment: str = "") -> str:
    out = browse(page, "--dump-dom", fragment=fragment)
    assert 'data-ready="' in out, "the page's script did not finish: " + out[-500:]
    return out


def count(page_dom: str) -> int:
    found = re.search(r'id="match-count" data-count="(\d+)"', page_dom)
    assert found, "no match count in the page"
    return int(found.group(1))


def listed(page_dom: str) -> list[str]:
    """The keys of the rows the list shows."""
    return [
        html_lib.unescape(k)
        for k in re.findall(
            r'class="row sample-row[^"]*" data-index="\d+" data-key="([^"]*)"', page_dom
        )
    ]


QUESTIONS = [
    "What is the capital of Japan? (Tokyo?)",
    "Add 2 and 2.",
    "Name a prime.",
    "Sort 3 1 2.",
]


def conductor_run() -> list[RunRecord]:
    records = []
    for i in range(12):
        plan = (
            fan("gpt-small", "claude-mid", "gemini-big")
            if i % 3 == 0
            else chain("gpt-small", "claude-mid")
        )
        verdict = ["correct", "incorrect", "correct", "run_failed"][i % 4]
        records.append(
            planned_record(f"q{i}", f"{QUESTIONS[i % 4]} #{i}", plan, verdict=verdict, cost=0.002)
        )
    return records


def single_run() -> list[RunRecord]:
    verdicts = ["incorrect", "incorrect", "correct", "correct"]
    return [
        planned_record(
            f"q{i}",
            f"{QUESTIONS[i % 4]} #{i}",
            chain("gemini-big"),
            verdict=verdicts[i % 4],
            cost=0.0005,
        )
        for i in range(12)
    ]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("view")
    a = write_bench(tmp / "conductor-run", conductor_run())
    b = tmp / "singles"
    write_bench(b / "single-gemini-big", single_run(), strategy="single:gemini-big")
    return write_view(load_runs([a, b]), tmp / "view.html")


def test_the_page_shows_the_runs_and_every_sample(page: Path) -> None:
    out = dom(page)
    rows = re.findall(r'<tr class="run-row" data-run="(\d)">(.*?)</tr>', out, re.S)
    assert [r[0] for r in rows] == ["0", "1"]
    assert "math500 · conductor · fake" in rows[0][1] and "single:gemini-big" in rows[1][1]
    assert "50.0%" in rows[0][1]  # 6 of 12 right
    assert count(out) == 24 and len(listed(out)) == 24
    # The charts are drawn: the accuracy-cost chart and a usage table per run.
    assert re.search(r'id="chart-accuracy-cost"[^>]*><svg', out)
    assert len(re.findall(r'<table class="usage" data-run=', out)) == 2


def test_one_sample_shows_its_workflow_graph(page: Path) -> None:
    out = dom(page, "sample=0")  # q0 of the conductor run: three attempts... then a judge
    box = out[out.index('<div id="sample">') :]
    svg = box[box.index("<svg") : box.index("</svg>")]
    steps = re.findall(r'<g class="step[^"]*" data-step="([\d.]+)"', svg)
    assert steps == ["1.0", "1.1", "1.2"]
    edges = re.findall(r'<path class="edge" data-from="([\d.]+)" data-to="([\d.]+)"', svg)
    assert sorted(edges) == [("1.0", "1.2"), ("1.1", "1.2")]
    # Each step's messages and response are there, collapsed.
    blocks = re.findall(r'<details class="step ok" data-step="1\.\d">', box)
    assert len(blocks) == 3 and "gemini-big says 42" in box
    assert "Conductor's reply" in box and "graded correct" in box
    # One numbering, conductor trace's: the graph's "Round 1" holds steps 0, 1 and 2.
    summaries = re.findall(r"<summary>(Round [^<]*)</summary>", box)
    assert summaries[0] == "Round 1: the Conductor's reply"
    assert [t.split(" · ")[:2] for t in summaries[1:]] == [
        ["Round 1", "step 0"],
        ["Round 1", "step 1"],
        ["Round 1", "step 2"],
    ]
    assert "round 0" not in box.lower()


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        (
            "verdict=right",
            [
                "q0#0",
                "q2#0",
                "q4#0",
                "q6#0",
                "q8#0",
                "q10#0",
                "q2#0",
                "q3#0",
                "q6#0",
                "q7#0",
                "q10#0",
                "q11#0",
            ],
        ),
        ("verdict=wrong&run=0", ["q1#0", "q5#0", "q9#0"]),
        ("verdict=failed", ["q3#0", "q7#0", "q11#0"]),
        ("q=TOKYO", ["q0#0", "q4#0", "q8#0", "q0#0", "q4#0", "q8#0"]),
        ("q=judge+the", ["q0#0", "q3#0", "q6#0", "q9#0"]),
        (
            "worker=claude-mid&steps=2",
            ["q1#0", "q2#0", "q4#0", "q5#0", "q7#0", "q8#0", "q10#0", "q11#0"],
        ),
        ("kind=parallel+attempts+%2B+judge", ["q0#0", "q3#0", "q6#0", "q9#0"]),
    ],
)
def test_filters_and_search_change_the_list(page: Path, fragment: str, expected: list[str]) -> None:
    out = dom(page, fragment)
    assert listed(out) == expected and count(out) == len(expected)


def test_runs_disagree_lists_the_samples_graded_differently(page: Path) -> None:
    right_a = {
        f"q{i}#0": ["correct", "incorrect", "correct", "run_failed"][i % 4] == "correct"
        for i in range(12)
    }
    right_b = {
        f"q{i}#0": ["incorrect", "incorrect", "correct", "correct"][i % 4] == "correct"
        for i in range(12)
    }
    differ = [k for k in right_a if right_a[k] != right_b[k]]
    out = dom(page, "disagree=1&run=0")
    assert listed(out) == differ and len(differ) == 6


def test_the_comparison_matches_counts_made_here(page: Path) -> None:
    a = [["correct", "incorrect", "correct", "run_failed"][i % 4] == "correct" for i in range(12)]
    b = [["incorrect", "incorrect", "correct", "correct"][i % 4] == "correct" for i in range(12)]
    expected = {
        "cmp-both": sum(x and y for x, y in zip(a, b, strict=True)),
        "cmp-only-a": sum(x and not y for x, y in zip(a, b, strict=True)),
        "cmp-only-b": sum(y and not x for x, y in zip(a, b, strict=True)),
        "cmp-neither": sum(not x and not y for x, y in zip(a, b, strict=True)),
    }
    out = dom(page, "a=0&b=1")
    shown = {
        k: int(v) for k, v in re.findall(r'id="(cmp-[a-z-]+)" class="num" data-value="(\d+)"', out)
    }
    assert shown == expected
    # B against A: the same table turned over.
    out = dom(page, "a=1&b=0")
    turned = {
        k: int(v) for k, v in re.findall(r'id="(cmp-[a-z-]+)" class="num" data-value="(\d+)"', out)
    }
    assert (
        turned["cmp-only-a"] == expected["cmp-only-b"]
        and turned["cmp-only-b"] == expected["cmp-only-a"]
    )


def _page_requests(net_log: Path) -> list[str]:
    """The requests a page (a file:// document) started, from Chromium's network log."""
    events = json.loads(net_log.read_text())["events"]
    return [
        str(p.get("network_isolation_key"))
        for p in (e.get("params") or {} for e in events)
        if "initiator" in p and "file://" in str(p.get("network_isolation_key"))
    ]


def test_the_page_makes_no_network_request(page: Path, tmp_path: Path) -> None:
    log = tmp_path / "net.json"
    out = browse(page, f"--log-net-log={log}", "--dump-dom", fragment="sample=0")
    assert 'data-ready="' in out and "<svg" in out
    assert _page_requests(log) == []
    # The check sees a page that does ask for something.
    probe = tmp_path / "probe.html"
    probe.write_text(
        '<img src="http://example.com/x.png"><script>fetch("https://example.org/")</script>'
    )
    browse(probe, f"--log-net-log={log}", "--dump-dom")
    assert len(_page_requests(log)) == 2


def test_a_question_cannot_break_out_of_the_data(tmp_path: Path) -> None:
    hostile = (
        'Why? </script><script>document.title="pwned"</script>'
        '<img src=x onerror="document.title=1">'
    )
    run = write_bench(tmp_path / "run", [planned_record("x", hostile, chain("gpt-small"))])
    out = dom(write_view(load_runs([run]), tmp_path / "view.html"), "sample=0")
    assert "<title>conductor view · math500 · conductor · fake</title>" in out
    assert html_lib.escape(hostile, quote=False) in out


def test_a_screenshot_of_the_page(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "view.png"
    browse(page, f"--screenshot={shot}", "--window-size=1280,900", fragment="sample=0")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


class DevTools:
    """One page in headless Chromium, driven over ``--remote-debugging-pipe``: Chromium
    reads commands on its fd 3 and answers on fd 4, one JSON message per NUL."""

    def __init__(self, url: str) -> None:
        to_chrome, self._out = os.pipe()
        self._in, from_chrome = os.pipe()
        # Above 4, so that placing them at 3 and 4 in the child overwrites nothing.
        ends = [os.dup(fd) for fd in (to_chrome, from_chrome)]
        while min(ends) <= 4:
            ends = [os.dup(fd) for fd in ends]

        def place() -> None:
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)

        self._proc = subprocess.Popen(
            [_chromium(), *FLAGS[:-1], "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4),
            preexec_fn=place,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (to_chrome, from_chrome, *ends):
            os.close(fd)
        self._buf = b""
        self._n = 0
        target = self.send("Target.createTarget", url=url)["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._n += 1
        msg: dict[str, Any] = {"id": self._n, "method": method, "params": params}
        if self._n > 2:
            msg["sessionId"] = self._session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._in, 1 << 16)
                assert chunk, "Chromium closed the pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._n:
                assert "error" not in reply, reply
                return reply["result"]  # type: ignore[no-any-return]

    def js(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Until the page has loaded, the expression may not even be evaluable.
            value = self.js(
                f"(() => {{ try {{ return {expression}; }} catch (e) {{ return null; }} }})()"
            )
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"never true: {expression}")

    def click(self, selector: str) -> None:
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()
        os.close(self._in)
        os.close(self._out)


@pytest.fixture
def browser(page: Path) -> Iterator[DevTools]:
    tools = DevTools(page.resolve().as_uri())
    tools.wait("document.documentElement.dataset.ready")
    try:
        yield tools
    finally:
        tools.close()


SHOWN = "document.getElementById('match-count').dataset.count"
KEYS = "[...document.querySelectorAll('.sample-row')].map(r => r.dataset.key)"


def test_typing_and_choosing_filter_the_list(browser: DevTools) -> None:
    assert browser.js(SHOWN) == "24"
    browser.js("document.getElementById('f-q').focus()")
    browser.send("Input.insertText", text="tokyo")
    browser.wait(f"{SHOWN} === '6'")
    assert browser.js(KEYS) == ["q0#0", "q4#0", "q8#0"] * 2
    assert "q=tokyo" in browser.js("location.hash")
    # A choice narrows it further: the runs' right answers among them.
    browser.js(
        "const v = document.getElementById('f-verdict'); v.value = 'right';"
        "v.dispatchEvent(new Event('input'))"
    )
    browser.wait(f"{SHOWN} === '3'")
    assert browser.js(KEYS) == ["q0#0", "q4#0", "q8#0"]
    assert "verdict=right" in browser.js("location.hash")
    # Clicking a row opens that sample, with its graph.
    browser.click(".sample-row[data-key='q4#0']")
    browser.wait("!!document.querySelector('#sample svg')")
    assert browser.js("document.querySelectorAll('#sample svg g.step').length") == 2
    assert "sample=" in browser.js("location.hash")


def test_the_list_draws_only_the_rows_in_view(tmp_path: Path) -> None:
    records = [
        planned_record(f"n{i:04d}", f"question {i}", chain("gpt-small")) for i in range(2000)
    ]
    page = write_view(load_runs([write_bench(tmp_path / "run", records)]), tmp_path / "v.html")
    tools = DevTools(page.resolve().as_uri())
    try:
        tools.wait("document.documentElement.dataset.ready")
        assert tools.js(SHOWN) == "2000"
        drawn = tools.js(KEYS)
        assert drawn[0] == "n0000#0" and len(drawn) < 60
        tools.js("document.getElementById('list').scrollTop = 28 * 1500")
        tools.wait("!!document.querySelector('.sample-row[data-key=\"n1500#0\"]')")
        assert len(tools.js(KEYS)) < 60 and "n0000#0" not in tools.js(KEYS)
        # Far down the list, a row's number is still its place in it.
        number = tools.js(
            "document.querySelector('.sample-row[data-key=\"n1500#0\"]').children[0].textContent"
        )
        assert number == "1501"
    finally:
        tools.close()


ROWS = (
    "[...document.querySelectorAll('.sample-row')]"
    ".map(r => [r.children[0].textContent, r.children[1].textContent, r.dataset.key])"
)


def test_the_rows_are_numbered_in_the_list_as_filtered(browser: DevTools) -> None:
    # #: the row's place in the list (1, 2, ...); run: the run's number in the overview.
    shown = browser.js(ROWS)
    assert [n for n, _run, _key in shown] == [str(i) for i in range(1, 25)]
    assert [run for _n, run, _key in shown] == ["0"] * 12 + ["1"] * 12
    browser.js("location.hash = 'verdict=wrong'")
    browser.wait(f"{SHOWN} === '9'")
    wrong = browser.js(ROWS)
    assert [n for n, _run, _key in wrong] == [str(i) for i in range(1, 10)]
    assert [(run, key) for _n, run, key in wrong] == [
        ("0", "q1#0"),
        ("0", "q5#0"),
        ("0", "q9#0"),
        *[("1", f"q{i}#0") for i in (0, 1, 4, 5, 8, 9)],
    ]


NOTICE = "document.getElementById('sample-notice')"
OPEN = "document.querySelector('#sample h3')"


def open_page(page: Path, fragment: str) -> DevTools:
    tools = DevTools(page.resolve().as_uri() + "#" + fragment)
    tools.wait("document.documentElement.dataset.drawn")
    return tools


def test_a_link_cannot_show_a_sample_its_filter_hides(page: Path) -> None:
    # Sample 1 (q1 of run 0) is wrong: a link filtering the right answers hides it.
    tools = open_page(page, "verdict=right&sample=1")
    try:
        tools.wait(f"!!{NOTICE}")
        assert tools.js(OPEN) is None and tools.js(SHOWN) == "12"
        text = tools.js(f"{NOTICE}.textContent")
        assert "q1 of run 0 is not shown" in text and "(right)" in text
        # The address says what the page shows: the filter, no sample.
        assert tools.js("location.hash") == "#verdict=right"
        # The notice's button clears the filters and opens the sample.
        tools.click("#sample-notice-open")
        tools.wait(f"!!{OPEN}")
        assert "q1" in tools.js(f"{OPEN}.textContent") and tools.js(SHOWN) == "24"
        assert tools.js("location.hash") == "#sample=1"
        assert tools.js("document.getElementById('f-verdict').value") == ""
        assert tools.js("document.querySelector('.sample-row.chosen').dataset.key") == "q1#0"
        # A filter chosen while a sample is open closes it once it hides it, saying so.
        tools.js(
            "const v = document.getElementById('f-verdict'); v.value = 'failed';"
            "v.dispatchEvent(new Event('input'))"
        )
        tools.wait(f"!!{NOTICE}")
        assert tools.js(OPEN) is None and "(failed)" in tools.js(f"{NOTICE}.textContent")
        assert tools.js("location.hash") == "#verdict=failed"
    finally:
        tools.close()


@pytest.mark.parametrize("fragment", ["verdict=wrong&sample=1", "q=tokyo&sample=12"])
def test_a_link_shows_a_sample_its_filter_lets_through(page: Path, fragment: str) -> None:
    tools = open_page(page, fragment)
    try:
        tools.wait(f"!!{OPEN}")
        assert tools.js(NOTICE) is None
        assert tools.js("location.hash") == "#" + fragment
        chosen = tools.js("document.querySelector('.sample-row.chosen').dataset.index")
        assert chosen == fragment.rsplit("=", 1)[1]
    finally:
        tools.close()


@pytest.mark.parametrize("sample", ["999", "abc", ""])
def test_a_link_to_a_sample_the_page_does_not_hold_says_so(page: Path, sample: str) -> None:
    tools = open_page(page, f"sample={sample}")
    try:
        tools.wait(f"!!{NOTICE}")
        assert tools.js(f"{NOTICE}.dataset.reason") == "unknown" and tools.js(OPEN) is None
        assert f"names sample {sample}," in tools.js(f"{NOTICE}.textContent")
        assert tools.js(SHOWN) == "24"
    finally:
        tools.close()


def test_the_list_shows_the_question_and_the_sample_its_prompt(tmp_path: Path) -> None:
    template = "Solve the following problem. Reason step by step.\n\n{q}\n\nEnd with ANSWER."
    asked = ["What is 9 + 10?", "Name a <b>prime</b>."]
    records = [
        planned_record(f"q{i}", q, chain("gpt-small"), template=template)
        for i, q in enumerate(asked)
    ]
    page = write_view(load_runs([write_bench(tmp_path / "run", records)]), tmp_path / "v.html")
    tools = open_page(page, "sample=1")
    try:
        tools.wait(f"!!{OPEN}")
        cells = tools.js(
            "[...document.querySelectorAll('.sample-row')].map(r => r.children[7].textContent)"
        )
        assert cells == asked
        box = "document.getElementById('sample')"
        assert tools.js(f"{box}.querySelector('pre').textContent") == asked[1]
        assert tools.js(f"{box}.querySelector('details.prompt pre').textContent") == (
            template.replace("{q}", asked[1])
        )
        # The search looks in the question, not in the template every prompt shares.
        tools.js(
            "const q = document.getElementById('f-q'); q.value = 'step by step';"
            "q.dispatchEvent(new Event('input'))"
        )
        tools.wait(f"{SHOWN} === '0'")
    finally:
        tools.close()


LABELS = "[...document.querySelectorAll('#chart-accuracy-cost g[id^=\"run-label-\"] text')]"


@pytest.mark.parametrize(("n", "same"), [(2, True), (6, True), (15, True), (15, False)])
def test_the_chart_labels_never_overlap(tmp_path: Path, n: int, same: bool) -> None:
    # Long names that differ only at their ends, every run at the same point (or spread).
    runs = []
    for k in range(n):
        records = [
            planned_record(
                f"q{i}",
                f"question {i}",
                chain("gpt-small"),
                verdict="correct" if i < (3 if same else 1 + k % 5) else "incorrect",
                cost=0.002 if same else 0.001 * (1 + k % 4),
            )
            for i in range(6)
        ]
        runs.append(
            write_bench(
                tmp_path / f"run-{k}",
                records,
                benchmark="math500-with-a-very-long\nbenchmark-name",
                strategy=f"conductor-checkpoint-of-the-grpo-training-run-{k}",
            )
        )
    page = write_view(load_runs(runs), tmp_path / "view.html")
    tools = open_page(page, "")
    try:
        boxes = tools.js(
            f"{LABELS}.map(t => {{ const r = t.getBoundingClientRect();"
            " return [t.textContent, r.left, r.top, r.right, r.bottom]; })"
        )
        chart = tools.js(
            "(() => { const r = document.querySelector('#chart-accuracy-cost svg')"
            ".getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })()"
        )
        leaders = tools.js(
            "[...document.querySelectorAll('#chart-accuracy-cost g[id^=\"run-leader-\"] path')]"
            ".map(p => { const m = p.getScreenCTM(), L = p.getTotalLength();"
            " return [0, L].map(d => { const q = p.getPointAtLength(d);"
            " return [q.x * m.a + q.y * m.c + m.e, q.x * m.b + q.y * m.d + m.f]; }); })"
        )
    finally:
        tools.close()
    assert len(boxes) == len(leaders) == n
    for i, (text, left, top, right, bottom) in enumerate(boxes):
        # Each label is one line, says which run it is, and is drawn whole inside the chart.
        # (a long name loses its middle, which keeps the ends that tell runs apart).
        assert text.startswith(f"{i}: math500-with-a-very") and text.endswith(f"run-{i} · fake")
        assert "…" in text and "\n" not in text
        assert bottom - top < 20 and right > left
        assert chart[0] <= left and right <= chart[2] and chart[1] <= top and bottom <= chart[3]
        # Its leader line leaves from its own left side.
        (x0, y0), _end = leaders[i]
        assert abs(x0 - left) < 8 and top - 4 <= y0 <= bottom + 4
    for a in range(n):
        for b in range(a + 1, n):
            _ta, la, ta, ra, ba = boxes[a]
            _tb, lb, tb, rb, bb = boxes[b]
            apart = ra <= lb or rb <= la or ba <= tb or bb <= ta
            assert apart, f"labels {a} and {b} overlap: {boxes[a]} {boxes[b]}"
    if same:  # every leader ends at the one point all the runs share (a few pixels short)
        ends = [end for _start, end in leaders]
        assert max(abs(x - ends[0][0]) + abs(y - ends[0][1]) for x, y in ends) < 8


def test_an_empty_page_says_a_linked_sample_is_not_there(tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "samples.jsonl").write_text("")
    page = write_view(load_runs([records]), tmp_path / "v.html")
    tools = open_page(page, "sample=0")
    try:
        tools.wait(f"!!{NOTICE}")
        assert "(it holds none)" in tools.js(f"{NOTICE}.textContent")
        assert tools.js(SHOWN) == "0"
    finally:
        tools.close()


def test_details_and_search_are_read_from_the_companion_chunk_by_chunk(tmp_path: Path) -> None:
    records = [
        planned_record(f"q{i}", f"Question number {i}", chain("gpt-small")) for i in range(8)
    ]
    run_dir = write_bench(tmp_path / "run", records)
    page = write_view(load_run(run_dir, DetailSpool(chunk=3)), tmp_path / "view.html")
    names = sorted(p.name for p in companion_dir(page).iterdir())
    assert names == [f"{k}-0000{n}.js" for k in "ds" for n in range(3)]
    # The last chunk's last sample: its details are its own, not a neighbour's.
    out = dom(page, "sample=7")
    assert "Question number 7</pre>" in out and "Question number 6</pre>" not in out
    # The search reads every chunk before it filters.
    out = dom(page, "q=number+7")
    assert count(out) == 1 and listed(out) == ["q7#0"]
    assert listed(dom(page, "q=question+number")) == [f"q{i}#0" for i in range(8)]


def test_a_page_without_its_own_companion_says_so(tmp_path: Path) -> None:
    run_dir = write_bench(tmp_path / "run", [planned_record("q0", "Alone?", chain("gpt-small"))])
    page = write_view(load_runs([run_dir]), tmp_path / "view.html")
    stale = page.read_text()
    write_view(load_runs([run_dir]), page)  # written again: the companion is another page's
    page.write_text(stale)
    out = dom(page, "sample=0")
    assert 'id="details-missing"' in out and "details of another page" in out
    shutil.rmtree(companion_dir(page))
    out = dom(page, "sample=0")
    assert 'id="details-missing"' in out and "view.details/d-00000.js" in out
    assert "search unavailable" in dom(page, "q=alone") and count(out) == 1
