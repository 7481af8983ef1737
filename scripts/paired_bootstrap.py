"""Paired difference of two methods on one `kbrouter eval` output, with a bootstrap standard error.

    python scripts/paired_bootstrap.py outputs/eval/scoreboard_cpu agent_grpo rag_all [--metric answer/f1_recall]

Scored the way the report scores (mean per dataset, datasets averaged into their group, groups averaged into the
macro), over the questions both methods answered. The bootstrap resamples questions within each dataset, so a
group's weight stays what the report gives it. A scoreboard of 15-30 questions a dataset moves by several points
between runs that differ only in float precision: read a difference against its standard error.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retrievers.jsonl import read_jsonl  # noqa: E402


def load_scores(out_dir: Path, metric: str) -> tuple[dict[str, str], dict[tuple[str, str], tuple[str, float]]]:
    """(dataset -> group, (method, qid) -> (dataset, score)) from an eval output folder."""
    results = json.loads((out_dir / "results.json").read_text())
    group_of = {name: d["group"] for name, d in results["datasets"].items() if not d.get("skipped")}
    scores = {}
    for row in read_jsonl(out_dir / "predictions.jsonl"):
        if row.get("error") or metric not in row["scores"]:
            continue  # failed predictions are left out of every figure, as in the report
        scores[(row["method"], row["qid"])] = (row["dataset"], float(row["scores"][metric]))
    return group_of, scores


def macro_difference(qids_by_dataset: dict[str, list[str]], diff: dict[str, float], group_of: dict[str, str]) -> float:
    per_group: dict[str, list[float]] = {}
    for ds, qids in qids_by_dataset.items():
        per_group.setdefault(group_of[ds], []).append(sum(diff[q] for q in qids) / len(qids))
    return statistics.fmean(statistics.fmean(v) for v in per_group.values())


def paired(out_dir: Path, a: str, b: str, metric: str, resamples: int = 2000, seed: int = 0) -> dict:
    group_of, scores = load_scores(out_dir, metric)
    by_ds: dict[str, list[str]] = {}
    diff = {}
    for (method, qid), (ds, x) in scores.items():
        if method == a and (b, qid) in scores and ds in group_of:
            diff[qid] = x - scores[(b, qid)][1]
            by_ds.setdefault(ds, []).append(qid)
    if not diff:
        raise SystemExit(f"no question scored by both {a!r} and {b!r} in {out_dir / 'predictions.jsonl'}")
    rng = random.Random(seed)
    boot = [
        macro_difference({ds: rng.choices(q, k=len(q)) for ds, q in by_ds.items()}, diff, group_of)
        for _ in range(resamples)
    ]
    return {"diff": macro_difference(by_ds, diff, group_of), "se": statistics.pstdev(boot), "n": len(diff)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="a `kbrouter eval` output folder (results.json, predictions.jsonl)")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--metric", default="answer/f1_recall")
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args(argv)
    r = paired(args.out_dir, args.a, args.b, args.metric, args.resamples)
    print(
        f"{args.a} - {args.b}: macro {args.metric} {100 * r['diff']:+.1f} x100, bootstrap s.e. "
        f"{100 * r['se']:.1f} ({r['diff'] / r['se'] if r['se'] else float('inf'):+.2f} s.e.), {r['n']} questions"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
