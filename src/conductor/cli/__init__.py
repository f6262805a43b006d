"""The ``conductor`` command line: parse options, call the library, render the result.

This package is the only place that prints.  One module per command or command group
(:mod:`.ask`, :mod:`.bench` with ``report``, :mod:`.trace`, :mod:`.train`,
:mod:`.serve`, :mod:`.view`, :mod:`.pools`, :mod:`.cache`, :mod:`.export`,
:mod:`.fit_router`), each parsing its options, calling one library function and
rendering what it returns; :mod:`.app` builds the command tree and holds :func:`main`,
the console-script entry point; :mod:`._common` has the consoles, exit codes and error
line they share, :mod:`._ci` what ``bench`` and ``report`` share for CI
(``--fail-under``, ``--junit``, ``--markdown``), :mod:`._tracing` the ``--otel``
options three commands share.
"""

from __future__ import annotations

from .app import app, main
from .trace import TraceFormat

__all__ = ["TraceFormat", "app", "main"]
