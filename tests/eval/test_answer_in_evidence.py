"""scripts/answer_in_evidence.py: which renderings of a step's hits show a gold answer, on the demo's real table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.types import Step, Trajectory
from retrievers.table import linearize, read_table_file
from retrievers.types import Doc, Hit

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def _row(method: str, question: str, gold: list[str], hits: tuple[Hit, ...]) -> dict:
    traj = Trajectory(id="q", question=question, steps=[Step(index=0, sub_question=question, kb="table", hits=hits)])
    return {"method": method, "dataset": "wtq", "qid": "q", "error": "", "gold": gold, "trajectory": traj.to_dict()}


def test_a_deep_row_counts_under_tables_focus_and_not_under_the_head_cut(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/answer_in_evidence.py")
    table = Doc("200-11", linearize(read_table_file(DEMO / "tables" / "200-11.csv")), modality="table")
    hits = (Hit(table, 0.03, 0, "table"),)
    rows = [
        # the 15th row; the head cut shows the first, which spells him "Phillip"
        _row("agent", "who was nominated for best film at the bafta?", ["Philip D'Antoni"], hits),
        _row("agent", "how many awards did it win?", ["7"], hits),  # a bare number: left out, it is in any table
        _row("agent", "was it nominated?", ["yes"], hits),  # yes/no: left out
        _row("other", "who won best actor from the kansas city film critics circle?", ["Nobody Here"], hits),
    ]
    (tmp_path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = mod.count(tmp_path, "agent", chars=250)
    assert dict(counts["wtq"]) == {"steps": 1, "full text": 1, "head": 0, "tables": 1, "all": 1}
    assert dict(mod.count(tmp_path, "other", chars=250)["wtq"]) == {
        "steps": 1,
        "full text": 0,
        "head": 0,
        "tables": 0,
        "all": 0,
    }
    with pytest.raises(SystemExit, match="no search steps of 'none'"):
        mod.count(tmp_path, "none")
