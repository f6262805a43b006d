"""What the SDK clients share beyond keys: their imports, the model name without a
litellm provider prefix, which keywords an SDK method takes, a bound on a call's whole
duration, the one way an SDK's exception becomes ours (:func:`our_errors`), and
:class:`SdkClient`, the part of a client over the ``openai``, ``anthropic`` or
``google-genai`` SDK that does not depend on the provider.

No SDK is imported at module level: each is imported on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import ModelCallError
from .failures import classify_sdk_error

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "BACKSTOP_GRACE_S",
    "SdkClient",
    "import_litellm",
    "import_sdk",
    "keyword_names",
    "our_errors",
    "strip_prefix",
    "with_backstop",
]

#: Extra seconds the asyncio backstop allows beyond the SDK's own time-out, so that the
#: SDK's (better-described) time-out error normally fires first.
BACKSTOP_GRACE_S = 1.0

T = TypeVar("T")

_litellm: Any = None

#: Modules an SDK looks up in ``sys.modules`` at call time without importing them (openai
#: 3.x asks for ``httpx`` to accept the old transport's types; google-genai asks for
#: ``requests``). The SDKs are imported on worker threads, so another client's import
#: can be half-way through one of these while this SDK sends: it then finds a module
#: without its attributes and the call dies ("partially initialized module 'httpx' has
#: no attribute 'Timeout'"). Importing them to the end first closes that window for good:
#: Python's per-module import lock makes this thread wait for an import already under way.
_PEEKED_BY: dict[str, tuple[str, ...]] = {
    "openai": ("httpx",),
    "google.genai": ("requests",),
}


def import_sdk(name: str) -> Any:
    """The SDK module ``name``, imported along with every module it peeks at, so that no
    import on another thread can leave it reading a half-made one. Blocking: run it off
    the event loop."""
    for peeked in _PEEKED_BY.get(name, ()):
        # Not installed: the SDK finds nothing there and takes its own path.
        with contextlib.suppress(ImportError):
            importlib.import_module(peeked)
    return importlib.import_module(name)


def import_litellm() -> Any:
    """The ``litellm`` module, imported once (it is slow to import) and kept quiet."""
    global _litellm
    if _litellm is None:
        # Without this, importing litellm fetches its price map from the network.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        _litellm = litellm
    return _litellm


def strip_prefix(model: str, prefixes: tuple[str, ...]) -> str:
    """``model`` without a leading litellm provider prefix such as ``openai/``."""
    for prefix in prefixes:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model


def keyword_names(func: Any, fallback: frozenset[str]) -> frozenset[str]:
    """The keyword parameter names of an SDK method (``fallback`` if unknowable), so that
    settings the installed SDK version does not take go in ``extra_body`` instead."""
    import inspect

    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return fallback
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


async def with_backstop(awaitable: Awaitable[T], timeout_s: float) -> T:
    """Await ``awaitable`` but give up a little after ``timeout_s`` (raises TimeoutError).

    SDK time-outs apply per read, so a slow trickle of bytes could outlive them; this
    bounds the whole call.
    """
    limit = timeout_s + BACKSTOP_GRACE_S
    if _HAS_TIMEOUT_CM:
        async with asyncio.timeout(limit):  # type: ignore[attr-defined]
            return await awaitable
    return await asyncio.wait_for(awaitable, limit)


# asyncio.timeout (3.11+) avoids wrapping the call in an extra task.
_HAS_TIMEOUT_CM = hasattr(asyncio, "timeout")


@contextlib.contextmanager
def our_errors(classify: Callable[[Exception], BaseException]) -> Iterator[None]:
    """Around a call into a provider's library: one of our errors passes as it is, any
    other exception is raised as ``classify`` names it (an exception it returns
    unchanged is a bug, raised as it was), without the library's traceback chained."""
    try:
        yield
    except ModelCallError:
        raise
    except Exception as exc:  # classified; anything else is re-raised
        raise classify(exc) from None


class SdkClient:
    """What a client over a provider's SDK does alike for every provider: import the SDK
    off the event loop, name its exceptions as ours, close its connections.

    A subclass sets :attr:`sdk` and keeps its SDK client in ``_client`` and the key it
    was made with in ``_key``; the ``openai`` and ``anthropic`` SDKs raise the same
    exception classes (:func:`~conductor.llm.failures.classify_sdk_error`), another SDK
    overrides :meth:`classify` and, where its client closes otherwise, :meth:`close`.
    """

    #: The SDK's module name (``openai``, ``anthropic``, ``google.genai``).
    sdk: ClassVar[str]
    target: Worker
    _client: Any
    _key: str | None

    async def prepare(self) -> None:
        """Import the SDK off the event loop (seconds on a busy machine)."""
        await asyncio.to_thread(import_sdk, self.sdk)

    def errors(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """Around a call of the SDK: its exceptions raised as ours."""
        return our_errors(lambda exc: self.classify(exc, timeout_s))

    def classify(self, exc: Exception, timeout_s: float) -> BaseException:
        """Our error for an exception of a call through the SDK client."""
        return classify_sdk_error(
            exc,
            importlib.import_module(self.sdk),
            target=self.target.id,
            timeout_s=timeout_s,
            key=self._key,
            url=str(self._client.base_url) if self._client is not None else None,
        )

    async def close(self, client: Any) -> None:
        """Close an SDK client's connections."""
        await client.close()

    async def aclose(self) -> None:
        """Close the SDK client's connections."""
        if self._client is not None:
            client, self._client = self._client, None
            await self.close(client)
