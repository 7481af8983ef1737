"""Eval test fixtures: two in-memory KBs over `tests.fakes.FakeRetriever`, four questions and an eval config.

The eval fake policy is `tests.fakes.FakePolicy`; the report tests pin the figures these two give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.kbs import KnowledgeBase
from tests.fakes import FakeRetriever

TEXT_DOCS = [
    ("p1", "Paris", "Paris is the capital of France and its answer word is Paris"),
    ("p2", "Berlin", "Berlin is the capital of Germany and its answer word is Berlin"),
    ("p3", "Rome", "Rome is the capital of Italy and its answer word is Rome"),
]
TABLE_DOCS = [("t1", "Medals", "norway won gold medal 16\nnation | gold\nnorway | 16")]
WORD_RANKS = {"words": "alnum", "score": "rank"}  # `\w+` words ("France?" matches "France"), scores 1 / (rank + 1)


@pytest.fixture
def fake_kbs() -> dict[str, KnowledgeBase]:
    return {
        "Text KB": KnowledgeBase(
            "wiki", "Text KB", FakeRetriever.with_docs("wiki", TEXT_DOCS, **WORD_RANKS), 3, "passages"
        ),
        "Table KB": KnowledgeBase(
            "tables",
            "Table KB",
            FakeRetriever.with_docs("tables", TABLE_DOCS, modality="table", **WORD_RANKS),
            3,
            "tables",
        ),
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
