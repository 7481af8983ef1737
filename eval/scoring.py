"""Per-question scores and their aggregation: answer metrics, retrieval recall@k, routing accuracy, cost.

Answer metrics come from `agent.metrics` (shared with the rewards): `f1_recall` (the paper's headline metric, the
recall of the best-F1 gold), `exact_match`, `token_f1`. `acc` is yes/no accuracy on yes/no questions and, as the
paper's final-answer reward, "F1-recall == 1" on the others. Keys use slash namespaces (`answer/f1_recall`,
`retrieval/recall@k`, `routing/accuracy`, `cost/steps`).

Two figures are pooled over steps rather than averaged over questions: per question, `count/*` keys hold the
numerator and denominator, and `mean_scores` divides their sums (see `RATIOS`):

- `format/valid_step_rate`: of the tagged outputs the policy generated, the share whose recorded parse has no format
  error (`agent.protocol`: a missing/empty required tag, an unknown KB, a KB with a `None` sub-question). For the
  step-protocol methods (the agent and its variants) the outputs are every plan (each `Step`: its `format_errors` when
  it retrieved nothing, else it parsed), every intermediate answer (each `Step` with a KB: its `format_errors`) and
  the final answer (`metadata.final_errors`, when a final was generated). For the other methods their tagged answer
  (`final_errors`) counts, and the router's `<ret>` reply (`metadata.route`: valid unless `format_error`); IRCoT's
  free-form reasoning sentences do not. With re-asks (`max_retries > 0`) a step's recorded parse is its last
  attempt's. Backend errors are not outputs.
- `routing/step_accuracy` and `routing/accuracy@step<i>`: of the retrieval steps (at step i), the share sent to the
  question's gold KB; only questions whose gold KB is configured, only methods that choose a KB. A plan that stopped
  or was malformed is no retrieval step (the routing-per-step plot shows those as `none` / `format_error`).
  `routing/accuracy` stays per question (a question never looked up scores 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from agent.metrics import exact_match, f1_recall, is_correct, normalize_answer, token_f1
from agent.types import Question, Trajectory
from retrievers.types import Hit

ANSWER_KEYS = ("answer/f1_recall", "answer/em", "answer/token_f1", "answer/acc")
COST_KEYS = ("cost/steps", "cost/searches", "cost/gen_tokens", "cost/latency_s")
ALL_KEYS = (*ANSWER_KEYS, "retrieval/recall@k", "routing/accuracy", *COST_KEYS, "run/error")
COUNT_PREFIX = "count/"
# pooled ratio -> (numerator count, denominator count); `@step<i>` variants follow the same pattern
RATIOS = {
    "format/valid_step_rate": ("count/valid_outputs", "count/outputs"),
    "routing/step_accuracy": ("count/routes_to_gold", "count/routes"),
}
# Row columns that are gold: scoring reads them from the current dataset row, never from a cached prediction.
GOLD_COLUMNS = ("gold_kb", "gold_evidence", "answer_type")
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
        acc = float(is_correct(recall))
    return {
        "answer/f1_recall": recall,
        "answer/em": exact_match(prediction, golds),
        "answer/token_f1": token_f1(prediction, golds),
        "answer/acc": acc,
    }


def evidence_matches(hit: Hit, gold: str) -> bool:
    """Whether a hit is the gold evidence `gold`: the same doc (a chunk counts as its source doc, an ingested record
    as its page), or for
    `<video>@<start>-<end>` golds a clip of the same video whose span overlaps the gold span."""
    ids = {hit.doc.id, str(hit.doc.metadata.get("doc_id", hit.doc.id))}
    if "source_id" in hit.doc.metadata:  # records of `kbrouter ingest` also count as their page (`report.pdf#p4`)
        ids.add(str(hit.doc.metadata["source_id"]))
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
    kbs = [s.kb for s in traj.retrieval_steps]
    return sum(kb == gold_kb for kb in kbs) / len(kbs) if kbs else 0.0


def output_validity(traj: Trajectory, step_protocol: bool) -> tuple[int, int]:
    """`(valid, generated)` tagged outputs of a trajectory (see the module docstring for what counts)."""
    outputs: list[bool] = []
    if step_protocol:
        retrieved = {id(s) for s in traj.retrieval_steps}  # the one definition of a retrieval step (agent.types)
        for s in traj.steps:
            if id(s) in retrieved:
                outputs += [True, not s.format_errors]  # it retrieved, so its plan parsed; then its answer
            else:
                outputs.append(not s.format_errors)  # a plan that stopped (valid) or was malformed
    if "route" in traj.metadata:  # the one-shot router's <ret> reply
        outputs.append(traj.metadata["route"] != "format_error")
    final_errors = list(traj.metadata.get("final_errors") or [])
    if traj.final_raw and "backend_error" not in final_errors:
        outputs.append(not final_errors)
    return sum(outputs), len(outputs)


def route_counts(traj: Trajectory, gold_kb: str) -> dict[str, float]:
    """`count/routes[@step<i>]` and `count/routes_to_gold[@step<i>]` over the trajectory's retrieval steps."""
    out: dict[str, float] = {"count/routes": 0.0, "count/routes_to_gold": 0.0}
    for s in traj.retrieval_steps:
        at = f"@step{s.index + 1}"
        for key in ("count/routes", f"count/routes{at}"):
            out[key] = out.get(key, 0.0) + 1
        for key in ("count/routes_to_gold", f"count/routes_to_gold{at}"):
            out[key] = out.get(key, 0.0) + float(s.kb == gold_kb)
    return out


def score_prediction(
    record: dict,
    kb_names: Sequence[str],
    routes: bool,
    retrieves: bool,
    step_protocol: bool = False,
    question: Question | None = None,
) -> dict[str, float]:
    """All per-question figures of one cached prediction record (see `eval.runner`).

    Args:
        record: `{trajectory, error, latency_s, ...}`.
        kb_names: names of the configured KBs (routing accuracy needs the gold KB among them).
        routes: the method chooses KBs (routing accuracy is reported).
        retrieves: the method can retrieve (recall@k is reported).
        step_protocol: the trajectory's steps are agent plan/answer steps (their outputs count for validity).
        question: the current dataset row: its answers and gold columns (`gold_kb`, `gold_evidence`,
            `answer_type`) replace those saved with the prediction.

    A record that ended in an error (it has an `error`, or stopped with `backend_error`) scores only `run/error` = 1.
    """
    traj = Trajectory.from_dict(record["trajectory"])
    meta = dict(traj.metadata)
    golds = list(traj.gold or [])
    if question is not None:  # the current gold, never the one saved with the prediction
        golds = list(question.answers or [])
        for key in GOLD_COLUMNS:
            meta.pop(key, None)
            if key in question.metadata:
                meta[key] = question.metadata[key]
    error = bool(record.get("error")) or traj.stop_reason == "backend_error"
    scores: dict[str, float] = {"run/error": float(error)}
    if error:  # a failure is counted as an error, not as a wrong answer: it is left out of every other figure
        return scores
    scores.update(answer_scores(traj.final_answer, golds, meta.get("answer_type", "open")))
    if retrieves:
        recall = evidence_recall((h for s in traj.steps for h in s.hits), meta.get("gold_evidence") or [])
        if recall is not None:
            scores["retrieval/recall@k"] = recall
    gold_kb = meta.get("gold_kb") or ""
    if routes and gold_kb in kb_names:
        scores["routing/accuracy"] = routing_accuracy(traj, gold_kb)
        scores.update(route_counts(traj, gold_kb))
    valid, generated = output_validity(traj, step_protocol)
    scores["count/valid_outputs"], scores["count/outputs"] = float(valid), float(generated)
    scores["cost/steps"] = float(len(traj.retrieval_steps))
    scores["cost/searches"] = float(meta.get("searches", scores["cost/steps"]))
    scores["cost/gen_tokens"] = float(meta.get("completion_tokens", 0))
    scores["cost/latency_s"] = float(record.get("latency_s", 0.0))
    return scores


def step_numbers(keys: Iterable[str], prefix: str) -> list[int]:
    """The `<i>` of every `<prefix><i>` key, sorted (`routing/accuracy@step` -> [1, 2, 3])."""
    return sorted({int(k[len(prefix) :]) for k in keys if k.startswith(prefix) and k[len(prefix) :].isdigit()})


def mean_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the rows that have it (a key absent everywhere is absent); the pooled ratios of
    `RATIOS` (and `routing/accuracy@step<i>`) are sums of their counts divided, absent when no row counts any."""
    out: dict[str, float] = {"n": float(len(rows))}
    for key in ALL_KEYS:
        vals = [r[key] for r in rows if key in r and not math.isnan(r[key])]
        if vals:
            out[key] = sum(vals) / len(vals)
    ratios = dict(RATIOS)
    for i in step_numbers({k for r in rows for k in r}, "count/routes@step"):
        ratios[f"routing/accuracy@step{i}"] = (f"count/routes_to_gold@step{i}", f"count/routes@step{i}")
    for ratio, (num, den) in ratios.items():
        total = sum(r.get(den, 0.0) for r in rows)
        if total > 0:
            out[ratio] = sum(r.get(num, 0.0) for r in rows) / total
    return out


def macro_average(per_dataset: dict[str, dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over datasets (or groups) of each key (those lacking a key are left out of its mean)."""
    out: dict[str, float] = {"datasets": float(len(per_dataset))}
    present = {k for d in per_dataset.values() for k in d}
    steps = [f"routing/accuracy@step{i}" for i in step_numbers(present, "routing/accuracy@step")]
    for key in [*ALL_KEYS, *RATIOS, *steps]:
        vals = [d[key] for d in per_dataset.values() if key in d]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out
