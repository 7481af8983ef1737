"""Query-focused evidence (`agent.protocol.evidence`): on the demo's real table and passage, within the same budget,
the answer step sees the row or sentence the sub-question asks about, which the head cut drops."""

import json
from itertools import pairwise
from pathlib import Path

import pytest

from agent.loop import AgentConfig
from agent.protocol import PromptSettings, answer_messages, render_hits
from agent.protocol.evidence import GAP, focus, split_units
from retrievers.table import linearize, read_table_file
from retrievers.types import Doc, Hit

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
FRENCH_CONNECTION = linearize(read_table_file(DEMO / "tables" / "200-11.csv"))  # WTQ: the film's awards, 2,052 chars
KC_Q = "who won best actor from the kansas city film critics circle?"  # the 23rd of 29 rows
KODACHROME = linearize(read_table_file(DEMO / "tables" / "200-24.csv"))  # 32 rows: 30 shown, then a trailer line


def _passage(doc_id: str) -> dict:
    return next(r for r in map(json.loads, (DEMO / "passages.jsonl").open()) if r["id"] == doc_id)


def _table_hit(text: str) -> Hit:
    return Hit(Doc("200-11", text, title="The French Connection (film)", modality="table"), 0.03, 0, "table")


def test_a_table_shows_its_header_and_the_row_the_sub_question_names():
    head_cut = render_hits([_table_hit(FRENCH_CONNECTION)], 250)
    focused = render_hits([_table_hit(FRENCH_CONNECTION)], 250, KC_Q)
    assert "Kansas City" not in head_cut
    assert "| Kansas City Film Critics Circle, 1972 | Best Actor | Gene Hackman | Won |" in focused
    assert focused.splitlines()[0] == "table-0: | Award | Category | Nominee | Result |"
    assert focused.splitlines()[-1].strip() == GAP  # later rows were left out, and it says so


def test_a_passage_shows_the_sentence_the_sub_question_is_about():
    row = _passage("wiki-377c86fc034b")  # Kansas City Scout, 1,713 chars
    doc = Doc(row["id"], row["text"], title=row["title"])
    query = "How much did the Federal Highway Administration contribute to the Kansas City Scout?"
    focused = render_hits([Hit(doc, 1.0, 0, "text")], 250, query)
    assert "Federal Highway Administration (FHWA) contributed 80-90 percent" in focused
    assert "Federal Highway" not in render_hits([Hit(doc, 1.0, 0, "text")], 250)


@pytest.mark.parametrize("max_chars", [120, 250, 400, 900])
@pytest.mark.parametrize("query", [KC_Q, "what did Gene Hackman win?", "zzz nothing matches"])
def test_focus_keeps_the_budget_and_the_units_order(max_chars, query):
    head, units = split_units(FRENCH_CONNECTION, table=True)
    out = focus(FRENCH_CONNECTION, query, max_chars, table=True).splitlines()
    assert out[: len(head)] == head
    kept = [line for line in out[len(head) :] if line != GAP]
    assert kept, "at least one row is shown"
    positions = [units.index(line) for line in kept]
    assert positions == sorted(positions)  # original order, so a table still reads top to bottom
    assert sum(len(line) + 1 for line in out if line != GAP) <= max_chars


@pytest.mark.parametrize(
    "query, max_chars, last_row",
    [
        # the row asked about, the rows after it left out, then the trailer (the reported `1956–1962 | … …`)
        ("when did Kodachrome Professional film 35 mm Type A stop?", 120, "35 mm, Type A (ASA 16) | 1956–1962 |"),
        # a larger budget: two rows kept, the rows between the second and the trailer left out
        (
            "when did Kodachrome Professional film 35 mm Type A stop?",
            200,
            "Professional, 35 mm, Type A (ASA 40) | 1962–1978 |",
        ),
        # another query: a row near the top kept, the 28 rows after it left out
        ("which Kodachrome film came in 35 mm Type A?", 120, "35 mm and 828, daylight & Type A | 1936–1962 |"),
    ],
)
def test_rows_left_out_before_the_trailer_show_one_gap_marker(query, max_chars, last_row):
    out = focus(KODACHROME, query, max_chars, table=True).splitlines()
    assert out[-1] == KODACHROME.splitlines()[-1] == "… (2 more rows; 32 in all)"
    assert out[-2].endswith(last_row)  # the trailer's own `…` marks the rows left out after the last kept one
    assert not [(a, b) for a, b in pairwise(out) if a.startswith(GAP) and b.startswith(GAP)]
    assert sum(len(line) + 1 for line in out if line != GAP) <= max_chars


def test_a_query_that_names_nothing_shows_the_head_as_before():
    focused = focus(FRENCH_CONNECTION, "zzz", 250, table=True)
    assert focused.split(GAP)[0].strip() == FRENCH_CONNECTION[: len(focused.split(GAP)[0].strip())]


def test_short_hits_and_unfocused_prompts_are_unchanged():
    short = Doc("d", "Jaws is a 1975 film directed by Steven Spielberg.", title="Jaws")
    assert render_hits([Hit(short, 1.0, 0, "text")], 250, "who directed Jaws?") == render_hits(
        [Hit(short, 1.0, 0, "text")]
    )
    hits = [_table_hit(FRENCH_CONNECTION)]
    plain = answer_messages(KC_Q, hits, settings=PromptSettings(evidence_chars=250))
    focused = answer_messages(KC_Q, hits, settings=PromptSettings(evidence_chars=250, evidence_focus="tables"))
    assert "Kansas City" in focused[-1]["content"] and "Kansas City" not in plain[-1]["content"]


def test_tables_mode_focuses_tables_only():
    row = _passage("wiki-377c86fc034b")
    passage = Hit(Doc(row["id"], row["text"], title=row["title"]), 1.0, 1, "text")
    hits = [_table_hit(FRENCH_CONNECTION), passage]
    query = "Kansas City Film Critics Circle and the Federal Highway Administration"
    tables = render_hits(hits, 250, query, "tables").split("\ntext-1: ")
    everything = render_hits(hits, 250, query, "all").split("\ntext-1: ")
    assert "Kansas City Film Critics Circle" in tables[0] and tables[0] == everything[0]
    assert tables[1] == render_hits([passage], 250).removeprefix("text-0: ")  # the passage keeps its head
    assert "Federal Highway Administration" in everything[1]


def test_a_head_longer_than_the_budget_falls_back_to_the_head_cut():
    text = "Title: " + "x" * 300 + "\n| a | b |\n| 1 | 2 |"
    assert focus(text, "a", 100, table=True) == text[:100] + " " + GAP


def test_the_setting_is_recorded_and_old_records_read_as_unfocused():
    assert AgentConfig(evidence_focus="tables").prompt_settings.to_dict()["evidence_focus"] == "tables"
    assert PromptSettings.from_dict({"few_shot": False, "evidence_chars": 1200}).evidence_focus == "head"


@pytest.mark.parametrize("bad", ["on", True, "table"])
def test_an_unknown_mode_is_refused_naming_the_key_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"agent\.evidence_focus.*'head', 'tables', 'all'"):
        AgentConfig(evidence_focus=bad)


@pytest.mark.parametrize("mode", ["head", "tables"])
def test_the_step_printer_shows_the_rows_the_answer_step_reads(mode):
    from rich.console import Console

    from agent.display import StepPrinter

    console = Console(record=True, width=400)
    event = {"hits": [_table_hit(FRENCH_CONNECTION)], "sub_question": KC_Q, "focus": mode, "chars": 250}
    StepPrinter(console)("q", "evidence", event)
    shown = console.export_text()
    assert shown.startswith(
        "    table-0 (0.030): The French Connection (film): | Award | Category | Nominee | Result |"
    )
    assert ("| Kansas City Film Critics Circle, 1972 | Best Actor | Gene Hackman | Won |" in shown) == (
        mode == "tables"
    )
