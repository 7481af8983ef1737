"""One bounded retry policy: how many attempts, how long to wait between them, which failures are worth another try.

Used by every client that talks to a server (`agent.backends.openai_compat`, `retrievers.remote`) and by the
synthesis teacher (`data_synthesis.teacher.RetryingPolicy`), so a request is retried in one place only. No
maintained retry library is a dependency (tenacity and backoff are not installed, and httpx's transport
`retries` covers connection failures only, not 5xx or 429), so the policy is this small class.

Retryable: connection errors and timeouts (`ConnectionError`, `TimeoutError`, `httpx.TransportError`) and HTTP
responses 5xx and 429 (`httpx.HTTPStatusError`). Never retried: any other HTTP status (4xx: the request itself is
wrong) and every other exception (bugs, malformed answers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Decides whether a failure is worth another attempt (default: `is_retryable`).
RetryPredicate = Callable[[BaseException], bool]


def retryable_status(status: int) -> bool:
    """HTTP 5xx (the server may recover) and 429 (too many requests: wait) are retryable; nothing else is."""
    return status == 429 or status >= 500


def http_status(error: BaseException) -> int | None:
    """The status code of an `httpx.HTTPStatusError`; None for any other exception."""
    try:
        import httpx
    except ImportError:  # no HTTP client installed: no HTTP status error can exist
        return None
    return error.response.status_code if isinstance(error, httpx.HTTPStatusError) else None


def is_retryable(error: BaseException) -> bool:
    """Connection errors, timeouts, HTTP 5xx and 429: True; any other HTTP status and any other error: False."""
    status = http_status(error)
    if status is not None:
        return retryable_status(status)
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    try:
        import httpx
    except ImportError:
        return False
    return isinstance(error, httpx.TransportError)  # refused, reset, timed out, protocol error


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries in all; the wait before retry `n` (0-based) is `backoff_s * 2**n`, capped at `max_backoff_s`.

    Example:
        >>> RetryPolicy(attempts=4, backoff_s=0.5).waits()
        [0.5, 1.0, 2.0]
    """

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"retry attempts must be an integer >= 1 (retries + 1), got {self.attempts!r}")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"retry back-off must be >= 0 seconds, got backoff_s={self.backoff_s}, max_backoff_s={self.max_backoff_s}"
            )

    @classmethod
    def from_retries(cls, retries: int, backoff_s: float) -> RetryPolicy:
        """The policy of a config that counts retries after the first try (`retries: 3` is 4 attempts)."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"`retries` must be an integer >= 0, got {retries!r}")
        return cls(attempts=retries + 1, backoff_s=backoff_s)

    def wait(self, retry: int) -> float:
        """Seconds to sleep before retry `retry` (0 for the first retry)."""
        return min(self.backoff_s * 2**retry, self.max_backoff_s)

    def waits(self) -> list[float]:
        """Every wait of a call that fails all its attempts, in order."""
        return [self.wait(n) for n in range(self.attempts - 1)]

    def call(
        self,
        fn: Callable[[], T],
        retryable: RetryPredicate = is_retryable,
        sleep: Callable[[float], None] = time.sleep,
        what: str = "request",
    ) -> T:
        """`fn()`, tried again after a retryable failure until the attempts run out.

        Raises:
            Exception: the last failure, when it is not retryable or no attempt is left.
        """
        for attempt in range(self.attempts):
            try:
                return fn()
            except Exception as e:
                if attempt == self.attempts - 1 or not retryable(e):
                    raise
                wait = self.wait(attempt)
                logger.warning(
                    "%s failed (attempt %d/%d): %s: %s; retrying in %.2fs",
                    what, attempt + 1, self.attempts, type(e).__name__, e, wait,
                )  # fmt: skip
                sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")
