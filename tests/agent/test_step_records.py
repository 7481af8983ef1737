"""The KB identifier rule of agent/step_records.py: `kb_id` both ways, unknown and ambiguous KBs, and the records."""

from __future__ import annotations

import pytest

from agent.kbs import KnowledgeBase
from agent.step_records import StepRecord, kb_id, records_from_trajectory
from agent.types import Step, Trajectory
from retrievers.config import KBConfig
from tests.fakes import FakeRetriever

KBS = [
    KnowledgeBase("wiki", "Text Retriever", FakeRetriever("wiki", ["a passage"])),
    KnowledgeBase("wtq", "Table Retriever", FakeRetriever("wtq", ["a table"])),
]
MENU = [(kb.display_name, kb.description) for kb in KBS]


@pytest.mark.parametrize(
    "kb, to, expected",
    [
        ("wiki", "display_name", "Text Retriever"),  # a name (Step.kb) -> what <ret> holds
        ("Table Retriever", "name", "wtq"),  # a display name (<ret>, StepRecord.gold) -> the name hits carry
        ("table retriever", "name", "wtq"),  # display names match as the plan parser matches them: case ignored
        ("'Text Retriever'.", "display_name", "Text Retriever"),  # ... and quotes / a trailing dot
        ("Text Retriever", "display_name", "Text Retriever"),  # already on the asked side: as configured
        ("wtq", "name", "wtq"),  # likewise for a name
    ],
)  # fmt: skip
def test_kb_id_maps_both_ways(kb, to, expected):
    assert kb_id(kb, KBS, to) == expected


def test_kb_id_reads_kb_configs_as_well_as_loaded_kbs(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("")
    configs = [KBConfig(name="wiki", kind="text", corpus=corpus, display_name="Text Retriever"),
               KBConfig(name="coco", kind="image", corpus=corpus)]  # fmt: skip
    assert kb_id("wiki", configs, "display_name") == "Text Retriever"
    assert kb_id("coco", configs, "display_name") == "coco"  # display name defaults to the name


def test_names_are_matched_exactly():
    with pytest.raises(ValueError, match="KB 'WIKI' is neither"):
        kb_id("WIKI", KBS, "display_name")  # a name is an id in code, not something the policy wrote


def test_an_unknown_kb_is_named_with_where_it_came_from_and_the_valid_ids():
    with pytest.raises(ValueError) as e:
        kb_id("Text KB", KBS, "display_name", "steps.jsonl:3")
    assert str(e.value) == (
        "steps.jsonl:3: KB 'Text KB' is neither the name nor the display name of a configured KB (names "
        "['wiki', 'wtq'], display names ['Text Retriever', 'Table Retriever']); write one of them, or add the KB to "
        "the KB YAML"
    )
    with pytest.raises(ValueError, match="^KB '' is neither"):  # no `where`: the message starts with the KB
        kb_id("", KBS, "name")


def test_a_name_that_is_another_kbs_display_name_is_refused_as_ambiguous():
    crossed = [KnowledgeBase("text", "Tables", FakeRetriever("text", [])),
               KnowledgeBase("tables", "Text", FakeRetriever("tables", []))]  # fmt: skip
    with pytest.raises(ValueError, match=r"q1: KB 'tables' names two KBs \('tables' and 'text'\).*rename one"):
        kb_id("tables", crossed, "display_name", "q1")


def test_kb_id_refuses_an_unknown_side():
    with pytest.raises(ValueError, match=r"`to` is 'display'; use one of \('name', 'display_name'\)"):
        kb_id("wiki", KBS, "display")  # type: ignore[arg-type]


def _traj(kb: str) -> Trajectory:
    steps = (Step(0, think="t", sub_question="who?", kb=kb, answer="x"), Step(1, think="enough"))
    return Trajectory("t1", "Q?", steps=steps, final_answer="x", gold=("x",))


def test_records_from_trajectory_maps_each_steps_kb_name_to_its_display_name():
    records = records_from_trajectory(_traj("wtq"), MENU, ids=KBS)
    assert [r.gold["kb"] for r in records if r.step_type == "plan"] == ["Table Retriever", None]
    assert records[0].kb_names == ("Text Retriever", "Table Retriever")
    with pytest.raises(ValueError, match=r"trajectory 't1' step 0: KB 'coco' is neither"):
        records_from_trajectory(_traj("coco"), MENU, ids=KBS)


def test_a_plan_record_naming_its_gold_kb_by_name_is_refused():
    """A KB name where the display name belongs would score every route reward 0; the record says so at once."""
    with pytest.raises(
        ValueError, match=r"gold kb 'wtq' is not among kb_names \['Text Retriever', 'Table Retriever'\]"
    ):
        records_from_trajectory(_traj("wtq"), MENU)  # without `ids` the steps must already carry display names
    row = records_from_trajectory(_traj("wtq"), MENU, ids=KBS)[0].to_dict()
    assert StepRecord.from_dict(row).gold["kb"] == "Table Retriever"  # the on-disk form round-trips
    with pytest.raises(ValueError, match="step 0 of trajectory 't1': gold kb 'wtq'"):
        StepRecord.from_dict({**row, "gold": {**row["gold"], "kb": "wtq"}})
    lower = StepRecord.from_dict({**row, "gold": {**row["gold"], "kb": "table retriever"}})
    assert lower.gold["kb"] == "table retriever"  # kept as written; the reward compares it case-insensitively
