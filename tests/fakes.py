"""The shared test fakes: policies that follow the step protocol by script, and an in-memory retriever.

`from tests.fakes import ...` in the agent, eval, synthesis, server and chaos tests and `benchmarks/agent_server_load.py`:

- `ScriptedPolicy`: replies `script(conversation)`; with `ordinal=True` the script also gets the conversation's
  ordinal among identical ones in the call, which `case_teacher()` (the synthesis tests' case-scripted teacher) uses.
- `StepPolicy`: a tiny obedient router for the agent/server tests (search once, answer with the first hit, stop).
- `FakePolicy`: the eval fake, which answers every prompt format the eval methods use (plan, router, one sentence at a
  time, answer, final) with word-count token figures; the eval report tests pin the figures it gives.
- `FakeRetriever`: docs ranked by shared words with the query.
- `RecordsParams`: a mixin that makes a fake policy take grammars and record the params of every call.

`tests/chaos/fake_server.py` is not here: it is a real `kbrouter serve` process, not a fake.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from agent.backends.base import BackendError, Completion, SamplingParams, last_user_text
from agent.kbs import KnowledgeBase
from retrievers.types import Doc, Hit, Query, as_queries

# a conversation -> the reply text; with `ScriptedPolicy(ordinal=True)`: (conversation, ordinal) -> the reply text
Script = Callable[[list[dict]], str] | Callable[[list[dict], int], str]


class RecordsParams:
    """Mixin for a fake policy (`class P(RecordsParams, ScriptedPolicy)`): it claims structured output, so the agent
    and the baselines send their grammars, and keeps every call's `SamplingParams` in `params`."""

    supports_grammar = True

    def generate(self, conversations, params):  # noqa: ANN001, ANN201
        self.__dict__.setdefault("params", []).append(params)
        return super().generate(conversations, params)  # type: ignore[misc] - the fake policy mixed in after


class ScriptedPolicy:
    """Answers by calling `script(conversation)`; records every generate call's batch size in `calls`.

    Args:
        script: the reply for one conversation.
        fail_on: when it is true for any conversation of a call, the call raises `BackendError` (counted in
            `backend_raises`).
        delay_s: seconds to sleep in every call (the crash test kills the job between them).
        ordinal: call `script(conversation, nth)` instead, `nth` counting the identical conversations before it in the
            same call (0 for the first), so that a script can make the samples of one question differ.
    """

    name = "scripted"

    def __init__(
        self,
        script: Script,
        fail_on: Callable[[list[dict]], bool] | None = None,
        delay_s: float = 0.0,
        ordinal: bool = False,
    ) -> None:
        self.script = script
        self.fail_on = fail_on
        self.delay_s = delay_s
        self.ordinal = ordinal
        self.calls: list[int] = []
        self.backend_raises = 0

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        self.calls.append(len(conversations))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_on and any(self.fail_on(c) for c in conversations):
            self.backend_raises += 1
            raise BackendError("scripted failure")
        if not self.ordinal:
            return [Completion(text=self.script(c), prompt_tokens=10, completion_tokens=5) for c in conversations]
        seen: dict[str, int] = {}
        out = []
        for conv in conversations:
            key = json.dumps(conv, sort_keys=True)
            nth = seen.get(key, 0)
            seen[key] = nth + 1
            out.append(Completion(text=self.script(conv, nth), prompt_tokens=10, completion_tokens=5))
        return out


WORDS = {
    "split": lambda text: set(text.lower().split()),  # whitespace-separated: "france?" is not "france"
    "alnum": lambda text: set(re.findall(r"\w+", text.lower())),  # runs of letters and digits
}
SCORES = {
    "overlap": lambda shared, rank: float(shared),  # the number of shared words
    "rank": lambda shared, rank: 1.0 / (rank + 1),
}


class FakeRetriever:
    """Returns its docs ranked by how many words they share with the query (ties in the order given); records its
    batches in `batches`.

    Args:
        kb: the KB name, set on every doc and hit.
        texts: one doc per text, with id `{kb}-{i}` and title `T{i}`; `with_docs` gives ids and titles instead.
        words: how a text splits into words, one of `WORDS` ("split": on whitespace; "alnum": `\\w+` runs).
        score: a hit's score, one of `SCORES` ("overlap": the shared-word count; "rank": 1 / (rank + 1)).
        modality: every doc's modality.

    Raises:
        ValueError: `words` or `score` is not one of the names above.
    """

    def __init__(
        self, kb: str, texts: list[str], words: str = "split", score: str = "overlap", modality: str = "text"
    ) -> None:
        if words not in WORDS:
            raise ValueError(f"FakeRetriever words={words!r} is unknown; use one of {sorted(WORDS)}")
        if score not in SCORES:
            raise ValueError(f"FakeRetriever score={score!r} is unknown; use one of {sorted(SCORES)}")
        self.kb = kb
        self.words, self.score = WORDS[words], SCORES[score]
        self.docs = [Doc(id=f"{kb}-{i}", text=t, title=f"T{i}", kb=kb, modality=modality) for i, t in enumerate(texts)]
        self.batches: list[list[Query]] = []

    @classmethod
    def with_docs(
        cls,
        kb: str,
        docs: list[tuple[str, str, str]],
        words: str = "split",
        score: str = "overlap",
        modality: str = "text",
    ) -> FakeRetriever:
        """A retriever over `(id, title, text)` docs."""
        retriever = cls(kb, [], words, score, modality)
        retriever.docs = [Doc(id=i, text=text, title=title, kb=kb, modality=modality) for i, title, text in docs]
        return retriever

    def search(self, queries: list[str | Query], k: int) -> list[list[Hit]]:
        qs = as_queries(queries)
        self.batches.append(qs)
        out = []
        for q in qs:
            words = self.words(q.text)
            ranked = sorted(((len(words & self.words(d.text)), d) for d in self.docs), key=lambda x: -x[0])[:k]
            out.append([Hit(doc=d, score=self.score(s, r), rank=r, kb=self.kb) for r, (s, d) in enumerate(ranked)])
        return out


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


class FakePolicy:
    """Replies by prompt type, deterministically; any conversation mentioning EXPLODE makes the call raise."""

    name = "fake"

    def __init__(self) -> None:
        self.seen: list[str] = []  # the original question of every plan/answer/final prompt, in order

    def _reply(self, conv: list[dict]) -> str:
        system, user = conv[0]["content"], conv[-1]["content"]
        if isinstance(user, list):
            user = " ".join(p.get("text", "") for p in user)
        first_evidence = re.search(r"^\w+-0: (.*)$", user, re.MULTILINE)
        word = first_evidence.group(1).split()[-1] if first_evidence else "unknown"
        if "Knowledge bases you can search" in system:
            if "Answer 1:" in user:
                return "<think>enough</think><sub-question>None</sub-question><ret>None</ret>"
            q = re.search(r"Original question: (.*)", user).group(1)
            kb = "Table KB" if "medal" in q.lower() else "Text KB"
            return f"<think>look it up</think><sub-question>{q}</sub-question><ret>{kb}</ret>"
        if "Choose where to look up" in system:
            return "<ret>Text KB</ret>"
        if "one sentence at a time" in system:
            return f"So the answer is: {word}"
        if "final answer" in system:
            answers = re.findall(r"Answer \d+: (.*)", user)
            return f"<think>from history</think><answer>{answers[-1] if answers else 'unknown'}</answer>"
        return f"<think>from evidence</think><answer>{word}</answer>"

    def generate(self, conversations: list[list[dict]], params: SamplingParams) -> list[Completion]:
        if any("EXPLODE" in json.dumps(c) for c in conversations):
            raise RuntimeError("injected failure")
        out = []
        for conv in conversations:
            self.seen.append(json.dumps(conv[-1]["content"]))
            text = self._reply(conv)
            out.append(
                Completion(
                    text=text,
                    prompt_tokens=sum(len(str(m["content"]).split()) for m in conv),
                    completion_tokens=len(text.split()),
                )
            )
        return out


# -- the synthesis tests' case-scripted teacher ----------------------------------------------------------------------
# Its reply depends only on the conversation (and, for identical conversations in one call, on their order), so a job
# run with it is deterministic. A question's text carries its case in brackets, e.g. `[wrong] ...`:
#
# | case | behaviour | expected verdict |
# |---|---|---|
# | ok | asks once, answers Paris, stops; both samples identical | accept sample 0, sample 1 `duplicate` |
# | vary | like ok, but the 2nd identical conversation in a call gets another sub-question | both accepted |
# | wrong | final answer London | `wrong_answer` |
# | empty | final reply empty (twice) | `empty_answer` |
# | format | first plan reply malformed, re-ask fixed | `format_error` under the strict rule |
# | unsupported | intermediate answer not in the evidence | `unsupported_answer` under the overlap rule |
# | long | three retrieval steps | `too_many_steps` when `rejection.max_steps: 2` |
# | emptymid | intermediate answer empty | `empty_intermediate_answer` |
# | backend | the backend raises whenever this question is in a call | `backend_error` |

TEACHER_KB = "Text Retriever"
TEACHER_EVIDENCE = "The Eiffel Tower is a wrought-iron tower in Paris, the capital of France."
TEACHER_CASES = ("ok", "vary", "wrong", "empty", "format", "unsupported", "long", "emptymid", "backend")


def teacher_kbs() -> dict[str, KnowledgeBase]:
    """The teacher's one KB: the evidence passage and a distractor (every sub-question ranks the evidence first)."""
    docs = [("d0", "Eiffel Tower", TEACHER_EVIDENCE), ("d1", "Paris", "Paris has many museums.")]
    retriever = FakeRetriever.with_docs("text", docs, words="alnum", score="rank")
    return {TEACHER_KB: KnowledgeBase("text", TEACHER_KB, retriever, 2, "test passages")}


def _text(message: dict) -> str:
    c = message["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if p.get("type") == "text")


def _conversation_text(conv: list[dict]) -> str:
    return " ".join(_text(m) for m in conv)


def teacher_reply(conv: list[dict], nth: int) -> str:
    """The teacher's reply to one conversation, by the case tag in it (see the table above)."""
    system, user = _text(conv[0]), _text(conv[-1])
    retry = conv[-1]["role"] == "user" and "did not follow the format" in user
    case = re.search(r"\[(\w+)\]", _conversation_text(conv))
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
        return f"<think>I need the city.</think><sub-question>{sub}</sub-question><ret>{TEACHER_KB}</ret>"
    if system.startswith("You answer a question using the evidence"):  # intermediate answer
        if case == "emptymid":
            return ""
        answer = "Zanzibar" if case == "unsupported" else "Paris"
        return f"<think>The evidence says so.</think><answer>{answer}</answer>"
    # final
    if case == "empty":
        return ""
    return f"<think>It is in Paris.</think><answer>{'London' if case == 'wrong' else 'Paris'}</answer>"


def case_teacher(delay_s: float = 0.0) -> ScriptedPolicy:
    """The case-scripted teacher: `teacher_reply`, raising whenever a `[backend]` question is in the call."""
    return ScriptedPolicy(
        teacher_reply, fail_on=lambda conv: "[backend]" in _conversation_text(conv), delay_s=delay_s, ordinal=True
    )


def teacher_questions(path: Path, cases: tuple[str, ...] = TEACHER_CASES, extra: list[dict] | None = None) -> Path:
    """A generic-format QA file with one question per case (gold: Paris), then the `extra` rows."""
    rows = [{"id": f"q-{c}", "question": f"[{c}] In which city is the Eiffel Tower?", "answers": ["Paris"]}
            for c in cases] + (extra or [])  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
