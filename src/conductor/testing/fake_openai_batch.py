"""The fake server's OpenAI Files and Batch APIs, over the batch engine (``fake_batch``).

Routes (under ``/v1``, the OpenAI base): ``POST /files`` (a multipart upload,
``purpose=batch``), ``GET /files/{id}`` and ``GET /files/{id}/content``;
``POST /batches``, ``GET /batches/{id}`` (a read of its status, which moves it),
``GET /batches`` (newest first, ``limit`` and ``after``) and
``POST /batches/{id}/cancel``.

As OpenAI does: an input file is JSONL of ``{custom_id, method: "POST", url, body}``; a
file that breaks the rules (a line that is not such an object, a repeated custom id, a
url not the batch's endpoint, two models, over 50,000 lines) makes the batch ``failed``
with ``errors`` naming the line.  Once a batch has ended its answered lines are in its
output file (``{id, custom_id, response: {status_code: 200, request_id, body}, error:
null}``) and the others in its error file: a line the model's script failed with the
provider's error body and status, a line never run (expired, cancelled) with
``response: null`` and ``error: {code: "batch_expired" | "batch_cancelled"}``.  The
engine's ``ended`` is OpenAI's ``completed``.  The batch's label (``FakeBatch.label``)
is its metadata's ``conductor_label``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from .fake_batch import BatchBase, BatchLine, BatchPlan, FakeBatch, FakeFile
from .fake_openai import OpenAIRoutes
from .fake_script import Reply
from .fake_wire import broken_reply, error_payload

__all__ = ["OPENAI_BATCH_MAX_LINES", "OpenAIBatchRoutes"]

#: The most requests one OpenAI batch holds.
OPENAI_BATCH_MAX_LINES = 50_000
#: The endpoint the fake runs batches for (the only one conductor sends).
_ENDPOINT = "/v1/chat/completions"
_STATUS = {
    "validating": "validating",
    "in_progress": "in_progress",
    "ended": "completed",
    "expired": "expired",
    "failed": "failed",
    "cancelling": "cancelling",
    "cancelled": "cancelled",
}
_NEVER_RUN = {"expired": "batch_expired", "cancelled": "batch_cancelled"}


class OpenAIBatchRoutes(OpenAIRoutes, BatchBase):
    """OpenAI's Files and Batch APIs."""

    def _batch_routes(self, app: web.Application) -> None:
        super()._batch_routes(app)
        for base in ("/v1", ""):
            app.router.add_post(f"{base}/files", self._openai_upload)
            app.router.add_get(f"{base}/files/{{file_id}}", self._openai_file)
            app.router.add_get(f"{base}/files/{{file_id}}/content", self._openai_file_content)
            app.router.add_post(f"{base}/batches", self._openai_batch_create)
            app.router.add_get(f"{base}/batches", self._openai_batch_list)
            app.router.add_get(f"{base}/batches/{{batch_id}}", self._openai_batch_get)
            app.router.add_post(f"{base}/batches/{{batch_id}}/cancel", self._openai_batch_cancel)

    # -- files ---------------------------------------------------------------------------

    async def _openai_upload(self, request: web.Request) -> web.Response:
        _key, error = self._batch_intake(request, "openai", "upload")
        if error is not None:
            return error
        try:
            form = await request.post()
        except ValueError as exc:
            return self._error("openai", 400, f"a multipart upload was expected ({exc})", {})
        purpose, upload = form.get("purpose"), form.get("file")
        if not isinstance(purpose, str) or not isinstance(upload, web.FileField):
            return self._error("openai", 400, "'file' and 'purpose' are required", {})
        data = upload.file.read()
        kept = self._file_put("file-", upload.filename or "upload.jsonl", purpose, data)
        return web.json_response(_file_object(kept))

    async def _openai_file(self, request: web.Request) -> web.Response:
        _key, error = self._batch_intake(request, "openai", "file")
        if error is not None:
            return error
        kept = self._file_get(request.match_info["file_id"])
        if kept is None:
            return self._error("openai", 404, "No such File object", {})
        return web.json_response(_file_object(kept))

    async def _openai_file_content(self, request: web.Request) -> web.Response:
        _key, error = self._batch_intake(request, "openai", "results")
        if error is not None:
            return error
        kept = self._file_get(request.match_info["file_id"])
        if kept is None:
            return self._error("openai", 404, "No such File object", {})
        return web.Response(body=kept.data, content_type="application/octet-stream")

    # -- batches -------------------------------------------------------------------------

    async def _openai_batch_create(self, request: web.Request) -> web.Response:
        api_key, error = self._batch_intake(request, "openai", "create")
        if error is not None:
            return error
        try:
            body = await request.json()
        except ValueError:
            return self._error("openai", 400, "the body is not JSON", {})
        if not isinstance(body, dict):
            return self._error("openai", 400, "the body is not a JSON object", {})
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint != _ENDPOINT:
            return self._error("openai", 400, f"endpoint must be {_ENDPOINT}", {})
        if window != "24h":
            return self._error("openai", 400, "completion_window must be 24h", {})
        kept = self._file_get(str(body.get("input_file_id")))
        if kept is None or kept.purpose != "batch":
            return self._error("openai", 404, "input_file_id names no batch file", {})
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict) or len(metadata) > 16:
            return self._error("openai", 400, "metadata must hold at most 16 pairs", {})
        lines, problems = _read_input(kept.data)
        label = metadata.get("conductor_label")
        batch = self._batch_make(
            "openai",
            "batch_",
            lines,
            label=label if isinstance(label, str) else None,
            api_key=api_key,
            extra={"input_file_id": kept.id, "metadata": metadata, "errors": problems},
        )
        if problems:
            # Refused when validated: the next read finds it failed.
            batch.plan = BatchPlan(
                running_polls=0, outcome="failed", message=problems[0]["message"]
            )
        return web.json_response(self._batch_object(batch))

    async def _openai_batch_get(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        _key, error = self._batch_intake(request, "openai", "status", batch_id)
        if error is not None:
            return error
        batch = self._batch_find(batch_id)
        if batch is None or batch.protocol != "openai":
            return self._error("openai", 404, f"No batch found with id '{batch_id}'", {})
        await self._batch_poll(batch)
        return web.json_response(self._batch_object(batch))

    async def _openai_batch_list(self, request: web.Request) -> web.Response:
        _key, error = self._batch_intake(request, "openai", "list")
        if error is not None:
            return error
        try:
            limit = min(100, max(1, int(request.query.get("limit", "20"))))
        except ValueError:
            return self._error("openai", 400, "limit must be a whole number", {})
        batches = self._batch_list("openai")
        after = request.query.get("after")
        if after:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        data = [self._batch_object(b) for b in page]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(batches) > limit,
            }
        )

    async def _openai_batch_cancel(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        _key, error = self._batch_intake(request, "openai", "cancel", batch_id)
        if error is not None:
            return error
        batch = self._batch_find(batch_id)
        if batch is None or batch.protocol != "openai":
            return self._error("openai", 404, f"No batch found with id '{batch_id}'", {})
        self._batch_cancel(batch)
        return web.json_response(self._batch_object(batch))

    # -- shapes --------------------------------------------------------------------------

    def _batch_object(self, batch: FakeBatch) -> dict[str, Any]:
        """The Batch object, its result files written once it has ended."""
        created = int(batch.created_at)
        ended = int(batch.ended_at) if batch.ended_at is not None else None
        state = batch.state
        if batch.terminal and state != "failed" and "output_file_id" not in batch.extra:
            self._write_results(batch)
        problems = batch.extra.get("errors") or []
        if state == "failed" and not problems:
            problems = [{"code": "batch_failed", "line": None, "message": batch.plan.message}]
        never_run = batch.unanswered if batch.terminal and state != "failed" else 0
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": _ENDPOINT,
            "errors": {"object": "list", "data": problems} if state == "failed" else None,
            "input_file_id": batch.extra.get("input_file_id", ""),
            "completion_window": "24h",
            "status": _STATUS[state],
            "output_file_id": batch.extra.get("output_file_id"),
            "error_file_id": batch.extra.get("error_file_id"),
            "created_at": created,
            "in_progress_at": created if state != "validating" else None,
            "expires_at": created + 24 * 3600,
            "finalizing_at": ended if state == "ended" else None,
            "completed_at": ended if state == "ended" else None,
            "failed_at": ended if state == "failed" else None,
            "expired_at": ended if state == "expired" else None,
            "cancelling_at": int(time.time()) if state == "cancelling" else None,
            "cancelled_at": ended if state == "cancelled" else None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": batch.succeeded,
                "failed": batch.errored + never_run,
            },
            "metadata": batch.extra.get("metadata") or None,
        }

    def _write_results(self, batch: FakeBatch) -> None:
        """The batch's output and error files, as OpenAI writes them when it ends."""
        out: list[str] = []
        errors: list[str] = []
        for line in batch.lines:
            record = self._result_line(batch, line)
            answered = record["response"] is not None and record["response"]["status_code"] == 200
            (out if answered else errors).append(json.dumps(record))
        if out:
            kept = self._file_put("file-", "batch_output.jsonl", "batch_output", _jsonl(out))
            batch.extra["output_file_id"] = kept.id
        else:
            batch.extra["output_file_id"] = None
        if errors:
            kept = self._file_put("file-", "batch_errors.jsonl", "batch_output", _jsonl(errors))
            batch.extra["error_file_id"] = kept.id

    def _result_line(self, batch: FakeBatch, line: BatchLine) -> dict[str, Any]:
        ident = self._new_id("batch_req_")
        outcome, request = line.outcome, line.request
        if outcome is None or request is None:
            code = _NEVER_RUN.get(batch.state, "batch_expired")
            message = "This request could not be executed before the batch ended."
            return {
                "id": ident,
                "custom_id": line.custom_id,
                "response": None,
                "error": {"code": code, "message": message},
            }
        if isinstance(outcome, Reply):
            status, body = 200, self._chat_completion(request, outcome)
        elif outcome.shape is not None:
            status, body = 200, broken_reply("openai", outcome.shape, request, ident)
        else:
            status = outcome.status or 500
            body = error_payload("openai", status, outcome.message)
        return {
            "id": ident,
            "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": self._new_id("req_"), "body": body},
            "error": None,
        }


def _jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _file_object(kept: FakeFile) -> dict[str, Any]:
    return {
        "id": kept.id,
        "object": "file",
        "bytes": len(kept.data),
        "created_at": kept.created_at,
        "filename": kept.filename,
        "purpose": kept.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def _read_input(data: bytes) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The lines of an input file, and what breaks OpenAI's rules (``errors.data``)."""
    lines: list[BatchLine] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()

    def problem(number: int | None, code: str, message: str) -> None:
        problems.append({"code": code, "line": number, "message": message, "param": None})

    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            problem(number, "invalid_json_line", "This line is not parseable as valid JSON.")
            continue
        if not isinstance(entry, dict):
            problem(number, "invalid_request", "A line must be a JSON object.")
            continue
        custom_id, body = entry.get("custom_id"), entry.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            problem(number, "missing_required_parameter", "custom_id is required.")
        elif custom_id in seen:
            problem(number, "duplicate_custom_id", f"custom_id {custom_id!r} is repeated.")
        elif entry.get("method") != "POST" or entry.get("url") != _ENDPOINT:
            problem(number, "invalid_url", f"Each line must be a POST to {_ENDPOINT}.")
        elif not isinstance(body, dict) or not isinstance(body.get("model"), str):
            problem(number, "missing_required_parameter", "body.model is required.")
        else:
            seen.add(custom_id)
            models.add(body["model"])
            lines.append(BatchLine(custom_id, body["model"], body))
    if len(models) > 1:
        problem(None, "mismatched_model", "All requests of a batch must use one model.")
    if len(lines) > OPENAI_BATCH_MAX_LINES:
        problem(None, "too_many_requests", f"A batch holds at most {OPENAI_BATCH_MAX_LINES}.")
    if not lines and not problems:
        problem(None, "empty_file", "The input file holds no request.")
    return lines, problems
