"""The teacher policy of a synthesis job: any `agent.backends` policy, wrapped in `RetryingPolicy`.

A long job must not die because one request failed. `RetryingPolicy` retries a failed `generate` call with
exponential back-off; if the whole batch keeps failing it asks each conversation alone (so one bad request cannot
sink its neighbours), and a conversation that still fails comes back as a `Completion(finish_reason="error")`,
which the agent loop records as `stop_reason="backend_error"` and the job as a `backend_error` rejection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.backends.base import BackendError, Completion, Message, Policy, SamplingParams
from data_synthesis.config import TeacherSpec

logger = logging.getLogger(__name__)

# Errors a backend raises when a request fails (server down, timeout, OOM). Anything else is a bug and propagates.
TRANSIENT = (BackendError, OSError, RuntimeError)


class RetryingPolicy:
    """A `Policy` that retries failures of `inner` and turns persistent ones into error completions.

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
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        self.failures = 0  # failed attempts seen (logged in the summary)

    def _call(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion] | str:
        """Completions, or the last error message after `retries` retries."""
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                out = self.inner.generate(conversations, params)
            except TRANSIENT as e:
                self.failures += 1
                error = f"{type(e).__name__}: {e}"
                logger.warning("teacher request failed (attempt %d/%d): %s", attempt + 1, self.retries + 1, error)
                continue
            if len(out) != len(conversations):
                raise BackendError(f"teacher returned {len(out)} completions for {len(conversations)} conversations")
            bad = [i for i, c in enumerate(out) if c.finish_reason == "error"]
            if not bad:
                return out
            if len(bad) < len(out):  # keep the good ones, retry only the failed items
                again = self.generate([conversations[i] for i in bad], params)
                out = list(out)
                for i, c in zip(bad, again, strict=True):
                    out[i] = c
                return out
            self.failures += 1
            error = out[0].metadata.get("error", "error completion")
            logger.warning("teacher returned errors (attempt %d/%d): %s", attempt + 1, self.retries + 1, error)
        return error

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
        for conv in conversations:
            one = self._call([conv], params)
            result.append(Completion(text="", finish_reason="error", metadata={"error": one})
                          if isinstance(one, str) else one[0])  # fmt: skip
        return result


def build_teacher(spec: TeacherSpec) -> RetryingPolicy:
    """The teacher `spec` names (through `agent.backends.factory.make_policy`), wrapped in `RetryingPolicy`."""
    from agent.backends.factory import make_policy

    return RetryingPolicy(make_policy(spec.policy_config()), retries=spec.retries, backoff_s=spec.backoff_s)
