"""Split a steps.jsonl by trajectory into a training file and a held-out file (whole trajectories, by hash).

The held-out steps score the router after each training stage (base, SFT, Step-GRPO) on prompts no stage trained
on; the split is by trajectory so no held-out step shares a question with a training step.

Run: python scripts/split_steps.py runs/synth/annotation_cpu/steps.jsonl --heldout-share 0.2 --plan-only clip_notes
(`--plan-only D`: keep only the plan steps of dataset D, whose answers must not be trained on; see
scripts/make_clip_questions.py.)

`--routing-from rejected.jsonl --kb configs/kb/eval_cpu.yaml` adds routing records: the first plan step of every
trajectory the annotation teacher built but rejection dropped (its retrieved evidence missed the gold support). That
step's target (search the dataset's own KB with the question itself) comes from the annotation, not from the
evidence, so it is right whatever the retrievers found; later steps depend on the evidence and are not used. Only
for the annotation teacher: a model teacher's rejected plans may be wrong. They are split by question like the rest.
"""

from __future__ import annotations

import argparse
import hashlib
from collections import Counter
from pathlib import Path

from retrievers.jsonl import iter_jsonl_objects


def question_of(trajectory_id: str) -> str:
    return trajectory_id.split("#", 1)[0]  # synthesis ids are `<question id>#<sample>`


def routing_records(rejected: Path, kb_file: Path) -> list[dict]:
    from agent.types import Trajectory
    from data_synthesis.records import step_records
    from retrievers.config import load_kb_configs

    kbs = load_kb_configs(kb_file)
    menu = [(kb.display_name, kb.description) for kb in kbs]
    out = []
    for _, row in iter_jsonl_objects(rejected):
        traj = Trajectory.from_dict(row["trajectory"])
        first = step_records(traj, menu, kbs)[0]
        if first["step_type"] == "plan" and first["gold"]["kb"]:
            first["metadata"] = {**first["metadata"], "routing_only": True, "rejected_for": row["reasons"]}
            out.append(first)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", help="steps.jsonl written by kbrouter synth")
    ap.add_argument("--heldout-share", type=float, default=0.2)
    ap.add_argument(
        "--plan-only",
        nargs="*",
        default=[],
        metavar="DATASET",
        help="datasets whose answer and final steps are dropped (their plan steps are kept)",
    )
    ap.add_argument("--routing-from", help="rejected.jsonl of an annotation-teacher run: add its first plan steps")
    ap.add_argument("--kb", help="the KB set of that run (its plan prompts list these KBs)")
    args = ap.parse_args()
    if args.routing_from and not args.kb:
        ap.error("--routing-from needs --kb (the KB set the synthesis run used)")
    src = Path(args.steps)
    buckets = int(round(1 / args.heldout_share))
    out = {"train": src.with_name("steps_train.jsonl"), "heldout": src.with_name("steps_heldout.jsonl")}
    counts: Counter = Counter()
    lines = {"train": [], "heldout": []}
    dropped: Counter = Counter()
    records = [rec for _, rec in iter_jsonl_objects(src)]
    if args.routing_from:
        routing = routing_records(Path(args.routing_from), Path(args.kb))
        print(f"routing records (first plan steps of rejected trajectories): {len(routing)}")
        records += routing
    for rec in records:
        if rec["step_type"] != "plan" and rec.get("metadata", {}).get("dataset") in args.plan_only:
            dropped[rec["step_type"]] += 1
            continue
        q = question_of(rec["trajectory_id"])
        side = "heldout" if int(hashlib.sha1(q.encode()).hexdigest(), 16) % buckets == 0 else "train"
        lines[side].append(rec)
        counts[(side, rec["step_type"])] += 1
    import json

    if dropped:
        print(f"dropped (--plan-only {' '.join(args.plan_only)}): {dict(dropped)}")

    for side, path in out.items():
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines[side]))
        tmp.rename(path)
        print(
            f"{path}: {len(lines[side])} records " + str({t: counts[(side, t)] for t in ("plan", "answer", "final")})
        )


if __name__ == "__main__":
    main()
