"""What a caller masks: the target's keys as the environment holds them at each
attempt, not as it held them when the caller was made (litellm reads its key when it
calls, so a key set later is the one a provider could echo)."""

from __future__ import annotations

import pytest

from conductor.errors import AuthenticationError
from conductor.llm.caller import ModelCaller
from conductor.llm.keys import KnownSecrets, known_secrets
from conductor.llm.types import ModelRequest
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, Fault, Reply

KEY_ENV = "CONDUCTOR_TEST_LATE_KEY"


def request() -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": "hi"},))


async def test_a_key_set_after_the_caller_was_made_is_masked(
    fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    target = Worker(
        id="w1",
        model="m",
        client="openai",
        api_base=fake_server.openai_base,
        api_key_env=KEY_ENV,
        max_retries=0,
    )
    caller = ModelCaller(target)
    try:
        first = "sk-set-after-the-caller-1234567890"
        monkeypatch.setenv(KEY_ENV, first)
        fake_server.script("m", [Fault(401, f"Incorrect API key provided: {first}.")])
        with pytest.raises(AuthenticationError) as info:
            await caller.complete(request())
        assert first not in str(info.value) and "Incorrect API key" in str(info.value)
        # Changed again: the new value is masked, in a reply this time.
        second = "sk-changed-once-more-0987654321"
        monkeypatch.setenv(KEY_ENV, second)
        fake_server.script("m", [Reply(f"Your key is {second}.")])
        done = await caller.complete(request())
        assert done.text == "Your key is ***."
    finally:
        await caller.aclose()


def test_known_secrets_is_the_values_of_a_target_read_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = Worker(
        id="w1",
        model="m",
        client="openai",
        api_base="https://user:sk-in-the-url-password-42@example.test/v1",
        api_key_env=KEY_ENV,
    )
    monkeypatch.setenv(KEY_ENV, "sk-from-the-variable-123")
    secrets = KnownSecrets(target)
    assert secrets.values() == known_secrets(target)
    assert set(secrets.values()) == {"sk-from-the-variable-123", "sk-in-the-url-password-42"}
    monkeypatch.delenv(KEY_ENV)
    assert secrets.values() == ("sk-in-the-url-password-42",)
