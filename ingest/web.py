"""HTML and Markdown files: text by section (h1-h6), tables, and local images with their alt text (BeautifulSoup).

Markdown is rendered to HTML first (markdown-it-py, CommonMark + tables), so both go through one reader.
Boilerplate (`script`, `style`, `nav`, `header`, `footer`, `form`, `noscript`) is dropped. A `<table>` with at least
2 columns and a data row becomes a table (header: its `<th>` row, else its first row); a layout table (one column,
or a table holding tables) is read as text. An `<img>` whose `src` is a local file next to the page becomes a figure
captioned by its `<figcaption>`, else its `alt` or `title`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ingest.units import FigureUnit, Parsed, Skip, TableUnit, clean, pack_passages, rectangular

BOILERPLATE = ("script", "style", "nav", "header", "footer", "form", "noscript", "iframe", "svg")
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
BLOCKS = ("p", "li", "blockquote", "pre", "dd", "dt", "td", "th", "figcaption", "caption", "div", "section", "article")


def read_html_text(path: Path) -> str:
    """The file's text: UTF-8, else the charset the bytes declare or look like (charset-normalizer)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        from charset_normalizer import from_bytes

        best = from_bytes(data).best()
        if best is None:
            raise Skip("unreadable", "not text in any known encoding") from None
        return str(best)


def parse_markdown(path: Path, file: str, figure_dir: Path, figure_prefix: str) -> Parsed:
    """Parse a Markdown file (rendered to HTML, then read as HTML)."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(read_html_text(path))
    parsed = _parse(html, path, file, figure_dir, figure_prefix, kind="markdown")
    if parsed.title == path.stem.replace("_", " "):
        first = next((ln.lstrip("# ").strip() for ln in read_html_text(path).splitlines() if ln.strip()), "")
        parsed.title = first[:120] or parsed.title
    return parsed


def parse_html(path: Path, file: str, figure_dir: Path, figure_prefix: str) -> Parsed:
    """Parse an HTML file into sections of text, tables and local figures."""
    return _parse(read_html_text(path), path, file, figure_dir, figure_prefix, kind="html")


def _parse(html: str, path: Path, file: str, figure_dir: Path, figure_prefix: str, kind: str) -> Parsed:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "lxml")
    for tag in soup(BOILERPLATE):
        tag.decompose()
    title_tag = soup.find("title")
    h1 = soup.find("h1")
    title = clean(title_tag.get_text(" ")) if title_tag else ""
    title = title or (clean(h1.get_text(" ")) if h1 else "") or path.stem.replace("_", " ")
    parsed = Parsed(file=file, title=title, kind=kind)
    body = soup.body or soup
    for table in body.find_all("table"):
        if table.find("table") is not None:
            continue  # a layout table: its inner tables are read on their own
        unit = _table(table, file, len(parsed.tables) + 1, _section_of(table))
        if unit is not None:
            parsed.tables.append(unit)
            table.decompose()  # its text is the table's, not a passage's
    for img in body.find_all("img"):
        _figure(img, path, parsed, figure_dir, figure_prefix)
    blocks: list[tuple[str, dict]] = []
    section = ""
    for el in body.find_all([*HEADINGS, *BLOCKS]):
        if el.name in HEADINGS:
            section = clean(el.get_text(" "))
            blocks.append((section, {"file": file, "section": section}))
            continue
        if el.find([*HEADINGS, *BLOCKS]) is not None:  # a container: its blocks are read one by one, here only
            text = " ".join(el.find_all(string=True, recursive=False))  # the text directly inside it
        else:
            text = el.get_text(" ")
        if text.strip():
            blocks.append((text, {"file": file, "section": section}))
    parsed.passages = pack_passages(_dedupe(blocks))
    if not parsed.passages and not parsed.tables:
        raise Skip("no text", "the page holds no text or tables")
    return parsed


def _dedupe(blocks: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    # nested inline tags (a span inside an a) can both be leaves of different parents; keep each text once in a row
    out: list[tuple[str, dict]] = []
    for text, prov in blocks:
        if out and clean(out[-1][0]) == clean(text):
            continue
        out.append((text, prov))
    return out


def _section_of(el) -> str:  # noqa: ANN001
    heading = el.find_previous(HEADINGS)
    return clean(heading.get_text(" ")) if heading is not None else ""


def _table(table, file: str, number: int, section: str) -> TableUnit | None:  # noqa: ANN001
    rows = []
    head_cells: list[str] | None = None
    for tr in table.find_all("tr"):
        cells = tr.find_all(["th", "td"])
        texts = []
        for c in cells:
            span = int(c.get("colspan", 1)) if str(c.get("colspan", "1")).isdigit() else 1
            texts += [clean(c.get_text(" "))] + [""] * (min(span, 50) - 1)
        if head_cells is None and cells and all(c.name == "th" for c in cells):
            head_cells = texts
        elif any(texts):
            rows.append(texts)
    if head_cells is None and rows:
        head_cells, rows = rows[0], rows[1:]
    if head_cells is None:
        return None
    header, rows = rectangular(head_cells, rows)
    if len(header) < 2 or not rows:
        return None
    cap = table.find("caption")
    caption = clean(cap.get_text(" ")) if cap is not None else section
    prov = {"file": file, "section": section, "table": number} if section else {"file": file, "table": number}
    return TableUnit(header, rows, caption, prov)


def _figure(img, path: Path, parsed: Parsed, figure_dir: Path, figure_prefix: str) -> None:  # noqa: ANN001
    src = str(img.get("src") or "")
    if not src or "://" in src or src.startswith(("data:", "//")):
        return  # remote or inline images are not fetched
    source = (path.parent / src.split("?")[0]).resolve()
    if not source.is_file() or not source.is_relative_to(path.parent.resolve()):
        return  # only images that sit beside the page (no reading outside the ingested folder)
    fig = img.find_parent("figure")
    caption_tag = fig.find("figcaption") if fig is not None else None
    caption = clean(caption_tag.get_text(" ")) if caption_tag is not None else ""
    caption = caption or clean(str(img.get("alt") or "")) or clean(str(img.get("title") or ""))
    n = len(parsed.figures) + 1
    figure_dir.mkdir(parents=True, exist_ok=True)
    name = f"figure{n}{source.suffix.lower()}"
    shutil.copyfile(source, figure_dir / name)
    prov = {"file": parsed.file, "figure": n}
    parsed.figures.append(FigureUnit(f"{figure_prefix}/{name}", caption or f"{parsed.title}, image {n}", prov))
