"""What `skip_zero_advantage` saves in Step-GRPO: the same recipe trained for a few steps with the skip off and on,
side by side in one process, from the same adapter, seed and prompts.

Prints per step and mode the step's wall seconds (TRL's `step_time`, generation included), the mean reward, the
share of zero-std groups and the share of rows the skip left out; then the median step time of each mode, their
ratio, and how far apart the two runs' trainable weights ended (same seed and prompts: the first step samples the
same completions in both, so the weights differ by float rounding until a later step samples differently).

    python benchmarks/zero_advantage.py                       # stop-47 chain stage 2c, 4 steps a mode
    python benchmarks/zero_advantage.py --recipe configs/train/smollm2_router_chain_grpo_lora_cpu.yaml --steps 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(recipe: str, steps: int, skip: bool, out: str, extra: list[str]) -> tuple[list[dict], dict]:
    from training.config import load_config
    from training.trainers import build_grpo_trainer, train

    cfg = load_config("grpo", recipe, ["--max_steps", str(steps), "--output_dir", out, "--save_strategy", "no",
                                       "--skip_zero_advantage", str(skip).lower(), *extra])  # fmt: skip
    trainer = build_grpo_trainer(cfg)
    train(trainer, cfg)
    weights = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return [h for h in trainer.state.log_history if "step_time" in h], weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=str(REPO / "configs" / "train" / "smollm2_router_chain_grpo3_lora_cpu.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    args, extra = ap.parse_known_args()
    if args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    logs, weights = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for skip in (False, True):
            logs[skip], weights[skip] = run(args.recipe, args.steps, skip, f"{tmp}/{skip}", extra)
    print(f"recipe {args.recipe}, {args.steps} steps a mode")
    print("step  mode  step_s  reward  zero-std groups  rows skipped")
    for skip in (False, True):
        for h in logs[skip]:
            skipped = h.get("frac_rows_skipped_zero_advantage")
            print(f"{h['step']:>4}  {'on' if skip else 'off':>4}  {h['step_time']:6.1f}  {h['reward']:6.3f}  "
                  f"{h['frac_reward_zero_std']:15.2f}  {'-' if skipped is None else f'{skipped:.2f}':>12}")  # fmt: skip
    med = {skip: statistics.median(h["step_time"] for h in logs[skip]) for skip in (False, True)}
    total = {skip: sum(h["step_time"] for h in logs[skip]) for skip in (False, True)}
    print(f"median step: off {med[False]:.1f} s, on {med[True]:.1f} s, on/off {med[True] / med[False]:.2f}x")
    print(f"all steps:   off {total[False]:.1f} s, on {total[True]:.1f} s, on/off {total[True] / total[False]:.2f}x")
    same = [h0["reward"] == h1["reward"] for h0, h1 in zip(logs[False], logs[True], strict=True)]
    diff = max(float((weights[True][n] - w).norm() / w.norm().clamp(min=1e-12)) for n, w in weights[False].items())
    print(
        f"steps with the same mean reward in both modes: {sum(same)}/{len(same)} (same samples while equal); "
        f"largest relative weight difference after the runs: {diff:.2e}"
    )


if __name__ == "__main__":
    main()
