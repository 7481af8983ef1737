"""OpenAI-compatible chat-completions backend: vLLM and SGLang servers, `kbrouter serve`, hosted APIs."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.backends.base import Completion, Message, SamplingParams, per_row_params, scores_past_prefix
from retrievers.retry import RetryPolicy, http_status

logger = logging.getLogger(__name__)


# how each server family takes an EBNF grammar in a chat-completions request
GRAMMAR_FIELDS = {
    "vllm": lambda g: {"structured_outputs": {"grammar": g}},
    "sglang": lambda g: {"ebnf": g},
    "llamacpp": lambda g: {"grammar": g},
    "none": None,
}


def to_openai_messages(messages: list[Message]) -> list[dict]:
    """Images referenced by path become `image_url` parts holding data URLs (servers cannot read our disk)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "image":
                    parts.append({"type": "image_url", "image_url": {"url": image_data_url(p["image"])}})
                else:
                    parts.append({"type": "text", "text": p["text"]})
            content = parts
        out.append({"role": m["role"], "content": content})
    return out


def image_data_url(path: str) -> str:
    """`data:image/...;base64,...` for an image file."""
    import base64
    import mimetypes

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"image {path} does not exist")
    mime = mimetypes.guess_type(p.name)[0] or "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(p.read_bytes()).decode()}"


class OpenAICompatiblePolicy:
    """Sends each conversation as one `/v1/chat/completions` request, `concurrency` at a time.

    A request that fails with a connection error, a timeout, HTTP 5xx or 429 is retried `retries` times with
    exponential back-off (`retrievers.retry.RetryPolicy`, the one retry policy); any other 4xx is not retried. A
    request that still fails comes back as a completion with `finish_reason="error"` (the loop records
    `backend_error` for that trajectory only).

    Args:
        base_url: e.g. `http://127.0.0.1:8000/v1`.
        model: the model name the server expects.
        api_key: bearer token; defaults to `$OPENAI_API_KEY` or "EMPTY".
        grammar_field: how a step grammar is sent: `vllm` (`structured_outputs: {grammar}`, also what
            `kbrouter serve` reads), `sglang` (`ebnf`), `llamacpp` (`grammar`), or `none` (hosted APIs, which reject
            unknown fields: constrained decoding is then unavailable).
        send_step: send each request's agent step (`plan`, `answer`, `final`) as `kbrouter_step`, which
            `kbrouter serve` reads to pick a plan adapter's weights; off by default, since hosted APIs reject
            unknown fields.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        grammar_field: str = "vllm",
        send_step: bool = False,
    ) -> None:
        import httpx

        if grammar_field not in GRAMMAR_FIELDS:
            raise ValueError(f"grammar_field {grammar_field!r} is unknown; valid: {sorted(GRAMMAR_FIELDS)}")
        self.grammar_field = grammar_field
        self.supports_grammar = grammar_field != "none"
        # vLLM's prompt_logprobs + continue_final_message, which `kbrouter serve` speaks too: what the route prior reads
        self.supports_continuation_scoring = grammar_field == "vllm"
        self.send_step = send_step

        self.name = model
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        self._client = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {key}"})
        self.concurrency = concurrency
        self.retry = RetryPolicy.from_retries(retries, backoff)  # connection errors, 5xx, 429; never another 4xx

    def _one(self, messages: list[Message], params: SamplingParams) -> Completion:
        body: dict = {
            "model": self.model,
            "messages": to_openai_messages(messages),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.top_k:
            body["top_k"] = params.top_k  # vLLM/SGLang extension
        if self.send_step and params.step:
            body["kbrouter_step"] = params.step
        if params.grammar:
            if not self.supports_grammar:
                raise ValueError("this OpenAI-compatible policy has grammar_field 'none': it cannot send a grammar")
            body.pop("stop", None)  # the grammar ends the reply; a stop string would cut its last tag
            body.update(GRAMMAR_FIELDS[self.grammar_field](params.grammar))

        def post() -> Completion:
            r = self._client.post(self.url, json=body)
            r.raise_for_status()
            return self._completion(r.json(), params)

        try:
            return self.retry.call(post, what=f"request to {self.url}")
        except Exception as e:  # connection refused, timeout, HTTP error, malformed answer: this conversation fails
            status = http_status(e)
            error = f"HTTP {status}: {e.response.text[:200]}" if status is not None else f"{type(e).__name__}: {e}"
        logger.warning("request to %s failed (attempts allowed: %d): %s", self.url, self.retry.attempts, error)
        # `retryable: False`: the retry policy has had its say (or the request was a 4xx); a wrapper such as the
        # synthesis teacher must not retry it again (that would stack a second retry layer on this one)
        return Completion(
            text="", finish_reason="error", metadata={"error": f"{self.url}: {error}", "retryable": False}
        )

    @staticmethod
    def _completion(data: dict, params: SamplingParams) -> Completion:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        # Servers drop the stop string; put the closing tag back so the parser sees a complete step.
        if (
            choice.get("finish_reason") == "stop"
            and len(params.stop) == 1
            and not text.rstrip().endswith(params.stop[0])
        ):
            text = text + params.stop[0]
        usage = data.get("usage") or {}
        return Completion(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason") or "stop",
        )

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        if not conversations:
            return []
        rows = per_row_params(params, len(conversations))  # a grammar tuple: one grammar per request
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(self._one, conversations, rows))

    def _prompt_logprobs(self, messages: list[Message], assistant: str, step: str | None) -> tuple[list, list]:
        """The server's token ids and log-probabilities of `messages` + an open assistant message `assistant`."""
        body: dict = {
            "model": self.model,
            "messages": to_openai_messages([*messages, {"role": "assistant", "content": assistant}]),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "return_token_ids": True,
        }
        if self.send_step and step:
            body["kbrouter_step"] = step

        def post() -> tuple[list, list]:
            r = self._client.post(self.url, json=body)
            r.raise_for_status()
            data = r.json()
            scored = data["prompt_logprobs"]
            # each position's dict holds the prompt's own token (alone, at prompt_logprobs 0); ids from
            # prompt_token_ids where the server sends them
            ids = data.get("prompt_token_ids") or [int(next(iter(d))) if d else None for d in scored]
            logprobs = [None if d is None else float(d[str(i)]["logprob"]) for d, i in zip(scored, ids, strict=True)]
            return ids, logprobs

        return self.retry.call(post, what=f"scoring request to {self.url}")

    def continuation_logprobs(
        self,
        conversations: list[list[Message]],
        prefixes: list[str],
        continuations: list[str],
        step: str | None = None,
    ) -> list[list[float] | None]:
        """Per conversation, each continuation's summed log-probability after its prompt + prefix, read from the
        server's `prompt_logprobs` (vLLM, `kbrouter serve`); None for a conversation the server could not score
        (the route prior then keeps the policy's own pick).

        One request per continuation and one for the prefix alone, concurrently (`scores_past_prefix` says which
        tokens are the continuation's).
        """
        if not continuations or any(not c for c in continuations):
            raise ValueError(f"continuation_logprobs needs non-empty continuations, got {continuations!r}")
        jobs = [(c, p + text) for c, p in enumerate(prefixes) for text in ("", *continuations)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(jobs))) as pool:
            futures = [pool.submit(self._prompt_logprobs, conversations[c], text, step) for c, text in jobs]
        out: list[list[float] | None] = []
        width = len(continuations) + 1
        for c in range(len(conversations)):
            try:
                (head, _), *rows = [f.result() for f in futures[c * width : (c + 1) * width]]
            except Exception as e:  # the server is down or does not score: this plan keeps its own KB
                logger.warning("could not score continuations at %s (%s); the policy's pick stands", self.url, e)
                out.append(None)
                continue
            out.append(scores_past_prefix(head, rows))
        return out
