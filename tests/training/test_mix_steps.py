"""scripts/mix_steps.py: two sources of the same datasets, capped apart by a recipe's `max_per_dataset`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _records(path: Path, dataset: str, n: int) -> Path:
    rows = [
        {"trajectory_id": f"{dataset}-{i}#0", "step_type": "plan", "metadata": {"dataset": dataset}} for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_prefix_renames_only_its_sources_datasets(tmp_path, load_script):
    mod = load_script("scripts/mix_steps.py")
    gold = _records(tmp_path / "gold.jsonl", "tabfact", 2)
    own = _records(tmp_path / "own.jsonl", "tabfact", 3)
    out = tmp_path / "new" / "mix.jsonl"  # its folder is made
    mod.main([str(gold), f"self_={own}", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["metadata"]["dataset"] for r in rows] == ["tabfact"] * 2 + ["self_tabfact"] * 3
    assert [r["trajectory_id"] for r in rows[2:]] == ["tabfact-0#0", "tabfact-1#0", "tabfact-2#0"]  # else unchanged


def test_a_missing_source_names_it(tmp_path, load_script):
    mod = load_script("scripts/mix_steps.py")
    with pytest.raises(FileNotFoundError, match="self_=.*nope.jsonl"):
        mod.main([f"self_={tmp_path / 'nope.jsonl'}", "--out", str(tmp_path / "mix.jsonl")])
