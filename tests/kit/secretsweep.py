"""A sweep for secrets masked by value: a unique secret planted in every field of a pool
that may take a value from the environment, every command run over it, and every byte
written looked through for each secret in every form it could take.

:func:`run_sweep` plants the secrets (:data:`PLACEMENTS`), runs ``pools show``, ``ask``
(``--out``, ``--json``, ``--otel``, ``--debug``), ``bench`` (on the fake servers over
real HTTP, with ``--junit``, ``--markdown`` and ``--otel``), ``bench --estimate``,
``bench --resume``, ``report``, ``trace`` in each format, ``view``, ``export otel`` and
an in-process ``serve`` (its records, its call cache, its replies, streamed and not),
and returns what it saw.  :func:`leaks` says where each secret was found.  The forms
looked for are worked out here, from the standard library, not from the code under
test.  Each command starts with no secret held (``SECRETS.forget()``), as a new
process would, so a command that loads no pool shows what its own process would know.

Run as a script (``python tests/kit/secretsweep.py [--off]``) it prints the table of
placements x places; ``--off`` runs it with masking by value switched off (the
positive control), and on a checkout without masking by value it shows the before.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conductor.testing import FakeLLMServer, Fault
from kit.benchkit import boxed_number, make_math_file
from kit.otlpkit import OtlpReceiver
from kit.poolkit import invoke_cli, lists, write_pool

try:  # a checkout from before masking by value (the "before" column) has no SECRETS
    from conductor.redact import SECRETS
except ImportError:  # pragma: no cover - only when run against an older checkout
    SECRETS = None  # type: ignore[assignment]

#: Where a secret is planted -> the environment variable that carries it.  The names
#: sound like no key (no KEY, TOKEN, SECRET...), so that only the pool loader can know
#: the values are secrets.
PLACEMENTS = {
    "URL query (?project=)": "SWEEP_QUERY",
    "URL path segment": "SWEEP_PATH",
    "URL fragment": "SWEEP_FRAGMENT",
    "URL user-info": "SWEEP_USERINFO",
    "header (User-Agent)": "SWEEP_HEADER",
    "param (user)": "SWEEP_PARAM",
    "model name": "SWEEP_MODEL",
    "worker id": "SWEEP_ID",
    "worker description": "SWEEP_DESCRIPTION",
    "system prompt": "SWEEP_SYSTEM",
    "prefill": "SWEEP_PREFILL",
    "pool name": "SWEEP_POOL_NAME",
    "Conductor model": "SWEEP_CONDUCTOR_MODEL",
    "Conductor template path": "SWEEP_TEMPLATE_DIR",
    "echoed in an error body": "SWEEP_ECHO",
    "URL of a server that is down": "SWEEP_DOWN",
    "bad URL quoted by an error": "SWEEP_BAD_URL",
    "pool description": "SWEEP_POOL_DESCRIPTION",
    "model name (litellm)": "SWEEP_LITELLM_MODEL",
}


def secret_of(placement: str) -> str:
    """A unique value for ``placement``: letters, digits, ``+``, ``=`` and ``-`` (so that
    a URL, JSON and base64 each write it differently), 20 characters or more."""
    tag = "".join(c for c in placement.title() if c.isalnum())[:10]
    return f"{tag}Q7+w9={tag[::-1].lower()}-Zk3"


SECRETS_BY_PLACEMENT = {p: secret_of(p) for p in PLACEMENTS}
ENV = {var: SECRETS_BY_PLACEMENT[p] for p, var in PLACEMENTS.items()}


def forms(secret: str) -> dict[str, bytes]:
    """The ways a writer or a protocol could write ``secret``."""
    raw = secret.encode()
    out = {
        "raw": secret,
        "percent": urllib.parse.quote(secret, safe=""),
        "percent-lower": urllib.parse.quote(secret, safe="").lower(),
        "form-encoded": urllib.parse.quote_plus(secret),
        # A query read and written again: ``+`` read as a space, written back as ``+``.
        "query-reencoded": urllib.parse.quote_plus(secret.replace("+", " ")),
        "json": json.dumps(secret)[1:-1],
        "json-in-json": json.dumps(json.dumps(secret)[1:-1])[1:-1],
        "html": html.escape(secret),
        "lower": secret.lower(),
        "upper": secret.upper(),
    }
    for offset, prefix in enumerate((b"", b"u:", b"ab:")):
        encoded = base64.b64encode(prefix + raw).decode()
        start = (8 * len(prefix) + 5) // 6
        middle = encoded[start : (8 * (len(prefix) + len(raw))) // 6]
        out[f"base64+{offset}"] = middle
        out[f"base64url+{offset}"] = middle.replace("+", "-").replace("/", "_")
    return {name: text.encode() for name, text in out.items()}


@dataclass
class Sweep:
    """What a sweep saw: the files under ``root`` (less its inputs), the text each
    command printed, and the bytes sent over the wire (spans, serve's replies)."""

    root: Path
    inputs: set[Path] = field(default_factory=set)
    printed: dict[str, str] = field(default_factory=dict)
    sent: dict[str, bytes] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)

    def places(self) -> Iterator[tuple[str, bytes]]:
        """Every place a secret could land: (its name, its bytes)."""
        for path in sorted(self.root.rglob("*")):
            if any(path == i or i in path.parents for i in self.inputs):
                continue
            rel = str(path.relative_to(self.root))
            yield f"path:{rel}", rel.encode()
            if path.is_file():
                yield f"file:{rel}", path.read_bytes()
        for label, text in self.printed.items():
            yield f"printed:{label}", text.encode()
        for label, data in self.sent.items():
            yield f"sent:{label}", data


def leaks(sweep: Sweep) -> dict[str, dict[str, list[str]]]:
    """placement -> place -> the forms of its secret found there."""
    found: dict[str, dict[str, list[str]]] = {}
    wanted = {p: forms(s) for p, s in SECRETS_BY_PLACEMENT.items()}
    for place, data in sweep.places():
        for placement, shapes in wanted.items():
            hits = [name for name, form in shapes.items() if form in data]
            if hits:
                found.setdefault(placement, {})[place] = hits
    return found


def sweep_pool(tmp: Path, server: FakeLLMServer) -> Path:
    """A pool with one secret in every placement (``${VAR}`` references to :data:`ENV`)."""
    base = server.openai_base
    port = base.split(":")[-1].split("/")[0]
    template_dir = tmp / "inputs" / SECRETS_BY_PLACEMENT["Conductor template path"]
    template_dir.mkdir(parents=True)
    from conductor.conductors.prompt import load_conductor_template

    (template_dir / "default.txt").write_text(load_conductor_template("default").text)

    def ref(placement: str) -> str:
        return "${" + PLACEMENTS[placement] + "}"

    def entry(wid: str, **extra: Any) -> dict[str, Any]:
        return {"id": wid, "model": wid, "client": "openai", "api_base": base,
                "max_retries": 0, "timeout_s": 10, **extra}  # fmt: skip

    workers = [
        entry("w-query", api_base=f"{base}?project={ref('URL query (?project=)')}"),
        entry("w-path", api_base=f"http://127.0.0.1:{port}/{ref('URL path segment')}/v1"),
        entry("w-fragment", api_base=f"{base}#{ref('URL fragment')}"),
        entry("w-userinfo", api_base=f"http://{ref('URL user-info')}@127.0.0.1:{port}/v1"),
        entry(
            "w-header",
            params={"extra_headers": {"User-Agent": ref("header (User-Agent)")}},
            context={"prefill": ref("prefill")},
        ),
        entry("w-param", params={"user": ref("param (user)")}),
        {**entry("w-model"), "model": ref("model name")},
        {
            **entry("w-id"),
            "id": ref("worker id"),
            "description": f"Good at sums. {ref('worker description')}",
            "system_prompt": f"Answer briefly. {ref('system prompt')}",
        },
        entry("w-echo", params={"user": ref("echoed in an error body")}),
        entry("w-down", api_base=f"http://127.0.0.1:9/{ref('URL of a server that is down')}/v1"),
        {
            **entry("w-litellm"),
            "client": "litellm",
            "model": f"openai/{ref('model name (litellm)')}",
        },
    ]
    pool = {
        "name": ref("pool name"),
        "description": f"a pool for the secrets sweep {ref('pool description')}",
        "defaults": {"temperature": 0.2, "max_tokens": 256},
        "workers": workers,
        "conductor": {
            "backend": "endpoint",
            "model": ref("Conductor model"),
            "api_base": base,
            "max_retries": 0,
            "template": f"{tmp / 'inputs'}/{ref('Conductor template path')}/default.txt",
            "show_descriptions": True,
            "max_steps": 12,
        },
    }
    assert len(workers) == WORKERS
    return write_pool(tmp / "inputs" / "pool.yaml", pool)


def broken_pool(tmp: Path) -> Path:
    """A pool whose ``api_base`` takes a value that is not a URL: the error quotes it."""
    bad = "${" + PLACEMENTS["bad URL quoted by an error"] + "}"
    pool = {"workers": [{"id": "w", "model": "m", "client": "openai", "api_base": bad}]}
    return write_pool(tmp / "inputs" / "broken.yaml", pool)


#: How many workers the sweep's pool has (the Conductor plans one step for each).
WORKERS = 11


def script_server(server: FakeLLMServer) -> None:
    """The Conductor plans one step per worker; the workers that can be reached answer,
    and the echoing one quotes its secret back in an error body."""
    n = WORKERS
    plan = lists(list(range(n)), ["Solve it."] * n, [[] for _ in range(n)])
    server.script(SECRETS_BY_PLACEMENT["Conductor model"], lambda r: plan)
    for wid in ("w-header", "w-param", "w-userinfo", "w-id", "w-query", "w-fragment"):
        server.script(wid, boxed_number)
    server.script(SECRETS_BY_PLACEMENT["model name"], boxed_number)
    server.script(SECRETS_BY_PLACEMENT["model name (litellm)"], boxed_number)
    echo = SECRETS_BY_PLACEMENT["echoed in an error body"]
    server.script(
        "w-echo",
        lambda r: Fault(400, f"user {echo} is not in project https://api.example/{echo}/v1"),
    )


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    kept = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in kept.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_sweep(tmp: Path, server: FakeLLMServer, *, masking: bool = True) -> Sweep:
    """Run every command over the sweep pool in ``tmp`` (see the module's docstring)."""
    sweep = Sweep(tmp)
    inputs = tmp / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    sweep.inputs.add(inputs)
    pool = sweep_pool(tmp, server)
    data = make_math_file(inputs / "math.jsonl", 2)
    script_server(server)
    cache = tmp / "cache"
    run = tmp / "run"
    env = {**ENV, "CONDUCTOR_CACHE_DIR": str(cache)}
    if SECRETS is not None:
        SECRETS.enabled = masking
    try:
        with OtlpReceiver() as receiver:

            def cli(label: str, *args: str) -> None:
                if SECRETS is not None:
                    SECRETS.forget()  # as a new process starts
                res = invoke_cli(*args, env=env, cwd=tmp)
                sweep.printed[f"{label} (stdout)"] = res.stdout
                sweep.printed[f"{label} (stderr)"] = res.stderr
                sweep.codes[label] = res.returncode

            cli("pools show", "pools", "show", str(pool))
            cli("pools show (bad URL)", "pools", "show", str(broken_pool(tmp)))
            bench = ("bench", "math500", "--pool", str(pool), "--data", str(data))
            cli("bench --estimate", *bench, "--estimate")
            cli(
                "bench",
                *bench, "--out", str(run), "--otel", receiver.url,
                "--junit", str(tmp / "bench-junit.xml"), "--markdown", str(tmp / "bench.md"),
            )  # fmt: skip
            cli("bench --resume", *bench, "--resume", str(run))
            cli(
                "report", "report", str(run),
                "--junit", str(tmp / "report-junit.xml"), "--markdown", str(tmp / "report.md"),
            )  # fmt: skip
            cli("trace", "trace", str(run))
            sample = "math500/test/synthetic/0.json"
            for fmt in ("table", "tree", "mermaid", "svg", "json"):
                cli(f"trace -f {fmt}", "trace", str(run), "--sample", sample, "-f", fmt)
            cli("view", "view", str(run), "--out", str(tmp / "view.html"))
            cli("export otel", "export", "otel", str(run), "--otel", receiver.url)
            ask = ("ask", "What is 3 + 0?", "--pool", str(pool))
            cli("ask", *ask, "--out", str(tmp / "ask-record.json"), "--otel", receiver.url)
            cli("ask --json", *ask, "--json", "--no-cache")
            cli("ask --debug", "--debug", *ask, "--no-cache")
            cli("ask (unknown worker)", *ask, "--strategy", "single:nobody")
            cli("export otel (ask record)", "export", "otel", str(tmp / "ask-record.json"),
                "--otel", receiver.url)  # fmt: skip
            _serve(sweep, pool, tmp, env)
            for i, body in enumerate(receiver.bodies):
                sweep.sent[f"otel export request {i}"] = body
    finally:
        if SECRETS is not None:
            SECRETS.enabled = True
            SECRETS.forget()
    return sweep


def _serve(sweep: Sweep, pool_file: Path, tmp: Path, env: dict[str, str]) -> None:
    """``conductor serve`` of the pool, in process: its records, its call cache and
    what it answers."""
    from conductor.pool import load_pool
    from kit.servekit import served

    if SECRETS is not None:
        SECRETS.forget()
    with _env(env):
        pool = load_pool(pool_file)
        records = tmp / "serve-records"
        with served(pool, records_dir=records, use_cache=True) as url:
            question = {"role": "user", "content": "What is 5 + 0?"}
            with httpx.Client(timeout=60) as client:
                sweep.sent["serve GET /models"] = client.get(f"{url}/models").content
                body = {"model": "conductor", "messages": [question]}
                sweep.sent["serve chat"] = client.post(f"{url}/chat/completions", json=body).content
                streamed = {**body, "stream": True}
                sweep.sent["serve chat (stream)"] = client.post(
                    f"{url}/chat/completions", json=streamed
                ).content
                single = {"model": "single:w-echo", "messages": [question]}
                sweep.sent["serve chat (failing worker)"] = client.post(
                    f"{url}/chat/completions", json=single
                ).content
                responses = {"model": "conductor", "input": "What is 6 + 0?"}
                sweep.sent["serve responses"] = client.post(
                    f"{url}/responses", json=responses
                ).content


# Places grouped for the table: (column, what a place's name starts with).  What a
# command printed is split: standard output by command, standard error (logs, warnings,
# error lines) in one column.
COLUMNS = (
    ("pools show", ("printed:pools show (stdout)",)),
    ("config.json", ("file:run/config.json",)),
    ("samples.jsonl", ("file:run/samples.jsonl",)),
    ("summary.json", ("file:run/summary.json",)),
    ("rate_limits.json", ("file:run/rate_limits.json",)),
    ("cache.db", ("file:cache/",)),
    ("otel spans", ("sent:otel",)),
    ("view HTML", ("file:view",)),
    ("JUnit/Markdown", ("file:bench-junit", "file:bench.md", "file:report")),
    ("bench/--estimate stdout", ("printed:bench",)),
    ("report/trace stdout", ("printed:report", "printed:trace")),
    ("ask stdout/--out/--json", ("printed:ask", "file:ask-record")),
    ("stderr: logs, errors", ()),
    ("serve records", ("file:serve-records",)),
    ("serve replies", ("sent:serve",)),
    ("file names", ("path:",)),
)
_STDERR = "stderr: logs, errors"


def in_column(place: str, column: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``place`` belongs to ``column`` of :data:`COLUMNS`."""
    if place.endswith("(stderr)"):
        return column == _STDERR
    return place.startswith(prefixes) if prefixes else False


def table(found: dict[str, dict[str, list[str]]]) -> str:
    """A Markdown table: placement x column, ``L`` where the secret was found."""
    head = "| placement | " + " | ".join(c for c, _ in COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    rows = [head, rule]
    for placement in PLACEMENTS:
        places = found.get(placement, {})
        cells = []
        for column, prefixes in COLUMNS:
            hit = any(in_column(p, column, prefixes) for p in places)
            cells.append("**L**" if hit else ".")
        rows.append(f"| {placement} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:  # pragma: no cover - a script for the report's table
    import sys
    import tempfile

    masking = "--off" not in sys.argv
    tmp = Path(tempfile.mkdtemp(prefix="secretsweep-"))
    try:
        with FakeLLMServer() as server:
            sweep = run_sweep(tmp, server, masking=masking)
        found = leaks(sweep)
        print(table(found))
        print()
        print("exit codes:", json.dumps(sweep.codes))
        for placement, places in found.items():
            for place, hits in sorted(places.items()):
                print(f"{placement}: {place}: {', '.join(hits)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    main()
