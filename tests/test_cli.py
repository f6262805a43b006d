"""The real `conductor` command, run as a subprocess against the fake provider server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, invoke_cli, lists, pool_dict, run_cli, worker, write_pool

from conductor import __version__
from conductor.testing import FakeLLMServer, Fault

SECRET = "sk-test-SECRET-0123456789abcdef"


def conductor(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return run_cli(*args, env=env, timeout=timeout, columns=120)


def here(*args: str, env: dict[str, str] | None = None) -> Any:
    """The same command in this process, for tests that need nothing of a real one."""
    return invoke_cli(*args, env=env, columns=120)


def four_client_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    workers = [
        worker(server, "via-litellm", "litellm", api_key_env="FAKE_KEY"),
        worker(server, "via-openai", "openai", api_key_env="FAKE_KEY"),
        worker(server, "via-anthropic", "anthropic", api_key_env="FAKE_KEY"),
        worker(server, "via-google", "google", api_key_env="FAKE_KEY"),
    ]
    data = pool_dict(server, workers, api_key_env="FAKE_KEY")
    return write_pool(tmp_path / "pool.yaml", data)


@pytest.mark.process
def test_ask_end_to_end_with_every_client(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.expected_api_key = SECRET
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            lists(
                [0, 1, 2, 3],
                ["Try it", "Try it too", "And you", "Pick the best and answer"],
                [[], [], [], ["all"]],
            )
        ],
    )
    for wid in ("via-litellm", "via-openai", "via-anthropic"):
        fake_server.script(wid, [f"{wid} says 391"])
    fake_server.script("via-google", ["ANSWER: 391"])
    pool = four_client_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    cache = tmp_path / "cache"
    env = {"FAKE_KEY": SECRET, "CONDUCTOR_CACHE_DIR": str(cache)}
    res = conductor("ask", "What is 17 * 23?", "--pool", str(pool), "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr
    # Topology, step table and answer are all shown.
    assert "parallel" in res.stdout
    for wid in ("via-litellm", "via-openai", "via-anthropic", "via-google"):
        assert wid in res.stdout
    assert "ANSWER: 391" in res.stdout
    protocols = {r.protocol for r in fake_server.requests}
    assert protocols == {"openai", "anthropic", "gemini"}
    assert all(r.api_key == SECRET for r in fake_server.requests)

    record = json.loads(out.read_text())
    assert record["schema_version"] == 2
    assert record["final_answer"] == "ANSWER: 391"
    assert [s["worker_id"] for s in record["rounds"][0]["steps"]] == [
        "via-litellm",
        "via-openai",
        "via-anthropic",
        "via-google",
    ]
    assert all(s["call"]["input_tokens"] > 0 for s in record["rounds"][0]["steps"])

    # The rerun is answered entirely from the cache: no HTTP request at all.
    before = len(fake_server.requests)
    again = conductor("ask", "What is 17 * 23?", "--pool", str(pool), "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert len(fake_server.requests) == before
    rerun = json.loads(again.stdout)
    assert rerun["totals"]["cached_calls"] == rerun["totals"]["calls"] == 5

    # No secret in any file written: the record, the cache, or the output.
    written = [p for p in [out, *cache.rglob("*")] if p.is_file()]
    assert written
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in res.stdout + res.stderr + again.stdout + again.stderr

    # trace renders the record in every format.
    for fmt in ("table", "tree", "mermaid", "json"):
        shown = conductor("trace", str(out), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        assert "via-google" in shown.stdout
    assert "flowchart" in conductor("trace", str(out), "--format", "mermaid").stdout


@pytest.mark.process
def test_ask_debug_logs_hold_no_secret(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    fake_server.script("via-openai", [Fault(401, "Incorrect API key provided")])
    pool = four_client_pool(tmp_path, fake_server)
    env = {"FAKE_KEY": SECRET, "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    res = conductor(
        "--debug", "ask", "q", "--pool", str(pool), "--out", str(tmp_path / "r.json"), env=env
    )
    assert res.returncode == 1
    assert SECRET not in res.stdout + res.stderr
    assert SECRET not in (tmp_path / "r.json").read_text()


@pytest.mark.process
def test_auth_failure_exits_1_with_clear_message(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    fake_server.script("via-openai", [Fault(401, "Incorrect API key provided")])
    pool = four_client_pool(tmp_path, fake_server)
    res = conductor("ask", "q", "--pool", str(pool), "--no-cache", env={"FAKE_KEY": "k"})
    assert res.returncode == 1
    text = " ".join((res.stdout + res.stderr).split())
    assert "via-openai" in text and "401" in text and "Incorrect API key provided" in text
    assert len(fake_server.requests_for("via-openai")) == 1  # not retried
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("yaml_text", "needle", "line"),
    [
        ("name: x\nworkers:\n  - id: a\n    modle: openai/gpt-5\n", 'did you mean "model"', 4),
        ("workers:\n  - id: a\n    model: m\n  - id: a\n    model: m\n", "duplicate", 4),
        ("workers: [\n", "", None),
    ],
)
def test_bad_pool_exits_2_with_file_and_line(
    tmp_path: Path, yaml_text: str, needle: str, line: int | None
) -> None:
    pool = tmp_path / "bad.yaml"
    pool.write_text(yaml_text)
    res = here("ask", "q", "--pool", str(pool))
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert str(pool) in err
    if line is not None:
        assert f"{pool}:{line}:" in err
    assert needle in err
    assert "Traceback" not in res.stderr


def test_unknown_pool_name_exits_2() -> None:
    res = here("ask", "q", "--pool", "no-such-pool")
    assert res.returncode == 2
    assert "no-such-pool" in res.stderr


@pytest.mark.process
def test_help_is_fast_and_does_not_import_litellm() -> None:
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('litellm', 'openai', 'anthropic', 'google.genai', 'llama_cpp')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert "HEAVY []" in res.stdout, res.stdout
    assert "ask" in res.stdout and "trace" in res.stdout


@pytest.mark.process
def test_help_imports_no_command_library() -> None:
    """Each command imports what it runs on when it runs: ``--help`` loads none of it."""
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "libs = ('conductor.execute', 'conductor.bench.session', 'conductor.bench.runner',"
        " 'conductor.pool_check', 'conductor.train.trainer', 'conductor.render', 'diskcache',"
        " 'datasets', 'torch', 'rich.live', 'rich.progress')\n"
        "print('LOADED', [m for m in libs if m in sys.modules])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert "LOADED []" in res.stdout, res.stdout + res.stderr


@pytest.mark.process
def test_the_cli_package_runs_as_a_module() -> None:
    """``python -m conductor.cli`` is how ``accelerate launch -m conductor.cli train`` starts."""
    res = subprocess.run(
        [sys.executable, "-m", "conductor.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"conductor {__version__}"


def test_trace_of_a_bad_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "run.json"
    bad.write_text("{not json")
    res = here("trace", str(bad))
    assert res.returncode == 2
    assert f"{bad}:1" in res.stderr


def test_pools_list_and_show() -> None:
    res = here("pools", "list")
    assert res.returncode == 0, res.stderr
    for name in ("frontier", "paper", "open", "local"):
        assert name in res.stdout
    shown = here("pools", "show", "paper")
    assert shown.returncode == 0, shown.stderr
    assert "Model 6" in shown.stdout


@pytest.mark.process
def test_pools_check_reports_latency_and_errors(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("via-anthropic", [Fault(401, "invalid x-api-key")])
    pool = four_client_pool(tmp_path, fake_server)
    res = conductor("pools", "check", str(pool), env={"FAKE_KEY": "k"})
    assert res.returncode == 1
    out = " ".join(res.stdout.split())
    assert "ok" in out and "invalid x-api-key" in out
    assert {r.model for r in fake_server.requests} >= {"via-openai", "via-google", CONDUCTOR_MODEL}


@pytest.mark.process
def test_pools_check_reports_a_conductor_that_cannot_be_set_up(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    data = pool_dict(fake_server, [worker(fake_server, "w0")])
    data["conductor"] = {"backend": "checkpoint", "model": str(tmp_path / "no-such-checkpoint")}
    res = conductor("pools", "check", str(write_pool(tmp_path / "pool.yaml", data)))
    assert res.returncode == 1, res.stdout
    out = " ".join(res.stdout.split())
    assert "Conductor" in out and "does not exist" in out
    assert [r.model for r in fake_server.requests] == ["w0"]  # the worker is still checked


@pytest.mark.process
def test_cache_stats_and_clear(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["go"], [[]])])
    pool = four_client_pool(tmp_path, fake_server)
    env = {"FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(tmp_path / "cc")}
    assert conductor("ask", "q", "--pool", str(pool), env=env).returncode == 0
    stats = conductor("cache", "stats", env=env)
    assert "entries:   2" in stats.stdout
    assert "directory:" in stats.stdout and str(tmp_path / "cc") in stats.stdout
    assert "removed 0" in conductor("cache", "clear", "--older-than", "7d", env=env).stdout
    assert "removed 2" in conductor("cache", "clear", env=env).stdout
    bad = conductor("cache", "clear", "--older-than", "soon", env=env)
    assert bad.returncode == 2


# -- bad inputs: one line, exit 2 ----------------------------------------------------


def one_error_line(res: Any) -> str:
    """The single line a refused command prints: no traceback, exactly one line (log
    warnings aside)."""
    assert "Traceback" not in res.stderr, res.stderr
    lines = [
        line for line in res.stderr.splitlines() if line.strip() and not line.startswith("WARNING")
    ]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def fake_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    data = pool_dict(server, [worker(server, "w", api_key_env="FAKE_KEY")], api_key_env="FAKE_KEY")
    return write_pool(tmp_path / "pool.yaml", data)


def bench_cmd(pool: Path, data: Path, out: Path) -> list[str]:
    return ["bench", "math500", "--pool", str(pool), "--strategy", "single:w", "--data", str(data),
            "--out", str(out)]  # fmt: skip


@pytest.mark.process
def test_bench_refuses_bad_data_before_any_request(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = fake_pool(tmp_path, fake_server)
    env = {"FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"problem": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1"))
    res = conductor(*bench_cmd(pool, latin1, tmp_path / "r1"), env=env)
    assert res.returncode == 2
    assert f"{latin1}:1: is not UTF-8 text" in one_error_line(res)

    columns = tmp_path / "columns.jsonl"
    columns.write_text('{"question": "q", "gold": "1"}\n')
    res = conductor(*bench_cmd(pool, columns, tmp_path / "r2"), env=env)
    assert res.returncode == 2
    line = one_error_line(res)
    assert f"{columns}:1:" in line and "no column 'problem' (it has: gold, question)" in line

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"problem": "x" * 200, "answer": "1"}) + "\n")
    limited = {**env, "CONDUCTOR_MAX_QUESTION_CHARS": "100"}
    res = conductor(*bench_cmd(pool, long, tmp_path / "r3"), env=limited)
    assert res.returncode == 2
    assert "the question is 200 characters long, over the limit of 100" in one_error_line(res)
    assert fake_server.requests == []


def test_ask_refuses_a_question_over_the_limit(tmp_path: Path) -> None:
    res = here("ask", "y" * 200, env={"CONDUCTOR_MAX_QUESTION_CHARS": "100"})
    assert res.returncode == 2
    assert "over the limit of 100" in one_error_line(res)


@pytest.mark.process
def test_unusable_output_and_cache_paths_exit_2(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, lambda request: lists([0], ["Solve it"], [[]]))
    fake_server.set_default(lambda request: "ANSWER: 1000")
    pool = fake_pool(tmp_path, fake_server)
    data = tmp_path / "ok.jsonl"
    data.write_text(json.dumps({"problem": "What is 1000?", "answer": "1000"}) + "\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    env = {"FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}

    res = conductor("ask", "q", "--pool", str(pool), "--out", str(a_file / "run.json"), env=env)
    assert res.returncode == 2
    assert "cannot write the run record (Not a directory)" in one_error_line(res)
    assert fake_server.requests == []  # refused before paying for the run
    res = conductor(*bench_cmd(pool, data, a_file / "run"), env=env)
    assert res.returncode == 2
    assert f"{a_file / 'run'}: cannot create the run directory (Not a directory)" in (
        one_error_line(res)
    )
    bad_cache = {**env, "CONDUCTOR_CACHE_DIR": str(a_file / "cache")}
    res = conductor(*bench_cmd(pool, data, tmp_path / "r"), env=bad_cache)
    assert res.returncode == 2
    assert "the cache directory" in one_error_line(res) and "--no-cache" in res.stderr
    res = conductor("cache", "stats", env=bad_cache)
    assert res.returncode == 2


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged user can enter (pytest's tmp_path is private)."""
    path = Path(tempfile.mkdtemp(prefix="conductor-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in path.rglob("*"):
            with contextlib.suppress(OSError):
                sub.chmod(0o755 if sub.is_dir() else 0o644)
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.process
def test_read_only_output_and_cache_directories_exit_2(
    shared_dir: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lambda request: lists([0], ["Solve it"], [[]]))
    fake_server.set_default(lambda request: "ANSWER: 1000")
    pool = fake_pool(shared_dir, fake_server)
    data = shared_dir / "ok.jsonl"
    data.write_text(json.dumps({"problem": "What is 1000?", "answer": "1000"}) + "\n")
    for path in (pool, data):
        path.chmod(0o644)
    read_only = shared_dir / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    writable_cache = shared_dir / "cache"
    writable_cache.mkdir()
    writable_cache.chmod(0o777)
    denied = _read_only_runner(shared_dir)

    def run(*args: str, cache: Path, read_only_dirs: tuple[Path, ...] = (read_only,)) -> Any:
        env = {**os.environ, "COLUMNS": "120", "FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(cache)}
        return subprocess.run(
            [*denied.prefix(read_only_dirs), sys.executable, "-m", "conductor", *args],
            capture_output=True,
            text=True,
            timeout=scaled(120),
            env=env,
            cwd=shared_dir,
        )

    res = run(
        "ask", "q", "--pool", str(pool), "--out", str(read_only / "r.json"), cache=writable_cache
    )
    assert res.returncode == 2, res.stderr
    assert f"cannot write the run record ({denied.reason})" in one_error_line(res)
    res = run(*bench_cmd(pool, data, read_only / "run"), cache=writable_cache)
    assert res.returncode == 2, res.stderr
    assert f"{read_only / 'run'}: cannot create the run directory ({denied.reason})" in (
        one_error_line(res)
    )
    # A read-only cache directory, empty or already holding a cache.
    res = run(*bench_cmd(pool, data, shared_dir / "run"), cache=read_only)
    assert res.returncode == 2, res.stderr
    assert f"the cache directory {read_only} cannot be used" in one_error_line(res)
    assert any(writable_cache.iterdir())  # the runs above opened a cache there
    for sub in writable_cache.rglob("*"):
        sub.chmod(0o555 if sub.is_dir() else 0o444)
    writable_cache.chmod(0o555)
    res = run("cache", "stats", cache=writable_cache, read_only_dirs=(writable_cache,))
    assert res.returncode == 2, res.stderr
    assert "cannot be used" in one_error_line(res)


@dataclass(frozen=True)
class _ReadOnlyRunner:
    """How a child process is run so that directories it is given cannot be written,
    and the reason (``strerror``) a write there fails with."""

    mechanism: str  # "mount": read-only bind mounts; "chmod": permissions; "setpriv"
    reason: str

    def prefix(self, read_only_dirs: tuple[Path, ...]) -> list[str]:
        if self.mechanism == "mount":
            # Each directory bind-mounted read-only onto itself in a private mount
            # namespace: refused to every user, root included (EROFS).
            return [*_UNSHARE, "sh", "-c", _RO_SCRIPT, "sh", *map(str, read_only_dirs), "--"]
        if self.mechanism == "setpriv":
            return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        return []


_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]
_RO_SCRIPT = (
    'while [ "$1" != -- ]; do '
    'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 97; shift; done; '
    'shift; exec "$@"'
)


def _read_only_runner(shared: Path) -> _ReadOnlyRunner:
    """A way to make directories unwritable for a child that binds its user.

    Root ignores file permissions, so a read-only bind mount in a user namespace is
    tried first (it binds root too); without one, permissions do for another user, and
    root runs the child as nobody (65534) where that user can read the interpreter and
    this checkout (a checkout inside a 0700 directory, such as root's home, is not).
    """
    probe = shared / "ro-probe"
    probe.mkdir()
    try:
        if shutil.which("unshare") and shutil.which("mount"):
            # The same mount, then a write that must fail.
            script = _RO_SCRIPT.replace('exec "$@"', 'if touch "$1/x"; then exit 1; fi')
            done = subprocess.run(
                [*_UNSHARE, "sh", "-c", script, "sh", str(probe), "--", str(probe)],
                capture_output=True,
                timeout=scaled(30),
            )
            if done.returncode == 0:
                return _ReadOnlyRunner("mount", "Read-only file system")
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if os.geteuid() != 0:
        return _ReadOnlyRunner("chmod", "Permission denied")
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, with neither a user namespace nor setpriv to drop root")
    import conductor

    nobody = _ReadOnlyRunner("setpriv", "Permission denied")
    seen = subprocess.run(
        [*nobody.prefix(()), sys.executable, "-c", "import conductor; print(conductor.__file__)"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=shared,
    )
    if seen.returncode != 0 or seen.stdout.strip() != conductor.__file__:
        last = (seen.stderr.strip().splitlines() or [f"it imports {seen.stdout.strip()}"])[-1]
        pytest.skip(
            "running as root, where file permissions do not bind, without a user namespace "
            "for a read-only mount, and uid 65534 cannot run this checkout's conductor "
            f"(a directory above it closed to other users?): {last}"
        )
    return nobody


@pytest.mark.long
def test_deeply_nested_pool_yaml_exits_2(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("workers: " + "[" * 10_000 + "]" * 10_000 + "\n")
    res = here("pools", "show", str(deep))
    assert res.returncode == 2
    assert f"{deep}: invalid YAML: collections are nested too deeply" in one_error_line(res)


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        ("[]", "not a conductor run record"),
        ('{"schema_version": 1, "rounds": [1]}', "rounds[0] must be an object"),
        ('{"schema_version": 1, "rounds": [{"steps": [{"index": 0}]}]}', "has no 'call'"),
        ('{"schema_version": 1, "rounds": [], "question": 5}', "record.question must be"),
        (
            '{"schema_version": 1, "rounds": [], "question": "q", "pool": {}, "conductor": {},'
            ' "settings": {}, "totals": {"wall_s": "3"}}',
            'totals.wall_s must be a number, not "3"',
        ),
    ],
)
def test_malformed_run_records_exit_2(tmp_path: Path, shape: str, needle: str) -> None:
    path = tmp_path / "run.json"
    path.write_text(shape)
    for fmt in ("table", "tree", "mermaid", "json"):
        res = here("trace", str(path), "--format", fmt)
        assert res.returncode == 2, res.stderr
        line = one_error_line(res)
        assert line.startswith(f"error: {path}: ") and needle in line


def test_malformed_bench_samples_name_their_line(tmp_path: Path) -> None:
    (tmp_path / "samples.jsonl").write_bytes(b'{"schema_version": 1, "rounds": 3}\n')
    res = here("trace", str(tmp_path))
    assert res.returncode == 2
    assert "samples.jsonl:1: record.rounds must be a list" in one_error_line(res)


@pytest.mark.process
def test_terminal_escapes_in_replies_are_shown_not_obeyed(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    hostile = "\x1b[2J\x1b]0;pwned\x07"
    fake_server.script(CONDUCTOR_MODEL, [lists([0], [f"Solve it {hostile}"], [[]])])
    fake_server.script("w", [f"ANSWER: 4 {hostile} \x9b31m"])
    pool = fake_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    env = {"FAKE_KEY": "k", "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    res = conductor("ask", "q", "--pool", str(pool), "--out", str(out), env=env)
    assert res.returncode == 0, res.stderr
    for text in (res.stdout, res.stderr):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in res.stdout
    assert hostile in json.loads(out.read_text())["final_answer"]  # the record keeps it
    for fmt in ("table", "tree", "mermaid", "json"):
        shown = conductor("trace", str(out), "--format", fmt)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
        assert "\x9b" not in shown.stdout
    # A provider's error message is escaped too.
    fake_server.script("w", [Fault(400, f"bad {hostile}")])
    res = conductor("ask", "q2", "--pool", str(pool), "--no-cache", env=env)
    assert res.returncode == 1
    assert "\x1b" not in res.stdout + res.stderr and "\\x1b" in res.stderr


@pytest.mark.parametrize("command", ["bench", "report"])
def test_every_option_of_bench_and_report_has_help(command: str) -> None:
    import typer

    from conductor.cli.app import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    cmd = group.commands[command]
    missing = [
        param.name
        for param in cmd.params
        if not (getattr(param, "help", None) or "").strip() and param.name != "help"
    ]
    assert missing == [], f"`conductor {command}` options without help text: {missing}"
