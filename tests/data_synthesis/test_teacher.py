"""RetryingPolicy: back-off, retrying only failed items, and error completions instead of a dead job."""

from __future__ import annotations

import pytest

from agent.backends.base import BackendError, Completion, SamplingParams
from data_synthesis.teacher import RetryingPolicy

PARAMS = SamplingParams(max_new_tokens=4)


class Flaky:
    """Fails the first `fail_calls` calls (raising), and items whose text contains 'bad' for `bad_times` calls."""

    name = "flaky"

    def __init__(self, fail_calls: int = 0, bad_times: int = 0) -> None:
        self.fail_calls, self.bad_times, self.calls = fail_calls, bad_times, []

    def generate(self, conversations, params):
        self.calls.append([c[0]["content"] for c in conversations])
        if len(self.calls) <= self.fail_calls:
            raise BackendError("server down")
        out = []
        for c in conversations:
            text = c[0]["content"]
            failing = "bad" in text and sum(text in call for call in self.calls) <= self.bad_times
            out.append(Completion("", finish_reason="error", metadata={"error": "boom"}) if failing
                       else Completion(f"ok:{text}"))  # fmt: skip
        return out


def _convs(*texts: str) -> list[list[dict]]:
    return [[{"role": "user", "content": t}] for t in texts]


def test_transient_failures_are_retried_with_doubling_backoff():
    waits: list[float] = []
    policy = RetryingPolicy(Flaky(fail_calls=2), retries=3, backoff_s=1.5, sleep=waits.append)
    out = policy.generate(_convs("a", "b"), PARAMS)
    assert [c.text for c in out] == ["ok:a", "ok:b"]
    assert waits == [1.5, 3.0] and policy.failures == 2


def test_only_failed_items_are_asked_again():
    inner = Flaky(bad_times=1)
    out = RetryingPolicy(inner, retries=2, backoff_s=0, sleep=lambda s: None).generate(_convs("a", "bad", "c"), PARAMS)
    assert [c.text for c in out] == ["ok:a", "ok:bad", "ok:c"]
    assert inner.calls == [["a", "bad", "c"], ["bad"]]  # the good items were not regenerated


def test_persistent_failure_becomes_error_completion_for_that_item_only():
    inner = Flaky(bad_times=99)
    policy = RetryingPolicy(inner, retries=1, backoff_s=0, sleep=lambda s: None)
    out = policy.generate(_convs("a", "bad"), PARAMS)
    assert out[0].text == "ok:a" and out[1].finish_reason == "error" and out[1].metadata["error"] == "boom"


def test_a_batch_that_always_raises_is_split_per_conversation():
    class Poisoned(Flaky):
        def generate(self, conversations, params):
            self.calls.append([c[0]["content"] for c in conversations])
            if any("bad" in c[0]["content"] for c in conversations):
                raise BackendError("request rejected")
            return [Completion(f"ok:{c[0]['content']}") for c in conversations]

    inner = Poisoned()
    out = RetryingPolicy(inner, retries=1, backoff_s=0, sleep=lambda s: None).generate(_convs("a", "bad"), PARAMS)
    assert out[0].text == "ok:a" and out[1].finish_reason == "error" and "request rejected" in out[1].metadata["error"]
    assert inner.calls == [["a", "bad"], ["a", "bad"], ["a"], ["bad"], ["bad"]]


def test_an_error_the_inner_policy_already_retried_is_not_retried_again():
    """`OpenAICompatiblePolicy` retries its own requests and marks what is left `retryable: False`: one layer."""

    class Retried(Flaky):
        def generate(self, conversations, params):
            self.calls.append([c[0]["content"] for c in conversations])
            return [Completion("", finish_reason="error", metadata={"error": "HTTP 503", "retryable": False})
                    if "bad" in c[0]["content"] else Completion("ok") for c in conversations]  # fmt: skip

    waits: list[float] = []
    inner = Retried()
    out = RetryingPolicy(inner, retries=3, backoff_s=1, sleep=waits.append).generate(_convs("a", "bad"), PARAMS)
    assert [c.finish_reason for c in out] == ["stop", "error"] and out[1].metadata["error"] == "HTTP 503"
    assert inner.calls == [["a", "bad"]] and waits == []
    out = RetryingPolicy(inner, retries=3, backoff_s=1, sleep=waits.append).generate(_convs("bad"), PARAMS)
    assert out[0].finish_reason == "error" and len(inner.calls) == 2 and waits == []


def test_a_client_error_raised_by_the_inner_policy_propagates_unretried():
    import httpx

    class Rejecting(Flaky):
        def generate(self, conversations, params):
            self.calls.append(1)
            request = httpx.Request("POST", "http://x/v1")
            raise httpx.HTTPStatusError("HTTP 400", request=request, response=httpx.Response(400, request=request))

    inner = Rejecting()
    with pytest.raises(httpx.HTTPStatusError):
        RetryingPolicy(inner, retries=3, backoff_s=0, sleep=lambda s: None).generate(_convs("a"), PARAMS)
    assert inner.calls == [1]


def test_an_openai_teacher_retries_its_requests_with_the_teacher_settings():
    from data_synthesis.config import TeacherSpec
    from data_synthesis.teacher import build_teacher
    from retrievers.retry import RetryPolicy

    spec = TeacherSpec(backend="openai", model="m", kwargs={"base_url": "http://127.0.0.1:1/v1"}, retries=1,
                       backoff_s=0.25)  # fmt: skip
    teacher = build_teacher(spec)
    assert teacher.inner.retry == RetryPolicy(attempts=2, backoff_s=0.25) == teacher.retry


def test_the_wrapper_keeps_the_teachers_structured_output():
    """`agent.constrained` asks the policy it is given; the retry wrapper must not hide a grammar backend."""

    class WithGrammar(Flaky):
        supports_grammar = True

    assert RetryingPolicy(WithGrammar()).supports_grammar is True
    assert RetryingPolicy(Flaky()).supports_grammar is False
