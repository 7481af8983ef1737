"""Fakes for agent tests: a scripted policy and an in-memory retriever."""

from __future__ import annotations

from collections.abc import Callable

from agent.backends.base import BackendError, Completion, SamplingParams
from retrievers.types import Doc, Hit, Query, as_queries


class ScriptedPolicy:
    """Answers by calling `script(conversation) -> str`; records every generate call's batch size."""

    name = "scripted"

    def __init__(self, script: Callable[[list[dict]], str], fail_on: Callable[[list[dict]], bool] | None = None):
        self.script = script
        self.fail_on = fail_on
        self.calls: list[int] = []

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        self.calls.append(len(conversations))
        if self.fail_on and any(self.fail_on(c) for c in conversations):
            raise BackendError("scripted failure")
        return [Completion(text=self.script(c), prompt_tokens=10, completion_tokens=5) for c in conversations]


class FakeRetriever:
    """Returns docs whose text shares a word with the query, scored by overlap; records its batches."""

    def __init__(self, kb: str, texts: list[str]):
        self.kb = kb
        self.docs = [Doc(id=f"{kb}-{i}", text=t, title=f"T{i}", kb=kb) for i, t in enumerate(texts)]
        self.batches: list[list[Query]] = []

    def search(self, queries, k):
        qs = as_queries(queries)
        self.batches.append(qs)
        out = []
        for q in qs:
            words = set(q.text.lower().split())
            scored = sorted(((len(words & set(d.text.lower().split())), d) for d in self.docs), key=lambda x: -x[0])
            out.append([Hit(doc=d, score=float(s), rank=r, kb=self.kb) for r, (s, d) in enumerate(scored[:k])])
        return out


def last_user_text(conv: list[dict]) -> str:
    content = conv[-1]["content"]
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


def system_text(conv: list[dict]) -> str:
    return conv[0]["content"]
