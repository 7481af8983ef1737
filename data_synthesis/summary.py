"""The job summary: `summary.json` and `summary.md`, computed from the output files (so a resumed or merged job
reports the same figures as an uninterrupted one, apart from wall time).

Figures: questions asked and skipped (by reason and by dataset; rows held out by `exclude_split` are counted apart),
trajectories accepted / rejected (by reason), acceptance and rejection reasons by modality, by dataset, by
annotation kind (annotation teacher) and by number of retrieval steps, step records by type, KB usage per step (all
and accepted), stop reasons, tokens and seconds per question, trajectories per minute, and the accounting check
`accepted + rejected == asked * m`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from pathlib import Path

from retrievers.jsonl import read_jsonl

logger = logging.getLogger(__name__)


def _rate(a: int, n: int) -> float:
    return round(a / n, 4) if n else 0.0


def read_output(path: Path) -> list[dict]:
    """The records of an output file of the job (a torn last line is not one), [] when it does not exist."""
    return read_jsonl(path, log=True) if path.exists() else []


def _groups(everything: list[tuple[dict, bool]], rejected: list[dict], key: str) -> dict:
    """Accepted / rejected counts and rejection reasons per value of a trajectory metadata key."""
    out: dict[str, dict] = defaultdict(lambda: {"trajectories": 0, "accepted": 0, "rejected": 0,
                                                 "rejection_reasons": Counter()})  # fmt: skip
    for t, ok in everything:
        g = out[str(t["metadata"].get(key) or "unknown")]
        g["trajectories"] += 1
        g["accepted" if ok else "rejected"] += 1
    for r in rejected:
        out[str(r["trajectory"]["metadata"].get(key) or "unknown")]["rejection_reasons"].update(r["reasons"])
    return {k: {**v, "acceptance_rate": _rate(v["accepted"], v["trajectories"]),
                "rejection_reasons": dict(v["rejection_reasons"])} for k, v in sorted(out.items())}  # fmt: skip


def build_summary(accepted: list[dict], rejected: list[dict], skipped: list[dict], progress: list[dict],
                  m: int, steps: list[dict] | None = None) -> dict:  # fmt: skip
    """Summary figures from accepted trajectories, rejection records, skips, committed batch lines and step records."""
    from data_synthesis.inputs import HELD_OUT

    held_out = [s for s in skipped if s["reason"] == HELD_OUT]
    skipped = [s for s in skipped if s["reason"] != HELD_OUT]
    everything = [(t, True) for t in accepted] + [(r["trajectory"], False) for r in rejected]
    asked = sorted({t["metadata"]["question_id"] for t, _ in everything})
    by_dataset: dict[str, dict] = defaultdict(lambda: {"questions": set(), "trajectories": 0, "accepted": 0,
                                                        "questions_with_accepted": set()})  # fmt: skip
    by_steps: dict[int, Counter] = defaultdict(Counter)
    kb_all: dict[int, Counter] = defaultdict(Counter)
    kb_acc: dict[int, Counter] = defaultdict(Counter)
    stop = Counter()
    prompt_tokens = completion_tokens = 0
    for t, ok in everything:
        meta = t["metadata"]
        d = by_dataset[meta.get("dataset", "")]
        d["questions"].add(meta["question_id"])
        d["trajectories"] += 1
        d["accepted"] += ok
        if ok:
            d["questions_with_accepted"].add(meta["question_id"])
        retrievals = [s for s in t["steps"] if s.get("sub_question") is not None]
        by_steps[len(retrievals)]["trajectories"] += 1
        by_steps[len(retrievals)]["accepted"] += ok
        for i, s in enumerate(retrievals):
            kb_all[i][s.get("kb") or "none"] += 1
            if ok:
                kb_acc[i][s.get("kb") or "none"] += 1
        stop[t["stop_reason"]] += 1
        prompt_tokens += int(meta.get("prompt_tokens", 0))
        completion_tokens += int(meta.get("completion_tokens", 0))
    reasons = Counter(r for rec in rejected for r in rec["reasons"])
    first_reason = Counter(rec["reasons"][0] for rec in rejected if rec["reasons"])
    seconds = sum(float(p.get("seconds", 0.0)) for p in progress)
    n_q, n_t = len(asked), len(everything)
    return {
        "questions_asked": n_q,
        "m": m,
        "trajectories": n_t,
        "accepted": len(accepted),
        "rejected": len(rejected),
        "acceptance_rate": _rate(len(accepted), n_t),
        "accounted": n_t == n_q * m,
        "questions_with_accepted": sum(len(d["questions_with_accepted"]) for d in by_dataset.values()),
        "skipped": len(skipped),
        "skipped_by_reason": dict(Counter(s["reason"] for s in skipped)),
        "skipped_by_dataset": {
            d: dict(Counter(s["reason"] for s in skipped if s["dataset"] == d))
            for d in sorted({s["dataset"] for s in skipped})
        },
        "held_out_excluded": {
            "total": len(held_out),
            "by_dataset": dict(sorted(Counter(s["dataset"] for s in held_out).items())),
        },
        "by_modality": _groups(everything, rejected, "modality"),
        "by_annotation": _groups(everything, rejected, "annotation")
        if any("annotation" in t["metadata"] for t, _ in everything)
        else {},
        "step_records": {
            "total": len(steps or []),
            "by_type": dict(sorted(Counter(r["step_type"] for r in steps or []).items())),
            "by_dataset": {
                d: dict(
                    sorted(Counter(r["step_type"] for r in steps or [] if r["metadata"].get("dataset") == d).items())
                )
                for d in sorted({r["metadata"].get("dataset", "") for r in steps or []})
            },
        },
        "rejection_reasons": dict(reasons),
        "rejection_first_reason": dict(first_reason),
        "stop_reasons": dict(stop),
        "by_dataset": {
            name: {
                "questions": len(d["questions"]),
                "trajectories": d["trajectories"],
                "accepted": d["accepted"],
                "acceptance_rate": _rate(d["accepted"], d["trajectories"]),
                "questions_with_accepted": len(d["questions_with_accepted"]),
            }
            for name, d in sorted(by_dataset.items())
        },  # fmt: skip
        "by_num_steps": {
            str(k): {
                "trajectories": c["trajectories"],
                "accepted": c["accepted"],
                "acceptance_rate": _rate(c["accepted"], c["trajectories"]),
            }
            for k, c in sorted(by_steps.items())
        },  # fmt: skip
        "kb_usage_per_step": {str(i): dict(c) for i, c in sorted(kb_all.items())},
        "kb_usage_per_step_accepted": {str(i): dict(c) for i, c in sorted(kb_acc.items())},
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "per_question": round((prompt_tokens + completion_tokens) / n_q, 1) if n_q else 0.0,
        },  # fmt: skip
        "time": {
            "seconds": round(seconds, 2),
            "per_question_s": round(seconds / n_q, 3) if n_q else 0.0,
            "trajectories_per_minute": round(60 * n_t / seconds, 2) if seconds else 0.0,
        },  # fmt: skip
        "teacher_failures": sum(int(p.get("teacher_failures", 0)) for p in progress),
        "batches": len(progress),
    }


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


STEP_TYPES = ("plan", "answer", "final")


def _reasons(counts: dict) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


def summary_markdown(s: dict) -> str:
    """A readable report of `build_summary`'s figures."""
    parts = [
        "# Trajectory synthesis summary",
        "",
        f"- questions asked: {s['questions_asked']} (x m = {s['m']} samples = {s['trajectories']} trajectories; "
        f"accounted: {s['accounted']})",
        f"- accepted: {s['accepted']} ({100 * s['acceptance_rate']:.1f}%), rejected: {s['rejected']}; "
        f"questions with >= 1 accepted: {s['questions_with_accepted']}",
        f"- skipped rows: {s['skipped']} {s['skipped_by_reason'] or ''}",
        f"- held-out rows excluded (never read for training): {s['held_out_excluded']['total']} "
        f"{s['held_out_excluded']['by_dataset'] or ''}",
        f"- step records: {s['step_records']['total']} {s['step_records']['by_type'] or ''}",
        f"- tokens per question: {s['tokens']['per_question']}; seconds per question: {s['time']['per_question_s']}; "
        f"trajectories/minute: {s['time']['trajectories_per_minute']}; teacher failures retried: "
        f"{s['teacher_failures']}",
        "",
        "## Acceptance by dataset",
        _table(["dataset", "questions", "trajectories", "accepted", "rate", "questions with accepted"],
               [[k, v["questions"], v["trajectories"], v["accepted"], f"{100 * v['acceptance_rate']:.1f}%",
                 v["questions_with_accepted"]] for k, v in s["by_dataset"].items()]),
        "",
        "## Accepted and rejected by modality",
        _table(["modality", "trajectories", "accepted", "rejected", "rate", "rejection reasons"],
               [[k, v["trajectories"], v["accepted"], v["rejected"], f"{100 * v['acceptance_rate']:.1f}%",
                 _reasons(v["rejection_reasons"])] for k, v in s["by_modality"].items()]),
        "",
        *([
            "## Accepted and rejected by annotation kind",
            _table(["kind", "trajectories", "accepted", "rejected", "rate", "rejection reasons"],
                   [[k, v["trajectories"], v["accepted"], v["rejected"], f"{100 * v['acceptance_rate']:.1f}%",
                     _reasons(v["rejection_reasons"])] for k, v in s["by_annotation"].items()]),
            "",
        ] if s["by_annotation"] else []),
        "## Skipped rows by dataset",
        _table(["dataset", "reasons"], [[k, _reasons(v)] for k, v in s["skipped_by_dataset"].items()]),
        "",
        "## Step records by type and dataset",
        _table(["dataset", *STEP_TYPES], [[d, *(c.get(t, 0) for t in STEP_TYPES)]
                                          for d, c in s["step_records"]["by_dataset"].items()]),
        "",
        "## Acceptance by number of retrieval steps",
        _table(["steps", "trajectories", "accepted", "rate"],
               [[k, v["trajectories"], v["accepted"], f"{100 * v['acceptance_rate']:.1f}%"]
                for k, v in s["by_num_steps"].items()]),
        "",
        "## Rejection reasons (a trajectory may have several)",
        _table(["reason", "trajectories"], sorted(s["rejection_reasons"].items(), key=lambda kv: -kv[1])),
        "",
        "## KB usage per step (all trajectories / accepted)",
        _table(["step", "KB", "all", "accepted"],
               [[int(i) + 1, kb, n, s["kb_usage_per_step_accepted"].get(i, {}).get(kb, 0)]
                for i, c in s["kb_usage_per_step"].items() for kb, n in sorted(c.items())]),
        "",
        "## Stop reasons",
        _table(["stop_reason", "trajectories"], sorted(s["stop_reasons"].items())),
        "",
    ]  # fmt: skip
    return "\n".join(parts)


def finalize(folder: Path, m: int, export_format: str = "parquet") -> dict:
    """Write `summary.json`, `summary.md` and the `datasets` export of an output folder; returns the summary."""
    from data_synthesis.commit_log import PROGRESS, SKIPPED, atomic_write
    from data_synthesis.records import export_dataset

    folder = Path(folder)
    accepted = read_output(folder / "trajectories.jsonl")
    rejected = read_output(folder / "rejected.jsonl")
    steps = read_output(folder / "steps.jsonl")
    summary = build_summary(
        accepted, rejected, read_output(folder / SKIPPED), read_output(folder / PROGRESS), m, steps
    )
    atomic_write(folder / "summary.json", json.dumps(summary, indent=2))
    atomic_write(folder / "summary.md", summary_markdown(summary))
    export_dataset(accepted, steps, folder, export_format)
    logger.info("summary: %d/%d trajectories accepted (%.1f%%) over %d questions -> %s", summary["accepted"],
                summary["trajectories"], 100 * summary["acceptance_rate"], summary["questions_asked"], folder)  # fmt: skip
    return summary
