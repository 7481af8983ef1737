"""PDF files: text in reading order, ruled tables, and figures with their "Figure n" captions (pdfplumber).

pdfplumber (MIT, on pdfminer.six) needs no model weights. Reading order comes from pdfminer's layout analysis
(text boxes, columns kept apart); a passage is a run of boxes of one page, at most 100 words, with the union of
their bboxes (PDF points, origin top-left: `[x0, top, x1, bottom]`). Tables are pdfplumber's ruled tables, their
multi-line cells split back into rows; a page with a "TABLE" caption and no ruled table gets a text-aligned table
below the caption. Figures: every raster image of at least `MIN_FIGURE_PT` points a side goes to the "Figure n"
caption in its column (nearest vertically), images of one caption are rendered together as one PNG; a caption with
no raster image (a vector chart) gets the drawing next to it. Text inside a table is not repeated as passages.

Skips (no record of the file is written): encrypted without the right `--password`, malformed, over the page
limit, over the time limit, and no text layer (a scan: OCR it first, e.g. `ocrmypdf in.pdf out.pdf`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from ingest.units import FigureUnit, Limits, Parsed, Skip, TableUnit, clean, pack_passages, rectangular

logger = logging.getLogger(__name__)

MIN_FIGURE_PT = 40  # smaller images are rules, bullets and logos
CAPTION_GAP_PT = 250  # an image further than this from every caption is a figure of its own
RENDER_DPI = 110
FIGURE_PAD_PT = 8
FIGURE_CAPTION = re.compile(r"^\s*(fig(?:ure)?\.?)\s*(\d+[\w.\-]*)", re.IGNORECASE)
TABLE_CAPTION = re.compile(r"^\s*table\b\s*([\w.\-]*)", re.IGNORECASE)
FOOTNOTE = re.compile(r"^\s*([*†‡§¶]|source:|note:)", re.IGNORECASE)


def parse_pdf(
    path: Path, file: str, figure_dir: Path, figure_prefix: str, limits: Limits, password: str = ""
) -> Parsed:
    """Parse one PDF into passages, tables and figures.

    Args:
        path: the PDF.
        file: its name in provenance (relative to the ingested folder).
        figure_dir: where figure PNGs are written (created on demand).
        figure_prefix: the figures' paths as recorded (relative to the corpus folder).
        limits: per-file bounds (pages, seconds).
        password: tried on encrypted PDFs.

    Raises:
        Skip: encrypted, malformed, over a limit, or no text layer; nothing is written for the file.
    """
    import pdfplumber
    from pdfminer.pdfdocument import PDFPasswordIncorrect

    start = time.monotonic()
    try:
        pdf = pdfplumber.open(path, password=password or None, laparams={})
        pages = pdf.pages  # parses the page tree: a broken file fails here
    except PDFPasswordIncorrect:
        how = "the --password given is wrong" if password else "pass --password to open it"
        raise Skip("encrypted", f"password-protected PDF ({how})") from None
    except Exception as e:  # pdfminer raises many types (PSEOF, PDFSyntaxError, ...) for a malformed file
        cause = e.__cause__ or e.__context__ or e
        if type(cause).__name__ == "PDFPasswordIncorrect":
            how = "the --password given is wrong" if password else "pass --password to open it"
            raise Skip("encrypted", f"password-protected PDF ({how})") from None
        raise Skip("malformed", f"not a readable PDF ({type(cause).__name__}: {str(cause)[:120]})") from None
    with pdf:
        if len(pages) > limits.max_pages:
            raise Skip("over page limit", f"{len(pages)} pages > --max-pages {limits.max_pages}")
        try:
            has_text = any(page.chars for page in pages)  # stops at the first page with text: a scan is caught early
        except Exception as e:  # a broken content stream
            raise Skip("malformed", f"unreadable page content ({type(e).__name__}: {str(e)[:120]})") from None
        if not has_text:
            raise Skip("no text layer", "no text layer (a scan?); OCR it first, e.g. `ocrmypdf in.pdf out.pdf`")
        title = _title(pdf.metadata, path)
        parsed = Parsed(file=file, title=title, kind="pdf", pages=len(pages))
        blocks: list[tuple[str, dict]] = []
        for number, page in enumerate(pages, 1):
            if time.monotonic() - start > limits.max_seconds:
                raise Skip("over time limit", f"still parsing page {number} after {limits.max_seconds:g} s")
            try:
                blocks += _page(page, number, parsed, figure_dir, figure_prefix)
            except Skip:
                raise
            except Exception as e:  # one broken page (bad content stream) fails the file, not the run
                raise Skip("malformed", f"page {number}: {type(e).__name__}: {str(e)[:120]}") from None
            page.flush_cache()
    parsed.passages = pack_passages(blocks)
    return parsed


def _title(metadata: dict, path: Path) -> str:
    title = str(metadata.get("Title") or "").strip()
    if not title or title.lower().startswith(("microsoft word", "untitled")) or title.lower().endswith(".pdf"):
        title = path.stem.replace("_", " ").replace("-", " ")
    return title


def _bbox(obj: dict) -> list[float]:
    return [round(float(obj["x0"]), 1), round(float(obj["top"]), 1), round(float(obj["x1"]), 1),
            round(float(obj["bottom"]), 1)]  # fmt: skip


def _inside(obj: dict, box: tuple | list) -> bool:
    cx, cy = (obj["x0"] + obj["x1"]) / 2, (obj["top"] + obj["bottom"]) / 2
    return box[0] <= cx <= box[2] and box[1] <= cy <= box[3]


def _page(page, number: int, parsed: Parsed, figure_dir: Path, figure_prefix: str) -> list[tuple[str, dict]]:  # noqa: ANN001
    """Tables and figures of one page appended to `parsed`; returns the page's text blocks in reading order."""
    boxes = [b for b in page.objects.get("textboxhorizontal", []) if b["text"].strip()]
    tables = _tables(page, boxes)
    for header, rows, caption, _, bbox in tables:
        parsed.tables.append(
            TableUnit(
                header,
                rows,
                caption,
                {"file": parsed.file, "page": number, "bbox": bbox, "table": len(parsed.tables) + 1},
            )
        )
    kept_text = " ".join(t[2] + " " + t[3] for t in tables)  # titles and notes inside a table's rules stay text
    body = [b for b in boxes if not any(_inside(b, t[4]) for t in tables) or clean(b["text"])[:40] in kept_text]
    _figures(page, number, boxes, [t[4] for t in tables], parsed, figure_dir, figure_prefix)
    return [(b["text"], {"file": parsed.file, "page": number, "bbox": _bbox(b)}) for b in body]


# -- tables -------------------------------------------------------------------------------------------------------


def _explode(row: list[str]) -> list[list[str]]:
    """One ruled row whose cells hold n lines each (rows without their own rules) back into n rows."""
    counts = {len(c.split("\n")) for c in row if c}
    if len(counts) != 1 or (n := counts.pop()) < 2:
        return [[" ".join(c.split()) for c in row]]
    return [[c.split("\n")[i].strip() if c else "" for c in row] for i in range(n)]


def _grid_to_table(
    grid: list[list[str | None]], header_of: Callable[[int], list[str] | None] | None = None
) -> tuple[list[str], list[list[str]], str, str] | None:
    """Header, rows, title and notes of an extracted grid; None when it is no real table (< 2 rows or columns).

    Rows of a wide grid with a single filled cell are not table rows: at the top they are its title, at the bottom
    its notes (which stay text passages too). `header_of(i)` may give the header of grid row `i` cell by cell.
    """
    cells = [[c or "" for c in row] for row in grid]

    def single(row: list[str]) -> bool:
        return len(row) > 2 and sum(1 for c in row if c.strip()) <= 1

    title_lines, note_lines = [], []
    first = 0
    while cells and single(cells[0]):
        title_lines += [" ".join(c.split()) for c in cells.pop(0) if c.strip()]
        first += 1
    while cells and single(cells[-1]):
        note_lines = [" ".join(c.split()) for c in cells.pop() if c.strip()] + note_lines
    if len(cells) < 2:
        return None
    split = header_of(first) if header_of is not None else None
    header = split if split is not None and len(split) == len(cells[0]) else [" ".join(c.split()) for c in cells[0]]
    rows = [r for row in cells[1:] for r in _explode(row)]
    header, rows = rectangular(header, rows)
    if len(header) < 2 or not rows:
        return None
    return header, rows, " ".join(title_lines), " ".join(note_lines)


NUMBER = re.compile(r"^[($€£]?[-–+]?\d[\d,.]*%?\)?[*†‡§¶]*$")


def _text_table(page, region: tuple) -> tuple[list[str], list[list[str]], str, str] | None:  # noqa: ANN001
    """A table without rules from its words: a line with >= 3 numbers is a row (label = the words left of its first
    number); label lines without numbers join the nearest row (labels that wrap around their row's numbers)."""
    words = page.crop(region).extract_words(keep_blank_chars=False, use_text_flow=False)
    lines: list[list[dict]] = []
    for w in sorted(words, key=lambda w: (round(w["top"]), w["x0"])):
        if lines and abs(lines[-1][0]["top"] - w["top"]) < 3:
            lines[-1].append(w)
        else:
            lines.append([w])
    numeric = [ln for ln in lines if sum(bool(NUMBER.match(w["text"])) for w in ln) >= 3]
    if len(numeric) < 2:
        return None
    split = min(next(w["x0"] for w in ln if NUMBER.match(w["text"])) for ln in numeric)
    rows = []
    for ln in numeric:
        label = [w for w in sorted(ln, key=lambda w: w["x0"]) if w["x1"] <= split + 1]
        values = [w["text"] for w in sorted(ln, key=lambda w: w["x0"]) if w["x1"] > split + 1]
        rows.append({"top": ln[0]["top"], "label": [w["text"] for w in label], "values": values, "extra": []})
    first, last = numeric[0][0]["top"], numeric[-1][0]["top"]
    for ln in lines:
        if ln in numeric or all(w["x0"] > split for w in ln):
            continue
        top = ln[0]["top"]
        if top < first - 12 or top > last + 12:
            continue  # a heading above the table or a note below it
        nearest = min(rows, key=lambda r: (abs(r["top"] - top), -r["top"]))
        nearest["extra"].append((top, [w["text"] for w in sorted(ln, key=lambda w: w["x0"])]))
    grid = []
    for r in rows:
        before = [t for top, ws in sorted(r["extra"]) if top < r["top"] for t in ws]
        after = [t for top, ws in sorted(r["extra"]) if top >= r["top"] for t in ws]
        grid.append([" ".join(before + r["label"] + after), *r["values"]])
    header, *body = grid
    header, body = rectangular(header, body)
    return (header, body, "", "") if len(header) >= 2 and body else None


def _split_header(page, table, index: int) -> list[str] | None:  # noqa: ANN001
    """A header row whose cells span several columns, cut into one name per column by the words' positions.

    A spanning cell of two lines is a group label over sub-headers ("Pre-Pawn" over "Handgun Long Gun *Other"): each
    column gets "label sub-header". Column edges come from the first data row with every cell of its own. None when
    no cell spans columns.
    """
    rows = table.rows
    if index >= len(rows) or all(c is not None for c in rows[index].cells):
        return None
    data = next((r for r in rows[index + 1 :] if all(c is not None for c in r.cells)), None)
    if data is None:
        return None
    edges = [(c[0], c[2]) for c in data.cells]
    cells = rows[index].cells
    out: list[str] = []
    j = 0
    while j < len(cells):
        cell, span = cells[j], 1
        while j + span < len(cells) and cells[j + span] is None:
            span += 1
        if cell is None:
            out.append("")
            j += 1
            continue
        words = page.within_bbox(cell, relative=False).extract_words()
        lines: list[list[dict]] = []
        for w in sorted(words, key=lambda w: (round(w["top"]), w["x0"])):
            if lines and abs(lines[-1][0]["top"] - w["top"]) < 3:
                lines[-1].append(w)
            else:
                lines.append([w])
        label = " ".join(w["text"] for w in lines[0]) if span > 1 and len(lines) > 1 else ""
        subs = [w for ln in (lines[1:] if label else lines) for w in ln]
        for k in range(span):
            x0, x1 = edges[j + k] if j + k < len(edges) else (cell[0], cell[2])
            name = " ".join(w["text"] for w in subs if x0 <= (w["x0"] + w["x1"]) / 2 < x1)
            out.append(" ".join(x for x in (label, name) if x))
        j += span
    return out


def _caption_near(boxes: list[dict], bbox: tuple, gap: float = 40) -> str:
    """The "Table n" line just above a table, else a short heading there."""
    above = [b for b in boxes if bbox[1] - gap <= b["bottom"] <= bbox[1] + 2 and bbox[0] - 50 <= b["x0"] <= bbox[2]]
    above.sort(key=lambda b: (not TABLE_CAPTION.match(b["text"]), bbox[1] - b["bottom"]))
    return clean(above[0]["text"]) if above and len(above[0]["text"].split()) <= 25 else ""


def _tables(page, boxes: list[dict]) -> list[tuple[list[str], list[list[str]], str, str, list[float]]]:  # noqa: ANN001
    """(header, rows, caption, notes, bbox) of each table of a page."""
    out = []
    for table in page.find_tables():
        got = _grid_to_table(table.extract(), lambda i, table=table: _split_header(page, table, i))
        if got is not None:
            header, rows, title, notes = got
            caption = " ".join(x for x in (_caption_near(boxes, table.bbox), title) if x)
            out.append((header, rows, caption, notes, [round(v, 1) for v in table.bbox]))
    if out:
        return out
    # no ruled table: a "TABLE" caption starts a text-aligned one, ending at its footnotes or the next caption
    for cap in boxes:
        if not TABLE_CAPTION.match(cap["text"]) or len(cap["text"].split()) < 2:
            continue
        below = sorted((b for b in boxes if b["top"] > cap["bottom"]), key=lambda b: b["top"])
        end = next(
            (b["top"] for b in below if FOOTNOTE.match(b["text"]) or FIGURE_CAPTION.match(b["text"])),
            min(cap["bottom"] + 300, page.height),
        )
        region = (0, cap["bottom"] + 1, page.width, end - 1)
        if region[3] - region[1] < 20:
            continue
        got = _text_table(page, region)
        if got is not None:
            header, rows, _, _ = got
            out.append((header, rows, clean(cap["text"]), "", [round(v, 1) for v in region]))
    return out


# -- figures ------------------------------------------------------------------------------------------------------


def _caption_columns(captions: list[dict], width: float) -> list[tuple[float, float]]:
    """The x-range of each caption's column: from its left edge to the next caption beside it (or the page edge)."""
    cols = []
    for c in captions:
        right = [o["x0"] for o in captions if o["x0"] > c["x0"] + 50 and abs(o["top"] - c["top"]) < 100]
        cols.append((c["x0"] - 10, min(right) if right else width))
    return cols


def _gap(a: dict | list, b: dict) -> float:
    top, bottom = (a[1], a[3]) if isinstance(a, list) else (a["top"], a["bottom"])
    return max(b["top"] - bottom, top - b["bottom"], 0.0)


def _figures(page, number, boxes, table_boxes, parsed, figure_dir, figure_prefix) -> None:  # noqa: ANN001
    captions = [b for b in boxes if FIGURE_CAPTION.match(b["text"])]
    columns = _caption_columns(captions, page.width)
    images = [
        im
        for im in page.images
        if im["x1"] - im["x0"] >= MIN_FIGURE_PT and im["bottom"] - im["top"] >= MIN_FIGURE_PT
        and not any(_inside(im, t) for t in table_boxes)
    ]  # fmt: skip
    groups: dict[int, list[list[float]]] = {}
    loose: list[list[float]] = []
    for im in images:
        cx = (im["x0"] + im["x1"]) / 2
        near = [(_gap(_bbox(im), c), i) for i, c in enumerate(captions) if columns[i][0] <= cx < columns[i][1]]
        near = [x for x in near if x[0] <= CAPTION_GAP_PT]
        if near:
            groups.setdefault(min(near)[1], []).append(_bbox(im))
        else:
            loose.append(_bbox(im))
    for i, cap in enumerate(captions):
        boxes_of = groups.get(i) or _vector_figure(page, cap, columns[i], table_boxes)
        if boxes_of:
            _save(page, number, _union(boxes_of), clean(cap["text"]), parsed, figure_dir, figure_prefix)
    for bbox in loose:  # an image without a "Figure n" caption: the nearest short line of real words, if any
        nearby = [b for b in boxes if _gap(bbox, b) <= 30 and 3 <= len(b["text"].split()) <= 60 and _wordy(b["text"])]
        caption = clean(min(nearby, key=lambda b: _gap(bbox, b))["text"]) if nearby else ""
        _save(page, number, bbox, caption or f"{parsed.title}, page {number}", parsed, figure_dir, figure_prefix)


def _wordy(text: str) -> bool:
    words = text.split()
    return sum(len(w) for w in words) / max(len(words), 1) >= 3 and any(c.isalpha() for c in text)


def _vector_figure(page, cap: dict, column: tuple[float, float], table_boxes: list) -> list[list[float]]:  # noqa: ANN001
    """The drawing (lines, curves, rects) next to a caption, grown from the caption while gaps stay small."""
    drawn = [
        _bbox(o)
        for o in [*page.lines, *page.curves, *page.rects]
        if column[0] <= (o["x0"] + o["x1"]) / 2 < column[1] and not any(_inside(o, t) for t in table_boxes)
    ]
    best: list[list[float]] = []
    for below in (True, False):
        edge = cap["bottom"] if below else cap["top"]
        picked: list[list[float]] = []
        for b in sorted(drawn, key=lambda b: b[1] if below else -b[3]):
            dist = b[1] - edge if below else edge - b[3]
            if dist < -2:
                continue
            if dist > 40:
                break
            picked.append(b)
            edge = max(edge, b[3]) if below else min(edge, b[1])
        if len(picked) > len(best):
            best = picked
    return best if len(best) >= 3 else []


def _union(bboxes: list[list[float]]) -> list[float]:
    return [min(b[0] for b in bboxes), min(b[1] for b in bboxes), max(b[2] for b in bboxes), max(b[3] for b in bboxes)]


def _save(page, number, bbox, caption, parsed, figure_dir, figure_prefix) -> None:  # noqa: ANN001
    """Render the figure's region of the page to PNG and record it."""
    n = len(parsed.figures) + 1
    pad = FIGURE_PAD_PT  # axis labels and callouts sit just outside the drawn objects
    x0, top = max(bbox[0] - pad, 0), max(bbox[1] - pad, 0)
    x1, bottom = min(bbox[2] + pad, page.width), min(bbox[3] + pad, page.height)
    if x1 - x0 < 1 or bottom - top < 1:
        return
    figure_dir.mkdir(parents=True, exist_ok=True)
    name = f"p{number}-figure{n}.png"
    page.crop((x0, top, x1, bottom)).to_image(resolution=RENDER_DPI).save(figure_dir / name)
    prov = {"file": parsed.file, "page": number, "bbox": [round(v, 1) for v in (x0, top, x1, bottom)], "figure": n}
    parsed.figures.append(FigureUnit(f"{figure_prefix}/{name}", caption, prov))
