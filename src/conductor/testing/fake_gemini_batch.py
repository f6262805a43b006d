"""The fake server's Gemini batch mode: ``models/{model}:batchGenerateContent`` and the
``batches`` resource, as the Gemini Developer API serves them to google-genai.

A batch is created from inline requests only (``batch.inputConfig.requests.requests``,
each a ``generateContent`` request with its ``metadata``), under ``displayName``, the
label the engine keeps.  Every answer is a long-running ``Operation`` named
``batches/{id}`` whose ``metadata`` is the batch (``GenerateContentBatch``: model,
display name, times, ``batchStats`` with its counts as int64 strings, and ``state``, a
``BATCH_STATE_*`` word); once the batch is done the operation says so (``done``) and
carries the answers both as ``metadata.output`` (which the SDK reads) and as its
``response``: ``inlinedResponses.inlinedResponses``, one per answered line in the
order of the requests, each a ``generateContent`` body or an ``error`` (a
``google.rpc.Status``: its gRPC code number and message), with the line's ``metadata``
echoed.  A failed batch has the operation's ``error`` and no answers; an expired one
answers only the lines that ran, a cancelled one none.  Gemini has no word for a batch
being cancelled: it stays ``BATCH_STATE_RUNNING`` until its status is next read.

Routes (under ``/v1beta/``, where Gemini documents batch mode, and ``/v1alpha/``; not
under ``/v1/``, google-genai 3's default, since ``/v1/batches`` is OpenAI's on this
server: a client asks for ``api_version="v1beta"``):
``POST models/{model}:batchGenerateContent``
(over :attr:`GeminiBatchRoutes.gemini_inline_limit_bytes` of body: 400, as the API
answers a request over its 20 MB), ``GET batches/{id}`` (a status read: logged as
``status``, or as ``results`` once the batch has ended, since the read then carries the
answers), ``GET batches`` (newest first, ``pageSize``/``pageToken``),
``POST batches/{id}:cancel`` and ``DELETE batches/{id}``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Literal

from aiohttp import web

from .fake_batch import BatchBase, BatchLine, BatchOperation, FakeBatch, FakeBatchState
from .fake_script import Reply
from .fake_wire import broken_reply, finish_word, gemini_response, gemini_status

__all__ = [
    "GEMINI_INLINE_LIMIT_BYTES",
    "GEMINI_LIST_PAGE",
    "GEMINI_LIST_PAGE_MAX",
    "GeminiBatchRoutes",
]

#: The most bytes of inline requests one batch may carry: Gemini's 20 MB (the API's
#: request size limit, 20971520 bytes).
GEMINI_INLINE_LIMIT_BYTES = 20 * 1024 * 1024

#: ``batches.list``'s page size when none is asked for, and the most one page holds
#: (Google documents neither; these are the fake's own).
GEMINI_LIST_PAGE = 50
GEMINI_LIST_PAGE_MAX = 1000

# The API versions batch mode is served under: v1beta, where the API reference documents
# it (and conductor.batches.google asks), and v1alpha.  google-genai 3 sends /v1/ by
# default, but /v1/batches is OpenAI's on this server.
_VERSION = "{version:v1beta|v1alpha}"

# The engine's states in Gemini's words; a batch being cancelled is still running.
_STATES: dict[FakeBatchState, str] = {
    "validating": "BATCH_STATE_PENDING",
    "in_progress": "BATCH_STATE_RUNNING",
    "cancelling": "BATCH_STATE_RUNNING",
    "ended": "BATCH_STATE_SUCCEEDED",
    "expired": "BATCH_STATE_EXPIRED",
    "failed": "BATCH_STATE_FAILED",
    "cancelled": "BATCH_STATE_CANCELLED",
}

_TYPES = "type.googleapis.com/google.ai.generativelanguage.v1beta."
_NOT_FOUND = "Requested entity was not found."


class GeminiBatchRoutes(BatchBase):
    """Gemini's batch mode over the batch engine (see the module's docstring)."""

    #: The most bytes a ``batchGenerateContent`` request may carry (settable, so that
    #: a test of chunking need not send 20 MB).
    gemini_inline_limit_bytes: int = GEMINI_INLINE_LIMIT_BYTES
    #: Whether an answer carries its request's ``metadata`` back, as the API reference
    #: says it does; ``False`` plays a backend seen not to (python-genai issue #2008),
    #: for a client that must then match answers to requests by their order.
    gemini_echo_metadata: bool = True
    #: The most batches one page of ``batches.list`` holds, whatever is asked for
    #: (settable, so that a test of paging need not make a thousand batches).
    gemini_list_page_max: int = GEMINI_LIST_PAGE_MAX

    def _batch_routes(self, app: web.Application) -> None:
        super()._batch_routes(app)
        app.router.add_post(
            f"/{_VERSION}/models/{{model}}:batchGenerateContent", self._gemini_batch_create
        )
        app.router.add_get(f"/{_VERSION}/batches", self._gemini_batch_list)
        app.router.add_get(f"/{_VERSION}/batches/{{batch}}", self._gemini_batch_get)
        app.router.add_post(f"/{_VERSION}/batches/{{batch}}:cancel", self._gemini_batch_cancel)
        app.router.add_delete(f"/{_VERSION}/batches/{{batch}}", self._gemini_batch_delete)

    # -- the routes ------------------------------------------------------------------------

    async def _gemini_batch_create(self, request: web.Request) -> web.Response:
        api_key, refused = self._batch_intake(request, "gemini", "create")
        if refused is not None:
            return refused
        raw = await request.read()
        limit = self.gemini_inline_limit_bytes
        if len(raw) > limit:
            return self._error(
                "gemini", 400, f"Request payload size exceeds the limit: {limit} bytes.", {}
            )
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return self._error("gemini", 400, f"Invalid JSON payload received: {exc}", {})
        parsed = _read_batch(body)
        if isinstance(parsed, str):
            return self._error("gemini", 400, parsed, {})
        label, items = parsed
        model = request.match_info["model"]
        lines = [
            BatchLine(custom_id=_line_key(metadata, index), model=model, body=inner)
            for index, (inner, metadata) in enumerate(items)
        ]
        batch = self._batch_make(
            "gemini",
            "",
            lines,
            label=label,
            api_key=api_key,
            extra={"metadata": [metadata for _, metadata in items]},
        )
        return web.json_response(self._gemini_operation(batch))

    async def _gemini_batch_get(self, request: web.Request) -> web.Response:
        batch = self._batch_find(request.match_info["batch"])
        # A read of an ended batch carries its answers: the results read of this API.
        operation: BatchOperation = "results" if batch is not None and batch.terminal else "status"
        _, refused = self._batch_intake(
            request, "gemini", operation, batch.id if batch is not None else None
        )
        if refused is not None:
            return refused
        if batch is None:
            return self._error("gemini", 404, _NOT_FOUND, {})
        await self._batch_poll(batch)
        return web.json_response(self._gemini_operation(batch))

    async def _gemini_batch_list(self, request: web.Request) -> web.Response:
        _, refused = self._batch_intake(request, "gemini", "list")
        if refused is not None:
            return refused
        listed = self._batch_list("gemini")
        size_text = request.query.get("pageSize", "")
        try:
            size = int(size_text) if size_text else 0
        except ValueError:
            size = -1
        if size < 0:
            return self._error("gemini", 400, f"Invalid page size: {size_text!r}.", {})
        size = min(size or GEMINI_LIST_PAGE, self.gemini_list_page_max)
        # A page token is the id of the first batch of the next page: batches made
        # meanwhile (listed first) do not shift the pages still to come.
        token = request.query.get("pageToken", "")
        start = 0
        if token:
            ids = [b.id for b in listed]
            if token not in ids:
                return self._error("gemini", 400, "Invalid page token.", {})
            start = ids.index(token)
        page = listed[start : start + size]
        body: dict[str, Any] = {}
        # As the API writes JSON: an empty list is left out.
        if page:
            body["operations"] = [self._gemini_operation(b) for b in page]
        if start + size < len(listed):
            body["nextPageToken"] = listed[start + size].id
        return web.json_response(body)

    async def _gemini_batch_cancel(self, request: web.Request) -> web.Response:
        return await self._gemini_batch_change(request, "cancel")

    async def _gemini_batch_delete(self, request: web.Request) -> web.Response:
        return await self._gemini_batch_change(request, "delete")

    async def _gemini_batch_change(
        self, request: web.Request, operation: Literal["cancel", "delete"]
    ) -> web.Response:
        """A cancellation or deletion: both answer an empty object."""
        batch = self._batch_find(request.match_info["batch"])
        _, refused = self._batch_intake(
            request, "gemini", operation, batch.id if batch is not None else None
        )
        if refused is not None:
            return refused
        if batch is None:
            return self._error("gemini", 404, _NOT_FOUND, {})
        if operation == "cancel":
            self._batch_cancel(batch)
        else:
            self._batch_drop(batch)
        return web.json_response({})

    # -- the wire shapes -------------------------------------------------------------------

    def _gemini_operation(self, batch: FakeBatch) -> dict[str, Any]:
        """``batch`` as the long-running operation every batch route answers with."""
        name = f"batches/{batch.id}"
        answers = self._gemini_answers(batch) if batch.terminal else []
        succeeded = sum("response" in a for a in answers)
        failed = sum("error" in a for a in answers)
        resource: dict[str, Any] = {
            "@type": _TYPES + "GenerateContentBatch",
            "model": f"models/{batch.model}",
            "displayName": batch.label or "",
            "name": name,
            "createTime": _timestamp(batch.created_at),
            "updateTime": _timestamp(batch.ended_at or batch.created_at),
            "batchStats": {
                "requestCount": str(len(batch.lines)),
                "successfulRequestCount": str(succeeded),
                "failedRequestCount": str(failed),
                "pendingRequestCount": str(0 if batch.terminal else len(batch.lines)),
            },
            "state": _STATES[batch.state],
        }
        operation: dict[str, Any] = {"name": name, "metadata": resource}
        if not batch.terminal:
            return operation
        resource["endTime"] = _timestamp(batch.ended_at or batch.created_at)
        operation["done"] = True
        if batch.state == "failed":
            operation["error"] = gemini_status(400, batch.plan.message)
            return operation
        if not answers:
            return operation  # cancelled, or expired before any line ran: no output
        output: dict[str, Any] = {"inlinedResponses": {"inlinedResponses": answers}}
        resource["output"] = output
        operation["response"] = {"@type": _TYPES + "GenerateContentBatchOutput", **output}
        return operation

    def _gemini_answers(self, batch: FakeBatch) -> list[dict[str, Any]]:
        """The answered lines of an ended batch, in the order of its requests."""
        metadata: list[dict[str, str]] = batch.extra.get("metadata", [])
        answers: list[dict[str, Any]] = []
        for index, line in enumerate(batch.lines):
            outcome = line.outcome
            if outcome is None:
                continue  # never ran (expired, cancelled): no answer at all
            answer: dict[str, Any] = {}
            if isinstance(outcome, Reply):
                prompt, completion = line.usage
                answer["response"] = gemini_response(
                    line.model,
                    f"{batch.id}-{index}",  # the same on every read
                    outcome.text,
                    finish=finish_word("gemini", outcome.finish_reason),
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                )
            elif outcome.shape is not None and line.request is not None:
                # A reply of a broken shape, as the live route serves it.
                answer["response"] = broken_reply(
                    "gemini", outcome.shape, line.request, f"{batch.id}-{index}"
                )
            else:
                answer["error"] = gemini_status(outcome.status or 500, outcome.message)
            if self.gemini_echo_metadata and index < len(metadata) and metadata[index]:
                answer["metadata"] = metadata[index]
            answers.append(answer)
        return answers


def _read_batch(body: Any) -> tuple[str, list[tuple[dict[str, Any], dict[str, str]]]] | str:
    """The display name and the inline (request, metadata) items of a
    ``batchGenerateContent`` body; or why it is refused."""
    batch = body.get("batch") if isinstance(body, dict) else None
    if not isinstance(batch, dict):
        return "batch is required."
    label = batch.get("displayName")
    if not isinstance(label, str) or not label:
        return "batch.display_name is required."
    source = batch.get("inputConfig")
    if isinstance(source, dict) and "fileName" in source:
        return "the fake server serves inline requests only, not batch.input_config.file_name."
    requests = source.get("requests") if isinstance(source, dict) else None
    listed = requests.get("requests") if isinstance(requests, dict) else None
    if not isinstance(listed, list) or not listed:
        return "batch.input_config.requests.requests must hold at least one request."
    items: list[tuple[dict[str, Any], dict[str, str]]] = []
    for index, item in enumerate(listed):
        inner = item.get("request") if isinstance(item, dict) else None
        contents = inner.get("contents") if isinstance(inner, dict) else None
        if not isinstance(inner, dict) or not isinstance(contents, list) or not contents:
            return f"batch.input_config.requests.requests[{index}].request.contents is required."
        metadata = item.get("metadata")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            return f"batch.input_config.requests.requests[{index}].metadata must map to strings."
        items.append((inner, metadata))
    return label, items


def _line_key(metadata: dict[str, str], index: int) -> str:
    """The custom id a line is logged under: its metadata's ``key`` (the name clients
    give a line's id, after the JSONL input's ``key``), else its position."""
    return metadata.get("key") or str(index)


def _timestamp(epoch: float) -> str:
    """An RFC 3339 time in UTC, as Google's JSON writes a ``Timestamp``."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
