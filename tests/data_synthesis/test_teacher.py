"""RetryingPolicy: back-off, retrying only failed items, and error completions instead of a dead job."""

from __future__ import annotations

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
