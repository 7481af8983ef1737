"""Reciprocal-rank fusion on hand-made ranked lists."""

from __future__ import annotations

import pytest

from retrievers.fusion import reciprocal_rank_fusion
from retrievers.types import Doc, Hit


def ranked(ids: str, kb: str = "t") -> list[Hit]:
    """A ranked list from a string of one-letter doc ids, best first (scores are deliberately meaningless)."""
    return [Hit(Doc(i, f"text {i}", kb=kb), score=100.0 - r, rank=r, kb=kb) for r, i in enumerate(ids)]


@pytest.mark.parametrize(
    "lists, k, expected",
    [
        # a single list keeps its order
        (["abc"], 60, "abc"),
        # agreement wins: b is 2nd and 1st -> beats a (1st, absent) and c (absent, 2nd)
        (["ab", "bc"], 60, "bac"),
        # with k=0 top positions dominate: a and c (1/1 each) beat b (1/2 + 1/3); ties keep first-seen order
        (["ab", "cdb"], 0, "acbd"),
        # with the usual k=60, being in both lists dominates: b (1/62 + 1/63) beats a and c (1/61 each)
        (["ab", "cdb"], 60, "bacd"),
        # exact ties (every doc scores 1 with k=0) keep first-seen order
        (["ab", "cb"], 0, "abc"),
        # empty lists contribute nothing
        ([], 60, ""),
        (["", "ab"], 60, "ab"),
        # a doc repeated deeper in the same list still counts each appearance (here: d twice)
        (["dxd", "y"], 60, "dyx"),
    ],
)
def test_rrf_order(lists, k, expected):
    fused = reciprocal_rank_fusion([ranked(s) for s in lists], k=k)
    assert "".join(h.doc.id for h in fused) == expected
    assert [h.rank for h in fused] == list(range(len(expected)))
    assert all(a.score >= b.score for a, b in zip(fused, fused[1:], strict=False))


def test_rrf_scores_are_reciprocal_ranks():
    # b: 1/(60+2) + 1/(60+1); the input scores (100, 99, ...) must not leak into the fused score
    fused = reciprocal_rank_fusion([ranked("ab"), ranked("b")], k=60)
    assert fused[0].doc.id == "b"
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61)


def test_rrf_keeps_kbs_apart():
    # the same doc id in two KBs is two different documents, and each hit keeps its KB
    fused = reciprocal_rank_fusion([ranked("a", kb="text"), ranked("a", kb="table")])
    assert sorted((h.kb, h.doc.kb) for h in fused) == [("table", "table"), ("text", "text")]


def test_rrf_rejects_negative_k():
    with pytest.raises(ValueError, match="k must be >= 0"):
        reciprocal_rank_fusion([ranked("a")], k=-1)
