"""The one batched interface every policy backend satisfies: conversations in, completions out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

Message = dict  # {"role": "system"|"user"|"assistant", "content": str | list[{"type": "text"|"image", ...}]}


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings shared by all backends. `temperature == 0` means greedy; `seed` seeds one `generate` call.

    `stop` strings end a completion early (the text keeps the stop string, so closing tags survive). `grammar` is
    an EBNF grammar the whole completion must match (constrained decoding, `agent.protocol.grammar`); a backend
    without structured output rejects it (`supports_grammar`). A tuple holds one grammar per conversation of the call
    (`agent.answer_words: shown` builds each answer's from its own prompt); `row_params` cuts it to a subset. `step`
    names the agent step being decoded (`plan`, `answer`, `final`; None outside the step loop): a backend with
    per-step weights (`policy.plan_adapter`) picks them by it, the others ignore it.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | tuple[str, ...] | None = None
    step: str | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def row_params(params: SamplingParams, rows: Sequence[int]) -> SamplingParams:
    """`params` for these conversations (positions in the call): a per-conversation grammar tuple cut to them."""
    if isinstance(params.grammar, tuple):
        return replace(params, grammar=tuple(params.grammar[i] for i in rows))
    return params


def per_row_params(params: SamplingParams, conversations: int) -> list[SamplingParams]:
    """One params per conversation, each with a single grammar: a per-conversation tuple split, else `params` repeated
    (for backends and batchers that take one request, or one key, per conversation)."""
    check_grammar_rows(params, conversations)
    if isinstance(params.grammar, tuple):
        return [replace(params, grammar=g) for g in params.grammar]
    return [params] * conversations


def check_grammar_rows(params: SamplingParams, conversations: int) -> None:
    """A per-conversation grammar tuple must hold one grammar per conversation."""
    if isinstance(params.grammar, tuple) and len(params.grammar) != conversations:
        raise ValueError(
            f"SamplingParams.grammar holds {len(params.grammar)} grammars for {conversations} conversations"
        )


@dataclass(frozen=True)
class Completion:
    """One generated reply with its token counts."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    metadata: dict = field(default_factory=dict, compare=False, hash=False)


class BackendError(RuntimeError):
    """A backend could not produce a completion (server down, request rejected, OOM, ...).

    The agent loop catches it and ends the affected trajectories with `stop_reason="backend_error"`.
    """


@runtime_checkable
class Policy(Protocol):
    """A batched chat policy. `generate` returns one `Completion` per conversation, in order."""

    name: str

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]: ...


def supports_grammar(policy: object) -> bool:
    """Whether a policy enforces `SamplingParams.grammar` (backends say so with a `supports_grammar` attribute)."""
    return bool(getattr(policy, "supports_grammar", False))


def scores_past_prefix(head: list[int], rows: list[tuple[list[int], list[float | None]]]) -> list[float]:
    """Each continuation's summed log-probability from prompt scores (vLLM's `prompt_logprobs`, `kbrouter serve`):
    `head` is the token ids of prompt + prefix alone, each row the ids and per-token log-probabilities of prompt +
    prefix + one continuation. A continuation's tokens are those past the longest common prefix of the two id
    lists, so a token that straddles the boundary counts with the continuation."""
    import os

    out = []
    for ids, logprobs in rows:
        shared = len(os.path.commonprefix([head, ids]))  # works on lists: the tokens both start with
        out.append(float(sum(lp for lp in logprobs[shared:] if lp is not None)))
    return out


def message_images(messages: list[Message]) -> list[str]:
    """Image paths referenced in a conversation, in order."""
    return [
        part["image"]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part.get("type") == "image"
    ]


def last_user_text(messages: list[Message]) -> str:
    """The text of a conversation's last turn (its text parts, for a multimodal one)."""
    return text_only(messages[-1:])[0]["content"]


def text_only(messages: list[Message]) -> list[Message]:
    """Flatten multimodal content to plain strings (for text-only models)."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if p.get("type") == "text")
        out.append({"role": m["role"], "content": content})
    return out
