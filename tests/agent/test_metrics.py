"""Tests for agent/metrics.py: the paper's F1-recall (870 reference cases), SQuAD EM/F1, InfoSeek gold expansion."""

from __future__ import annotations

import json

import pytest

from agent.metrics import (
    exact_match,
    expand_infoseek_golds,
    f1_recall,
    is_correct,
    normalize_answer,
    paper_normalize,
    paper_tokens,
    token_f1,
)
from tests.conftest import SHARED

CASES = SHARED / "metrics" / "f1_recall_cases.jsonl"


@pytest.mark.skipif(not CASES.exists(), reason=f"shared reference cases absent: {CASES}")
def test_f1_recall_reproduces_all_reference_cases():
    rows = [json.loads(line) for line in CASES.read_text().splitlines() if line.strip()]
    assert len(rows) == 870
    mismatches = []
    for row in rows:
        got = f1_recall(row["prediction"], row["golds"])
        for key in ("precision", "recall", "f1"):
            if abs(getattr(got, key) - row[key]) > 1e-9:
                mismatches.append((row["prediction"], row["golds"], key, getattr(got, key), row[key]))
    assert not mismatches, mismatches[:5]


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("The Eiffel Tower.", ["eiffel", "tower"]),  # 'the' dropped, final period removed
        ("a cat", ["a", "cat"]),  # the release keeps the article 'a'
        ("An apple", ["apple"]),  # ...but drops 'an'
        ("three", ["3"]),  # number words to digits
        ("None", ["0"]),  # including 'none' -> '0'
        ("1,000 people", ["1000", "people"]),  # a \d,\d pattern deletes punctuation instead of spacing it
        ("Italian–Scottish", ["italian", "–", "scottish"]),  # NLTK 3.9 splits en dashes
        ("well-known", ["well", "known"]),  # '-' not next to a space becomes a space
        ("3.5 km", ["3.5", "km"]),  # a period before a digit is kept
        ("dont", ["do", "n't"]),  # contraction expanded, then split by the word tokenizer
        ("", []),  # empty text has no tokens
    ],
)
def test_paper_tokens(text, tokens):
    assert paper_tokens(text) == tokens


def test_paper_normalize_removes_at_most_32_periods():
    # the release passes re.UNICODE (32) as `count`: the 33rd period survives
    assert paper_normalize("." * 33) == "."


@pytest.mark.parametrize(
    "prediction, golds, precision, recall",
    [
        ("Paris", ["Paris"], 1.0, 1.0),  # identical
        ("it is paris", ["Paris"], 1 / 3, 1.0),  # verbose answer: full recall, low precision
        ("", ["Paris"], 0.0, 0.0),  # empty prediction scores 0
        ("Paris", [], 0.0, 0.0),  # no golds scores 0
        ("london", ["Paris"], 0.0, 0.0),  # no overlap
        ("new york city", ["york", "new york city"], 1.0, 1.0),  # the exact gold has the best F1
        ("paris", "Paris", 1.0, 1.0),  # a bare string gold is one gold
    ],
)
def test_f1_recall_hand_cases(prediction, golds, precision, recall):
    got = f1_recall(prediction, golds)
    assert got.precision == pytest.approx(precision)
    assert got.recall == pytest.approx(recall)


def test_f1_recall_picks_gold_with_highest_f1_and_reports_its_recall():
    # gold 1 'york' has recall 1 but F1 0.5; gold 2 has F1 0.8 and recall 2/3: the paper reports 2/3
    got = f1_recall("new york", ["york", "new york city"])
    assert got.f1 == pytest.approx(0.8)
    assert got.recall == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("The Cat!", "cat"),  # lower-case, punctuation and article removed
        ("  a   b  ", "b"),  # 'a' is an article in SQuAD normalisation
        ("U.S.A.", "usa"),  # periods deleted
    ],
)
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    "prediction, golds, em, f1",
    [
        ("The Cat", ["cat"], 1.0, 1.0),  # equal after normalisation
        ("black cat", ["cat"], 0.0, 2 / 3),  # partial overlap
        ("dog", ["cat", "dog"], 1.0, 1.0),  # any gold may match
        ("", ["cat"], 0.0, 0.0),  # empty prediction
        ("cat", [], 0.0, 0.0),  # no golds
    ],
)
def test_exact_match_and_token_f1(prediction, golds, em, f1):
    assert exact_match(prediction, golds) == em
    assert token_f1(prediction, golds) == pytest.approx(f1)


@pytest.mark.parametrize(
    "answer_eval, expected_head, expected_len, contains",
    [
        (["Rome", "Roma"], ["Rome", "Roma"], 2, "Roma"),  # string golds pass through
        # width 0.5 < 1: step 0.001; numpy.arange(6.5, 7.001, 0.001) overshoots by one float step (502 values,
        # the last 7.001, as in the release), plus ints 6 and 7
        ([{"wikidata": 6.75, "range": [6.5, 7.0]}], ["6.5", "6.501", "6.502"], 504, "7.001"),
        # width 46 in [5, 50): step 0.1 over [112, 158] (461 values) plus 47 ints
        ([{"wikidata": 135.0, "range": [112.0, 158.0]}], ["112.0", "112.1", "112.2"], 461 + 47, "135"),
        # width 384 >= 50: step 1 (385 values) plus 385 ints
        ([{"wikidata": 1920.0, "range": [1728.0, 2112.0]}], ["1728.0", "1729.0"], 385 + 385, "1920"),
    ],
)
def test_expand_infoseek_golds(answer_eval, expected_head, expected_len, contains):
    golds = expand_infoseek_golds(answer_eval)
    assert golds[: len(expected_head)] == expected_head
    assert len(golds) == expected_len
    assert contains in golds


def test_expanded_infoseek_golds_score_a_number_inside_the_range():
    golds = expand_infoseek_golds([{"wikidata": 1.18, "range": [1.062, 1.298]}])
    assert f1_recall("about 1.2", golds).recall == 1.0  # 1.2 lies in the range
    assert f1_recall("1.5", golds).recall == 0.0  # 1.5 does not


def test_is_correct_means_recall_one():
    assert is_correct(f1_recall("It is Paris.", ["paris"]).recall)
    assert not is_correct(f1_recall("Paris", ["paris is big"]).recall)  # recall 1/3
