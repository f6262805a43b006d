"""The HTTP side of ``conductor serve``: a FastAPI app with OpenAI's routes.

``GET /v1/models`` lists the models (:mod:`._models`).  ``POST /v1/chat/completions``
(:mod:`._protocol`), ``POST /v1/responses`` (:mod:`._responses`) and
``POST /v1/completions`` (:mod:`._completions`) each check the bearer token and the
body's size, read the body into one :class:`~._protocol.ChatRequest` in their own
format, check its JSON schemas off the event loop on the request's own budget
(:func:`~._protocol.check_schemas`, in the service's checker processes, which check its
replies later on the same budget), and hand a :class:`_Job` the renderer of that
format; the job turns the conversation into a question (:mod:`._conversation`), takes a
place among the slots (429 when the queue is full) and runs the orchestration on the
shared :class:`~._service.Service`, answering at once or as server-sent events.  A key
with a budget has each of the request's plans held against it first (:mod:`._spend`).
``GET`` and ``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``
read the server's stored responses (:mod:`._stores`), only the caller key's.

A client that goes away cancels its runs: a plain request watches its connection while
the runs go; a streamed one is cancelled by Starlette when the connection drops, and
the generator's ``finally`` cancels the runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from ..conductors.spec import Conductor, resolve_conductor
from ..errors import ConductorError, StateUnavailable, UsageError
from ..record import RunRecord, new_run_id
from ..redact import masked_json
from ..state import open_call_cache
from ..strategies import Strategy
from ..text import check_question
from ._completions import CompletionRenderer, parse_completion_request
from ._conversation import question_text
from ._cors import CorsMiddleware
from ._keys import ApiKey, KeyRing, strategy_for
from ._models import model_entry, model_list
from ._protocol import (
    ApiError,
    ChatRenderer,
    ChatRequest,
    broken_body,
    check_schemas,
    cost_of,
    error_body,
    failure_body,
    parse_chat_request,
)
from ._responses import (
    ResponsesRenderer,
    input_items,
    parse_responses_request,
    stored,
    unreachable,
)
from ._service import Service, Ticket, check_records_dir
from ._settings import ServeSettings
from ._spend import Reservation
from ._stores import owner_of

__all__ = ["create_app"]

log = logging.getLogger("conductor")


def create_app(settings: ServeSettings, conductor: Conductor | None = None) -> FastAPI:
    """The app serving ``settings.pool``.  The Conductor is resolved (unless the caller
    has: ``conductor``, resolved from the same settings) and the records directory
    checked here, so a bad one is a :class:`~conductor.errors.UsageError` (or an
    ``OSError`` naming the path) before any socket listens."""
    _check_settings(settings)
    if conductor is None:
        conductor = resolve_conductor(
            settings.pool, settings.conductor, cost_weight=settings.cost_weight
        )
    if settings.records_dir is not None:
        check_records_dir(settings.records_dir)
    if settings.use_cache or settings.state is not None:
        # A cache directory that cannot be used, or credentials the state server
        # refuses (which also keeps stored responses and budgets): one sentence now.
        with open_call_cache(settings.state):
            pass
    created = int(time.time())
    keyring = KeyRing(settings.pool, _keys_of(settings))

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
        key = _check_key(request, keyring)
        service: Service = request.app.state.service
        workers = key.allowed_workers if key is not None else None
        return _json(model_list(service.catalog, created, workers))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        key = _check_key(request, keyring)
        service: Service = request.app.state.service
        # 400 model_not_found for a name it refuses, 403 for one the key may not use
        strategy_for(service.catalog, key, model_id, None)
        return _json(model_entry(service.catalog, created, model_id))

    async def answer(
        request: Request,
        key: ApiKey | None,
        chat: ChatRequest,
        renderer: Callable[[list[str]], Renderer],
        sent_bytes: int,
    ) -> Response:
        """Run ``chat`` and answer in the form ``renderer`` makes for its run ids."""
        service: Service = request.app.state.service
        strategy = strategy_for(service.catalog, key, chat.model, chat.allowed_workers)
        question = question_text(chat.messages, chat.answer_format)
        try:
            check_question(question)
        except UsageError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_question") from None
        refused = strategy.answer_refusal(chat.answer_format)
        if refused is not None:
            param = "tools" if chat.answer_format.tools else chat.format_param
            raise ApiError(
                400, f"{chat.model}: {refused}", param=param, code="unsupported_parameter"
            )
        if not chat.answer_format.plain:
            # The request's checks (its schemas now, its replies later) run in the
            # service's checker processes, on one budget.
            checks = service.request_checks()
            chat = replace(chat, answer_format=replace(chat.answer_format, checks=checks))
            if not await _unless_gone(request.receive, check_schemas(chat, checks)):
                return Response(status_code=499)  # the client is gone: nobody reads this
        ticket = service.slots.admit()
        run_ids = [new_run_id() for _ in range(chat.n)]
        job = _Job(service, strategy, chat, question, run_ids, ticket, renderer(run_ids))
        # A client's W3C trace context: the runs' traces continue the client's.
        job.traceparent = request.headers.get("traceparent")
        try:
            # The first plan is held against the key's budget before its first call;
            # each plan then holds its own calls (the budget's holder).
            job.reservation = await service.spending.reserve(
                key,
                strategy,
                job.budget,
                question,
                sent_bytes + len(question.encode()),
                runs=chat.n,
            )
        except BaseException:
            ticket.release()
            raise
        if chat.stream:
            return job.streamed()
        try:
            return await job.answered(request.receive)
        finally:
            ticket.release()
            job.settle()

    async def body(request: Request) -> tuple[ApiKey | None, bytes]:
        """The caller's key (checked first: no body is read for a caller without
        one) and the request's body."""
        key = _check_key(request, keyring)
        return key, await _read_body(request, settings.max_body_bytes)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        key, raw = await body(request)
        chat = parse_chat_request(raw)
        return await answer(request, key, chat, lambda ids: ChatRenderer(chat, ids), len(raw))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        key, raw = await body(request)
        kept = request.app.state.service.stores.conversations
        owner = owner_of(key)
        asked = await parse_responses_request(raw, kept, owner)

        def renderer(ids: list[str]) -> Renderer:
            return ResponsesRenderer(asked, ids, kept, owner, settings.keep_responses_s)

        return await answer(request, key, asked.chat, renderer, len(raw))

    # A stored response: another key's id is "not found", exactly as an unknown one.

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Response:
        found = await _stored_response(request, keyring, response_id)
        return _json(found["response"])

    @app.get("/v1/responses/{response_id}/input_items")
    async def get_input_items(response_id: str, request: Request) -> Response:
        found = await _stored_response(request, keyring, response_id)
        items = input_items(response_id, found)
        if items is None:
            raise _no_response(response_id)
        return _json(_item_page(items, request))

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> Response:
        key = _check_key(request, keyring)
        kept = request.app.state.service.stores.conversations
        try:
            deleted = await kept.delete(response_id, owner_of(key))
        except StateUnavailable as exc:
            raise unreachable(exc) from None
        if not deleted:
            raise _no_response(response_id)
        return _json({"id": response_id, "object": "response", "deleted": True})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        key, raw = await body(request)
        text = parse_completion_request(raw)
        return await answer(request, key, text, lambda ids: CompletionRenderer(text, ids), len(raw))

    if settings.cors_origins:
        app.add_middleware(CorsMiddleware, origins=settings.cors_origins)

    return app


def _no_response(response_id: str) -> ApiError:
    return ApiError(
        404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found"
    )


async def _stored_response(request: Request, keyring: KeyRing, response_id: str) -> dict[str, Any]:
    """What is stored of ``response_id`` for the caller's key, or 404."""
    key = _check_key(request, keyring)
    kept = request.app.state.service.stores.conversations
    found = await stored(kept, response_id, owner_of(key))
    if found is None or not isinstance(found.get("response"), dict):
        raise _no_response(response_id)
    return found


def _item_page(items: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    """One page of ``items`` as OpenAI lists them: ``order`` (``desc`` unless asked),
    ``after`` an item id, ``limit`` 1 to 100 (20)."""
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be asc or desc", param="order")
    limit_text = query.get("limit", "20")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= 100:
        raise ApiError(400, "limit must be an integer from 1 to 100", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise ApiError(400, f"after names no item of this response: {after!r}", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[: int(limit_text)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else "",
        "last_id": page[-1]["id"] if page else "",
        "has_more": len(ordered) > len(page),
    }


def _check_settings(settings: ServeSettings) -> None:
    for name in ("max_concurrency", "max_body_bytes"):
        if getattr(settings, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.max_queue < 0:
        raise UsageError("--max-queue must be 0 or more")
    if settings.grace_s < 0:
        raise UsageError("--grace-s must be 0 or more")
    settings.check_limits()
    if settings.api_key is not None and not settings.api_key:
        raise UsageError("the API key is empty: set the variable to the token clients send")


def _keys_of(settings: ServeSettings) -> list[ApiKey]:
    # The --api-key-env token is a key like the file's, with every worker.
    single = [ApiKey("api-key-env", settings.api_key)] if settings.api_key else []
    return [*single, *settings.keys]


# -- one request ------------------------------------------------------------------------


class Renderer(Protocol):
    """What an endpoint's wire format makes of its runs: the body answering at once,
    and the server-sent events of a stream, each a list of encoded events (empty where
    the format has nothing to say).  :class:`_Job` does the rest, the same for every
    endpoint."""

    async def keep(self, records: list[RunRecord]) -> None:
        """Store what the format keeps of runs that all succeeded, before their answer
        is sent."""
        ...

    def body(self, records: list[RunRecord]) -> dict[str, Any]:
        """The answer of runs that all succeeded."""
        ...

    def opening(self) -> list[bytes]:
        """Sent before any run has ended (before the runs have a slot, even)."""
        ...

    def progress(self, payload: dict[str, Any]) -> list[bytes]:
        """One progress event, when the request asked for them."""
        ...

    def answer(self, index: int, record: RunRecord) -> list[bytes]:
        """The answer of run ``index``, which succeeded, as soon as it ended."""
        ...

    def closing(self, records: list[RunRecord]) -> list[bytes]:
        """The end of a stream whose runs all succeeded."""
        ...

    def failed(self, records: list[RunRecord], failed: RunRecord) -> list[bytes]:
        """The end of a stream one of whose runs (``failed``) recorded a failure."""
        ...

    def broken(self, message: str) -> list[bytes]:
        """The end of a stream whose run raised (the server's set-up, or a defect)."""
        ...


class _Job:
    """One admitted request: its runs, answered whole or streamed in the form of
    ``renderer``.  What is the same for every endpoint is here: the slot, the runs,
    a client leaving, the headers and a failed run's 502."""

    def __init__(
        self,
        service: Service,
        strategy: Strategy,
        chat: ChatRequest,
        question: str,
        run_ids: list[str],
        ticket: Ticket,
        renderer: Renderer,
    ) -> None:
        self.service = service
        self.strategy = strategy
        self.chat = chat
        self.question = question
        self.run_ids = run_ids
        self.ticket = ticket
        self.renderer = renderer
        self.budget = service.budget(chat.budget)  # one for all the request's runs
        self.headers = {"x-conductor-run-id": ",".join(run_ids)}
        self.traceparent: str | None = None
        #: The hold on the key's budget, settled when the runs end (``None``: no budget).
        self.reservation: Reservation | None = None

    def settle(self) -> None:
        """Settle the key's budget to what the runs spent, in the background (once;
        safe to repeat): what a request cancelled or cut short does."""
        if self.reservation is not None:
            self.reservation.close()

    async def settled(self) -> None:
        """Settle the key's budget before the answer is sent."""
        if self.reservation is not None:
            await self.reservation.settle()

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
        await self.settled()
        headers = {**self.headers, "x-conductor-cost-usd": _cost_header(records)}
        failed = next((r for r in records if r.status == "failed"), None)
        refused = self.reservation.refused if self.reservation is not None else None
        if failed is not None and refused is not None:
            # A plan the key's budget could not hold: the budget's refusal, not a failure.
            raise refused
        if failed is not None:
            return _json(failure_body(records, failed), status=502, headers=headers)
        await self.renderer.keep(records)
        return _json(self.renderer.body(records), headers=headers)

    async def _run_in_slot(self) -> list[RunRecord]:
        async with self.ticket.running():
            return await self.service.run_all(
                self.strategy,
                self.question,
                self.run_ids,
                budget=self.budget,
                answer_format=self.chat.answer_format,
                traceparent=self.traceparent,
            )

    def streamed(self) -> StreamingResponse:
        events = self._events()
        # A response that is never started (the client left first) drops its generator
        # unstarted, so its ``finally`` would not run: give the place back then too.
        weakref.finalize(events, self.ticket.release)
        weakref.finalize(events, _soon, asyncio.get_running_loop(), self.settle)
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={**self.headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def _events(self) -> AsyncIterator[bytes]:
        render = self.renderer
        n = len(self.run_ids)
        queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        tasks: list[asyncio.Task[RunRecord]] = []

        def on_event(payload: dict[str, Any]) -> None:
            queue.put_nowait(("event", 0, payload))

        try:
            for event in render.opening():
                yield event
            async with self.ticket.running():
                for i, run_id in enumerate(self.run_ids):
                    task = asyncio.ensure_future(
                        self.service.run_one(
                            self.strategy,
                            self.question,
                            i,
                            run_id,
                            on_event if self.chat.progress else None,
                            budget=self.budget,
                            answer_format=self.chat.answer_format,
                            traceparent=self.traceparent,
                        )
                    )
                    task.add_done_callback(functools.partial(_finished, queue, i))
                    tasks.append(task)
                records: dict[int, RunRecord] = {}
                while len(records) < n:
                    kind, i, item = await queue.get()
                    if kind == "event":
                        for event in render.progress(item):
                            yield event
                        continue
                    try:
                        record = item.result()
                    except Exception as exc:  # the headers are sent: end in the format
                        for event in render.broken(_server_message(exc)):
                            yield event
                        return
                    records[i] = record
                    if record.status != "failed":
                        for event in render.answer(i, record):
                            yield event
            done = [records[i] for i in range(n)]
            await self.settled()
            failed = next((r for r in done if r.status == "failed"), None)
            if failed is None:
                await render.keep(done)
            for event in render.failed(done, failed) if failed else render.closing(done):
                yield event
        finally:
            for task in tasks:
                task.cancel()
            self.ticket.release()
            self.settle()


def _soon(loop: asyncio.AbstractEventLoop, work: Callable[[], None]) -> None:
    """``work`` on ``loop`` from wherever a finalizer runs; nothing once the loop is
    closed (the server is gone, and its state server's lease settles the rest)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(work)


def _finished(queue: asyncio.Queue[tuple[str, int, Any]], index: int, task: Any) -> None:
    queue.put_nowait(("done", index, task))


async def _unless_gone(receive: Receive, work: Awaitable[None]) -> bool:
    """Await ``work`` while watching the connection: ``False`` (``work`` cancelled) when
    the client went away first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            if not pending.done():
                pending.cancel()
        for ended in (gone, task):
            with contextlib.suppress(asyncio.CancelledError):
                await ended
    return not task.cancelled()


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (the body was read already, so the next message
    is ``http.disconnect``, sent when the connection closes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _cost_header(records: list[RunRecord]) -> str:
    cost = cost_of(records)
    return "unknown" if cost is None else f"{cost:.8f}"


# -- the request's edges ----------------------------------------------------------------


def _check_key(request: Request, keyring: KeyRing) -> ApiKey | None:
    """The caller's key (``None`` on a server that needs none), or 401."""
    return keyring.check(request.headers.get("authorization", ""))


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 when it is over ``limit`` bytes.  An over-long body is still
    read (up to 16 times the limit) so the client, still sending, gets the answer
    rather than a broken connection."""
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    body = bytearray()
    seen = 0
    try:
        async for part in request.stream():
            seen += len(part)
            if seen > limit:
                over = True
            if not over:
                body += part
            elif seen > 16 * limit:
                break
    except ClientDisconnect:
        # Gone before its body was in (or closed for being too slow): nobody reads this.
        raise ApiError(408, "the request body did not arrive", code="request_timeout") from None
    if over:
        raise ApiError(
            413,
            f"the request body is over the limit of {limit:,} bytes",
            code="request_too_large",
        )
    return bytes(body)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # Every secret value of the process is masked in what a client is sent.
    return Response(
        masked_json(body, ensure_ascii=False).encode(),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


async def _api_error(request: Request, exc: ApiError) -> Response:
    return _json(exc.body(), status=exc.status, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A run that raised instead of recording its failure: the server's set-up (a
    missing model file, a Conductor that cannot be prompted) or a defect."""
    return _json(broken_body(_server_message(exc)), status=500)


def _server_message(exc: Exception) -> str:
    """What the client is told of an exception: a conductor error's sentence, or only
    its kind (the traceback goes to the log)."""
    if isinstance(exc, ConductorError):
        return str(exc)
    log.error("an unexpected error answered a request as a server error", exc_info=exc)
    return f"internal error ({type(exc).__name__}); see the server's log"


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return _json(
        error_body(str(exc.detail), type="invalid_request_error", code=code),
        status=exc.status_code,
        headers=dict(exc.headers or {}),
    )
