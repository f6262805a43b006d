"""Prices from pool overrides and litellm's bundled table."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from conductor.llm.cost import cost_usd, price_for, price_table
from conductor.llm.types import Usage
from conductor.targets import Price, Worker


def test_pool_override_wins() -> None:
    w = Worker(id="w", model="openai/gpt-4o", price=Price(1.0, 2.0))
    assert price_for(w) == Price(1.0, 2.0)
    assert cost_usd(Usage(1000, 500), price_for(w)) == pytest.approx(0.002)


def test_table_lookup_exact_and_prefix_stripped() -> None:
    table = price_table()
    gpt4o = table["gpt-4o"]
    want = Price(
        gpt4o["input_cost_per_token"] * 1e6,
        gpt4o["output_cost_per_token"] * 1e6,
        gpt4o["input_cost_per_token_batches"] * 1e6,
        gpt4o["output_cost_per_token_batches"] * 1e6,
    )
    assert price_for(Worker(id="a", model="openai/gpt-4o")) == want
    assert price_for(Worker(id="b", model="gpt-4o", client="openai")) == want
    gem = table["gemini/gemini-2.5-pro"]
    got = price_for(Worker(id="c", model="gemini/gemini-2.5-pro"))
    assert got is not None and got.input_per_mtok == pytest.approx(
        gem["input_cost_per_token"] * 1e6
    )
    cost = cost_usd(Usage(1_000_000, 0), want)
    assert cost == pytest.approx(want.input_per_mtok)


def test_batch_price_from_the_table_or_half_the_live_one() -> None:
    # The table's own batch prices where it has them (gpt-4o's are half, as OpenAI bills).
    gpt4o = price_for(Worker(id="a", model="openai/gpt-4o"))
    assert gpt4o is not None and gpt4o.batch_input_per_mtok is not None
    assert cost_usd(Usage(1_000_000, 0), gpt4o, batch=True) == pytest.approx(
        gpt4o.batch_input_per_mtok
    )
    # A pool's price without batch prices: half; with them, those.
    plain = Price(2.0, 8.0)
    assert cost_usd(Usage(1_000_000, 1_000_000), plain, batch=True) == pytest.approx(5.0)
    own = Price(2.0, 8.0, batch_input_per_mtok=1.5, batch_output_per_mtok=6.0)
    assert cost_usd(Usage(1_000_000, 1_000_000), own, batch=True) == pytest.approx(7.5)
    assert cost_usd(Usage(1_000_000, 1_000_000), own) == pytest.approx(10.0)


def test_local_is_free() -> None:
    w = Worker(id="l", model="smollm2", client="local")
    assert cost_usd(Usage(123, 456), price_for(w)) == 0.0


def test_unknown_model_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    w = Worker(id="x", model="openai/no-such-model-for-cost-test")
    with caplog.at_level(logging.WARNING, logger="conductor"):
        assert price_for(w) is None
        assert price_for(w) is None
        assert price_for(Worker(id="y", model="openai/no-such-model-for-cost-test")) is None
    hits = [r for r in caplog.records if "no-such-model-for-cost-test" in r.getMessage()]
    assert len(hits) == 1
    assert "(worker 'x')" in hits[0].getMessage()
    assert cost_usd(Usage(10, 10), None) is None


def test_the_warning_names_the_conductor_as_the_conductor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = Worker(id="conductor", model="openai/no-such-planner-for-cost-test")
    with caplog.at_level(logging.WARNING, logger="conductor"):
        assert price_for(w) is None
    (hit,) = [r.getMessage() for r in caplog.records if "no-such-planner" in r.getMessage()]
    assert hit == (
        "no price known for model 'openai/no-such-planner-for-cost-test' (the Conductor): "
        "its cost is not counted; set price: for it in the pool file to count it"
    )


@pytest.mark.process
def test_table_is_read_without_importing_litellm() -> None:
    code = (
        "import sys, json\n"
        "from conductor.llm.cost import price_for\n"
        "from conductor.targets import Worker\n"
        "p = price_for(Worker(id='a', model='openai/gpt-4o'))\n"
        "print(json.dumps([p is not None, 'litellm' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
