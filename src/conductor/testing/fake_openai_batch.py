"""The fake server's OpenAI Files and Batch APIs (``/v1/files``, ``/v1/batches``), over
the batch engine of ``fake_batch``.

A client uploads its requests as a JSONL file (``POST /v1/files``, multipart, with
``purpose=batch``), each line ``{custom_id, method: "POST", url:
"/v1/chat/completions", body}``, then makes a batch of the file (``POST /v1/batches``
with ``input_file_id``, ``endpoint``, ``completion_window: "24h"`` and ``metadata``).
The batch moves as the engine's plan says, at each read of it (``GET
/v1/batches/{id}``); once it ends, its result lines are two files, as OpenAI writes
them: the *output file* holds the lines answered with status 200 (``{id, custom_id,
response: {status_code, request_id, body: <chat.completion>}, error: null}``), the
*error file* the lines answered with an error status (the provider's error body in
``response.body``) and the lines never run (``response: null, error: {code:
"batch_expired" | "batch_cancelled", message}``).  Either file is made only when it
has a line, and both are read with ``GET /v1/files/{id}/content``.

An input file is checked as OpenAI checks it, while the batch validates: a file that
is empty, too large, has too many lines, or a line that is not JSON, lacks a
``custom_id`` or repeats one, names another URL than the batch's endpoint, or another
model than the lines before it, makes the batch ``failed`` at its first read, its
``errors.data`` naming each line and why; such a batch takes none of the test's
plans.  What the request itself must be (a known file, ``24h``, small metadata) is
refused at once with a 400 or 404.  The limits are attributes (50,000 requests and
200 MB, OpenAI's), so a test may lower them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .fake_batch import BatchBase, BatchLine, BatchOperation, BatchPlan, FakeBatch
from .fake_openai import ChatAnswer
from .fake_script import Fault, Reply
from .fake_wire import broken_reply, error_payload

__all__ = ["BATCH_ENDPOINT", "LABEL_KEY", "OpenAIBatchRoutes", "StoredFile"]

#: The one endpoint the fake server runs batches of.
BATCH_ENDPOINT = "/v1/chat/completions"

#: The metadata key conductor's batch client names its batches with
#: (:mod:`conductor.batches.openai`): its value is the batch's
#: :attr:`~conductor.testing.FakeBatch.label`.
LABEL_KEY = "conductor_label"

# Every endpoint OpenAI batches (the SDK's BatchCreateParams): another is refused as
# OpenAI refuses it, one of these but ours as one the fake server does not run.
_ENDPOINTS = frozenset(
    {
        "/v1/responses",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/completions",
        "/v1/moderations",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/videos",
    }
)
_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
_WINDOW_S = 24 * 3600
# OpenAI's limits on one upload and on metadata (its API reference).
_MAX_UPLOAD_BYTES = 512 * 1024 * 1024
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512
# How many line errors a failed batch lists at most.
_MAX_ERRORS = 100
# The engine's states in OpenAI's words (an ended batch whose files are not yet written
# is still finalizing).
_WORDS = {
    "validating": "validating",
    "in_progress": "in_progress",
    "ended": "completed",
    "expired": "expired",
    "failed": "failed",
    "cancelling": "cancelling",
    "cancelled": "cancelled",
}
_NOT_RUN = {
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": (
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
}


@dataclass(frozen=True)
class StoredFile:
    """A file the fake server holds: an upload, or a batch's output or error file."""

    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def info(self) -> dict[str, Any]:
        """The file as OpenAI's File object describes it."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.created_at + 30 * 24 * 3600 if "batch" in self.purpose else None,
            "status_details": None,
        }


def _refusal(status: int, message: str, *, code: str | None = None) -> web.Response:
    """An OpenAI error body refusing a Files or Batch API request (the shared
    vocabulary calls every 404 a missing model; here it is a missing file or batch)."""
    etype = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return web.json_response(body, status=status)


def _line_error(
    code: str, message: str, line: int | None, param: str | None = None
) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def read_input(
    content: bytes, endpoint: str, *, max_requests: int, max_bytes: int
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The lines of a batch input file, or the errors (OpenAI's ``BatchError`` objects,
    ``line`` 1-based) that fail the batch.  Blank lines are skipped."""
    if not content.strip():
        return [], [_line_error("empty_file", "The batch input file is empty.", None)]
    if len(content) > max_bytes:
        message = (
            f"The batch input file is larger than the {max_bytes} maximum. Please try "
            "again with a smaller batch."
        )
        return [], [_line_error("file_too_large", message, None)]
    rows = [(n, raw) for n, raw in enumerate(content.split(b"\n"), 1) if raw.strip()]
    if len(rows) > max_requests:
        message = (
            f"The batch input file has {len(rows)} requests, more than the "
            f"{max_requests} maximum per batch."
        )
        return [], [_line_error("too_many_tasks", message, None)]
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in rows:
        try:
            item = json.loads(raw)
            if not isinstance(item, dict):
                raise ValueError("not an object")
        except ValueError:
            errors.append(
                _line_error(
                    "invalid_json_line", "This line is not parseable as valid JSON.", number
                )
            )
            continue
        problem = _line_problem(item, endpoint, seen, model)
        if problem is not None:
            errors.append({**problem, "line": number})
            continue
        custom_id, body = item["custom_id"], item["body"]
        seen.add(custom_id)
        model = model or body["model"]
        lines.append(BatchLine(custom_id=custom_id, model=body["model"], body=body))
    return ([] if errors else lines), errors[:_MAX_ERRORS]


def _line_problem(
    item: dict[str, Any], endpoint: str, seen: set[str], model: str | None
) -> dict[str, Any] | None:
    """What is wrong with one parsed input line, as a ``BatchError`` (no line number)."""
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _line_error(
            "missing_required_parameter",
            "Missing required parameter: 'custom_id'.",
            None,
            "custom_id",
        )
    if custom_id in seen:
        return _line_error(
            "duplicate_custom_id",
            "The custom_id for this request is a duplicate of another request. The "
            "custom_id parameter must be unique for each request in a batch.",
            None,
            "custom_id",
        )
    if item.get("method") != "POST":
        return _line_error(
            "invalid_method", "The method of each request must be 'POST'.", None, "method"
        )
    if item.get("url") != endpoint:
        return _line_error(
            "url_mismatch",
            f"The URL provided for this request does not match the batch endpoint {endpoint}.",
            None,
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return _line_error(
            "missing_required_parameter", "Missing required parameter: 'body'.", None, "body"
        )
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _line_error(
            "missing_required_parameter", "Missing required parameter: 'model'.", None, "body.model"
        )
    if model is not None and body["model"] != model:
        return _line_error(
            "model_mismatch",
            f"The model {body['model']!r} does not match the model {model!r} of the lines "
            "before it: every request of a batch must use the same model.",
            None,
            "body.model",
        )
    return None


class OpenAIBatchRoutes(BatchBase):
    """The fake server's OpenAI Files and Batch API routes."""

    #: The most requests, and bytes of JSONL, one batch's input file may hold.
    openai_batch_max_requests: int = 50_000
    openai_batch_max_bytes: int = 200 * 1024 * 1024

    def __init__(self, expected_api_key: str | None = None, latency_s: float = 0.0) -> None:
        super().__init__(expected_api_key=expected_api_key, latency_s=latency_s)
        self._openai_files: dict[str, StoredFile] = {}

    # -- the test's side -----------------------------------------------------------------

    def openai_file(self, file_id: str) -> StoredFile:
        """The file ``file_id`` (an upload, an output or an error file); ``KeyError``
        when there is none."""
        with self._lock:
            return self._openai_files[file_id]

    def replace_openai_file(self, file_id: str, content: bytes) -> None:
        """Serve ``content`` as the file ``file_id`` from now on (a test's torn or
        foreign result line)."""
        with self._lock:
            stored = self._openai_files[file_id]
            self._openai_files[file_id] = StoredFile(
                stored.id, stored.filename, stored.purpose, content, stored.created_at
            )

    # -- routes --------------------------------------------------------------------------

    def _batch_routes(self, app: web.Application) -> None:
        super()._batch_routes(app)
        app.router.add_post("/v1/files", self._openai_upload)
        app.router.add_get("/v1/files/{file_id}", self._openai_file_info)
        app.router.add_delete("/v1/files/{file_id}", self._openai_file_delete)
        app.router.add_get("/v1/files/{file_id}/content", self._openai_file_content)
        app.router.add_post("/v1/batches", self._openai_batch_create)
        app.router.add_get("/v1/batches", self._openai_batch_list)
        app.router.add_get("/v1/batches/{batch_id}", self._openai_batch_retrieve)
        app.router.add_post("/v1/batches/{batch_id}/cancel", self._openai_batch_cancel)

    def _intake(
        self, request: web.Request, operation: BatchOperation, batch_id: str | None = None
    ) -> tuple[str | None, web.Response | None]:
        return self._batch_intake(request, "openai", operation, batch_id)

    async def _openai_upload(self, request: web.Request) -> web.Response:
        _, refused = self._intake(request, "upload")
        if refused is not None:
            return refused
        if not request.content_type.startswith("multipart/"):
            return _refusal(400, "The request must be multipart/form-data.")
        fields: dict[str, str] = {}
        filename: str | None = None
        content: bytes | None = None
        reader = await request.multipart()
        while True:
            part: Any = await reader.next()
            if part is None:
                break
            if part.name == "file":
                filename = part.filename or "upload"
                data = bytearray()
                while chunk := await part.read_chunk(1 << 20):
                    data += chunk
                    if len(data) > _MAX_UPLOAD_BYTES:
                        return _refusal(413, "File is too large.")
                content = bytes(data)
            elif part.name:
                fields[part.name] = (await part.read(decode=True)).decode("utf-8", "replace")
        purpose = fields.get("purpose")
        if content is None or filename is None:
            return _refusal(400, "Missing required parameter: 'file'.")
        if purpose is None:
            return _refusal(400, "Missing required parameter: 'purpose'.")
        if purpose not in _PURPOSES:
            return _refusal(400, f"Invalid value for 'purpose': {purpose!r}.")
        if purpose == "batch" and not filename.endswith(".jsonl"):
            return _refusal(400, "Invalid file format for Batch API. Must be .jsonl")
        stored = StoredFile(self._new_id("file-"), filename, purpose, content, int(time.time()))
        with self._lock:
            self._openai_files[stored.id] = stored
        return web.json_response(stored.info())

    def _stored(self, file_id: str) -> StoredFile | None:
        with self._lock:
            return self._openai_files.get(file_id)

    async def _openai_file_info(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        _, refused = self._intake(request, "file")
        if refused is not None:
            return refused
        stored = self._stored(file_id)
        if stored is None:
            return _refusal(404, f"No such File object: {file_id}")
        return web.json_response(stored.info())

    async def _openai_file_delete(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        _, refused = self._intake(request, "file")
        if refused is not None:
            return refused
        with self._lock:
            stored = self._openai_files.pop(file_id, None)
        if stored is None:
            return _refusal(404, f"No such File object: {file_id}")
        return web.json_response({"id": file_id, "object": "file", "deleted": True})

    async def _openai_file_content(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        stored = self._stored(file_id)
        # Reading a batch's results is its own operation; any other file's content not.
        results = stored is not None and stored.purpose == "batch_output"
        _, refused = self._intake(request, "results" if results else "file")
        if refused is not None:
            return refused
        if stored is None:
            return _refusal(404, f"No such File object: {file_id}")
        return web.Response(body=stored.content, content_type="application/octet-stream")

    async def _openai_batch_create(self, request: web.Request) -> web.Response:
        api_key, refused = self._intake(request, "create")
        if refused is not None:
            return refused
        try:
            body = json.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return _refusal(400, "We could not parse the JSON body of your request.")
        problem = _create_problem(body)
        if problem is not None:
            return _refusal(400, problem)
        file_id = body["input_file_id"]
        stored = self._stored(file_id)
        if stored is None:
            return _refusal(404, f"No such File object: {file_id}")
        if stored.purpose != "batch":
            return _refusal(400, f"The file {file_id} was not uploaded with purpose 'batch'.")
        metadata = body.get("metadata") or {}
        lines, errors = read_input(
            stored.content,
            body["endpoint"],
            max_requests=self.openai_batch_max_requests,
            max_bytes=self.openai_batch_max_bytes,
        )
        extra = {
            "endpoint": body["endpoint"],
            "input_file_id": file_id,
            "metadata": metadata or None,
            "errors": errors,
            "stamps": {},
        }
        plan = None
        if errors:
            # Refused while validating: failed at its first read, whatever the script.
            plan = BatchPlan(running_polls=0, outcome="failed", message=errors[0]["message"])
        batch = self._batch_make(
            "openai",
            "batch_",
            lines,
            label=metadata.get(LABEL_KEY),
            api_key=api_key,
            extra=extra,
            plan=plan,
        )
        return web.json_response(self._openai_batch_object(batch))

    def _openai_batch_of(
        self, request: web.Request, operation: BatchOperation
    ) -> tuple[FakeBatch | None, web.Response | None]:
        batch_id = request.match_info["batch_id"]
        _, refused = self._intake(request, operation, batch_id)
        if refused is not None:
            return None, refused
        batch = self._batch_find(batch_id)
        if batch is None or batch.protocol != "openai":
            return None, _refusal(404, f"No batch found with id '{batch_id}'.")
        return batch, None

    async def _openai_batch_retrieve(self, request: web.Request) -> web.Response:
        batch, refused = self._openai_batch_of(request, "status")
        if batch is None:
            assert refused is not None
            return refused
        await self._batch_poll(batch)
        self._openai_settle(batch)
        return web.json_response(self._openai_batch_object(batch))

    async def _openai_batch_cancel(self, request: web.Request) -> web.Response:
        batch, refused = self._openai_batch_of(request, "cancel")
        if batch is None:
            assert refused is not None
            return refused
        if batch.terminal:
            word = self._openai_word(batch)
            return _refusal(400, f"Cannot cancel a batch with status '{word}'.")
        self._batch_cancel(batch)
        self._openai_settle(batch)
        return web.json_response(self._openai_batch_object(batch))

    async def _openai_batch_list(self, request: web.Request) -> web.Response:
        _, refused = self._intake(request, "list")
        if refused is not None:
            return refused
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return _refusal(400, "Invalid 'limit': it must be an integer from 1 to 100.")
        batches = self._batch_list("openai")
        after = request.query.get("after")
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [self._openai_batch_object(b) for b in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(batches) > limit,
            }
        )

    # -- batches in OpenAI's words -------------------------------------------------------

    def _openai_word(self, batch: FakeBatch) -> str:
        with self._lock:
            if batch.state == "ended" and "counts" not in batch.extra:
                return "finalizing"
            return _WORDS[batch.state]

    def _openai_settle(self, batch: FakeBatch) -> None:
        """Stamp the time ``batch`` reached its state, and write its output and error
        files once it has ended."""
        now = int(time.time())
        with self._lock:
            stamps: dict[str, int] = batch.extra.setdefault("stamps", {})
            state = batch.state
            if state in ("in_progress", "ended", "expired"):
                stamps.setdefault("in_progress_at", now)
            if state in ("cancelling", "cancelled"):
                stamps.setdefault("cancelling_at", now)
            if not batch.terminal or "counts" in batch.extra:
                return
            ended = {"ended": ("finalizing_at", "completed_at"), "expired": ("expired_at",)}
            for name in ended.get(state, (f"{state}_at",)):
                stamps.setdefault(name, now)
            output: list[bytes] = []
            failed: list[bytes] = []
            for line in batch.lines if state != "failed" else []:
                status, result = self._openai_result_line(batch, line, now)
                text = json.dumps(result).encode() + b"\n"
                (output if status == 200 else failed).append(text)
            answered_errors = sum(line.outcome is not None for line in batch.lines) - len(output)
            batch.extra["counts"] = (len(output), answered_errors)
            for kind, rows in (("output", output), ("error", failed)):
                if rows:
                    stored = StoredFile(
                        self._new_id("file-"),
                        f"{batch.id}_{kind}.jsonl",
                        "batch_output",
                        b"".join(rows),
                        now,
                    )
                    self._openai_files[stored.id] = stored
                    batch.extra[f"{kind}_file_id"] = stored.id

    def _openai_result_line(
        self, batch: FakeBatch, line: BatchLine, now: int
    ) -> tuple[int | None, dict[str, Any]]:
        """One result line (and its status; ``None``: never run), as OpenAI writes it."""
        head = {"id": self._new_id("batch_req_"), "custom_id": line.custom_id}
        outcome = line.outcome
        if outcome is None:
            code, message = _NOT_RUN["expired" if batch.state == "expired" else "cancelled"]
            return None, {**head, "response": None, "error": {"code": code, "message": message}}
        if isinstance(outcome, Reply):
            status = 200
            answer = ChatAnswer.of(outcome, *line.usage)
            body: Any = answer.body(ident=self._new_id("chatcmpl-"), created=now, model=line.model)
        else:
            status, body = self._openai_fault_body(line, outcome)
        response = {"status_code": status, "request_id": self._new_id("req_"), "body": body}
        return status, {**head, "response": response, "error": None}

    def _openai_fault_body(self, line: BatchLine, fault: Fault) -> tuple[int, Any]:
        """What a line a ``Fault`` answered holds: a reply of a broken shape, a verbatim
        body (as JSON where it is, else its text), or the provider's error body.  A
        reset or a hang, which a batch cannot show, is a server error."""
        if fault.shape is not None and line.request is not None:
            return fault.status, broken_reply(
                "openai", fault.shape, line.request, "chatcmpl-broken"
            )
        if fault.body is not None:
            text = fault.body.decode("utf-8", "replace")
            try:
                return fault.status, json.loads(text)
            except ValueError:
                return fault.status, text
        if fault.action != "respond" or fault.status < 400:
            return 500, error_payload(
                "openai", 500, "The server had an error processing this request."
            )
        return fault.status, error_payload("openai", fault.status, fault.message)

    def _openai_batch_object(self, batch: FakeBatch) -> dict[str, Any]:
        """``batch`` as OpenAI's Batch object."""
        word = self._openai_word(batch)
        with self._lock:
            extra = batch.extra
            stamps = dict(extra.get("stamps") or {})
            completed, failed = extra.get("counts", (0, 0))
            errors = extra.get("errors") or []
            if batch.state == "failed" and not errors:
                errors = [_line_error("batch_failed", batch.plan.message, None)]
            used_in = sum(line.usage[0] for line in batch.lines if isinstance(line.outcome, Reply))
            used_out = sum(line.usage[1] for line in batch.lines if isinstance(line.outcome, Reply))
            created = int(batch.created_at)
            obj: dict[str, Any] = {
                "id": batch.id,
                "object": "batch",
                "endpoint": extra.get("endpoint", BATCH_ENDPOINT),
                "model": batch.model or None,
                "errors": {"object": "list", "data": errors} if errors else None,
                "input_file_id": extra.get("input_file_id"),
                "completion_window": "24h",
                "status": word,
                "output_file_id": extra.get("output_file_id"),
                "error_file_id": extra.get("error_file_id"),
                "created_at": created,
                "expires_at": created + _WINDOW_S,
                "request_counts": {
                    "total": len(batch.lines),
                    "completed": completed,
                    "failed": failed,
                },
                "usage": {
                    "input_tokens": used_in,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": used_out,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": used_in + used_out,
                },
                "metadata": extra.get("metadata"),
            }
        for name in (
            "in_progress_at",
            "finalizing_at",
            "completed_at",
            "failed_at",
            "expired_at",
            "cancelling_at",
            "cancelled_at",
        ):
            obj[name] = stamps.get(name)
        return obj


def _create_problem(body: dict[str, Any]) -> str | None:
    """Why OpenAI refuses a batch creation at once (a 400), or ``None``."""
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str) or not body[name]:
            return f"Missing required parameter: '{name}'."
    endpoint = body["endpoint"]
    if endpoint not in _ENDPOINTS:
        return f"Invalid value for 'endpoint': {endpoint!r} is not a supported endpoint."
    if endpoint != BATCH_ENDPOINT:
        return f"The fake server runs batches of {BATCH_ENDPOINT} only, not {endpoint}."
    if body["completion_window"] != "24h":
        return "Invalid value for 'completion_window': only '24h' is supported."
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > _METADATA_KEYS:
        return f"Invalid 'metadata': an object of at most {_METADATA_KEYS} pairs."
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_CHARS or not isinstance(value, str):
            return f"Invalid 'metadata': key {key[:80]!r} is too long or its value not a string."
        if len(value) > _METADATA_VALUE_CHARS:
            return (
                f"Invalid 'metadata': the value of {key!r} is longer than "
                f"{_METADATA_VALUE_CHARS} characters."
            )
    return None
