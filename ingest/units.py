"""What a parser gets out of one file: passages, tables, figures and videos, each with its provenance.

A parser returns one `Parsed` per file; `ingest.corpora` turns the `Parsed` of every file into the JSONL corpora the
existing KB kinds read. `Parsed` round-trips through JSON so that a re-run reuses the parse of an unchanged file.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from retrievers.chunking import chunk_words

MAX_WORDS = 100  # passages of at most 100 words, as the paragraph KBs of UniversalRAG


class Skip(Exception):  # noqa: N818 - a skip is an outcome, not an error of kbrouter
    """A file is left out of the KBs: `reason` is the summary's bucket, the message says why and what to do."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Passage:
    """A run of text of at most `MAX_WORDS` words; `provenance` holds file, page, bbox or section."""

    text: str
    provenance: dict


@dataclass
class TableUnit:
    """A table: header, rows of cell strings, caption, provenance (`table` is its 1-based number in the file)."""

    header: list[str]
    rows: list[list[str]]
    caption: str
    provenance: dict


@dataclass
class FigureUnit:
    """A figure saved as an image file (`image`, relative to the corpus folder) with its caption."""

    image: str
    caption: str
    provenance: dict


@dataclass
class VideoUnit:
    """A video file with its sidecar subtitles (absolute paths)."""

    video: str
    subtitles: str | None
    description: str
    provenance: dict


@dataclass
class Parsed:
    """Everything one file yields; `pages` is 0 for formats without pages."""

    file: str
    title: str
    kind: str
    pages: int = 0
    passages: list[Passage] = field(default_factory=list)
    tables: list[TableUnit] = field(default_factory=list)
    figures: list[FigureUnit] = field(default_factory=list)
    videos: list[VideoUnit] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Parsed:
        return cls(
            file=d["file"],
            title=d["title"],
            kind=d["kind"],
            pages=d.get("pages", 0),
            passages=[Passage(**p) for p in d.get("passages", [])],
            tables=[TableUnit(**t) for t in d.get("tables", [])],
            figures=[FigureUnit(**f) for f in d.get("figures", [])],
            videos=[VideoUnit(**v) for v in d.get("videos", [])],
        )


def clean(text: str) -> str:
    """Whitespace collapsed; a word hyphenated across a line break joined again ("practi-\\ntioners")."""
    text = re.sub(r"(\w)-\s*\n\s*([a-z])", r"\1\2", text)
    return " ".join(text.split())


def pack_passages(blocks: list[tuple[str, dict]], max_words: int = MAX_WORDS) -> list[Passage]:
    """Pack consecutive text blocks that share a page or section into passages of at most `max_words` words.

    Blocks merge while they fit; a block longer than `max_words` is cut into near-equal chunks. A merged passage's
    bbox is the union of its blocks' bboxes.

    Args:
        blocks: `(text, provenance)` in reading order; provenance without `bbox` is fine.
        max_words: the most words of a passage.
    """
    out: list[Passage] = []
    words: list[str] = []
    prov: dict | None = None

    def flush() -> None:
        if words and prov is not None:
            out.append(Passage(" ".join(words), prov))

    for text, block_prov in blocks:
        block_words = clean(text).split()
        if not block_words:
            continue
        same_place = prov is not None and _place(prov) == _place(block_prov)
        if same_place and len(words) + len(block_words) <= max_words:
            words += block_words
            if "bbox" in prov:
                prov = {**prov, "bbox": _union(prov["bbox"], block_prov.get("bbox"))}
            continue
        flush()
        words, prov = [], None
        if len(block_words) <= max_words:
            words, prov = block_words, dict(block_prov)
            continue
        for chunk in chunk_words(" ".join(block_words), max_words):
            out.append(Passage(chunk, dict(block_prov)))
    flush()
    return out


def _place(prov: dict) -> tuple:
    return prov.get("file"), prov.get("page"), prov.get("section"), prov.get("sheet")


def _union(a: list | None, b: list | None) -> list | None:
    if a is None or b is None:
        return a or b
    return [round(min(a[0], b[0]), 1), round(min(a[1], b[1]), 1), round(max(a[2], b[2]), 1), round(max(a[3], b[3]), 1)]


def rectangular(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Pad or cut every row to the header's width, drop empty rows and empty columns."""
    width = max([len(header), *(len(r) for r in rows)]) if rows or header else 0
    grid = [list(r) + [""] * (width - len(r)) for r in [header, *rows]]
    keep = [j for j in range(width) if any(row[j] for row in grid)]
    grid = [[row[j] for j in keep] for row in grid]
    head, *body = grid or [[]]
    return head, [r for r in body if any(r)]


@dataclass(frozen=True)
class Limits:
    """Per-file bounds: a file over one is skipped with the limit named (no partial records)."""

    max_bytes: int = 200 * 1024 * 1024
    max_pages: int = 2000
    max_seconds: float = 300.0
    max_rows: int = 100_000  # rows of one CSV/TSV/XLSX sheet

    def __post_init__(self) -> None:
        for key in ("max_bytes", "max_pages", "max_seconds", "max_rows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"--{key.replace('_', '-')} must be a positive number, got {value!r}")
