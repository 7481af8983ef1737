"""Rejection sampling: which teacher trajectories are kept, and why each other one is not.

The always-on rule (DESIGN §6, the paper's `data_filter.py`): the final answer scores 1 on the answer metric, i.e.
the F1-recall of the best gold is 1 (`agent.metrics.f1_recall`, the code eval and the reward use). Optional rules
(`RejectionSpec`): no format error anywhere, every intermediate answer overlapping its own evidence, at most `n`
retrieval steps. Every rule that fails is recorded, so a rejected trajectory lists all its reasons.

Reasons, in the order they are checked:

| reason | when |
|---|---|
| `backend_error` | the teacher (after retries) or a KB failed; the trajectory is incomplete |
| `empty_answer` | no final answer text |
| `wrong_answer` | final answer F1-recall < 1 against every gold |
| `missing_support` | (gold steps: the annotation teacher) a step's hits do not hold its gold support |
| `format_error` | (rule) a plan, answer or final reply had a format error, even if a re-ask fixed it |
| `unsupported_answer` | (rule) an intermediate answer shares < `min_evidence_overlap` of its tokens with its hits |
| `too_many_steps` | (rule) more retrieval steps than `rejection.max_steps` |
| `empty_intermediate_answer` | an intermediate answer is empty: no training target for that step |
| `duplicate` | same sub-questions, KBs and answers as a kept sample of the same question |
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.metrics import f1_recall, is_correct, normalize_answer
from agent.types import Trajectory
from data_synthesis.config import RejectionSpec
from retrievers.types import Hit

REASONS = (
    "backend_error",
    "empty_answer",
    "wrong_answer",
    "format_error",
    "unsupported_answer",
    "too_many_steps",
    "empty_intermediate_answer",
    "duplicate",
)
# Only trajectories with gold steps (metadata `gold_support`, written by the annotation teacher) can miss a support.
MISSING_SUPPORT = "missing_support"


def answer_score(prediction: str, golds: tuple[str, ...] | list[str]) -> float:
    """F1-recall of the best gold (the paper's metric); 1.0 means the answer is accepted."""
    return f1_recall(prediction, list(golds)).recall


def support_keys(hit: Hit) -> set[str]:
    """The ids a hit answers to: its doc id, the source record of a chunk (`metadata.doc_id`, `<id>#<i>` cut)."""
    keys = {hit.doc.id, re.sub(r"#\d+$", "", hit.doc.id)}
    if hit.doc.metadata.get("doc_id") is not None:
        keys.add(str(hit.doc.metadata["doc_id"]))
    return keys


def _clip(hit: Hit) -> tuple[str, float, float] | None:
    """(video id, start, end) of a clip hit: a clip KB's `media` span, or a clip corpus' `start`/`end` columns."""
    meta = hit.doc.metadata
    video = meta.get("video_id")
    if video is None:
        return None
    if hit.doc.media is not None and hit.doc.media.start is not None:
        return str(video), float(hit.doc.media.start), float(hit.doc.media.end)
    if meta.get("start") is not None and meta.get("end") is not None:
        return str(video), float(meta["start"]), float(meta["end"])
    return None


def support_rank(hits: Sequence[Hit], support: dict) -> int | None:
    """Position of the first hit that holds (part of) `support`, or None.

    A support is `{"ids": [...], "need": "all"|"any"}` (doc, table or image ids) or `{"video_id", "span": [s, e]}`
    (any clip of that video overlapping the span).
    """
    for i, hit in enumerate(hits):
        if "span" in support:
            clip = _clip(hit)
            start, end = support["span"]
            if clip is not None and clip[0] == support["video_id"] and clip[1] < end and clip[2] > start:
                return i
        elif support_keys(hit) & set(support["ids"]):
            return i
    return None


def holds_support(hits: Sequence[Hit], support: dict) -> bool:
    """Whether the hits hold the gold support: every id (`need: all`), any id, or a clip overlapping the span.

    Example:
        >>> from retrievers.types import Doc
        >>> hits = [Hit(Doc("wiki-1#0", "…", metadata={"doc_id": "wiki-1"}), 1.0, 0, "wiki")]
        >>> holds_support(hits, {"ids": ["wiki-1"], "need": "all"}), holds_support(hits, {"ids": ["wiki-2"]})
        (True, False)
    """
    if "span" in support or support.get("need", "all") == "any":
        return support_rank(hits, support) is not None
    found = set().union(*(support_keys(h) for h in hits)) if hits else set()
    return set(support["ids"]) <= found


def has_format_error(traj: Trajectory) -> bool:
    """Any format error in any step (including ones a re-ask fixed: more than one raw reply) or the final."""
    if traj.stop_reason == "format_error" or traj.metadata.get("final_errors"):
        return True
    if len(traj.final_raw) > 1:
        return True
    for s in traj.steps:
        expected = 2 if s.sub_question is not None else 1  # one plan reply, plus one answer reply when it asked
        if s.format_errors or len(s.raw) > expected:
            return True
    return False


def evidence_overlap(answer: str, evidence: str) -> float:
    """Share of the answer's tokens found in the evidence: the precision of `f1_recall(answer, [evidence])`."""
    if not answer.strip() or not evidence.strip():
        return 0.0
    return f1_recall(answer, [evidence]).precision


def rejection_reasons(traj: Trajectory, rules: RejectionSpec) -> list[str]:
    """All reasons to reject `traj` (empty list: keep it). Duplicates are judged by `dedupe_key` separately."""
    if traj.stop_reason == "backend_error":
        return ["backend_error"]
    reasons = []
    if not traj.final_answer.strip():
        reasons.append("empty_answer")
    elif not is_correct(answer_score(traj.final_answer, traj.gold or ())):
        reasons.append("wrong_answer")
    steps = traj.retrieval_steps
    supports = traj.metadata.get("gold_support")
    if supports is not None and (len(steps) != len(supports) or any(
            sup is not None and not holds_support(s.hits, sup) for s, sup in zip(steps, supports, strict=True))):  # fmt: skip
        reasons.append(MISSING_SUPPORT)
    if rules.require_no_format_errors and has_format_error(traj):
        reasons.append("format_error")
    if rules.require_evidence_overlap:
        for s in steps:
            evidence = "\n".join(h.doc.text for h in s.hits)
            if evidence_overlap(s.answer, evidence) < rules.min_evidence_overlap:
                reasons.append("unsupported_answer")
                break
    if rules.max_steps is not None and len(steps) > rules.max_steps:
        reasons.append("too_many_steps")
    if any(not s.answer.strip() for s in steps):
        reasons.append("empty_intermediate_answer")
    return reasons


def dedupe_key(traj: Trajectory) -> tuple:
    """What makes two samples of one question the same trajectory: normalised sub-questions, KBs, answers."""
    return (
        tuple(
            (normalize_answer(s.sub_question or ""), s.kb, normalize_answer(s.answer)) for s in traj.retrieval_steps
        ),
        normalize_answer(traj.final_answer),
    )


@dataclass(frozen=True)
class Verdict:
    """The judgement of one trajectory."""

    trajectory: Trajectory
    reasons: tuple[str, ...]
    score: float

    @property
    def accepted(self) -> bool:
        return not self.reasons


def judge_group(trajectories: list[Trajectory], rules: RejectionSpec) -> list[Verdict]:
    """Judge the samples of one question in order; a later sample equal to a kept one is a `duplicate`."""
    kept: set[tuple] = set()
    out = []
    for t in trajectories:
        reasons = rejection_reasons(t, rules)
        score = answer_score(t.final_answer, t.gold or ()) if t.stop_reason != "backend_error" else 0.0
        if not reasons:
            key = dedupe_key(t)
            if key in kept:
                reasons = ["duplicate"]
            kept.add(key)
        out.append(Verdict(t, tuple(reasons), score))
    return out
