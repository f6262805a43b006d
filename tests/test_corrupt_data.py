"""Damaged data files are named as damaged, in one sentence, exit 2: never a traceback,
never "check the path and its permissions" (what pyarrow's thrift errors became when
the command line took them for an ``OSError``).

Parquet: a valid file (and one written with page checksums) cut at many offsets, with
a wrong magic at either end, a footer length that lies, the metadata zeroed or
randomised, and seeded flips of single bytes in the metadata and in the pages.  A
structural fault (a cut, a magic, the footer, the metadata) must be refused as a
corrupt Parquet file; a flipped byte may land where it changes nothing checkable (a
statistic, a value of a page written without a checksum), so that mutant may load,
but it is never anything but loaded or refused as corrupt.  JSONL, CSV and JSON files
damaged in their own ways are refused naming the file and line.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conductor.bench.spec import load_benchmark
from conductor.cli.app import main
from conductor.datasets.samples import count_samples
from conductor.errors import UsageError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SEED = 37
ROWS = [
    {
        "problem": f"What is {i} + {i}? " + "pad " * (i % 7),
        "answer": str(2 * i),
        "unique_id": f"q{i}",
    }
    for i in range(300)
]


def _parquet(path: Path, **options: object) -> bytes:
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=100, **options)
    return path.read_bytes()


def parquet_mutants(folder: Path) -> Iterator[tuple[str, bytes, bool]]:
    """(name, bytes, whether it must be refused) for each damaged Parquet file."""
    rng = random.Random(SEED)
    data = _parquet(folder / "plain.parquet")
    n = len(data)
    footer = int.from_bytes(data[-8:-4], "little")
    meta = n - 8 - footer
    cuts = {0, 1, 3, 4, 7, 8, 50, n // 4, n // 2, meta - 1, meta, meta + 1, meta + footer // 2}
    cuts |= {n - 9, n - 8, n - 5, n - 4, n - 1}
    for cut in sorted(cuts):
        yield f"cut at {cut} of {n}", data[:cut], True
    yield "magic only", b"PAR1", True
    yield "two magics", b"PAR1PAR1", True
    yield "wrong magic at the end", data[:-4] + b"PARX", True
    yield "wrong magic at the start", b"PARX" + data[4:], True  # pyarrow never reads it
    yield "footer length 2**31-1", data[:-8] + (2**31 - 1).to_bytes(4, "little") + b"PAR1", True
    yield "footer length 0", data[:-8] + bytes(4) + b"PAR1", True
    yield "footer length + 1", data[:-8] + (footer + 1).to_bytes(4, "little") + b"PAR1", True
    yield "metadata zeroed", data[:meta] + bytes(footer) + data[-8:], True
    noise = bytes(rng.randrange(256) for _ in range(footer))
    yield "metadata random", data[:meta] + noise + data[-8:], True
    for _ in range(10):
        i = rng.randrange(meta, n - 8)
        flipped = data[i] ^ (1 << rng.randrange(8))
        yield f"metadata byte {i} flipped", data[:i] + bytes([flipped]) + data[i + 1 :], False
    for _ in range(8):
        i = rng.randrange(4, meta)
        yield f"page byte {i} flipped", data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :], False
    checked = _parquet(folder / "checked.parquet", write_page_checksum=True)
    checked_meta = len(checked) - 8 - int.from_bytes(checked[-8:-4], "little")
    for _ in range(6):
        i = rng.randrange(4, checked_meta)
        yield (
            f"checksummed page byte {i} flipped",
            checked[:i] + bytes([checked[i] ^ 0xFF]) + checked[i + 1 :],
            False,
        )


def test_at_least_25_parquet_mutants_are_tried() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        cases = list(parquet_mutants(Path(folder)))
    assert len(cases) >= 25 and sum(must for _n, _d, must in cases) >= 25


CORRUPT = re.compile(
    r"^(?P<path>\S+\.parquet): is not a readable Parquet file \(corrupt or truncated"
)


def test_every_damaged_parquet_file_loads_or_is_named_as_corrupt(tmp_path: Path) -> None:
    spec = load_benchmark("math500")
    failures = []
    refused = loaded = 0
    for i, (name, data, must_refuse) in enumerate(parquet_mutants(tmp_path)):
        path = tmp_path / f"m{i}.parquet"
        path.write_bytes(data)
        try:
            count_samples(spec, data_file=path)
        except UsageError as exc:
            text = str(exc)
            match = CORRUPT.match(text)
            if match is None or match["path"] != str(path) or "\n" in text:
                failures.append(f"{name}: {text}")
            refused += 1
            continue
        except Exception as exc:  # noqa: BLE001 - what this test looks for
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        loaded += 1
        if must_refuse:
            failures.append(f"{name}: loaded")
    assert not failures, "\n".join(failures)
    assert refused >= 25, (refused, loaded)


def test_the_command_line_names_a_corrupt_parquet_file_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _parquet(tmp_path / "good.parquet")
    cases = {"cut": data[: len(data) // 2], "thrift": data[:-8] + bytes(4) + b"PAR1"}
    for name, damaged in cases.items():
        path = tmp_path / f"{name}.parquet"
        path.write_bytes(damaged)
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(["bench", "math500", "--data", str(path), "--estimate"])
        err = capsys.readouterr().err.strip()
        assert done.value.code == 2, err
        assert err.startswith(f"error: {path}: is not a readable Parquet file (corrupt"), err
        assert "\n" not in err and "permissions" not in err, err


def test_a_page_written_with_a_checksum_is_checked(tmp_path: Path) -> None:
    """A flipped byte in a checksummed page's values is found; without checksums the
    same flip reads as other data (the positive control: the check is what finds it)."""
    spec = load_benchmark("math500")
    plain = _parquet(tmp_path / "plain.parquet")
    checked = _parquet(tmp_path / "checked.parquet", write_page_checksum=True)

    def flipped(data: bytes) -> Path:
        # The first row's question, in the first page of the problem column.
        i = data.index(b"What is 0 + 0?") + 5
        out = tmp_path / f"flip-{len(data)}.parquet"
        out.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :])
        return out

    assert count_samples(spec, data_file=flipped(plain)) == 300  # read as other values
    with pytest.raises(UsageError, match="CRC checksum verification failed"):
        count_samples(spec, data_file=flipped(checked))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


GOOD_JSONL = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS[:5])
GOOD_CSV = b"problem,answer\n" + b"".join(
    f'"{r["problem"]}",{r["answer"]}\n'.encode() for r in ROWS[:5]
)
TEXT_CASES = {
    # name: (file name, bytes, what the sentence says)
    "jsonl torn line": ("d.jsonl", GOOD_JSONL[:-20], r"d.jsonl:5: not valid JSON"),
    "jsonl 0xff": (
        "d.jsonl",
        GOOD_JSONL.replace(b"What", b"Wh\xffat", 1),
        r"d.jsonl:1: is not UTF-8",
    ),
    "jsonl NUL line": ("d.jsonl", GOOD_JSONL + b"\x00\x00\n", r"d.jsonl:6: not valid JSON"),
    "jsonl not an object": (
        "d.jsonl",
        GOOD_JSONL + b"[1, 2]\n",
        r"d.jsonl:6: each line must be a JSON object",
    ),
    "jsonl nested deep": (
        "d.jsonl",
        b"[" * 100_000 + b"\n",
        r"d.jsonl:1: (JSON nested too deeply|not valid JSON)",
    ),
    "jsonl huge number": (
        "d.jsonl",
        b'{"problem": "x", "answer": ' + b"9" * 5000 + b"}\n",
        r"d.jsonl:1: not valid JSON",
    ),
    "csv unclosed quote": (
        "d.csv",
        GOOD_CSV + b'"open,1\n',
        r"d.csv:\d+: not valid CSV",
    ),
    "csv text after a quote": ("d.csv", GOOD_CSV + b'"x"y,1\n', r"d.csv:7: not valid CSV"),
    "csv 0xff": ("d.csv", GOOD_CSV + b"caf\xe9,1\n", r"d.csv:7: is not UTF-8"),
    "json cut": ("d.json", json.dumps(ROWS[:5]).encode()[:-10], r"d.json:1: not valid JSON"),
    "json not a list": ("d.json", b'{"a": 1}', r"d.json: a .json data file must hold a list"),
    "json 0xff": ("d.json", b'[\n{"problem": "\xff"}]', r"d.json:2: is not UTF-8"),
    "json nested deep": (
        "d.json",
        b"[" * 100_000,
        r"d.json(:1)?: (JSON nested too deeply|not valid JSON)",
    ),
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_damaged_text_data_files_are_one_sentence_naming_the_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, data, said = TEXT_CASES[case]
    path = _write(tmp_path / name, data)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["bench", "math500", "--data", str(path), "--estimate"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    assert re.search(said, err), err


def test_a_byte_order_mark_at_the_start_of_a_data_file_is_not_data(tmp_path: Path) -> None:
    spec = load_benchmark("math500")
    bom = b"\xef\xbb\xbf"
    for name, data in (
        ("d.jsonl", GOOD_JSONL),
        ("d.csv", GOOD_CSV),
        ("d.json", json.dumps(ROWS[:5]).encode()),
    ):
        assert count_samples(spec, data_file=_write(tmp_path / name, bom + data)) == 5
