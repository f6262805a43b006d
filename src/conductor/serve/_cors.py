"""Cross-origin requests from a browser, for the origins a server lets in
(``--cors-origin``); with none, the app answers no preflight and sends no CORS header.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from a listed origin
is answered 204 here, before the routes, since a browser sends it without the bearer
token; one from any other origin is a 403 in OpenAI's error shape.  Every other
response to a listed origin carries ``Access-Control-Allow-Origin`` and exposes the
``x-conductor-*`` headers.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._protocol import error_body

__all__ = ["CorsMiddleware"]

_METHODS = "GET, POST, OPTIONS"
#: Always allowed; a preflight's other requested headers (an SDK's own) are allowed too.
_HEADERS = ("authorization", "content-type")
_EXPOSED = "x-conductor-run-id, x-conductor-cost-usd, retry-after"
_MAX_AGE_S = "600"


class CorsMiddleware:
    """Lets ``origins`` (``*``: any) call the app from a browser."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/") for o in origins)

    def _allowed(self, origin: str) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ``origin``, or ``None``."""
        if self.any:
            return "*"
        return origin if origin.rstrip("/") in self.origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self._allowed(origin)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(allowed, headers, send)
            return
        if allowed is None:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["access-control-allow-origin"] = allowed
                out["access-control-expose-headers"] = _EXPOSED
                if allowed != "*":
                    out.add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, allowed: str | None, headers: Headers, send: Send) -> None:
        if allowed is None:
            body = json.dumps(
                error_body(
                    "this origin may not call the server: start it with --cors-origin ORIGIN",
                    type="invalid_request_error",
                    code="cors_origin_not_allowed",
                )
            ).encode()
            out = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
            await send({"type": "http.response.start", "status": 403, "headers": out})
            await send({"type": "http.response.body", "body": body})
            return
        asked = [
            h.strip().lower()
            for h in headers.get("access-control-request-headers", "").split(",")
            if h.strip()
        ]
        allow_headers = ", ".join(dict.fromkeys([*_HEADERS, *asked]))
        out = [
            (b"access-control-allow-origin", allowed.encode()),
            (b"access-control-allow-methods", _METHODS.encode()),
            (b"access-control-allow-headers", allow_headers.encode("latin-1")),
            (b"access-control-max-age", _MAX_AGE_S.encode()),
        ]
        if allowed != "*":
            out.append((b"vary", b"Origin"))
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b""})
