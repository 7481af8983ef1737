"""Fakes for the eval tests: a deterministic policy that follows every prompt format, and in-memory KBs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.backends.base import Completion, SamplingParams
from agent.kbs import KnowledgeBase
from retrievers.types import Doc, Hit, Query, as_queries

TEXT_DOCS = [
    ("p1", "Paris", "Paris is the capital of France and its answer word is Paris"),
    ("p2", "Berlin", "Berlin is the capital of Germany and its answer word is Berlin"),
    ("p3", "Rome", "Rome is the capital of Italy and its answer word is Rome"),
]
TABLE_DOCS = [("t1", "Medals", "norway won gold medal 16\nnation | gold\nnorway | 16")]


class FakeRetriever:
    """Ranks its docs by word overlap with the query text."""

    def __init__(self, name: str, docs: list[tuple[str, str, str]], modality: str = "text") -> None:
        self.name = name
        self.docs = [Doc(id=i, text=t, title=ti, kb=name, modality=modality) for i, ti, t in docs]
        self.calls = 0

    def search(self, queries: list[str | Query], k: int) -> list[list[Hit]]:
        self.calls += 1
        out = []
        for q in as_queries(queries):
            words = set(re.findall(r"\w+", q.text.lower()))
            ranked = sorted(self.docs, key=lambda d: (-len(words & set(re.findall(r"\w+", d.text.lower()))), d.id))[:k]
            out.append([Hit(doc=d, score=1.0 / (r + 1), rank=r, kb=self.name) for r, d in enumerate(ranked)])
        return out


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


@pytest.fixture
def fake_kbs() -> dict[str, KnowledgeBase]:
    return {
        "Text KB": KnowledgeBase("wiki", "Text KB", FakeRetriever("wiki", TEXT_DOCS), 3, "passages"),
        "Table KB": KnowledgeBase("tables", "Table KB", FakeRetriever("tables", TABLE_DOCS, "table"), 3, "tables"),
    }


QUESTIONS = [
    {
        "id": "q1",
        "question": "What is the capital of France?",
        "answers": ["Paris"],
        "gold_kb": "wiki",
        "gold_evidence": ["p1"],
    },
    {
        "id": "q2",
        "question": "What is the capital of Germany?",
        "answers": ["Berlin"],
        "gold_kb": "wiki",
        "gold_evidence": ["p2"],
    },
    {
        "id": "q3",
        "question": "How many gold medal did norway win?",
        "answers": ["16"],
        "gold_kb": "tables",
        "gold_evidence": ["t1"],
    },
    {
        "id": "q4",
        "question": "Is Rome the capital of Italy?",
        "answers": ["yes"],
        "gold_kb": "wiki",
        "gold_evidence": ["p3"],
    },
]


@pytest.fixture
def questions_file(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def eval_yaml(tmp_path: Path, questions: Path, methods: list[str], out: str = "out", **extra: object) -> Path:
    """An eval config over the fake KBs (the runner gets them directly) and one JSONL question file."""
    import yaml

    data = {
        "name": "fake",
        "output_dir": str(tmp_path / out),
        "methods": methods,
        "batch_size": 3,
        "agent": {"max_steps": 2, "max_retries": 0},
        "datasets": [{"name": "toy", "loader": "jsonl", "path": str(questions), "sample_seed": None}],
        **extra,
    }
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
