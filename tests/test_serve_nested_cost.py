"""A pool worker that is another `conductor serve`: the outer run's cost is the one the
inner server reported (its ``x-conductor-cost-usd`` header), not tokens times a price,
over each OpenAI-protocol client; ``unknown`` from the inner server stays unknown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.poolkit import worker
from kit.servekit import make_pool_file, served

from conductor.pool import load_pool
from conductor.testing import FakeLLMServer, Reply

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}
#: w0's one call at PRICE: 5 tokens in, 3 out.
INNER_COST = (5 * 1000 + 3 * 2000) / 1e6


def nested(url: str, client: str, **extra: Any) -> dict[str, Any]:
    """A worker that asks the inner server's ``single:w0`` model."""
    model = "single:w0" if client != "litellm" else "openai/single:w0"
    return {
        "id": "inner",
        "client": client,
        "model": model,
        "api_base": url,
        "max_retries": 0,
        "timeout_s": 30,
        **extra,
    }


def ask(url: str) -> httpx.Response:
    body = {"model": "single:inner", "messages": [{"role": "user", "content": "Capital?"}]}
    resp = httpx.post(f"{url}/chat/completions", json=body, timeout=90)
    assert resp.status_code == 200, resp.text
    return resp


@pytest.mark.parametrize("client", ["openai", "litellm", "http"])
def test_the_outer_cost_is_the_inner_servers(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    if client == "litellm":
        pytest.importorskip("litellm")
    fake_server.script("w0", Reply("Paris", None, 5, 3))
    inner_pool = load_pool(
        make_pool_file(tmp_path, fake_server, workers=[worker(fake_server, "w0", price=PRICE)])
    )
    with served(inner_pool) as inner_url:
        outer_pool = load_pool(
            make_pool_file(
                tmp_path, fake_server, name="outer.yaml", workers=[nested(inner_url, client)]
            )
        )
        with served(outer_pool) as outer_url:
            resp = ask(outer_url)
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == "Paris"
    # Tokens times a price would give no cost at all: "single:w0" is in no price table.
    assert body["conductor"]["cost_usd"] == pytest.approx(INNER_COST)
    assert float(resp.headers["x-conductor-cost-usd"]) == pytest.approx(INNER_COST)


@pytest.mark.parametrize("client", ["openai", "http"])
def test_unknown_from_the_inner_server_stays_unknown(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    fake_server.script("w0", Reply("Paris", None, 5, 3))
    inner_pool = load_pool(make_pool_file(tmp_path, fake_server, n=1))  # w0 unpriced
    with served(inner_pool) as inner_url:
        # A price set for the nested worker does not make up the inner run's cost.
        outer = nested(inner_url, client, price=PRICE)
        outer_pool = load_pool(
            make_pool_file(tmp_path, fake_server, name="outer.yaml", workers=[outer])
        )
        with served(outer_pool) as outer_url:
            resp = ask(outer_url)
    assert resp.json()["conductor"]["cost_usd"] is None
    assert resp.headers["x-conductor-cost-usd"] == "unknown"
