"""Table KBs: CSV/TSV/JSON tables, linearised into readable text and embedded row-chunk by row-chunk.

Corpus forms:
- a folder of table files: `*.html.csv` (TabFact, `#`-separated, id = file name), `*.csv` (RFC or WTQ style with
  `\\`-escapes), `*.tsv` (WTQ escapes `\\n`, `\\p`, `\\\\`), `*.json` (`{"header"|"columns", "rows"|"data"}`). A `.json`
  without rows beside a table of the same stem is page metadata (`title`, `url`), as in WikiTableQuestions.
- a JSONL file, one table per line: `{"id", "path" | "file", "title"?, "caption"?}` (path relative to the JSONL) or
  inline `{"id", "header", "rows", "title"?, "caption"?}`; an optional `metadata` object is kept on the table's doc.

Options (`options:` in the KB YAML): `max_rows` (rows shown in `Doc.text`, default 30), `max_cell_chars` (cell
length shown, default 120), `metadata_file` (a JSONL giving per-table `caption`/`page_title`, e.g. TabFact's
`statements.jsonl`) with `metadata_key` (its table id column, default `table_id`).

`Doc.text` is the bounded display form; the vector of a table is the renormalised mean of its row-chunk vectors;
BM25 sees every row.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from retrievers.config import KBConfig
from retrievers.jsonl import iter_jsonl_objects
from retrievers.store import write_index
from retrievers.types import Doc

logger = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".tsv", ".json")


@dataclass
class Table:
    """A parsed table: header, rows of cell strings and where it came from."""

    id: str
    header: list[str]
    rows: list[list[str]]
    title: str = ""
    caption: str = ""
    metadata: dict = field(default_factory=dict)


def _clean(cell: object) -> str:
    return " ".join(str(cell).split())


def read_table_file(path: str | Path) -> Table:
    """Parse one table file (format chosen by suffix; see the module docstring)."""
    path = Path(path)
    name = path.name
    if name.endswith(".html.csv"):
        with path.open(encoding="utf-8") as f:
            lines = [line.rstrip("\n").split("#") for line in f if line.strip()]
        table_id = name
    elif path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            lines = [row for row in csv.reader(f, escapechar="\\") if row]
        table_id = path.stem
    elif path.suffix == ".tsv":
        with path.open(encoding="utf-8") as f:
            lines = [
                [
                    c.replace("\\n", " ").replace("\\p", "|").replace("\\\\", "\\")
                    for c in line.rstrip("\n").split("\t")
                ]
                for line in f
                if line.strip()
            ]
        table_id = path.stem
    elif path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        header = data.get("header", data.get("columns"))
        rows = data.get("rows", data.get("data"))
        if header is None or rows is None:
            raise ValueError(f"{path}: a JSON table needs `header` (or `columns`) and `rows` (or `data`)")
        table_id = str(data.get("id", path.stem))
        return Table(
            table_id,
            [_clean(c) for c in header],
            [[_clean(c) for c in r] for r in rows],
            data.get("title", ""),
            data.get("caption", ""),
            {"path": str(path)},
        )
    else:
        raise ValueError(f"{path}: unsupported table file; use one of .html.csv, .csv, .tsv, .json")
    if not lines:
        raise ValueError(f"{path}: empty table file")
    header, *rows = ([_clean(c) for c in line] for line in lines)
    return Table(table_id, header, rows, metadata={"path": str(path)})


def _is_table_json(path: Path) -> bool:
    data = json.loads(path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and ("rows" in data or "data" in data)


def read_tables(corpus: str | Path) -> list[Table]:
    """Read every table of a corpus folder or JSONL listing, in a stable order."""
    corpus = Path(corpus)
    tables: list[Table] = []
    if corpus.is_dir():
        files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix in TABLE_SUFFIXES)
        stems = {p.with_suffix("") for p in files if p.suffix in (".csv", ".tsv")}
        chosen = []
        for p in files:
            if p.suffix == ".tsv" and p.with_suffix(".csv").exists():
                continue  # the .csv twin is the same table
            if p.suffix == ".json" and (p.with_suffix("") in stems or not _is_table_json(p)):
                continue  # page metadata, merged below
            chosen.append(p)
        for p in chosen:
            table = read_table_file(p)
            side = p.with_suffix(".json")
            if p.suffix != ".json" and side.exists():
                page = json.loads(side.read_text(encoding="utf-8"))
                table.title = table.title or page.get("title", "")
                table.metadata.update({k: page[k] for k in ("url",) if k in page})
            tables.append(table)
        return tables
    for line_no, row in iter_jsonl_objects(corpus):
        if "header" in row:
            table = Table(
                str(row["id"]), [_clean(c) for c in row["header"]], [[_clean(c) for c in r] for r in row["rows"]]
            )
        elif "path" in row or "file" in row:
            table = read_table_file(corpus.parent / row.get("path", row.get("file")))
            table.id = str(row.get("id", table.id))
        else:
            raise ValueError(f"{corpus}:{line_no}: a table line needs `path` (or `file`) or `header` + `rows`")
        table.title = row.get("title") or row.get("page_title") or table.title
        table.caption = row.get("caption") or table.caption
        table.metadata.update(row.get("metadata") or {})  # e.g. provenance written by `kbrouter ingest`
        tables.append(table)
    return tables


def apply_metadata(tables: list[Table], metadata_file: str | Path, key: str = "table_id") -> None:
    """Fill missing captions/titles from a JSONL keyed by table id (first line per table wins)."""
    meta: dict[str, dict] = {}
    for _, row in iter_jsonl_objects(metadata_file):
        meta.setdefault(str(row.get(key)), row)
    for table in tables:
        row = meta.get(table.id)
        if row:  # upstream metadata has nulls (e.g. TabFact tables without a page title)
            table.caption = table.caption or row.get("caption") or ""
            table.title = table.title or row.get("page_title") or row.get("title") or ""


def _heading(table: Table) -> str:
    parts = [f"Title: {table.title}"] if table.title else []
    if table.caption and table.caption.lower() != table.title.lower():
        parts.append(f"Caption: {table.caption}")
    return " | ".join(parts)


def _row(cells: list[str], max_chars: int | None = None) -> str:
    if max_chars:
        cells = [c if len(c) <= max_chars else c[: max_chars - 1] + "…" for c in cells]
    return "| " + " | ".join(cells) + " |"


def linearize(table: Table, max_rows: int | None = 30, max_cell_chars: int | None = 120) -> str:
    """Render a table as readable lines: `Title: … | Caption: …`, `| col | col |`, one line per row.

    Args:
        table: the table.
        max_rows: rows to show (None: all); a final line says how many were left out.
        max_cell_chars: longer cells are cut with an ellipsis (None: never).
    """
    lines = [h for h in [_heading(table)] if h]
    lines.append(_row(table.header, max_cell_chars))
    shown = table.rows if max_rows is None else table.rows[:max_rows]
    lines.extend(_row(r, max_cell_chars) for r in shown)
    if len(shown) < len(table.rows):
        lines.append(f"… ({len(table.rows) - len(shown)} more rows; {len(table.rows)} in all)")
    return "\n".join(lines)


def row_chunks(table: Table, max_words: int = 100) -> list[str]:
    """Cut a table into embeddable chunks: heading + header + as many whole rows as fit in `max_words` words."""
    head = "\n".join(h for h in [_heading(table), _row(table.header)] if h)
    budget = max(max_words - len(head.split()), 1)
    chunks, current, words = [], [], 0
    for r in table.rows:
        line = _row(r)
        n = len(line.split())
        if current and words + n > budget:
            chunks.append(head + "\n" + "\n".join(current))
            current, words = [], 0
        current.append(line)
        words += n
    if current or not chunks:
        chunks.append(head + ("\n" + "\n".join(current) if current else ""))
    return chunks


def build_table_index(cfg: KBConfig, out_dir: Path, progress: bool = True) -> dict:
    """Read, linearise and index the tables of a table KB into `out_dir`.

    Returns:
        Manifest fields (`dim`, `doc_count`, `embedded_texts`).
    """
    tables = read_tables(cfg.corpus)
    if cfg.options.get("metadata_file"):
        apply_metadata(tables, cfg.options["metadata_file"], cfg.options.get("metadata_key", "table_id"))
    max_rows = cfg.options.get("max_rows", 30)
    max_cell = cfg.options.get("max_cell_chars", 120)
    docs, embed_texts, groups, bm25_texts = [], [], [], []
    for i, t in enumerate(tables):
        meta = {**t.metadata, "n_rows": len(t.rows), "n_cols": len(t.header), "caption": t.caption}
        docs.append(
            Doc(
                id=t.id,
                text=linearize(t, max_rows, max_cell),
                title=t.title or t.caption or t.id,
                kb=cfg.name,
                modality="table",
                metadata=meta,
            )
        )
        chunks = row_chunks(t, cfg.chunk_words)
        embed_texts.extend(chunks)
        groups.extend([i] * len(chunks))
        bm25_texts.append(linearize(t, None, None))
    logger.info("KB %s: %d tables -> %d row chunks", cfg.name, len(docs), len(embed_texts))
    return write_index(cfg, out_dir, docs, embed_texts, bm25_texts, groups=groups, progress=progress)
