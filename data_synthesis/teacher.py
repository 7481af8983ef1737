"""The teacher policy of a synthesis job: any `agent.backends` policy, wrapped in `RetryingPolicy`.

A long job must not die because one request failed. `RetryingPolicy` retries a failed `generate` call with
exponential back-off (`retrievers.retry.RetryPolicy`); if the whole batch keeps failing it asks each conversation
alone (so one bad request cannot sink its neighbours), and a conversation that still fails comes back as a `Completion(finish_reason="error")`,
which the agent loop records as `stop_reason="backend_error"` and the job as a `backend_error` rejection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.backends.base import BackendError, Completion, Message, Policy, SamplingParams, row_params, supports_grammar
from data_synthesis.config import TeacherSpec
from retrievers.retry import RetryPolicy, http_status, is_retryable

logger = logging.getLogger(__name__)

# What a local backend (transformers, vLLM in process) raises when a request fails: a server down, a timeout, an
# OOM. Retried besides the shared rule's connection errors, 5xx and 429. Anything else is a bug and propagates.
TRANSIENT = (BackendError, OSError, RuntimeError)


class _AllFailed(BackendError):
    """Every completion of a call is a retryable error (a failed attempt, as if the call had raised)."""


class _WrongCount(BackendError):
    """The backend answered the wrong number of conversations: a bug, never retried."""


def is_transient(error: BaseException) -> bool:
    """`retrievers.retry.is_retryable` (connection errors, 5xx, 429; never another 4xx) plus `TRANSIENT`."""
    if isinstance(error, _WrongCount) or http_status(error) is not None:
        return is_retryable(error)
    return is_retryable(error) or isinstance(error, TRANSIENT)


def worth_asking_again(c: Completion) -> bool:
    """An error completion another attempt may fix: not a bad input (too long a prompt), not already retried."""
    return not c.metadata.get("bad_input") and c.metadata.get("retryable", True)


class RetryingPolicy:
    """A `Policy` that retries failures of `inner` and turns persistent ones into error completions.

    The attempts and waits are `retrievers.retry.RetryPolicy`'s, the one retry policy. An inner policy that retries
    its own requests (`OpenAICompatiblePolicy`) marks its error completions `retryable: False`, so they are not
    retried a second time here; `build_teacher` hands it the teacher's policy instead.

    Args:
        inner: the teacher.
        retries: retries after the first failure (per call, then per conversation).
        backoff_s: first wait; doubles after each retry.
        sleep: injectable for tests.
    """

    def __init__(self, inner: Policy, retries: int = 3, backoff_s: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:  # fmt: skip
        self.inner = inner
        self.name = inner.name
        # retries change nothing about what is decoded: a teacher that enforces step grammars still does
        self.supports_grammar = supports_grammar(inner)
        self.retry = RetryPolicy.from_retries(retries, backoff_s)
        self._sleep = sleep
        self.failures = 0  # failed attempts seen (logged in the summary)

    def _once(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """One attempt: the completions, or a raised failure (`_AllFailed` when every completion is a retryable error)."""
        try:
            out = self.inner.generate(conversations, params)
        except Exception as e:
            if is_transient(e):
                self.failures += 1
            raise
        if len(out) != len(conversations):
            raise _WrongCount(f"teacher returned {len(out)} completions for {len(conversations)} conversations")
        if all(c.finish_reason == "error" and worth_asking_again(c) for c in out):
            self.failures += 1
            raise _AllFailed(out[0].metadata.get("error", "error completion"))
        return out

    def _call(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion] | str:
        """Completions, or the last error message once the retry policy gives up."""
        try:
            out = self.retry.call(
                lambda: self._once(conversations, params), is_transient, self._sleep, what="teacher request"
            )
        except Exception as e:
            if not is_transient(e):
                raise
            return str(e) if isinstance(e, _AllFailed) else f"{type(e).__name__}: {e}"
        again = [i for i, c in enumerate(out) if c.finish_reason == "error" and worth_asking_again(c)]
        if again:  # keep the good ones, retry only the failed items
            out = list(out)
            for i, c in zip(
                again, self.generate([conversations[i] for i in again], row_params(params, again)), strict=True
            ):
                out[i] = c
        return out

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """Like `inner.generate`, but never raises a transient error: failures become error completions."""
        if not conversations:
            return []
        out = self._call(conversations, params)
        if not isinstance(out, str):
            return out
        if len(conversations) == 1:
            return [Completion(text="", finish_reason="error", metadata={"error": out})]
        logger.warning("teacher batch of %d keeps failing; asking each conversation alone", len(conversations))
        result = []
        for i, conv in enumerate(conversations):
            one = self._call([conv], row_params(params, [i]))
            result.append(Completion(text="", finish_reason="error", metadata={"error": one})
                          if isinstance(one, str) else one[0])  # fmt: skip
        return result


def build_teacher(spec: TeacherSpec) -> RetryingPolicy:
    """The teacher `spec` names (through `agent.backends.factory.make_policy`), wrapped in `RetryingPolicy`.

    An OpenAI-compatible teacher retries each request itself, with the teacher's `retries` and `backoff_s`: one
    retry layer, not its defaults under ours.
    """
    from agent.backends.factory import make_policy
    from agent.backends.openai_compat import OpenAICompatiblePolicy

    inner = make_policy(spec.policy_config())
    if isinstance(inner, OpenAICompatiblePolicy):
        inner.retry = RetryPolicy.from_retries(spec.retries, spec.backoff_s)
    return RetryingPolicy(inner, retries=spec.retries, backoff_s=spec.backoff_s)
