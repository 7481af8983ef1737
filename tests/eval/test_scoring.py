"""Hand-made cases for the per-question figures (answer metrics via agent.metrics, recall@k, routing, aggregation)."""

from __future__ import annotations

import pytest

from agent.metrics import expand_infoseek_golds
from agent.types import Step, Trajectory
from eval.scoring import (
    answer_scores,
    evidence_matches,
    evidence_recall,
    macro_average,
    mean_scores,
    routing_accuracy,
    score_prediction,
    yes_no,
)
from retrievers.types import Doc, Hit

INFOSEEK_RANGE = [{"wikidata": 6.75, "range": [6.5, 7.0]}]  # a real InfoSeek numeric gold (infoseek_val_00000002)


@pytest.mark.parametrize(
    ("prediction", "golds", "answer_type", "expected"),
    [
        # exact answer: every metric is 1
        (
            "Paris",
            ["Paris"],
            "open",
            {"answer/f1_recall": 1.0, "answer/em": 1.0, "answer/token_f1": 1.0, "answer/acc": 1.0},
        ),
        # verbose answer: F1-recall (recall) stays 1, EM drops to 0, token F1 = 2*(1/4*1)/(1/4+1) = 0.4
        (
            "it is in Paris",
            ["Paris"],
            "open",
            {"answer/f1_recall": 1.0, "answer/em": 0.0, "answer/token_f1": 0.4, "answer/acc": 1.0},
        ),
        # multi-gold rule: the gold with the best F1 wins and ITS recall is reported. vs "paris": P=.5 R=1 F1=.667;
        # vs "france paris city": P=1 R=2/3 F1=.8 -> the second wins, so F1-recall is 2/3 (not the max recall 1)
        ("paris france", ["paris", "france paris city"], "open", {"answer/f1_recall": 2 / 3, "answer/acc": 0.0}),
        # no overlap with any gold
        ("London", ["Paris", "City of Light"], "open", {"answer/f1_recall": 0.0, "answer/em": 0.0, "answer/acc": 0.0}),
        # EM matches any of several golds after normalisation (case, article, punctuation)
        ("The Beatles!", ["beatles", "Fab Four"], "open", {"answer/em": 1.0}),
        # yes/no set: accuracy needs a committed yes/no; F1-recall rewards the hedge "yes or no" (paper quirk)
        ("yes or no", ["yes"], "yesno", {"answer/f1_recall": 1.0, "answer/acc": 0.0}),
        ("Yes, it is.", ["yes"], "yesno", {"answer/acc": 1.0}),
        ("no", ["yes"], "yesno", {"answer/f1_recall": 0.0, "answer/acc": 0.0}),
        # number words become digits in the paper's normalisation
        ("two", ["2"], "open", {"answer/f1_recall": 1.0}),
    ],
)
def test_answer_scores(prediction: str, golds: list[str], answer_type: str, expected: dict) -> None:
    scores = answer_scores(prediction, golds, answer_type)
    for key, value in expected.items():
        assert scores[key] == pytest.approx(value), key


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("6.8", 1.0),  # inside [6.5, 7.0] on the 0.001 grid of a range narrower than 1
        ("6.75", 1.0),  # the wikidata value itself
        ("7", 1.0),  # every integer in [int(lo), int(hi)] is added
        ("6", 1.0),  # ... including int(6.5) = 6, below the range: the paper's code does this
        ("7.5", 0.0),  # outside the range
        ("8", 0.0),  # an integer outside [6, 7]
    ],
)
def test_infoseek_numeric_range(prediction: str, expected: float) -> None:
    golds = expand_infoseek_golds(INFOSEEK_RANGE)
    assert answer_scores(prediction, golds)["answer/f1_recall"] == expected


def test_infoseek_string_golds_unchanged() -> None:
    # string golds (non-numeric InfoSeek answers) pass through as they are
    assert expand_infoseek_golds(["Dahlia", "dahlias"]) == ["Dahlia", "dahlias"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("yes", "yes"), ("No.", "no"), ("true", "yes"), ("yes or no", None), ("maybe", None)],
)
def test_yes_no(text: str, expected: str | None) -> None:
    assert yes_no(text) == expected


def _hit(id_: str, **meta: object) -> Hit:
    return Hit(doc=Doc(id=id_, text="x", metadata=meta), score=1.0, rank=0, kb="k")


@pytest.mark.parametrize(
    ("hit", "gold", "expected"),
    [
        (_hit("wiki-a"), "wiki-a", True),  # same doc id
        (_hit("wiki-a#1", doc_id="wiki-a"), "wiki-a", True),  # a chunk of the gold paragraph counts
        (_hit("wiki-b"), "wiki-a", False),  # another doc
        (_hit("vid@10-20"), "vid@15-30", True),  # clip overlapping the gold span
        (_hit("vid@10-20"), "vid@20-30", False),  # clip touching but not overlapping the span
        (_hit("other@10-20"), "vid@10-20", False),  # same span, other video
    ],
)
def test_evidence_matches(hit: Hit, gold: str, expected: bool) -> None:
    assert evidence_matches(hit, gold) is expected


def test_evidence_recall_counts_each_gold_once() -> None:
    hits = [_hit("a"), _hit("a#0", doc_id="a"), _hit("c")]
    assert evidence_recall(hits, ["a", "b"]) == 0.5  # a found (twice), b missing
    assert evidence_recall(hits, []) is None  # no gold evidence known


def _traj(kbs: list[str | None], answer: str = "Paris", **meta: object) -> Trajectory:
    steps = tuple(
        Step(index=i, sub_question=None if kb is None else "q", kb=kb, hits=() if kb is None else (_hit(f"{kb}-doc"),))
        for i, kb in enumerate(kbs)
    )
    return Trajectory(id="q", question="Q?", steps=steps, final_answer=answer, gold=("Paris",), metadata=meta)


@pytest.mark.parametrize(
    ("kbs", "expected"),
    [
        (["wiki", "wiki"], 1.0),  # both steps to the gold KB
        (["wiki", "tables", None], 0.5),  # one of two retrieval steps right; the stop step does not count
        ([None], 0.0),  # never looked up: counted as a wrong route
    ],
)
def test_routing_accuracy(kbs: list[str | None], expected: float) -> None:
    assert routing_accuracy(_traj(kbs), "wiki") == expected


def test_score_prediction_and_aggregation() -> None:
    rec = {
        "trajectory": _traj(
            ["wiki", "tables"], gold_kb="wiki", gold_evidence=["wiki-doc", "zzz"], completion_tokens=12, searches=2
        ).to_dict(),
        "latency_s": 0.5,
        "error": "",
    }
    s = score_prediction(rec, ["wiki", "tables"], routes=True, retrieves=True)
    assert s["retrieval/recall@k"] == 0.5 and s["routing/accuracy"] == 0.5
    assert s["cost/steps"] == 2 and s["cost/searches"] == 2 and s["cost/gen_tokens"] == 12
    # a method that does not route gets no routing figure; a gold KB that is not configured neither
    assert "routing/accuracy" not in score_prediction(rec, ["wiki"], routes=False, retrieves=True)
    assert "routing/accuracy" not in score_prediction(rec, ["other"], routes=True, retrieves=True)
    mean = mean_scores([{"answer/em": 1.0}, {"answer/em": 0.0, "retrieval/recall@k": 0.5}])
    assert mean["answer/em"] == 0.5 and mean["retrieval/recall@k"] == 0.5 and mean["n"] == 2
    # macro average: unweighted over datasets, whatever their size
    assert macro_average({"a": {"answer/em": 1.0}, "b": {"answer/em": 0.0}})["answer/em"] == 0.5
