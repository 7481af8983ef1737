"""`kbrouter ingest PATH --name N --parser docling`: DOCX, HTML (and PDF, with layout weights) read by docling.

docling cannot share the main env (its pins: huggingface_hub<2, typer<0.27, and pillow<13 in older docling-core,
clash with ours), so it lives in its own venv, as a pipx-style tool: `make docling` builds `.venv-docling`, and
each file is converted there by `ingest/docling_worker.py` in a subprocess under the per-file time limit
(`--max-seconds`). The worker prints the document's items as JSON; this module turns them into the units the
built-in parsers make (`Parsed`: passages by section, tables with header and rows, figures with captions), with
provenance (`file`, `section`, and for PDF `page` and `bbox`) and `parser: docling`.

The interpreter is `$KBROUTER_DOCLING_PYTHON`, else `.venv-docling/bin/python` in the repo; docling's models folder
(PDF only) is `$KBROUTER_DOCLING_ARTIFACTS`. Other formats (XLSX, CSV, Markdown, images, videos) keep the built-in
readers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from ingest.office import CAPTION
from ingest.units import FigureUnit, Limits, Parsed, Skip, TableUnit, clean, pack_passages, rectangular

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("docling_worker.py")
DEFAULT_PYTHON = ROOT / ".venv-docling" / "bin" / "python"
DOCLING_SUFFIXES = (".docx", ".html", ".htm", ".pdf")
EXIT_NEEDS_WEIGHTS = 3  # as docling_worker.EXIT_NEEDS_WEIGHTS (the worker cannot be imported here: other env)
HEADINGS = ("title", "section_header")
MD_LINK = re.compile(r"\[([^\]]*)\]\([^)\s]*\)")  # docling's table export writes a linked cell as [text](url)


def docling_python() -> Path:
    """The docling env's interpreter.

    Raises:
        FileNotFoundError: it does not exist; the message names the path and the fix.
    """
    given = os.environ.get("KBROUTER_DOCLING_PYTHON")
    python = Path(given) if given else DEFAULT_PYTHON
    if not python.is_file():
        where = f"KBROUTER_DOCLING_PYTHON={given!r}" if given else f"{python}"
        raise FileNotFoundError(
            f"--parser docling: no docling env at {where}; build it with `make docling` (in {ROOT}), "
            "or point KBROUTER_DOCLING_PYTHON at a python that has docling installed"
        )
    return python


def parse_docling(path: Path, file: str, figure_dir: Path, figure_prefix: str, limits: Limits) -> Parsed:
    """Convert one file with docling (in its own env) into passages, tables and figures with provenance.

    Raises:
        FileNotFoundError: the docling env is missing.
        Skip: docling failed on the file, needs layout weights (PDF), ran past `limits.max_seconds`, or found nothing.
    """
    cmd = [str(docling_python()), "-I", str(WORKER), str(path.resolve()), "--figure-dir", str(figure_dir.resolve())]
    if os.environ.get("KBROUTER_DOCLING_ARTIFACTS"):
        cmd += ["--artifacts-path", os.environ["KBROUTER_DOCLING_ARTIFACTS"]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limits.max_seconds, env=env)
    except subprocess.TimeoutExpired:
        raise Skip("over time limit", f"docling ran past --max-seconds {limits.max_seconds:g}") from None
    err = done.stderr.strip().splitlines()
    last = next((ln for ln in reversed(err) if ln.startswith("docling_worker:")), err[-1] if err else "")
    if done.returncode == EXIT_NEEDS_WEIGHTS:
        raise Skip("docling needs layout weights", last.removeprefix("docling_worker: "))
    if done.returncode != 0:
        raise Skip("docling error", f"exit {done.returncode}: {last[:300] or 'no message'}")
    return from_docling(json.loads(done.stdout), path, file, figure_prefix)


def from_docling(doc: dict, path: Path, file: str, figure_prefix: str) -> Parsed:
    """The worker's JSON -> `Parsed`: sections from title/section-header items, text packed into passages."""
    items = doc["items"]
    title = next((clean(i["text"]) for i in items if i["type"] == "text" and i["label"] == "title"), "")
    kind = {".htm": "html"}.get(path.suffix.lower(), path.suffix.lower().lstrip("."))
    parsed = Parsed(file=file, title=title or path.stem.replace("_", " "), kind=kind, pages=len(doc["pages"]))
    blocks: list[tuple[str, dict]] = []
    section = ""
    for i, item in enumerate(items):
        if item["type"] == "text" and item["label"] in HEADINGS and clean(item["text"]):
            section = clean(item["text"])
        where = _where(file, section, item["prov"])
        if item["type"] == "table":
            header, rows = rectangular(
                [_cell(h) for h in item["header"]], [[_cell(c) for c in r] for r in item["rows"]]
            )
            if len(header) >= 2 and rows:
                n = len(parsed.tables) + 1
                parsed.tables.append(TableUnit(header, rows, clean(item["caption"]) or section, {**where, "table": n}))
        elif item["type"] == "picture":
            if item["image"] is None:
                continue  # no image data (a page's remote picture): nothing to index
            n = len(parsed.figures) + 1
            caption = clean(item["caption"]) or _next_caption(items, i) or f"{parsed.title}, picture {n}"
            parsed.figures.append(FigureUnit(f"{figure_prefix}/{item['image']}", caption, {**where, "figure": n}))
        elif clean(item["text"]):
            blocks.append((item["text"], where))
    parsed.passages = pack_passages(blocks)
    if not parsed.passages and not parsed.tables and not parsed.figures:
        raise Skip("no text", "docling found no text, tables or pictures")
    return parsed


def _cell(text: str) -> str:
    return clean(MD_LINK.sub(r"\1", text))


def _next_caption(items: list[dict], i: int) -> str:
    # docling links no caption to a DOCX picture; as ingest.office does, a "Figure n" paragraph right after names it
    nxt = next((it for it in items[i + 1 :] if it["type"] != "text" or clean(it["text"])), None)
    if nxt is not None and nxt["type"] == "text" and CAPTION.match(nxt["text"]):
        return clean(nxt["text"])
    return ""


def _where(file: str, section: str, prov: list[dict]) -> dict:
    out: dict = {"file": file, "parser": "docling"}
    if section:
        out["section"] = section
    if prov:
        out["page"] = prov[0]["page"]
        out["bbox"] = prov[0]["bbox"]
    return out
