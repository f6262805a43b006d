"""`conductor serve` restricted to some of the pool's workers (a request's
`conductor.allowed_workers`, a keys file's `allowed_workers`) and models pinned to the
pool's content (`conductor@DIGEST`), through the openai SDK and httpx against servers
whose workers are the fake provider server."""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, run_cli, worker
from kit.servekit import ServeProcess, make_pool_file, served

from conductor.pool import Pool, load_pool
from conductor.runs.rundir import iter_records
from conductor.testing import FakeLLMServer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from conductor.serve import KeysFileError, load_keys_text  # noqa: E402

QUESTION = [{"role": "user", "content": "Capital of France?"}]
KEYS_ENV = {"TEAM_A_TOKEN": "team-a-token-123"}
KEYS_FILE = """\
keys:
  - name: team-a
    token_env: TEAM_A_TOKEN
    allowed_workers: [w0, w1]
  - name: admin
    token: admin-token-456
"""


def described_pool(tmp_path: Path, server: FakeLLMServer, **extra: Any) -> Pool:
    """Three workers w0..w2, each described, and a Conductor shown the descriptions (so
    its prompt names which workers it was given)."""
    entries = [worker(server, f"w{i}", description=f"worker number {i}") for i in range(3)]
    return load_pool(
        make_pool_file(tmp_path, server, workers=entries, show_descriptions=True, **extra)
    )


def client(url: str, key: str = "unused") -> Any:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def conductor_prompt(server: FakeLLMServer) -> str:
    (request,) = server.requests_for(CONDUCTOR_MODEL)
    return "\n".join(m["content"] for m in request.messages)


def error_of(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    error: dict[str, Any] = resp.json()["error"]
    return error


def ask(url: str, model: str, key: str | None = None, **ours: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "messages": QUESTION}
    if ours:
        body["conductor"] = ours
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=60)


# -- a request's own allowed_workers ----------------------------------------------------


def test_the_conductor_is_shown_only_the_allowed_workers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # The Conductor, shown w0 and w2 as Models 0 and 1, plans Model 1: that is w2.
    fake_server.script(CONDUCTOR_MODEL, lists([1], ["Answer it."], [[]]))
    fake_server.script("w2", "Paris, says w2")
    records = tmp_path / "records"
    with served(described_pool(tmp_path, fake_server), records_dir=records) as url:
        reply = client(url).chat.completions.create(
            model="conductor",
            messages=QUESTION,
            extra_body={"conductor": {"allowed_workers": ["w2", "w0"]}},
        )
    assert reply.choices[0].message.content == "Paris, says w2"
    prompt = conductor_prompt(fake_server)
    assert "- Model 0: worker number 0\n- Model 1: worker number 2" in prompt, prompt
    assert "Model 2" not in prompt and "worker number 1" not in prompt
    assert len(fake_server.requests_for("w2")) == 1
    assert fake_server.requests_for("w0") == fake_server.requests_for("w1") == []
    (run,) = (reply.model_extra or {})["conductor"]["runs"]
    assert [s["worker"] for s in run["workflow"]["rounds"][0]["steps"]] == ["w2"]
    (record,) = iter_records(records / "samples.jsonl")
    assert record.allowed_workers == ["w0", "w2"]
    assert [s.worker_id for s in record.rounds[0].steps] == ["w2"]


def test_an_unrestricted_request_records_every_worker(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([2], ["Answer it."], [[]]))
    fake_server.script("w2", "Paris")
    records = tmp_path / "records"
    with served(described_pool(tmp_path, fake_server), records_dir=records) as url:
        client(url).chat.completions.create(model="conductor", messages=QUESTION)
    assert "- Model 2: worker number 2" in conductor_prompt(fake_server)
    (record,) = iter_records(records / "samples.jsonl")
    assert record.allowed_workers == ["w0", "w1", "w2"]


def test_baselines_only_over_the_allowed_workers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    for w in ("w0", "w1", "w2"):
        fake_server.script(w, f"from {w}")
    with served(described_pool(tmp_path, fake_server)) as url:
        only = {"allowed_workers": ["w0", "w2"]}
        moa = client(url).chat.completions.create(
            model="moa", messages=QUESTION, extra_body={"conductor": only}
        )
        calls = {w: len(fake_server.requests_for(w)) for w in ("w0", "w1", "w2")}
        left_out = ask(url, "single:w1", allowed_workers=["w0", "w2"])
        aggregator_left_out = ask(url, "moa:w1", allowed_workers=["w0", "w2"])
        single = ask(url, "single:w2", allowed_workers=["w0", "w2"])
    # moa: both allowed workers propose, the first (w0) aggregates; w1 is never asked.
    assert moa.choices[0].message.content == "from w0"
    assert calls == {"w0": 2, "w1": 0, "w2": 1}
    for resp in (left_out, aggregator_left_out):
        error = error_of(resp, 400)
        assert error["param"] == "model" and '"w1"' in error["message"], error
        assert "allowed_workers" in error["message"]
    assert single.status_code == 200, single.text
    assert single.json()["choices"][0]["message"]["content"] == "from w2"


@pytest.mark.parametrize(
    ("allowed", "needle"),
    [
        (["w0", "w22"], 'did you mean "w2"?'),
        ([], "non-empty list"),
        ("w0", "non-empty list"),
        (["w0", ""], "non-empty list"),
    ],
)
def test_bad_allowed_workers_are_400(
    tmp_path: Path, fake_server: FakeLLMServer, allowed: Any, needle: str
) -> None:
    with served(described_pool(tmp_path, fake_server)) as url:
        resp = ask(url, "conductor", allowed_workers=allowed)
    error = error_of(resp, 400)
    assert error["param"] == "conductor.allowed_workers"
    assert needle in error["message"], error
    assert fake_server.requests == []


# -- keys files -------------------------------------------------------------------------


def keyed(tmp_path: Path, server: FakeLLMServer, **settings: Any) -> Any:
    pool = described_pool(tmp_path, server)
    keys = load_keys_text(KEYS_FILE, pool, source="keys.yaml", environ=KEYS_ENV)
    return served(pool, keys=keys, **settings)


def test_keys_file_restricts_each_key(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([1], ["Answer it."], [[]]))
    fake_server.script("w1", "Paris, says w1")
    fake_server.script("w2", "from w2")
    team_a, admin = "team-a-token-123", "admin-token-456"
    with keyed(tmp_path, fake_server) as url:
        listed = {
            key: httpx.get(
                f"{url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
            ).json()
            for key in (team_a, admin)
        }
        reply = client(url, team_a).chat.completions.create(model="conductor", messages=QUESTION)
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client(url, team_a).chat.completions.create(model="single:w2", messages=QUESTION)
        wider = ask(url, "conductor", team_a, allowed_workers=["w1", "w2"])
        shown = httpx.get(
            f"{url}/models/single:w2", headers={"Authorization": f"Bearer {team_a}"}, timeout=30
        )
        admins = client(url, admin).chat.completions.create(model="single:w2", messages=QUESTION)
        nobody = ask(url, "conductor")
        stranger = ask(url, "conductor", "not-a-token")
    # team-a sees and uses w0 and w1 only; the admin key every worker.
    ids_a = [m["id"] for m in listed[team_a]["data"]]
    assert [i for i in ids_a if "@" not in i] == ["conductor", "single:w0", "single:w1", "moa"]
    assert listed[team_a]["conductor"]["workers"] == ["w0", "w1"]
    assert "single:w2" in [m["id"] for m in listed[admin]["data"]]
    assert reply.choices[0].message.content == "Paris, says w1"
    prompt = conductor_prompt(fake_server)
    assert "- Model 1: worker number 1" in prompt and "worker number 2" not in prompt
    assert denied.value.status_code == 403
    assert '"w2"' in denied.value.message and "team-a" in denied.value.message
    for resp in (wider, shown):
        error = error_of(resp, 403)
        assert error["code"] == "worker_not_allowed" and '"w2"' in error["message"], error
    assert admins.choices[0].message.content == "from w2"
    for resp in (nobody, stranger):
        assert error_of(resp, 401)["code"] == "invalid_api_key"
    assert "team-a-token-123" not in json.dumps(list(listed.values())) + wider.text


def test_api_key_env_beside_a_keys_file(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w2", "from w2")
    with keyed(tmp_path, fake_server, api_key="env-token-789") as url:
        beside = ask(url, "single:w2", "env-token-789")
        team_a = ask(url, "single:w2", "team-a-token-123")
    assert beside.status_code == 200, beside.text
    assert error_of(team_a, 403)["code"] == "worker_not_allowed"


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (
            "keys:\n  - name: a\n    token_env: A_TOKEN\n    allowed_worker: [w0]\n",
            4,
            'unknown key "allowed_worker" (did you mean "allowed_workers"?)',
        ),
        (
            "keys:\n  - name: a\n    token_env: A_TOKEN\n    allowed_workers: [w0, w22]\n",
            4,
            'no worker "w22" (did you mean "w2"?)',
        ),
        ("keys:\n  - name: a\n    token_env: UNSET_TOKEN\n", 3, "UNSET_TOKEN is not set"),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    token: x\n", 2, "not both"),
        ("keys:\n  - name: a\n", 2, "needs one of token_env"),
        ("keys:\n  - name: a\n    api_key: x\n", 3, "token_env"),
        (
            "keys:\n  - name: a\n    token_env: A_TOKEN\n  - name: a\n    token: other\n",
            4,
            'duplicate key name "a" on lines 2 and 4',
        ),
        (
            "keys:\n  - name: a\n    token_env: A_TOKEN\n  - name: b\n    token: a-secret\n",
            4,
            "same token as the key on line 2",
        ),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    allowed_workers: []\n", 4, "one or more"),
        ("keys: []\n", 1, "one or more keys"),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    max_calls: 0\n", 4, "max_calls must be"),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    max_usd: -1\n", 4, "max_usd must be"),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    max_usd: 2e6\n", 4, "up to 1e+06"),
        ("keys:\n  - name: a\n    token_env: A_TOKEN\n    max_usd: lots\n", 4, "keys[0].max_usd"),
        (
            "keys:\n  - name: a\n    token_env: A_TOKEN\n    max_cals: 5\n",
            4,
            'unknown key "max_cals" (did you mean "max_calls"?)',
        ),
        ("keyz:\n  - name: a\n", 1, 'did you mean "keys"?'),
    ],
)
def test_bad_keys_files_name_the_line(
    tmp_path: Path, fake_server: FakeLLMServer, text: str, line: int, needle: str
) -> None:
    pool = described_pool(tmp_path, fake_server)
    with pytest.raises(KeysFileError) as raised:
        load_keys_text(text, pool, source="keys.yaml", environ={"A_TOKEN": "a-secret"})
    assert raised.value.line == line, raised.value
    assert str(raised.value).startswith(f"keys.yaml:{line}: ")
    assert needle in str(raised.value), raised.value
    assert "a-secret" not in str(raised.value)


@pytest.mark.process
def test_cli_keys_file(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w1", "from w1")
    pool = make_pool_file(tmp_path, fake_server, n=3)
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS_FILE)
    bad = tmp_path / "bad-keys.yaml"
    bad.write_text("keys:\n  - name: a\n    token_env: TEAM_A_TOKEN\n    allowed_workers: [w9]\n")
    refused = run_cli("serve", "--port", "0", "--pool", str(pool), "--keys", str(bad), env=KEYS_ENV)
    assert refused.returncode == 2, refused.stderr
    assert f"{bad}:4: " in refused.stderr and '"w9"' in refused.stderr, refused.stderr
    args = ("--pool", str(pool), "--keys", str(keys), "--no-cache")
    with ServeProcess(*args, env=KEYS_ENV) as server:
        url = server.wait_url()
        allowed = ask(url, "single:w1", "team-a-token-123")
        denied = ask(url, "single:w2", "team-a-token-123")
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait() == 0
    assert allowed.status_code == 200, allowed.text
    assert error_of(denied, 403)["code"] == "worker_not_allowed"
    assert "team-a-token-123" not in server.stderr + server.stdout


# -- pinned ids and the models list -----------------------------------------------------


def digest_of(url: str) -> str:
    digest: str = httpx.get(f"{url}/models", timeout=30).json()["conductor"]["pool_digest"]
    return digest


def test_pinned_ids_answer_and_a_stale_one_is_refused(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer it."], [[]]))
    fake_server.script("w0", ["Paris", "Paris again"])
    with served(described_pool(tmp_path, fake_server)) as url:
        digest = digest_of(url)
        pinned = client(url).chat.completions.create(model=f"conductor@{digest}", messages=QUESTION)
        single = client(url).chat.completions.create(model=f"single:w0@{digest}", messages=QUESTION)
        with pytest.raises(openai.BadRequestError) as stale:
            client(url).chat.completions.create(model="conductor@0123456789ab", messages=QUESTION)
    assert len(digest) == 12
    assert pinned.model == f"conductor@{digest}"
    assert pinned.choices[0].message.content == "Paris"
    assert single.choices[0].message.content == "Paris again"
    assert stale.value.code == "model_not_found"
    assert "pool has changed" in stale.value.message and digest in stale.value.message


def test_the_digest_follows_what_decides_answers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    def digest(**changes: Any) -> str:
        pool = described_pool(tmp_path, fake_server)
        w0 = pool.workers[0]
        params = {**w0.params, **changes.pop("params", {})}
        workers = (replace(w0, params=params, **changes), *pool.workers[1:])
        with served(replace(pool, workers=workers, name="renamed")) as url:
            return digest_of(url)

    same = digest()
    assert digest() == same
    # How a model is reached, paced and paid for does not change its answers ...
    assert digest(timeout_s=99.0, max_concurrency=3) == same
    # ... its sampling settings and prompts do.
    assert digest(params={"temperature": 0.9}) != same
    assert digest(system_prompt="Answer in French.") != same


def test_models_list_shape(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    with served(described_pool(tmp_path, fake_server)) as url:
        body = httpx.get(f"{url}/models", timeout=30).json()
        digest = body["conductor"]["pool_digest"]
        sdk_ids = [m.id for m in client(url).models.list()]
        one = {
            model: httpx.get(f"{url}/models/{model}", timeout=30)
            for model in ("vote:3:w0", f"reflect:2:w1@{digest}", "vote:K:W", "moa@0123456789ab")
        }
    ids = [m["id"] for m in body["data"]]
    plain = ["conductor", "single:w0", "single:w1", "single:w2", "moa"]
    assert ids == [*plain, *(f"{m}@{digest}" for m in plain)]
    assert sdk_ids == ids
    for m in body["data"]:
        meta = m["conductor"]
        assert meta["pinned"] is ("@" in m["id"]) and meta["pool_digest"] == digest
        assert meta["pattern"] is None
    patterns = body["conductor"]["patterns"]
    assert [p["pattern"] for p in patterns] == ["vote:K:W", "reflect:K:W"]
    assert all(p["k_min"] == 1 and "k_max" in p for p in patterns)
    assert body["conductor"]["workers"] == ["w0", "w1", "w2"]
    vote = one["vote:3:w0"]
    assert vote.status_code == 200, vote.text
    assert vote.json()["id"] == "vote:3:w0" and vote.json()["conductor"]["pattern"] == "vote:K:W"
    reflect = one[f"reflect:2:w1@{digest}"].json()
    assert reflect["conductor"]["pinned"] is True
    assert reflect["conductor"]["pattern"] == "reflect:K:W"
    for model in ("vote:K:W", "moa@0123456789ab"):
        assert error_of(one[model], 400)["code"] == "model_not_found"
    assert fake_server.requests == []


async def test_each_allowed_set_is_built_once_on_the_shared_callers(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    from conductor.conductors.spec import resolve_conductor
    from conductor.execute import RunSettings
    from conductor.llm.caller import CallerSet
    from conductor.serve._models import Catalog

    pool = described_pool(tmp_path, fake_server)
    catalog = Catalog(pool, resolve_conductor(pool), CallerSet(None), RunSettings())
    try:
        some = catalog.resolve("conductor", ("w0", "w2"))
        assert catalog.resolve(f"conductor@{catalog.digest}", ("w0", "w2")) is some
        assert [w.id for w in some.pool.workers] == ["w0", "w2"]
        assert catalog.resolve("conductor", ("w0", "w1")) is not some
        assert catalog.resolve("conductor") is catalog.conductor
        assert catalog.resolve("moa", ("w0", "w2")) is catalog.resolve("moa", ("w0", "w2"))
    finally:
        await catalog.aclose()
