"""Questions/second of the step loop, mode by mode, side by side in one run, with the outputs checked identical.

Modes (same model, KBs, greedy settings and questions; each runs in its own child process so its peak RSS is its own):
  sequential         one question at a time (today's interactive path)
  lockstep           all questions of a batch together (today's batched path)
  prefix             lockstep + shared-prefix KV reuse (`policy.prefix_cache_mb`)
  sequential_prefix  one at a time + prefix reuse across steps and questions (the `kbrouter ask` path)
  continuous         transformers' continuous batching (`policy.continuous_batching`; unconstrained decoding only)

Text: SmolLM2-135M-Instruct on the demo KB, the first N of ../shared/data/text/questions.jsonl.
`--vl`: the tiny random Qwen2.5-VL with a real COCO photo as every question's image (throughput only: its words are
noise). The final answers (and every raw step output) of each mode are compared with the lockstep path's; the
script exits 1 when a mode's final answers differ.

    python benchmarks/agent_throughput.py                                   # 32 questions, max_steps 1, fp32
    python benchmarks/agent_throughput.py --n 16 --dtype bfloat16 --modes lockstep prefix
    python benchmarks/agent_throughput.py --constrained on --tokens 128 --modes lockstep prefix
    python benchmarks/agent_throughput.py --constrained off --modes sequential lockstep prefix continuous
    python benchmarks/agent_throughput.py --vl --modes sequential lockstep prefix
    python benchmarks/agent_throughput.py --sweep 1 4 8 16 32 --plot outputs/bench/throughput.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SHARED_Q = SHARED / "text" / "questions.jsonl"
COCO_IMAGES = SHARED / "image" / "coco" / "images"
MODES = ("sequential", "lockstep", "prefix", "sequential_prefix", "continuous")
BASELINE = "lockstep"  # today's batched path: every other mode's outputs are compared with it


def load_questions(n: int, vl: bool = False):  # noqa: ANN201
    from dataclasses import replace

    from agent.io import question_from_row
    from retrievers.jsonl import read_jsonl

    src = SHARED_Q if SHARED_Q.exists() else REPO / "data" / "demo" / "questions.jsonl"
    rows = read_jsonl(src)
    qs = [
        question_from_row({"id": r.get("id", r.get("qid")), "question": r["question"], "answers": r["answers"]})
        for r in rows
    ]
    while len(qs) < n:
        qs = qs + qs
    images: tuple[str, ...] = ()
    if vl:
        photos = sorted(COCO_IMAGES.glob("*.jpg"))
        if not photos:
            raise FileNotFoundError(f"--vl needs the COCO photos under {COCO_IMAGES}")
        images = (str(photos[0]),)
    return [replace(q, id=f"{q.id}-{i}", images=images) for i, q in enumerate(qs[:n])], src


def run_mode(args: argparse.Namespace) -> dict:
    """One mode in this process: load, warm up, time the questions, return figures and outputs."""
    import resource

    import torch

    from agent.backends.factory import PolicyConfig, make_policy
    from agent.kbs import load_knowledge_bases
    from agent.loop import AgentConfig, StepAgent

    mode = args.child
    questions, _ = load_questions(args.n, args.vl)
    kbs = load_knowledge_bases(args.kb)
    policy = make_policy(
        PolicyConfig(
            backend="vl" if args.vl else "transformers",
            model="tiny-qwen2.5-vl" if args.vl else args.model,
            dtype=args.dtype,
            max_batch_size=args.batch_size,
            prefix_cache_mb=args.prefix_cache_mb if "prefix" in mode else 0,
            continuous_batching=mode == "continuous",
        )
    )
    cfg = AgentConfig(
        max_steps=args.max_steps,
        plan_tokens=args.tokens,
        answer_tokens=args.tokens,
        final_tokens=args.tokens,
        constrained=args.constrained,
        few_shot=args.few_shot,
    )
    agent = StepAgent(policy, kbs, cfg)
    agent.run_batch(questions[:2])  # warm-up: first-call overheads (grammar compile, allocator) out of the timing
    cache = getattr(policy, "prefix_cache", None)
    if cache is not None:  # a timed run pays for its own prefixes
        cache.clear()
    phases = time_forward_phases(policy.model)
    t0 = time.perf_counter()
    if mode.startswith("sequential"):
        trajs = agent.run_sequential(questions)
    else:
        trajs = agent.run(questions, batch_size=args.batch_size)
    seconds = time.perf_counter() - t0
    return {
        "mode": mode,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "constrained": agent.constrained,
        "gen_tokens": sum(t.metadata["completion_tokens"] for t in trajs),
        "prompt_tokens": sum(t.metadata["prompt_tokens"] for t in trajs),
        "answers": [t.final_answer for t in trajs],
        "raw": [[r for s in t.steps for r in s.raw] + list(t.final_raw) for t in trajs],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prefix": cache.stats() if cache is not None else None,
        "phases": phases,
    }


def time_forward_phases(model) -> dict[str, list[float]]:  # noqa: ANN001 - a transformers model
    """Add up, per phase, [calls, seconds, tokens] of the model's forwards: `decode` is a forward of one new token a
    row (a generate step), `prefill` any longer one (prompts, prefix builds; continuous batching packs both into one).

    Forward hooks, not a wrapped `forward`: `generate` reads `forward`'s signature to decide which inputs to build (a
    `(*args, **kwargs)` wrapper loses the position ids the prefix layout needs, and the outputs change)."""
    phases = {"prefill": [0, 0.0, 0], "decode": [0, 0.0, 0]}
    started: list[float] = []

    def pre(module, args, kwargs):  # noqa: ANN001, ANN202
        started.append(time.perf_counter())

    def post(module, args, kwargs, output):  # noqa: ANN001, ANN202
        ids = kwargs.get("input_ids", args[0] if args else None)
        phase = phases["decode" if ids is not None and ids.ndim == 2 and ids.shape[1] == 1 else "prefill"]
        phase[0] += 1
        phase[1] += time.perf_counter() - started.pop()
        phase[2] += int(ids.numel()) if ids is not None else 0

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.register_forward_hook(post, with_kwargs=True)
    return phases


def child_argv(args: argparse.Namespace, mode: str, batch_size: int, out: str) -> list[str]:
    argv = [sys.executable, __file__, "--child", mode, "--out", out, "--batch-size", str(batch_size)]
    argv += ["--n", str(args.n), "--max-steps", str(args.max_steps), "--tokens", str(args.tokens)]
    argv += ["--kb", args.kb, "--dtype", args.dtype, "--model", args.model, "--constrained", args.constrained]
    argv += ["--prefix-cache-mb", str(args.prefix_cache_mb)] + (["--vl"] if args.vl else [])
    argv += ["--few-shot"] if args.few_shot else []
    return argv


def spawn(args: argparse.Namespace, mode: str, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        subprocess.run(child_argv(args, mode, batch_size, out), check=True, cwd=REPO)
        return json.loads(Path(out).read_text())


def table(results: list[dict], n: int) -> bool:
    """Print the figures side by side; True when every mode's final answers equal the baseline's."""
    base = next((r for r in results if r["mode"] == BASELINE), results[0])
    seq = next((r for r in results if r["mode"] == "sequential"), None)
    ok = True
    print(
        f"{'mode':<20}{'seconds':>9}{'q/s':>8}{'x seq':>7}{'x lockstep':>11}{'gen tok':>9}{'peak RSS MB':>13}"
        f"{'same final':>12}{'same raw':>10}{'tok/s':>8}"
    )
    for r in results:
        same = sum(a == b for a, b in zip(r["answers"], base["answers"], strict=True))
        same_raw = sum(a == b for a, b in zip(r["raw"], base["raw"], strict=True))
        ok = ok and same == n
        x_seq = f"{seq['seconds'] / r['seconds']:.2f}" if seq else "-"
        print(
            f"{r['mode']:<20}{r['seconds']:>9.1f}{n / r['seconds']:>8.3f}{x_seq:>7}"
            f"{base['seconds'] / r['seconds']:>11.2f}{r['gen_tokens']:>9}{r['peak_rss_mb']:>13.0f}"
            f"{f'{same}/{n}':>12}{f'{same_raw}/{n}':>10}"
            f"{(r['prompt_tokens'] + r['gen_tokens']) / r['seconds']:>8.0f}"  # prompt + generated tokens a second
        )
        if r.get("phases"):
            pre, dec = r["phases"]["prefill"], r["phases"]["decode"]
            rest = r["seconds"] - pre[1] - dec[1]
            print(
                f"{'':<20}model forwards: prefill {pre[1]:.1f} s ({pre[0]} calls, {pre[2]} tokens, "
                f"{pre[2] / max(pre[1], 1e-9):.0f} tok/s); decode {dec[1]:.1f} s ({dec[0]} steps, {dec[2]} row-tokens, "
                f"{dec[2] / max(dec[1], 1e-9):.0f} tok/s); outside the model {rest:.1f} s"
            )
        if r["prefix"]:
            p = r["prefix"]
            print(
                f"{'':<20}prefix cache: {p['misses']} built, {p['hits']} reused as is; {p['tokens_run']} prefix "
                f"tokens run, {p['tokens_reused']} reused; {p['entries']} kept, {p['bytes'] / 2**20:.0f} MB"
            )
    return ok


def plot(sweep: dict[str, list[tuple[int, float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, pts in sweep.items():
        ax.plot([b for b, _ in pts], [q for _, q in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (rows per generate call)")
    ax.set_ylabel("questions / s")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="questions (32 for the issue's figure)")
    ap.add_argument("--max-steps", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per plan/answer/final step")
    ap.add_argument("--kb", default=str(REPO / "configs" / "kb" / "demo.yaml"))
    ap.add_argument("--model", default="smollm2", help="text model (smollm2, smollm2-kbrouter, a folder)")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16")
    ap.add_argument(
        "--constrained",
        default="off",
        help="agent.constrained: off (the issue's baseline settings) | on (needs --tokens >= 115 for the plan grammar)",
    )
    ap.add_argument("--prefix-cache-mb", type=int, default=512)
    ap.add_argument(
        "--few-shot",
        action="store_true",
        help="worked examples in every step prompt (as configs/eval/smollm2_cpu.yaml)",
    )
    ap.add_argument("--vl", action="store_true", help="the tiny Qwen2.5-VL with a real photo per question")
    ap.add_argument("--modes", nargs="+", default=["sequential", "lockstep", "prefix"], choices=MODES)
    ap.add_argument("--sweep", nargs="+", type=int, default=[], help="batch sizes for the questions/s plot")
    ap.add_argument("--plot", default=str(REPO / "outputs" / "bench" / "agent_throughput.png"))
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        Path(args.out).write_text(json.dumps(run_mode(args)))
        return 0

    questions, src = load_questions(args.n, args.vl)
    model = "tiny Qwen2.5-VL (random), one COCO photo per question" if args.vl else args.model
    print(
        f"{len(questions)} questions from {src.name}; {model} {args.dtype}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; max_steps={args.max_steps}, {args.tokens} new tokens max per "
        f"step, greedy, constrained={args.constrained}, few_shot={args.few_shot}, batch size {args.batch_size}",
        flush=True,
    )
    results = [spawn(args, mode, args.batch_size) for mode in args.modes]
    ok = table(results, len(questions))
    if args.sweep:
        sweep: dict[str, list[tuple[int, float]]] = {}
        for mode in (m for m in args.modes if not m.startswith("sequential")):
            for b in args.sweep:
                done = next((r for r in results if r["mode"] == mode and b == args.batch_size), None)
                r = done or spawn(args, mode, b)  # the table's own run is that batch size's point
                sweep.setdefault(mode, []).append((b, len(questions) / r["seconds"]))
                print(f"sweep {mode:<12} batch {b:>3}: {len(questions) / r['seconds']:.3f} q/s", flush=True)
        plot(sweep, Path(args.plot), f"{model} {args.dtype}, {len(questions)} questions, 2 cores (shared)")
        print(f"plot: {args.plot}")
    if not ok:
        print(f"FAIL: a mode's final answers differ from the {BASELINE} path's")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
