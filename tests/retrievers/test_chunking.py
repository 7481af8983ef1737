"""Passage chunking and corpus reading."""

from __future__ import annotations

import json

import pytest

from retrievers.chunking import chunk_words, passages, read_text_corpus


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.mark.parametrize(
    "n_words, max_words, sizes",
    [
        (0, 100, []),  # blank text gives no chunk
        (1, 100, [1]),  # a short text stays whole
        (100, 100, [100]),  # exactly the limit: one chunk
        (101, 100, [51, 50]),  # one word over: two balanced chunks, not 100 + 1
        (130, 100, [65, 65]),  # balanced, not 100 + 30
        (250, 100, [84, 84, 82]),  # three chunks, none over the limit
        (7, 3, [3, 3, 1]),  # 7 words, 3 per chunk: ceil(7/3)=3 chunks of size 3
    ],
)
def test_chunk_sizes(n_words, max_words, sizes):
    chunks = chunk_words(words(n_words), max_words)
    assert [len(c.split()) for c in chunks] == sizes
    assert " ".join(chunks).split() == words(n_words).split()  # nothing lost, order kept


def test_chunk_words_rejects_zero():
    with pytest.raises(ValueError, match="max_words"):
        chunk_words("a b", 0)


@pytest.mark.parametrize(
    "line, expected",
    [
        # kbrouter shared corpus format
        ({"doc_id": "d1", "title": "T", "text": "body"}, ("d1", "T", "body")),
        # FlashRAG format with the title inside `contents`
        ({"id": "7", "contents": '"Some Title"\nthe body'}, ("7", "Some Title", "the body")),
        # FlashRAG format with an explicit title: contents is taken whole when it has no quoted first line
        ({"id": 8, "title": "X", "contents": "plain body"}, ("8", "X", "plain body")),
    ],
)
def test_read_text_corpus_formats(tmp_path, line, expected):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(line) + "\n\n")
    (rec,) = read_text_corpus(path)
    assert (rec["id"], rec["title"], rec["text"]) == expected


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "c.jsonl:1: not valid JSON"),  # names file and line
        (json.dumps({"id": "1", "body": "x"}), "needs `text` or `contents`"),
        (json.dumps({"text": "x"}), "needs `id`"),
    ],
)
def test_read_text_corpus_errors(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        list(read_text_corpus(path))


def test_passages_keep_source_and_prepend_title():
    records = [
        {"id": "long", "title": "Long", "text": words(150), "metadata": {}},
        {"id": "short", "title": "", "text": "tiny text", "metadata": {"source": "x"}},
    ]
    docs, embed = passages(records, kb="kb1", granularity="paragraph", max_words=100)
    # the long record is cut in two chunks with suffixed ids; the short one keeps its id
    assert [d.id for d in docs] == ["long#0", "long#1", "short"]
    assert [d.metadata["doc_id"] for d in docs] == ["long", "long", "short"]
    assert docs[2].metadata["source"] == "x"
    assert all(d.kb == "kb1" and d.modality == "text" for d in docs)
    # the title is embedded, not stored in the passage text
    assert embed[0].startswith("Long\nw0 ") and not docs[0].text.startswith("Long")
    assert embed[2] == "tiny text"
    # document granularity keeps records whole
    docs, _ = passages(records, kb="kb1", granularity="document", max_words=100)
    assert [len(d.text.split()) for d in docs] == [150, 2]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"id": "a", "text": null}', r"c.jsonl:2: the text of doc 'a' is None, not a string"),
        ('{"id": "a", "text": "x", "title": 7}', r"c.jsonl:2: the title of doc 'a' is 7, not a string"),
        ('{"id": "a", "contents": null}', r"c.jsonl:2: `contents` is None, not a string"),
    ],
)
def test_a_corpus_line_of_the_wrong_type_is_named(tmp_path, line, match):
    from retrievers.chunking import read_text_corpus

    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        list(read_text_corpus(path))
