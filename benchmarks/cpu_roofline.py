"""How far the agent's measured tokens/s are from this CPU's limit for SmolLM2-135M (issue 14's gap analysis).

Three figures, measured in one run with the same thread count:
  1. float32 matmul GFLOP/s at the model's own shapes (tokens x 576 @ 576 x 1536 and the rest of a layer);
  2. the compute-bound tokens/s they imply: FLOPs per token counted from the model's config (every linear layer,
     the LM head for generated tokens, attention over the context);
  3. the model's own forward pass over a full batch of prompts (no generate loop, no padding): what torch reaches
     on this model with nothing of kbrouter around it.
Then each `--measured MODE=TOKENS_PER_S` (from `benchmarks/agent_throughput.py`'s last column) as a share of (2)
and (3).

    python benchmarks/cpu_roofline.py --measured sequential=72 lockstep=215 prefix=276 continuous=156
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def gemm_gflops(m: int, k: int, n: int, repeats: int) -> float:
    """Best-of-`repeats` GFLOP/s of one float32 (m x k) @ (k x n) matmul."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b  # warm-up: thread pool and allocator
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def flops_per_token(cfg, context: int, generated: bool) -> float:
    """Forward FLOPs of one token: 2 x the weights it multiplies, plus attention over `context` earlier tokens."""
    d, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    linear = layers * (d * d + 2 * d * kv + d * d + 3 * d * f)  # q, k, v, o, gate/up/down
    attention = layers * 2 * context * d  # q.k and p.v, each d multiply-adds per context token
    head = cfg.vocab_size * d if generated else 0  # generate computes logits for the last position only
    return 2 * (linear + attention + head)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the matmuls (a prefill batch's tokens)")
    ap.add_argument("--context", type=int, default=700, help="mean context length a token attends over")
    ap.add_argument("--gen-share", type=float, default=0.1, help="share of processed tokens that are generated")
    ap.add_argument("--batch", type=int, default=8, help="prompts in the model-forward measurement")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--measured", nargs="*", default=[], help="MODE=TOKENS_PER_S from agent_throughput.py")
    args = ap.parse_args(argv)
    measured = []  # checked before the minutes of measuring, so a typo costs nothing
    for item in args.measured:
        mode, _, value = item.partition("=")
        try:
            measured.append((mode, float(value)))
        except ValueError:
            ap.error(f"--measured {item!r}: write MODE=TOKENS_PER_S with a number, e.g. prefix=276")

    from transformers import AutoConfig, AutoModelForCausalLM

    from agent.backends.models import smollm2_path

    path = smollm2_path()
    cfg = AutoConfig.from_pretrained(path)
    threads = torch.get_num_threads()
    print(
        f"SmolLM2-135M float32, torch {torch.__version__}, {threads} threads (OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')})"
    )

    d, f = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    shapes = {"q/o": (d, d), "k/v": (d, kv), "gate/up": (d, f), "down": (f, d)}
    rates = {}
    for name, (k, n) in shapes.items():
        rates[name] = gemm_gflops(args.tokens, k, n, args.repeats)
        print(f"matmul {name:<8} {args.tokens} x {k} @ {k} x {n}: {rates[name]:6.1f} GFLOP/s")
    # one layer's linear time at these rates, so the mix of shapes is weighted by its FLOPs
    per_layer = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}
    layer_flops = sum(2 * shapes[s][0] * shapes[s][1] * c for s, c in per_layer.items())
    layer_s = sum(2 * shapes[s][0] * shapes[s][1] * c / (rates[s] * 1e9) for s, c in per_layer.items())
    gflops = layer_flops / layer_s / 1e9
    prompt_f = flops_per_token(cfg, args.context, generated=False)
    gen_f = flops_per_token(cfg, args.context, generated=True)
    mean_f = (1 - args.gen_share) * prompt_f + args.gen_share * gen_f
    bound = gflops * 1e9 / mean_f
    print(
        f"weighted matmul rate {gflops:.1f} GFLOP/s; FLOPs a token: prompt {prompt_f / 1e9:.3f} G, generated "
        f"{gen_f / 1e9:.3f} G (context {args.context}); mean at {args.gen_share:.0%} generated {mean_f / 1e9:.3f} G"
    )
    print(f"compute-bound ceiling: {bound:.0f} tokens/s")

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len))
    with torch.inference_mode():
        model(ids[:1, :16], logits_to_keep=1)  # warm-up
        best = float("inf")
        for _ in range(max(1, args.repeats // 2)):
            t0 = time.perf_counter()
            model(ids, logits_to_keep=1)
            best = min(best, time.perf_counter() - t0)
    forward = args.batch * args.prompt_len / best
    print(
        f"model forward, {args.batch} x {args.prompt_len} prompt tokens, no padding: {forward:.0f} tokens/s "
        f"({forward / bound:.0%} of the ceiling)"
    )

    for mode, tps in measured:
        print(
            f"{mode:<12} {tps:7.0f} tokens/s = {tps / bound:5.0%} of the ceiling, {tps / forward:5.0%} of the "
            f"model forward"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
