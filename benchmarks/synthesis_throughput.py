"""Synthesis throughput: trajectories per minute with m = 4 samples per question, three ways, side by side.

- lockstep: all questions x m samples advance together in one `StepAgent.run_batch` (what `kbrouter synth` does);
- per question: one question at a time, its m samples batched together;
- one at a time: every trajectory alone (`run_sequential`, the interactive loop).

Real parts: the SmolLM2-135M-Instruct teacher (transformers, CPU here) and a BM25 KB over the context paragraphs of
the questions (from ../shared/data/text). Small by default so it runs in a few minutes on 2 cores:

    python benchmarks/synthesis_throughput.py                       # 4 questions x m=4
    python benchmarks/synthesis_throughput.py --questions 8 --max_steps 2 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", default=str(ROOT.parent / "shared" / "data" / "text"))
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--m", type=int, default=4)
    parser.add_argument("--max_steps", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24, help="max new tokens per plan/answer/final reply")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default=None)
    parser.add_argument("--few_shot", action="store_true", help="show the worked example (longer prompts)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="2+ runs the modes in A B C, C B A order and sums them, cancelling load drift",
    )
    args = parser.parse_args(argv)

    import yaml

    from agent.loop import StepAgent
    from data_synthesis.config import SynthConfig
    from data_synthesis.inputs import read_inputs
    from data_synthesis.job import agent_config, batch_seed, expand, load_kbs
    from data_synthesis.teacher import build_teacher

    shared = Path(args.shared)
    rows = [json.loads(line) for line in (shared / "questions.jsonl").read_text().splitlines()][: args.questions]
    wanted = {d for r in rows for d in r["context_doc_ids"]}
    tmp = Path(tempfile.mkdtemp(prefix="synth_bench_"))
    with (shared / "corpus.jsonl").open() as f:
        (tmp / "corpus.jsonl").write_text("".join(line for line in f if json.loads(line)["doc_id"] in wanted))
    (tmp / "kb.yaml").write_text(yaml.safe_dump({"knowledge_bases": [
        {"name": "wiki", "display_name": "Text Retriever", "kind": "text", "corpus": str(tmp / "corpus.jsonl"),
         "search": "bm25", "k": 3, "index_dir": str(tmp / "index")}]}))  # fmt: skip
    cfg = SynthConfig(
        inputs=[{"path": str(shared / "questions.jsonl"), "format": "shared_text", "limit": args.questions}],
        kb_config=str(tmp / "kb.yaml"), m=args.m, temperature=0.7, top_p=0.95, max_steps=args.max_steps,
        top_k_hits=2, few_shot=args.few_shot, plan_tokens=args.tokens, answer_tokens=args.tokens, final_tokens=args.tokens, max_retries=0,
        teacher={"model": args.model, "device": args.device, "max_batch_size": 64}, progress=False,
    )  # fmt: skip
    questions, _ = read_inputs(cfg.inputs)
    kbs = load_kbs(cfg)
    policy = build_teacher(cfg.teacher)
    agent = StepAgent(policy, kbs, agent_config(cfg, batch_seed(cfg.seed, questions[0].id)))
    agent.run_batch(expand(questions[:1], 1))  # warm-up (weights in cache, kernels compiled)

    modes = {
        "lockstep (all questions x m)": lambda: agent.run_batch(expand(questions, args.m)),
        "per question (m batched)": lambda: [t for q in questions for t in agent.run_batch(expand([q], args.m))],
        "one trajectory at a time": lambda: agent.run_sequential(expand(questions, args.m)),
    }
    print(
        f"teacher={policy.name} questions={len(questions)} m={args.m} max_steps={args.max_steps} "
        f"tokens/reply<={args.tokens} few_shot={args.few_shot} device={args.device or 'auto'} rounds={args.rounds}"
    )
    totals = {name: [0, 0.0, 0] for name in modes}  # trajectories, seconds, generated tokens
    for r in range(args.rounds):
        for name in list(modes) if r % 2 == 0 else list(reversed(modes)):
            t0 = time.perf_counter()
            trajectories = modes[name]()
            totals[name][0] += len(trajectories)
            totals[name][1] += time.perf_counter() - t0
            totals[name][2] += sum(t.metadata["completion_tokens"] for t in trajectories)
    rates = {}
    for name, (n, seconds, tokens) in totals.items():
        rates[name] = 60 * n / seconds
        print(
            f"{name:30s} {n:3d} trajectories in {seconds:7.1f} s = {rates[name]:7.2f} traj/min "
            f"({tokens / seconds:6.1f} generated tok/s)"
        )
    base = rates["one trajectory at a time"]
    print(
        f"ratio lockstep / one at a time: {rates['lockstep (all questions x m)'] / base:.2f}x; "
        f"lockstep / per question: {rates['lockstep (all questions x m)'] / rates['per question (m batched)']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
