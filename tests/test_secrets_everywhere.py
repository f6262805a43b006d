"""No secret taken from the environment lands anywhere, whatever field it was put in:
the sweep of tests/kit/secretsweep.py (a unique secret in every field a pool may
substitute into; ``ask``, ``bench`` over real HTTP, ``serve``, ``report``, ``trace``,
``view``, ``export otel``, ``pools show``, ``--estimate``; every byte of every file, of
the output, of the spans and of serve's replies looked through for each secret in every
form), its positive control (masking switched off, the same sweep finds every secret
the name rules do not hide), and the walls that keep a new writer from going round the
masking."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from kit.clock import scaled
from kit.poolkit import invoke_cli, write_pool
from kit.secretsweep import PLACEMENTS, SECRETS_BY_PLACEMENT, leaks, run_sweep, table

from conductor.redact import MIN_SECRET_CHARS, SECRETS
from conductor.testing import FakeLLMServer

SRC = Path(__file__).resolve().parents[1] / "src" / "conductor"
# The placement the name rules hide already (``https://KEY@host``): found nowhere even
# with masking by value off.
HIDDEN_BY_NAME = {"URL user-info"}
# The commands that fail on purpose (a pool whose URL is bad, a worker that is not in it).
FAILING = {"pools show (bad URL)": 2, "ask (unknown worker)": 2}


@pytest.mark.process  # the spans are sent by a child process
def test_no_secret_lands_anywhere(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    sweep = run_sweep(tmp_path, fake_server)
    assert sweep.codes == {label: FAILING.get(label, 0) for label in sweep.codes}, sweep.codes
    # The sweep reached what it looks through.
    written = ("run/samples.jsonl", "run/rate_limits.json", "cache/cache.db", "view.html",
               "serve-records/samples.jsonl", "ask-record.json", "report-junit.xml")  # fmt: skip
    for name in written:
        assert (tmp_path / name).is_file(), name
    assert any(label.startswith("otel") for label in sweep.sent)
    assert b'"choices"' in sweep.sent["serve chat"]
    found = leaks(sweep)
    assert found == {}, table(found) + "\n" + repr(found)


@pytest.mark.process
def test_without_masking_the_sweep_finds_every_secret(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # The positive control: the same sweep, masking by value off, finds each secret but
    # the one the name rules hide; so the sweep above can fail, placement by placement.
    found = leaks(run_sweep(tmp_path, fake_server, masking=False))
    assert set(found) == set(PLACEMENTS) - HIDDEN_BY_NAME, table(found)


def _param_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    worker = {"id": "w", "model": "m", "client": "openai", "api_base": server.openai_base,
              "params": {"user": "${SWEEP_PARAM}"}}  # fmt: skip
    return write_pool(tmp_path / "pool.yaml", {"workers": [worker]})


@pytest.mark.parametrize("masking", [True, False])
def test_a_secret_folded_on_a_narrow_terminal_leaves_no_piece(
    tmp_path: Path, fake_server: FakeLLMServer, masking: bool
) -> None:
    # A value longer than its column is folded over lines: masked after the layout (in
    # the text written out), its pieces would each slip through.  Masked before the
    # layout, none is left.
    secret = SECRETS_BY_PLACEMENT["param (user)"] * 3
    pool = _param_pool(tmp_path, fake_server)
    SECRETS.enabled = masking
    try:
        res = invoke_cli("pools", "show", str(pool), env={"SWEEP_PARAM": secret}, columns=40)
    finally:
        SECRETS.enabled = True
    assert res.returncode == 0, res.stderr
    pieces = {secret[i : i + MIN_SECRET_CHARS] for i in range(len(secret) - MIN_SECRET_CHARS)}
    left = sorted(p for p in pieces if p in res.stdout)
    if masking:
        assert left == [] and "user=***" in res.stdout, res.stdout
    else:  # the control: folded, the whole value is nowhere, its pieces are there
        assert secret not in res.stdout and left, res.stdout


@pytest.mark.process
def test_a_traceback_is_masked(tmp_path: Path) -> None:
    # --debug lets an error through as a traceback, printed as the process ends.
    bad = "ftp://drop.example/" + SECRETS_BY_PLACEMENT["bad URL quoted by an error"]
    pool = tmp_path / "pool.yaml"
    pool.write_text("workers:\n  - {id: w, model: m, api_base: '${SWEEP_BAD_URL}'}\n")
    res = subprocess.run(
        [sys.executable, "-m", "conductor", "--debug", "pools", "show", str(pool)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env={**__import__("os").environ, "SWEEP_BAD_URL": bad},
    )
    assert res.returncode != 0 and "Traceback" in res.stderr, res.stderr
    # The message quoted the value (the control: it is there, masked).
    assert "must be an http(s) URL" in res.stderr and 'got "***"' in res.stderr
    assert bad not in res.stderr and SECRETS_BY_PLACEMENT["bad URL quoted by an error"] not in (
        res.stderr
    )


# --------------------------------------------------------------------------- the walls

# Every module that writes a file, and how what it writes is masked.  A new writer fails
# test_every_writer_is_known until it is added here, masked (or shown to hold nothing a
# pool gave it).  The two writers that go through a library are masked at their door:
# config.json's text (runs/config.py, BenchConfig.to_json) and the call cache's values
# (llm/cache.py, ResponseCache._write; its keys are digests).
WRITERS = {
    "record.py": "masked_json (ask --out)",
    "runs/rundir.py": "record_line masks (samples.jsonl, serve's records, batches.jsonl)",
    "runs/summary.py": "masked_json (summary.json, rate_limits.json)",
    "runs/batches.py": "record_line",
    "runs/lock.py": "the lock: a pid and a host name, nothing of a pool",
    "bench/claim.py": "record_line, BenchConfig.to_json",
    "bench/merge.py": "record_line, BenchConfig.to_json",
    "bench/shared.py": "state_token (random, nothing of a pool); record_line's lines",
    "localmodel/crashes.py": "masked_json (a model path may come from the environment)",
    "otel/_child.py": "masked_json (the tracer's report)",
    "view/page.py": "mask + mask_text",
    "view/companion.py": "mask",
    "router/store.py": "masked_json (router.json); the head is numbers",
    "train/metrics.py": "masked_json",
    "train/trainer.py": "masked_json",
    "conductors/checkpoint.py": "not masked: a checkpoint's conductor.json keeps the worker "
    "ids it was trained on (pool_order), which a later run compares",
    "datasets/sources.py": "a downloaded data file, nothing of a pool",
    "cli/_ci.py": "mask_text (--junit, --markdown)",
}
_WRITE_CALLS = {"write_private", "open_private", "write_text", "write_bytes"}


def _writer_modules() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        if rel.startswith(("testing/", "sandbox/")) or rel == "private.py":
            continue  # the fakes, the sandbox's scratch files, the writers' own floor
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in _WRITE_CALLS:
                    found.add(rel)
    return found


def test_every_writer_is_known() -> None:
    assert _writer_modules() == set(WRITERS)


def test_commands_print_only_through_the_masking_consoles() -> None:
    # typer.echo, print and sys.stdout.write would go round the consoles' masking: the
    # commands use _common's consoles and echo; app.py prints the version only.
    allowed = {"cli/_common.py": {"echo"}, "cli/app.py": {"echo", "write"}}
    for path in sorted((SRC / "cli").glob("*.py")):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    pytest.fail(f"{rel}:{node.lineno}: print() goes round the masking")
                continue
            owner = ast.unparse(node.func.value)
            if owner in ("typer", "click", "sys.stdout", "sys.stderr") and node.func.attr in (
                "echo",
                "secho",
                "write",
            ):
                assert node.func.attr in allowed.get(rel, set()), (
                    f"{rel}:{node.lineno}: {owner}.{node.func.attr} goes round the masking"
                )
