"""The templated text-KB comparison questions (scripts/make_comparison_questions.py): training paragraphs only."""

from __future__ import annotations

import json
from pathlib import Path


def test_category_reads_the_definition_of_a_first_sentence(load_script) -> None:
    m = load_script("scripts/make_comparison_questions.py")
    assert m.category("Local H is an American rock band from Zion, Illinois. It formed in 1990.") == "band"
    assert m.category("Daryl Hall (born 1946) is an American rock musician.") == "musician"
    assert m.category("Paris is the capital of France.") == "capital"
    assert m.category("Orbit is a member of the band.") is None  # too vague to compare on
    assert m.category("No definition in this sentence at all.") is None
    assert [m.plural(w) for w in ("band", "city", "businessman", "church", "day")] == [
        "bands", "cities", "businessmen", "churches", "days"]  # fmt: skip


def test_questions_pair_two_training_paragraphs_and_never_a_dev_one(shared_data: Path, load_script) -> None:
    m = load_script("scripts/make_comparison_questions.py")
    corpus = [json.loads(line) for line in (shared_data / "text" / "corpus.jsonl").read_text().splitlines() if line]
    train = [p for p in corpus if p["source"].startswith(m.TRAIN_SOURCES)]
    rows = m.comparison_rows(train, 120, seed=0)
    by_id = {p["doc_id"]: p for p in corpus}
    dev = {p["doc_id"] for p in corpus if p["source"].startswith("hotpotqa_dev")}
    assert len(rows) == 120 and len({r["qid"] for r in rows}) == 120
    kinds = {r["answers"][0] if r["answers"][0] in ("yes", "no") else "which" for r in rows}
    assert kinds == {"yes", "no", "which"}
    for r in rows:
        a, b = (by_id[d] for d in r["supporting_doc_ids"])
        assert not {a["doc_id"], b["doc_id"]} & dev
        assert m.bare_title(a["title"]) in r["question"] and m.bare_title(b["title"]) in r["question"]
        if r["answers"][0] == "yes":
            assert m.category(a["text"]) == m.category(b["text"])
        elif r["answers"][0] == "no":
            assert m.category(a["text"]) != m.category(b["text"])
        else:
            assert r["answers"][0] == m.bare_title(a["title"]) and m.category(a["text"]) in r["question"]


def test_committed_comparison_questions_are_the_scripts_output(shared_data: Path, load_script) -> None:
    m = load_script("scripts/make_comparison_questions.py")
    corpus = [json.loads(line) for line in (shared_data / "text" / "corpus.jsonl").read_text().splitlines() if line]
    train = [p for p in corpus if str(p.get("source", "")).startswith(m.TRAIN_SOURCES)]
    committed = Path(__file__).resolve().parents[2] / "data" / "synth" / "text_comparison_questions.jsonl"
    rows = [json.loads(line) for line in committed.read_text(encoding="utf-8").splitlines()]
    assert rows == m.comparison_rows(train, 240, seed=0)
