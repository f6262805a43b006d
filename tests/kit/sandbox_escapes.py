"""Attacks on the sandbox's outer engine (how a graded program is launched and confined),
each returning ``(defended, detail)`` and checking that nothing outside changed.

Every attack runs in-process (as whoever runs the tests) and, where that is root, again
as an ordinary user (uid 65534) through ``python tests/kit/sandbox_escapes.py [NAME...]``,
which prints ``{name: [defended, detail]}`` as JSON (see :func:`run_as_nobody`).  They
run with ``allow_subprocess=True`` and start shells and fresh interpreters: those stand
for native code that the in-process audit hook never sees, so only the engine stands
in the way.  Set ``SANDBOX_ESCAPES_ENGINE`` to try them on another engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pty
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conductor.sandbox import SandboxLimits, SandboxResult, run_sandboxed
from kit.clock import scaled

Outcome = tuple[bool, str]
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SECRET = "sk-conductor-escape-" + uuid.uuid4().hex
ENGINE = os.environ.get("SANDBOX_ESCAPES_ENGINE") or None


#: Proofs that a run's processes ran (:func:`proof`): numbers computed as they run.
_NONCE = 10**12 + uuid.uuid4().int % 10**12
#: How an attack's detail starts where its program printed no proof that it ran: such an
#: attack is not defended (an effect that did not happen proves nothing of a wall).
NOT_RUN = "did not run: "
# whether each run() since the attack started printed its proof (see proved)
_RUNS: list[bool] = []


def proof(step: str) -> tuple[str, str]:
    """(Python, sh) statements that print ``step``'s proof that it ran, which
    :func:`said` names: computed as they run, so neither the source nor a traceback
    quoting it can stand in for it."""
    k = len(step)
    python = f"print('ran', {step!r}, {_NONCE} + {k}, flush=True)"
    return python, f"echo ran {step} $(({_NONCE} + {k}))"


def said(step: str) -> str:
    """The line :func:`proof`'s statements print."""
    return f"ran {step} {_NONCE + len(step)}"


def run(code: str, *, proof_first: bool = False, **limits: Any) -> SandboxResult:
    """``code`` in the sandbox, run by a fresh interpreter the program starts: it has no
    audit hook, as native code would not (only the engine stands in the way);
    ``limits`` as :class:`SandboxLimits`'s fields.

    The interpreter prints its proof that it ran (:func:`proof`) after ``code``
    (``proof_first``: before it, for code that never ends); the proof is taken out of
    the result's stdout and noted for :func:`proved`."""
    limits = {"wall_time_s": 20, **limits, "allow_subprocess": True}
    body = textwrap.dedent(code)
    body = f"{proof('child')[0]}\n{body}" if proof_first else f"{body}\n{proof('child')[0]}\n"
    main = (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, '-c', {body!r}])\n"
        "sys.exit(r.returncode)\n"
    )
    res = run_sandboxed(main, engine=ENGINE, limits=SandboxLimits(**limits))
    line = said("child") + "\n"
    _RUNS.append(line in res.stdout)
    return dataclasses.replace(res, stdout=res.stdout.replace(line, "", 1))


def proved(attack: Callable[[], Outcome]) -> Callable[[], Outcome]:
    """``attack``, defended only where every program it ran printed its proof: a
    sandbox that runs nothing (:func:`runs_nothing`) fails it, whatever its effect."""

    @functools.wraps(attack)
    def checked() -> Outcome:
        _RUNS.clear()
        defended, detail = attack()
        if not _RUNS or not all(_RUNS):
            silent = len(_RUNS) - sum(_RUNS)
            return False, f"{NOT_RUN}{silent} of {len(_RUNS)} runs gave no proof; {detail}"
        return defended, detail

    return checked


@contextmanager
def host_dir() -> Iterator[Path]:
    """A directory outside the sandbox that everyone could read (so a failed read is
    the sandbox's doing, not the permissions')."""
    top = Path(tempfile.mkdtemp(prefix="conductor-escape-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------- sockets


def _unix_path_socket() -> Outcome:
    with host_dir() as top:
        path = top / "listener.sock"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        path.chmod(0o777)
        srv.listen(5)
        srv.settimeout(0.5)
        code = f"""
        import socket, subprocess, sys
        inner = ("import socket; s = socket.socket(socket.AF_UNIX); "
                 "s.connect({str(path)!r}); s.sendall(b'x')")
        r = subprocess.run([sys.executable, "-c", inner], capture_output=True, text=True)
        print(r.returncode, r.stderr.strip().splitlines()[-1:] )
        """
        res = run(code)
        try:
            conn, _ = srv.accept()
            conn.close()
            return False, "connected to the host's unix socket " + res.stdout[:100]
        except TimeoutError:
            return True, "no connection: " + res.stdout.strip()[:150]
        finally:
            srv.close()


def _unix_abstract_socket() -> Outcome:
    name = "\0conductor-escape-" + uuid.uuid4().hex
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(name)
    srv.listen(5)
    srv.settimeout(0.5)
    inner = (
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({name!r}); s.sendall(b'x')"
    )
    code = f"""
    import subprocess, sys
    r = subprocess.run([sys.executable, "-c", {inner!r}], capture_output=True, text=True)
    print(r.returncode, r.stderr.strip().splitlines()[-1:])
    """
    res = run(code)
    try:
        conn, _ = srv.accept()
        conn.close()
        return False, "connected to an abstract socket of the host"
    except TimeoutError:
        return True, "no connection: " + res.stdout.strip()[:150]
    finally:
        srv.close()


def _tcp_loopback() -> Outcome:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = f"""
    import subprocess
    r = subprocess.run(["sh", "-c", "exec 3<>/dev/tcp/127.0.0.1/{port}; echo sent >&3"],
                       capture_output=True, text=True)
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=1)
        print("connected")
    except OSError as exc:
        print("refused", exc)
    """
    res = run(code)
    try:
        conn, _ = srv.accept()
        conn.close()
        return False, "connected to 127.0.0.1"
    except TimeoutError:
        return True, "no connection: " + res.stdout.strip()[:150]
    finally:
        srv.close()


# ------------------------------------------------------------------------ terminal

_TTY_ATTACK = r"""
import fcntl, glob, os, termios
FAKE = "\naccuracy 100.00%\n"
reached = []
paths = ["/dev/tty", "/dev/console", "/dev/ptmx"] + glob.glob("/dev/pts/*")
paths += glob.glob("/proc/self/fd/*") + glob.glob("/proc/1/fd/*") + glob.glob("/proc/*/fd/*")
try:
    os.setsid()
except OSError:
    pass
for path in paths:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError:
        continue
    try:
        if os.isatty(fd):
            reached.append(path)
            os.write(fd, FAKE.encode())
            for ch in "echo typed\n":
                try:
                    fcntl.ioctl(fd, termios.TIOCSTI, ch.encode())
                except OSError:
                    pass
    finally:
        os.close(fd)
for fd in range(0, 64):
    try:
        if os.isatty(fd):
            reached.append(f"fd {fd}")
            os.write(fd, FAKE.encode())
    except OSError:
        pass
print("reached", reached)
"""

_UNDER_PTY = r"""
import contextlib, json, os, sys
sys.path[:0] = sys.argv[1:]  # src, tests (for kit/, which this file imports), tests/kit
import sandbox_escapes
broken = os.environ.get(sandbox_escapes.RUNS_NOTHING_ENV)
with sandbox_escapes.runs_nothing() if broken else contextlib.nullcontext():
    res = sandbox_escapes.run(sandbox_escapes._TTY_ATTACK)
ran = sandbox_escapes._RUNS == [True]
sys.stderr.write(json.dumps([res.stdout, res.stderr[-300:], ran]) + "\n")
"""


def _terminal() -> Outcome:
    """The run starts from a process whose controlling terminal is a pty (a user's
    shell); nothing the code does may write to it or type into it."""
    pid, master = pty.fork()
    if pid == 0:  # child: session leader with the pty as its controlling terminal
        try:
            paths = [str(REPO / p) for p in ("src", "tests", "tests/kit")]
            os.execv(sys.executable, [sys.executable, "-c", _UNDER_PTY, *paths])
        finally:
            os._exit(127)
    seen = b""
    deadline = time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    os.waitpid(pid, 0)
    text = seen.decode("utf-8", "replace")
    if "accuracy 100.00%" in text.replace(json.dumps("accuracy 100.00%")[1:-1], ""):
        return False, "the fake line reached the terminal"
    lines = [line for line in text.splitlines() if line.startswith("[")]
    try:
        stdout, _, ran = json.loads(lines[-1])
    except (IndexError, ValueError):
        return False, f"no result from the run: {text[-300:]!r}"
    _RUNS.append(ran)  # the run was the pty child's: its proof, as it saw it
    return "reached []" in stdout, stdout.strip()[:200]


# ---------------------------------------------------------------------- file system


def _read_host_files() -> Outcome:
    """Earlier runs' records, a --data file and a file in /tmp, readable by anyone."""
    with host_dir() as top:
        run_dir = top / "runs" / "lcb"
        run_dir.mkdir(parents=True)
        (run_dir / "samples.jsonl").write_text(json.dumps({"secret": SECRET}) + "\n")
        (top / "data.jsonl").write_text(SECRET + "\n")
        in_tmp = Path(tempfile.gettempdir()) / f"conductor-escape-{uuid.uuid4().hex}"
        in_tmp.write_text(SECRET)
        in_tmp.chmod(0o644)
        for path in [run_dir, run_dir.parent, top]:
            path.chmod(0o755)
        targets = [str(run_dir / "samples.jsonl"), str(top / "data.jsonl")]
        data_file = REPO / "tests" / "fixtures" / "bench" / "livecodebench.jsonl"
        code = f"""
        import subprocess
        cmd = "cat {" ".join(targets)} /proc/1/root{targets[0]} 2>&1; "
        # the secret in two halves: this program's own text (in /tmp/work) must not match
        cmd += "a={SECRET[:12]}; b={SECRET[12:]}; "
        # every small file anywhere but /proc, /dev (/dev/zero never ends), /usr and
        # Python's libraries (read-only copies of the host's, too big to search in time)
        cmd += "find / /proc/1/root/tmp \\( -path /proc -o -path /dev -o -path /usr "
        cmd += "-o -name site-packages -o -path '*/lib/python3*' \\) -prune "
        cmd += '-o -type f -size -1000k -exec grep -hs "$a$b" {{}} + 2>/dev/null | head -3; '
        cmd += "cat {data_file} 2>&1 | head -c 200"
        print(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout)
        """
        try:
            res = run(code, wall_time_s=60)
        finally:
            in_tmp.unlink(missing_ok=True)
        leaked = SECRET in res.stdout or "question_title" in res.stdout
        return not leaked, "read: " + res.stdout[:200] if leaked else "nothing of the host read"


def _write_outside() -> Outcome:
    with host_dir() as top:
        top.chmod(0o777)
        target = top / "written"
        code = f"""
        import subprocess
        subprocess.run(["sh", "-c", "echo x > {target}; echo x > /proc/1/root{target}; "
                        "ln -s {target} link; echo x > link; touch /x /usr/x /dev/x"])
        """
        res = run(code)
        made = target.exists()
        return not made, "written" if made else f"not written (rc {res.returncode})"


def _fill_work_dir() -> Outcome:
    """Filling the work dir and /dev/shm stops at the sandbox's 32 MiB tmpfs; the
    host's disk is untouched."""
    host = os.statvfs(tempfile.gettempdir())
    before = host.f_bavail * host.f_frsize
    shm = f"/dev/shm/conductor-fill-{uuid.uuid4().hex}"
    code = f"""
    import subprocess
    r = subprocess.run(["sh", "-c", "head -c 150000000 /dev/zero > fill; "
                        "head -c 150000000 /dev/zero > {shm}; "
                        "echo WROTE $(cat fill {shm} | wc -c); rm -f {shm}"],
                       capture_output=True, text=True)
    print(r.stdout, r.stderr)
    """
    res = run(code, disk_mb=32, max_file_mb=4096, wall_time_s=60)
    Path(shm).unlink(missing_ok=True)
    after = os.statvfs(tempfile.gettempdir())
    grown = before - after.f_bavail * after.f_frsize
    full = "No space left" in res.stdout
    wrote = next((int(w.split()[1]) for w in res.stdout.splitlines() if w.startswith("WROTE")), -1)
    # other tests write meanwhile: a sandbox that wrote 300 MB to the host shows plainly
    ok = full and 0 <= wrote <= 64 << 20 and grown < 200 << 20
    moved = f"host free space moved by {grown >> 20} MiB"
    return ok, f"tmpfs full: {full}, {wrote} bytes written, {moved}"


def _devices_and_sys() -> Outcome:
    code = """
    import os
    print(sorted(os.listdir("/dev")), os.path.exists("/sys/kernel"), os.path.exists("/dev/pts"))
    """
    res = run(code)
    want = "['fd', 'null', 'shm', 'stderr', 'stdin', 'stdout', 'urandom', 'zero'] False False"
    return res.stdout.strip() == want, res.stdout.strip()[:200]


def _proc_1_root() -> Outcome:
    code = """
    import os
    try:
        print(sorted(os.listdir("/proc/1/root")))
    except OSError as exc:
        print("refused", exc)
    print(sorted(os.listdir("/")), len([p for p in os.listdir("/proc") if p.isdigit()]))
    """
    res = run(code)
    listing = res.stdout
    host_only = [name for name in ("home", "var", "srv", "mnt", "boot") if f"'{name}'" in listing]
    return not host_only, listing.strip()[:200]


# --------------------------------------------------------------------------- memory

_MEMORY = r"""
import ctypes, mmap, os
held = 0
MB = 1 << 20
keep = []
try:
    for _ in range(10):
        fd = os.memfd_create("x")
        os.ftruncate(fd, 0)
        for _ in range(30):
            os.write(fd, b"x" * MB)
            held += MB
        keep.append(fd)
except OSError as exc:
    print("memfd:", exc.errno)
libc = ctypes.CDLL(None, use_errno=True)
print("shmget:", libc.shmget(0, 600 * MB, 0o1000 | 0o600), ctypes.get_errno())
try:
    with open("/dev/shm/fill", "wb") as fh:
        for _ in range(600):
            fh.write(b"x" * MB)
            held += MB
except OSError as exc:
    print("shm:", exc.errno)
print("held MB", held // MB)
"""


def _memory_files() -> Outcome:
    """Memory-backed files past the memory limit (300 MB of memfd asked under 200 MB)."""
    res = run(_MEMORY, memory_mb=200, disk_mb=64, max_file_mb=4096)
    held = next(
        (int(line.split()[-1]) for line in res.stdout.splitlines() if line.startswith("held")), -1
    )
    return 0 <= held <= 64, " ".join(res.stdout.split())[:200]


# -------------------------------------------------------------------------- processes


def _daemon_survives() -> Outcome:
    marker = f"{61 + uuid.uuid4().int % 500}.{uuid.uuid4().int % 1000:03d}"
    code = f"""
    import os, subprocess
    subprocess.Popen(["sh", "-c", "setsid sh -c 'trap \\"\\" HUP TERM; sleep {marker}' &"],
                     start_new_session=True)
    os.system("sleep 0.3")
    """
    run(code)

    def survivors() -> list[str]:
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        found.append(pid)
                except OSError:
                    continue
        return found

    deadline = time.monotonic() + 10
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = survivors()
    for pid in left:  # (its positive control leaves one behind)
        with contextlib.suppress(OSError):
            os.kill(int(pid), 9)
    return not left, f"survivors: {left}" if left else "every process of the run is gone"


def _fork_bomb() -> Outcome:
    """Processes without end: capped by RLIMIT_NPROC (a fresh uid as root), then all
    killed at the wall limit; the caller goes on.  (No positive control: a fork bomb
    is not run outside a sandbox; the program's own report shows it ran.)"""
    code = """
    import os, time
    for _ in range(100000):
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        except OSError:
            break
    print("capped at", len(os.listdir("/proc")), "entries in /proc", flush=True)
    time.sleep(30)
    """
    started = time.monotonic()
    res = run(code, proof_first=True, wall_time_s=5)
    took = time.monotonic() - started
    ok = res.timed_out and took < 30 and "capped at" in res.stdout
    return ok, f"timed out: {res.timed_out} after {took:.1f} s; {res.stdout.strip()[:60]}"


def _ptrace_driver() -> Outcome:
    """PTRACE_ATTACH to the process that runs the program (its parent here)."""
    code = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
    """
    res = run(code)
    first = res.stdout.split()[:1]
    return first == ["-1"], res.stdout.strip()[:100]


def _inherited_fds() -> Outcome:
    """A file the caller holds open (inheritable) must not reach the sandbox."""
    with host_dir() as top:
        path = top / "held-open.txt"
        path.write_text(SECRET)
        fd = os.open(path, os.O_RDONLY)
        os.set_inheritable(fd, True)
        try:
            code = """
            import os
            for n in os.listdir("/proc/self/fd"):
                try:
                    print(n, os.readlink(f"/proc/self/fd/{n}"))
                except OSError:
                    pass
            for n in range(3, 256):
                try:
                    os.lseek(n, 0, 0)
                    print(os.read(n, 200))
                except OSError:
                    pass
            """
            res = run(code)
        finally:
            os.close(fd)
        leaked = SECRET in res.stdout or str(path) in res.stdout
        # (no positive control: every engine starts the run with close_fds; the
        # listing of its own fds shows it ran)
        return not leaked and "0 " in res.stdout, res.stdout.strip()[:250]


def _user_namespace() -> Outcome:
    code = """
    import subprocess
    r = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /tmp && echo MOUNTED"],
                       capture_output=True, text=True)
    print(r.stdout.strip(), r.stderr.strip()[-80:])
    """
    res = run(code)
    return "MOUNTED" not in res.stdout, res.stdout.strip()[:150]


ATTACKS: dict[str, Callable[[], Outcome]] = {
    "connect to a host listener's unix socket file": proved(_unix_path_socket),
    "connect to a host abstract unix socket": proved(_unix_abstract_socket),
    "connect to 127.0.0.1 (network)": proved(_tcp_loopback),
    "write to / type into the user's terminal (tty, pts, fd links, setsid)": proved(_terminal),
    "read earlier runs' samples.jsonl, the --data file, /tmp": proved(_read_host_files),
    "write outside the sandbox (/proc/1/root, symlink, /usr, /dev)": proved(_write_outside),
    "fill the work dir and /dev/shm": proved(_fill_work_dir),
    "/dev holds only null, zero, urandom; no /sys, no /dev/pts": proved(_devices_and_sys),
    "/proc/1/root shows the sandbox, not the host": proved(_proc_1_root),
    "memfd / shm / SysV shm beyond the memory limit": proved(_memory_files),
    "a daemon (setsid, double fork) outlives the run": proved(_daemon_survives),
    "a fork bomb": proved(_fork_bomb),
    "ptrace the test driver": proved(_ptrace_driver),
    "an fd the caller holds open leaks in": proved(_inherited_fds),
    "a new user namespace to mount an unlimited tmpfs": proved(_user_namespace),
}


# ------------------------------------------------------------- positive controls


@contextmanager
def unsandboxed() -> Iterator[None]:
    """Runs started here (and by child processes started here) get no OS isolation
    (the ``none`` engine: resource limits and the audit hook only)."""
    old = os.environ.get("CONDUCTOR_SANDBOX_ISOLATION")
    os.environ["CONDUCTOR_SANDBOX_ISOLATION"] = "off"
    try:
        yield
    finally:
        if old is None:
            del os.environ["CONDUCTOR_SANDBOX_ISOLATION"]
        else:
            os.environ["CONDUCTOR_SANDBOX_ISOLATION"] = old


def positive_control(attack: Callable[[], Outcome], how: str | tuple[str, ...]) -> Outcome:
    """(whether the attack's effect happened, detail) with its wall taken down: ``how``
    is ``"unsandboxed"`` (no OS isolation at all) or the walls to remove
    (:func:`conductor.sandbox.walls_removed`).  An attack whose program did not run
    (:data:`NOT_RUN`) had no effect, whatever it says."""
    from conductor.sandbox import walls_removed

    if how == "unsandboxed":
        with unsandboxed():
            defended, detail = attack()
    else:
        with walls_removed(*how):
            defended, detail = attack()
    return not defended and not detail.startswith(NOT_RUN), detail


#: Set while :func:`runs_nothing` holds, for the runs a test starts in another process.
RUNS_NOTHING_ENV = "CONDUCTOR_TESTS_SANDBOX_RUNS_NOTHING"


@contextmanager
def runs_nothing() -> Iterator[None]:
    """A sandbox broken to run nothing: in every engine its driver starts and reports
    as always, but the ``program`` job (:func:`conductor.sandbox.run_sandboxed`'s) returns
    at once.  The positive control of the attacks' proofs that they ran: under it, no
    attack that runs a program may be reported defended."""
    from conductor.sandbox import _run

    real = _run.driver_source
    entry = b'\nif __name__ == "__main__":'

    def broken(job_driver: Any = None) -> bytes:
        head, sep, tail = real(job_driver).rpartition(entry)
        assert sep, "the driver's entry point moved: the broken sandbox must follow it"
        return head + b"\ndef job_program() -> None:\n    return None\n" + sep + tail

    _run.driver_source = broken  # type: ignore[assignment]
    os.environ[RUNS_NOTHING_ENV] = "1"
    try:
        yield
    finally:
        _run.driver_source = real  # type: ignore[assignment]
        del os.environ[RUNS_NOTHING_ENV]


#: How each attack's positive control takes its wall down; attacks left out say in
#: their doc why they have none.
CONTROLS: dict[str, str | tuple[str, ...]] = {
    "connect to a host listener's unix socket file": "unsandboxed",
    "connect to a host abstract unix socket": "unsandboxed",
    "connect to 127.0.0.1 (network)": "unsandboxed",
    "write to / type into the user's terminal (tty, pts, fd links, setsid)": "unsandboxed",
    "read earlier runs' samples.jsonl, the --data file, /tmp": "unsandboxed",
    "write outside the sandbox (/proc/1/root, symlink, /usr, /dev)": "unsandboxed",
    "fill the work dir and /dev/shm": "unsandboxed",
    "/dev holds only null, zero, urandom; no /sys, no /dev/pts": "unsandboxed",
    "/proc/1/root shows the sandbox, not the host": "unsandboxed",
    "memfd / shm / SysV shm beyond the memory limit": ("bwrap-seccomp", "child-seccomp"),
    "a daemon (setsid, double fork) outlives the run": "unsandboxed",
    "ptrace the test driver": ("bwrap-seccomp", "child-seccomp", "dumpable"),
    "a new user namespace to mount an unlimited tmpfs": ("bwrap-seccomp", "child-seccomp"),
}


def run_control(name: str) -> Outcome:
    return positive_control(ATTACKS[name], CONTROLS[name])


# ----------------------------------------------------------------- as an ordinary user


def _drop() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


# the interpreter must really be this user's to run (not found through a link into a
# directory it cannot read), and must import conductor (the graders too) from here
_PROBE = (
    "import conductor.sandbox, conductor.grading.code, os, sys\n"
    "assert os.access(os.path.realpath(sys.executable), os.R_OK | os.X_OK)\n"
)


def nobody_venv() -> str | None:
    """A venv uid 65534 can run, made once (outside any private home directory): the
    system's interpreter of this Python version, seeing this interpreter's
    site-packages (numpy, pandas, conductor's dependencies) through a ``.pth`` file.
    None where there is no such system interpreter or those directories are private."""
    import hashlib
    import site

    base = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    if not os.access(base, os.X_OK) or not sites:
        return None
    key = hashlib.sha256(json.dumps([base, sites]).encode()).hexdigest()[:12]
    top = Path(tempfile.gettempdir()) / f"conductor-nobody-venv-{key}"
    python = top / "bin" / "python"
    if python.exists():
        return str(python)
    work = Path(tempfile.mkdtemp(prefix="conductor-nobody-venv-"))
    try:
        made = subprocess.run(
            [base, "-m", "venv", "--without-pip", str(work / "v")],
            capture_output=True,
            timeout=scaled(120),
        )
        if made.returncode != 0:
            return None
        (own,) = (work / "v" / "lib").glob("python*/site-packages")
        lines = "".join(f"site.addsitedir({p!r}); " for p in sites)
        (own / "_conductor_tests.pth").write_text(f"import site; {lines}\n")
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        with contextlib.suppress(OSError):  # another test process made it first
            (work / "v").rename(top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return str(python) if python.exists() else None


def nobody_python(env: dict[str, str]) -> str | None:
    """An interpreter uid 65534 can run that imports conductor from this checkout: this
    one where it can, else :func:`nobody_venv` (this interpreter living under a private
    home, as in a pyenv or a venv under /root), else the system's."""
    candidates = [sys.executable, getattr(sys, "_base_executable", "")]
    candidates += [nobody_venv() or "", "/usr/bin/python3"]
    for python in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run(
            [*_drop(), python, "-c", _PROBE], env=env, capture_output=True, timeout=scaled(60)
        )
        if probe.returncode == 0:
            return python
    return None


def run_as_nobody(script: Path, names: list[str] | None = None) -> dict[str, Any] | str:
    """``python SCRIPT [NAME...]`` as uid 65534 (it prints a JSON object); a string
    saying why not where that cannot be done (not root, no setpriv, no interpreter)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return "dropping privileges needs root and setpriv"
    top = Path(tempfile.mkdtemp(prefix="conductor-nobody-"))
    try:
        for sub in ("tmp", "home"):
            (top / sub).mkdir()
        for path in (top, top / "tmp", top / "home"):
            path.chmod(0o777)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(top / "home"),
            "TMPDIR": str(top / "tmp"),
            "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}",
            "LANG": "C.UTF-8",
        }
        for key in ("SANDBOX_ESCAPES_ENGINE", "CONDUCTOR_SANDBOX_ISOLATION"):
            if key in os.environ:
                env[key] = os.environ[key]
        python = nobody_python(env)
        if python is None:
            return "no Python interpreter that uid 65534 can run imports conductor"
        done = subprocess.run(
            [*_drop(), python, str(script), *(names or [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise AssertionError(done.stderr[-3000:])
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--controls"]:
        print(json.dumps({name: run_control(name) for name in CONTROLS}))
    elif sys.argv[1:] == ["--runs-nothing"]:
        with runs_nothing():
            print(json.dumps({name: attack() for name, attack in ATTACKS.items()}))
    else:
        chosen = sys.argv[1:] or list(ATTACKS)
        print(json.dumps({name: ATTACKS[name]() for name in chosen}))
