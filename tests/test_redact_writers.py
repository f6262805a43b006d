"""No file a run writes and no CLI output shows a credential written into a pool: a key
in an ``api_base``'s query or user-info, or an ``extra_headers`` value, each from a
``${VAR}`` set to a unique string that is then looked for byte by byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.benchkit import make_math_file, number_in
from kit.poolkit import CONDUCTOR_MODEL, invoke_cli, lists, pool_dict, worker, write_pool

from conductor.errors import ModelCallError
from conductor.llm.caller import ModelCaller
from conductor.llm.types import ModelRequest
from conductor.redact import redact_params, redact_url
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault

SECRET = "s3cr3t-Zq81-unique-7fd2c0"
ENV = {"SECRET_X": SECRET}


def leaky_pool(tmp_path: Path, server: FakeLLMServer) -> Path:
    port = server.openai_base.split(":")[-1].split("/")[0]
    headers = {"X-Custom": "${SECRET_X}", "Accept": "*/*"}
    w0 = worker(server, "w0", params={"extra_headers": headers})
    w0["api_base"] = f"http://user:${{SECRET_X}}@127.0.0.1:{port}/v1"
    w1 = worker(server, "w1", max_retries=0)
    # The SDK appends its path after the query: w1's calls fail (404), recorded as errors.
    w1["api_base"] = f"{server.openai_base}?key=${{SECRET_X}}"
    w2 = worker(server, "w2", max_retries=0)
    # Nothing listens here: the connection error names the URL.
    w2["api_base"] = "http://127.0.0.1:9/v1?sig=${SECRET_X}&api-version=2024"
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, [w0, w1, w2]))


def files_holding(root: Path, secret: str) -> list[str]:
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.is_file() and secret.encode() in p.read_bytes()
    ]


def test_pools_show_hides_the_secrets(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    res = invoke_cli("pools", "show", str(leaky_pool(tmp_path, fake_server)), env=ENV)
    assert res.returncode == 0, res.stderr
    assert "127.0.0.1" in res.stdout and "w2" in res.stdout
    assert SECRET not in res.stdout + res.stderr


def test_a_bench_run_writes_no_secret(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        CONDUCTOR_MODEL, lists([0, 1, 2], ["Solve.", "Check.", "Check."], [[], [0], [0]])
    )
    for wid in ("w0", "w1", "w2"):
        fake_server.script(wid, lambda r: f"\\boxed{{{number_in(r)}}}")
    data = make_math_file(tmp_path / "math.jsonl", 2)
    out = tmp_path / "run"
    pool = leaky_pool(tmp_path, fake_server)
    res = invoke_cli(
        "bench", "math500", "--pool", str(pool), "--data", str(data), "--out", str(out),
        env={**ENV, "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")},
    )  # fmt: skip
    assert (out / "samples.jsonl").exists(), res.stdout + res.stderr
    assert (out / "summary.json").exists() and (out / "rate_limits.json").exists()
    # The header went out (w0 answered through it) though no file shows it.
    assert any(r.headers.get("x-custom") == SECRET for r in fake_server.requests_for("w0"))
    assert SECRET not in res.stdout + res.stderr
    assert files_holding(tmp_path, SECRET) == []
    one = ("trace", str(out), "--sample", "math500/test/synthetic/0.json")
    for args in (("report", str(out)), ("trace", str(out)), one):
        shown = invoke_cli(*args, env=ENV)
        assert shown.returncode == 0, shown.stderr
        assert SECRET not in shown.stdout + shown.stderr, args


@pytest.mark.parametrize(
    "url",
    [
        f"https://h/v1?key={SECRET}",
        f"https://h/v1?api_key={SECRET}",
        f"https://h/v1?token={SECRET}&x=1",
        f"https://h/v1?access_token={SECRET}",
        f"https://h/v1?sig={SECRET}",
        f"https://h/v1?signature={SECRET}",
        f"https://h/v1?X-Goog-Api-Key={SECRET}",
        f"https://h/v1?client_secret={SECRET}",
        f"https://h/v1?code={SECRET}",
        f"https://user:{SECRET}@h/v1",
        f"https://{SECRET}@h/v1",
    ],
)
def test_redact_url_hides_every_credential(url: str) -> None:
    shown = redact_url(url)
    assert SECRET not in shown and "h/v1" in shown


def test_every_extra_header_value_but_harmless_ones_is_hidden() -> None:
    params = {
        "temperature": 0.1,
        "extra_headers": {"X-Custom": SECRET, "Content-Type": "application/json"},
    }
    shown = redact_params(params)
    assert shown["temperature"] == 0.1
    assert shown["extra_headers"] == {"X-Custom": "***", "Content-Type": "application/json"}


@pytest.mark.parametrize("client", ["openai", "http", "litellm"])
@pytest.mark.parametrize("where", ["userinfo", "header"])
async def test_an_error_echoing_a_credential_is_masked(
    fake_server: FakeLLMServer, client: str, where: str
) -> None:
    # A server that quotes what it was sent: the message kept must not show the key.
    if where == "userinfo" and client != "openai":
        pytest.skip("aiohttp refuses user-info beside an Authorization header")
    fake_server.script("m", Fault(400, f"unknown key {SECRET} for this project"))
    base = fake_server.openai_base
    if where == "userinfo":
        base = base.replace("http://", f"http://user:{SECRET}@")
        params: dict[str, object] = {}
    else:
        params = {"extra_headers": {"X-Custom": SECRET}}
    model = "openai/m" if client == "litellm" else "m"
    target = Worker(id="w", model=model, client=client, api_base=base, params=params, max_retries=0)
    caller = ModelCaller(target)
    try:
        with pytest.raises(ModelCallError) as info:
            await caller.complete(ModelRequest(messages=({"role": "user", "content": "hi"},)))
    finally:
        await caller.aclose()
    assert "unknown key" in str(info.value)
    assert SECRET not in str(info.value) and SECRET not in info.value.describe()


def test_a_plain_header_value_is_hidden_but_not_masked_in_replies() -> None:
    from conductor.redact import credentials_in

    params = {"extra_headers": {"X-Env": "production", "Authorization": f"Bearer {SECRET}"}}
    assert redact_params(params)["extra_headers"] == {"X-Env": "***", "Authorization": "***"}
    # A word like "production" in an answer stays; the key is masked wherever it shows.
    url = f"https://u:{SECRET}x@h/v1?api-version=2024&sig={SECRET}y"
    assert credentials_in(url, params) == (f"{SECRET}x", f"{SECRET}y", SECRET)
