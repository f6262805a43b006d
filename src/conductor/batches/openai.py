"""OpenAI's Batch API, and an ``api_base`` server that speaks it: :class:`OpenAIBatchAPI`.

A batch is a JSONL file of requests uploaded to ``/v1/files`` (``purpose=batch``), one
line ``{custom_id, method: "POST", url: "/v1/chat/completions", body}`` per call, and a
batch made of that file at ``/v1/batches``, labelled in its metadata.  Each line's body
is exactly what the live client (:class:`~conductor.llm.openai_client.OpenAIClient`)
sends for the same request, built by that client's own :meth:`~conductor.llm.
openai_client.OpenAIClient.build_kwargs`, so a batch answer is the answer a live call
would have had, at half the price.  Both a ``client: openai`` worker and a litellm
worker of an ``openai/`` or ``hosted_vllm/`` model are served (the builder strips the
prefix).

A batch that has ended has up to two result files: the *output file* (lines answered
with status 200) and the *error file* (lines answered with an error status, and lines
never run because the batch expired or was cancelled).  Each answered line is read as
the live client reads a reply (:func:`~conductor.llm.replies.openai_reply`) or its
error (:func:`~conductor.llm.failures.error_for_status`); a line never run has no
outcome, so that the caller sends it again.

Nothing here decides what to batch or when: that is :mod:`conductor.batches.waves`'s.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BadRequestError, ModelCallError
from ..llm.apikey import PROVIDER_KEY_ENVS, resolve_api_key
from ..llm.failures import (
    classify_sdk_error,
    error_for_status,
    make_error,
    message_from_body,
    scrub,
)
from ..llm.openai_client import OpenAIClient
from ..llm.replies import body_of, openai_reply
from ..llm.sdk import import_sdk
from ..llm.types import ModelRequest, RawCompletion
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

__all__ = ["ENDPOINT", "LABEL_KEY", "OPENAI_BATCH_LIMITS", "OpenAIBatchAPI", "status_of"]

T = TypeVar("T")

#: The endpoint every line of a batch calls.
ENDPOINT = "/v1/chat/completions"

#: The metadata key a batch's label is sent under (metadata is what OpenAI keeps of a
#: name of ours, and lists batches with).
LABEL_KEY = "conductor_label"

#: OpenAI's limits on one batch: 50,000 requests, and an input file of 200 MB.
OPENAI_BATCH_LIMITS = BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024)

# How many pages of batches, of how many each, find() reads before it gives up: the
# batch it looks for was sent by a run that was killed, so it is among the newest.
_FIND_PAGES = 10
_PAGE_SIZE = 100

# The bytes a grammar's field name may add to a line once the server's kind is known
# (chunks() measures lines before submit() asks the server which field it reads).
_GRAMMAR_SLACK = 64

# Result lines of requests the provider never ran: they have no outcome.
_NOT_RUN = frozenset({"batch_expired", "batch_cancelled"})

# OpenAI's status words in the common terms.  A batch finalizing (writing its files)
# or cancelling has not stopped changing yet.
_STATES: dict[str, BatchState] = {
    "validating": "validating",
    "in_progress": "running",
    "finalizing": "running",
    "cancelling": "running",
    "completed": "ended",
    "failed": "failed",
    "expired": "expired",
    "cancelled": "cancelled",
}

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _key_envs(target: Worker) -> tuple[str, ...]:
    """Where the key is read from: a native worker's client's variables; a litellm
    worker's those litellm reads for its model's prefix (``hosted_vllm/`` its own)."""
    native = OpenAIClient.capabilities.key_envs
    if (target.client or "litellm") == "litellm" and "/" in target.model:
        return PROVIDER_KEY_ENVS.get(target.model.split("/", 1)[0], native)
    return native


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _errors_text(errors: Any) -> str | None:
    """A failed batch's ``errors.data`` as one line: each error's line and message."""
    data = errors.get("data") if isinstance(errors, Mapping) else None
    if not isinstance(data, list):
        return None
    parts: list[str] = []
    for item in data[:5]:
        if not isinstance(item, Mapping):
            continue
        message = str(item.get("message") or item.get("code") or "no message")
        line = item.get("line")
        parts.append(f"line {line}: {message}" if isinstance(line, int) else message)
    more = len(data) - 5
    text = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    return text or None


def status_of(batch: Mapping[str, Any]) -> BatchStatus:
    """A Batch object (as a dict) as a :class:`BatchStatus`.  A status word OpenAI may
    add later is taken as still running: waiting longer is safe, ending early not."""
    word = batch.get("status")
    state: BatchState = _STATES.get(word, "running") if isinstance(word, str) else "running"
    counts = batch.get("request_counts")
    counts = counts if isinstance(counts, Mapping) else {}
    detail = word if isinstance(word, str) else None
    if state == "failed":
        detail = _errors_text(batch.get("errors")) or detail
    return BatchStatus(
        state,
        total=_int(counts.get("total")),
        succeeded=_int(counts.get("completed")),
        failed=_int(counts.get("failed")),
        detail=detail,
    )


class OpenAIBatchAPI:
    """One worker's batches through ``openai.AsyncOpenAI``'s ``files`` and ``batches``."""

    def __init__(self, target: Worker) -> None:
        self.target = target
        self.limits: BatchLimits = OPENAI_BATCH_LIMITS
        # The live client builds the lines (and settles the grammar's field); it never
        # sends anything itself here.
        self._builder = OpenAIClient(target)
        self._envs = _key_envs(target)
        self._client: Any = None
        self._key: str | None = None
        # The custom ids of the batches this object sent, by batch id: a result line
        # whose custom id is not among them is not ours.  (A batch found after a crash
        # has none here: its lines are taken as they come.)
        self._sent: dict[str, frozenset[str]] = {}
        # The requests whose reply a grammar must admit, by custom id, so that a batch
        # reply is checked as the live call's is (only these are kept: a wave's prompts
        # are large).
        self._grammars: dict[str, ModelRequest] = {}

    def _sdk(self) -> Any:
        key = resolve_api_key(self.target, self._envs)
        if self._client is None or key != self._key:
            openai = import_sdk("openai")
            self._client = openai.AsyncOpenAI(
                api_key=key,
                base_url=self.target.api_base or None,
                max_retries=0,
                timeout=self.target.timeout_s,
            )
            self._key = key
        return self._client

    async def _call(self, method: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)`` of the SDK, its exceptions made ours."""
        try:
            return await method(*args, **kwargs)
        except ModelCallError:
            raise
        except Exception as exc:  # classified below; anything else is re-raised
            import openai

            raise classify_sdk_error(
                exc,
                openai,
                target=self.target.id,
                timeout_s=self.target.timeout_s,
                key=self._key,
                url=str(self._client.base_url) if self._client is not None else None,
            ) from None

    # -- lines -----------------------------------------------------------------------------

    def line(self, entry: BatchEntry) -> bytes:
        """``entry`` as one line of the input file, newline included: the body the live
        client would send for its request."""
        kwargs = self._builder.build_kwargs(entry.request)
        # A batch line is a body and nothing else: the HTTP headers a live call would
        # add (extra_headers) have no place in it, so they are left out.
        kwargs.pop("extra_headers", None)
        # What the SDK merges into the body of a live call, merged here the same way
        # (its keys over the keyword arguments').
        extra = kwargs.pop("extra_body", None) or {}
        body = {**kwargs, **extra}
        line = {"custom_id": entry.custom_id, "method": "POST", "url": ENDPOINT, "body": body}
        try:
            text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise make_error(
                BadRequestError,
                target=self.target.id,
                provider_message=f"the request cannot be written as a batch line: {exc}",
            ) from None
        return text.encode("utf-8") + b"\n"

    def _size(self, entry: BatchEntry) -> int:
        size = len(self.line(entry))
        if entry.request.grammar is not None and self._builder.grammar.applies:
            size += _GRAMMAR_SLACK
        return size

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        """``entries`` cut, in order, into batches within :attr:`limits` (each line
        measured as it will be written)."""
        return chunk_entries(entries, self.limits, target=self.target.id, size_of=self._size)

    # -- the batch API -------------------------------------------------------------------

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        """Upload ``entries`` as a JSONL file and make a batch of it labelled ``label``."""
        client = self._sdk()
        for entry in entries:
            # Which field carries a grammar is asked of the server once, before the
            # first line that needs it is built (as a live call asks before sending).
            await self._builder.grammar.resolve(entry.request, api_key=self._key)
        data = b"".join(self.line(entry) for entry in entries)
        name = _UNSAFE_NAME.sub("_", label)[:100] + ".jsonl"
        uploaded = await self._call(
            client.files.create, file=(name, data, "application/jsonl"), purpose="batch"
        )
        try:
            batch = await self._call(
                client.batches.create,
                input_file_id=uploaded.id,
                endpoint=ENDPOINT,
                completion_window="24h",
                metadata={LABEL_KEY: label},
            )
        except BadRequestError:
            # Refused: no batch holds the file, so it is not left behind.  (After a
            # time-out the batch may exist, and must keep its file.)
            with contextlib.suppress(Exception):
                await client.files.delete(uploaded.id)
            raise
        batch_id = str(batch.id)
        self._sent[batch_id] = frozenset(entry.custom_id for entry in entries)
        for entry in entries:
            if entry.request.grammar is not None and self._builder.grammar.applies:
                self._grammars[entry.custom_id] = entry.request
        return batch_id

    async def _batch(self, batch_id: str) -> dict[str, Any]:
        client = self._sdk()
        return body_of(await self._call(client.batches.retrieve, batch_id), self.target.id)

    async def status(self, batch_id: str) -> BatchStatus:
        """Where the batch stands (a read of it, which is what moves it on)."""
        return status_of(await self._batch(batch_id))

    async def results(self, batch_id: str) -> list[LineOutcome]:
        """The outcomes of the batch's output and error files (the lines never run, torn
        lines and lines not of this batch left out; a custom id's first line wins)."""
        batch = await self._batch(batch_id)
        client = self._sdk()
        ours = self._sent.get(batch_id)
        out: dict[str, LineOutcome] = {}
        for field in ("output_file_id", "error_file_id"):
            file_id = batch.get(field)
            if not isinstance(file_id, str) or not file_id:
                continue
            content = await self._call(client.files.content, file_id)
            for raw in content.content.splitlines():
                outcome = await self._outcome(raw, ours)
                if outcome is not None and outcome.custom_id not in out:
                    out[outcome.custom_id] = outcome
        return list(out.values())

    async def _outcome(self, raw: bytes, ours: frozenset[str] | None) -> LineOutcome | None:
        """One result line's outcome; ``None`` for a line never run or unreadable."""
        try:
            item = json.loads(raw)
        except ValueError:
            return None  # torn, or not JSON at all: its call is sent again
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not custom_id:
            return None
        if ours is not None and custom_id not in ours:
            return None
        target = self.target.id
        response = item.get("response")
        status = response.get("status_code") if isinstance(response, dict) else None
        if isinstance(response, dict) and isinstance(status, int):
            body = response.get("body")
            if 200 <= status < 300:
                try:
                    completion = await self._completion(body, self._grammars.get(custom_id))
                except ModelCallError as exc:
                    return LineOutcome(custom_id, error=exc)
                return LineOutcome(custom_id, completion=completion)
            message = message_from_body(body) or f"HTTP {status}"
            error = error_for_status(status, scrub(message, self._key), target=target)
            return LineOutcome(custom_id, error=error)
        failure = item.get("error")
        if not isinstance(failure, dict) or failure.get("code") in _NOT_RUN:
            return None
        # A failure with no HTTP status of its own: the provider's, which may pass.
        message = str(failure.get("message") or failure.get("code") or "no message")
        error = error_for_status(None, scrub(message, self._key), target=target)
        return LineOutcome(custom_id, error=error)

    async def _completion(self, body: Any, request: ModelRequest | None) -> RawCompletion:
        """A status-200 line's body, read as the live client reads its reply."""
        target = self.target.id
        if isinstance(body, dict):
            # Through the SDK's own reply type, as a live reply is, so that the kept
            # body has the same fields either way.
            from openai.types.chat import ChatCompletion

            with contextlib.suppress(Exception):
                body = body_of(ChatCompletion.construct(**body), target)
        raw = openai_reply(body, target)
        if request is not None:
            await self._builder.grammar.check(raw, request, api_key=self._key)
        return raw

    async def find(self, label: str) -> str | None:
        """The newest batch whose metadata carries ``label`` (among the newest thousand
        batches of the key), or ``None``."""
        client = self._sdk()
        page = await self._call(client.batches.list, limit=_PAGE_SIZE)
        for _ in range(_FIND_PAGES):
            for batch in page.data:
                metadata = getattr(batch, "metadata", None)
                if isinstance(metadata, Mapping) and metadata.get(LABEL_KEY) == label:
                    return str(batch.id)
            if not page.has_next_page():
                break
            page = await self._call(page.get_next_page)
        return None

    async def cancel(self, batch_id: str) -> None:
        """Ask OpenAI to stop the batch; one that has already ended is left as it is."""
        client = self._sdk()
        try:
            await self._call(client.batches.cancel, batch_id)
        except BadRequestError:
            # OpenAI refuses to cancel a batch that has ended: nothing is left to stop.
            if (await self.status(batch_id)).terminal:
                return
            raise

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
