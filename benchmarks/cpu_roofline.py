"""How far the agent's measured tokens/s are from this CPU's limit for SmolLM2-135M (issue 14's gap analysis).

Three figures, measured in one run with the same thread count:
  1. float32 matmul GFLOP/s at the model's own shapes (tokens x 576 @ 576 x 1536 and the rest of a layer);
  2. the compute-bound tokens/s they imply: FLOPs per token counted from the model's config (every linear layer,
     the LM head for generated tokens, attention over the context);
  3. the model's own forward pass over a full batch of prompts (no generate loop, no padding): what torch reaches
     on this model with nothing of kbrouter around it;
  4. one decoding step (one new token a row over a cached context) at batch 1, 8 and 32, with transformers'
     `DynamicCache` and `StaticCache`: a step reads every weight and every row's keys and values once, so its time
     hardly grows with the batch, and its tokens/s sit far below (2) at the batch sizes the agent runs.
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


def layer_gflops(shapes: dict[str, tuple[int, int]], rates: dict[str, float]) -> float:
    """GFLOP/s of one layer's linear work at these per-shape rates (the shapes weighted by their FLOPs)."""
    per_layer = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}
    flops = sum(2 * shapes[s][0] * shapes[s][1] * c for s, c in per_layer.items())
    seconds = sum(2 * shapes[s][0] * shapes[s][1] * c / (rates[s] * 1e9) for s, c in per_layer.items())
    return flops / seconds / 1e9


def decode_step_s(model, batch: int, context: int, static: bool, steps: int) -> float:  # noqa: ANN001
    """Mean seconds of one greedy-decoding forward (`batch` rows, one token each) over `context` cached tokens."""
    from transformers import DynamicCache, StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=context + steps + 1) if static else DynamicCache(config=cfg)
    mask = torch.ones(batch, context, dtype=torch.long)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, cfg.vocab_size, (batch, context)), attention_mask=mask, cache=cache)
        x = torch.randint(0, cfg.vocab_size, (batch, 1))
        t0 = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1)
            model(input_ids=x, attention_mask=mask, cache=cache, logits_to_keep=1)
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="rows of the matmuls (a prefill batch's tokens)")
    ap.add_argument("--context", type=int, default=700, help="mean context length a token attends over")
    ap.add_argument("--gen-share", type=float, default=0.1, help="share of processed tokens that are generated")
    ap.add_argument("--batch", type=int, default=8, help="prompts in the model-forward measurement")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-batches", nargs="*", type=int, default=[1, 8, 32], help="rows of the decode steps")
    ap.add_argument("--decode-context", type=int, default=300, help="cached tokens a decoding row attends over")
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
    gflops = layer_gflops(shapes, rates)
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

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_token = 2 * cfg.num_hidden_layers * kv * 4  # float32 keys + values of one cached token, every layer
    for b in args.decode_batches:
        dyn = decode_step_s(model, b, args.decode_context, static=False, steps=10)
        sta = decode_step_s(model, b, args.decode_context, static=True, steps=10)
        read = weights + b * args.decode_context * kv_token  # bytes a step must read at least
        # the same matmuls with `b` rows: small-row GEMMs run far below the 4096-row rate
        small = layer_gflops(shapes, {n: gemm_gflops(b, k, o, args.repeats * 4) for n, (k, o) in shapes.items()})
        floor = b * flops_per_token(cfg, args.decode_context, generated=True) / (small * 1e9)
        print(
            f"decode step, batch {b:>3}, context {args.decode_context}: DynamicCache {dyn * 1e3:6.1f} ms, "
            f"StaticCache {sta * 1e3:6.1f} ms; {b / dyn:4.0f} tokens/s ({b / dyn / bound:4.0%} of the ceiling); "
            f"reads >= {read / 2**20:.0f} MB ({read / dyn / 1e9:.1f} GB/s); matmuls at {b} rows {small:5.1f} GFLOP/s "
            f"-> {floor * 1e3:.0f} ms of FLOPs"
        )

    for mode, tps in measured:
        print(
            f"{mode:<12} {tps:7.0f} tokens/s = {tps / bound:5.0%} of the ceiling, {tps / forward:5.0%} of the "
            f"model forward"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
