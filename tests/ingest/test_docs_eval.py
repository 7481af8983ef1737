"""The eval side of ingested documents: the `docs_qa` loader (gold KB from the evidence type, gold page) and
gold-page recall over ingested records (`source_id`)."""

from __future__ import annotations

import pytest

from eval.datasets import DatasetSpec, load_dataset
from eval.scoring import evidence_recall
from retrievers.types import Doc, Hit


def test_docs_qa_loader_on_the_shared_questions(docs):
    loaded = load_dataset(DatasetSpec(name="docs", loader="docs_qa", sample_seed=None), docs.parent)
    assert loaded.group == "docs" and len(loaded.questions) == 40
    by_id = {q.id: q for q in loaded.questions}
    q = by_id["docs-nics-q1"]
    assert q.answers == ("264,140", "264140")
    assert q.metadata["gold_kb"] == "table"
    assert q.metadata["gold_evidence"] == ["fbi_nics_background_checks_2015-11.pdf#p1"]
    assert by_id["docs-amt-q1"].metadata["gold_kb"] == "image"  # figure questions: the figure KB
    assert by_id["docs-fedreg-q3"].metadata["gold_evidence"] == ["federal_register_2020-17221_faa_737max_nprm.pdf#p2"]
    assert by_id["docs-fdic-q1"].metadata["gold_evidence"] == ["fdic_failed_bank_list.html"]  # no pages: the file
    kinds = [q.metadata["gold_kb"] for q in loaded.questions]
    assert (kinds.count("table"), kinds.count("image"), kinds.count("text")) == (13, 10, 17)


def test_docs_qa_loader_names_a_bad_line(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(
        '{"qid": "a", "file": "x.pdf", "question": "q?", "answers": ["1"], "page": 1, "evidence_type": "text"}\n'
        '{"qid": "b", "file": "x.pdf", "question": "q?", "answers": ["1"], "page": 1, "evidence_type": "chart"}\n'
    )
    with pytest.raises(ValueError, match=r"qa.jsonl:2: `evidence_type` must be one of .*'chart'"):
        load_dataset(DatasetSpec(name="d", loader="docs_qa", path=str(path)))


def test_gold_page_recall_counts_an_ingested_record_as_its_page():
    on_page = Doc("r.pdf#p4#2", "x", metadata={"source_id": "r.pdf#p4", "doc_id": "r.pdf#p4#2"})
    other = Doc("r.pdf#p5#0", "y", metadata={"source_id": "r.pdf#p5"})
    plain = Doc("r.pdf#p4", "z")  # an id that happens to equal a page, without ingest metadata, still matches by id
    assert evidence_recall([Hit(other, 1.0, 0, "text")], ["r.pdf#p4"]) == 0.0
    assert evidence_recall([Hit(other, 1.0, 0, "text"), Hit(on_page, 0.5, 1, "text")], ["r.pdf#p4"]) == 1.0
    assert evidence_recall([Hit(plain, 1.0, 0, "text")], ["r.pdf#p4"]) == 1.0
