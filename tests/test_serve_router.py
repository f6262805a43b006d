"""`conductor serve --router DIR`: the fitted router as the model `router`, through the
openai SDK against a server whose workers are the fake provider server."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import worker
from kit.servekit import ServeProcess, error_of, make_pool_file, served

from conductor.pool import load_pool
from conductor.testing import FakeLLMServer

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
np = pytest.importorskip("numpy")
openai = pytest.importorskip("openai")

from conductor.router import FitSettings, RoutingData, fit_router, save_router  # noqa: E402

COUNTRIES = ("France", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt", "India")


def _router(out: Path, *, seed: int = 0) -> Path:
    """A router over single:w0 (right on products) and single:w1 (right on capitals)."""
    prompts, scores = [], []
    for i in range(160):
        if i % 2:
            prompts.append(f"What is the capital of {COUNTRIES[i % 8]}?")
            scores.append([0.0, 1.0])
        else:
            prompts.append(f"What is {i % 13 + 2} * {i % 7 + 3}?")
            scores.append([1.0, 0.0])
    data = RoutingData(
        arms=("single:w0", "single:w1"),
        benchmarks=("synthetic",) * 160,
        sample_ids=tuple(str(i) for i in range(160)),
        prompts=tuple(prompts),
        keys=tuple(hashlib.sha256(f"{p}{i}".encode()).hexdigest() for i, p in enumerate(prompts)),
        scores=np.asarray(scores),
        costs=np.zeros((160, 2)),
        unpriced=(),
        sources=("synthetic",),
        pool_sha256=(),
        dropped=0,
    )
    save_router(fit_router(data, FitSettings(seed=seed)), out)
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The router, fitted once for the module (the tests only read its directory)."""
    return _router(tmp_path_factory.mktemp("router") / "r")


@pytest.fixture
def setup(tmp_path: Path, fake_server: FakeLLMServer, fitted: Path) -> dict[str, Any]:
    for w in ("w0", "w1", "w2"):
        fake_server.script(w, f"from {w}")
    workers = [worker(fake_server, w) for w in ("w0", "w1", "w2")]
    pool_file = make_pool_file(tmp_path, fake_server, workers=workers)
    return {
        "pool_file": pool_file,
        "pool": load_pool(pool_file),
        "router": fitted,
        "server": fake_server,
    }


def _ask(url: str, model: str, text: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=60)


def test_the_model_router_sends_each_question_to_its_arm(
    tmp_path: Path, setup: dict[str, Any], fake_server: FakeLLMServer
) -> None:
    records = tmp_path / "records"
    with served(setup["pool"], router=setup["router"], records_dir=records) as url:
        client = openai.OpenAI(base_url=url, api_key="x")
        product = client.chat.completions.create(
            model="router", messages=[{"role": "user", "content": "What is 6 * 7?"}]
        )
        capital = client.chat.completions.create(
            model="router", messages=[{"role": "user", "content": "What is the capital of Peru?"}]
        )
        listed = httpx.get(f"{url}/models", timeout=30).json()
    assert product.choices[0].message.content == "from w0"
    assert capital.choices[0].message.content == "from w1"
    assert [len(fake_server.requests_for(w)) for w in ("w0", "w1", "w2")] == [1, 1, 0]
    entry = next(m for m in listed["data"] if m["id"] == "router")
    assert entry["conductor"]["kind"] == "router"
    from conductor.runs.rundir import iter_records

    routes = [r.route.arm if r.route else None for r in iter_records(records / "samples.jsonl")]
    assert routes == ["single:w0", "single:w1"]
    # The server's path to the router is not what a record calls the strategy.
    assert all(r.settings["strategy"] == "router" for r in iter_records(records / "samples.jsonl"))


def test_a_router_arm_outside_the_allowed_workers_is_400(setup: dict[str, Any]) -> None:
    with served(setup["pool"], router=setup["router"]) as url:
        refused = _ask(url, "router", "What is 2 * 3?", conductor={"allowed_workers": ["w0", "w2"]})
        allowed = _ask(url, "router", "What is 2 * 3?", conductor={"allowed_workers": ["w0", "w1"]})
    error = error_of(refused, 400)
    assert '"w1"' in error["message"] and "allowed_workers" in error["message"], error
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["choices"][0]["message"]["content"] == "from w0"


def test_a_client_cannot_name_a_router_directory(
    setup: dict[str, Any], fake_server: FakeLLMServer
) -> None:
    with served(setup["pool"]) as url:
        none = _ask(url, "router", "What is 2 * 3?")
        named = _ask(url, f"router:{setup['router']}", "What is 2 * 3?")
        listed = httpx.get(f"{url}/models", timeout=30).json()
    assert "without --router DIR" in error_of(none, 400)["message"]
    assert error_of(named, 400)["code"] == "model_not_found"
    assert "router" not in [m["id"] for m in listed["data"]]
    assert fake_server.requests == []


@pytest.mark.process
def test_serve_refuses_a_bad_router_before_it_listens(
    tmp_path: Path, setup: dict[str, Any]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with ServeProcess("--pool", str(setup["pool_file"]), "--router", str(empty)) as proc:
        code = proc.wait()
    assert code == 2
    assert "not a router directory" in proc.stderr
    assert "listening" not in proc.stderr

    # A router whose arm names a worker this pool does not have.
    server = setup["server"]
    small = make_pool_file(tmp_path, server, workers=[worker(server, "w0")], name="small.yaml")
    with ServeProcess("--pool", str(small), "--router", str(setup["router"])) as proc:
        code = proc.wait()
    assert code == 2
    assert "its arm single:w1 cannot run" in proc.stderr, proc.stderr


def test_a_pinned_router_is_pinned_to_its_head_not_only_the_pool(
    tmp_path: Path, setup: dict[str, Any]
) -> None:
    def versions(router: Path) -> tuple[dict[str, str], int]:
        with served(setup["pool"], router=router) as url:
            listed = httpx.get(f"{url}/models", timeout=30).json()
            pinned = {m["id"].split("@")[0]: m["id"] for m in listed["data"] if "@" in m["id"]}
            pool_digest = listed["conductor"]["pool_digest"]
            ok = _ask(url, pinned["router"], "What is 6 * 7?").status_code
            stale = _ask(url, f"router@{pool_digest}", "What is 6 * 7?")
            assert stale.status_code == 400
            assert "pinned to router version" in error_of(stale)["message"]
            return pinned, ok

    first, ok = versions(setup["router"])
    assert ok == 200
    assert first["router"].split("@")[1] != first["conductor"].split("@")[1]
    # Fitted again (another split): another router version, the same pool version.
    again, _ = versions(_router(tmp_path / "r2", seed=5))
    assert again["router"] != first["router"] and again["conductor"] == first["conductor"]
    # The same router moved to another directory is the same version.
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(setup["router"], moved)
    same, _ = versions(moved)
    assert same["router"] == first["router"]
