"""retrievers/jsonl.py: the JSONL reader's file:line errors and the atomic whole-file writer."""

from __future__ import annotations

import pytest

from retrievers.jsonl import iter_jsonl_objects, write_jsonl_atomic


def test_atomic_write_round_trips_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl_atomic(path, ({"id": i, "text": "café"} for i in range(3)))
    assert [row for _, row in iter_jsonl_objects(path)] == [{"id": i, "text": "café"} for i in range(3)]
    assert "café" in path.read_text(encoding="utf-8")  # non-ASCII kept as is
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl_atomic(path, [{"id": "old"}])

    def rows():
        yield {"id": "new"}
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(path, rows())
    assert path.read_text(encoding="utf-8") == '{"id": "old"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_reader_names_file_and_line_of_a_broken_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2,\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not valid JSON"):
        list(iter_jsonl_objects(path))


def test_a_broken_table_corpus_line_is_named(tmp_path):
    from retrievers.table import read_tables

    corpus = tmp_path / "tables.jsonl"
    corpus.write_text('{"id": "t1", "header": ["a"], "rows": [["1"]]}\n{"id": "t2", "header": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tables\.jsonl:2: not valid JSON"):
        read_tables(corpus)
