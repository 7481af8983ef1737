"""Dataset loaders: the generic JSONL loader with a column mapping, bad input, and the shared / paper files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.datasets import DatasetSpec, load_dataset
from tests.conftest import SHARED

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data folder {SHARED} is absent")


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_malformed_line_is_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "q.jsonl", ['{"id": "a", "question": "q?", "answers": ["x"]}', "", '{"id": "b", "question']
    )
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        load_dataset(DatasetSpec(name="t", loader="jsonl", path=str(path)))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('["not", "an", "object"]', r":1: expected a JSON object"),  # a JSON array instead of a row
        ('{"id": "a", "query": "q?", "answers": ["x"]}', r":1: missing column 'question'"),  # unmapped column
        ('{"id": "a", "question": "q?", "answers": {"x": 1}}', r":1: column 'answers' \(answers\) must be a string"),
        ('{"id": "a", "question": "q?", "answers": ["x"], "images": 3}', r":1: column 'images' \(images\) must be"),
    ],
)
def test_bad_rows(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_dataset(DatasetSpec(name="t", loader="jsonl", path=str(_write(tmp_path / "q.jsonl", [line]))))


def test_a_numeric_answer_is_one_answer(tmp_path: Path) -> None:
    path = _write(tmp_path / "q.jsonl", ['{"id": "a", "question": "How many?", "answers": 5}'])
    assert load_dataset(DatasetSpec(name="t", loader="jsonl", path=str(path))).questions[0].answers == ("5",)


def test_generic_jsonl_with_column_mapping(tmp_path: Path) -> None:
    rows = [
        {
            "qid": f"n{i}",
            "query": f"question {i}?",
            "gold": f"ans{i}" if i % 2 else ["yes"],
            "kb": "wiki",
            "support": [f"d{i}"],
        }
        for i in range(6)
    ]
    path = _write(tmp_path / "q.jsonl", [json.dumps(r) for r in rows])
    spec = DatasetSpec(
        name="mine",
        loader="jsonl",
        path=str(path),
        limit=4,
        sample_seed=1,
        columns={"id": "qid", "question": "query", "answers": "gold", "gold_kb": "kb", "gold_evidence": "support"},
    )
    ds = load_dataset(spec)
    assert len(ds.questions) == 4 and ds.group == "custom" and not ds.skipped
    by_id = {q.id: q for q in ds.questions}
    q = next(iter(by_id.values()))
    n = int(q.id[1:])
    assert (
        q.question == f"question {n}?" and q.metadata["gold_evidence"] == [f"d{n}"] and q.metadata["gold_kb"] == "wiki"
    )
    assert q.answers == ((f"ans{n}",) if n % 2 else ("yes",))  # a bare string gold becomes a one-element list
    assert q.metadata["answer_type"] == ("open" if n % 2 else "yesno")
    # the seeded subset is stable across loads, and differs from the file order
    again = [q.id for q in load_dataset(spec).questions]
    assert again == [q.id for q in ds.questions] and again != ["n0", "n1", "n2", "n3"]


def test_unknown_loader_and_column_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown loader 'hotpot'; valid: .*hotpotqa"):
        DatasetSpec(name="x", loader="hotpot")
    with pytest.raises(ValueError, match=r"unknown `columns` key\(s\) \['answer'\]"):
        DatasetSpec(name="x", loader="jsonl", path="q.jsonl", columns={"answer": "a"})


@needs_shared
@pytest.mark.parametrize(
    ("loader", "group", "gold_kb"),
    [
        ("hotpotqa", "text", "wiki"),  # supporting paragraphs are the gold evidence
        ("musique", "text", "wiki"),
        ("tabfact", "table", "tabfact"),  # the statement's table
        ("wtq", "table", "wtq"),
        ("coco", "image", "coco_captions"),  # the question's own photo
        ("video", "video", "video_clips"),  # the evidence time span
        ("r1_tabfact", "table", "tabfact"),  # the paper's TabFact, joined to its tables
    ],
)
def test_shared_sets_carry_gold_evidence(loader: str, group: str, gold_kb: str) -> None:
    ds = load_dataset(DatasetSpec(name=loader, loader=loader, limit=3), SHARED)
    assert len(ds.questions) == 3 and ds.group == group
    for q in ds.questions:
        assert q.answers and q.metadata["gold_kb"] == gold_kb and q.metadata["gold_evidence"]
        assert all(Path(p).exists() for p in q.images)


@needs_shared
def test_paper_visual_sets_without_images_are_skipped_or_text_only() -> None:
    skipped = load_dataset(DatasetSpec(name="webqa", loader="r1_webqa", limit=5), SHARED)
    assert skipped.questions == [] and "images are not available" in skipped.skipped and "text_only" in skipped.skipped
    text_only = load_dataset(DatasetSpec(name="infoseek", loader="r1_infoseek", text_only=True), SHARED)
    assert len(text_only.questions) == 1000 and all(q.images == () for q in text_only.questions)
    # InfoSeek numeric golds are expanded to the paper's candidate list, string golds kept as they are
    first = next(q for q in text_only.questions if q.id == "infoseek_val_00000002")  # range [6.5, 7.0]
    assert "6.8" in first.answers and "7" in first.answers and "7.5" not in first.answers


@needs_shared
def test_dynvqa_nan_line_loads() -> None:
    # the released file holds a bare NaN that strict JSON parsers reject; it must still load
    ds = load_dataset(DatasetSpec(name="dyn", loader="r1_dynvqa", text_only=True, sample_seed=None), SHARED)
    assert len(ds.questions) == 715


def test_the_validation_part_follows_the_test_part_and_never_overlaps_it(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": [f"a{i}"]} for i in range(10)]
    path = _write(tmp_path / "q.jsonl", [json.dumps(r) for r in rows])

    def ids(**kw) -> list[str]:
        return [q.id for q in load_dataset(DatasetSpec(name="toy", loader="jsonl", path=str(path), **kw)).questions]

    test = ids(limit=4)
    validation = ids(limit=4, part="validation", validation_limit=3)
    assert len(test) == 4 and len(validation) == 3 and not set(test) & set(validation)
    assert ids(limit=4, part="validation") == ids(limit=4, part="validation", validation_limit=4)  # default: `limit`
    assert set(ids(limit=4, part="validation", validation_limit=100)) == {r["id"] for r in rows} - set(test)
    assert ids(limit=4, sample_seed=1) != test  # the parts follow the shuffle, so a seed changes both
    whole = load_dataset(DatasetSpec(name="toy", loader="jsonl", path=str(path), part="validation"))
    assert whole.questions == [] and "the parts before it (`limit` None) take all 10 questions" in whole.skipped
    with pytest.raises(ValueError, match=r"`part` must be one of \('test', 'validation', 'confirm'\), got 'dev'"):
        DatasetSpec(name="toy", loader="jsonl", path=str(path), part="dev")


def test_the_confirm_part_follows_the_validation_part(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": [f"a{i}"]} for i in range(12)]
    path = _write(tmp_path / "q.jsonl", [json.dumps(r) for r in rows])

    def ids(**kw) -> list[str]:
        return [q.id for q in load_dataset(DatasetSpec(name="toy", loader="jsonl", path=str(path), **kw)).questions]

    test, validation = ids(limit=3), ids(limit=3, part="validation", validation_limit=4)
    confirm = ids(limit=3, part="confirm", validation_limit=4)
    assert len(confirm) == 4 and not set(confirm) & (set(test) | set(validation))  # default size: validation's
    every = ids(sample_seed=0)  # the whole shuffle: the three parts are consecutive slices of it
    assert test + validation + confirm == every[:11]
    assert ids(limit=3, part="confirm", validation_limit=4, confirm_limit=2) == confirm[:2]
    assert ids(limit=3, part="confirm", validation_limit=4, confirm_limit=50) == every[7:]
    assert ids(limit=3, part="confirm") == every[6:9]  # no validation_limit: each part `limit` long
    empty = load_dataset(
        DatasetSpec(name="toy", loader="jsonl", path=str(path), limit=4, part="confirm", validation_limit=8)
    )
    assert empty.questions == [] and "(`limit` 4, `validation_limit` 8) take all 12 questions" in empty.skipped
    with pytest.raises(ValueError, match="`confirm_limit` must be >= 1 or null, got 0"):
        DatasetSpec(name="toy", loader="jsonl", path=str(path), part="confirm", confirm_limit=0)
