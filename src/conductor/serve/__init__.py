"""``conductor serve``: any orchestration as an OpenAI-compatible model.

:func:`create_app` builds the FastAPI app for a :class:`ServeSettings`;
:func:`serve_in_thread` runs it under uvicorn in a background thread (what tests and
notebooks use), :func:`run_server` in the foreground (what the CLI uses).  Importing
this package imports FastAPI and uvicorn (the ``serve`` extra).
"""

from __future__ import annotations

from ._app import create_app
from ._keys import ApiKey, KeysFileError, load_keys, load_keys_text
from ._server import run_server, serve_in_thread
from ._settings import ServeSettings

__all__ = [
    "ApiKey",
    "KeysFileError",
    "ServeSettings",
    "create_app",
    "load_keys",
    "load_keys_text",
    "run_server",
    "serve_in_thread",
]
