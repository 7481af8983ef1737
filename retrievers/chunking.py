"""Reading text corpora and cutting documents into passages of at most `chunk_words` words."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from retrievers.jsonl import iter_jsonl_objects
from retrievers.types import Doc


def chunk_words(text: str, max_words: int = 100) -> list[str]:
    """Split text into consecutive chunks of at most `max_words` words, of near-equal length.

    Equal sizes avoid a tiny trailing chunk (130 words give 65 + 65, not 100 + 30). Whitespace is normalised.

    Args:
        text: the document text.
        max_words: the most words a chunk may hold.

    Returns:
        The chunks; empty for blank text.
    """
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    words = text.split()
    if not words:
        return []
    n_chunks = math.ceil(len(words) / max_words)
    size = math.ceil(len(words) / n_chunks)
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)]


def _split_contents(contents: str) -> tuple[str, str]:
    # FlashRAG/DPR `contents` is '"Title"\ntext' when no separate title is given.
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], rest
    return "", contents


def read_text_corpus(path: str | Path) -> Iterator[dict]:
    """Yield `{"id", "title", "text", "metadata"}` records from a JSONL corpus.

    Accepted line formats: `{"id", "contents" | "text", "title"?}` (FlashRAG) and `{"doc_id", "title", "text"}`
    (kbrouter's shared corpora). Other keys go to `metadata`.

    Raises:
        ValueError: a line is not JSON or lacks an id or text; the message names the file and line.
    """
    path = Path(path)
    for line_no, row in iter_jsonl_objects(path):
        doc_id = row.get("id", row.get("doc_id"))
        title = row.get("title") or ""
        if "text" in row:
            text = row["text"]
        elif "contents" in row:
            if not isinstance(row["contents"], str):
                raise ValueError(f"{path}:{line_no}: `contents` is {row['contents']!r}, not a string")
            parsed_title, text = _split_contents(row["contents"])
            title = title or parsed_title
        else:
            raise ValueError(f"{path}:{line_no}: a corpus line needs `text` or `contents`; found {sorted(row)}")
        if doc_id is None:
            raise ValueError(f"{path}:{line_no}: a corpus line needs `id` (or `doc_id`); found {sorted(row)}")
        if not isinstance(text, str):
            raise ValueError(
                f"{path}:{line_no}: the text of doc {doc_id!r} is {text!r}, not a string; give it text (or drop the line)"
            )
        if not isinstance(title, str):
            raise ValueError(f"{path}:{line_no}: the title of doc {doc_id!r} is {title!r}, not a string; quote it")
        extra = {k: v for k, v in row.items() if k not in ("id", "doc_id", "title", "text", "contents")}
        yield {"id": str(doc_id), "title": title, "text": text, "metadata": extra}


def passages(
    records: list[dict], kb: str, granularity: str = "paragraph", max_words: int = 100
) -> tuple[list[Doc], list[str]]:
    """Turn corpus records into retrievable units and the texts to embed (title prepended).

    Args:
        records: output of `read_text_corpus`.
        kb: KB name stamped on every `Doc`.
        granularity: `paragraph` cuts each record into ≤`max_words` chunks; `document` keeps records whole.
        max_words: chunk size for `paragraph`.

    Returns:
        `(docs, embed_texts)`. A record that fits in one chunk keeps its id; otherwise chunk ids are `<id>#<i>`.
        Every doc's metadata has `doc_id` (the source record) and `chunk`.
    """
    docs: list[Doc] = []
    embed_texts: list[str] = []
    for rec in records:
        if granularity == "paragraph":
            chunks = chunk_words(rec["text"], max_words)
        else:
            chunks = [rec["text"].strip()] if rec["text"].strip() else []
        for i, chunk in enumerate(chunks):
            doc_id = rec["id"] if len(chunks) == 1 else f"{rec['id']}#{i}"
            meta = {**rec["metadata"], "doc_id": rec["id"], "chunk": i}
            docs.append(Doc(id=doc_id, text=chunk, title=rec["title"], kb=kb, modality="text", metadata=meta))
            embed_texts.append(f"{rec['title']}\n{chunk}" if rec["title"] else chunk)
    return docs, embed_texts
