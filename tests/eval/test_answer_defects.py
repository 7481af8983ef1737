"""scripts/answer_defects.py: answers that cite an evidence label, finals that copy the question, thinks cut mid-phrase."""

from __future__ import annotations

import json
from pathlib import Path


def _traj(question: str, answers: list[tuple[str, str]], final: tuple[str, str], kb: str = "wiki") -> dict:
    steps = [
        {"kb": kb, "sub_question": question, "answer": a, "answer_think": t, "hits": [{"kb": kb, "rank": 0}]}
        for a, t in answers
    ]
    steps.append({"kb": None, "sub_question": None, "hits": []})  # the stop plan: no answer to check
    return {"question": question, "steps": steps, "final_answer": final[0], "final_think": final[1]}


def test_each_defect_is_found_and_clean_answers_pass(load_script) -> None:
    mod = load_script("scripts/answer_defects.py")
    q = "What WB supernatural drama series was Jawbreaker star Rose McGowan best known for being in?"
    bad = _traj(q, [("Text-1 (Animorphs", "Text-0 (Victoria Hanley is an American")],
                (" Jawbreaker star Rose McGowan best known", "The sub-question's answer answers the question: Jaw"),
                kb="text")  # fmt: skip
    good = _traj(q, [("Charmed", "text-0 (Rose McGowan) gives the answer: Charmed")],
                 ("Charmed", "The sub-question's answer answers the question: Charmed"), kb="text")  # fmt: skip
    c_bad, c_good = mod.trajectory_defects(bad), mod.trajectory_defects(good)
    assert (c_bad["answers"], c_bad["label"], c_bad["open_think"], c_bad["question_copy"]) == (2, 1, 2, 1)
    assert (c_good["answers"], c_good["label"], c_good["open_think"], c_good["question_copy"]) == (2, 0, 0, 0)


def test_labels_count_only_for_kbs_the_trajectory_searched(load_script) -> None:
    mod = load_script("scripts/answer_defects.py")
    assert mod.names_evidence_line("video_clips-0", {"video_clips"})
    assert mod.names_evidence_line("Wiki-1 (The Big Bird Cage)", {"wiki"})
    assert not mod.names_evidence_line("Blink-182", {"wiki"})  # a band, not an evidence line
    assert not mod.names_evidence_line("text-2", {"wiki"})
    assert not mod.copies_question("Charmed", "Was it Charmed?")  # under four words: a short answer, not a copy
    assert not mod.think_is_open("The evidence answers it.", "yes")


def test_predictions_are_split_by_method_and_failed_rows_skipped(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/answer_defects.py")
    t = _traj("Who?", [("wiki-0", "wiki-0 (X) gives the answer: wiki-0")], ("X", "So X"))
    rows = [{"method": "a", "trajectory": t}, {"method": "b", "trajectory": t},
            {"method": "b", "trajectory": t, "error": "backend down"}]  # fmt: skip
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = mod.defects_by_method(mod.read_jsonl(path))
    assert table["a"] == table["b"] and table["a"]["label"] == 1 and table["a"]["answers"] == 2
    assert set(mod.defects_by_method(mod.read_jsonl(path), ["a"])) == {"a"}
