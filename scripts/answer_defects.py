"""Count the answer defects a reader shows, per method, in `kbrouter eval` predictions or `kbrouter run` trajectories.

    python scripts/answer_defects.py outputs/eval/scoreboard_cpu/predictions.jsonl [--methods agent_grpo rag_all]
    python scripts/answer_defects.py outputs/demo/trajectories.jsonl

Three defects, each a share of the answers it can apply to (an answer well formed under the grammar can still be one):
- `label`: an intermediate or final answer that names an evidence line (`text-1`, `video_clips-0`, `Wiki-1 (…)`)
  instead of what the line says;
- `question_copy`: a final answer of four words or more that is a piece of the question itself;
- `open_think`: an answer or final think that stops mid-phrase, i.e. does not end in a word that closes a sentence or
  in the answer it gives (stage 2c's targets were cut at 55 characters: "… gives the answer: Stephen").
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.metrics import normalize_answer  # noqa: E402
from retrievers.jsonl import read_jsonl  # noqa: E402


def names_evidence_line(answer: str, kbs: Iterable[str]) -> bool:
    """True when the answer cites an evidence line label (`<kb>-<rank>`) of a KB the trajectory searched."""
    low = answer.lower()
    return any(re.search(rf"(?<![\w-]){re.escape(kb.lower())}-\d", low) for kb in kbs)


def copies_question(answer: str, question: str, min_words: int = 4) -> bool:
    words = normalize_answer(answer)
    return len(words.split()) >= min_words and f" {words} " in f" {normalize_answer(question)} "


def think_is_open(think: str, answer: str) -> bool:
    """A think that neither ends a sentence nor ends with its own answer was cut (or closed) mid-phrase."""
    t = think.strip()
    if not t:
        return False
    return not (t[-1] in ".!?)\"'" or (answer.strip() and normalize_answer(t).endswith(normalize_answer(answer))))


def trajectory_defects(traj: dict) -> Counter:
    """Counts of each defect and of the answers each one was checked on, for one trajectory."""
    c: Counter = Counter()
    kbs = {h["kb"] for s in traj.get("steps", []) for h in s.get("hits", [])}
    answers = [(s.get("answer") or "", s.get("answer_think") or "") for s in traj.get("steps", []) if s.get("kb")]
    final = traj.get("final_answer") or ""
    final_think = traj.get("final_think") or ""
    for answer, think in [*answers, (final, final_think)]:
        if not answer:
            continue
        c["answers"] += 1
        c["label"] += names_evidence_line(answer, kbs)
        c["open_think"] += think_is_open(think, answer)
    if final:
        c["finals"] += 1
        c["question_copy"] += copies_question(final, traj.get("question", ""))
    return c


def defects_by_method(rows: Iterable[dict], methods: Sequence[str] | None = None) -> dict[str, Counter]:
    """`predictions.jsonl` rows (method + trajectory) or bare trajectories (method `run`)."""
    out: dict[str, Counter] = {}
    for row in rows:
        traj = row.get("trajectory", row)
        method = row.get("method", "run")
        if not isinstance(traj, dict) or (methods and method not in methods) or row.get("error"):
            continue
        out.setdefault(method, Counter()).update(trajectory_defects(traj))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="predictions.jsonl of `kbrouter eval`, or trajectories.jsonl")
    ap.add_argument("--methods", nargs="*", default=None, help="only these methods (default: all)")
    args = ap.parse_args(argv)
    if not args.path.is_file():
        raise SystemExit(f"{args.path} does not exist: pass an eval output's predictions.jsonl or a trajectories file")
    table = defects_by_method(read_jsonl(args.path), args.methods)
    print(f"{'method':<22} {'answers':>8} {'label':>12} {'open think':>12} {'finals':>7} {'question copy':>14}")
    for method, c in table.items():
        a, f = max(c["answers"], 1), max(c["finals"], 1)
        print(
            f"{method:<22} {c['answers']:>8} {c['label']:>5} {100 * c['label'] / a:>5.1f} %"
            f" {c['open_think']:>5} {100 * c['open_think'] / a:>5.1f} % {c['finals']:>7}"
            f" {c['question_copy']:>6} {100 * c['question_copy'] / f:>5.1f} %"
        )


if __name__ == "__main__":
    main()
