"""Cost of constrained decoding: tokens/s with and without the step grammar, same prompts, same model, one run.

Both sides generate the same plan and answer prompts (the agent's own, over the demo KBs) in the same batches; the
constrained side adds xgrammar's logits processor over the step grammar. Greedy decoding, so the only difference is
the grammar mask. Prints generated tokens/s per side, their ratio, the grammar compile time, and how many outputs
parse on each side.

    python benchmarks/constrained_decoding.py                 # SmolLM2-135M-Instruct, ~2 min on 2 cores
    python benchmarks/constrained_decoding.py --model smollm2-kbrouter --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--questions", type=int, default=8, help="demo questions (one plan + one answer prompt each)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per side (alternating, after a warm-up)")
    ap.add_argument("--plan-tokens", type=int, default=448)
    ap.add_argument("--answer-tokens", type=int, default=256)
    args = ap.parse_args()

    from agent.backends.base import SamplingParams
    from agent.backends.constrained import compiled_grammar
    from agent.backends.hf import TransformersPolicy
    from agent.cli import DEMO_QUESTIONS
    from agent.io import read_questions
    from agent.protocol import answer_grammar, answer_messages, parse_answer, parse_plan, plan_grammar, plan_messages

    policy = TransformersPolicy(args.model, max_batch_size=16)
    kbs = [("Text Retriever", "Wikipedia paragraphs"), ("Table Retriever", "Wikipedia tables")]
    names = tuple(n for n, _ in kbs)
    qs = read_questions(str(DEMO_QUESTIONS))[: args.questions]
    plans = [plan_messages(q.question, [], kbs) for q in qs]
    answers = [answer_messages(q.question, []) for q in qs]
    pg, ag = plan_grammar(names, args.plan_tokens), answer_grammar(args.answer_tokens)
    t0 = time.perf_counter()
    for g in (pg, ag):
        compiled_grammar(policy.model, policy.tokenizer, g.ebnf)
    compile_s = time.perf_counter() - t0

    def side(constrained: bool) -> tuple[int, float, int]:
        tokens, seconds, ok = 0, 0.0, 0
        for convs, g, tok, stop, parse in ((plans, pg, args.plan_tokens, "</ret>", lambda t: parse_plan(t, names)),
                                           (answers, ag, args.answer_tokens, "</answer>", parse_answer)):  # fmt: skip
            params = SamplingParams(max_new_tokens=tok, grammar=g.ebnf if constrained else None,
                                    stop=() if constrained else (stop,))  # fmt: skip
            t = time.perf_counter()
            outs = policy.generate(convs, params)
            seconds += time.perf_counter() - t
            tokens += sum(o.completion_tokens for o in outs)
            ok += sum(parse(o.text).ok for o in outs)
        return tokens, seconds, ok

    side(True), side(False)  # warm-up: first-call allocations, compiled grammars in the cache
    totals = {True: [0, 0.0, 0], False: [0, 0.0, 0]}
    for _ in range(args.rounds):
        for constrained in (False, True):
            n, s, ok = side(constrained)
            totals[constrained][0] += n
            totals[constrained][1] += s
            totals[constrained][2] += ok
    n_out = 2 * len(qs) * args.rounds
    print(
        f"model {policy.name}, {len(qs)} plan + {len(qs)} answer prompts, {args.rounds} rounds per side, greedy; "
        f"grammar compile (plan + answer, once per KB set): {compile_s * 1000:.0f} ms"
    )
    rate = {}
    for constrained in (False, True):
        n, s, ok = totals[constrained]
        rate[constrained] = n / s
        label = "constrained  " if constrained else "unconstrained"
        print(f"{label}  {n:6d} tokens in {s:6.1f} s = {n / s:6.1f} tokens/s; valid steps {ok}/{n_out}")
    print(f"ratio constrained / unconstrained tokens/s: {rate[True] / rate[False]:.3f}")


if __name__ == "__main__":
    main()
