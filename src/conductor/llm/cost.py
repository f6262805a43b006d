"""What a call cost: what the server reported, else the pool's price override or
litellm's bundled price table.

A server may report a call's cost itself: a nested ``conductor serve`` in its
``x-conductor-cost-usd`` header (and its body's ``conductor.cost_usd``), OpenRouter and
others in ``usage.cost`` (USD).  That figure, read with the reply
(:func:`conductor.llm.replies.reported_cost`), is the call's cost: tokens times a price
would miss what the server's own calls cost.

The table is read straight from the JSON file inside the installed litellm package,
without importing litellm (which is slow to import), once and only when first needed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import target_name
from ..targets import Price
from .factory import capabilities_of

if TYPE_CHECKING:
    from ..targets import Worker
    from .types import Usage

__all__ = ["SpendMeter", "cost_usd", "failed_call_cost", "price_for", "price_table"]

log = logging.getLogger("conductor")

_TABLE_FILE = "model_prices_and_context_window_backup.json"
_table: dict[str, Any] | None = None
_lock = threading.Lock()
_warned: set[str] = set()
_FREE = Price(0.0, 0.0)


def price_table() -> dict[str, Any]:
    """litellm's price table (``{}`` when litellm or its file is missing)."""
    global _table
    if _table is None:
        with _lock:
            if _table is None:
                _table = _load_table()
    return _table


def _load_table() -> dict[str, Any]:
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return {}
    path = Path(spec.origin).parent / _TABLE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _entry_price(entry: Any) -> Price | None:
    if not isinstance(entry, dict):
        return None
    inp = entry.get("input_cost_per_token")
    out = entry.get("output_cost_per_token")
    if inp is None and out is None:
        return None
    # The table gives batch prices for some models; the others are at the default share.
    batch_in = entry.get("input_cost_per_token_batches")
    batch_out = entry.get("output_cost_per_token_batches")
    return Price(
        float(inp or 0.0) * 1e6,
        float(out or 0.0) * 1e6,
        None if batch_in is None else float(batch_in) * 1e6,
        None if batch_out is None else float(batch_out) * 1e6,
    )


def price_for(target: Worker) -> Price | None:
    """The price of ``target``'s model, or None when unknown (warned once per model).

    Order: the pool's ``price`` override; ``Price(0, 0)`` for in-process models (local,
    checkpoint); litellm's table by the exact model string; then without the provider
    prefix (``openai/gpt-4o`` -> ``gpt-4o``), or, for a model without one, with the
    prefix the table files its client's models under (``gemini/``, its capabilities'
    ``price_prefix``).
    """
    fixed = _fixed_price(target)
    if fixed is not None:
        return fixed
    table = price_table()
    model = target.model
    candidates = [model]
    if "/" in model:
        candidates.append(model.split("/", 1)[1])
    elif (prefix := capabilities_of(target).price_prefix) is not None:
        candidates.append(f"{prefix}{model}")
    for name in candidates:
        price = _entry_price(table.get(name))
        if price is not None:
            return price
    if model not in _warned:
        _warned.add(model)
        log.warning(
            "no price known for model %r (%s): its cost is not counted; "
            "set price: for it in the pool file to count it",
            model,
            target_name(target.id),
        )
    return None


def _fixed_price(target: Worker) -> Price | None:
    """The price known without the table: the pool's override, or free for a model that
    runs in this process."""
    if target.price is not None:
        return target.price
    if capabilities_of(target).in_process:
        return _FREE
    return None


def failed_call_cost(target: Worker) -> float | None:
    """What a call to ``target`` that failed cost: 0 for a free model (a local one, or
    one priced 0 in the pool), else unknown (a provider may bill a call that timed out).

    Unlike :func:`price_for` it never consults the table, so a failure adds no warning."""
    return 0.0 if _fixed_price(target) == _FREE else None


def cost_usd(usage: Usage, price: Price | None, *, batch: bool = False) -> float | None:
    """USD for ``usage`` at ``price`` (its batch price with ``batch``); None when the
    price is unknown."""
    if price is None:
        return None
    if batch:
        price = price.for_batch()
    return (
        usage.input_tokens * price.input_per_mtok + usage.output_tokens * price.output_per_mtok
    ) / 1e6


class SpendMeter:
    """What a run has spent, against its cap (``bench --max-usd``): ``spent`` starts at
    what its records already cost (a resumed run) and grows by each call paid for.
    Charged from the event loop's thread only."""

    def __init__(self, cap_usd: float | None, spent_usd: float = 0.0) -> None:
        self.cap_usd = cap_usd
        self.spent_usd = spent_usd

    def charge(self, usd: float | None) -> None:
        """Add a call's cost (``None``, unknown, adds nothing: a run with a cap refuses
        a target of unknown price before it starts)."""
        if usd:
            self.spent_usd += usd

    def call_refusal(self) -> str | None:
        """Why no call may be made now, or ``None``.  Here never: the cap stops new
        samples (:meth:`refusal`), and the calls of those in flight are made.  A meter
        that cannot count a call's spend says so (a Ray node's, its server lost)."""
        return None

    def refusal(self) -> str | None:
        """Why no more may be spent, or ``None``."""
        cap = self.cap_usd
        if cap is None or self.spent_usd < cap:
            return None
        return f"the run has spent ${self.spent_usd:.4f}, reaching its --max-usd ${cap:.4f}"
