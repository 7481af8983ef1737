"""Per-question scores and their aggregation: answer metrics, retrieval recall@k, routing accuracy, cost.

Answer metrics come from `eval.metrics` (shared with the rewards): `f1_recall` (the paper's headline metric, the
recall of the best-F1 gold), `exact_match`, `token_f1`. `acc` is yes/no accuracy on yes/no questions and, as the
paper's final-answer reward, "F1-recall == 1" on the others. Keys use slash namespaces (`answer/f1_recall`,
`retrieval/recall@k`, `routing/accuracy`, `cost/steps`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from agent.types import Trajectory
from eval.metrics import exact_match, f1_recall, normalize_answer, token_f1
from retrievers.types import Hit

ANSWER_KEYS = ("answer/f1_recall", "answer/em", "answer/token_f1", "answer/acc")
COST_KEYS = ("cost/steps", "cost/searches", "cost/gen_tokens", "cost/latency_s")
ALL_KEYS = (*ANSWER_KEYS, "retrieval/recall@k", "routing/accuracy", *COST_KEYS, "run/error")
_SPAN = re.compile(r"^(?P<vid>.+)@(?P<start>[0-9.]+)-(?P<end>[0-9.]+)$")


def yes_no(text: str) -> str | None:
    """`yes` or `no` when the answer commits to exactly one of them, else None."""
    words = set(normalize_answer(text).split())
    found = words & {"yes", "no", "true", "false"}
    mapped = {"yes" if w in ("yes", "true") else "no" for w in found}
    return mapped.pop() if len(mapped) == 1 else None


def answer_scores(prediction: str, golds: Sequence[str], answer_type: str = "open") -> dict[str, float]:
    """F1-recall, EM, token F1 and accuracy of one prediction against its golds (best gold wins)."""
    if not golds:
        return {}
    recall = f1_recall(prediction, golds).recall
    if answer_type == "yesno":
        acc = float(yes_no(prediction) == normalize_answer(golds[0]))
    else:
        acc = float(recall == 1.0)
    return {"answer/f1_recall": recall, "answer/em": exact_match(prediction, golds),
            "answer/token_f1": token_f1(prediction, golds), "answer/acc": acc}


def evidence_matches(hit: Hit, gold: str) -> bool:
    """Whether a hit is the gold evidence `gold`: the same doc (a chunk counts as its source doc), or for
    `<video>@<start>-<end>` golds a clip of the same video whose span overlaps the gold span."""
    ids = {hit.doc.id, str(hit.doc.metadata.get("doc_id", hit.doc.id))}
    if gold in ids:
        return True
    g = _SPAN.match(gold)
    if not g:
        return False
    for doc_id in ids:
        h = _SPAN.match(doc_id)
        if h and h["vid"] == g["vid"] and float(h["start"]) < float(g["end"]) and float(h["end"]) > float(g["start"]):
            return True
    return False


def evidence_recall(hits: Iterable[Hit], golds: Sequence[str]) -> float | None:
    """Fraction of gold evidence ids found among `hits`; None when no gold evidence is known."""
    if not golds:
        return None
    hits = list(hits)
    return sum(any(evidence_matches(h, g) for h in hits) for g in golds) / len(golds)


def routing_accuracy(traj: Trajectory, gold_kb: str) -> float:
    """Fraction of the retrieval steps sent to the gold KB; 0 when the question was never looked up."""
    kbs = [s.kb for s in traj.steps if s.kb is not None]
    return sum(kb == gold_kb for kb in kbs) / len(kbs) if kbs else 0.0


def score_prediction(record: dict, kb_names: Sequence[str], routes: bool, retrieves: bool) -> dict[str, float]:
    """All per-question figures of one cached prediction record (see `eval.runner`).

    Args:
        record: `{trajectory, error, latency_s, ...}`.
        kb_names: names of the configured KBs (routing accuracy needs the gold KB among them).
        routes: the method chooses KBs (routing accuracy is reported).
        retrieves: the method can retrieve (recall@k is reported).
    """
    traj = Trajectory.from_dict(record["trajectory"])
    meta = traj.metadata
    golds = list(traj.gold or [])
    scores: dict[str, float] = {"run/error": float(bool(record.get("error")))}
    scores.update(answer_scores(traj.final_answer, golds, meta.get("answer_type", "open")))
    if retrieves:
        recall = evidence_recall((h for s in traj.steps for h in s.hits), meta.get("gold_evidence") or [])
        if recall is not None:
            scores["retrieval/recall@k"] = recall
    gold_kb = meta.get("gold_kb") or ""
    if routes and gold_kb in kb_names:
        scores["routing/accuracy"] = routing_accuracy(traj, gold_kb)
    scores["cost/steps"] = float(sum(1 for s in traj.steps if s.kb is not None))
    scores["cost/searches"] = float(meta.get("searches", scores["cost/steps"]))
    scores["cost/gen_tokens"] = float(meta.get("completion_tokens", 0))
    scores["cost/latency_s"] = float(record.get("latency_s", 0.0))
    return scores


def mean_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the rows that have it (a key absent everywhere is absent)."""
    out: dict[str, float] = {"n": float(len(rows))}
    for key in ALL_KEYS:
        vals = [r[key] for r in rows if key in r and not math.isnan(r[key])]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def macro_average(per_dataset: dict[str, dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over datasets of each key (datasets lacking a key are left out of that key's mean)."""
    out: dict[str, float] = {"datasets": float(len(per_dataset))}
    for key in ALL_KEYS:
        vals = [d[key] for d in per_dataset.values() if key in d]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out
