"""`--parser docling`: the real shared DOCX and HTML converted by docling in its own env (`.venv-docling`, built by
`make docling`; .ci/run builds it), turned into kbrouter's units with provenance; the missing-env, no-weights-PDF
and time-limit errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ingest.cli import main
from ingest.docling_parser import parse_docling
from ingest.job import PARSED_DIR, Settings, file_key, run_ingest
from ingest.units import Limits, Parsed, Skip

FILES = ("docling_word_sample.docx", "fdic_failed_bank_list.html", "fbi_nics_background_checks_2015-11.pdf")


@pytest.fixture(scope="module")
def ingested(docs, tmp_path_factory) -> Path:
    """One `kbrouter ingest --parser docling` run over the real DOCX, HTML and a PDF; returns the corpus folder."""
    tmp = tmp_path_factory.mktemp("docling")
    src = tmp / "in"
    src.mkdir()
    for name in FILES:
        shutil.copyfile(docs / name, src / name)
    # a generous per-file limit: docling starts in a few seconds, but on a loaded 2-core machine it can take minutes
    rc = main([str(src), "--name", "t", "--corpus-dir", str(tmp / "c"), "--out", str(tmp / "t.yaml"), "--quiet",
               "--parser", "docling", "--max-seconds", "1500"])  # fmt: skip
    assert rc == 0
    return tmp / "c"


def _parsed(corpus: Path, name: str) -> Parsed:
    return Parsed.from_dict(json.loads((corpus / PARSED_DIR / f"{file_key(name)}.json").read_text()))


def test_docx_table_picture_sections_and_provenance(ingested):
    from PIL import Image

    parsed = _parsed(ingested, "docling_word_sample.docx")
    assert parsed.kind == "docx" and parsed.pages == 0
    assert parsed.title == "Swimming in the lake"  # docling's title item
    (table,) = parsed.tables
    assert table.header == ["", "Food", "Calories per portion"]
    grain = next(r for r in table.rows if r[0] == "Grain")
    assert grain[1:] == ["Corn, Buckwheat, Barley", "200"]  # docs-wordsample-q1
    assert table.provenance == {"file": "docling_word_sample.docx", "parser": "docling", "section": "Let’s eat",
                                "table": 1}  # fmt: skip
    (figure,) = parsed.figures
    assert figure.caption == "Figure 1: This is a cute duckling"  # the "Figure n" paragraph after the picture
    with Image.open(ingested / figure.image) as im:
        assert im.width > 50
    assert {"Let’s swim!", "Let’s eat"} <= {p.provenance.get("section") for p in parsed.passages}
    swim = next(p for p in parsed.passages if "try not to drown" in p.text)
    assert swim.provenance == {"file": "docling_word_sample.docx", "parser": "docling", "section": "Let’s swim!"}


def test_html_table_and_text_by_section(ingested):
    parsed = _parsed(ingested, "fdic_failed_bank_list.html")
    assert parsed.kind == "html"
    (table,) = parsed.tables
    assert table.header == ["Bank Name", "City", "ST", "CERT", "Acquiring Institution", "Closing Date", "Updated Date"]
    assert len(table.rows) == 505  # as the built-in reader counts them
    indymac = next(r for r in table.rows if r[0] == "IndyMac Bank")
    assert indymac[4] == "OneWest Bank, FSB"  # docs-fdic-q1
    text = " ".join(p.text for p in parsed.passages)
    assert "failed since October 1, 2000" in text  # docs-fdic-q5
    assert "OneWest" not in text and "Pasadena" not in text  # table cells are not repeated as passages
    assert not any("](" in c for r in table.rows for c in r)  # linked bank names as their text, not [name](url)
    where = next(p for p in parsed.passages if "failed since October 1, 2000" in p.text).provenance
    assert where["file"] == "fdic_failed_bank_list.html" and where["parser"] == "docling" and where.get("section")


def test_corpora_and_the_pdf_without_layout_weights(ingested, tmp_path):
    summary = json.loads((ingested / "summary.json").read_text())
    # the PDF goes to docling too, which needs layout weights that this env lacks: skipped, with the fix named
    assert summary["parsed"] == 2 and summary["skips_by_reason"] == {"docling needs layout weights": 1}
    message = summary["skipped_files"]["fbi_nics_background_checks_2015-11.pdf"]
    assert "artifacts_path" in message and "docling-tools models download" in message
    passages = [json.loads(ln) for ln in (ingested / "passages.jsonl").read_text().splitlines()]
    assert passages and all(p["provenance"]["parser"] == "docling" for p in passages)
    tables = [json.loads(ln) for ln in (ingested / "tables.jsonl").read_text().splitlines()]
    assert any(r == ["Grain", "Corn, Buckwheat, Barley", "200"] for t in tables for r in t["rows"])
    # another parser over the same folder is other settings: refused without --force, before any parse
    with pytest.raises(ValueError, match=r"parser: was 'docling', now 'builtin'"):
        run_ingest([tmp_path], ingested, Settings())


def test_missing_env_names_the_path_and_make_docling(docs, tmp_path, monkeypatch):
    missing = tmp_path / "no-env" / "bin" / "python"
    monkeypatch.setenv("KBROUTER_DOCLING_PYTHON", str(missing))
    with pytest.raises(FileNotFoundError, match=r"no-env/bin/python.*`make docling`"):
        run_ingest([docs / "docling_word_sample.docx"], tmp_path / "c", Settings(parser="docling"))
    assert not (tmp_path / "c").exists()  # failed before any work


def test_time_limit_ends_the_worker(docs, tmp_path):
    # docling's import alone takes longer than 0.05 s: the subprocess is killed and the file skipped, named
    with pytest.raises(Skip, match=r"--max-seconds 0.05") as e:
        parse_docling(
            docs / "fdic_failed_bank_list.html", "x.html", tmp_path / "f", "figures/x", Limits(max_seconds=0.05)
        )
    assert e.value.reason == "over time limit"


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match=r"--parser must be one of builtin, docling, got 'marker'"):
        Settings(parser="marker")
