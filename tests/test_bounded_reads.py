"""Every reader of a path the user names refuses what is not a regular file, in one
line and before anything is read, and reads regular files with a bound.

- *Not a file*: each command that reads a path is given ``/dev/zero`` (endless), a FIFO
  nobody writes to (an open waits forever), a directory where a file is wanted, a
  socket and a symbolic link that loops; and each command that reads a run directory
  is given one whose files are such things.  Each must exit 2 with one line saying
  what the path is, within seconds (an alarm fails a test that waits).
- *Too much*: a file of one 1 GiB line (sparse: no disk used) given to the readers of
  records, run directories, config and data files; each child's peak memory is
  measured (``ru_maxrss``) and must stay near the reader's bound, far under the file.

Positive controls: the same measurement shows a plain whole-file read of that file
reaching its size, and a plain open of the FIFO still waiting when it is killed, so
neither the measure nor the FIFO can pass these tests by not working.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from kit.clock import scaled

from conductor.cli.app import main
from conductor.record import MAX_RECORD_BYTES
from conductor.userfiles import UnreadableFileError, bounded_lines, open_regular, read_regular

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30

# ------------------------------------------------------------------ hostile paths


@pytest.fixture
def hostile() -> Iterator[Path]:
    """A short folder (a socket's path is at most 107 bytes) holding each kind of
    thing that is not a regular file, under every suffix a reader looks for."""
    folder = Path(tempfile.mkdtemp(prefix="hostile-", dir="/tmp"))
    socks: list[socket.socket] = []
    for suffix in ("", ".jsonl", ".csv", ".json", ".parquet", ".yaml", ".txt"):
        (folder / f"zero{suffix}").symlink_to("/dev/zero")
        os.mkfifo(folder / f"fifo{suffix}")
        (folder / f"dir{suffix}").mkdir()
        (folder / f"loop{suffix}").symlink_to(f"loop{suffix}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(folder / f"sock{suffix}"))
        socks.append(sock)
    try:
        yield folder
    finally:
        for sock in socks:
            sock.close()
        shutil.rmtree(folder)


#: What each kind of path is called in the refusal.
KINDS = {
    "zero": "character device",
    "fifo": "FIFO",
    "dir": "directory",
    "loop": "symbolic link that loops",
    "sock": "socket",
}

#: Every command that reads a file the user names, ``{P}`` the path.
FILE_COMMANDS = {
    "trace": ["trace", "{P}"],
    "export otel": ["export", "otel", "{P}", "--otel", "http://127.0.0.1:9"],
    "export otel .jsonl": ["export", "otel", "{P}.jsonl", "--otel", "http://127.0.0.1:9"],
    "view": ["view", "{P}", "--out", "{OUT}/v.html"],
    "pools show": ["pools", "show", "{P}"],
    "pools check": ["pools", "check", "{P}"],
    "ask --pool": ["ask", "--pool", "{P}", "q"],
    "ask --file": ["ask", "--file", "{P}"],
    "ask --template": ["ask", "--template", "{P}", "q"],
    "ask --template .yaml": ["ask", "--template", "{P}.yaml", "q"],
    "bench FILE": ["bench", "{P}.yaml", "--estimate"],
    "bench --data .jsonl": ["bench", "math500", "--data", "{P}.jsonl", "--estimate"],
    "bench --data .csv": ["bench", "math500", "--data", "{P}.csv", "--estimate"],
    "bench --data .json": ["bench", "math500", "--data", "{P}.json", "--estimate"],
    "bench --data .parquet": ["bench", "math500", "--data", "{P}.parquet", "--estimate"],
    "train": ["train", "{P}.yaml"],
    "serve --pool": ["serve", "--pool", "{P}", "--port", "0"],
    "serve --keys": ["serve", "--keys", "{P}", "--port", "0"],
    "fit-router --features-model": [
        *("fit-router", "{OUT}", "--features", "gguf-mean-v1", "--features-model", "{P}"),
        *("--out", "{OUT}/router"),
    ],
}
#: Commands that read a directory; ``{P}`` is the directory, or a run directory whose
#: ``samples.jsonl`` and ``config.json`` are the hostile thing.
DIR_COMMANDS = {
    "trace": ["trace", "{P}"],
    "trace --sample": ["trace", "{P}", "--sample", "x"],
    "export otel": ["export", "otel", "{P}", "--otel", "http://127.0.0.1:9"],
    "view": ["view", "{P}", "--out", "{OUT}/v.html"],
    "report": ["report", "{P}"],
    "bench --resume": ["bench", "--resume", "{P}"],
    "bench merge": ["bench", "merge", "{P}", "--out", "{OUT}/merged"],
    "fit-router": ["fit-router", "{P}", "--out", "{OUT}/router"],
    "serve --router": ["serve", "--router", "{P}", "--port", "0"],
    # A writer: opening a FIFO to append waits for a reader as a read waits for a writer.
    "serve --records": ["serve", "--records", "{P}", "--port", "0"],
}


class Hung(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int) -> Iterator[None]:
    """Fail, rather than wait forever, when a read blocks (a FIFO's open is
    interrupted by the signal)."""

    def ring(_signum: int, _frame: FrameType | None) -> None:
        raise Hung(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with alarm(30):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0
    return code, capsys.readouterr().err.strip()


def _fill(argv: list[str], path: Path, out: Path) -> list[str]:
    return [a.replace("{P}", str(path)).replace("{OUT}", str(out)) for a in argv]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(FILE_COMMANDS))
def test_a_path_that_is_not_a_regular_file_is_refused_in_one_line(
    command: str,
    kind: str,
    hostile: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(_fill(FILE_COMMANDS[command], hostile / kind, tmp_path), capsys)
    assert code == 2, err
    if command == "fit-router --features-model" and kind == "dir":
        # The option itself refuses a directory (typer's usage error, before us).
        assert "is a directory" in err
        return
    assert err.startswith("error: ") and "\n" not in err, err
    assert str(hostile / kind) in err, err
    if not (command.startswith(("trace", "export", "view")) and kind == "dir"):
        # (A directory is what those read as a run: refused as one with no records.)
        assert KINDS[kind] in err, err


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(DIR_COMMANDS))
def test_a_run_directory_whose_files_are_not_regular_files_is_refused_in_one_line(
    command: str,
    kind: str,
    hostile: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    run = hostile / f"run-{kind}"
    run.mkdir()
    for name in ("samples.jsonl", "config.json", "router.json", "summary.json"):
        target = run / name
        if kind == "zero":
            target.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(target)
        elif kind == "dir":
            target.mkdir()
        elif kind == "loop":
            target.symlink_to(name)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(target))
            sock.close()
    code, err = run_cli(_fill(DIR_COMMANDS[command], run, tmp_path), capsys)
    assert code == 2, err
    # (A warning may come first: a records directory made private to its owner.)
    error = err.splitlines()[-1]
    assert error.startswith("error: ") and "Traceback" not in err, err
    assert str(run) in error, err


def test_the_fifo_and_device_classes_would_hang_or_run_away_without_the_check(
    hostile: Path,
) -> None:
    """Positive control: the same FIFO, opened as the readers used to open it, is still
    waiting when the alarm rings; /dev/zero read as they used to read it gives more
    than any bound (here stopped at 64 MiB by the test itself)."""
    with pytest.raises(Hung), alarm(2):
        open(hostile / "fifo", "rb").close()  # noqa: SIM115 - it never returns
    with open(hostile / "zero", "rb") as fh:
        assert len(fh.read(64 << 20)) == 64 << 20
    with pytest.raises(UnreadableFileError, match="FIFO"), alarm(5):
        open_regular(hostile / "fifo", "file")


# ------------------------------------------------------------------ bounded reads


def test_a_line_over_its_bound_is_skipped_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"short\n" + b"x" * 5000 + b"\nafter\nlast-no-newline")
    with open_regular(path) as fh:
        lines = list(bounded_lines(fh, 100))
    assert lines == [(1, b"short\n"), (2, None), (3, b"after\n"), (4, b"last-no-newline")]
    # A line of exactly the bound is kept, newline or not.
    path.write_bytes(b"y" * 100 + b"\n" + b"z" * 100)
    with open_regular(path) as fh:
        assert [n for n, raw in bounded_lines(fh, 100) if raw is not None] == [1, 2]


def test_a_whole_file_read_stops_one_byte_past_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a" * 101)
    with pytest.raises(UnreadableFileError, match="more than 100 bytes"):
        read_regular(path, "pool file", 100)
    path.write_bytes(b"a" * 100)
    assert read_regular(path, "pool file", 100) == b"a" * 100


@pytest.fixture(scope="module")
def one_line_gib() -> Iterator[Path]:
    """1 GiB in one line with no newline (sparse: it takes no disk), under every name
    and suffix a reader looks for."""
    folder = Path(tempfile.mkdtemp(prefix="gib-"))
    big = folder / "big"
    with open(big, "wb") as fh:
        fh.truncate(GIB)
    for name in ("big.json", "big.jsonl", "big.csv", "big.yaml"):
        (folder / name).symlink_to(big)
    for run in ("run", "served"):
        (folder / run).mkdir()
        (folder / run / "samples.jsonl").symlink_to(big)
    yield folder
    shutil.rmtree(folder)


def _conductor(*args: str) -> list[str]:
    return [sys.executable, "-m", "conductor", *args]


#: (command, the bound it reads up to): its peak must stay under bound + the interpreter.
MEASURED = {
    "trace FILE": (("trace", "{D}/big.json"), MAX_RECORD_BYTES),
    "trace DIR": (("trace", "{D}/run"), MAX_RECORD_BYTES),
    "export otel .jsonl": (
        ("export", "otel", "{D}/big.jsonl", "--otel", "http://127.0.0.1:9"),
        MAX_RECORD_BYTES,
    ),
    "view records DIR": (("view", "{D}/served", "--out", "{D}/v.html"), MAX_RECORD_BYTES),
    "pools show": (("pools", "show", "{D}/big.yaml"), 16 << 20),
    "bench --data .jsonl": (
        ("bench", "math500", "--data", "{D}/big.jsonl", "--estimate"),
        32 << 20,
    ),
    "bench --data .csv": (("bench", "math500", "--data", "{D}/big.csv", "--estimate"), 32 << 20),
    "bench --data .json": (("bench", "math500", "--data", "{D}/big.json", "--estimate"), 256 << 20),
}
#: What the interpreter and the libraries a command imports take, beyond the bound.
HEADROOM_MB = 300


@pytest.mark.process
@pytest.mark.parametrize("command", list(MEASURED))
def test_a_gigabyte_line_is_read_within_the_readers_bound(command: str, one_line_gib: Path) -> None:
    from kit.memory import peak

    argv, bound = MEASURED[command]
    got = peak(_conductor(*(a.replace("{D}", str(one_line_gib)) for a in argv)))
    assert got.rc is not None, f"{command}: did not finish"
    assert "Traceback" not in got.stderr, got.stderr[-2000:]
    assert got.peak_mb < (bound >> 20) + HEADROOM_MB, f"{command}: {got.peak_mb:.0f} MiB"
    assert got.peak_mb < 1024 / 2, f"{command}: {got.peak_mb:.0f} MiB for a 1 GiB file"


@pytest.mark.process
def test_the_measure_sees_a_whole_file_read_and_a_wait(one_line_gib: Path, tmp_path: Path) -> None:
    """Positive control of the measure: the old reads (a record file read whole, a JSONL
    file read line by line with no bound) of the same file peak above its size; and a
    FIFO opened plainly is still waiting when the timeout kills it."""
    from kit.memory import peak

    whole = peak(
        [
            sys.executable,
            "-c",
            "import sys; open(sys.argv[1], 'rb').read()",
            str(one_line_gib / "big.json"),
        ]
    )
    assert whole.rc == 0 and whole.peak_mb >= 1000, whole
    lines = peak(
        [
            sys.executable,
            "-c",
            "import sys\nfor line in open(sys.argv[1], 'rb'): pass",
            str(one_line_gib / "big.jsonl"),
        ]
    )
    assert lines.rc == 0 and lines.peak_mb >= 1000, lines
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    waited = peak(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'rb')", str(fifo)], timeout=3
    )
    assert waited.rc is None, waited


@pytest.mark.process
def test_a_fifo_given_to_trace_and_export_ends_at_once_in_a_real_process(tmp_path: Path) -> None:
    """The two commands issue 37 named, as processes: /dev/zero and a FIFO each end in
    one line, exit 2, without taking memory."""
    from kit.memory import peak

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        for argv in (
            ["trace", str(path)],
            ["export", "otel", str(path), "--otel", "http://127.0.0.1:9"],
        ):
            got = peak(_conductor(*argv), timeout=60)
            assert got.rc == 2, got
            assert got.stderr.strip().count("\n") == 0 and "not a regular file" in got.stderr, got
            assert got.peak_mb < 200, got


def test_a_looping_link_where_a_path_is_resolved_is_one_sentence(hostile: Path) -> None:
    """Path.resolve raises RuntimeError on a loop (Python 3.11): the places that resolve
    a path the user gave say what it is instead."""
    from conductor.cli._ci import CiOutputs
    from conductor.localmodel.models import get_host

    loop = hostile / "loop"
    with pytest.raises(UnreadableFileError, match="symbolic link that loops"):
        CiOutputs.of(None, loop, hostile / "loop.txt")
    with pytest.raises(UnreadableFileError, match="symbolic link that loops"):
        get_host(loop)


def test_a_huge_record_file_is_refused_naming_its_bound(tmp_path: Path) -> None:
    from conductor.errors import RecordError
    from conductor.record import read_record

    path = tmp_path / "run.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_RECORD_BYTES + 1)
    with pytest.raises(RecordError, match=r"run.json: holds more than 256 MiB"):
        read_record(path)
    path.write_bytes(b'{"schema_version": 1}\xff')
    with pytest.raises(RecordError, match=r"run.json:1: is not UTF-8 text \(byte 0xff"):
        read_record(path)
    path.write_text(json.dumps([1]))
    with pytest.raises(RecordError):
        read_record(path)


def _as_nobody() -> tuple[list[str], dict[str, str]] | None:
    """How to run ``python -m conductor`` as uid 65534 (root only): this interpreter
    when that user may run it, else the system's one of the same version with this
    checkout and its packages on the path; None when neither works."""
    import sysconfig

    import conductor

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    src = str(Path(conductor.__file__).parent.parent)
    paths = sysconfig.get_paths()
    candidates = [
        (sys.executable, {}),
        (
            f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",
            {"PYTHONPATH": f"{src}:{paths['purelib']}:{paths['platlib']}"},
        ),
    ]
    for python, extra in candidates:
        env = {**os.environ, **extra, "HOME": "/tmp"}
        seen = subprocess.run(
            [*drop, python, "-c", "import conductor; print(conductor.__file__)"],
            capture_output=True,
            text=True,
            env=env,
            timeout=scaled(60),
            cwd="/",
        )
        if seen.returncode == 0 and seen.stdout.strip() == conductor.__file__:
            return [*drop, python, "-m", "conductor"], env
    return None


@pytest.mark.process
def test_an_ordinary_user_is_refused_the_same_way(hostile: Path) -> None:
    """As uid 65534 (where root can run a child as that user): the same refusals, in a
    real process, each within its timeout."""
    runner = _as_nobody()
    if runner is None:
        pytest.skip("not root, or uid 65534 cannot run this checkout's conductor")
    prefix, env = runner
    hostile.chmod(0o755)  # mkdtemp made it 0700: the other user must reach its paths
    for kind, said in KINDS.items():
        path = hostile / kind
        for argv in (
            ["trace", str(path)],
            ["pools", "show", str(path)],
            ["ask", "--file", str(path)],
        ):
            done = subprocess.run(
                [*prefix, *argv],
                capture_output=True,
                text=True,
                env=env,
                timeout=scaled(60),
                cwd="/",
            )
            err = done.stderr.strip()
            assert done.returncode == 2, (argv, err)
            assert err.startswith("error: ") and "\n" not in err, (argv, err)
            if kind != "dir" or argv[0] != "trace":
                assert said in err, (argv, err)
