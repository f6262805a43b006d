"""Anthropic's Message Batches as a :class:`~conductor.batches.api.BatchAPI`, over the
``anthropic`` SDK's ``messages.batches``.

Each line's ``params`` is the body the live call of the same request sends: the
:class:`~conductor.llm.anthropic_client.AnthropicClient`'s own keyword arguments, with
its ``extra_body`` merged in (the SDK merges it into the live body the same way), so a
batch answer is the answer the live call would get, at half the price.  It serves a
``client: anthropic`` worker and a litellm worker whose model is ``anthropic/...``
alike: the live client strips the prefix and reads the key from the same variables.

Where Anthropic differs from the common terms of :mod:`~conductor.batches.api`:

- it keeps no name for a batch, so :meth:`AnthropicBatchAPI.find` has nothing to look
  a label up by and always answers ``None``;
- it has no whole-batch failure: a request it refuses is an ``errored`` line, so a batch
  always ``ended``; it is reported ``expired`` or ``cancelled`` only when every line
  was, and otherwise ``ended``, the lines that did not run being absent from the
  results (the caller sends them again);
- an ``errored`` line carries an error body, not an HTTP status: its error type names
  the status a live call would have failed with (``rate_limit_error`` is 429,
  ``overloaded_error`` 529 ...), from which the error is built as a live call's is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ModelCallError, RetryableError
from ..llm.anthropic_client import AnthropicClient
from ..llm.apikey import resolve_api_key
from ..llm.failures import (
    classify_sdk_error,
    connection_error,
    error_for_status,
    make_error,
    network_error,
    scrub,
)
from ..llm.replies import anthropic_reply, bad_response, body_of
from ..llm.sdk import with_backstop
from ..llm.types import RawCompletion
from .api import (
    BatchEntry,
    BatchLimits,
    BatchState,
    BatchStatus,
    LineOutcome,
    chunk_entries,
)

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["ANTHROPIC_BATCH_LIMITS", "ANTHROPIC_ERROR_STATUS", "AnthropicBatchAPI"]

#: What one Message Batch may hold: 100,000 requests and 256 MB.  Anthropic does not say
#: whether its MB is 10**6 or 2**20 bytes; the smaller reading is the one always safe.
ANTHROPIC_BATCH_LIMITS = BatchLimits(max_requests=100_000, max_bytes=256_000_000)

#: The HTTP status each error type of Anthropic's stands for (as its error pages pair
#: them): an errored line is the error the live call would have raised with it.
ANTHROPIC_ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# The bytes of the creation body around its request lines: '{"requests": [' and ']}'.
_BODY_OVERHEAD = len('{"requests": []}')
# The live client's base may name the messages route (litellm takes it either way); the
# batch routes hang off the root.
_MESSAGES_ROUTE = "/v1/messages"


class AnthropicBatchAPI:
    """One worker's Message Batches: requests in, results out, over ``AsyncAnthropic``
    (retries off: the batcher decides what is asked again, and when)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.limits: BatchLimits = ANTHROPIC_BATCH_LIMITS
        self._live = AnthropicClient(worker)
        self._client: Any = None
        self._key: str | None = None

    # -- the requests ----------------------------------------------------------------------

    def _line(self, entry: BatchEntry) -> dict[str, Any]:
        """One request of the batch: the live call's body under the entry's custom id."""
        params = self._live.build_kwargs(entry.request)
        # A line has no headers of its own (only the whole batch's request has), so a
        # request's extra headers cannot travel with it; they are left out.
        params.pop("extra_headers", None)
        params.update(params.pop("extra_body", None) or {})
        return {"custom_id": entry.custom_id, "params": params}

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        """``entries`` cut into batches of at most :attr:`limits` requests and bytes.

        A line's bytes are counted as ``json.dumps`` writes it by default (spaces after
        separators, non-ASCII escaped): never fewer than the SDK sends; each line after
        the first is preceded by ``", "``."""
        return chunk_entries(
            entries,
            self.limits,
            target=self.worker.id,
            size_of=lambda entry: len(json.dumps(self._line(entry)).encode()) + 2,
            overhead=_BODY_OVERHEAD,
        )

    # -- the SDK ---------------------------------------------------------------------------

    def _sdk(self) -> Any:
        """The SDK client, made again when the key in the environment changed."""
        key = resolve_api_key(self.worker, AnthropicClient.capabilities.key_envs)
        if self._client is None or key != self._key:
            import anthropic

            base = self.worker.api_base
            if base:
                base = base.rstrip("/").removesuffix(_MESSAGES_ROUTE)
            self._client = anthropic.AsyncAnthropic(
                api_key=key,
                base_url=base or None,
                max_retries=0,
                timeout=self.worker.timeout_s,
            )
            self._key = key
        return self._client

    def _failure(self, exc: Exception) -> BaseException:
        """Our error for what the SDK raised; anything else is returned unchanged, to be
        re-raised as the bug it is."""
        import anthropic

        target, timeout_s = self.worker.id, self.worker.timeout_s
        url = str(self._client.base_url) if self._client is not None else None
        mapped = classify_sdk_error(
            exc, anthropic, target=target, timeout_s=timeout_s, key=self._key, url=url
        )
        if mapped is not exc:
            return mapped
        # While a response is being streamed the SDK's HTTP library raises its own
        # errors, unwrapped: a connection lost halfway through the results.
        if type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            lost = network_error(exc, target=target, timeout_s=timeout_s, url=url, key=self._key)
            return lost or connection_error(target, scrub(str(exc), self._key) or None, url)
        if isinstance(exc, anthropic.AnthropicError):
            # The SDK's own refusal, before any request: results asked for before the
            # batch names them.  Asking later may find them.
            return make_error(
                RetryableError, target=target, provider_message=scrub(str(exc), self._key)
            )
        return exc

    # -- BatchAPI ----------------------------------------------------------------------------

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        """Send ``entries`` as one Message Batch; ``label`` is not kept (Anthropic keeps
        no name for a batch)."""
        requests = [self._line(entry) for entry in entries]
        client = self._sdk()
        try:
            batch = await client.messages.batches.create(requests=requests)
        except Exception as exc:  # classified below; anything else is re-raised
            raise self._failure(exc) from None
        batch_id = getattr(batch, "id", None)
        if not isinstance(batch_id, str) or not batch_id:
            raise bad_response(self.worker.id, "the new Message Batch has no id")
        return batch_id

    async def status(self, batch_id: str) -> BatchStatus:
        """Where the batch stands: ``running`` until it has ended, then ``ended``
        unless every line expired or was cancelled."""
        client = self._sdk()
        try:
            batch = await with_backstop(
                client.messages.batches.retrieve(batch_id), self.worker.timeout_s
            )
        except Exception as exc:  # classified below; anything else is re-raised
            raise self._failure(exc) from None
        return self._status_of(body_of(batch, self.worker.id))

    def _status_of(self, batch: dict[str, Any]) -> BatchStatus:
        word = batch.get("processing_status")
        raw_counts = batch.get("request_counts")
        counts = raw_counts if isinstance(raw_counts, dict) else {}

        def count(name: str) -> int:
            value = counts.get(name)
            return value if isinstance(value, int) and value > 0 else 0

        names = ("processing", "succeeded", "errored", "canceled", "expired")
        total = sum(count(name) for name in names)
        state: BatchState
        if word in ("in_progress", "canceling"):
            state = "running"
        elif word == "ended":
            state = "ended"
            if total and count("expired") == total:
                state = "expired"
            elif total and count("canceled") == total:
                state = "cancelled"
        else:
            raise bad_response(self.worker.id, f"the Message Batch's processing_status is {word!r}")
        return BatchStatus(
            state,
            total=total,
            succeeded=count("succeeded"),
            failed=count("errored"),
            detail=word,
        )

    async def results(self, batch_id: str) -> list[LineOutcome]:
        """The batch's answered lines, read as the SDK streams them (a line at a time,
        never the whole file at once)."""
        client = self._sdk()
        outcomes: list[LineOutcome] = []
        try:
            async with client.messages.batches.with_streaming_response.results(
                batch_id
            ) as response:
                async for text in response.iter_lines():
                    outcome = self._outcome(text)
                    if outcome is not None:
                        outcomes.append(outcome)
        except Exception as exc:  # classified below; anything else is re-raised
            raise self._failure(exc) from None
        return outcomes

    def _outcome(self, text: str) -> LineOutcome | None:
        """One result line; ``None`` for a line that did not run (canceled, expired) or
        that cannot be read at all."""
        try:
            line = json.loads(text)
        except ValueError:
            return None
        if not isinstance(line, dict) or not isinstance(line.get("result"), dict):
            return None
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str):
            return None
        result: dict[str, Any] = line["result"]
        kind = result.get("type")
        if kind == "succeeded":
            try:
                return LineOutcome(custom_id, completion=self._reply(result.get("message")))
            except ModelCallError as exc:
                return LineOutcome(custom_id, error=exc)
        if kind == "errored":
            return LineOutcome(custom_id, error=self._line_error(result.get("error")))
        # canceled, expired, or a kind this code does not know: not run, sent again.
        return None

    def _reply(self, message: Any) -> RawCompletion:
        """A succeeded line's Message, read as the live client reads its reply (through
        the SDK's Message type, so that the body kept is the same shape)."""
        if isinstance(message, dict):
            from anthropic.types import Message

            message = body_of(Message.model_construct(**message), self.worker.id)
        return anthropic_reply(message, self.worker.id)

    def _line_error(self, body: Any) -> ModelCallError:
        """What the live call would have raised for an errored line's error body
        (``{"type": "error", "error": {"type", "message"}}``)."""
        inner = body.get("error") if isinstance(body, dict) else None
        inner = inner if isinstance(inner, dict) else {}
        kind = inner.get("type")
        message = inner.get("message")
        # A type not known here is taken for a server's error: a retry may pass.
        status = ANTHROPIC_ERROR_STATUS.get(kind, 500) if isinstance(kind, str) else 500
        text = message if isinstance(message, str) and message else f"errored ({kind})"
        return error_for_status(status, scrub(text, self._key), target=self.worker.id)

    async def find(self, label: str) -> str | None:
        """Always ``None``: Anthropic keeps no name for a batch to find it by."""
        return None

    async def cancel(self, batch_id: str) -> None:
        """Ask Anthropic to stop the batch (it is ``canceling`` until it has ended)."""
        client = self._sdk()
        try:
            await with_backstop(client.messages.batches.cancel(batch_id), self.worker.timeout_s)
        except Exception as exc:  # classified below; anything else is re-raised
            raise self._failure(exc) from None

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
