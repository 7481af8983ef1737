"""Question files and JSONL writing: clear errors, no torn lines."""

import json

import pytest

from agent.io import JsonlWriter, iter_jsonl, read_questions, repair


def write(tmp_path, lines):
    p = tmp_path / "q.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_read_questions_keeps_extra_columns(tmp_path):
    p = write(tmp_path, [json.dumps({"id": 1, "question": " Who? ", "answers": "X", "dataset": "d"})])
    (q,) = read_questions(p)
    assert q.id == "1" and q.question == "Who?" and q.answers == ("X",) and q.metadata == {"dataset": "d"}


@pytest.mark.parametrize(
    "lines,match",
    [
        (['{"id": 1, "question": "a"}', "{broken"], "q.jsonl:2: not valid JSON"),  # names the line
        (['{"question": "a"}'], "missing field 'id'"),  # missing id
        (['{"id": 1, "question": "   "}'], "empty question"),  # empty question
        (['{"id": 1, "question": "a"}', '{"id": 1, "question": "b"}'], "duplicate id"),  # duplicate ids
        (["[1, 2]"], "expected a JSON object"),  # wrong type
    ],
)
def test_read_questions_errors(tmp_path, lines, match):
    with pytest.raises(ValueError, match=match):
        read_questions(write(tmp_path, lines))


def test_missing_image_is_reported_with_question_id(tmp_path):
    p = write(tmp_path, [json.dumps({"id": "img1", "question": "what?", "image": "/nope.jpg"})])
    with pytest.raises(FileNotFoundError, match="img1"):
        read_questions(p)


def test_writer_repairs_a_torn_last_line(tmp_path):
    p = tmp_path / "out.jsonl"
    p.write_text('{"a": 1}\n{"a": 2')  # a crash mid-line
    assert repair(p) == len('{"a": 2')
    with JsonlWriter(p) as w:
        w.write({"a": 3})
    assert [r["a"] for r in iter_jsonl(p)] == [1, 3]
