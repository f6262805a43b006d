"""Seeded fuzz of every configuration reader: pool files, benchmark files, templates (chat
and text), training configs, keys files and router directories' ``router.json``.

Each reader is handed mutants of a valid file: a value swapped for a wrong type, null,
a huge or negative number, NaN, infinity, a 5,000-digit integer, a date that is no
date, a YAML tag (binary, set, a Python object), nesting hundreds deep; and, on the
bytes, a 0xff byte, a NUL, a byte-order mark, a duplicated key, a cut, UTF-16.  Every
mutant must either load or be refused as one sentence naming the file (and, where it
has one, the line) as a :class:`~conductor.errors.UsageError`; the refused ones are then
given to the command that reads them, in process, which must exit 2 with that one line
on stderr.  A traceback of any kind fails the test, naming the mutant.

The cases are drawn from a fixed seed, so a failure is reproducible; ``FUZZ_SEED`` in
the environment draws others.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import shutil
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from conductor.bench.spec import load_benchmark
from conductor.cli.app import main
from conductor.conductors.prompt import load_conductor_template
from conductor.errors import UsageError
from conductor.pool import load_pool
from conductor.serve import load_keys
from conductor.text import printable
from conductor.train.config import load_train_config

REPO = Path(__file__).resolve().parent.parent
SEED = int(os.environ.get("FUZZ_SEED", "37"))
#: Mutants per kind of file: enough to meet every kind of mutation several times.
PER_KIND = int(os.environ.get("FUZZ_PER_KIND", "45"))
#: Of the refused mutants, how many per kind also go through the command line.
CLI_PER_KIND = 12

# Values a mutant puts in place of one value of the file.  The placeholders stand for
# YAML that safe_dump cannot write (a number int() refuses to print, a plain scalar that
# resolves as a date, a tag), put in by text after dumping.
_RAW = {
    "__HUGE__": "9" * 5000,
    "__NEG_HUGE__": "-" + "9" * 5000,
    "__BIG_INT__": "99999999999999999999999999999",
    "__HEX__": "0x7fffffffffffffffffffffff",
    "__SEXAGESIMAL__": "190:20:30",
    "__BAD_DATE__": "2024-13-45",
    "__TIMESTAMP__": "2001-12-14t21:59:43.10-05:00",
    "__NAN__": ".nan",
    "__INF__": ".inf",
    "__NEG_INF__": "-.inf",
    "__FLOAT_OVERFLOW__": "1.0e+400",
    "__BINARY__": "!!binary aGVsbG8=",
    "__SET__": "!!set {a, b}",
    "__OMAP__": "!!omap [a: 1, b: 2]",
    "__PYTHON__": "!!python/object/apply:os.getpid []",
    "__DEEP__": "[" * 300 + "]" * 300,
    "__DEEP_MAP__": "{a: " * 120 + "1" + "}" * 120,
    "__ALIAS__": "*nowhere",
}
_VALUES: list[Any] = [
    None,
    True,
    False,
    "text",
    "",
    "x" * 20_000,
    0,
    -1,
    1.5,
    -0.0,
    2**70,
    [],
    {},
    ["x", 1],
    {"x": {"y": None}},
    "${UNSET_FUZZ_VARIABLE}",
    "$",
    "${",
    *(_RAW.keys()),
]


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``tree`` (a key of a mapping, an index of a list)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def _replaced(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(tree)
    node = out
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return out


def _dumped(tree: Any) -> str:
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=10_000)
    for name, raw in _RAW.items():
        text = text.replace(name, raw)
    return text


def _tree_mutant(tree: Any, rng: random.Random) -> tuple[str, bytes]:
    places = list(_paths(tree))
    path = rng.choice(places)
    value = rng.choice(_VALUES)
    shown = value if not isinstance(value, str) or len(value) < 40 else f"<{len(value)} chars>"
    return f"{'.'.join(map(str, path))} = {shown!r}", _dumped(_replaced(tree, path, value)).encode(
        "utf-8"
    )


def _byte_mutant(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(
        [
            "0xff",
            "nul",
            "bom",
            "bom-inside",
            "duplicate-line",
            "cut",
            "utf16",
            "flip",
            "crlf",
            "tab",
            "lone-surrogate",
            "dollar",
            "dollar",
        ]
    )
    at = rng.randrange(len(data) + 1)
    if kind == "0xff":
        return f"0xff at {at}", data[:at] + b"\xff" + data[at:]
    if kind == "nul":
        return f"NUL at {at}", data[:at] + b"\x00" + data[at:]
    if kind == "bom":
        return "BOM", b"\xef\xbb\xbf" + data
    if kind == "bom-inside":
        return f"BOM at {at}", data[:at] + b"\xef\xbb\xbf" + data[at:]
    if kind == "duplicate-line":
        lines = data.splitlines(keepends=True)
        keyed = [i for i, line in enumerate(lines) if b":" in line] or [0]
        i = rng.choice(keyed)
        return f"line {i + 1} twice", b"".join(lines[: i + 1] + lines[i:])
    if kind == "cut":
        return f"cut at {at}", data[:at]
    if kind == "utf16":
        return "UTF-16", data.decode("utf-8").encode("utf-16")
    if kind == "flip":
        i = rng.randrange(max(len(data), 1))
        return f"byte {i} flipped", data[:i] + bytes([data[i] ^ 0x80]) + data[i + 1 :]
    if kind == "crlf":
        return "CRLF", data.replace(b"\n", b"\r\n")
    if kind == "tab":
        return f"tab at {at}", data[:at] + b"\t" + data[at:]
    if kind == "dollar":
        # Where text is a template, a placeholder it does not know, or a bare "$".
        piece = rng.choice([b"${nonsense}", b"$ ", b"${", b"${question", b"$$", b"$1"])
        return f"{piece!r} at {at}", data[:at] + piece + data[at:]
    return f"surrogate at {at}", data[:at] + b"\xed\xa0\x80" + data[at:]


def mutants(data: bytes, tree: Any, n: int, rng: random.Random) -> list[tuple[str, bytes]]:
    """``n`` mutants of a file: two in three change one value, one in three its bytes."""
    out = []
    for _ in range(n):
        if tree is not None and rng.random() < 2 / 3:
            out.append(_tree_mutant(tree, rng))
        else:
            out.append(_byte_mutant(data, rng))
    return out


# ------------------------------------------------------------------ the kinds of file


@dataclass
class Kind:
    """One kind of configuration file: how a mutant is laid out, read and commanded."""

    name: str
    source: Path
    #: Writes the mutant's bytes where the reader looks; returns the path messages name.
    place: Callable[[Path, bytes], Path]
    load: Callable[[Path], object]
    argv: Callable[[Path], list[str]]
    parse: Callable[[bytes], Any] = lambda data: yaml.safe_load(data)
    #: What a refusal must name first: the file (a router's: its directory, whose
    #: head.npy router.json describes).
    named: Callable[[Path], Path] = lambda path: path


def _file(name: str) -> Callable[[Path, bytes], Path]:
    def place(folder: Path, data: bytes) -> Path:
        path = folder / name
        path.write_bytes(data)
        return path

    return place


def _train_place(folder: Path, data: bytes) -> Path:
    shutil.copytree(REPO / "configs" / "train" / "data", folder / "data", dirs_exist_ok=True)
    path = folder / "train.yaml"
    path.write_bytes(data)
    return path


def _bench_place(folder: Path, data: bytes) -> Path:
    shutil.copy(REPO / "benchmarks" / "smoke.jsonl", folder / "smoke.jsonl")
    path = folder / "bench.yaml"
    path.write_bytes(data)
    return path


def _router_place(folder: Path, data: bytes) -> Path:
    shutil.copytree(_router_dir(), folder / "router", dirs_exist_ok=True)
    path = folder / "router" / "router.json"
    path.write_bytes(data)
    return path


_KEYS = b"""\
keys:
  - name: team-a
    token_env: FUZZ_TEAM_TOKEN
    allowed_workers: [answerer, solver]
  - name: admin
    token: admin-token-456
"""
_SHIPPED_POOL = REPO / "pools" / "local.yaml"


def _router_dir() -> Path:
    """A router directory fitted once per session on synthetic scores."""
    global _ROUTER
    if _ROUTER is None:
        import tempfile

        import numpy as np

        from conductor.router import RoutingData, fit_router, save_router

        rng = np.random.default_rng(0)
        n = 120
        prompts = tuple(f"What is {i} + {i % 7}? (item {i})" for i in range(n))
        scores = np.asarray([[i % 2, (i + 1) % 2] for i in range(n)], dtype=float)
        data = RoutingData(
            arms=("single:answerer", "single:solver"),
            benchmarks=("synthetic",) * n,
            sample_ids=tuple(str(i) for i in range(n)),
            prompts=prompts,
            keys=tuple(hashlib.sha256(p.encode()).hexdigest() for p in prompts),
            scores=np.clip(scores + rng.normal(0, 0.01, scores.shape), 0, 1),
            costs=np.tile(np.asarray([0.001, 0.002]), (n, 1)),
            unpriced=(),
            sources=("runs/x",),
            pool_sha256=("f" * 64,),
            dropped=0,
        )
        out = Path(tempfile.mkdtemp(prefix="fuzz-router-")) / "router"
        save_router(fit_router(data), out)
        _ROUTER = out
    return _ROUTER


_ROUTER: Path | None = None


def _load_router(path: Path) -> object:
    from conductor.router import load_router

    return load_router(path.parent)


KINDS = [
    Kind(
        "pool",
        _SHIPPED_POOL,
        _file("pool.yaml"),
        load_pool,
        lambda p: ["pools", "show", str(p)],
    ),
    Kind(
        "benchmark",
        REPO / "benchmarks" / "smoke.yaml",
        _bench_place,
        load_benchmark,
        lambda p: ["bench", str(p), "--estimate"],
    ),
    Kind(
        "chat template",
        REPO / "src" / "conductor" / "prompts" / "chat.yaml",
        _file("template.yaml"),
        lambda p: load_conductor_template(str(p)),
        lambda p: ["ask", "--template", str(p), "q"],
    ),
    Kind(
        "text template",
        REPO / "src" / "conductor" / "prompts" / "default.txt",
        _file("template.txt"),
        lambda p: load_conductor_template(str(p)),
        lambda p: ["ask", "--template", str(p), "q"],
        parse=lambda data: None,  # text: only its bytes are changed
    ),
    Kind(
        "training config",
        REPO / "configs" / "train" / "tiny-cpu.yaml",
        _train_place,
        load_train_config,
        lambda p: ["train", str(p)],
    ),
    Kind(
        "keys file",
        Path("<keys>"),
        _file("keys.yaml"),
        lambda p: load_keys(p, load_pool(_SHIPPED_POOL), environ={"FUZZ_TEAM_TOKEN": "t" * 20}),
        lambda p: ["serve", "--keys", str(p), "--port", "0"],
    ),
    Kind(
        "router.json",
        Path("<router>"),
        _router_place,
        _load_router,
        lambda p: ["serve", "--router", str(p.parent), "--port", "0"],
        parse=lambda data: json.loads(data),
        named=lambda path: path.parent,
    ),
]


def _source_bytes(kind: Kind) -> bytes:
    if kind.name == "keys file":
        return _KEYS
    if kind.name == "router.json":
        return (_router_dir() / "router.json").read_bytes()
    return kind.source.read_bytes()


def _refusal_ok(message: str, path: Path) -> str | None:
    """What is wrong with a refusal's message, or None: one line, naming the file first
    (and its line where it has one)."""
    if "\n" in message.strip():
        return "more than one line"
    if "Traceback" in message:
        return "a traceback"
    where = re.match(rf"^{re.escape(str(path))}(/[\w.]+)?(:\d+)?: \S", message)
    if where is None:
        return "does not begin with FILE: or FILE:LINE:"
    return None


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_mutant_of_a_config_file_loads_or_is_refused_in_one_sentence(
    kind: Kind, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUZZ_TEAM_TOKEN", "t" * 20)
    monkeypatch.chdir(tmp_path)
    rng = random.Random(f"{SEED}:{kind.name}")
    data = _source_bytes(kind)
    cases = mutants(data, kind.parse(data), PER_KIND, rng)
    failures: list[str] = []
    refused: list[tuple[str, Path, str]] = []
    for i, (what, mutant) in enumerate(cases):
        folder = tmp_path / f"m{i}"
        folder.mkdir()
        path = kind.place(folder, mutant)
        try:
            kind.load(path)
        except UsageError as exc:
            problem = _refusal_ok(str(exc), kind.named(path))
            if problem:
                failures.append(f"{what}: {problem}: {exc}")
            refused.append((what, path, str(exc)))
        except Exception:  # noqa: BLE001 - any other exception is what this test finds
            last = traceback.format_exc().strip().splitlines()[-1]
            failures.append(f"{what}: {last}")
    # The command line says the same, once, and exits 2.
    for what, path, message in rng.sample(refused, min(CLI_PER_KIND, len(refused))):
        capsys.readouterr()
        try:
            main(kind.argv(path))
        except SystemExit as exc:
            code = exc.code
        except Exception:  # noqa: BLE001
            failures.append(f"CLI {what}: {traceback.format_exc().strip().splitlines()[-1]}")
            continue
        else:
            code = 0
        err = capsys.readouterr().err.strip()
        if code != 2 or err.count("\n") or not err.startswith("error: "):
            failures.append(f"CLI {what}: exit {code}, stderr {err[:300]!r}")
        elif err != f"error: {printable(message)}":
            failures.append(f"CLI {what}: not the reader's sentence: {err[:300]!r}")
    assert not failures, f"{len(failures)} of {len(cases)} mutants:\n" + "\n".join(failures)
    # Most mutants are refused: the fuzz is not testing the reader of a file it never
    # damages (a positive control of the harness itself).
    assert len(refused) >= PER_KIND // 3, f"only {len(refused)} of {len(cases)} refused"
