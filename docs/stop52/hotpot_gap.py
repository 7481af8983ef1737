"""Stop 52: why agent_mix loses HotpotQA to agent_grpo_route, from the stored scoreboard predictions alone.

Reads docs/stop51/scoreboard_cache.jsonl.gz (no model, no retrieval), scores each prediction with the repo's own
`eval.scoring.score_prediction` (which calls `agent.metrics.f1_recall`), and re-renders each step's evidence with
`agent.protocol.prompts.render_hits` at the recorded render settings to know what the answer step was shown.

Run:  source .venv/bin/activate && python docs/stop52/hotpot_gap.py [--json outputs/hotpot_gap.json]
Writes docs/stop52/hotpot_gap.md (the tables and examples; the conclusions are the CONCLUSIONS block below).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


from agent.metrics import normalize_answer, token_f1  # noqa: E402
from agent.protocol.prompts import render_hits  # noqa: E402
from agent.types import Trajectory  # noqa: E402
from eval.scoring import answer_scores, score_prediction, yes_no  # noqa: E402

CACHE = ROOT / "docs/stop51/scoreboard_cache.jsonl.gz"
OUT = ROOT / "docs/stop52/hotpot_gap.md"
DATASET = "hotpotqa"
A, B = "agent_grpo_route", "agent_mix"  # shipped router, cheap data-mix chain
METHODS = (A, B, "rag_all")
KB_NAMES = ("wiki", "tabfact", "wtq", "coco_captions", "video_clips")
CAUSES = {
    "a": "(a) different KB routing",
    "b": "(b) different number of hops",
    "c": "(c) same hits in the same order, different answer (answer-step quality)",
    "d": "(d) same KB and hops, different hits or hit order (sub-question wording)",
    "e": "(e) other",
}


def load() -> dict[str, dict[str, dict]]:
    """{method: {qid: record}} for DATASET; a later record of the same key wins (as `eval.cache.read_cache`)."""
    by: dict[str, dict[str, dict]] = defaultdict(dict)
    with gzip.open(CACHE, "rt") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if r["dataset"] == DATASET:
                    by[r["method"]][r["qid"]] = r
    return by


def contains(text: str, golds: list[str]) -> bool:
    """Case-insensitive substring test of any gold answer string (raw lower-case, and SQuAD-normalised)."""
    low, norm = text.lower(), normalize_answer(text)
    return any(g.lower() in low or (normalize_answer(g) and normalize_answer(g) in norm) for g in golds)


def describe(record: dict) -> dict:
    traj = Trajectory.from_dict(record["trajectory"])
    meta = traj.metadata
    render = meta.get("render") or {}
    golds = list(traj.gold or [])
    yesno_q = meta.get("answer_type") == "yesno"
    sc = score_prediction(record, KB_NAMES, routes=True, retrieves=True, step_protocol=True)
    steps = []
    for s in traj.retrieval_steps:
        shown = render_hits(
            s.hits, render.get("evidence_chars", 250), s.sub_question, render.get("evidence_focus", "all")
        )
        full = "\n".join(h.doc.text for h in s.hits)
        steps.append(
            {
                "i": s.index,
                "sub_question": s.sub_question,
                "kb": s.kb,
                "hit_ids": [str(h.doc.metadata.get("doc_id", h.doc.id)) for h in s.hits],
                "hit_titles": [h.doc.title for h in s.hits],
                "gold_in_hits": None if yesno_q else contains(full, golds),
                "gold_in_shown": None if yesno_q else contains(shown, golds),
                "shown": shown,
                "answer": s.answer,
                "answer_f1r": answer_scores(s.answer, golds, meta.get("answer_type", "open")).get(
                    "answer/f1_recall", 0.0
                ),
                "think": s.think,
                "answer_think": s.answer_think,
            }
        )
    all_ids = {i for st in steps for i in st["hit_ids"]}
    gold_ev = list(meta.get("gold_evidence") or [])
    return {
        "qid": traj.id,
        "question": traj.question,
        "gold": golds,
        "answer_type": meta.get("answer_type", "open"),
        "final": traj.final_answer,
        "final_think": traj.final_think,
        "final_from_step": meta.get("final_from_step"),
        "stop_reason": traj.stop_reason,
        "f1r": sc.get("answer/f1_recall", 0.0),
        "em": sc.get("answer/em", 0.0),
        "acc": sc.get("answer/acc", 0.0),
        "recall_at_k": sc.get("retrieval/recall@k"),
        "n_steps": len(traj.retrieval_steps),
        "searches": int(sc.get("cost/searches", 0)),
        "kbs": [st["kb"] for st in steps],
        "steps": steps,
        "hit_ids": sorted(all_ids),
        "gold_ev_found": sum(g in all_ids for g in gold_ev),
        "gold_ev_n": len(gold_ev),
        "gold_in_hits": None if yesno_q else any(st["gold_in_hits"] for st in steps),
        "gold_in_shown": None if yesno_q else any(st["gold_in_shown"] for st in steps),
        "words": len(traj.final_answer.split()),
        "source": answer_source(traj.question, traj.final_answer, steps),
        "qtype": "yes/no" if yesno_q else ("A-or-B" if comparison_options(traj.question, golds) else "other open"),
        "pick": comparison_pick(traj.question, traj.final_answer, golds) if not yesno_q else None,
        "first_f1r": steps[0]["answer_f1r"] if steps else 0.0,
        "final_is_last_step": bool(steps)
        and normalize_answer(traj.final_answer) == normalize_answer(steps[-1]["answer"]),
        "yesno": yes_no(traj.final_answer),
        "model": meta.get("model"),
        "render": render,
    }


def comparison_options(question: str, golds: list[str]) -> tuple[str, str] | None:
    """The two candidates of an "A or B" question: the comma-delimited clause holding ` or `, split there; only when
    a gold answer matches one of them (token F1 > 0.5 with a candidate or with its last words)."""
    for clause in " ".join(question.split()).rstrip("?").split(","):
        if " or " in clause:
            a, b = (x.strip() for x in clause.split(" or ", 1))
            if any(_match(g, a) > 0.5 or _match(g, b) > 0.5 for g in golds):
                return a, b
    return None


def _match(answer: str, option: str) -> float:
    """Token F1 of `answer` with `option` or with its last words (`Did X sing with Hellogoodbye` -> `Hellogoodbye`)."""
    tail = " ".join(option.split()[-max(1, len(answer.split())) :])
    return max(token_f1(answer, [option]), token_f1(answer, [tail]))


def comparison_pick(question: str, answer: str, golds: list[str]) -> str | None:
    """For a two-candidate question: `gold` / `other` candidate picked (token F1 > 0.5 with it), `neither`; else None."""
    opts = comparison_options(question, golds)
    if not opts:
        return None
    gold_i = max((0, 1), key=lambda i: max(_match(g, opts[i]) for g in golds))
    scores = [_match(answer, o) for o in opts]
    if max(scores) <= 0.5:
        return "neither"
    if min(scores) > 0.5 and scores[0] == scores[1]:
        return "both"
    return "gold" if scores.index(max(scores)) == gold_i else "other"


def answer_source(question: str, answer: str, steps: list[dict]) -> dict[str, bool]:
    """Where the final answer's words can be found: the question, the shown evidence, a hit title (normalised)."""
    a = normalize_answer(answer)
    shown = normalize_answer(" ".join(s["shown"] for s in steps))
    titles = {normalize_answer(t or "") for s in steps for t in s["hit_titles"]}
    in_q = bool(a) and f" {a} " in f" {normalize_answer(question)} "  # whole words only (`lys` is not in `lilys`)
    in_ev = bool(a) and f" {a} " in f" {shown} "
    yn_answer = yes_no(answer) is not None and len(a.split()) == 1  # a bare yes/no is in no passage by nature
    return {
        "in_question": in_q,
        "in_evidence": in_ev,
        "is_title": a in titles,
        "nowhere": bool(a) and not (in_q or in_ev or yn_answer),
    }


def classify(a: dict, b: dict) -> str:
    if a["kbs"] != b["kbs"] and set(a["kbs"]) != set(b["kbs"]):
        return "a"
    if a["n_steps"] != b["n_steps"]:
        return "b"
    if [st["hit_ids"] for st in a["steps"]] == [st["hit_ids"] for st in b["steps"]]:
        return "c"
    if a["kbs"] == b["kbs"]:
        return "d"
    return "e"


def gold_before_both(a: dict, b: dict) -> bool:
    """Both readers were shown the gold: the gold string in the shown evidence (open questions), or every gold
    supporting doc among the hits (yes/no questions, whose gold string is not in any passage)."""
    if a["answer_type"] == "yesno":
        return all(x["gold_ev_found"] == x["gold_ev_n"] > 0 for x in (a, b))
    return bool(a["gold_in_shown"] and b["gold_in_shown"])


def trunc(text: str | None, n: int = 200) -> str:
    text = " ".join(str(text or "").split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None, help="also dump the per-question rows here")
    args = ap.parse_args()
    by = load()
    qids = sorted(by[A])
    assert set(by[B]) == set(qids) == set(by["rag_all"]), "methods cover different questions"
    rows = {m: {q: describe(by[m][q]) for q in qids} for m in METHODS}
    n = len(qids)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))

    L: list[str] = []
    L.append("# Stop 52: why `agent_mix` loses HotpotQA to the shipped router (from stored predictions only)\n")
    L.append(
        f"Source: `{CACHE.relative_to(ROOT)}` ({n} HotpotQA questions, methods {', '.join(METHODS)}). "
        "Produced by `docs/stop52/hotpot_gap.py`; no model or retriever was run. F1-recall is the repo's own "
        "(`eval.scoring.score_prediction` -> `agent.metrics.f1_recall`, gold from the cached trajectory).\n"
    )
    L.append("**Measured** = counted from the cache records. **Inferred** = my reading of those counts (marked).\n")

    # --- headline
    L.append("## 1. Per-method figures over all 25 questions (measured)\n")
    L.append(
        "| method | model (cache) | F1-R | EM | Acc | mean answer words | median words | final yes/no (of 25) | "
        "yes/no right (of yes/no qs) | gold string in hits (open qs) | gold string in shown evidence (open qs) | "
        "gold docs found (R@k) | steps/q |"
    )
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    n_yn = sum(rows[A][q]["answer_type"] == "yesno" for q in qids)
    n_open = n - n_yn
    for m in METHODS:
        r = [rows[m][q] for q in qids]
        words = sorted(x["words"] for x in r)
        yn_right = sum(x["acc"] for x in r if x["answer_type"] == "yesno")
        L.append(
            f"| {m} | {r[0]['model']} | {pct(sum(x['f1r'] for x in r) / n)} | {pct(sum(x['em'] for x in r) / n)} | "
            f"{pct(sum(x['acc'] for x in r) / n)} | {sum(words) / n:.2f} | {words[n // 2]} | "
            f"{sum(x['yesno'] is not None for x in r)} | {yn_right:.0f}/{n_yn} | "
            f"{sum(bool(x['gold_in_hits']) for x in r if x['answer_type'] != 'yesno')}/{n_open} | "
            f"{sum(bool(x['gold_in_shown']) for x in r if x['answer_type'] != 'yesno')}/{n_open} | "
            f"{pct(sum(x['recall_at_k'] or 0 for x in r) / n)} | {sum(x['n_steps'] for x in r) / n:.2f} |"
        )
    L.append("")
    L.append(
        f'The set has {n_yn} yes/no questions and {n_open} open ones. "Gold string in hits" is a case-insensitive '
        'substring test of a gold answer in the full text of the retrieved hits (all steps); "shown" applies '
        "the same test to the evidence as the answer step saw it (re-rendered with `render_hits` at the "
        'recorded `evidence_chars` 250 / `evidence_focus`); it is not defined for yes/no golds (rag_all records no render settings: its "shown" uses 250 characters with '
        "the default focus, an approximation). R@k = share of "
        "the gold supporting docs among the hits (the report's column).\n"
    )

    # --- per-question table
    L.append("## 2. Per question (measured)\n")
    L.append(
        f"Δ = F1-R({A}) − F1-R({B}). Hop = retrieval steps; KB per step; G = gold string in shown evidence "
        "(y/n, – for yes/no questions); ev = gold docs found / gold docs.\n"
    )
    L.append(
        f"| # | question | gold | {A} answer | F1-R | hops/KB | G | ev | {B} answer | F1-R | hops/KB | G | ev | "
        "same hits | Δ | cause |"
    )
    L.append("|---:|---|---|---|---:|---|:-:|:-:|---|---:|---|:-:|:-:|:-:|---:|---|")
    causes: dict[str, list[tuple[str, float]]] = defaultdict(list)
    yn = {True: "y", False: "n", None: "–"}
    for k, q in enumerate(qids, 1):
        a, b = rows[A][q], rows[B][q]
        delta = a["f1r"] - b["f1r"]
        cause = classify(a, b) if abs(delta) > 1e-9 else ""
        if cause:
            causes[cause].append((q, delta))
        L.append(
            f"| {k} | {trunc(a['question'], 90)} | {trunc('; '.join(a['gold']), 40)} | {trunc(a['final'], 60)} | "
            f"{pct(a['f1r'])} | {a['n_steps']}/{','.join(a['kbs'])} | {yn[a['gold_in_shown']]} | "
            f"{a['gold_ev_found']}/{a['gold_ev_n']} | {trunc(b['final'], 60)} | {pct(b['f1r'])} | "
            f"{b['n_steps']}/{','.join(b['kbs'])} | {yn[b['gold_in_shown']]} | {b['gold_ev_found']}/{b['gold_ev_n']} | "
            f"{'y' if a['hit_ids'] == b['hit_ids'] else 'n'} | {pct(delta)} | {cause} |"
        )
    L.append("")

    # --- causes
    L.append("## 3. Causes of the questions where the two F1-recalls differ (measured classification)\n")
    L.append(
        "Rule, first match wins: (a) the sets of KBs searched differ; (b) the number of retrieval steps "
        "differs; (c) identical retrieved doc ids in the same order at every step (the answer step saw the "
        "same evidence); (d) same KBs and hops but different doc ids or a different hit order (the sub-question "
        "wording differed: the retrieval query is the sub-question); (e) anything else. Points = summed "
        f"per-question Δ / {n} × 100 (positive = favours {A}).\n"
    )
    L.append(
        "| cause | questions | A better / B better | points (net) | points for A | points for B | "
        "gold shown to both readers | questions if hit order is ignored |"
    )
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    loose = Counter()
    for c, items in causes.items():
        for q, _ in items:
            a, b = rows[A][q], rows[B][q]
            loose["c" if c in "cd" and a["hit_ids"] == b["hit_ids"] else c] += 1
    tot = 0.0
    for c, label in CAUSES.items():
        items = causes.get(c, [])
        pos = sum(d for _, d in items if d > 0)
        neg = sum(d for _, d in items if d < 0)
        tot += pos + neg
        L.append(
            f"| {label} | {len(items)} | {sum(d > 0 for _, d in items)} / {sum(d < 0 for _, d in items)} | "
            f"{100 * (pos + neg) / n:+.1f} | {100 * pos / n:+.1f} | {100 * neg / n:+.1f} | "
            f"{sum(gold_before_both(rows[A][q], rows[B][q]) for q, _ in items)}/{len(items)} | {loose[c]} |"
        )
    n_diff = sum(len(v) for v in causes.values())
    n_both = sum(gold_before_both(rows[A][q], rows[B][q]) for v in causes.values() for q, _ in v)
    L.append(f"| **all** | **{n_diff}** | | **{100 * tot / n:+.1f}** | | | **{n_both}/{n_diff}** | |")
    L.append("")
    L.append(
        "'Gold shown to both' uses the final shown evidence of every step; for (b) the extra hop's evidence "
        "counts too. A = " + A + ", B = " + B + "."
    )
    L.append("")

    # sub-split of (c): answer-form facts per question
    L.append("### The differing questions one by one (columns measured; the 'reading' column is inferred)\n")
    L.append(
        f"| # | cause | type | gold | {A} final | F1-R | {B} final | F1-R | Δ | same sub-q | reading (inferred) |"
    )
    L.append("|---:|:-:|---|---|---|---:|---|---:|---:|:-:|---|")
    for c in CAUSES:
        for q, d in causes.get(c, []):
            a, b = rows[A][q], rows[B][q]
            same_sq = [x["sub_question"] for x in a["steps"]] == [x["sub_question"] for x in b["steps"]]
            L.append(
                f"| {qids.index(q) + 1} | {c} | {a['qtype']} | {trunc('; '.join(a['gold']), 30)} | "
                f"{trunc(a['final'], 50)} | {pct(a['f1r'])} | {trunc(b['final'], 50)} | {pct(b['f1r'])} | "
                f"{pct(d):>6} | {'y' if same_sq else 'n'} | {NOTES.get(q, '')} |"
            )
    L.append("")

    # --- rag_all reference
    L.append("## 4. Agreement and reference (measured)\n")
    same_hits = sum(rows[A][q]["hit_ids"] == rows[B][q]["hit_ids"] for q in qids)
    same_sub = sum(
        [s["sub_question"] for s in rows[A][q]["steps"]] == [s["sub_question"] for s in rows[B][q]["steps"]]
        for q in qids
    )
    sub_is_q = {
        m: sum(
            all(s["sub_question"].strip() == rows[m][q]["question"].strip() for s in rows[m][q]["steps"][:1])
            for q in qids
        )
        for m in (A, B)
    }
    same_final = sum(normalize_answer(rows[A][q]["final"]) == normalize_answer(rows[B][q]["final"]) for q in qids)
    stop = {m: Counter(rows[m][q]["stop_reason"] for q in qids) for m in (A, B)}
    L.append(
        f"- identical sub-question sequence: {same_sub}/{n}; identical retrieved doc ids: {same_hits}/{n}; "
        f"identical normalised final answer: {same_final}/{n}"
    )
    L.append(f"- first sub-question = the question verbatim: {A} {sub_is_q[A]}/{n}, {B} {sub_is_q[B]}/{n}")
    L.append(f"- stop reasons: {A} {dict(stop[A])}; {B} {dict(stop[B])}")
    ffs = {m: Counter(str(rows[m][q]["final_from_step"]) for q in qids) for m in (A, B)}
    L.append(
        f"- final answer reused from a step's answer (`final_from_step`, None = a final step was generated): "
        f"{A} {dict(ffs[A])}; {B} {dict(ffs[B])}"
    )
    wins = Counter((rows[A][q]["f1r"] > rows[B][q]["f1r"]) - (rows[A][q]["f1r"] < rows[B][q]["f1r"]) for q in qids)
    L.append(f"- per question: {A} better {wins[1]}, {B} better {wins[-1]}, tie {wins[0]}")
    L.append("")

    # --- by question type
    L.append("## 5. By question type (measured; type from the question text, heuristic)\n")
    L.append(
        "A-or-B = the question names two candidates and a gold matches one of them; yes/no = the dataset's "
        "answer type; other open = the rest (bridge questions: a person, a country, a colour, a count...).\n"
    )
    L.append(
        f"| type | questions | F1-R {A} | F1-R {B} | gap points (of the 25-question mean) | {A} better / {B} better |"
    )
    L.append("|---|---:|---:|---:|---:|---:|")
    for t in ("A-or-B", "yes/no", "other open"):
        qs = [q for q in qids if rows[A][q]["qtype"] == t]
        fa, fb = (sum(rows[m][q]["f1r"] for q in qs) for m in (A, B))
        L.append(
            f"| {t} | {len(qs)} | {pct(fa / len(qs))} | {pct(fb / len(qs))} | {100 * (fa - fb) / n:+.1f} | "
            f"{sum(rows[A][q]['f1r'] > rows[B][q]['f1r'] for q in qs)} / "
            f"{sum(rows[A][q]['f1r'] < rows[B][q]['f1r'] for q in qs)} |"
        )
    L.append("")
    L.append(
        "A-or-B questions: which candidate the final answer names (token F1 > 0.5 with it; `both` = a hedge "
        "naming both, `neither` = garbled or another string).\n"
    )
    L.append("| method | gold candidate | other candidate | both | neither |")
    L.append("|---|---:|---:|---:|---:|")
    for m in (A, B):
        c = Counter(rows[m][q]["pick"] for q in qids if rows[m][q]["qtype"] == "A-or-B")
        L.append(f"| {m} | {c['gold']} | {c['other']} | {c['both']} | {c['neither']} |")
    L.append("")
    L.append(
        "Where the final answer's words are found (normalised substring; over all 25; not exclusive). "
        "'nowhere' = a non-yes/no answer found as whole words neither in the question nor in the shown "
        "evidence (a garbled or reworded copy, or invented). "
        "First-step F1-R = the step-1 intermediate answer scored against the gold, the same reader on (mostly) "
        "the same evidence.\n"
    )
    L.append(
        "| method | in question | in shown evidence | = a hit title | nowhere | final = last step's answer | "
        "first-step answer F1-R | first-step F1-R where both methods' step-1 hits are identical |"
    )
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    same0 = [
        q
        for q in qids
        if rows[A][q]["steps"]
        and rows[B][q]["steps"]
        and rows[A][q]["steps"][0]["hit_ids"] == rows[B][q]["steps"][0]["hit_ids"]
    ]
    for m in (A, B):
        r = [rows[m][q] for q in qids]
        src = Counter(k for x in r for k, v in x["source"].items() if v)
        L.append(
            f"| {m} | {src['in_question']} | {src['in_evidence']} | {src['is_title']} | {src['nowhere']} | "
            f"{sum(x['final_is_last_step'] for x in r)}/{n} | {pct(sum(x['first_f1r'] for x in r) / n)} | "
            f"{pct(sum(rows[m][q]['first_f1r'] for q in same0) / len(same0))} (n={len(same0)}, same order) |"
        )
    L.append("")

    # --- examples
    L.append("## 6. Examples side by side (measured; text truncated to ~200 chars)\n")
    for q in EXAMPLES:
        if q not in rows[A]:
            continue
        k = qids.index(q) + 1
        L.append(f"### #{k} `{q}`\n")
        L.append(
            f"**Q:** {trunc(rows[A][q]['question'], 300)}  \n**Gold:** {'; '.join(rows[A][q]['gold'])}  "
            f"(type {rows[A][q]['answer_type']})\n"
        )
        for m in (A, B):
            r = rows[m][q]
            L.append(f"**{m}** — F1-R {pct(r['f1r'])}, stop `{r['stop_reason']}`, final: *{trunc(r['final'])}*\n")
            for s in r["steps"]:
                L.append(
                    f"- step {s['i'] + 1} → `{s['kb']}` | sub-q: {trunc(s['sub_question'])} | hits: "
                    f"{trunc('; '.join(s['hit_titles']), 120)} | gold in shown: {yn[s['gold_in_shown']]} | "
                    f"answer-think: {trunc(s['answer_think'])} | answer: **{trunc(s['answer'])}**"
                )
            if r["final_from_step"] is None and r["final_think"]:
                L.append(f"- final think: {trunc(r['final_think'])}")
            L.append("")
    L.append(CONCLUSIONS)
    OUT.write_text("\n".join(L) + "\n")
    sys.stdout.write(f"wrote {OUT}\n")
    for c in CAUSES:
        items = causes.get(c, [])
        sys.stdout.write(f"{c} {len(items)} {100 * sum(d for _, d in items) / n:+.1f}\n")


# ---- hand-written after reading the rows above (inferred), keyed by qid
NOTES: dict[str, str] = {
    "hotpotqa-dev-5a77321355429972597f1493": "A's step 1 already answered wrong (`American Scary (Tonight)`, F1-R 0); "
    "its 2nd plan degenerated into repeated KB names and hit max_steps. B named the gold candidate at step 1. The "
    "extra hop did not cost A a right answer",
    "hotpotqa-dev-5a7652435542992d0ec060a5": "same prompt evidence, gold entity is hit 0; B's answer-think cites wiki-0 "
    "(Tchaikovsky) then answers the other candidate",
    "hotpotqa-dev-5a84cf175542992a431d1aa2": "same evidence; A garbled a copy of the wrong candidate (`Lys` for Lilys); B "
    "named the gold candidate",
    "hotpotqa-dev-5a8b544855429950cd6afcae": "same evidence; B named the other candidate (which no hit is about)",
    "hotpotqa-dev-5abe19895542991f661060c2": "same hits (B's sub-q only lower-cased); B answered the prefecture named in "
    "hit 0 (Jingmen), not the country asked: wrong answer type",
    "hotpotqa-dev-5a7199725542994082a3e88f": "different junk tails on the sub-q re-ordered the same 3 hits; A picked the "
    "other candidate (its hit 0), B a misspelt copy of the gold (`Highroads`, half recall)",
    "hotpotqa-dev-5ab69c25554299110f219a39": "gold doc is hit 0 for both; B's sub-q was cut at `album \"Old and ?` and the "
    "reader copied that fragment; A rewrote a short bridge sub-q and copied the name",
    "hotpotqa-dev-5ae518ae5542993aec5ec13c": "both found both gold docs; B rewrote the sub-q as `What is the meaning "
    "of ...`, its step answered an entity, its final step then said `Yes`; A kept the yes/no form",
    "hotpotqa-dev-5ae7e1fc55429952e35ea9cc": "hit 0 is Oranjegekte for both; B copied a garbled form of the title "
    "(`Oranjekt`) instead of the colour: wrong answer type",
}
EXAMPLES: list[str] = [
    "hotpotqa-dev-5a7652435542992d0ec060a5",  # (c) same evidence, wrong candidate
    "hotpotqa-dev-5ab69c25554299110f219a39",  # (d) truncated sub-question copied into the answer
    "hotpotqa-dev-5ae518ae5542993aec5ec13c",  # (d) yes/no question reworded into an open one
    "hotpotqa-dev-5a77321355429972597f1493",  # (b) the shipped router's degenerate second hop (agent_mix wins)
]
CONCLUSIONS = """## 7. Conclusions

- **Routing and retrieval explain none of the gap (measured).** Both methods send every HotpotQA retrieval step to
  `wiki` (the gold KB; Route 100 for both), find the gold docs about equally (R@k 78.0 vs 76.0), show the gold answer
  string to the reader on the same 17 of 21 open questions, and in **all 9 questions whose F1-recall differs the gold
  was in front of both readers** (the string in the shown evidence, or both gold docs for the yes/no one). Cause (a)
  has 0 questions.
- **The 14.0 points are 9 questions: the shipped router wins 6 (+24.0), agent_mix wins 3 (−10.0) (measured).**
  By the brief's causes: (c) identical hits in identical order, different answer: 4 questions, +8.0 net; (d) same
  KB and hop count, different hits or hit order from a differently worded sub-question: 4 questions, +10.0 net;
  (b) hop count: 1 question, −4.0 (the shipped router's degenerate 2nd hop, on a question its 1st step already got
  wrong). Ignoring hit order, (c) would hold 6 questions and (d) 2. Either way the difference is in what the model
  writes (answer step, and the sub-question the answer step reads), not in what the retriever can find.
- **Comparison questions are a wash; the gap is on bridge and yes/no questions (measured).** On the 10 "A or B"
  questions agent_mix is slightly ahead (35.0 vs 30.0, −2.0 points; both name the wrong candidate 4-5 times of 10).
  On the 11 other open questions the shipped router leads 45.5 vs 18.2 (+12.0 points, 3 wins / 0 losses) and on the
  4 yes/no questions 75 vs 50 (+4.0, 1 / 0). *Inferred:* in those 4 losses agent_mix returns a related string of the
  wrong type (the prefecture `Jingmen` for a country, a garbled title `Oranjekt` for a colour, a fragment of the
  sub-question `Old and ?` for a person, an entity then `Yes` for a yes/no question) where the shipped router returns
  the asked type.
- **Sub-question wording acts through the reader, not the retriever (inferred from the prompt code and the rows).**
  The answer step sees only the sub-question and its evidence, never the original question (`answer_messages` in
  `agent/protocol/prompts.py`). agent_mix's harmful rewrites (#16 cut at `album "Old and ?`, #24 `What is the
  meaning of ...`, #5 a candidate replaced by `Text Retriever`) changed the question the reader answered; the shipped
  router's sub-questions also carry junk tails (`urn:hlb-cr:cr-t-t-t...`, #1, #25) but kept the question's form.
  Both copy the question verbatim as their first sub-question on 16 of 25.
- **Not verbosity or answer form in general (measured).** Mean final answer length 2.84 words (shipped) vs 1.92
  (agent_mix), but the median is 2 for both and the shipped mean is inflated by two degenerate outputs that score 0
  (#3, #5). EM tracks F1-recall (36.0 vs 28.0). Each method answers yes/no on 4 questions (right 3/4 vs 2/4).
  `rag_all`'s 46.7 comes with 23.1-word answers and EM 0.0: F1-recall rewards long answers, so it is no sign of better
  reading.
- **Both readers are weak and the gap is small in questions (measured / inferred).** On the 19 questions whose step-1
  hits are identical in identical order, step-1 answer F1-R is 36.8 vs 31.6 (one net question); 7 (shipped) and 5
  (agent_mix) non-yes/no final answers appear as whole words neither in the question nor in the shown evidence
  (garbled or recombined copies such as `Lys`, `Oranjekt`, `Texas Highroads`, `Moche Rip Curl Pro Portugal 2016`).
  agent_mix's final answer is a whole-word copy of part of the question on 11 of 25 against 6 of 25. *Inferred:* 6 wins against 3 is a two-sided sign-test p ≈ 0.51; on 25 questions
  this is a difference in answer-step behaviour on a handful of bridge/yes-no questions, not a measured systematic
  deficit. More questions of the bridge and yes/no types (e.g. the validation part) would be needed to confirm it.
- **Not covered (not measured).** The earlier cheap chains' HotpotQA runs (22.0, 26.0) are not in this cache, so
  whether they fail the same way is unknown. What in agent_mix's training (data version, dropout, chain length; see
  `docs/stop52/plan.md`) causes the answer-type errors cannot be read from predictions.
"""

if __name__ == "__main__":
    main()
