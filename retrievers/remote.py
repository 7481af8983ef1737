"""A retriever that asks a running retrieval service (`kbrouter serve-retrieval`) instead of loading indexes.

It satisfies the `Retriever` protocol, so the agent, synthesis, eval and training use a remote KB by one line of
KB config::

    knowledge_bases:
      - name: text
        kind: text
        corpus: ../../data/demo/passages.jsonl
        options: {remote: http://127.0.0.1:8765}     # remote_timeout, remote_retries, remote_kb are optional

Connection failures, 5xx and 429 answers are retried with exponential back-off (`retrievers.retry.RetryPolicy`, the
one retry policy); after the last try a `ConnectionError` names the URL and how to fix it (a 503 or no answer), or a
`RuntimeError` gives the service's message (another 5xx: the KB's search failed). Any other 4xx is not retried: it
raises `ValueError` with the service's message.
"""

from __future__ import annotations

import logging
import os

from retrievers.retry import RetryPolicy, retryable_status
from retrievers.types import Hit, Query, as_queries

logger = logging.getLogger(__name__)


class RemoteRetriever:
    """Searches KB `kb` of the retrieval service at `url`. Satisfies `Retriever`.

    Args:
        url: service base URL, e.g. `http://127.0.0.1:8765`.
        kb: KB name on the service.
        timeout: seconds per HTTP request.
        retries: extra attempts after a connection error, timeout, 5xx or 429.
        backoff: first back-off in seconds; doubled after every failed attempt.
        max_queries: queries per request (the service's `max_queries` bound); larger batches are split.
        api_key: Bearer key of a service started with `--api-key` (default: the first of `$KBROUTER_API_KEY`).
    """

    def __init__(
        self,
        url: str,
        kb: str,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_queries: int = 512,
        api_key: str | None = None,
    ) -> None:
        try:
            import httpx
        except ImportError as e:
            raise ImportError("RemoteRetriever needs httpx: pip install httpx") from e
        if retries < 0:
            raise ValueError(f"`retries` must be >= 0, got {retries}")
        self.url = url.rstrip("/")
        self.name = kb
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.retry = RetryPolicy.from_retries(retries, backoff)
        self.max_queries = max_queries
        self._httpx = httpx
        key = api_key or next(iter(os.environ.get("KBROUTER_API_KEY", "").split(",")), "").strip()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _post(self, payload: dict) -> dict:
        httpx = self._httpx

        def once() -> dict:
            response = self._client.post("/search", json=payload)
            response.raise_for_status()
            return response.json()

        try:
            return self.retry.call(once, what=f"retrieval service {self.url}")
        except httpx.HTTPStatusError as e:
            status, last = e.response.status_code, e
            try:
                message = e.response.json().get("error", e.response.text)
            except ValueError:
                message = e.response.text
            if not retryable_status(status):
                raise ValueError(f"retrieval service {self.url} rejected the request ({status}): {message}") from e
            if status != 503:  # the service answered, but the KB's search failed every time
                raise RuntimeError(
                    f"retrieval service {self.url} failed ({status}) after {self.retry.attempts} attempts: {message}"
                ) from e
        except httpx.TransportError as e:  # refused, reset, timed out
            last = e
        raise ConnectionError(
            f"retrieval service at {self.url} did not answer after {self.retry.attempts} attempts ({last}); start it "
            f"with `kbrouter serve-retrieval --kb <your KB yaml> --port <port>` or fix `remote:` in the KB YAML"
        )

    def search(self, queries: list[str | Query], k: int | None = None) -> list[list[Hit]]:
        """Top-k hits per query from the service; an empty query gets an empty list without a request.

        Args:
            queries: query strings or `Query`s (image paths must be readable by the service).
            k: hits per query; None uses the service's default for this KB.
        """
        qs = as_queries(queries)
        live = [i for i, q in enumerate(qs) if q.text.strip()]
        results: list[list[Hit]] = [[] for _ in qs]
        for start in range(0, len(live), self.max_queries):
            chunk = live[start : start + self.max_queries]
            items = []
            for i in chunk:
                item: dict = {"kb": self.name, "text": qs[i].text, "image": qs[i].image}
                if k is not None:
                    item["k"] = k
                items.append(item)
            answer = self._post({"queries": items})
            for i, hits in zip(chunk, answer["results"], strict=True):
                results[i] = [Hit.from_dict(h) for h in hits]
        return results


def remote_kb_from_config(cfg) -> RemoteRetriever:
    """The `RemoteRetriever` a KB config asks for with `options: {remote: URL}`.

    Optional options: `remote_kb` (name on the service; default `cfg.name`), `remote_timeout` (seconds),
    `remote_retries`.

    Args:
        cfg: a `retrievers.config.KBConfig` whose `options` has `remote`.

    Raises:
        ValueError: `options.remote` is missing or not an http(s) URL.
    """
    url = cfg.options.get("remote")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(
            f"KB {cfg.name!r}: `options.remote` must be the service URL, e.g. http://127.0.0.1:8765; got {url!r}"
        )
    return RemoteRetriever(
        url,
        kb=str(cfg.options.get("remote_kb", cfg.name)),
        timeout=float(cfg.options.get("remote_timeout", 60.0)),
        retries=int(cfg.options.get("remote_retries", 3)),
    )
