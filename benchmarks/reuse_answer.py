"""What `agent.reuse_answer` saves: the agent with and without its final step after a search that asked the question
itself, side by side in one process on one loaded model, the two modes alternating so machine drift hits both.

The agent is the one `kbrouter run` builds from the same flags (by default the shipped router with its card's
settings, where `reuse_answer` is on). Prints per mode the median and min wall seconds of a run over all questions,
prompt and generated tokens, how many finals were reused, and each question whose final differs, with its gold.

    python benchmarks/reuse_answer.py                         # the demo's 7 questions and KBs, 3 repeats
    python benchmarks/reuse_answer.py --repeats 1 --questions data/demo/questions.jsonl --kb configs/kb/demo.yaml
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    from agent.backends.factory import make_policy
    from agent.cli import add_common_args, resolve_configs
    from agent.io import read_questions
    from agent.kbs import load_knowledge_bases
    from agent.loop import StepAgent
    from agent.metrics import f1_recall

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default=str(REPO / "data" / "demo" / "questions.jsonl"))
    ap.add_argument("--repeats", type=int, default=3)
    add_common_args(ap, kb_default=str(REPO / "configs" / "kb" / "demo.yaml"))
    args, args.overrides = ap.parse_known_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    pol_cfg, agent_cfg, kb_file = resolve_configs(args)
    questions = read_questions(args.questions)
    policy = make_policy(pol_cfg)
    kbs = load_knowledge_bases(kb_file)
    agents = {mode: StepAgent(policy, kbs, replace(agent_cfg, reuse_answer=mode)) for mode in (False, True)}
    agents[True].run(questions[:1])  # warm-up: the first generate call compiles grammars and fills caches
    walls: dict[bool, list[float]] = {False: [], True: []}
    trajs: dict[bool, list] = {}
    for _ in range(args.repeats):
        for mode, agent in agents.items():
            t0 = time.perf_counter()
            trajs[mode] = agent.run(questions, batch_size=len(questions))
            walls[mode].append(time.perf_counter() - t0)
    print(f"{len(questions)} questions from {args.questions}, {args.repeats} repeat(s), policy {policy.name}")
    print(f"{'reuse_answer':<13} {'median s':>9} {'min s':>7} {'prompt tok':>11} {'gen tok':>8} {'reused':>7}")
    for mode in (False, True):
        ts = trajs[mode]
        prompt = sum(t.metadata.get("prompt_tokens", 0) for t in ts)
        gen = sum(t.metadata.get("completion_tokens", 0) for t in ts)
        reused = sum("final_from_step" in t.metadata for t in ts)
        print(
            f"{str(mode).lower():<13} {statistics.median(walls[mode]):>9.2f} {min(walls[mode]):>7.2f} {prompt:>11} "
            f"{gen:>8} {reused:>7}"
        )
    ratio = statistics.median(walls[True]) / statistics.median(walls[False])
    print(f"wall ratio on/off (medians): {ratio:.2f}")
    for off, on in zip(trajs[False], trajs[True], strict=True):
        if off.final_answer != on.final_answer:
            gold = list(off.gold or ())
            scores = [f1_recall(a, gold).recall if gold else float("nan") for a in (off.final_answer, on.final_answer)]
            print(
                f"  {off.id}: {off.final_answer!r} ({scores[0]:.2f}) -> {on.final_answer!r} ({scores[1]:.2f}), gold {gold}"
            )


if __name__ == "__main__":
    main()
