"""Paired difference of two methods on one `kbrouter eval` output, with a bootstrap standard error.

    python scripts/paired_bootstrap.py outputs/eval/scoreboard_cpu agent_grpo rag_all [--metric answer/f1_recall]
    python scripts/paired_bootstrap.py outputs/eval/scoreboard_cpu agent_grpo rag_all --answer-type open
    python scripts/paired_bootstrap.py outputs/eval/new agent_grpo_route agent_grpo_route --b-dir outputs/eval/old
    python scripts/paired_bootstrap.py outputs/eval/scoreboard agent_long agent_grpo_route \
        --also outputs/eval/validation outputs/eval/confirm      # each set, then pooled by inverse variance

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
    ap.add_argument("--also", type=Path, nargs="+", default=[], help="output folders of other questions, then pooled")
    args = ap.parse_args(argv)
    if args.also and args.b_dir:
        ap.error("--also pairs a and b inside each folder; it cannot be combined with --b-dir")
    r = paired(
        args.out_dir, args.a, args.b, args.metric, args.resamples, answer_type=args.answer_type, b_dir=args.b_dir
    )
    b_name = f"{args.b} ({args.b_dir})" if args.b_dir else args.b
    results = [(args.out_dir, r)]
    for out_dir in args.also:
        results.append(
            (out_dir, paired(out_dir, args.a, args.b, args.metric, args.resamples, answer_type=args.answer_type))
        )
    for out_dir, r in results:
        where = f" [{out_dir}]" if args.also else ""
        print(f"{args.a} - {b_name}: macro {args.metric} {_figure(r['diff'], r['se'])}, {r['n']} questions{where}")
    if args.also:
        pooled = pool([r for _, r in results])
        figure = _figure(pooled["diff"], pooled["se"])
        print(f"pooled over {len(results)} sets by inverse variance: {figure}, {pooled['n']} questions")
    return 0


def pool(results: list[dict]) -> dict:
    """Inverse-variance pooled difference of independent sets; a set with s.e. 0 (same answers) carries no weight."""
    weighted = [(1 / r["se"] ** 2, r) for r in results if r["se"] > 0]
    if not weighted:
        return {"diff": 0.0, "se": 0.0, "n": sum(r["n"] for r in results)}
    total = sum(w for w, _ in weighted)
    diff = sum(w * r["diff"] for w, r in weighted) / total
    return {"diff": diff, "se": math.sqrt(1 / total), "n": sum(r["n"] for r in results)}


def _figure(diff: float, se: float) -> str:
    z = diff / se if se else math.copysign(math.inf, diff) if diff else 0.0  # same answers: 0
    return f"{100 * diff:+.1f} x100, bootstrap s.e. {100 * se:.1f} ({z:+.2f} s.e.)"


if __name__ == "__main__":
    raise SystemExit(main())
