"""The parses of every file -> the JSONL corpora the existing KB kinds read, and the KB-set YAML over them.

| file | KB (kind, granularity) | one line per |
|---|---|---|
| `passages.jsonl` | `text` (text, paragraph) | passage of <= 100 words: `{id, title, text, provenance, source_id}` |
| `documents.jsonl` | `document` (text, document) | file: its whole text |
| `tables.jsonl` | `table` (table) | table part (<= `table_rows` rows, ~1000 characters), header repeated: `{id, header, rows, title, caption, metadata}` |
| `images.jsonl` | `image` (image) | figure: `{id, image, captions, title, metadata}` |
| `videos.jsonl` | `clip` and `video` | video: `{id, video, subtitles, title, description}` |

`source_id` is the record's page (`report.pdf#p4`) or, for formats without pages, its file: the unit eval's
gold-page recall counts. A corpus file is rewritten only when its bytes change, so `kbrouter index` reuses the
index of every KB whose records did not change.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from ingest.units import Parsed
from retrievers.jsonl import dumps_line

YAML_MARK = "# Written by kbrouter ingest"
KB_KINDS = {  # KB name -> (corpus file, kind, granularity, display name the router knows, k)
    "text": ("passages.jsonl", "text", "paragraph", "Text Retriever", 5),
    "document": ("documents.jsonl", "text", "document", "Document Retriever", 2),
    "table": ("tables.jsonl", "table", "table", "Table Retriever", 3),
    "image": ("images.jsonl", "image", "image", "Image Retriever", 3),
    "clip": ("videos.jsonl", "clip", "clip", "Clip Retriever", 3),
    "video": ("videos.jsonl", "video", "video", "Video Retriever", 2),
}


# The table and image KBs' descriptions list up to this many document titles (`KBConfig.describe_titles`): their
# generic descriptions hide which reports' tables and figures they hold.
DESCRIBE_TITLES = 8


def source_id(prov: dict) -> str:
    """The page (`file#p4`) a record sits on, or its file when the format has no pages."""
    return f"{prov['file']}#p{prov['page']}" if prov.get("page") is not None else prov["file"]


TABLE_PART_CHARS = 1000  # a table part's rows fit in about this many characters: the policy reads ~1200 per hit


def rows_per_part(header: list[str], rows: list[list[str]], most: int, chars: int = TABLE_PART_CHARS) -> int:
    """How many rows one table record holds: at most `most`, fewer when wide rows would not fit in `chars`."""
    if not rows:
        return most
    row_chars = sum(len(" | ".join(r)) + 4 for r in rows) / len(rows)
    room = chars - len(" | ".join(header)) - 4
    return max(1, min(most, int(room // row_chars)))


def corpus_lines(parses: list[Parsed], table_rows: int = 25) -> dict[str, list[dict]]:
    """The lines of every corpus file, from the parses (in file order)."""
    out: dict[str, list[dict]] = {name: [] for name in ("passages", "documents", "tables", "images", "videos")}
    for p in parses:
        for i, passage in enumerate(p.passages):
            where = f"p{passage.provenance['page']}#{i}" if passage.provenance.get("page") is not None else f"s{i}"
            out["passages"].append(
                {
                    "id": f"{p.file}#{where}",
                    "title": p.title,
                    "text": passage.text,
                    "provenance": passage.provenance,
                    "source_id": source_id(passage.provenance),
                }
            )
        if p.passages:
            out["documents"].append(
                {
                    "id": p.file,
                    "title": p.title,
                    "text": "\n".join(x.text for x in p.passages),
                    "provenance": {"file": p.file, "pages": p.pages} if p.pages else {"file": p.file},
                    "source_id": p.file,
                }
            )
        for t in p.tables:
            base = f"{p.file}#t{t.provenance['table']}"
            size = rows_per_part(t.header, t.rows, table_rows)
            parts = [t.rows[i : i + size] for i in range(0, len(t.rows), size)] or [[]]
            for j, rows in enumerate(parts):
                prov = dict(t.provenance)
                if len(parts) > 1:
                    prov["rows"] = [j * size + 1, j * size + len(rows)]
                out["tables"].append(
                    {
                        "id": base if len(parts) == 1 else f"{base}.{j + 1}",
                        "header": t.header,
                        "rows": rows,
                        "title": p.title,
                        "caption": t.caption,
                        "metadata": {"provenance": prov, "source_id": source_id(prov)},
                    }
                )
        for f in p.figures:
            out["images"].append(
                {
                    "id": f"{p.file}#f{f.provenance['figure']}",
                    "image": f.image,
                    "captions": [f.caption],
                    "title": p.title,
                    "metadata": {"provenance": f.provenance, "source_id": source_id(f.provenance)},
                }
            )
        for v in p.videos:
            out["videos"].append(
                {
                    "id": p.file,
                    "video": v.video,
                    "subtitles": v.subtitles,
                    "title": p.title,
                    "description": v.description,
                    "metadata": {"provenance": v.provenance, "source_id": source_id(v.provenance)},
                }
            )
    return out


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` (temporary name, then rename) unless it already holds exactly that; True if written."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True


def write_corpora(parses: list[Parsed], corpus_dir: Path, table_rows: int = 25) -> dict[str, int]:
    """Write the corpus files (an empty kind's file is removed); returns the line count of each."""
    counts = {}
    for name, lines in corpus_lines(parses, table_rows).items():
        path = corpus_dir / f"{name}.jsonl"
        if not lines:
            path.unlink(missing_ok=True)
        else:
            if name == "videos":  # the video KBs read paths relative to the JSONL
                lines = [
                    {
                        **v,
                        "video": os.path.relpath(v["video"], corpus_dir.resolve()),
                        "subtitles": os.path.relpath(v["subtitles"], corpus_dir.resolve()) if v["subtitles"] else None,
                    }
                    for v in lines
                ]
            write_if_changed(path, "".join(map(dumps_line, lines)))
        counts[name] = len(lines)
    return counts


def kb_yaml(name: str, corpus_dir: Path, yaml_path: Path, counts: dict[str, int], options: dict) -> str:
    """The KB-set YAML over the written corpora (paths relative to the YAML file, indexes in the corpus folder)."""
    base = yaml_path.resolve().parent
    rel = Path(os.path.relpath(corpus_dir.resolve(), base)).as_posix()
    kbs = []
    sources = {"text": "passages", "document": "documents", "table": "tables", "image": "images"}
    for kb, (corpus, kind, granularity, display, k) in KB_KINDS.items():
        if counts.get(sources.get(kb, "videos"), 0) == 0:
            continue
        entry = {
            "name": kb,
            "display_name": display,
            "description": _description(kb, name),
            "kind": kind,
            "granularity": granularity,
            "corpus": f"{rel}/{corpus}",
            "encoder": options.get("encoder", "minilm"),
            "search": "hybrid" if kind in ("text", "table") else "dense",
            "index": "flat",
            "index_dir": f"{rel}/indexes/{kb}",
            "k": k,
        }
        if kb in ("table", "image"):
            entry["describe_titles"] = DESCRIBE_TITLES
        if kind in ("image", "clip", "video"):
            entry["options"] = {
                "clip_model": options.get("clip_model", "kbrouter-tiny-clip"),
                "clip_pretrained": options.get("clip_pretrained"),
                "visual_weight": options.get("visual_weight", 0.0),
            }
        kbs.append(entry)
    head = (  # line 1 is the command that uses the file, as in every configs/kb YAML
        f"# Build:    kbrouter index --kb {yaml_path.as_posix()}\n"
        f"{YAML_MARK} from {rel}/: rerun the same `kbrouter ingest` to update it (edits here are overwritten).\n"
        f"# Override: kbrouter index --kb {yaml_path.as_posix()} --only table --force\n"
        "# CLIP is `kbrouter-tiny-clip` with random weights unless --clip-model/--clip-pretrained name real ones, so\n"
        "# random pixels would only add noise: figures rank by their captions alone (visual_weight 0; 0.8 with weights).\n"
        f"# describe_titles {DESCRIBE_TITLES} (table, image): they hold a few documents' tables and figures, so\n"
        "# their descriptions end with those documents' titles and the router sees which reports they cover.\n"
    )
    return head + yaml.safe_dump({"knowledge_bases": kbs}, sort_keys=False, allow_unicode=True, width=119)


def _description(kb: str, name: str) -> str:
    return {
        "text": f"Passages (up to 100 words) of the {name} documents, with file and page.",
        "document": f"Whole {name} documents, one per file: what a document is about overall.",
        "table": f"Tables from the {name} documents (PDF, web pages, office files), header and rows.",
        "image": f"Figures and images from the {name} documents, searched by their captions.",
        "clip": f"Short clips of the {name} videos with their subtitles.",
        "video": f"Whole {name} videos with their subtitles.",
    }[kb]
