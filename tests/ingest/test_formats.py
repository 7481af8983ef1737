"""HTML, Markdown, DOCX, XLSX, CSV/TSV, image and video readers: the real shared HTML page and DOCX, and small
files written here in each format."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.media import parse_image, parse_video
from ingest.office import parse_delimited, parse_xlsx
from ingest.units import Limits, Skip, pack_passages
from ingest.web import parse_html, parse_markdown


def test_docx_table_picture_caption_and_sections(parse_doc):
    from PIL import Image

    parsed, out = parse_doc("docling_word_sample.docx")
    assert parsed.title == "Swimming in the lake"  # the Title-style paragraph (core properties have none)
    (table,) = parsed.tables
    assert table.header == ["", "Food", "Calories per portion"]
    grain = next(r for r in table.rows if r[0] == "Grain")
    assert grain[1:] == ["Corn, Buckwheat, Barley", "200"]  # docs-wordsample-q1
    (figure,) = parsed.figures
    assert figure.caption == "Figure 1: This is a cute duckling"  # the Caption paragraph after the picture
    with Image.open(out / "docling_word_sample" / Path(figure.image).name) as im:
        assert im.width > 50
    sections = {p.provenance.get("section") for p in parsed.passages}
    assert {"Let’s swim!", "Let’s eat"} <= sections
    assert parsed.pages == 0 and all("page" not in p.provenance for p in parsed.passages)


def test_html_table_and_text_by_section(parse_doc):
    parsed, _ = parse_doc("fdic_failed_bank_list.html")
    assert parsed.title == "FDIC: Failed Bank List"
    (table,) = parsed.tables
    assert table.header == ["Bank Name", "City", "ST", "CERT", "Acquiring Institution", "Closing Date", "Updated Date"]
    assert len(table.rows) == 505
    indymac = next(r for r in table.rows if r[0] == "IndyMac Bank")
    assert indymac[4] == "OneWest Bank, FSB"  # docs-fdic-q1
    text = " ".join(p.text for p in parsed.passages)
    assert "failed since October 1, 2000" in text  # docs-fdic-q5
    assert "IndyMac" not in text  # table rows are not repeated as passages
    assert table.provenance == {"file": "fdic_failed_bank_list.html", "section": "Failed Bank List", "table": 1}


def test_markdown_sections_table_and_local_image(tmp_path):
    from PIL import Image

    Image.new("RGB", (40, 30), "red").save(tmp_path / "chart.png")
    md = tmp_path / "notes.md"
    md.write_text(
        "# Field notes\n\nIntro paragraph.\n\n## Birds\n\nWe saw **three** herons.\n\n"
        "| bird | count |\n|---|---|\n| heron | 3 |\n| crow | 7 |\n\n"
        "![Herons by the lake](chart.png)\n\n![remote](https://example.org/x.png)\n",
        encoding="utf-8",
    )
    parsed = parse_markdown(md, "notes.md", tmp_path / "figs", "figures/notes")
    assert parsed.title == "Field notes"
    (table,) = parsed.tables
    assert table.header == ["bird", "count"] and table.rows == [["heron", "3"], ["crow", "7"]]
    assert table.provenance["section"] == "Birds"
    herons = next(p for p in parsed.passages if "herons" in p.text)
    assert herons.provenance["section"] == "Birds" and "three" in herons.text
    (figure,) = parsed.figures  # the remote image is not fetched
    assert figure.caption == "Herons by the lake"
    assert (tmp_path / "figs" / Path(figure.image).name).read_bytes() == (tmp_path / "chart.png").read_bytes()


def test_html_never_reads_images_outside_its_folder(tmp_path):
    from PIL import Image

    Image.new("RGB", (10, 10)).save(tmp_path / "secret.png")
    page = tmp_path / "site" / "page.html"
    page.parent.mkdir()
    page.write_text('<html><body><p>Hello there.</p><img src="../secret.png" alt="x"></body></html>')
    assert parse_html(page, "page.html", tmp_path / "figs", "f").figures == []


def test_xlsx_sheets_become_tables(tmp_path):
    import openpyxl

    book = openpyxl.Workbook()
    book.active.title = "Budget"
    for row in (["item", "cost"], ["paint", 12.5], ["brushes", "=2*3"]):
        book.active.append(row)
    book.create_sheet("Empty")
    book.save(tmp_path / "b.xlsx")
    parsed = parse_xlsx(tmp_path / "b.xlsx", "b.xlsx", Limits())
    (table,) = parsed.tables  # the empty sheet gives nothing
    assert table.header == ["item", "cost"] and table.rows[0] == ["paint", "12.5"]
    assert table.provenance == {"file": "b.xlsx", "sheet": "Budget", "table": 1}
    with pytest.raises(Skip) as e:
        parse_xlsx(tmp_path / "b.xlsx", "b.xlsx", Limits(max_rows=1))
    assert e.value.reason == "over row limit"


@pytest.mark.parametrize(
    "name, content",
    [
        ("t.csv", '\ufeffcity,pop\n"Paris, FR",2100000\nLyon,500000\n'),  # a BOM and a quoted comma
        ("t.tsv", "city\tpop\nParis, FR\t2100000\nLyon\t500000\n"),
    ],
)
def test_delimited_files(tmp_path, name, content):
    (tmp_path / name).write_text(content, encoding="utf-8")
    (table,) = parse_delimited(tmp_path / name, name, Limits()).tables
    assert table.header == ["city", "pop"] and table.rows == [["Paris, FR", "2100000"], ["Lyon", "500000"]]


def test_delimited_file_that_is_not_utf8(tmp_path):
    (tmp_path / "t.csv").write_bytes(b"a,b\n\xff\xfe,1\n")
    with pytest.raises(Skip) as e:
        parse_delimited(tmp_path / "t.csv", "t.csv", Limits())
    assert e.value.reason == "unreadable"


def test_image_caption_from_sidecar_then_exif(tmp_path):
    from PIL import Image

    exif = Image.Exif()
    exif[270] = "A lighthouse at dusk"
    Image.new("RGB", (20, 20)).save(tmp_path / "a.jpg", exif=exif)
    Image.new("RGB", (20, 20)).save(tmp_path / "b.png")
    (tmp_path / "b.png.txt").write_text("Two boats in a harbour\n")
    Image.new("RGB", (20, 20)).save(tmp_path / "c.png")
    captions = [
        parse_image(tmp_path / n, n, tmp_path / "corpus").figures[0].caption for n in ("a.jpg", "b.png", "c.png")
    ]
    assert captions == ["A lighthouse at dusk", "Two boats in a harbour", "c"]  # EXIF, sidecar, file name
    fig = parse_image(tmp_path / "a.jpg", "a.jpg", tmp_path / "corpus").figures[0]
    assert (tmp_path / "corpus" / fig.image).resolve() == (tmp_path / "a.jpg").resolve()  # referenced in place


def test_broken_image_is_skipped(tmp_path):
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(Skip) as e:
        parse_image(tmp_path / "x.png", "x.png", tmp_path)
    assert e.value.reason == "malformed"


def test_video_finds_its_subtitles(tmp_path):
    (tmp_path / "subtitles").mkdir()
    (tmp_path / "talk.mp4").write_bytes(b"\x00" * 16)  # decoded by the clip/video KBs at index time, not here
    (tmp_path / "subtitles" / "talk.en.srt").write_text("1\n00:00:01,000 --> 00:00:02,000\nhello\n")
    (tmp_path / "talk.txt").write_text("A talk about boats.")
    (video,) = parse_video(tmp_path / "talk.mp4", "talk.mp4").videos
    assert Path(video.subtitles).name == "talk.en.srt" and video.description == "A talk about boats."


def test_pack_passages_merges_within_a_page_and_cuts_long_blocks():
    p1 = {"file": "f.pdf", "page": 1, "bbox": [10, 10, 20, 20]}
    blocks = [("one two", p1), ("three", {**p1, "bbox": [5, 30, 15, 40]}), ("four", {"file": "f.pdf", "page": 2})]
    blocks.append((" ".join(["w"] * 250), {"file": "f.pdf", "page": 3}))
    out = pack_passages(blocks)
    assert [p.text for p in out[:2]] == ["one two three", "four"]  # never across pages
    assert out[0].provenance["bbox"] == [5, 10, 20, 40]  # the union of the merged blocks
    sizes = [len(p.text.split()) for p in out[2:]]
    assert len(sizes) == 3 and sum(sizes) == 250 and max(sizes) - min(sizes) <= 2  # three near-equal passages
