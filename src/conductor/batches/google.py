"""Gemini's batch mode (the Gemini Developer API's ``batchGenerateContent``) as a
:class:`~conductor.batches.api.BatchAPI`, over google-genai's async client.

A batch's requests go inline, in the one request that creates it (Gemini's other way
in, an uploaded JSONL file, is not used), so a batch holds at most 20 MB of them:
:meth:`GoogleBatchAPI.chunks` cuts to that.  Each is an ``InlinedRequest`` made of the
contents and config :meth:`~conductor.llm.google_client.GoogleClient.build_request`
builds for the live call, so that a line is the body the live call would send, with the
line's custom id in its ``metadata`` (``{"key": custom_id}``).  The label is the batch's
display name; :meth:`GoogleBatchAPI.find` looks for it among the batches listed, newest
first.

google-genai reads the batch (a long-running operation named ``batches/{id}``) as a
``BatchJob``: its ``state`` (``JOB_STATE_*``: the API's ``BATCH_STATE_*`` words as the
SDK renames them) and, once it is done, ``dest.inlined_responses``: each a
``GenerateContentResponse``, read as a live reply is (its JSON dump through
:func:`~conductor.llm.replies.gemini_reply`), or an ``error`` (a ``google.rpc.Status``:
its gRPC code stands for an HTTP status, and becomes our error as a live call's status
does).  An answer is matched to its request by the ``metadata`` it carries back
(google-genai reads it as ``InlinedResponse.metadata``), not by its place: python-genai
issue #1909 reports large batches answered out of order.  Where the API echoes no
metadata at all (issues #1886 and #2008 report backends that did not), the API
reference's word that answers come in the order of their requests is taken, but only
for a batch this object sent (the custom ids are known in order) and only when every
request has an answer: anything less certain is left out, and sent again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BadResponseError, ModelCallError
from ..llm.apikey import resolve_api_key
from ..llm.failures import error_for_status, scrub
from ..llm.google_client import GoogleClient, classify_google_error
from ..llm.replies import bad_response, body_of, gemini_reply
from ..llm.sdk import with_backstop
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

__all__ = [
    "GEMINI_BATCH_LIMITS",
    "GEMINI_INLINE_LIMIT_BYTES",
    "GoogleBatchAPI",
    "METADATA_KEY",
]

#: The most bytes of inline requests one batch may carry: the API's 20 MB (its request
#: size limit, 20971520 bytes).
GEMINI_INLINE_LIMIT_BYTES = 20 * 1024 * 1024

#: One batch's limits.  Google sets no count on inline requests; 10,000 keeps a status
#: read of an ended batch (which carries every answer) a sane size.
GEMINI_BATCH_LIMITS = BatchLimits(max_requests=10_000, max_bytes=GEMINI_INLINE_LIMIT_BYTES)

#: The ``metadata`` field a line's custom id goes in (the name Gemini's JSONL input
#: gives a line's id).
METADATA_KEY = "key"

# Bytes kept for what the creation request carries besides its lines (the model, the
# display name, the nesting): well over what they take.
_ENVELOPE_BYTES = 4096
# Bytes added to each line's measured size for what the SDK's conversion adds to it (the
# ``request`` nesting, a system instruction made a Content, the list's separator).
_LINE_SLACK_BYTES = 256

# batches.list pages read looking for a label: the newest 1,000 batches.
_FIND_PAGE_SIZE = 100
_FIND_PAGES = 10

# The SDK's job states in the BatchAPI's words.  A state not here (one Google adds) is
# taken as running: the batch is asked about again.
_STATES: dict[str, BatchState] = {
    "JOB_STATE_QUEUED": "validating",
    "JOB_STATE_PENDING": "validating",
    "JOB_STATE_RUNNING": "running",
    "JOB_STATE_CANCELLING": "running",
    "JOB_STATE_UPDATING": "running",
    "JOB_STATE_PAUSED": "running",
    "JOB_STATE_SUCCEEDED": "ended",
    "JOB_STATE_PARTIALLY_SUCCEEDED": "ended",
    "JOB_STATE_FAILED": "failed",
    "JOB_STATE_EXPIRED": "expired",
    "JOB_STATE_CANCELLED": "cancelled",
}

# The HTTP status each gRPC code (google.rpc.Code) stands for, as Google's HTTP
# mapping gives it: an error line's code is one of these.
_GRPC_STATUS: dict[int, int] = {
    1: 499,  # CANCELLED
    2: 500,  # UNKNOWN
    3: 400,  # INVALID_ARGUMENT
    4: 504,  # DEADLINE_EXCEEDED
    5: 404,  # NOT_FOUND
    6: 409,  # ALREADY_EXISTS
    7: 403,  # PERMISSION_DENIED
    8: 429,  # RESOURCE_EXHAUSTED
    9: 400,  # FAILED_PRECONDITION
    10: 409,  # ABORTED
    11: 400,  # OUT_OF_RANGE
    12: 501,  # UNIMPLEMENTED
    13: 500,  # INTERNAL
    14: 503,  # UNAVAILABLE
    15: 500,  # DATA_LOSS
    16: 401,  # UNAUTHENTICATED
}

T = TypeVar("T")


#: The API version batches are asked of: Gemini documents its batch mode under v1beta
#: (the live calls keep the SDK's default).  A server that speaks OpenAI's protocol too
#: (the test fake) then keeps OpenAI's ``/v1/batches`` and Gemini's apart.
BATCH_API_VERSION = "v1beta"


class GoogleBatchAPI:
    """Gemini's batch mode for one worker's key and model (see the module's
    docstring)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.limits: BatchLimits = GEMINI_BATCH_LIMITS
        # The live client builds each line, and its SDK client sends the batch requests.
        self._live = GoogleClient(worker, api_version=BATCH_API_VERSION)
        self._key: str | None = None
        # The custom ids of each batch this object sent, in order: for answers that come
        # back without their metadata.
        self._sent: dict[str, tuple[str, ...]] = {}

    # -- building lines ----------------------------------------------------------------

    def _inline(self, entry: BatchEntry) -> Any:
        """``entry`` as the SDK's ``InlinedRequest``."""
        from google.genai import types

        kwargs = self._live.build_request(entry.request, self.worker.timeout_s)
        config = kwargs["config"]
        if config is not None and config.http_options is not None:
            # A line is not an HTTP request of its own: its time-out and extra headers
            # have nowhere to go (the SDK would drop them from a line anyway).
            config = config.model_copy(update={"http_options": None})
        return types.InlinedRequest(
            contents=kwargs["contents"], config=config, metadata={METADATA_KEY: entry.custom_id}
        )

    def _size(self, entry: BatchEntry) -> int:
        """The bytes ``entry`` adds to the creation request: its JSON as the SDK writes
        it (ASCII, camelCase names), and the slack for the SDK's nesting."""
        dumped = self._inline(entry).model_dump(mode="json", by_alias=True, exclude_none=True)
        return len(json.dumps(dumped)) + _LINE_SLACK_BYTES

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        """``entries`` cut, in order, into batches of at most :attr:`limits`' count and
        bytes (a request over the byte limit on its own: ``BadRequestError``)."""
        return chunk_entries(
            entries,
            self.limits,
            target=self.worker.id,
            size_of=self._size,
            overhead=_ENVELOPE_BYTES,
        )

    # -- the batch API -----------------------------------------------------------------

    async def _call(self, make: Callable[[Any], Awaitable[T]]) -> T:
        """Await ``make(sdk client)``, its failures made our errors (the key masked)."""
        self._key = resolve_api_key(self.worker, GoogleClient.capabilities.key_envs)
        client = self._live.sdk_client()
        timeout_s = self.worker.timeout_s
        try:
            return await with_backstop(make(client), timeout_s)
        except ModelCallError:
            raise
        except Exception as exc:  # classified below; anything else is re-raised
            raise classify_google_error(
                exc,
                target=self.worker.id,
                timeout_s=timeout_s,
                url=self.worker.api_base,
                key=self._key,
            ) from None

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        from google.genai import types

        requests = [self._inline(entry) for entry in entries]
        config = types.CreateBatchJobConfig(display_name=label)
        job = await self._call(
            lambda client: client.aio.batches.create(
                model=self._live.model, src=requests, config=config
            )
        )
        name = getattr(job, "name", None)
        if not isinstance(name, str) or not name:
            raise bad_response(self.worker.id, "the batch was created without a name")
        self._sent[name] = tuple(entry.custom_id for entry in entries)
        return name

    async def _get(self, batch_id: str) -> Any:
        name = _batch_name(batch_id)
        return await self._call(lambda client: client.aio.batches.get(name=name))

    async def status(self, batch_id: str) -> BatchStatus:
        job = await self._get(batch_id)
        word = _state_word(job)
        answers = _answers(job)
        failed = sum(getattr(a, "error", None) is not None for a in answers)
        sent = self._sent.get(_batch_name(batch_id), ())
        return BatchStatus(
            _STATES.get(word, "running"),
            total=len(sent) or len(answers),
            succeeded=len(answers) - failed,
            failed=failed,
            detail=word,
        )

    async def results(self, batch_id: str) -> list[LineOutcome]:
        job = await self._get(batch_id)
        answers = _answers(job)
        keys = [_key_of(answer) for answer in answers]
        sent = self._sent.get(_batch_name(batch_id))
        if answers and not any(keys) and sent is not None and len(sent) == len(answers):
            # No metadata came back: the reference says answers are in request order.
            keys = list(sent)
        outcomes: list[LineOutcome] = []
        for answer, key in zip(answers, keys, strict=True):
            if not key:
                continue  # not matched to a request: left out, so it is sent again
            outcome = self._outcome(key, answer)
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes

    def _outcome(self, key: str, answer: Any) -> LineOutcome | None:
        """One answer as a line's outcome (``None``: it holds neither reply nor error)."""
        target = self.worker.id
        error = getattr(answer, "error", None)
        if error is not None:
            code = getattr(error, "code", None)
            status: int | None = code if isinstance(code, int) else None
            if status is not None and status < 100:
                # A gRPC code; an HTTP status (which some clients report) is kept.
                status = _GRPC_STATUS.get(status, 500)
            message = getattr(error, "message", None) or f"the request failed (code {code})"
            failure = error_for_status(status, scrub(str(message), self._key), target=target)
            return LineOutcome(key, error=failure)
        response = getattr(answer, "response", None)
        if response is None:
            return None
        try:
            # Read as the live client reads a reply: the SDK object's JSON dump.
            body = body_of(
                response, target, mode="json", exclude_none=True, exclude={"sdk_http_response"}
            )
            completion = gemini_reply(body, target, self._live.model)
        except BadResponseError as exc:
            return LineOutcome(key, error=exc)
        return LineOutcome(key, completion=completion)

    async def find(self, label: str) -> str | None:
        from google.genai import types

        config = types.ListBatchJobsConfig(page_size=_FIND_PAGE_SIZE)
        pager = await self._call(lambda client: client.aio.batches.list(config=config))
        for number in range(_FIND_PAGES):
            if number:
                if not pager.config.get("page_token"):
                    return None
                await self._call(lambda _client: pager.next_page())
            for job in pager.page:
                name = getattr(job, "name", None)
                if getattr(job, "display_name", None) == label and isinstance(name, str):
                    return name
        return None

    async def cancel(self, batch_id: str) -> None:
        name = _batch_name(batch_id)
        await self._call(lambda client: client.aio.batches.cancel(name=name))

    async def aclose(self) -> None:
        await self._live.aclose()


def _batch_name(batch_id: str) -> str:
    """A batch's resource name, as the SDK wants it (``batches/{id}``)."""
    return batch_id if batch_id.startswith("batches/") else f"batches/{batch_id}"


def _state_word(job: Any) -> str:
    """The SDK's word for the job's state (``JOB_STATE_UNSPECIFIED`` when it has none)."""
    state = getattr(job, "state", None)
    word = getattr(state, "value", state)
    return str(word) if word else "JOB_STATE_UNSPECIFIED"


def _answers(job: Any) -> list[Any]:
    """The inline answers of a done batch (none before it is done, or where it has
    none: failed, cancelled)."""
    answers = getattr(getattr(job, "dest", None), "inlined_responses", None)
    return list(answers) if isinstance(answers, list) else []


def _key_of(answer: Any) -> str | None:
    """The custom id an answer's metadata carries back, if any."""
    metadata = getattr(answer, "metadata", None)
    key = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    return key if isinstance(key, str) and key else None
