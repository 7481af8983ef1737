"""benchmarks/retrieval_quality.py --predictions: recall of one KB on the sub-questions an eval method sent it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
TEXT_QUESTIONS = [q for q in map(json.loads, (DEMO / "questions.jsonl").open()) if q["kb"] == "text"]


def _row(q: dict, method: str, sub_question: str, gold_kb: str = "text") -> dict:
    meta = {"gold_kb": gold_kb, "gold_evidence": q["metadata"]["supporting_doc_ids"]}
    steps = [{"sub_question": sub_question, "kb": "text"}]
    return {"method": method, "question": q["question"], "trajectory": {"steps": steps, "metadata": meta}}


@pytest.fixture(scope="module")
def kb_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("kb")
    (folder / "kbs.yaml").write_text(
        "knowledge_bases:\n  - name: text\n    display_name: Text Retriever\n    kind: text\n"
        f"    corpus: {DEMO / 'passages.jsonl'}\n    search: hybrid\n    index_dir: {folder / 'index'}\n"
    )
    return folder / "kbs.yaml"


def _recall_at_5(out: str, ranker: str) -> float:
    line = next(x for x in out.splitlines() if x.startswith(ranker))
    return float(re.split(r"\s{2,}", line.strip())[-1])


def test_recall_is_measured_on_the_methods_sub_questions(load_script, kb_file, tmp_path, capsys) -> None:
    mod = load_script("benchmarks/retrieval_quality.py")
    rows = [_row(q, "agent", q["question"]) for q in TEXT_QUESTIONS]
    rows += [_row(q, "vague", "what is it?") for q in TEXT_QUESTIONS]  # another method, sub-questions that miss
    rows.append(_row(TEXT_QUESTIONS[0], "agent", "x", gold_kb="table"))  # another KB's question: not counted
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--predictions", str(preds), "--kb-config", str(kb_file), "--kb", "text"]

    assert mod.main([*args, "--method", "agent"]) == 0
    out = capsys.readouterr().out
    assert f"{len(TEXT_QUESTIONS)} sub-questions of agent" in out
    sharp = _recall_at_5(out, "hybrid")
    assert mod.main([*args, "--method", "vague"]) == 0
    vague = _recall_at_5(capsys.readouterr().out, "hybrid")
    assert sharp >= 0.5 and vague < sharp  # the demo questions find their paragraphs; "what is it?" does not


def test_a_kb_the_file_lacks_is_named(load_script, kb_file, tmp_path, capsys) -> None:
    mod = load_script("benchmarks/retrieval_quality.py")
    preds = tmp_path / "predictions.jsonl"
    preds.write_text(json.dumps(_row(TEXT_QUESTIONS[0], "agent", "q")) + "\n")
    with pytest.raises(SystemExit):
        mod.main(["--predictions", str(preds), "--kb-config", str(kb_file), "--kb", "wiki"])
    assert "KB 'wiki' is not in" in capsys.readouterr().err


def test_a_bm25_kb_is_measured_on_a_hybrid_copy_and_its_own_index_is_left_alone(load_script, tmp_path, capsys) -> None:
    mod = load_script("benchmarks/retrieval_quality.py")
    own = tmp_path / "own_index"
    kbs = tmp_path / "kbs.yaml"
    kbs.write_text(
        "knowledge_bases:\n  - name: text\n    display_name: Text Retriever\n    kind: text\n"
        f"    corpus: {DEMO / 'passages.jsonl'}\n    search: bm25\n    index_dir: {own}\n"
    )
    preds = tmp_path / "predictions.jsonl"
    preds.write_text(json.dumps(_row(TEXT_QUESTIONS[0], "agent", TEXT_QUESTIONS[0]["question"])) + "\n")
    args = ["--predictions", str(preds), "--kb-config", str(kbs), "--kb", "text", "--cache-dir", str(tmp_path / "c")]
    assert mod.main([*args, "--method", "agent"]) == 0
    assert "1 sub-questions of agent" in capsys.readouterr().out
    assert not own.exists() and (tmp_path / "c" / "eval_text").is_dir()


def test_the_query_is_the_first_searched_step_not_a_stop_plan(load_script, kb_file, tmp_path, capsys) -> None:
    mod = load_script("benchmarks/retrieval_quality.py")
    rows = []
    for q in TEXT_QUESTIONS:
        row = _row(q, "agent", q["question"])
        row["trajectory"]["steps"].insert(0, {"sub_question": None, "kb": None})  # a stop plan before the search
        row["question"] = "what is it?"  # the fallback, were the stop plan taken for the first step
        rows.append(row)
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--predictions", str(preds), "--kb-config", str(kb_file), "--kb", "text", "--method", "agent"]
    assert mod.main(args) == 0
    assert _recall_at_5(capsys.readouterr().out, "hybrid") >= 0.5
