"""The bad inputs issue 37 saw give tracebacks, and their neighbours: each is one
sentence naming FILE:LINE, exit 2, through the command line.

- a benchmark file with ``grader: null`` (an AssertionError in bench/spec.py);
- a Conductor template file holding a 0xff byte (a UnicodeDecodeError), in either form;
- a 5,000-digit ``max_concurrency`` (``int()`` refuses numbers that long, PyYAML let
  its ValueError through), and the same number where any count or number is read;
- ``epochs: 99999999999999999999999999999``, accepted and run without end: every count
  now has a range (:mod:`conductor.bounds`), stated in the message;
- NaN and infinity where a number is read, a date that is no date, a NUL byte.

The positive control of each is the file one edit away that loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conductor.bounds import EPOCHS, SHARDS, Bound, parse_count
from conductor.cli.app import main
from conductor.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
HUGE = "9" * 5000


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    return code, capsys.readouterr().err.strip()


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], where: str, said: str) -> str:
    code, err = run(argv, capsys)
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith(f"error: {where}"), err
    assert said in err, err
    return err


def benchmark(tmp_path: Path, **changes: str) -> Path:
    """The shipped smoke benchmark beside its data, with top-level keys replaced."""
    (tmp_path / "smoke.jsonl").write_bytes((REPO / "benchmarks" / "smoke.jsonl").read_bytes())
    lines = (REPO / "benchmarks" / "smoke.yaml").read_text().splitlines()
    out = []
    for line in lines:
        key = line.split(":", 1)[0]
        out.append(f"{key}: {changes.pop(key)}" if key in changes else line)
    out += [f"{k}: {v}" for k, v in changes.items()]
    path = tmp_path / "bench.yaml"
    path.write_text("\n".join(out) + "\n")
    return path


def _line_of(path: Path, key: str) -> int:
    return next(
        i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(key)
    )


def test_grader_null_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = benchmark(tmp_path, grader="null")
    refused(
        ["bench", str(path), "--estimate"],
        capsys,
        f"{path}:{_line_of(path, 'grader')}: ",
        "grader must be one of",
    )
    # Positive control: the same file with a grader loads.
    assert run(["bench", str(benchmark(tmp_path, grader="short")), "--estimate"], capsys)[0] == 0


@pytest.mark.parametrize("value", ["99999999999999999999999999999", HUGE, "0", "-1", "1001", "2.5"])
def test_epochs_have_a_range(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = benchmark(tmp_path, epochs=value)
    err = refused(
        ["bench", str(path), "--estimate"],
        capsys,
        f"{path}:{_line_of(path, 'epochs')}: ",
        f"epochs must be {EPOCHS.describe()}",
    )
    assert len(err) < 400  # a 5,000-digit number is named, not printed
    assert run(["bench", str(benchmark(tmp_path, epochs="1000")), "--estimate"], capsys)[0] == 0


def test_the_command_lines_counts_have_a_range(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["bench", "smoke", "--epochs", "99999999999999999999999999999", "--estimate"],
        ["bench", "smoke", "--limit", HUGE, "--estimate"],
        ["bench", "smoke", "--max-steps", "1001", "--estimate"],
        ["bench", "smoke", "--concurrency", "100001", "--estimate"],
        ["ask", "--rounds", "101", "q"],
        ["trace", ".", "--limit", "0"],
    ):
        code, err = run(argv, capsys)
        assert code == 2, (argv, err)
        assert "Traceback" not in err, (argv, err)
        said = ("range", "as an integer", "less than or equal", "greater than or equal")
        assert any(words in err for words in said), (argv, err)


@pytest.mark.parametrize("shard", [f"0/{HUGE}", f"{HUGE}/3", "3/3", "0/0", "-1/2", "1/2/3", "x"])
def test_a_shard_is_read_within_its_range(shard: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["bench", "smoke", "--shard", shard, "--estimate"], capsys)
    assert code == 2 and err.count("\n") == 0, err
    assert "--shard" in err and "must be I/N" in err and len(err) < 300, err
    assert run(["bench", "smoke", "--shard", "2/3", "--estimate"], capsys)[0] == 0


def test_parse_count_never_reads_a_number_longer_than_its_range() -> None:
    assert parse_count(" 0042 ", SHARDS, "N") == 42
    assert parse_count("-1", Bound(-1, 5), "n") == -1
    for text in (HUGE, "1" + "0" * 7, "-1", "1e3", "٣", "", " "):
        with pytest.raises(UsageError, match="must be an integer from 1 to 1,000,000"):
            parse_count(text, SHARDS, "N")


POOL = (REPO / "pools" / "local.yaml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("max_concurrency: 1", f"max_concurrency: {HUGE}", "got a number of 5,000 digits"),
        ("max_concurrency: 1", "max_concurrency: 100001", "from 1 to 100,000"),
        ("max_tokens: 160", f"max_tokens: -{HUGE}", "max_tokens must be an integer from 1 to"),
        ("timeout_s: 300", "timeout_s: .inf", "timeout_s must be a positive number up to 604800"),
        ("timeout_s: 300", "timeout_s: .nan", "timeout_s must be a positive number"),
        ("timeout_s: 300", f"timeout_s: 1{'0' * 400}", "a number of 401 digits"),
        ("temperature: 0.0", "temperature: 1.0e+400", "temperature must be a number between 0"),
        ("temperature: 0.0", "temperature: 2024-13-45", "temperature has an invalid value"),
        ("max_retries: 1", "max_retries: 0x7fffffffffffffffffff", "max_retries must be an integer"),
        ("max_retries: 1", "max_retries: 190:20:30", "max_retries must be an integer from 0 to"),
    ],
)
def test_a_pool_number_out_of_reach_is_one_sentence(
    old: str, new: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert old in POOL
    path = tmp_path / "pool.yaml"
    path.write_text(POOL.replace(old, new, 1))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if new in text)
    err = refused(["pools", "show", str(path)], capsys, f"{path}:{line}: ", said)
    assert len(err) < 400, err
    path.write_text(POOL)  # positive control
    assert run(["pools", "show", str(path)], capsys)[0] == 0


@pytest.mark.parametrize("name", ["default.txt", "chat.yaml"])
def test_a_template_with_a_0xff_byte_names_its_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = (REPO / "src" / "conductor" / "prompts" / name).read_bytes()
    lines = good.splitlines(keepends=True)
    path = tmp_path / name
    path.write_bytes(b"".join(lines[:3]) + b"caf\xff\n" + b"".join(lines[3:]))
    refused(
        ["ask", "--template", str(path), "q"], capsys, f"{path}:4: ", "is not UTF-8 text (byte 0xff"
    )


def test_a_nul_byte_in_a_yaml_file_names_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL.replace("max_retries: 1", "max_retries: 1\x00", 1))
    line = next(i for i, t in enumerate(POOL.splitlines(), 1) if "max_retries: 1" in t)
    refused(["pools", "show", str(path)], capsys, f"{path}:{line}: ", "is not allowed in YAML")


def test_a_record_holding_a_5000_digit_number_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "run.json"
    record.write_text('{"schema_version": 1,\n "epoch": ' + HUGE + "}\n")
    refused(["trace", str(record)], capsys, f"{record}:", "a number of more than 4,300 digits")
    # In samples.jsonl the line is skipped with a warning, as a torn line is.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "samples.jsonl").write_text(
        json.dumps({"sample_id": "a"})[:-1] + f', "x": {HUGE}}}\n'
    )
    code, err = run(["trace", str(run_dir)], capsys)
    assert code == 0 and "samples.jsonl:1: skipped a line that is not a JSON record" in err, err
