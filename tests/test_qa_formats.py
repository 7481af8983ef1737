"""One QA reader (`agent/qa_formats.py`): synthesis and eval read the shared sets the same way, and count skips alike.

The parity cases read the real files under the shared data folder through both callers and compare what each would
ask: ids in file order, question wording and gold answers. The expected sizes are counted here from the raw files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.qa_formats import FORMATS, Source, check_rows, count_skips, read_rows
from data_synthesis.config import InputSpec
from data_synthesis.inputs import read_inputs
from eval.datasets import SHARED_FORMATS, DatasetSpec, load_dataset
from tests.conftest import SHARED


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("loader", "parts", "fmt", "dataset"),
    [
        # HotpotQA and MuSiQue share one file; each eval loader keeps its dataset's rows
        ("hotpotqa", ("text", "questions.jsonl"), "shared_text", "hotpotqa"),
        ("musique", ("text", "questions.jsonl"), "shared_text", "musique"),
        # TabFact claims: eval's file is statements.jsonl, worded by agent.phrasing for both
        ("tabfact", ("table", "tabfact", "statements.jsonl"), "tabfact", ""),
        ("wtq", ("table", "wtq", "questions.jsonl"), "wtq", ""),
        ("coco", ("image", "coco", "qa_derived.jsonl"), "coco", ""),  # same photos too
        ("video", ("video", "qa.jsonl"), "video", ""),
    ],
)
def test_synthesis_and_eval_ask_the_same_questions(shared_path, loader, parts, fmt, dataset):
    path = shared_path(*parts)
    assert SHARED_FORMATS[loader] == (fmt, dataset)
    raw = [r for r in _raw(path) if not dataset or r["dataset"] == dataset]
    synth, skips = read_inputs([InputSpec(path=str(path), format=fmt)])
    synth = [q for q in synth if not dataset or q.metadata["dataset"] == dataset]
    ds = load_dataset(DatasetSpec(name=loader, loader=loader, sample_seed=None), SHARED)
    assert not skips and ds.skips == {} and not ds.skipped
    assert len(synth) == len(ds.questions) == len(raw) > 0
    assert [q.id for q in synth] == [q.id for q in ds.questions] == [r["qid"] for r in raw]
    assert [q.answers for q in synth] == [q.answers for q in ds.questions]
    assert [q.images for q in synth] == [q.images for q in ds.questions]
    # synthesis strips the wording when it builds its Question (eval asks the file's text as it is: 26 HotpotQA
    # questions end in a space; kept so cached eval predictions stay valid)
    assert [q.question for q in synth] == [q.question.strip() for q in ds.questions]


def _lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


BAD_WTQ = [
    {"qid": "w1", "table_id": "t1", "question": "How many?", "answers": ["3"]},  # kept
    {"qid": "w2", "table_id": "t1", "question": "Who?", "answers": []},  # no gold
    {"qid": "w3", "table_id": "t1", "question": "  ", "answers": ["x"]},  # empty question
    {"qid": "w1", "table_id": "t2", "question": "Again?", "answers": ["4"]},  # duplicate id
    {"qid": "w4", "table_id": "t2", "question": "Which year?", "answers": [" 1999 ", ""]},  # golds stripped
]


def test_both_callers_skip_and_count_the_same_rows(tmp_path):
    path = _lines(tmp_path / "questions.jsonl", BAD_WTQ)
    synth, skips = read_inputs([InputSpec(path=str(path), format="wtq")])
    ds = load_dataset(DatasetSpec(name="wtq", loader="wtq", path=str(path), sample_seed=None))
    assert [(s.id, s.reason) for s in skips] == [("w2", "no_gold"), ("w3", "empty_question"), ("w1", "duplicate_id")]
    assert ds.skips == count_skips(skips) == {"no_gold": 1, "empty_question": 1, "duplicate_id": 1}
    assert [(q.id, q.answers) for q in synth] == [(q.id, q.answers) for q in ds.questions]
    assert [q.id for q in ds.questions] == ["w1", "w4"] and ds.questions[1].answers == ("1999",)
    assert [q.metadata["gold_evidence"] for q in ds.questions] == [["t1"], ["t2"]]  # eval's own field


def test_a_missing_photo_is_skipped_unless_text_only(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"\xff\xd8")
    _lines(tmp_path / "images.jsonl", [{"image_id": "coco-1", "file": "images/a.jpg"}])
    rows = [
        {"qid": "c1", "image_id": "coco-1", "question": "What colour?", "answer": "red", "type": "color"},
        {"qid": "c2", "image_id": "coco-2", "question": "How many?", "answer": "2", "type": "count"},  # no photo
    ]
    path = _lines(tmp_path / "qa_derived.jsonl", rows)
    ds = load_dataset(DatasetSpec(name="coco", loader="coco", path=str(path), sample_seed=None))
    assert [q.id for q in ds.questions] == ["c1"] and ds.skips == {"missing_image": 1}
    assert ds.questions[0].images == (str(tmp_path / "images" / "a.jpg"),)
    _, skips = read_inputs([InputSpec(path=str(path), format="coco")])
    assert [(s.id, s.reason) for s in skips] == [("c2", "missing_image")]
    text_only = load_dataset(DatasetSpec(name="coco", loader="coco", path=str(path), text_only=True))
    assert sorted(q.id for q in text_only.questions) == ["c1", "c2"] and text_only.skips == {}
    assert all(q.images == () for q in text_only.questions)


def test_check_rows_shares_seen_ids_across_files(tmp_path):
    first = read_rows("wtq", Source(str(_lines(tmp_path / "a.jsonl", BAD_WTQ[:1]))))
    second = read_rows("wtq", Source(str(_lines(tmp_path / "b.jsonl", BAD_WTQ[3:]))))
    seen: set[str] = set()
    kept_a, _ = check_rows(first, "a.jsonl", seen)
    kept_b, skips = check_rows(second, "b.jsonl", seen)
    assert [r.id for r in kept_a + kept_b] == ["w1", "w4"] and seen == {"w1", "w4"}
    assert skips[0].reason == "duplicate_id" and "b.jsonl" in skips[0].detail


def test_bad_format_and_missing_file_name_the_culprit(tmp_path):
    with pytest.raises(ValueError, match=r"unknown QA format 'hotpot'; valid: \['coco', 'docs', 'generic'"):
        read_rows("hotpot", Source("q.jsonl"))
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        read_rows("wtq", Source(str(tmp_path / "nope.jsonl")))
    assert set(SHARED_FORMATS.values()) <= {(f, d) for f in FORMATS for d in ("", "hotpotqa", "musique")}
