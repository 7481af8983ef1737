"""`answers_shown`: a reader stage keeps only the answer steps whose rendered evidence still shows a gold answer."""

import json

from agent.metrics import shows_answer
from agent.protocol import PromptSettings, answer_evidence, answer_messages, plan_messages
from agent.step_records import StepRecord
from retrievers.types import Doc, Hit
from training.config import StepDataArgs
from training.trainers import load_records

SHORT = PromptSettings(few_shot=False, evidence_chars=60, evidence_focus="head")
KING = "Stephen King directed Maximum Overdrive (1986)."  # 48 characters: shown whole


def _answer(i: int, text: str, golds: list[str], question: str = "Who directed Maximum Overdrive?") -> StepRecord:
    hits = [Hit(Doc(f"d{i}", text, title="Maximum Overdrive"), 0.5, 0, "wiki")]
    return StepRecord(f"t{i}", "answer", answer_messages(question, hits, settings=SHORT), {"answers": golds})


def test_shows_answer_matches_whole_normalised_words_only():
    assert shows_answer("Directed by Stephen King.", ["stephen king"])
    assert shows_answer("The Beatles, 1964", ["Beatles"])  # articles and punctuation normalised away
    assert not shows_answer("Kingston upon Thames", ["King"])  # a word part is not the answer
    assert not shows_answer("anything", [""])


def test_answer_evidence_is_the_evidence_block_without_the_question():
    msgs = answer_messages("Who is Rose?", [Hit(Doc("d", "Rose McGowan is an actress."), 0.5, 0, "wiki")])
    evidence = answer_evidence(msgs)
    assert "Rose McGowan is an actress." in evidence and "Who is Rose?" not in evidence
    plan = plan_messages("Who is Rose?", [], [("Text Retriever", "passages")])
    assert answer_evidence(plan) == ""  # not an answer prompt: no evidence


def test_load_records_drops_answer_steps_whose_cut_evidence_hides_the_gold(tmp_path):
    cut = _answer(
        0, "Maximum Overdrive is a 1986 American science fiction horror comedy film. " + KING, ["Stephen King"]
    )
    shown = _answer(1, KING, ["Stephen King"])
    in_question_only = _answer(2, "A 1986 film shot in Leland.", ["Stephen King"], "Did Stephen King direct it?")
    yes_no = _answer(3, "A 1986 film shot in Leland.", ["yes"], "Was it shot in 1986?")
    plan = StepRecord("t4", "plan", plan_messages("Who?", [], [("Text Retriever", "p")]),
                      {"sub_question": "Who?", "kb": "Text Retriever"}, kb_names=("Text Retriever",))  # fmt: skip
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in (cut, shown, in_question_only, yes_no, plan)))
    assert "Stephen King" not in answer_evidence(cut.messages)  # 60 characters a hit cut it off
    kept = load_records(StepDataArgs(train_file=str(path), answers_shown=True), str(path))
    assert [r.trajectory_id for r in kept] == ["t1", "t3", "t4"]
    assert len(load_records(StepDataArgs(train_file=str(path)), str(path))) == 5  # off by default
