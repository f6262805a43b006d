"""Secrets masked by value: the one owner of the process's secret values
(``conductor.redact.SECRETS``), the forms a value is found in, what the configuration
readers give it, and what the writers and keys do with it.  The sweep over every
command and every byte written is tests/test_secrets_everywhere.py."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import logging
import urllib.parse
import xml.sax.saxutils
from pathlib import Path

import markupsafe
import pytest
from kit.benchkit import boxed_number, make_math_file
from kit.poolkit import invoke_cli, write_pool

from conductor.pool import load_pool_text
from conductor.redact import (
    MIN_SECRET_CHARS,
    SECRETS,
    Masker,
    MaskingFilter,
    mask,
    mask_text,
    masked_json,
    redact_url,
)
from conductor.render.format import clip, clip_middle
from conductor.render.markdown import markdown_cell
from conductor.testing import FakeLLMServer

SECRET = 'Prj-7q+Zx=w8/k"Lm é~s'  # punctuation, a quote, a slash, a non-ASCII letter


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


# Each way a writer or a protocol of this project (or one it talks to) writes a value.
WRITTEN = {
    "raw": lambda s: s,
    "json": lambda s: json.dumps(s),
    "json ascii": lambda s: json.dumps(s, ensure_ascii=True),
    "json in json": lambda s: json.dumps(json.dumps({"url": f"https://h/{s}/v1"})),
    "percent": lambda s: urllib.parse.quote(s, safe=""),
    "percent, lower-case hex": lambda s: urllib.parse.quote(s, safe="").lower(),
    "form-encoded": lambda s: urllib.parse.quote_plus(s),
    "a query redact_url wrote again": lambda s: redact_url(
        "https://h/v1?project=" + urllib.parse.quote(s)
    ),
    "markupsafe (jinja)": lambda s: str(markupsafe.escape(s)),
    "XML attribute (JUnit)": lambda s: xml.sax.saxutils.quoteattr(s),
    "Markdown cell": markdown_cell,
    "Basic auth header": lambda s: "Authorization: Basic " + _basic("user", s),
    "Basic auth, a longer user": lambda s: _basic("someone", s),
    "base64 of the value": lambda s: base64.b64encode(s.encode()).decode(),
    "urlsafe base64 after 2 bytes": lambda s: base64.urlsafe_b64encode(b"ab" + s.encode()).decode(),
    "lower-cased (a search index)": lambda s: f"find {s.lower()} here",
    "upper-cased": lambda s: s.upper(),
    "clipped before an ellipsis": lambda s: f"cannot reach https://h/{s[:12]}…",
    "clipped by render.format.clip": lambda s: clip(f"see https://h/{s}/v1", 24),
    "the tail after clip_middle's cut": lambda s: clip_middle("a" * 300 + s + "/v1", 5, 20),
}


def _pieces_left(shown: str) -> list[str]:
    """The runs of MIN_SECRET_CHARS characters of SECRET still readable in ``shown``
    once every encoding is undone (percent, entities, backslashes, case, base64)."""
    undone = [shown]
    undone.append(urllib.parse.unquote_plus(shown))
    undone.append(html.unescape(shown))
    undone.append(shown.replace("\\", ""))
    for token in shown.replace("=", " ").split():
        for cut in range(4):
            with contextlib.suppress(ValueError):
                padded = token[cut:] + "=" * (-len(token[cut:]) % 4)
                for decode in (base64.b64decode, base64.urlsafe_b64decode):
                    with contextlib.suppress(ValueError):
                        undone.append(decode(padded).decode("utf-8", "replace"))
    text = "\n".join(undone).lower()
    windows = (SECRET[i : i + MIN_SECRET_CHARS] for i in range(len(SECRET) - MIN_SECRET_CHARS + 1))
    return [w for w in windows if w.lower() in text]


@pytest.mark.parametrize("how", sorted(WRITTEN))
def test_a_secret_is_masked_however_it_is_written(how: str) -> None:
    written = WRITTEN[how](SECRET)
    shown = Masker([SECRET]).text(written)
    assert "***" in shown, (how, written)
    assert _pieces_left(shown) == [], (how, written, shown)


@pytest.mark.parametrize("how", sorted(WRITTEN))
def test_without_the_secret_held_each_form_holds_it(how: str) -> None:
    # The positive control: each written form does carry the secret (or a piece of it,
    # as the search above reads it), and a masker holding nothing leaves it there.
    written = WRITTEN[how](SECRET)
    assert _pieces_left(written) != [], how
    assert Masker([]).text(written) == written
    assert Masker(["someone-elses-value"]).text(written) == written


def test_a_text_without_a_secret_is_left_alone() -> None:
    masker = Masker([SECRET])
    for text in ("", "plain words", "Prj-7q+Zx", "https://h/v1?project=other", "…", "…" * 5):
        assert masker.text(text) == text


def test_the_longer_of_two_nested_secrets_is_masked_whole() -> None:
    short, long = "abcdefgh12", "abcdefgh12-and-more"
    assert Masker([short, long]).text(f"x {long} y {short} z") == "x *** y *** z"


def test_data_is_masked_in_keys_strings_and_numbers() -> None:
    masker = Masker(["123456789012", SECRET])
    data = {SECRET: [SECRET, 123456789012, 1.5, True, None], "n": (3, f"in {SECRET}")}
    assert masker.data(data) == {"***": ["***", "***", 1.5, True, None], "n": [3, "in ***"]}
    # A JSON document stays JSON: the number became a string, not a bare ***.
    assert json.loads(json.dumps(masker.data({"project": 123456789012}))) == {"project": "***"}


def test_objects_are_masked_as_json_would_write_them(tmp_path: Path) -> None:
    SECRETS.add(SECRET)
    where = tmp_path / SECRET / "x.txt"
    text = masked_json({"path": where}, default=str)
    assert SECRET not in text and json.loads(text) == {"path": f"{tmp_path}/***/x.txt"}


# --------------------------------------------------------------------------- the owner


def test_a_value_too_short_to_mask_is_refused() -> None:
    assert not SECRETS.add("a" * (MIN_SECRET_CHARS - 1))
    assert SECRETS.add("b" * MIN_SECRET_CHARS)
    assert mask_text("aaaaaaa and bbbbbbbb") == "aaaaaaa and ***"


def test_a_variable_whose_name_sounds_like_a_key_is_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACME_SERVICE_TOKEN", "tok-0123456789abcdef")
    monkeypatch.setenv("ACME_REGION", "region-eu-west-42")
    SECRETS.forget()  # rescan the environment now
    assert mask_text("tok-0123456789abcdef in region-eu-west-42") == "*** in region-eu-west-42"
    # A variable a client reads its key from, whatever its name, once it is watched.
    SECRETS.watch("ACME_REGION")
    assert mask_text("region-eu-west-42") == "***"
    # A key changed after it was watched is the value masked.
    monkeypatch.setenv("ACME_REGION", "region-us-east-77")
    assert mask_text("region-eu-west-42 region-us-east-77") == "region-eu-west-42 ***"


def test_switched_off_nothing_is_masked_by_value() -> None:
    SECRETS.add(SECRET)
    SECRETS.enabled = False
    try:
        assert mask_text(SECRET) == SECRET
        assert mask({"a": SECRET}) == {"a": SECRET}
    finally:
        SECRETS.enabled = True
    assert mask_text(SECRET) == "***"


# --------------------------------------------------------------------------- the readers

POOL = """
workers:
  - id: w
    model: ${MODEL}
    api_base: https://h.example/${PROJECT}/v1?region=${REGION:-eu-west-region-1}
    params:
      max_tokens: ${MAX_TOKENS}
      user: "${USER_TAG}"
  - id: k
    model: m
    api_base: https://h.example/v1?key=literal-key-in-the-file-99
"""


def test_every_value_taken_from_the_environment_is_held(caplog: pytest.LogCaptureFixture) -> None:
    env = {"MODEL": "gpt-from-env-1", "PROJECT": "proj-abcdef123", "MAX_TOKENS": "512",
           "USER_TAG": "u42"}  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="conductor"):
        load_pool_text(POOL, source="pool.yaml", environ=env)
        load_pool_text(POOL, source="pool.yaml", environ=env)
    held = SECRETS.values()
    assert {"gpt-from-env-1", "proj-abcdef123", "literal-key-in-the-file-99"} <= held
    # A default written in the file is not a secret; 512 and u42 are too short to mask.
    assert not held & {"eu-west-region-1", "512", "u42"}
    # The short string is said once (not at each load), with its place; the number,
    # a setting, is not.
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "pool.yaml:8: workers[0].params.user takes ${USER_TAG}" in warned[0]
    assert "3 characters" in warned[0] and "u42" not in warned[0]


def test_an_error_quoting_a_value_from_the_environment_is_masked() -> None:
    from conductor.errors import PoolError

    bad = "ftp://files.example/drop-7f3k2q"
    text = "workers:\n  - {id: w, model: m, api_base: '${BASE}'}\n"
    with pytest.raises(PoolError) as info:
        load_pool_text(text, source="pool.yaml", environ={"BASE": bad})
    assert bad in str(info.value)  # the exception is the reader's; its printers mask
    assert mask_text(str(info.value)).count("***") == 1 and bad not in mask_text(str(info.value))


# --------------------------------------------------------------------------- the writers


def test_the_log_handler_masks_messages_and_tracebacks() -> None:
    SECRETS.add(SECRET)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.addFilter(MaskingFilter())
    logger = logging.getLogger("conductor.test-secrets")
    logger.addHandler(handler)
    try:
        logger.warning("cannot reach %s", f"https://h/{SECRET}/v1")
        try:
            raise ValueError(f"bad project {SECRET}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert records[0] == "WARNING: cannot reach https://h/***/v1"
    assert "ValueError: bad project ***" in records[1] and "Traceback" in records[1]
    assert not any(SECRET in r for r in records)


def _one_worker_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    pool = {
        "workers": [
            {
                "id": "w",
                "model": "w",
                "client": "openai",
                "api_base": server.openai_base,
                "max_retries": 0,
                "params": {"user": "${SWEEP_PROJECT}"},
            },  # fmt: skip
        ]
    }
    return write_pool(tmp_path / "pool.yaml", pool)


def test_two_secrets_never_share_a_cache_entry(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w", boxed_number)
    pool = _one_worker_pool(tmp_path, fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 2)
    cache = tmp_path / "cache"

    def bench(out: str, project: str) -> int:
        before = len(fake_server.requests_for("w"))
        res = invoke_cli(
            "bench", "math500", "--pool", str(pool), "--data", str(data), "--strategy",
            "single:w", "--out", str(tmp_path / out),
            env={"SWEEP_PROJECT": project, "CONDUCTOR_CACHE_DIR": str(cache)},
        )  # fmt: skip
        assert res.returncode == 0, res.stdout + res.stderr
        SECRETS.forget()  # as the next process starts
        return len(fake_server.requests_for("w")) - before

    first, other = "project-alpha-000111", "project-bravo-222333"
    assert bench("a", first) == 2
    # What is written is the same for both: the secret is masked in config.json...
    config_a = json.loads((tmp_path / "a" / "config.json").read_text())
    assert bench("b", other) == 2  # ...yet the second secret is asked again, not replayed
    config_b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config_a["pool"]["workers"] == config_b["pool"]["workers"]
    assert config_a["pool"]["workers"][0]["params"]["user"] == "***"
    # The positive control: the same secret again is replayed from the cache.
    assert bench("c", first) == 0
    assert not any(s.encode() in p.read_bytes() for s in (first, other) for p in
                   cache.rglob("*") if p.is_file())  # fmt: skip


def test_a_run_with_a_secret_resumes(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_server.script("w", boxed_number)
    pool = _one_worker_pool(tmp_path, fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 2)
    out = tmp_path / "run"
    env = {"SWEEP_PROJECT": "project-alpha-000111", "CONDUCTOR_CACHE_DIR": str(tmp_path / "c")}
    base = ("bench", "math500", "--pool", str(pool), "--data", str(data), "--strategy", "single:w")
    first = invoke_cli(*base, "--out", str(out), env=env)
    assert first.returncode == 0, first.stderr
    assert "project-alpha-000111" not in (out / "config.json").read_text()
    SECRETS.forget()
    # config.json holds the secret masked, the run in memory holds it: the same run.
    resumed = invoke_cli(*base, "--resume", str(out), env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # The positive control: compared as written and as held, the two configs differ.
    import conductor.bench.runconfig as runconfig

    SECRETS.forget()
    monkeypatch.setattr(runconfig, "mask", lambda value: value)
    refused = invoke_cli(*base, "--resume", str(out), env=env)
    assert refused.returncode == 2 and "cannot resume" in refused.stderr
    assert "project-alpha-000111" not in refused.stderr  # the refusal quotes it masked
