"""Which answer should a vote keep? Scores, from the candidates one `kbrouter eval` run recorded with
`agent.answer_samples` > 1, four ways to pick a question's final answer among them:

- `first`: the first decode (what the agent answers without a vote);
- `f1`: the agent's pick, the candidate with the highest summed token F1 against the others;
- `exact`: the normalised answer most candidates wrote (ties: the earliest);
- `oracle`: the candidate that scores best against the gold (a bound no rule can pass).

A question's candidates are those of the step its final answer came from: the reused search (`final_from_step`) or
the final step (`final_votes`). Prints F1-recall and EM ×100 per dataset and macro-averaged over the groups, as the
eval report averages them.

    python scripts/vote_rules.py outputs/eval/validation_s50 agent_vote5
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from agent.metrics import exact_match, f1_recall, normalize_answer

RULES = ("first", "f1", "exact", "oracle")


def candidates(traj: dict) -> tuple[list[str | None], int] | None:
    """(the candidates, the index the agent kept) of the step the final answer came from; None without a vote."""
    meta = traj.get("metadata", {})
    if "final_from_step" in meta:
        votes = next((s.get("votes") for s in traj["steps"] if s["index"] == meta["final_from_step"]), None)
    else:
        votes = meta.get("final_votes")
    return (votes["answers"], votes["kept"]) if votes else None


def pick(rule: str, answers: list[str | None], kept: int, golds: list[str]) -> str:
    valid = [(j, a) for j, a in enumerate(answers) if a is not None]
    if rule == "first":
        return answers[0] or ""
    if rule == "f1":
        return answers[kept] or ""
    if not valid:
        return ""
    if rule == "exact":
        counts = collections.Counter(normalize_answer(a) for _, a in valid)
        return max(valid, key=lambda ja: (counts[normalize_answer(ja[1])], -ja[0]))[1]
    return max(valid, key=lambda ja: (f1_recall(ja[1], golds).recall, -ja[0]))[1]  # oracle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("method")
    args = ap.parse_args()
    scores: dict[str, dict[str, list[tuple[float, float]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    group_of, unvoted = {}, 0
    with (args.out_dir / "predictions.jsonl").open(encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["method"] != args.method:
                continue
            found = candidates(rec["trajectory"])
            if found is None:
                unvoted += 1
                continue
            golds = [str(g) for g in rec["gold"]]
            group_of[rec["dataset"]] = rec["trajectory"]["metadata"].get("group", rec["dataset"])
            for rule in RULES:
                answer = pick(rule, *found, golds)
                scores[rule][rec["dataset"]].append((f1_recall(answer, golds).recall, exact_match(answer, golds)))
    if not scores:
        raise SystemExit(
            f"no voted predictions of {args.method!r} in {args.out_dir}: run it with agent.answer_samples > 1"
        )
    datasets = sorted(group_of)
    print(
        f"{args.method} in {args.out_dir}: {sum(len(v) for v in scores['first'].values())} voted questions, {unvoted} without a vote"
    )
    print("rule    " + "".join(f"{d:>18}" for d in datasets) + "   macro F1-R   macro EM")
    for rule in RULES:
        per = {d: [sum(x) / len(x) for x in zip(*scores[rule][d], strict=True)] for d in datasets}
        groups = collections.defaultdict(list)
        for d in datasets:
            groups[group_of[d]].append(per[d])
        macro = [sum(sum(v[k] for v in g) / len(g) for g in groups.values()) / len(groups) for k in (0, 1)]
        cells = "".join(f"{100 * per[d][0]:>9.1f} / {100 * per[d][1]:>5.1f}" for d in datasets)
        print(f"{rule:<8}{cells}   {100 * macro[0]:>10.1f}   {100 * macro[1]:>8.1f}")


if __name__ == "__main__":
    main()
