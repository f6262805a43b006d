"""A bench that fails before its first sample leaves nothing in the way of the fixed
command, and a dataset out of reach fails at once with the `--data` hint (real CLI)."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, worker, write_pool

from conductor.testing import FakeLLMServer

# Every test here starts a child process.
pytestmark = pytest.mark.process


def _pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    server.script(CONDUCTOR_MODEL, [lists([0], ["Solve the problem."], [[]])])
    server.script("w0", lambda r: "\\boxed{2}")
    server.script("w1", lambda r: "\\boxed{2}")
    workers = [worker(server, "w0"), worker(server, "w1")]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"), **env}, timeout=120)


def _records(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


GOOD_ROWS = [{"problem": f"What is {i} + 2 - {i}?", "answer": "2"} for i in range(2)]


def _write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -------------------------------------------------------------------- fail, then fix


@pytest.mark.parametrize("strategy", ["conductor", "singles"])
def test_a_failed_first_run_leaves_no_directory_and_the_fixed_command_runs(
    tmp_path: Path, fake_server: FakeLLMServer, strategy: str
) -> None:
    pool = _pool(tmp_path, fake_server)
    data = _write_rows(tmp_path / "m.jsonl", [{"problem": "What is 1 + 1?"}])  # no answer
    out = tmp_path / "runs" / "deep" / "math"
    command = ["bench", "math500", "--pool", str(pool), "--data", str(data),
               "--out", str(out), "--strategy", strategy]  # fmt: skip

    failed = _cli(tmp_path, *command)
    assert failed.returncode == 2, failed.stderr
    assert "no column 'answer'" in failed.stderr
    # Every directory the failed run made is gone (runs/ did not exist before it).
    assert not (tmp_path / "runs").exists()
    assert not fake_server.requests  # it failed before any call

    _write_rows(data, GOOD_ROWS)
    fixed = _cli(tmp_path, *command)
    assert fixed.returncode == 0, fixed.stderr
    run_dirs = [out] if strategy == "conductor" else [out / "single-w0", out / "single-w1"]
    for run_dir in run_dirs:
        records = _records(run_dir)
        assert len(records) == 2
        assert {r["grade"]["status"] for r in records} == {"correct"}  # type: ignore[index]


def test_a_folder_the_user_made_keeps_its_files_and_is_reused(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = _pool(tmp_path, fake_server)
    data = _write_rows(tmp_path / "m.jsonl", [{"problem": "What is 1 + 1?"}])
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    command = ["bench", "math500", "--pool", str(pool), "--data", str(data), "--out", str(out)]

    assert _cli(tmp_path, *command).returncode == 2
    # The folder and what was in it stay; what the run wrote is gone.
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]

    _write_rows(data, GOOD_ROWS)
    fixed = _cli(tmp_path, *command)
    assert fixed.returncode == 0, fixed.stderr
    assert len(_records(out)) == 2
    assert (out / "notes.txt").read_text() == "my notes\n"


def test_a_directory_left_without_records_is_taken_over(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # What a run killed before its first sample leaves (no cleanup could run): its
    # config, an empty samples file and the lock file.
    pool = _pool(tmp_path, fake_server)
    data = _write_rows(tmp_path / "m.jsonl", GOOD_ROWS)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"benchmark": {"name": "math500"}, "seed": 9}))
    (out / "samples.jsonl").write_text("")
    (out / ".lock").write_text("12345\n")
    res = _cli(tmp_path, "bench", "math500", "--pool", str(pool), "--data", str(data),
               "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert len(_records(out)) == 2
    assert json.loads((out / "config.json").read_text())["seed"] == 0  # the new run's


def test_finished_samples_are_never_removed(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    # The data fails after the first sample is dispatched (an answer that is no option
    # is found when the second sample is built, after every row was counted): the run
    # that created the directory fails, and its finished sample stays, resumable.
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["Answer."], [[]])])
    fake_server.script("w0", lambda r: "The answer is B.")
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    rows = [
        {"question": "What is 7 times 8?", "choices": ["54", "56", "58"], "answer": 1},
        {"question": "What is 2 + 2?", "choices": ["3", "4", "5"], "answer": 7},
    ]
    data = _write_rows(tmp_path / "c.jsonl", rows)
    out = tmp_path / "runs" / "mmlu"
    res = _cli(tmp_path, "bench", "mmlu", "--pool", str(pool), "--data", str(data),
               "--out", str(out), "--concurrency", "1")  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "answer 7 is not an option" in res.stderr
    assert [r["sample_id"] for r in _records(out)] == [f"mmlu/{_hash('What is 7 times 8?')}"]
    assert (out / "config.json").is_file()
    # Without --resume the directory is refused, as for any run holding records.
    again = _cli(tmp_path, "bench", "mmlu", "--pool", str(pool), "--data", str(data),
                 "--out", str(out))  # fmt: skip
    assert again.returncode == 2 and "--resume" in again.stderr
    assert len(_records(out)) == 1


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# -------------------------------------------------------------------- offline Hub


def _stderr_lines(res: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("benchmark", "columns"),
    [
        ("math500", "columns problem, answer (optional: unique_id, subject, level)"),
        ("livecodebench", "columns question_content, contest_date (optional: question_title"),
        ("gpqa-diamond", "columns Question, Correct Answer, Incorrect Answer 1"),
    ],
)
def test_offline_mode_fails_at_once_with_the_data_hint(
    tmp_path: Path, fake_server: FakeLLMServer, benchmark: str, columns: str
) -> None:
    pool = _pool(tmp_path, fake_server)
    out = tmp_path / "run"
    res = _cli(
        tmp_path, "bench", benchmark, "--pool", str(pool), "--out", str(out),
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    lines = _stderr_lines(res)
    assert len(lines) == 1, res.stderr
    assert "out of reach (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set)" in lines[0]
    assert "no copy is cached; pass --data FILE" in lines[0]
    assert ".jsonl, .json, .csv or .parquet" in lines[0]
    assert columns in lines[0]
    assert not out.exists()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _online_env(endpoint: str, tmp_path: Path) -> dict[str, str]:
    """Offline mode off, the Hub at ``endpoint``, no proxy, an empty Hub cache."""
    return {
        "HF_HUB_OFFLINE": "",
        "HF_DATASETS_OFFLINE": "",
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HTTPS_PROXY": "",
        "https_proxy": "",
        "ALL_PROXY": "",
        "all_proxy": "",
    }


def test_an_unreachable_hub_fails_at_once_without_retry_lines(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # No network as the Hub libraries see it: nothing listens at the endpoint.  Their
    # own retries would print a line per attempt for about 25 s.
    pool = _pool(tmp_path, fake_server)
    port = _closed_port()
    res = _cli(
        tmp_path, "bench", "math500", "--pool", str(pool), "--out", str(tmp_path / "run"),
        **_online_env(f"http://127.0.0.1:{port}", tmp_path),
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    lines = _stderr_lines(res)
    assert len(lines) == 1, res.stderr
    assert f"out of reach (127.0.0.1:{port} refused the connection)" in lines[0]
    assert "pass --data FILE" in lines[0] and "columns problem, answer" in lines[0]
    assert "Retry" not in res.stderr
    assert not (tmp_path / "run").exists()


class _Hub(BaseHTTPRequestHandler):
    """A Hub that knows no dataset: every request is logged and answered 404."""

    paths: list[str] = []

    def _not_found(self) -> None:
        self.paths.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _not_found

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []
    handler = type("Hub", (_Hub,), {"paths": paths})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()


def test_a_reachable_hub_is_asked_as_before(
    tmp_path: Path, fake_server: FakeLLMServer, hub: tuple[str, list[str]]
) -> None:
    # The reachability check must not turn a working network into "offline": the load
    # goes to the Hub, and its own answer (no such dataset) is reported with the hint.
    endpoint, paths = hub
    pool = _pool(tmp_path, fake_server)
    res = _cli(
        tmp_path, "bench", "math500", "--pool", str(pool), "--out", str(tmp_path / "run"),
        **_online_env(endpoint, tmp_path),
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert any(p.startswith("/datasets/HuggingFaceH4/MATH-500/") for p in paths), paths
    assert "out of reach" not in res.stderr
    assert "cannot load HuggingFaceH4/MATH-500" in res.stderr
    assert "pass --data FILE with a local copy" in res.stderr
