"""The one retry policy: which failures are retried, how often, and the waits between attempts."""

from __future__ import annotations

import httpx
import pytest

from retrievers.retry import RetryPolicy, is_retryable

REQUEST = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def _status_error(status: int) -> httpx.HTTPStatusError:
    response = httpx.Response(status, request=REQUEST, text="no")
    return httpx.HTTPStatusError(f"HTTP {status}", request=REQUEST, response=response)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (httpx.ConnectError("refused", request=REQUEST), True),  # nothing listens (yet)
        (httpx.ReadTimeout("slow", request=REQUEST), True),  # the server is busy
        (ConnectionResetError("reset"), True),  # a socket error outside httpx
        (TimeoutError(), True),
        (_status_error(500), True),  # the server failed: it may recover
        (_status_error(503), True),
        (_status_error(429), True),  # too many requests: wait and ask again
        (_status_error(400), False),  # the request is wrong: asking again cannot help
        (_status_error(404), False),
        (_status_error(422), False),
        (ValueError("malformed JSON"), False),  # a bad answer or a bug: not transient
        (KeyError("choices"), False),
    ],
)
def test_connection_errors_5xx_and_429_are_retryable_other_4xx_never(error, retryable):
    assert is_retryable(error) is retryable


def test_waits_double_from_the_first_and_stop_at_the_cap():
    assert RetryPolicy(attempts=4, backoff_s=0.5).waits() == [0.5, 1.0, 2.0]
    assert RetryPolicy(attempts=5, backoff_s=10, max_backoff_s=25).waits() == [10, 20, 25, 25]
    assert RetryPolicy.from_retries(0, 1.0).waits() == []  # retries: 0 is one attempt


def _failing(errors: list[BaseException], calls: list[int]):
    def fn() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "ok"

    return fn


def test_a_retryable_failure_is_retried_until_it_succeeds():
    waits: list[float] = []
    calls: list[int] = []
    fn = _failing([_status_error(503), httpx.ConnectError("refused", request=REQUEST)], calls)
    assert RetryPolicy(attempts=3, backoff_s=0.25).call(fn, sleep=waits.append) == "ok"
    assert len(calls) == 3 and waits == [0.25, 0.5]


def test_a_client_error_is_raised_at_once_and_the_last_transient_one_after_the_attempts():
    calls: list[int] = []
    with pytest.raises(httpx.HTTPStatusError, match="HTTP 404"):
        RetryPolicy(attempts=5).call(_failing([_status_error(404)], calls), sleep=lambda s: None)
    assert len(calls) == 1
    calls.clear()
    errors = [_status_error(502), _status_error(502), _status_error(500)]
    with pytest.raises(httpx.HTTPStatusError, match="HTTP 500"):
        RetryPolicy(attempts=3).call(_failing(errors, calls), sleep=lambda s: None)
    assert len(calls) == 3


def test_a_custom_rule_decides_what_is_retried():
    calls: list[int] = []
    fn = _failing([RuntimeError("CUDA out of memory")], calls)
    assert RetryPolicy(attempts=2).call(fn, retryable=lambda e: isinstance(e, RuntimeError), sleep=lambda s: None)
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attempts": 0}, "attempts must be an integer >= 1"),
        ({"attempts": True}, "attempts must be an integer >= 1"),  # a bool is an int to Python
        ({"backoff_s": -1}, "back-off must be >= 0"),
    ],
)
def test_a_bad_policy_is_rejected_naming_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)
    with pytest.raises(ValueError, match=r"`retries` must be an integer >= 0, got -1"):
        RetryPolicy.from_retries(-1, 1.0)
