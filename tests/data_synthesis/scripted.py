"""A scripted teacher and an in-memory KB for the synthesis tests; also a runner for the crash test's subprocess.

The teacher's reply depends only on the conversation (and, for identical conversations in one call, on their order),
so a job run with it is deterministic. A question's text carries its case in brackets, e.g. `[wrong] ...`:

| case | behaviour | expected verdict |
|---|---|---|
| ok | asks once, answers Paris, stops; both samples identical | accept sample 0, sample 1 `duplicate` |
| vary | like ok, but the 2nd identical conversation in a call gets another sub-question | both accepted |
| wrong | final answer London | `wrong_answer` |
| empty | final reply empty (twice) | `empty_answer` |
| format | first plan reply malformed, re-ask fixed | `format_error` under the strict rule |
| unsupported | intermediate answer not in the evidence | `unsupported_answer` under the overlap rule |
| long | three retrieval steps | `too_many_steps` when `rejection.max_steps: 2` |
| emptymid | intermediate answer empty | `empty_intermediate_answer` |
| backend | the backend raises whenever this question is in a call | `backend_error` |
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.backends.base import BackendError, Completion, SamplingParams  # noqa: E402
from agent.kbs import KnowledgeBase  # noqa: E402
from retrievers.types import Doc, Hit  # noqa: E402

KB = "Text Retriever"
EVIDENCE = "The Eiffel Tower is a wrought-iron tower in Paris, the capital of France."
CASES = ("ok", "vary", "wrong", "empty", "format", "unsupported", "long", "emptymid", "backend")


class FakeRetriever:
    """Two fixed passages for every query."""

    def search(self, queries: list, k: int) -> list[list[Hit]]:
        docs = [Doc("d0", EVIDENCE, "Eiffel Tower", "text"), Doc("d1", "Paris has many museums.", "Paris", "text")]
        return [[Hit(d, 1.0 - i / 10, i, "text") for i, d in enumerate(docs[:k])] for _ in queries]


def fake_kbs() -> dict[str, KnowledgeBase]:
    return {KB: KnowledgeBase("text", KB, FakeRetriever(), 2, "test passages")}


def _text(message: dict) -> str:
    c = message["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if p.get("type") == "text")


class ScriptedPolicy:
    """Replies from a script keyed by the case tag in the question (see the module docstring)."""

    name = "scripted"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self.backend_raises = 0

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        texts = [" ".join(_text(m) for m in c) for c in conversations]
        if any("[backend]" in t for t in texts):
            self.backend_raises += 1
            raise BackendError("scripted outage")
        seen: dict[str, int] = {}
        out = []
        for conv in conversations:
            key = json.dumps(conv, sort_keys=True)
            nth = seen.get(key, 0)
            seen[key] = nth + 1
            out.append(Completion(self._reply(conv, nth), prompt_tokens=10, completion_tokens=5))
        return out

    def _reply(self, conv: list[dict], nth: int) -> str:
        system, user = _text(conv[0]), _text(conv[-1])
        retry = conv[-1]["role"] == "user" and "did not follow the format" in user
        everything = " ".join(_text(m) for m in conv)
        case = re.search(r"\[(\w+)\]", everything)
        case = case.group(1) if case else "ok"
        if system.startswith("You answer questions step by step"):  # plan
            if case == "format" and not retry:
                return "I will look it up."
            asked = len(re.findall(r"^Sub-question \d+:", _text(conv[-1] if not retry else conv[-3]), re.M))
            if asked >= (3 if case == "long" else 1):
                return "<think>I know enough.</think><sub-question>None</sub-question><ret>None</ret>"
            sub = "What city is the Eiffel Tower in?" if not (case == "vary" and nth) else "Where is the Eiffel Tower?"
            if case == "long":
                sub = f"Step {asked + 1}: where is the Eiffel Tower?"
            sub = f"[{case}] {sub}"  # the answer step sees only the sub-question: it carries the case
            return f"<think>I need the city.</think><sub-question>{sub}</sub-question><ret>{KB}</ret>"
        if system.startswith("You answer a question using the evidence"):  # intermediate answer
            if case == "emptymid":
                return ""
            answer = "Zanzibar" if case == "unsupported" else "Paris"
            return f"<think>The evidence says so.</think><answer>{answer}</answer>"
        # final
        if case == "empty":
            return ""
        return f"<think>It is in Paris.</think><answer>{'London' if case == 'wrong' else 'Paris'}</answer>"


def write_questions(path: Path, cases: tuple[str, ...] = CASES, extra: list[dict] | None = None) -> Path:
    """A generic-format QA file with one question per case (gold: Paris)."""
    rows = [{"id": f"q-{c}", "question": f"[{c}] In which city is the Eiffel Tower?", "answers": ["Paris"]}
            for c in cases] + (extra or [])  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


if __name__ == "__main__":  # crash-test runner: python scripted.py CONFIG.json DELAY_S
    import logging

    from data_synthesis.config import SynthConfig
    from data_synthesis.job import run_synthesis

    logging.basicConfig(level=logging.WARNING)
    cfg = SynthConfig(**json.loads(Path(sys.argv[1]).read_text()))
    run_synthesis(cfg, policy=ScriptedPolicy(delay_s=float(sys.argv[2])), kbs=fake_kbs())
