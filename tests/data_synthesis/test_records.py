"""Synthesis' KB identifiers: gold plans and trajectories carry KB names, step records display names (`kb_id`)."""

from __future__ import annotations

import pytest

from agent.kbs import KnowledgeBase
from agent.types import Question, Step, Trajectory
from data_synthesis.annotation import AnnotationTeacher
from data_synthesis.gold_plans import GoldPlan, GoldStep
from data_synthesis.records import step_records
from tests.fakes import FakeRetriever

WIKI = FakeRetriever("wiki", ["Frank Wisbar directed Strangler of the Swamp.", "Wisbar was born in 1899."])
WTQ = FakeRetriever("wtq", ["year film director 1946 Strangler of the Swamp Frank Wisbar"])
KBS = {"Text Retriever": KnowledgeBase("wiki", "Text Retriever", WIKI, k=2),
       "Table Retriever": KnowledgeBase("wtq", "Table Retriever", WTQ, k=2)}  # fmt: skip
MENU = [(kb.display_name, kb.description) for kb in KBS.values()]
Q = Question("q1", "When was the director of Strangler of the Swamp born?", answers=("1899",))


def _plan(*kbs: str) -> GoldPlan:
    steps = tuple(GoldStep(f"sub-question {i} on Wisbar?", kb, f"a{i}") for i, kb in enumerate(kbs))
    return GoldPlan("test", steps, "1899")


def test_step_records_map_the_trajectorys_kb_names_to_display_names():
    steps = (Step(0, sub_question="Who directed it?", kb="wtq", answer="Wisbar"),
             Step(1, sub_question="When was Wisbar born?", kb="wiki", answer="1899"), Step(2))  # fmt: skip
    traj = Trajectory("q1#0", Q.question, steps=steps, final_answer="1899", gold=("1899",))
    plans = [r for r in step_records(traj, MENU, KBS.values()) if r["step_type"] == "plan"]
    assert [r["gold"]["kb"] for r in plans] == ["Table Retriever", "Text Retriever", None]
    assert all(r["kb_names"] == ["Text Retriever", "Table Retriever"] for r in plans)


def test_step_records_refuse_a_kb_that_is_not_loaded():
    """Before `kb_id`, an unknown KB went into `gold.kb` as written (a route reward of 0 for every completion)."""
    traj = Trajectory("q1#0", Q.question, steps=(Step(0, sub_question="x?", kb="coco", answer="y"),),
                      final_answer="y", gold=("y",))  # fmt: skip
    with pytest.raises(ValueError, match=r"trajectory 'q1#0' step 0: KB 'coco' is neither the name nor the display "
                                         r"name of a configured KB \(names \['wiki', 'wtq'\]"):  # fmt: skip
        step_records(traj, MENU, KBS.values())


def test_annotation_trajectories_carry_names_and_their_step_records_display_names():
    """A gold plan may name a KB either way; the trajectory (as the loop's) holds names, the records display names."""
    teacher = AnnotationTeacher(KBS, {"q1": _plan("wiki", "table retriever")}, top_k=1, max_steps=3)
    (traj,) = teacher.run_batch([Q])
    assert [s.kb for s in traj.steps] == ["wiki", "wtq", None]  # stop plan last
    assert [h.kb for s in traj.steps for h in s.hits] == ["wiki", "wtq"]  # each hop searched its own KB
    assert len(WIKI.batches[-1]) == len(WTQ.batches[-1]) == 1
    plans = [r for r in step_records(traj, MENU, KBS.values()) if r["step_type"] == "plan"]
    assert [r["gold"]["kb"] for r in plans] == ["Text Retriever", "Table Retriever", None]


def test_annotation_refuses_a_gold_plan_naming_a_kb_that_is_not_loaded():
    teacher = AnnotationTeacher(KBS, {"q1": _plan("wiki", "coco")}, top_k=1, max_steps=3)
    with pytest.raises(ValueError, match=r"question q1: its gold plan: KB 'coco' is neither"):
        teacher.run_batch([Q])  # before any search (the old check came after it, behind a KeyError)
