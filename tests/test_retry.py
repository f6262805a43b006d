"""Back-off, Retry-After handling and error classification."""

from __future__ import annotations

import email.utils
import time

import pytest

from conductor.errors import (
    AuthenticationError,
    BadRequestError,
    RateLimitError,
    RequestTimeoutError,
    ServerError,
)
from conductor.llm.failures import (
    error_for_status,
    make_error,
    message_from_body,
    parse_retry_after,
    scrub,
)
from conductor.llm.retry import MAX_RETRY_AFTER_S, RetryPolicy, send_with_retries
from conductor.llm.types import RawCompletion, Usage

OK = RawCompletion(text="ok", usage=Usage(1, 1), raw={})


class Script:
    """A send() that raises the given errors in turn, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> RawCompletion:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return OK


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, s: float) -> None:
        self.waits.append(s)


def server_error(retry_after: float | None = None) -> ServerError:
    return make_error(ServerError, target="w", status=500, retry_after_s=retry_after)


def test_backoff_is_exponential_capped_and_jittered() -> None:
    policy = RetryPolicy(10, base_delay_s=0.5, max_delay_s=4.0, jitter=0.25)
    mid = [policy.delay_s(n, lambda: 0.5, None) for n in range(1, 7)]
    assert mid == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.delay_s(2, lambda: 0.0, None) == pytest.approx(0.75)
    assert policy.delay_s(2, lambda: 1.0, None) == pytest.approx(1.25)


def test_retry_after_is_a_floor_with_a_cap() -> None:
    policy = RetryPolicy(3, jitter=0.25)
    assert policy.delay_s(1, lambda: 0.0, 9.0) == 9.0
    assert policy.delay_s(1, lambda: 0.0, 10_000.0) == MAX_RETRY_AFTER_S
    # A short Retry-After does not shorten the normal back-off.
    assert policy.delay_s(3, lambda: 0.5, 0.1) == 2.0


async def test_retries_until_success_and_counts_attempts() -> None:
    send = Script(
        server_error(), make_error(RateLimitError, target="w", status=429, retry_after_s=3)
    )
    sleeps = Sleeps()
    raw, attempts = await send_with_retries(send, RetryPolicy(5), sleep=sleeps, rng=lambda: 0.5)
    assert raw is OK and attempts == 3 and send.calls == 3
    assert sleeps.waits == [0.5, 3.0]


@pytest.mark.parametrize("cls", [AuthenticationError, BadRequestError])
async def test_non_retryable_raise_at_once(cls: type) -> None:
    send = Script(make_error(cls, target="w", status=400), server_error())
    sleeps = Sleeps()
    with pytest.raises(cls) as info:
        await send_with_retries(send, RetryPolicy(5), sleep=sleeps)
    assert info.value.attempts == 1 and send.calls == 1 and sleeps.waits == []


async def test_exhausted_retries_reraise_last_error() -> None:
    last = make_error(RequestTimeoutError, target="w", provider_message="the last one")
    send = Script(server_error(), server_error(), last)
    with pytest.raises(RequestTimeoutError) as info:
        await send_with_retries(send, RetryPolicy(2), sleep=Sleeps())
    # The last error, passed on with its attempt count (the raised one is not changed).
    assert type(info.value) is RequestTimeoutError and info.value.attempts == 3
    assert info.value.provider_message == "the last one" and str(info.value) == str(last)
    assert last.attempts is None


async def test_zero_retries_means_one_attempt() -> None:
    send = Script(server_error())
    with pytest.raises(ServerError) as info:
        await send_with_retries(send, RetryPolicy(0), sleep=Sleeps())
    assert info.value.attempts == 1


async def test_other_exceptions_are_not_retried() -> None:
    send = Script(ValueError("a bug"))
    with pytest.raises(ValueError):
        await send_with_retries(send, RetryPolicy(5), sleep=Sleeps())
    assert send.calls == 1


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "12"}) == 12.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (parse_retry_after({"retry-after": when}) or 0) <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None and parse_retry_after(None) is None


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (429, RateLimitError),
        (500, ServerError),
        (502, ServerError),
        (503, ServerError),
        (529, ServerError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (400, BadRequestError),
        (404, BadRequestError),
        (422, BadRequestError),
        (409, BadRequestError),
    ],
)
def test_error_for_status(status: int, cls: type) -> None:
    err = error_for_status(status, "provider says no", target="w1", headers={"Retry-After": "4"})
    assert type(err) is cls
    assert err.status == status and err.provider_message == "provider says no"
    assert err.retry_after_s == 4.0
    assert "w1" in str(err) and f"HTTP {status}" in str(err) and "provider says no" in str(err)


def test_message_from_body_shapes() -> None:
    assert message_from_body({"error": {"message": "a"}}) == "a"
    assert message_from_body({"type": "error", "error": {"type": "x", "message": "b"}}) == "b"
    assert message_from_body('{"error": {"code": 400, "message": "c"}}') == "c"
    assert message_from_body([{"error": {"message": "d"}}]) == "d"
    assert message_from_body("plain text") == "plain text"
    assert message_from_body(None) is None


def test_scrub_masks_secret() -> None:
    assert scrub("key sk-abcdef was wrong", "sk-abcdef") == "key *** was wrong"
    assert scrub("nothing here", None) == "nothing here"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_cuts_attempts_to_what_remains() -> None:
    from conductor.llm.retry import MIN_ATTEMPT_S, Deadline

    clock = Clock()
    deadline = Deadline(10.0, clock=clock)
    assert deadline.attempt_timeout_s(600.0) == 10.0
    assert deadline.attempt_timeout_s(3.0) == 3.0
    clock.now += 8.0
    assert deadline.attempt_timeout_s(600.0) == pytest.approx(2.0)
    assert deadline.allows_wait(1.0) and not deadline.allows_wait(2.0)
    clock.now += 5.0  # past the end: an attempt still gets the minimum, never zero
    assert deadline.attempt_timeout_s(600.0) == MIN_ATTEMPT_S
    unlimited = Deadline(None, clock=clock)
    assert unlimited.attempt_timeout_s(600.0) == 600.0 and unlimited.allows_wait(1e9)


async def test_send_with_retries_stops_when_the_deadline_leaves_no_time() -> None:
    from conductor.llm.retry import Deadline

    clock = Clock()
    deadline = Deadline(20.0, clock=clock)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    async def send() -> RawCompletion:
        clock.now += 6.0  # each attempt times out after 6 s
        raise make_error(RequestTimeoutError, target="w", provider_message="no reply")

    policy = RetryPolicy(max_retries=10, base_delay_s=1.0, jitter=0.0)
    with pytest.raises(RequestTimeoutError, match="total_timeout_s of 20 s ran out") as info:
        await send_with_retries(send, policy, sleep=sleep, deadline=deadline)
    # 6 s, wait 1, 6 s, wait 2 (t = 15), 6 s (t = 21): no time for a fourth.
    assert info.value.attempts == 3  # type: ignore[attr-defined]
    assert waits == [1.0, 2.0]


async def test_a_retry_after_beyond_the_deadline_fails_now() -> None:
    from conductor.llm.retry import Deadline

    clock = Clock()
    script = Script(
        make_error(RateLimitError, target="w", provider_message="slow", retry_after_s=60.0)
    )
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    with pytest.raises(RateLimitError) as info:
        await send_with_retries(
            script, RetryPolicy(5), sleep=sleep, deadline=Deadline(30.0, clock=clock)
        )
    assert script.calls == 1 and waits == []
    assert info.value.retry_after_s == 60.0


def test_an_error_is_replaced_with_new_fields_never_changed() -> None:
    from conductor.errors import ConnectionRefusedByHostError

    first = make_error(
        ConnectionRefusedByHostError,
        target="w",
        provider_message="Connection refused",
        host="127.0.0.1",
        port=9,
    )
    assert first.max_retries == 1 and first.attempts is None  # the class's cap
    again = first.replace(attempts=3, max_retries=2)
    assert type(again) is ConnectionRefusedByHostError and again is not first
    assert (again.attempts, again.max_retries, again.host, again.port) == (3, 2, "127.0.0.1", 9)
    assert str(again) == str(first) and first.attempts is None and first.max_retries == 1
    described = first.replace(attempts=3, described=True)
    assert "after 3 attempts" in str(described) and "after" not in str(first)
    assert first.with_target("w") is first
    moved = first.with_target("other")
    assert moved.target == "other" and first.target == "w" and str(moved) == str(first)
    with pytest.raises(TypeError, match="no field 'colour'"):
        first.replace(colour="red")
