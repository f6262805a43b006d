"""Test doubles for conductor and its users: a fake LLM provider server.

`FakeLLMServer` speaks the OpenAI, Anthropic and Gemini wire protocols on 127.0.0.1, so a
pool can be tested end to end with the real SDKs and no network or API key.
"""

from __future__ import annotations

from .fake_batch import BatchCall, BatchLine, BatchPlan, FakeBatch
from .fake_script import (
    SHAPES,
    FakeRequest,
    FakeToolCall,
    Fault,
    Reply,
    Responder,
    ResponderResult,
    Shape,
)
from .fake_server import FakeLLMServer

__all__ = [
    "SHAPES",
    "BatchCall",
    "BatchLine",
    "BatchPlan",
    "FakeBatch",
    "FakeLLMServer",
    "FakeRequest",
    "FakeToolCall",
    "Fault",
    "Reply",
    "Responder",
    "ResponderResult",
    "Shape",
]
