"""OpenAI's Batch API (and an ``api_base`` server that speaks it) as a
:class:`~conductor.llm.batchapi.BatchAPI`, over the ``openai`` SDK.

A batch is a JSONL file uploaded with ``purpose=batch`` (``POST /v1/files``), one line
``{custom_id, method: "POST", url: "/v1/chat/completions", body}`` per request, then
``POST /v1/batches`` naming it, with our label in its metadata (so a batch whose id was
never written down can be found by listing).  Each body is the one the live client
(:class:`~conductor.llm.openai_client.OpenAIClient`) sends, so a worker reached through
litellm as ``openai/...`` or ``hosted_vllm/...`` batches the same request too.  Once the
batch has ended its output file holds the answered lines and its error file the others;
a line's body is read by the live client's reader, and a line's error becomes the error
the live call would have raised.  A line never run (``batch_expired``,
``batch_cancelled``) is left out: the batcher sends it again.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ModelCallError
from .apikey import resolve_api_key
from .batchapi import BatchEntry, BatchLimits, BatchState, BatchStatus, LineOutcome, chunk_entries
from .failures import classify_sdk_error, error_for_status, message_from_body, scrub
from .openai_client import OpenAIClient
from .replies import openai_reply

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["LABEL_KEY", "OpenAIBatchAPI"]

#: The metadata key our label travels under.
LABEL_KEY = "conductor_label"
#: OpenAI's limits of one batch (50,000 requests, 200 MB), the bytes with a margin:
#: lines are measured before they are built (:func:`~conductor.llm.batchapi.entry_bytes`).
LIMITS = BatchLimits(50_000, 180 * 1024 * 1024)
#: Pages of batches looked through to find a label (newest first, 100 a page).
FIND_PAGES = 10
_ENDPOINT = "/v1/chat/completions"
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


class OpenAIBatchAPI:
    """One worker's batches at OpenAI (or its ``api_base`` server)."""

    limits = LIMITS

    def __init__(self, target: Worker) -> None:
        self.target = target
        self._live = OpenAIClient(target)
        self._client: Any = None
        self._key: str | None = None

    def _sdk(self) -> Any:
        key = resolve_api_key(self.target, OpenAIClient.capabilities.key_envs)
        if self._client is None or key != self._key:
            import openai

            self._client = openai.AsyncOpenAI(
                api_key=key,
                base_url=self.target.api_base or None,
                max_retries=0,
                timeout=self.target.timeout_s,
            )
            self._key = key
        return self._client

    def _failure(self, exc: Exception) -> BaseException:
        import openai

        if isinstance(exc, ModelCallError):
            return exc
        return classify_sdk_error(
            exc,
            openai,
            target=self.target.id,
            timeout_s=self.target.timeout_s,
            key=self._key,
            url=str(self._client.base_url) if self._client is not None else None,
        )

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        return chunk_entries(entries, self.limits, target=self.target.id)

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        client = self._sdk()
        lines = []
        for entry in entries:
            body = await self._live.line_body(entry.request)
            line = {"custom_id": entry.custom_id, "method": "POST", "url": _ENDPOINT, "body": body}
            lines.append(json.dumps(line, ensure_ascii=False))
        data = ("\n".join(lines) + "\n").encode()
        try:
            uploaded = await client.files.create(
                file=(f"{label}.jsonl", io.BytesIO(data), "application/jsonl"), purpose="batch"
            )
            batch = await client.batches.create(
                input_file_id=uploaded.id,
                endpoint=_ENDPOINT,
                completion_window="24h",
                metadata={LABEL_KEY: label},
            )
        except Exception as exc:  # classified; anything else is re-raised as the bug it is
            raise self._failure(exc) from None
        return str(batch.id)

    async def _retrieve(self, batch_id: str) -> Any:
        try:
            return await self._sdk().batches.retrieve(batch_id)
        except Exception as exc:  # classified; anything else is re-raised
            raise self._failure(exc) from None

    async def status(self, batch_id: str) -> BatchStatus:
        batch = await self._retrieve(batch_id)
        counts = batch.request_counts
        detail = str(batch.status)
        errors = getattr(getattr(batch, "errors", None), "data", None) or []
        if batch.status == "failed" and errors:
            first = errors[0]
            where = f"line {first.line}: " if first.line is not None else ""
            detail = f"failed: {where}{first.message or first.code}"
        return BatchStatus(
            _STATES.get(str(batch.status), "running"),
            total=counts.total if counts else 0,
            succeeded=counts.completed if counts else 0,
            failed=counts.failed if counts else 0,
            detail=scrub(detail, self._key),
        )

    async def results(self, batch_id: str) -> list[LineOutcome]:
        batch = await self._retrieve(batch_id)
        out: list[LineOutcome] = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            try:
                content = await self._sdk().files.content(file_id)
                text = content.text
            except Exception as exc:  # classified; anything else is re-raised
                raise self._failure(exc) from None
            for raw in text.splitlines():
                outcome = self._outcome(raw)
                if outcome is not None:
                    out.append(outcome)
        return out

    def _outcome(self, raw: str) -> LineOutcome | None:
        """One result line as an outcome; ``None`` for a line never run or one that
        cannot be read (both are sent again)."""
        try:
            line = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            return None
        custom_id = line["custom_id"]
        response = line.get("response")
        if not isinstance(response, dict):
            return None  # batch_expired, batch_cancelled: never run
        status = response.get("status_code")
        body = response.get("body")
        target = self.target.id
        if status == 200:
            try:
                return LineOutcome(custom_id, completion=openai_reply(body, target))
            except ModelCallError as exc:
                return LineOutcome(custom_id, error=exc)
        status = status if isinstance(status, int) else None
        message = scrub(str(message_from_body(body) or "no message"), self._key)
        return LineOutcome(custom_id, error=error_for_status(status, message, target=target))

    async def find(self, label: str) -> str | None:
        client = self._sdk()
        after: str | None = None
        try:
            for _ in range(FIND_PAGES):
                kwargs: dict[str, Any] = {"limit": 100}
                if after is not None:
                    kwargs["after"] = after
                page = await client.batches.list(**kwargs)
                for batch in page.data:
                    if (batch.metadata or {}).get(LABEL_KEY) == label:
                        return str(batch.id)
                if not page.data or not page.has_more:
                    return None
                after = page.data[-1].id
        except Exception as exc:  # classified; anything else is re-raised
            raise self._failure(exc) from None
        return None

    async def cancel(self, batch_id: str) -> None:
        try:
            await self._sdk().batches.cancel(batch_id)
        except Exception as exc:  # classified; anything else is re-raised
            raise self._failure(exc) from None

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
        await self._live.aclose()
