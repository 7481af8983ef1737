"""retrievers/jsonl.py: the reader's file:line errors, the atomic whole-file writer, the appenders and the torn-line
policy."""

from __future__ import annotations

import pytest

from retrievers.jsonl import JsonlWriter, append_jsonl, iter_jsonl_objects, read_jsonl, repair, write_jsonl_atomic


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


# The torn-line policy: one rule for every log (trajectories, eval cache, snapshots, synthesis outputs).


def test_a_log_reader_skips_a_torn_tail_and_leaves_the_file(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    data = b'{"id": 1}\n{"id": 2}\n{"id": 3'  # a writer killed mid-record
    path.write_bytes(data)
    assert read_jsonl(path, log=True) == [{"id": 1}, {"id": 2}]
    assert "log.jsonl:3: skipping a torn last line" in caplog.text
    assert path.read_bytes() == data  # a reader does not write (the writer may still be running)


def test_a_finished_record_without_its_newline_is_still_torn_in_a_log(tmp_path):
    # the newline is what marks a log record finished: a parsable tail is dropped too, as `repair` cuts it
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}')
    assert read_jsonl(path, log=True) == [{"id": 1}]
    assert repair(path) == len(b'{"id": 2}')
    assert path.read_bytes() == b'{"id": 1}\n'


@pytest.mark.parametrize("log", [True, False])
def test_a_broken_middle_line_is_an_error_in_a_log_and_in_an_input_file(tmp_path, log):
    path = tmp_path / "mid.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": \n{"id": 3}\n')
    with pytest.raises(ValueError, match=r"mid\.jsonl:2: not valid JSON"):
        read_jsonl(path, log=log)


def test_an_input_file_reads_a_last_line_without_newline_and_names_a_torn_one(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}')  # editors leave the final newline off
    assert read_jsonl(path) == [{"id": 1}, {"id": 2}]
    path.write_bytes(b'{"id": 1}\n{"id": 2')  # a truncated input is bad input, not a log tail
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2: not valid JSON"):
        read_jsonl(path)


@pytest.mark.parametrize(
    "before,cut",
    [
        (b"", 0),  # empty file
        (b'{"a": 1}\n', 0),  # ends on a newline: nothing to cut
        (b'{"a": 1', 7),  # only a torn line
        (b'{"a": 1}\n' + b'{"a": "' + b"x" * 20000, 20007),  # torn tail longer than one backward read block
        (b'{"a": "' + b"y" * 20000 + b'"}\n{"a', 3),  # last newline far from the start of the file
    ],
)
def test_repair_cuts_exactly_the_bytes_after_the_last_newline(tmp_path, before, cut):
    path = tmp_path / "log.jsonl"
    path.write_bytes(before)
    assert repair(path) == cut
    assert path.read_bytes() == before[: len(before) - cut]
    assert repair(tmp_path / "absent.jsonl") == 0


def test_append_cuts_a_torn_tail_first_and_returns_the_size(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2')
    size = append_jsonl(path, [{"id": 3, "t": "é"}, {"id": 4}])
    assert size == path.stat().st_size
    assert read_jsonl(path, log=True) == [{"id": 1}, {"id": 3, "t": "é"}, {"id": 4}]
    assert append_jsonl(path, []) == size  # nothing appended: the size a commit line would record


def test_writer_and_reader_agree_after_a_crash(tmp_path):
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as w:
        w.write({"id": 1})
    with path.open("ab") as f:
        f.write(b'{"id": 2, "half')  # killed mid-record
    with JsonlWriter(path) as w:
        w.write({"id": 3})
    assert read_jsonl(path) == [{"id": 1}, {"id": 3}]


def test_end_reads_only_the_committed_prefix(tmp_path):
    path = tmp_path / "out.jsonl"
    committed = append_jsonl(path, [{"id": 1}, {"id": 2}])
    append_jsonl(path, [{"id": 3}])  # written, not yet committed
    assert [row for _, row in iter_jsonl_objects(path, log=True, end=committed)] == [{"id": 1}, {"id": 2}]
    assert [row for _, row in iter_jsonl_objects(path, log=True, end=0)] == []
