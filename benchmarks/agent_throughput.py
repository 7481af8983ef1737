"""Questions/second of the step loop: one question at a time vs all questions in lockstep batches.

Same model (SmolLM2-135M-Instruct, fp32, CPU), same KBs (the demo KB), same greedy settings, same questions
(the first N of ../shared/data/text/questions.jsonl, or the demo questions repeated when that is absent).

    python benchmarks/agent_throughput.py                 # 32 questions, max_steps 1
    python benchmarks/agent_throughput.py --n 64 --max-steps 2 --batch-size 32
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_Q = REPO.parent / "shared" / "data" / "text" / "questions.jsonl"


def load_questions(n: int):  # noqa: ANN201
    from agent.io import iter_jsonl, question_from_row

    src = SHARED_Q if SHARED_Q.exists() else REPO / "data" / "demo" / "questions.jsonl"
    rows = list(iter_jsonl(src))
    qs = [
        question_from_row({"id": r.get("id", r.get("qid")), "question": r["question"], "answers": r["answers"]})
        for r in rows
    ]
    while len(qs) < n:
        qs = qs + qs
    from dataclasses import replace

    return [replace(q, id=f"{q.id}-{i}") for i, q in enumerate(qs[:n])], src


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="questions (>= 32 for the issue's figure)")
    ap.add_argument("--max-steps", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per plan/answer/final step")
    ap.add_argument("--kb", default=str(REPO / "configs" / "kb" / "demo.yaml"))
    args = ap.parse_args(argv)

    import torch

    from agent.backends.hf import TransformersPolicy
    from agent.kbs import load_knowledge_bases
    from agent.loop import AgentConfig, StepAgent

    questions, src = load_questions(args.n)
    kbs = load_knowledge_bases(args.kb)
    policy = TransformersPolicy("smollm2", max_batch_size=args.batch_size)
    cfg = AgentConfig(
        max_steps=args.max_steps, plan_tokens=args.tokens, answer_tokens=args.tokens, final_tokens=args.tokens
    )
    agent = StepAgent(policy, kbs, cfg)
    agent.run_batch(questions[:2])  # warm-up: first-call overheads out of both timings

    print(
        f"{len(questions)} questions from {src.name}; SmolLM2-135M fp32 on {torch.get_num_threads()} threads; "
        f"max_steps={args.max_steps}, {args.tokens} new tokens max per step, greedy"
    )
    t0 = time.perf_counter()
    seq = agent.run_sequential(questions)
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    bat = agent.run(questions, batch_size=args.batch_size)
    t_bat = time.perf_counter() - t0

    def tokens(ts) -> int:  # noqa: ANN001
        return sum(t.metadata["completion_tokens"] for t in ts)

    same = sum(a.final_answer == b.final_answer for a, b in zip(seq, bat, strict=True))
    print(f"{'loop':<22}{'seconds':>10}{'questions/s':>14}{'gen tokens':>12}")
    print(f"{'sequential (1 at a time)':<22}{t_seq:>10.1f}{len(seq) / t_seq:>14.3f}{tokens(seq):>12}")
    print(f"{'lockstep batch ' + str(args.batch_size):<22}{t_bat:>10.1f}{len(bat) / t_bat:>14.3f}{tokens(bat):>12}")
    print(f"speed-up (batched / sequential): {t_seq / t_bat:.2f}x; same final answer on {same}/{len(seq)} questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
