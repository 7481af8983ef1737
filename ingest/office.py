"""Office and delimited files: DOCX (python-docx), XLSX (openpyxl), CSV and TSV (the csv module).

DOCX: paragraphs and tables in document order; a Title/Heading paragraph starts a section; a picture becomes a
figure captioned by the next (or previous) Caption-style or "Figure n" paragraph. XLSX: every sheet with at least
two filled columns is a table (header: its first filled row; formulas read as their cached values). CSV/TSV: one
table, its first row the header. A sheet or file over `Limits.max_rows` rows is skipped with the limit named.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from ingest.units import FigureUnit, Limits, Parsed, Skip, TableUnit, clean, pack_passages, rectangular

CAPTION = re.compile(r"^\s*(fig(?:ure)?\.?|table)\s*\d", re.IGNORECASE)


def parse_docx(path: Path, file: str, figure_dir: Path, figure_prefix: str) -> Parsed:
    """Parse a Word document into sections of text, tables and pictures with captions."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, KeyError, ValueError) as e:
        raise Skip("malformed", f"not a readable DOCX ({type(e).__name__}: {str(e)[:120]})") from None
    except Exception as e:  # a zip that is not an Office package raises BadZipFile and others
        raise Skip("malformed", f"not a readable DOCX ({type(e).__name__}: {str(e)[:120]})") from None
    title = clean(document.core_properties.title or "")
    parsed = Parsed(file=file, title=title, kind="docx")
    body = document.element.body
    items: list = []
    for el in body.iterchildren():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "p":
            items.append(Paragraph(el, document))
        elif tag == "tbl":
            items.append(Table(el, document))
    blocks: list[tuple[str, dict]] = []
    section = ""
    pending_pictures: list[tuple[str, int]] = []  # (image part name, index of its paragraph) awaiting a caption
    for i, item in enumerate(items):
        if isinstance(item, Table):
            unit = _docx_table(item, file, len(parsed.tables) + 1, section)
            if unit is not None:
                prev = items[i - 1] if i else None
                if isinstance(prev, Paragraph) and CAPTION.match(prev.text or ""):
                    unit.caption = clean(prev.text)
                parsed.tables.append(unit)
            continue
        style = (item.style.name if item.style is not None else "") or ""
        text = clean(item.text or "")
        if style == "Title" and not parsed.title:
            parsed.title = text
        if style.startswith("Heading") or style == "Title":
            section = text or section
        for rid in item._element.xpath(".//a:blip/@r:embed"):
            part = document.part.related_parts.get(rid)
            if part is not None:
                pending_pictures.append((part, i))
        if pending_pictures and text and (style == "Caption" or CAPTION.match(text)):
            for part, _ in pending_pictures:
                _save_picture(part, text, section, parsed, figure_dir, figure_prefix)
            pending_pictures = []
        elif pending_pictures and text and i - pending_pictures[-1][1] > 1:
            for part, _ in pending_pictures:  # no caption right after the picture: the nearest paragraph names it
                _save_picture(part, "", section, parsed, figure_dir, figure_prefix)
            pending_pictures = []
        if text:
            blocks.append((text, {"file": file, "section": section} if section else {"file": file}))
    for part, _ in pending_pictures:
        _save_picture(part, "", section, parsed, figure_dir, figure_prefix)
    parsed.title = parsed.title or path.stem.replace("_", " ")
    parsed.passages = pack_passages(blocks)
    if not parsed.passages and not parsed.tables and not parsed.figures:
        raise Skip("no text", "the document holds no text, tables or pictures")
    return parsed


def _docx_table(table, file: str, number: int, section: str) -> TableUnit | None:  # noqa: ANN001
    grid = []
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:  # a merged cell appears once per grid column it spans
            key = id(cell._tc)
            cells.append("" if key in seen else clean(cell.text))
            seen.add(key)
        grid.append(cells)
    if len(grid) < 2:
        return None
    header, rows = rectangular(grid[0], grid[1:])
    if len(header) < 2 or not rows:
        return None
    prov = {"file": file, "section": section, "table": number} if section else {"file": file, "table": number}
    return TableUnit(header, rows, section, prov)


def _save_picture(part, caption: str, section: str, parsed: Parsed, figure_dir: Path, prefix: str) -> None:  # noqa: ANN001
    n = len(parsed.figures) + 1
    suffix = Path(str(part.partname)).suffix.lower() or ".png"
    figure_dir.mkdir(parents=True, exist_ok=True)
    name = f"figure{n}{suffix}"
    (figure_dir / name).write_bytes(part.blob)
    prov = {"file": parsed.file, "section": section, "figure": n} if section else {"file": parsed.file, "figure": n}
    parsed.figures.append(FigureUnit(f"{prefix}/{name}", caption or f"{parsed.title}, picture {n}", prov))


def parse_xlsx(path: Path, file: str, limits: Limits) -> Parsed:
    """Parse every sheet of a workbook into a table (cached formula values, read-only)."""
    import openpyxl

    try:
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as e:  # openpyxl raises InvalidFileException, BadZipFile, KeyError, ... on a broken file
        raise Skip("malformed", f"not a readable XLSX ({type(e).__name__}: {str(e)[:120]})") from None
    parsed = Parsed(file=file, title=path.stem.replace("_", " "), kind="xlsx")
    try:
        for sheet in book.worksheets:
            grid = []
            for row in sheet.iter_rows(values_only=True):
                cells = ["" if v is None else clean(str(v)) for v in row]
                if any(cells):
                    grid.append(cells)
                if len(grid) > limits.max_rows + 1:
                    raise Skip("over row limit", f"sheet {sheet.title!r} has > {limits.max_rows} rows (--max-rows)")
            if len(grid) < 2:
                continue
            header, rows = rectangular(grid[0], grid[1:])
            if len(header) >= 2 and rows:
                prov = {"file": file, "sheet": sheet.title, "table": len(parsed.tables) + 1}
                parsed.tables.append(TableUnit(header, rows, sheet.title, prov))
    finally:
        book.close()
    if not parsed.tables:
        raise Skip("no tables", "no sheet has a header and a data row in two or more columns")
    return parsed


def parse_delimited(path: Path, file: str, limits: Limits) -> Parsed:
    """Parse a CSV or TSV file (UTF-8, a BOM is fine) into one table."""
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            grid = []
            for row in csv.reader(f, delimiter=delimiter):
                cells = [clean(c) for c in row]
                if any(cells):
                    grid.append(cells)
                if len(grid) > limits.max_rows + 1:
                    raise Skip("over row limit", f"more than {limits.max_rows} rows (--max-rows)")
    except UnicodeDecodeError as e:
        raise Skip("unreadable", f"not UTF-8 text (byte offset {e.start}); save it as UTF-8") from None
    except csv.Error as e:
        raise Skip("malformed", f"not a readable {path.suffix[1:].upper()} ({e})") from None
    if len(grid) < 2:
        raise Skip("no tables", "needs a header row and at least one data row")
    header, rows = rectangular(grid[0], grid[1:])
    if len(header) < 1 or not rows:
        raise Skip("no tables", "needs a header row and at least one data row")
    parsed = Parsed(file=file, title=path.stem.replace("_", " "), kind=path.suffix.lower()[1:])
    parsed.tables.append(TableUnit(header, rows, "", {"file": file, "table": 1}))
    return parsed
