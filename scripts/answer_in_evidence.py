"""How often the evidence an answer step reads holds a gold answer, per evidence rendering: a reader-free measure of
`agent.evidence_focus` on a `kbrouter eval` output.

    python scripts/answer_in_evidence.py outputs/eval/scoreboard_cpu agent_grpo_route --chars 250

For every search step of the method's trajectories, it renders the step's hits as the answer step would under each
mode (`head`, `tables`, `all`) and counts the steps where a gold answer appears, normalised and as whole words, next to
the hits' full text (the most any rendering could show). Yes/no and number-only answers are left out: "2" is in
almost any table.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.metrics import normalize_answer, shows_answer  # noqa: E402
from agent.protocol import FOCUS_MODES, render_hits  # noqa: E402
from agent.types import Trajectory  # noqa: E402
from retrievers.jsonl import read_jsonl  # noqa: E402


def count(out_dir: Path, method: str, chars: int = 250) -> dict[str, dict[str, int]]:
    """dataset -> {"steps", "full text", and each mode of `FOCUS_MODES`: search steps whose text holds a gold answer}."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in read_jsonl(out_dir / "predictions.jsonl"):
        if row["method"] != method or row.get("error"):
            continue
        golds = [g for g in map(normalize_answer, row["gold"]) if g and g not in ("yes", "no") and not g.isdigit()]
        for step in Trajectory.from_dict(row["trajectory"]).steps if golds else ():
            if not step.hits:
                continue
            c = counts[row["dataset"]]
            c["steps"] += 1
            c["full text"] += shows_answer(" ".join(h.doc.text for h in step.hits), golds)
            for mode in FOCUS_MODES:
                c[mode] += shows_answer(render_hits(step.hits, chars, step.sub_question, mode), golds)
    if not counts:
        sys.exit(f"no search steps of {method!r} with an open gold answer in {out_dir / 'predictions.jsonl'}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, help="a `kbrouter eval` output folder (its predictions.jsonl)")
    ap.add_argument("method")
    ap.add_argument("--chars", type=int, default=250, help="evidence_chars of the rendering (the scoreboard's: 250)")
    args = ap.parse_args()
    counts = count(args.out_dir, args.method, args.chars)
    print(f"| dataset | search steps | gold in the hits' full text | {' | '.join(FOCUS_MODES)} |")
    print(f"|---|---:|---:|{'---:|' * len(FOCUS_MODES)}")
    for dataset, c in sorted(counts.items()):
        cells = " | ".join(str(c[m]) for m in FOCUS_MODES)
        print(f"| {dataset} | {c['steps']} | {c['full text']} | {cells} |")


if __name__ == "__main__":
    main()
