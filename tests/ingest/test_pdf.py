"""PDF parsing on the real shared documents: tables with header and cells, figures with captions, page numbers,
and the files that must be skipped with a named reason (encrypted, scanned, malformed, over a limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingest.pdf import parse_pdf
from ingest.units import Limits, Skip

NICS = "fbi_nics_background_checks_2015-11.pdf"
MMWR = "cdc_mmwr_2011_health_inequality_excerpt.pdf"
AMT = "faa_amt_handbook_p7-45.pdf"
FEDREG = "federal_register_2020-17221_faa_737max_nprm.pdf"


def _row(table, first_cell: str) -> list[str]:
    return next(r for r in table.rows if r[0] == first_cell)


def test_ruled_table_has_its_header_and_known_cells(parse_doc):
    parsed, _ = parse_doc(NICS)
    assert len(parsed.tables) == 1
    table = parsed.tables[0]
    # the two-level header: cells spanning several columns are cut into one name per column, group label first
    assert table.header[:4] == ["State / Territory", "Permit", "Handgun", "Long Gun"]
    assert table.header[7:10] == ["Pre-Pawn Handgun", "Pre-Pawn Long Gun", "Pre-Pawn *Other"]
    assert table.header[-1] == "Totals"
    assert "NICS Firearm Background Checks" in table.caption  # the title row spanning the table became its caption
    # one ruled row holds five states as multi-line cells: they come back as five rows, cells aligned
    assert _row(table, "Kentucky")[1] == "264,140"  # qa docs-nics-q1: Kentucky's permit checks
    assert _row(table, "California")[-1] == "180116"  # docs-nics-q4: printed without a thousands separator
    texas = _row(table, "Texas")
    assert (texas[table.header.index("Permit")], texas[table.header.index("Handgun")]) == ("21,550", "56,941")
    assert _row(table, "Totals")[-1] == "2,236,457"
    assert len(table.rows) >= 55  # 55 states and territories, plus the totals row
    assert table.provenance["page"] == 1 and table.provenance["table"] == 1
    assert all(len(r) == len(table.header) for r in table.rows)


def test_table_notes_inside_its_rules_stay_text(parse_doc):
    parsed, _ = parse_doc(NICS)
    text = " ".join(p.text for p in parsed.passages)
    assert "Refers to frames, receivers and other firearms" in text  # docs-nics-q5 is a text question
    assert "264,140" not in text  # table cells are not repeated as passages


def test_unruled_table_under_a_table_caption(parse_doc):
    parsed, _ = parse_doc(MMWR)
    (table,) = parsed.tables
    assert table.caption.startswith("TABLE. Inequality in income")
    assert table.provenance["page"] == 2
    assert table.header[0] == "Inequality measure" and table.header[1:3] == ["1997", "1998"]
    income = _row(table, "Median household income")
    assert income[table.header.index("1997")] == "$49,497"  # docs-mmwrineq-q3
    assert income[table.header.index("2007")] == "$52,163"
    # a label printed on two lines around its numbers is one cell
    assert any(r[0] == "Between-state income inequality (Gini index)" for r in table.rows)


def test_raster_figures_get_their_captions(parse_doc):
    from PIL import Image

    parsed, out = parse_doc(AMT)
    captions = [f.caption for f in parsed.figures]
    assert captions == ["Figure 7-26. Self-locking nuts.", "Figure 7-27. Stainless steel self-locking nut."]
    left, right = parsed.figures
    assert left.provenance["page"] == right.provenance["page"] == 1
    assert left.provenance["bbox"][2] < right.provenance["bbox"][2]  # 7-26 is the left column's figure
    for fig in parsed.figures:
        with Image.open(out / Path(AMT).stem / Path(fig.image).name) as im:
            assert im.width > 200 and im.height > 150  # a rendered region, not an icon


def test_vector_charts_get_their_captions_and_pages(parse_doc):
    parsed, _ = parse_doc(MMWR)
    by_page = [(f.provenance["page"], f.caption.split(".")[0]) for f in parsed.figures]
    assert by_page == [(2, "FIGURE 1"), (3, "FIGURE 2"), (3, "FIGURE 3")]
    assert "Median household income" in parsed.figures[0].caption


@pytest.mark.parametrize(
    "name, phrase, page",
    [
        # (document, words of a qa.jsonl evidence quote, its page): text lands on the page it is printed on
        (FEDREG, "must receive comments on this proposed AD by September 21, 2020", 1),
        (FEDREG, "resulting in 189 fatalities", 2),
        (FEDREG, "this proposed AD affects 73 airplanes", 5),
        (AMT, "the bellows type is made of aluminum alloy only", 1),
        (MMWR, "Gini index of 0.46 in 2007", 1),
    ],
)
def test_passages_carry_their_page(parse_doc, name, phrase, page):
    parsed, _ = parse_doc(name)
    found = [p for p in parsed.passages if phrase.lower() in p.text.lower()]
    assert found, f"{phrase!r} not in any passage of {name}"
    assert page in {p.provenance["page"] for p in found}  # (the first is repeated on the last page)
    assert all(len(p.text.split()) <= 100 for p in parsed.passages)
    x0, top, x1, bottom = found[0].provenance["bbox"]
    assert 0 <= x0 < x1 and 0 <= top < bottom  # a real box on the page


def test_every_qa_page_exists_in_its_pdf(docs, parse_doc):
    """The qa file's page numbers count physical pages from 1, as provenance does."""
    for line in (docs / "qa.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["file"] in (NICS, MMWR, AMT, FEDREG):
            parsed, _ = parse_doc(row["file"])
            assert 1 <= row["page"] <= parsed.pages


def _parse(path: Path, tmp_path: Path, **kw):
    return parse_pdf(path, path.name, tmp_path / "figs", "figures/x", kw.pop("limits", Limits()), **kw)


def test_encrypted_pdf_is_skipped_unless_the_password_is_given(docs, tmp_path):
    path = docs / "encrypted_pandas_text_analysis_graph.pdf"
    with pytest.raises(Skip) as e:
        _parse(path, tmp_path)
    assert e.value.reason == "encrypted" and "--password" in str(e.value)
    with pytest.raises(Skip) as e:
        _parse(path, tmp_path, password="wrong")
    assert e.value.reason == "encrypted" and "wrong" in str(e.value)
    with pytest.raises(Skip) as e:  # AES-256 opens with the right password; the page is one raster chart
        _parse(path, tmp_path, password="user")
    assert e.value.reason == "no text layer"


def test_scan_without_text_layer_is_skipped_with_the_fix(docs, tmp_path):
    with pytest.raises(Skip) as e:
        _parse(docs / "wikipedia_ocr_article_scan.pdf", tmp_path)
    assert e.value.reason == "no text layer" and "ocrmypdf" in str(e.value)
    assert not (tmp_path / "figs").exists()  # no partial output


@pytest.mark.parametrize(
    "make",
    [
        lambda real: real[: len(real) // 3],  # truncated mid-file
        lambda real: b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage",  # a header and nothing else
        lambda real: b"just some text, not a PDF at all",
    ],
)
def test_malformed_pdf_is_skipped(docs, tmp_path, make):
    path = tmp_path / "broken.pdf"
    path.write_bytes(make((docs / NICS).read_bytes()))
    with pytest.raises(Skip) as e:
        _parse(path, tmp_path)
    assert e.value.reason == "malformed"


def test_page_limit(docs, tmp_path):
    with pytest.raises(Skip) as e:
        _parse(docs / FEDREG, tmp_path, limits=Limits(max_pages=10))
    assert e.value.reason == "over page limit" and "15 pages" in str(e.value)
