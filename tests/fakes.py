"""The shared test fakes: a scripted policy, an in-memory retriever and a step-following policy.

Used by the agent, server, chaos and benchmark code (`from tests.fakes import ...`). Kept apart on purpose:
`tests/data_synthesis/scripted.py` (the case-scripted synthesis teacher, also run as the crash test's subprocess),
`tests/eval/conftest.py` (the eval fakes whose figures the report tests pin) and `tests/chaos/fake_server.py` (a
real `kbrouter serve` process, not a fake).
"""

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


class StepPolicy:
    """Follows the step protocol like a tiny, obedient router: it searches once (in the KB whose first word the
    question mentions, else the first KB listed), answers with the first hit's title, then stops and repeats the
    last answer. `delay` seconds per generate call; `gate` (an Event) blocks every call until it is set.
    `seen` keeps the last user text of every conversation, in order."""

    name = "step-policy"

    def __init__(self, delay: float = 0.0, gate=None) -> None:  # noqa: ANN001 (threading.Event)
        import threading

        self.delay = delay
        self.gate = gate
        self.seen: list[str] = []
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def _reply(self, conv: list[dict]) -> str:
        import re

        system, user = system_text(conv), last_user_text(conv)
        if "Knowledge bases you can search" in system:
            if "Answer 1:" in user:
                return "<think>I know enough now.</think><sub-question>None</sub-question><ret>None</ret>"
            kbs = re.findall(r"^- ([^:\n]+)", system, re.MULTILINE)
            question = re.search(r"Original question: (.*)", user).group(1)
            words = set(re.findall(r"\w+", question.lower()))
            kb = next((k for k in kbs if k.split()[0].lower() in words), kbs[0])
            return (
                f"<think>I should look this up in {kb}.</think><sub-question>{question}</sub-question><ret>{kb}</ret>"
            )
        if "using the evidence" in system:
            rows = re.findall(r"^\s+\| ([^|\n]+?) \|", user, re.MULTILINE)  # a table hit: first cell of row 1
            first = re.search(r"^\S+-0: ([^:\n]+)", user, re.MULTILINE)
            answer = rows[1] if len(rows) > 1 else " ".join(first.group(1).split()[:8]) if first else "unknown"
            return f"<think>The first hit says so.</think><answer>{answer}</answer>"
        answers = re.findall(r"Answer \d+: (.*)", user)
        return f"<think>From the steps.</think><answer>{answers[-1] if answers else 'unknown'}</answer>"

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        import time

        with self._lock:
            self.batches.append(len(conversations))
            self.seen.extend(last_user_text(c) for c in conversations)
        if self.gate is not None:
            self.gate.wait(10)
        if self.delay:
            time.sleep(self.delay)
        return [Completion(text=self._reply(c), prompt_tokens=10, completion_tokens=5) for c in conversations]
