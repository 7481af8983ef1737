"""scripts/vote_rules.py: the final answer's candidates are found where the loop records them, and each rule picks
as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _traj(answers: list[str | None], kept: int, reused: bool) -> dict:
    votes = {"answers": answers, "agreement": [0.0] * len(answers), "kept": kept}
    step = {"index": 0, "votes": votes} if reused else {"index": 0}
    meta = {"group": "text", "final_from_step": 0} if reused else {"group": "text", "final_votes": votes}
    return {"steps": [step], "metadata": meta}


@pytest.mark.parametrize("reused", [True, False])
def test_candidates_come_from_the_step_the_final_answer_came_from(load_script, reused: bool) -> None:
    mod = load_script("scripts/vote_rules.py")
    assert mod.candidates(_traj(["a", "b"], 1, reused)) == (["a", "b"], 1)
    assert mod.candidates({"steps": [{"index": 0}], "metadata": {}}) is None  # an agent without a vote


def test_each_rule_picks_as_documented(load_script) -> None:
    mod = load_script("scripts/vote_rules.py")
    answers = ["Jawbreaker", None, "the Charmed series", "Charmed", "charmed"]
    golds = ["Charmed"]
    assert mod.pick("first", answers, 2, golds) == "Jawbreaker"
    assert mod.pick("f1", answers, 2, golds) == "the Charmed series"  # what the agent kept
    assert mod.pick("exact", answers, 2, golds) == "Charmed"  # "charmed" twice once normalised; the earlier wins
    assert mod.pick("oracle", answers, 2, golds) == "the Charmed series"  # F1-recall 1, the earliest of those
    assert mod.pick("exact", [None, None], 0, golds) == "" and mod.pick("first", [None], 0, golds) == ""


def test_it_prints_every_rule_and_refuses_a_run_without_votes(
    tmp_path: Path, load_script, capsys, monkeypatch
) -> None:
    mod = load_script("scripts/vote_rules.py")
    rows = [
        {
            "method": "v",
            "dataset": "hotpotqa",
            "gold": ["Charmed"],
            "trajectory": _traj(["Scream", "Charmed", "Charmed"], 1, True),
        },
        {"method": "other", "dataset": "hotpotqa", "gold": ["x"], "trajectory": _traj(["x"], 0, True)},
    ]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr("sys.argv", ["vote_rules.py", str(tmp_path), "v"])
    mod.main()
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert lines["first"][-2:] == ["0.0", "0.0"] and lines["f1"][-2:] == ["100.0", "100.0"]
    assert lines["exact"][-2:] == ["100.0", "100.0"] and "1 voted questions, 0 without a vote" in out
    monkeypatch.setattr("sys.argv", ["vote_rules.py", str(tmp_path), "other_method"])
    with pytest.raises(SystemExit, match="no voted predictions of 'other_method'"):
        mod.main()
