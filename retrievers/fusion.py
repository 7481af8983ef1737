"""Reciprocal-rank fusion of ranked hit lists (Cormack et al., 2009)."""

from __future__ import annotations

from retrievers.types import Hit


def reciprocal_rank_fusion(ranked: list[list[Hit]], k: int = 60) -> list[Hit]:
    """Fuse ranked lists of hits into one list scored by `sum(1 / (k + position))`.

    Positions are 1-based and taken from each list's order (not from `Hit.rank`). A document is identified by
    `(kb, doc.id)`; the first list that holds it supplies its `Doc`. Ties keep first-seen order.

    Args:
        ranked: ranked lists, best first (e.g. one from BM25 and one from dense search).
        k: smoothing constant; larger values flatten the contribution of top positions.

    Returns:
        All distinct hits, best first, with fused scores and 0-based ranks.

    Example:
        >>> from retrievers.types import Doc
        >>> a, b = Doc("a", "..."), Doc("b", "...")
        >>> fused = reciprocal_rank_fusion([[Hit(a, 9.0, 0, "t"), Hit(b, 3.0, 1, "t")], [Hit(b, 0.8, 0, "t")]])
        >>> [h.doc.id for h in fused]
        ['b', 'a']
    """
    if k < 0:
        raise ValueError(f"RRF constant k must be >= 0, got {k}")
    scores: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], Hit] = {}
    for hits in ranked:
        for position, hit in enumerate(hits, start=1):
            key = (hit.kb, hit.doc.id)
            scores[key] = scores.get(key, 0.0) + 1.0 / (k + position)
            first.setdefault(key, hit)
    order = sorted(scores, key=lambda key: -scores[key])  # sorted() is stable: ties keep first-seen order
    return [Hit(doc=first[key].doc, score=scores[key], rank=r, kb=first[key].kb) for r, key in enumerate(order)]
