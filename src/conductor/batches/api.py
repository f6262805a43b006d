"""The one interface every provider's batch API is reached through.

A batch API takes many requests at once, answers them within hours instead of seconds,
and charges half the live price (OpenAI's ``/v1/batches`` and the vLLM-style servers
that speak it, Anthropic's Message Batches, Gemini's batch mode).  A :class:`BatchAPI`
is one provider key's and one model's: it turns :class:`BatchEntry` items into the
provider's request lines, submits them as one batch, reports the batch's state, and
reads its result lines back as :class:`LineOutcome` items, each the same
:class:`~conductor.llm.types.RawCompletion` a live call of the same request returns,
or the :class:`~conductor.errors.ModelCallError` it would have raised.

What to put in a batch and when (waves), what is written to the run directory before
a submission, and what is retried are decided one level up, in
:mod:`conductor.batches.waves`: an implementation here makes no decision of its own.
Implementations: :mod:`conductor.batches.openai`, :mod:`conductor.batches.anthropic`
and :mod:`conductor.batches.google`, made by :func:`conductor.batches.batch_api`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal, Protocol, runtime_checkable

from ..errors import BadRequestError, ModelCallError
from ..llm.failures import make_error
from ..llm.types import ModelRequest, RawCompletion

__all__ = [
    "BatchAPI",
    "BatchEntry",
    "BatchLimits",
    "BatchState",
    "BatchStatus",
    "LineOutcome",
    "TERMINAL_STATES",
    "chunk_entries",
    "entry_bytes",
]


@dataclass(frozen=True)
class BatchLimits:
    """The most one batch may hold: requests, and bytes of its request lines."""

    max_requests: int
    max_bytes: int


@dataclass(frozen=True)
class BatchEntry:
    """One request of a batch: ``custom_id`` is the call's cache key (64 hex digits,
    which every provider's custom-id rule admits), by which its result line is found."""

    custom_id: str
    request: ModelRequest


#: Where a batch stands, in the providers' common terms: ``validating`` (accepted, not
#: yet started), ``running``, ``ended`` (every line has its result), ``failed`` (the
#: whole batch was refused: no line ran), ``expired`` (the completion window ran out:
#: the lines that finished have results, the others none), ``cancelled``.
BatchState = Literal["validating", "running", "ended", "failed", "expired", "cancelled"]

#: The states after which a batch changes no more: its results can be read.
TERMINAL_STATES: frozenset[BatchState] = frozenset({"ended", "failed", "expired", "cancelled"})


@dataclass(frozen=True)
class BatchStatus:
    """A batch's state and counts as the provider reports them; ``detail`` is the
    provider's own word for the state, or why the batch failed."""

    state: BatchState
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    detail: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class LineOutcome:
    """One result line: exactly one of ``completion`` (the reply, parsed as a live call's
    is) and ``error`` (what a live call would have raised for the line's error: its class
    says whether a retry may help).  A line the provider did not run (the batch expired
    or was cancelled first) has no outcome at all: :meth:`BatchAPI.results` leaves it
    out."""

    custom_id: str
    completion: RawCompletion | None = None
    error: ModelCallError | None = None

    def __post_init__(self) -> None:
        if (self.completion is None) == (self.error is None):
            raise ValueError("a LineOutcome holds exactly one of completion and error")


@runtime_checkable
class BatchAPI(Protocol):
    """One provider key's and one model's batch API."""

    limits: BatchLimits

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        """``entries`` cut into batches within :attr:`limits`, in order (one chunk when
        they fit; an entry too large for any batch raises ``BadRequestError``)."""
        ...

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        """Submit ``entries`` (one chunk) as one batch labelled ``label`` (a name of
        ours, kept by the provider where it keeps one: metadata or a display name);
        return the provider's batch id.  Raise a ``ModelCallError`` subclass when the
        submission fails."""
        ...

    async def status(self, batch_id: str) -> BatchStatus:
        """Where the batch stands now."""
        ...

    async def results(self, batch_id: str) -> list[LineOutcome]:
        """The result lines of a batch in a terminal state, in any order.  A line the
        provider did not run (an expired, cancelled or failed batch) is absent: the
        caller sends again what it does not find.  A line that is not one of ours (an
        unknown custom id) or that cannot be read at all is left out too (it is then
        sent again); a reply that can be read but is broken is an ``error``, as the
        live call's would be."""
        ...

    async def find(self, label: str) -> str | None:
        """The id of a batch submitted with ``label``, where the provider lists batches
        with their labels (a submission whose id was never recorded: the process was
        killed between sending it and writing the answer down); ``None`` otherwise."""
        ...

    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch (lines already answered keep results)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


#: What a request line holds besides the request itself (ids, model, the envelope).
_LINE_OVERHEAD = 1024


def entry_bytes(entry: BatchEntry) -> int:
    """About how many bytes ``entry``'s request line takes: its request as JSON, plus
    :data:`_LINE_OVERHEAD`.  The providers' byte limits are far above any one
    request's, so each implementation's :class:`BatchLimits` keeps a margin below its
    provider's instead of building every line twice."""
    request = entry.request
    payload = {
        "messages": list(request.messages),
        "params": request.params,
        "grammar": request.grammar,
        "response_format": request.response_format,
        "tools": [asdict(t) for t in request.tools],
    }
    text = json.dumps(payload, ensure_ascii=False, default=str)
    return len(text.encode()) + len(entry.custom_id) + _LINE_OVERHEAD


def chunk_entries(
    entries: Sequence[BatchEntry],
    limits: BatchLimits,
    *,
    target: str | None,
    size_of: Callable[[BatchEntry], int] = entry_bytes,
    overhead: int = 0,
) -> list[list[BatchEntry]]:
    """``entries`` cut in order into batches within ``limits`` (as many requests and
    bytes as a batch may hold: ``size_of`` each entry, ``overhead`` a batch's own
    bytes); an entry too large for any batch raises ``BadRequestError`` naming
    ``target``."""
    room = limits.max_bytes - overhead
    chunks: list[list[BatchEntry]] = []
    current: list[BatchEntry] = []
    size = 0
    for entry in entries:
        need = size_of(entry)
        if need > room:
            raise make_error(
                BadRequestError,
                target=target,
                provider_message=f"a request of {need:,} bytes is larger than a batch may "
                f"be ({limits.max_bytes:,} bytes)",
            )
        if current and (len(current) >= limits.max_requests or size + need > room):
            chunks.append(current)
            current, size = [], 0
        current.append(entry)
        size += need
    if current:
        chunks.append(current)
    return chunks
