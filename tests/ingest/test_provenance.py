"""Provenance labels, and where they show: evidence lines (byte-identical for records without provenance, which is
what the trained router sees for the existing KBs), the terminal display, hit cards and the stream's evidence line."""

from __future__ import annotations

import pytest

from agent.chat import evidence_line, hit_card
from agent.display import StepPrinter
from agent.protocol.prompts import render_hits
from retrievers.provenance import provenance_label
from retrievers.types import Doc, Hit, Media


@pytest.mark.parametrize(
    "prov, label",
    [
        ({"file": "report.pdf", "page": 4, "table": 2}, "report.pdf p. 4, table 2"),
        ({"file": "report.pdf", "page": 4, "bbox": [1, 2, 3, 4]}, "report.pdf p. 4"),  # the bbox stays in metadata
        ({"file": "a.pdf", "page": 1, "table": 1, "rows": [26, 50]}, "a.pdf p. 1, table 1, rows 26–50"),
        ({"file": "a.docx", "section": "Let’s eat", "figure": 1}, 'a.docx, section "Let’s eat", figure 1'),
        ({"file": "b.xlsx", "sheet": "Budget", "table": 1}, "b.xlsx, sheet Budget, table 1"),
        ({"file": "talk.mp4", "start": 12, "end": 30.25}, "talk.mp4, 12.0s–30.2s"),
        ({"file": "x.html", "section": "s" * 80}, 'x.html, section "' + "s" * 59 + '…"'),  # long sections are cut
        ({"page": 3}, ""),  # no file: no label
        ("report.pdf", ""),  # not a mapping
    ],
)
def test_provenance_label(prov, label):
    assert provenance_label({"provenance": prov}) == label


def _hit(doc: Doc, kb: str, rank: int = 0) -> Hit:
    return Hit(doc=doc, score=0.5, rank=rank, kb=kb)


OLD_HITS = [  # records as the existing KBs hold them: metadata without provenance
    _hit(Doc("d1", "It is the capital of France.", title="Paris", metadata={"doc_id": "d1", "chunk": 0}), "text"),
    _hit(Doc("t1", "Title: Cities\n| city | pop |\n| Paris | 2.1M |", title="Cities", modality="table"), "table", 1),
    _hit(Doc("v#001", "hello there", title="cartoon", modality="video", media=Media("v.mp4", 1.0, 4.5)), "clip", 2),
]


def test_evidence_lines_without_provenance_are_unchanged():
    expected = (
        "text-0: Paris: It is the capital of France.\n"
        "table-1: Title: Cities\n    | city | pop |\n    | Paris | 2.1M |\n"
        "clip-2: cartoon: hello there [1.0s–4.5s]"
    )
    assert render_hits(OLD_HITS) == expected
    assert render_hits(OLD_HITS, max_chars=10).splitlines()[0] == "text-0: Paris: It is the …"


def test_evidence_lines_with_provenance_end_with_the_source():
    prov = {"provenance": {"file": "report.pdf", "page": 4, "table": 2}, "source_id": "report.pdf#p4"}
    table = Doc("report.pdf#t2", "| year | cost |\n| 2020 | $3,400 |", title="Report", modality="table", metadata=prov)
    text = Doc("report.pdf#p4#0", "Costs rose.", title="Report", metadata={"provenance": {"file": "r.pdf", "page": 4}})
    lines = render_hits([_hit(table, "table"), _hit(text, "text", 1)])
    assert lines == (
        "table-0: | year | cost |\n    | 2020 | $3,400 | [source: report.pdf p. 4, table 2]\n"
        "text-1: Report: Costs rose. [source: r.pdf p. 4]"
    )


def test_display_cards_and_stream_show_the_source():
    from rich.console import Console

    doc = Doc("r#p4#0", "Costs rose sharply in 2020. " * 20, title="Report",
              metadata={"provenance": {"file": "report.pdf", "page": 4}})  # fmt: skip
    console = Console(record=True, width=200)
    StepPrinter(console)("q", "evidence", {"hits": [_hit(doc, "text"), OLD_HITS[0]]})
    shown = console.export_text().splitlines()
    assert "[report.pdf p. 4]" in shown[0]  # before the text, so the 140-character cut never hides it
    assert "[" not in shown[1].split(":")[0]  # a record without provenance shows as before
    card = hit_card(_hit(doc, "text"), None)
    assert card["source"] == "report.pdf p. 4"
    assert "source" not in hit_card(OLD_HITS[0], None)
    assert "best 'Report [report.pdf p. 4]'" in evidence_line("Text Retriever", [card])
