"""Paired difference of two methods on one `kbrouter eval` output, with a bootstrap standard error.

    python scripts/paired_bootstrap.py outputs/eval/scoreboard_cpu agent_grpo rag_all [--metric answer/f1_recall]
    python scripts/paired_bootstrap.py outputs/eval/scoreboard_cpu agent_grpo rag_all --answer-type open
    python scripts/paired_bootstrap.py outputs/eval/new agent_grpo_route agent_grpo_route --b-dir outputs/eval/old

The arithmetic is `eval.paired` (the report's macro: datasets -> groups -> mean; questions resampled within each
dataset); the report itself prints each method against its `plot_method`. This script pairs any two methods, `b`
from another output folder of the same questions with `--b-dir` (a method rerun after a change, against its predictions
from before).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.paired import paired_difference  # noqa: E402
from retrievers.jsonl import read_jsonl  # noqa: E402


def load_scores(
    out_dir: Path, metric: str, answer_type: str | None = None
) -> tuple[dict[str, str], dict[str, dict[tuple[str, str], float]]]:
    """(dataset -> group, method -> {(dataset, qid): score}) from an eval output folder.

    `answer_type` (`yesno` | `open`) keeps only those questions: a constant answer earns nothing on open ones.
    """
    results = json.loads((out_dir / "results.json").read_text())
    group_of = {name: d["group"] for name, d in results["datasets"].items() if not d.get("skipped")}
    scores: dict[str, dict[tuple[str, str], float]] = {}
    for row in read_jsonl(out_dir / "predictions.jsonl"):
        if row.get("error") or metric not in row["scores"]:
            continue  # failed predictions are left out of every figure, as in the report
        meta = (row.get("trajectory") or {}).get("metadata") or {}
        if answer_type and (meta.get("answer_type") or "open") != answer_type:  # untyped is open, as in the report
            continue
        scores.setdefault(row["method"], {})[(row["dataset"], row["qid"])] = float(row["scores"][metric])
    return group_of, scores


def paired(
    out_dir: Path,
    a: str,
    b: str,
    metric: str,
    resamples: int = 2000,
    seed: int = 0,
    answer_type: str | None = None,
    b_dir: Path | None = None,
) -> dict:
    group_of, scores = load_scores(out_dir, metric, answer_type)
    b_scores = load_scores(b_dir, metric, answer_type)[1] if b_dir else scores
    r = paired_difference(scores.get(a, {}), b_scores.get(b, {}), group_of, resamples, seed)
    if r is None:
        where = f"{out_dir} and {b_dir}" if b_dir else str(out_dir / "predictions.jsonl")
        raise SystemExit(f"no question scored by both {a!r} and {b!r} in {where}")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="a `kbrouter eval` output folder (results.json, predictions.jsonl)")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--metric", default="answer/f1_recall")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--answer-type", choices=("yesno", "open"), default=None, help="only these questions")
    ap.add_argument("--b-dir", type=Path, default=None, help="read method b from this output folder instead")
    args = ap.parse_args(argv)
    r = paired(
        args.out_dir, args.a, args.b, args.metric, args.resamples, answer_type=args.answer_type, b_dir=args.b_dir
    )
    b_name = f"{args.b} ({args.b_dir})" if args.b_dir else args.b
    z = r["diff"] / r["se"] if r["se"] else math.copysign(math.inf, r["diff"]) if r["diff"] else 0.0  # same answers: 0
    print(
        f"{args.a} - {b_name}: macro {args.metric} {100 * r['diff']:+.1f} x100, bootstrap s.e. "
        f"{100 * r['se']:.1f} ({z:+.2f} s.e.), {r['n']} questions"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
