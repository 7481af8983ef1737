"""scripts/paired_bootstrap.py: the report's macro (datasets -> groups -> mean) of a paired difference, and its s.e."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _write(out: Path, scores: dict[str, dict[str, list[float]]]) -> None:
    """scores[method][dataset] = per-question F1; datasets `a1`, `a2` form group `a`, `b1` group `b`."""
    groups = {"a1": "a", "a2": "a", "b1": "b"}
    out.mkdir()
    (out / "results.json").write_text(
        json.dumps({"datasets": {d: {"group": g, "skipped": ""} for d, g in groups.items()}})
    )
    rows = [
        {"method": m, "dataset": ds, "qid": f"{ds}-{i}", "error": "", "scores": {"answer/f1_recall": x}}
        for m, per_ds in scores.items()
        for ds, xs in per_ds.items()
        for i, x in enumerate(xs)
    ]
    rows.append({"method": "x", "dataset": "b1", "qid": "b1-9", "error": "backend down", "scores": {}})
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_macro_weights_groups_equally_and_pairs_by_question(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    _write(
        tmp_path / "run",
        {
            "x": {"a1": [1, 1], "a2": [0, 0, 0, 0], "b1": [1, 0]},
            "y": {"a1": [0, 0], "a2": [0, 0, 0, 0], "b1": [0, 0]},
        },
    )
    r = mod.paired(tmp_path / "run", "x", "y", "answer/f1_recall", resamples=500)
    # group a: mean(a1 diff 1.0, a2 diff 0.0) = 0.5; group b: 0.5; macro 0.5 (a question-pooled mean would be 0.375)
    assert r["diff"] == pytest.approx(0.5)
    assert r["n"] == 8
    assert 0.05 < r["se"] < 0.5  # only b1 varies under resampling
    same = mod.paired(tmp_path / "run", "y", "y", "answer/f1_recall", resamples=50)
    assert same["diff"] == 0 and same["se"] == 0


def test_methods_with_no_common_question_are_a_clear_error(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    _write(tmp_path / "run", {"x": {"a1": [1]}})
    with pytest.raises(SystemExit, match="no question scored by both 'x' and 'rag_all'"):
        mod.paired(tmp_path / "run", "x", "rag_all", "answer/f1_recall")


def test_answer_type_keeps_only_those_questions(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"datasets": {"a1": {"group": "a", "skipped": ""}}}))
    # x wins the yes/no question, y the open one: the filter decides which difference is reported
    rows = [
        {"method": m, "dataset": "a1", "qid": qid, "error": "", "scores": {"answer/f1_recall": x},
         "trajectory": {"metadata": {"answer_type": kind}}}
        for m, qid, kind, x in [("x", "q1", "yesno", 1.0), ("y", "q1", "yesno", 0.0),
                                ("x", "q2", "open", 0.0), ("y", "q2", "open", 1.0)]
    ]  # fmt: skip
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mod.paired(out, "x", "y", "answer/f1_recall", resamples=50)["diff"] == pytest.approx(0.0)
    assert mod.paired(out, "x", "y", "answer/f1_recall", resamples=50, answer_type="yesno")["diff"] == 1.0
    r = mod.paired(out, "x", "y", "answer/f1_recall", resamples=50, answer_type="open")
    assert r["diff"] == -1.0 and r["n"] == 1


def test_an_untyped_question_counts_as_open_as_in_the_report(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"datasets": {"a1": {"group": "a", "skipped": ""}}}))
    rows = [
        {"method": m, "dataset": "a1", "qid": "q1", "error": "", "scores": {"answer/f1_recall": x},
         "trajectory": {"metadata": {}}}
        for m, x in [("x", 0.0), ("y", 1.0)]
    ]  # fmt: skip
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = mod.paired(out, "x", "y", "answer/f1_recall", resamples=50, answer_type="open")
    assert r["diff"] == -1.0 and r["n"] == 1
    with pytest.raises(SystemExit, match="no question scored by both"):
        mod.paired(out, "x", "y", "answer/f1_recall", resamples=50, answer_type="yesno")


def test_b_can_come_from_another_output_folder(tmp_path: Path, load_script) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    _write(tmp_path / "new", {"x": {"a1": [1, 1], "a2": [0, 0], "b1": [1, 1]}})
    _write(tmp_path / "old", {"x": {"a1": [0, 0], "a2": [0, 0], "b1": [1, 0]}})
    r = mod.paired(tmp_path / "new", "x", "x", "answer/f1_recall", resamples=200, b_dir=tmp_path / "old")
    assert r["diff"] == pytest.approx((0.5 + 0.5) / 2) and r["n"] == 6  # group a: (1 + 0) / 2, group b: 0.5
    assert mod.paired(tmp_path / "new", "x", "x", "answer/f1_recall", resamples=50)["diff"] == 0  # without it: itself


def test_also_prints_each_set_then_pools_them_by_inverse_variance(tmp_path: Path, load_script, capsys) -> None:
    mod = load_script("scripts/paired_bootstrap.py")
    _write(
        tmp_path / "s1",
        {"x": {"a1": [1, 0], "a2": [1, 1], "b1": [1, 0, 1, 0]}, "y": {"a1": [0, 0], "a2": [0, 0], "b1": [0] * 4}},
    )
    _write(
        tmp_path / "s2",
        {"x": {"a1": [0, 0], "a2": [0, 0], "b1": [0, 1]}, "y": {"a1": [0, 0], "a2": [0, 0], "b1": [0, 0]}},
    )
    assert mod.main([str(tmp_path / "s1"), "x", "y", "--also", str(tmp_path / "s2"), "--resamples", "300"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        len(lines) == 3 and "[" + str(tmp_path / "s2") + "]" in lines[1] and lines[2].startswith("pooled over 2 sets")
    )
    r1, r2 = (mod.paired(tmp_path / s, "x", "y", "answer/f1_recall", resamples=300) for s in ("s1", "s2"))
    pooled = mod.pool([r1, r2])
    w1, w2 = 1 / r1["se"] ** 2, 1 / r2["se"] ** 2
    assert pooled["diff"] == pytest.approx((w1 * r1["diff"] + w2 * r2["diff"]) / (w1 + w2))
    assert min(r1["diff"], r2["diff"]) < pooled["diff"] < max(r1["diff"], r2["diff"])
    assert pooled["se"] < min(r1["se"], r2["se"]) and pooled["n"] == r1["n"] + r2["n"]
    # a set with the same answers (s.e. 0) carries no weight: the pool is the other set's figure
    assert mod.pool([r1, {"diff": 0.0, "se": 0.0, "n": 3}])["diff"] == pytest.approx(r1["diff"])
    with pytest.raises(SystemExit):  # argparse's error: --also pairs within each folder, --b-dir across two
        mod.main([str(tmp_path / "s1"), "x", "y", "--also", str(tmp_path / "s2"), "--b-dir", str(tmp_path / "s2")])
