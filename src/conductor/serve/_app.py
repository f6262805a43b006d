"""The HTTP side of ``conductor serve``: a FastAPI app with OpenAI's routes.

``GET /v1/models`` lists the models (:mod:`._models`); ``POST /v1/chat/completions``
checks the bearer token, the body's size and shape (:mod:`._protocol`), turns the
conversation into a question (:mod:`._conversation`), takes a place among the slots
(429 when the queue is full) and runs the orchestration on the shared
:class:`~._service.Service`, answering at once or as server-sent events.

A client that goes away cancels its runs: a plain request watches its connection while
the runs go; a streamed one is cancelled by Starlette when the connection drops, and
the generator's ``finally`` cancels the runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive

from ..conductors.spec import resolve_conductor
from ..errors import ConductorError, UsageError
from ..llm.cache import ResponseCache
from ..record import RunRecord, new_run_id
from ..strategies import Strategy
from ..text import check_question
from ._conversation import question_text
from ._models import model_list
from ._protocol import (
    ApiError,
    ChatRequest,
    chunk,
    completion_body,
    conductor_field,
    cost_of,
    error_body,
    finish_reason,
    parse_chat_request,
    pieces,
    sse,
    tool_call_deltas,
    usage_of,
)
from ._service import Service, Ticket, check_records_dir
from ._settings import ServeSettings

__all__ = ["create_app"]

log = logging.getLogger("conductor")


def create_app(settings: ServeSettings) -> FastAPI:
    """The app serving ``settings.pool``.  The Conductor is resolved and the records
    directory checked here, so a bad one is a :class:`~conductor.errors.UsageError` (or
    an ``OSError`` naming the path) before any socket listens."""
    _check_settings(settings)
    conductor = resolve_conductor(settings.pool, settings.conductor)
    if settings.records_dir is not None:
        check_records_dir(settings.records_dir)
    if settings.use_cache:
        with ResponseCache():  # a cache directory that cannot be used: one sentence now
            pass
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Service.opened(settings, conductor) as service:
            app.state.service = service
            yield

    app = FastAPI(
        title="conductor serve",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _server_error)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        _check_key(request, settings.api_key)
        return _json(model_list(settings.pool, created))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        _check_key(request, settings.api_key)
        service: Service = request.app.state.service
        service.catalog.resolve(model_id)  # 400 model_not_found for a name it refuses
        listed = {m["id"]: m for m in model_list(settings.pool, created)["data"]}
        kind = "conductor" if model_id == "conductor" else "baseline"
        return _json(
            listed.get(model_id)
            or {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "conductor",
                "conductor": {"pool": settings.pool.name, "kind": kind, "pattern": False},
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        _check_key(request, settings.api_key)
        raw = await _read_body(request, settings.max_body_bytes)
        chat = parse_chat_request(raw)
        service: Service = request.app.state.service
        strategy = service.catalog.resolve(chat.model)
        question = question_text(chat.messages, chat.answer_format)
        try:
            check_question(question)
        except UsageError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_question") from None
        refused = strategy.answer_refusal(chat.answer_format)
        if refused is not None:
            param = "tools" if chat.answer_format.tools else "response_format"
            raise ApiError(
                400, f"{chat.model}: {refused}", param=param, code="unsupported_parameter"
            )
        ticket = service.slots.admit()
        run_ids = [new_run_id() for _ in range(chat.n)]
        job = _Job(service, strategy, chat, question, run_ids, ticket)
        if chat.stream:
            return job.streamed()
        try:
            return await job.answered(request.receive)
        finally:
            ticket.release()

    return app


def _check_settings(settings: ServeSettings) -> None:
    for name in ("max_concurrency", "max_body_bytes"):
        if getattr(settings, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.max_queue < 0:
        raise UsageError("--max-queue must be 0 or more")
    if settings.grace_s < 0:
        raise UsageError("--grace-s must be 0 or more")
    if settings.api_key is not None and not settings.api_key:
        raise UsageError("the API key is empty: set the variable to the token clients send")


# -- one request ------------------------------------------------------------------------


class _Job:
    """One admitted chat-completions request: its runs, answered whole or streamed."""

    def __init__(
        self,
        service: Service,
        strategy: Strategy,
        chat: ChatRequest,
        question: str,
        run_ids: list[str],
        ticket: Ticket,
    ) -> None:
        self.service = service
        self.strategy = strategy
        self.chat = chat
        self.question = question
        self.run_ids = run_ids
        self.ticket = ticket
        self.id = "chatcmpl-" + run_ids[0]
        self.created = int(time.time())
        self.headers = {"x-conductor-run-id": ",".join(run_ids)}

    async def answered(self, receive: Receive) -> Response:
        """Run, watching the connection from the start (waiting for a slot included):
        a client that leaves cancels the runs."""
        work = asyncio.ensure_future(self._run_in_slot())
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, gone):
                if not task.done():
                    task.cancel()
            # The watcher first: awaiting a run that raised raises (a 500) here.
            for task in (gone, work):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if work.cancelled():
            return Response(status_code=499)  # the client is gone: nobody reads this
        records = work.result()
        headers = {**self.headers, "x-conductor-cost-usd": _cost_header(records)}
        failed = next((r for r in records if r.status == "failed"), None)
        if failed is not None:
            body = _failure(failed)
            body["conductor"] = conductor_field(records)
            return _json(body, status=502, headers=headers)
        return _json(
            completion_body(self.id, self.created, self.chat.model, records), headers=headers
        )

    async def _run_in_slot(self) -> list[RunRecord]:
        async with self.ticket.running():
            return await self.service.run_all(
                self.strategy, self.question, self.run_ids, answer_format=self.chat.answer_format
            )

    def streamed(self) -> StreamingResponse:
        events = self._events()
        # A response that is never started (the client left first) drops its generator
        # unstarted, so its ``finally`` would not run: give the place back then too.
        weakref.finalize(events, self.ticket.release)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={**self.headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(chunk(self.id, self.created, self.chat.model, choices, **extra))

    async def _events(self) -> AsyncIterator[bytes]:
        chat = self.chat
        queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        tasks: list[asyncio.Task[RunRecord]] = []

        def on_event(payload: dict[str, Any]) -> None:
            queue.put_nowait(("event", 0, payload))

        try:
            yield self._chunk(
                [{"index": i, "delta": {"role": "assistant", "content": ""}} for i in range(chat.n)]
            )
            async with self.ticket.running():
                for i, run_id in enumerate(self.run_ids):
                    task = asyncio.ensure_future(
                        self.service.run_one(
                            self.strategy,
                            self.question,
                            i,
                            run_id,
                            on_event if chat.progress else None,
                            chat.answer_format,
                        )
                    )
                    task.add_done_callback(functools.partial(_finished, queue, i))
                    tasks.append(task)
                records: dict[int, RunRecord] = {}
                while len(records) < chat.n:
                    kind, i, item = await queue.get()
                    if kind == "event":
                        yield self._chunk([], conductor={"event": item})
                        continue
                    record = item.result()  # a run that raised ends the stream here
                    records[i] = record
                    if record.status == "failed":
                        continue
                    text = record.final_answer or ""
                    if text or not record.final_tool_calls:
                        for piece in pieces(text):
                            yield self._chunk([{"index": i, "delta": {"content": piece}}])
                    for call in tool_call_deltas(record):
                        yield self._chunk([{"index": i, "delta": {"tool_calls": [call]}}])
                    yield self._chunk(
                        [{"index": i, "delta": {}, "finish_reason": finish_reason(record)}],
                        conductor=conductor_field([record]),
                    )
            done = [records[i] for i in range(chat.n)]
            failed = next((r for r in done if r.status == "failed"), None)
            if failed is not None:
                body = _failure(failed)
                body["conductor"] = conductor_field(done)
                yield sse(body)
            elif chat.include_usage:
                yield self._chunk([], usage=usage_of(done))
            yield sse("[DONE]")
        finally:
            for task in tasks:
                task.cancel()
            self.ticket.release()


def _finished(queue: asyncio.Queue[tuple[str, int, Any]], index: int, task: Any) -> None:
    queue.put_nowait(("done", index, task))


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (the body was read already, so the next message
    is ``http.disconnect``, sent when the connection closes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _failure(record: RunRecord) -> dict[str, Any]:
    message = f"the orchestration failed: {record.error or 'no answer was produced'}"
    return error_body(message, type="server_error", code="orchestration_failed")


def _cost_header(records: list[RunRecord]) -> str:
    cost = cost_of(records)
    return "unknown" if cost is None else f"{cost:.8f}"


# -- the request's edges ----------------------------------------------------------------


def _check_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "no API key was given: send it as Authorization: Bearer KEY",
            type="authentication_error",
            code="invalid_api_key",
        )
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(
            401,
            "the API key is not valid for this server",
            type="authentication_error",
            code="invalid_api_key",
        )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 when it is over ``limit`` bytes.  An over-long body is still
    read (up to 16 times the limit) so the client, still sending, gets the answer
    rather than a broken connection."""
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    body = bytearray()
    seen = 0
    async for part in request.stream():
        seen += len(part)
        if seen > limit:
            over = True
        if not over:
            body += part
        elif seen > 16 * limit:
            break
    if over:
        raise ApiError(
            413,
            f"the request body is over the limit of {limit:,} bytes",
            code="request_too_large",
        )
    return bytes(body)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, ensure_ascii=False).encode(),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


async def _api_error(request: Request, exc: ApiError) -> Response:
    return _json(exc.body(), status=exc.status, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A run that raised instead of recording its failure: the server's set-up (a
    missing model file, a Conductor that cannot be prompted) or a defect."""
    if isinstance(exc, ConductorError):
        message = str(exc)
    else:
        log.error("an unexpected error answered a request with 500", exc_info=exc)
        message = f"internal error ({type(exc).__name__}); see the server's log"
    return _json(error_body(message, type="server_error", code="server_error"), status=500)


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return _json(
        error_body(str(exc.detail), type="invalid_request_error", code=code),
        status=exc.status_code,
        headers=dict(exc.headers or {}),
    )
