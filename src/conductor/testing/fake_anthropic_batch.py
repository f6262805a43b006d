"""The fake server's Anthropic Message Batches API, at ``anthropic_base``.

- ``POST /v1/messages/batches`` takes ``{"requests": [{"custom_id", "params"}]}`` and
  answers the new ``MessageBatch``.  It checks what Anthropic checks before it accepts
  a batch: at least one request and at most :attr:`AnthropicBatchRoutes.
  anthropic_batch_max_requests` (100,000), a body of at most
  :attr:`~AnthropicBatchRoutes.anthropic_batch_max_bytes` (256 MB; a 413
  ``request_too_large``), each custom id 1 to 64 of ``[a-zA-Z0-9_-]`` and unique, and
  each ``params`` an object naming a ``model``, ``max_tokens`` and ``messages`` (a 400
  ``invalid_request_error`` naming the field, in pydantic's words as Anthropic's are).
- ``GET /v1/messages/batches/{id}`` reads a batch's status: the read that moves it
  (:mod:`~conductor.testing.fake_batch`).
- ``GET /v1/messages/batches`` lists them newest first, a page of ``limit`` (default
  20, 1 to 1000) after ``after_id`` or before ``before_id``, with ``has_more``,
  ``first_id`` and ``last_id`` as the SDK's ``AsyncPage`` reads them.
- ``POST /v1/messages/batches/{id}/cancel`` asks to stop one (``canceling`` until its
  status is next read); a batch that has ended is answered unchanged.
- ``GET /v1/messages/batches/{id}/results`` streams the result lines as JSON Lines,
  once the batch has ended (a 404 before); ``results_url`` names it.

The engine's states in Anthropic's words: ``validating`` and ``in_progress`` are both
``in_progress`` (Anthropic has no validation step it reports), ``cancelling`` is
``canceling``, and every end is ``ended``, its ``request_counts`` saying how: a line
answered by a :class:`~conductor.testing.Reply` ``succeeded`` (its Message built as a
live reply's is), by a :class:`~conductor.testing.Fault` ``errored`` (the fault's
status in Anthropic's error body; a fault of a broken shape is a ``succeeded`` line
carrying that broken Message, and one with no error status, a reset or a hang, an
``api_error``), a line left unanswered ``expired`` or ``canceled``.  Anthropic has no
whole-batch failure: the engine's ``failed`` ending is every line ``errored`` with an
``invalid_request_error`` carrying the plan's message, as Anthropic errors the lines
whose params it refuses.  Anthropic keeps no name for a batch, so
:attr:`~conductor.testing.FakeBatch.label` is ``None``.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from .fake_anthropic import anthropic_message
from .fake_batch import BatchBase, BatchLine, BatchOperation, FakeBatch
from .fake_script import Fault, Reply
from .fake_wire import broken_reply, error_payload

__all__ = ["AnthropicBatchRoutes"]

_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CUSTOM_ID_RULE = "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"
#: A batch's results are kept, and its end comes at the latest, 24 hours after it is made.
_EXPIRY_S = 24 * 3600.0
_LIST_DEFAULT, _LIST_MAX = 20, 1000
#: What each end leaves a line nobody answered.
_UNANSWERED = {"expired": "expired", "cancelled": "canceled", "failed": "errored"}


class _Refused(Exception):
    """A batch request Anthropic refuses: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _time(epoch: float | None) -> str | None:
    """An RFC 3339 time in UTC, as Anthropic writes them (``...Z``)."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def _result_type(batch: FakeBatch, line: BatchLine) -> str:
    """How a line of an ended batch ended, in Anthropic's words."""
    if isinstance(line.outcome, Reply):
        return "succeeded"
    if isinstance(line.outcome, Fault):
        return "succeeded" if line.outcome.shape is not None else "errored"
    return _UNANSWERED.get(batch.state, "expired")


class AnthropicBatchRoutes(BatchBase):
    """Anthropic's Message Batches API over the shared batch engine."""

    #: The most requests one batch may hold (a test may lower it on its server).
    anthropic_batch_max_requests: int = 100_000
    #: The most bytes one creation's body may hold (Anthropic's 256 MB).
    anthropic_batch_max_bytes: int = 256_000_000

    def _batch_routes(self, app: web.Application) -> None:
        super()._batch_routes(app)
        base = "/v1/messages/batches"
        app.router.add_post(base, self._anthropic_batch_create)
        app.router.add_get(base, self._anthropic_batch_list)
        app.router.add_get(base + "/{batch_id}", self._anthropic_batch_status)
        app.router.add_post(base + "/{batch_id}/cancel", self._anthropic_batch_cancel)
        app.router.add_get(base + "/{batch_id}/results", self._anthropic_batch_results)

    # -- routes --------------------------------------------------------------------------

    async def _anthropic_batch_create(self, request: web.Request) -> web.StreamResponse:
        api_key, error = self._batch_intake(request, "anthropic", "create")
        if error is not None:
            return error
        try:
            raw = await self._anthropic_body(request)
            lines = self._anthropic_lines(raw)
        except _Refused as refused:
            return self._error("anthropic", refused.status, refused.message, {})
        batch = self._batch_make("anthropic", "msgbatch_", lines, label=None, api_key=api_key)
        return self._anthropic_batch_reply(request, batch)

    async def _anthropic_batch_status(self, request: web.Request) -> web.StreamResponse:
        batch = self._anthropic_batch_of(request, "status")
        if isinstance(batch, web.Response):
            return batch
        await self._batch_poll(batch)
        return self._anthropic_batch_reply(request, batch)

    async def _anthropic_batch_cancel(self, request: web.Request) -> web.StreamResponse:
        batch = self._anthropic_batch_of(request, "cancel")
        if isinstance(batch, web.Response):
            return batch
        with self._lock:
            asked_now = not batch.terminal and not batch.cancel_asked
        self._batch_cancel(batch)
        if asked_now:
            with self._lock:
                batch.extra["cancel_initiated_at"] = time.time()
        return self._anthropic_batch_reply(request, batch)

    async def _anthropic_batch_list(self, request: web.Request) -> web.StreamResponse:
        _, error = self._batch_intake(request, "anthropic", "list")
        if error is not None:
            return error
        try:
            page, has_more = self._anthropic_page(request.query)
        except _Refused as refused:
            return self._error("anthropic", refused.status, refused.message, {})
        with self._lock:
            data = [self._anthropic_batch_object(request, b) for b in page]
        return web.json_response(
            {
                "data": data,
                "has_more": has_more,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def _anthropic_batch_results(self, request: web.Request) -> web.StreamResponse:
        batch = self._anthropic_batch_of(request, "results")
        if isinstance(batch, web.Response):
            return batch
        with self._lock:
            ended = batch.terminal
        if not ended:
            message = f"Message Batch {batch.id} has not ended: its results are not ready"
            return self._error("anthropic", 404, message, {})
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/binary"})
        await response.prepare(request)
        # One write per line: the client reads a stream, as it would a large file.
        for line in self._anthropic_results(batch):
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
        return response

    # -- the parts -----------------------------------------------------------------------

    def _anthropic_batch_of(
        self, request: web.Request, operation: BatchOperation
    ) -> FakeBatch | web.Response:
        """The batch a request's path names, or the error to answer."""
        batch_id = request.match_info["batch_id"]
        _, error = self._batch_intake(request, "anthropic", operation, batch_id)
        if error is not None:
            return error
        batch = self._batch_find(batch_id)
        if batch is None or batch.protocol != "anthropic":
            return self._error("anthropic", 404, f"Message Batch {batch_id} not found.", {})
        return batch

    async def _anthropic_body(self, request: web.Request) -> dict[str, Any]:
        """The creation's JSON body, read no further than the size limit (read in
        pieces, so that the limit is Anthropic's and not the web framework's)."""
        limit = self.anthropic_batch_max_bytes
        raw = bytearray()
        async for piece in request.content.iter_chunked(1 << 20):
            raw += piece
            if len(raw) > limit:
                raise _Refused(413, f"Request exceeds the maximum size of {limit} bytes.")
        try:
            body = json.loads(bytes(raw))
        except ValueError as exc:
            raise _Refused(400, f"Invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise _Refused(400, "Input should be a valid dictionary")
        return body

    def _anthropic_lines(self, body: dict[str, Any]) -> list[BatchLine]:
        """The batch's lines, checked as Anthropic checks them."""
        requests = body.get("requests")
        if not isinstance(requests, list):
            what = "Field required" if requests is None else "Input should be a valid list"
            raise _Refused(400, f"requests: {what}")
        most = self.anthropic_batch_max_requests
        if not 1 <= len(requests) <= most:
            bound = "at least 1 item" if not requests else f"at most {most} items"
            raise _Refused(
                400,
                f"requests: List should have {bound} after validation, not {len(requests)}",
            )
        lines: list[BatchLine] = []
        seen: set[str] = set()
        for n, item in enumerate(requests):
            where = f"requests.{n}"
            if not isinstance(item, dict):
                raise _Refused(400, f"{where}: Input should be a valid dictionary")
            custom_id = item.get("custom_id")
            if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
                raise _Refused(400, f"{where}.custom_id: {_CUSTOM_ID_RULE}")
            if custom_id in seen:
                raise _Refused(
                    400, f"{where}.custom_id: custom_id {custom_id!r} is not unique in the batch"
                )
            seen.add(custom_id)
            params = item.get("params")
            if not isinstance(params, dict):
                raise _Refused(400, f"{where}.params: Field required")
            for name in ("model", "max_tokens", "messages"):
                if name not in params:
                    raise _Refused(400, f"{where}.params.{name}: Field required")
            lines.append(BatchLine(custom_id, str(params["model"]), params))
        return lines

    def _anthropic_page(self, query: Any) -> tuple[list[FakeBatch], bool]:
        """One page of the listing (newest first) and whether more lie beyond it, in
        the direction of the cursor given."""
        try:
            limit = int(query.get("limit", _LIST_DEFAULT))
        except ValueError:
            raise _Refused(400, "limit: Input should be a valid integer") from None
        if not 1 <= limit <= _LIST_MAX:
            raise _Refused(400, f"limit: Input should be between 1 and {_LIST_MAX}")
        before, after = query.get("before_id"), query.get("after_id")
        if before and after:
            raise _Refused(400, "Only one of before_id and after_id may be given")
        listed = self._batch_list("anthropic")
        ids = [b.id for b in listed]
        cursor = before or after
        if cursor and cursor not in ids:
            raise _Refused(400, f"Invalid cursor: no Message Batch {cursor}")
        if before:
            end = ids.index(before)
            start = max(0, end - limit)
            return listed[start:end], start > 0
        start = ids.index(after) + 1 if after else 0
        return listed[start : start + limit], start + limit < len(listed)

    def _anthropic_batch_reply(self, request: web.Request, batch: FakeBatch) -> web.Response:
        with self._lock:
            return web.json_response(self._anthropic_batch_object(request, batch))

    def _anthropic_batch_object(self, request: web.Request, batch: FakeBatch) -> dict[str, Any]:
        """The ``MessageBatch`` object for ``batch`` now (the caller holds the lock)."""
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        ended = batch.terminal
        if ended:
            for line in batch.lines:
                counts[_result_type(batch, line)] += 1
        else:
            # Anthropic counts every request as processing until the whole batch ends.
            counts["processing"] = len(batch.lines)
        status = "ended" if ended else "canceling" if batch.state == "cancelling" else "in_progress"
        origin = f"{request.scheme}://{request.host}"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "created_at": _time(batch.created_at),
            "ended_at": _time(batch.ended_at) if ended else None,
            "expires_at": _time(batch.created_at + _EXPIRY_S),
            "cancel_initiated_at": _time(batch.extra.get("cancel_initiated_at")),
            "archived_at": None,
            "results_url": f"{origin}/v1/messages/batches/{batch.id}/results" if ended else None,
        }

    def _anthropic_results(self, batch: FakeBatch) -> list[dict[str, Any]]:
        """The result lines of an ended batch, made once (a Message keeps its id however
        often the results are read)."""
        with self._lock:
            made: list[dict[str, Any]] | None = batch.extra.get("results")
            if made is None:
                made = [self._anthropic_result(batch, line) for line in batch.lines]
                batch.extra["results"] = made
            return made

    def _anthropic_result(self, batch: FakeBatch, line: BatchLine) -> dict[str, Any]:
        outcome = line.outcome
        kind = _result_type(batch, line)
        result: dict[str, Any] = {"type": kind}
        if isinstance(outcome, Reply):
            result["message"] = anthropic_message(
                line.model, outcome, self._new_id("msg_"), line.usage
            )
        elif isinstance(outcome, Fault) and outcome.shape is not None:
            assert line.request is not None
            result["message"] = broken_reply(
                "anthropic", outcome.shape, line.request, self._new_id("msg_")
            )
        elif isinstance(outcome, Fault):
            status = outcome.status if outcome.status >= 400 else 500
            result["error"] = error_payload("anthropic", status, outcome.message)
        elif kind == "errored":
            result["error"] = error_payload("anthropic", 400, batch.plan.message)
        return {"custom_id": line.custom_id, "result": result}
