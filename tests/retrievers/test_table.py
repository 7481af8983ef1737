"""Table reading and linearisation (TabFact, WikiTableQuestions, JSON) and a real table KB on the demo tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from retrievers.config import KBConfig
from retrievers.kb import build_kb, load_kb
from retrievers.store import pool
from retrievers.table import Table, apply_metadata, linearize, read_table_file, read_tables, row_chunks

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def test_tabfact_file(shared_path):
    # TabFact: '#'-separated, header first, id is the file name as in statements.jsonl `table_id`
    path = shared_path("table", "tabfact", "tables", "1-10236830-6.html.csv")
    table = read_table_file(path)
    assert table.id == "1-10236830-6.html.csv"
    assert table.header == ["nomination", "actors name", "film name", "director", "country"]
    assert table.rows[0] == ["best actor in a leading role", "piotr adamczyk", "chopin : desire for love",
                             "jerzy antczak", "poland"]  # fmt: skip
    assert all(len(r) == 5 for r in table.rows)
    apply_metadata([table], shared_path("table", "tabfact", "statements.jsonl"))
    assert table.title == "stozhary"
    text = linearize(table)
    assert text.splitlines()[:3] == [
        "Title: stozhary",
        "| nomination | actors name | film name | director | country |",
        "| best actor in a leading role | piotr adamczyk | chopin : desire for love | jerzy antczak | poland |",
    ]


def test_wtq_csv_escapes(shared_path):
    # WTQ csv escapes quotes as \" (not ""), which the plain csv dialect would mangle
    table = read_table_file(shared_path("table", "wtq", "tables", "200-34.csv"))
    assert table.header == ["Character", "Actor", "Series", "Notes"]
    sam = table.rows[0]
    assert sam[:3] == ["Professor Sam Ryan", "Amanda Burton", "Series 1-8"]
    assert 'first episode of series eight, "A Time To Heal".' in sam[3]
    assert all(len(r) == 4 for r in table.rows)


def test_wtq_tsv_matches_csv(shared_path):
    # the .tsv twin (escapes \n, \p, \\) parses to the same cells as the .csv
    csv_table = read_table_file(shared_path("table", "wtq", "tables", "200-11.csv"))
    tsv_table = read_table_file(shared_path("table", "wtq", "tables", "200-11.tsv"))
    assert tsv_table.header == csv_table.header and tsv_table.rows == csv_table.rows


def test_demo_folder_reads_page_titles():
    # a folder of WTQ csv + page json: one table per csv, titled from its json
    tables = read_tables(DEMO / "tables")
    assert len(tables) == 36
    by_id = {t.id: t for t in tables}
    assert by_id["200-11"].title == "The French Connection (film)"
    assert by_id["200-11"].metadata["path"].endswith("200-11.csv")


@pytest.mark.parametrize(
    "max_rows, max_cell, expected",
    [
        # everything shown
        (None, None, ["Title: T | Caption: cap", "| a | b |", "| 1 | x |", "| 2 | long cell |", "| 3 | z |"]),
        # rows cut, with a count of what is missing
        (1, None, ["Title: T | Caption: cap", "| a | b |", "| 1 | x |", "… (2 more rows; 3 in all)"]),
        # long cells cut with an ellipsis
        (None, 5, ["Title: T | Caption: cap", "| a | b |", "| 1 | x |", "| 2 | long… |", "| 3 | z |"]),
    ],
)
def test_linearize(max_rows, max_cell, expected):
    table = Table("t", ["a", "b"], [["1", "x"], ["2", "long cell"], ["3", "z"]], title="T", caption="cap")
    assert linearize(table, max_rows, max_cell).splitlines() == expected


def test_row_chunks_repeat_the_header():
    rows = [[str(i), "word " * 5] for i in range(30)]
    table = Table("t", ["n", "text"], rows, title="Long table")
    chunks = row_chunks(table, max_words=40)
    assert len(chunks) > 1
    assert all(c.startswith("Title: Long table\n| n | text |") for c in chunks)
    assert all(len(c.split()) <= 40 for c in chunks)
    assert sum(c.count("\n") - 1 for c in chunks) == 30  # every row lands in exactly one chunk


def test_pool_is_renormalised_mean():
    vectors = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.float32)
    pooled = pool(vectors, [0, 0, 1], 2)
    np.testing.assert_allclose(pooled, [[2**-0.5, 2**-0.5], [1, 0]], rtol=1e-6)


def test_json_table_and_jsonl_listing(tmp_path):
    (tmp_path / "t1.json").write_text(json.dumps({"header": ["city", "pop"], "rows": [["Oslo", 700000]]}))
    (tmp_path / "list.jsonl").write_text(
        json.dumps({"id": "first", "path": "t1.json", "title": "Cities", "caption": "Nordic"})
        + "\n"
        + json.dumps({"id": "inline", "header": ["h"], "rows": [["v"]], "page_title": "Inline"})
        + "\n"
    )
    first, inline = read_tables(tmp_path / "list.jsonl")
    assert (first.id, first.title, first.caption, first.rows) == ("first", "Cities", "Nordic", [["Oslo", "700000"]])
    assert (inline.id, inline.title) == ("inline", "Inline")


def test_demo_table_kb(tmp_path):
    # the 3 answer tables among the 9 smallest other demo tables: real tables, a few seconds of encoding
    corpus = tmp_path / "tables"
    corpus.mkdir()
    answer_tables = ["200-11", "200-18", "200-24"]
    by_size = sorted((DEMO / "tables").glob("*.csv"), key=lambda p: p.stat().st_size)
    others = [p.stem for p in by_size if p.stem not in answer_tables][:9]
    for stem in answer_tables + others:
        for suffix in (".csv", ".json"):
            shutil.copy(DEMO / "tables" / (stem + suffix), corpus / (stem + suffix))
    cfg = KBConfig(name="table", display_name="Table Retriever", kind="table", corpus=corpus,
                   index_dir=tmp_path / "table")  # fmt: skip
    build_kb(cfg, progress=False)
    kb = load_kb(cfg)
    questions = [json.loads(line) for line in (DEMO / "questions.jsonl").open()]
    questions = [q for q in questions if q["kb"] == "table"]
    results = kb.search([q["question"] for q in questions], k=3)
    for q, hits in zip(questions, results, strict=True):
        # the table holding the answer is the top hit, and its display text shows the answer
        assert hits[0].doc.id == q["metadata"]["table_id"], [h.doc.id for h in hits]
        assert q["answers"][0] in hits[0].doc.text
        assert hits[0].kb == "table" and hits[0].doc.modality == "table"
        assert hits[0].doc.metadata["n_rows"] > 0


def test_apply_metadata_tolerates_nulls(tmp_path):
    # TabFact's statements.jsonl has tables whose page_title is null; the first line per table wins
    meta = tmp_path / "meta.jsonl"
    rows = [
        {"table_id": "t1", "caption": "cap one", "page_title": None},
        {"table_id": "t1", "caption": "later line", "page_title": "ignored"},
        {"table_id": "t2", "caption": "cap two", "page_title": "Page Two"},
    ]
    meta.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t1, t2, t3 = Table("t1", ["a"], [["1"]]), Table("t2", ["a"], [["1"]]), Table("t3", ["a"], [["1"]])
    apply_metadata([t1, t2, t3], meta)
    assert (t1.title, t1.caption) == ("", "cap one")
    assert (t2.title, t2.caption) == ("Page Two", "cap two")
    assert (t3.title, t3.caption) == ("", "")  # no metadata: unchanged
    assert linearize(t1).splitlines()[0] == "Caption: cap one"
