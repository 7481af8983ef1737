"""scripts/yesno_signal.py: the yes-vs-no margin read at `<answer>`, its AUC against the gold, and which rows count."""

from __future__ import annotations

import json


def _row(qid: str, gold: str, think: str, said: str, answer_type: str = "yesno", searched: bool = True) -> dict:
    hit = {
        "doc": {"id": "wiki-1", "text": "Salvia has about 1,000 species; Arachis has 68.", "title": "Salvia",
                "kb": "wiki", "modality": "text", "media": None, "metadata": {}},
        "kb": "wiki", "rank": 0, "score": 1.0,
    }  # fmt: skip
    plan = "<think>I need this.</think>\n<sub-question>Does Salvia have more species?</sub-question>\n<ret>Text</ret>"
    step = {
        "kb": "wiki" if searched else None,
        "sub_question": "Does Salvia have more species than Arachis?",
        "hits": [hit] if searched else [],
        "raw": [plan, f"<think>{think}</think>\n<answer>{said}</answer>"],
    }
    traj = {
        "gold": [gold], "final_answer": said, "steps": [step],
        "metadata": {"answer_type": answer_type, "render": {"few_shot": False, "evidence_chars": 250}},
    }  # fmt: skip
    return {"dataset": "hotpotqa", "method": "agent", "qid": qid, "trajectory": traj}


def test_auc_and_the_median_split(load_script) -> None:
    mod = load_script("scripts/yesno_signal.py")
    golds = ["yes", "yes", "no", "no"]
    assert mod.auc([2.0, 1.0, -1.0, -2.0], golds) == 1.0  # the margin orders every yes above every no
    assert mod.auc([-2.0, -1.0, 1.0, 2.0], golds) == 0.0
    assert mod.auc([0.0, 0.0, 0.0, 0.0], golds) == 0.5  # a constant carries nothing
    assert mod.auc([1.0, 2.0], ["no", "no"]) is None  # one class only
    assert mod.median_split_accuracy([2.0, 1.0, -1.0, -2.0], golds) == 1.0
    assert mod.median_split_accuracy([-2.0, -1.0, 1.0, 2.0], golds) == 0.0


def test_answer_prefix_keeps_the_think_and_stops_at_the_open_tag(load_script) -> None:
    mod = load_script("scripts/yesno_signal.py")
    assert mod.answer_prefix("<think>a: yes</think>\n<Answer >yes</answer>") == "<think>a: yes</think>\n<Answer >"
    assert mod.answer_prefix("<think>cut mid-phrase") is None


def test_rows_without_a_searched_yesno_answer_are_left_out(load_script) -> None:
    mod = load_script("scripts/yesno_signal.py")
    rows = [
        _row("q1", "yes", "It says yes.", "yes"),
        _row("q2", "Salvia", "It says Salvia.", "Salvia", answer_type="open"),  # open question
        _row("q3", "no", "x", "no", searched=False),  # no search, no answer step to read
        {**_row("q4", "no", "x", "no"), "method": "other"},  # another method
    ]
    assert [item["row"]["qid"] for item in mod.yesno_rows(rows, "agent")] == ["q1"]


def test_margin_follows_the_answer_the_think_announces(load_script, tmp_path, capsys) -> None:
    """Read at `<answer>` (not before the think), the shipped router's margin follows the word its think names."""
    mod = load_script("scripts/yesno_signal.py")
    rows = [
        _row("q1", "yes", "wiki-0 (Salvia) gives the answer: yes", "yes"),
        _row("q2", "no", "wiki-0 (Salvia) gives the answer: no", "no"),
    ]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mod.main([str(path), "--method", "agent"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("all"))
    assert line.split()[2] == "1.000"  # AUC: the yes-think row has the larger margin
