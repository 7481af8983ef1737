"""Share of Step-GRPO groups that can learn (rewards differ within the group), by sampling temperature.

A group whose G completions all earn the same reward has advantage 0 and adds nothing to the gradient. This rolls
out the first `--prompts` train prompts of a GRPO recipe G times each, from the recipe's starting policy
(`init_adapter`), at each temperature, through the trainer's own generate-and-score path (its grammars, rewards and
format gate; `training/prompt_screen.py`). It prints the live share per step type, the mean reward, and the seconds,
side by side.

    python benchmarks/grpo_live_share.py --recipe configs/train/smollm2_router_chain_v2_grpo_lora_cpu.yaml \
        --temperatures 1.0 1.5 2.0 --prompts 32     # ~4 min a temperature on 2 cores

TRL divides the logits by the same temperature in the loss, so training at T optimises the policy at T. Its greedy
argmax, which the agent decodes, is the same at any T.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def measure(recipe: str, temperature: float, prompts: int, seed: int) -> dict:
    import torch

    from training.config import load_config
    from training.prompt_screen import screen
    from training.trainers import build_grpo_trainer

    torch.manual_seed(seed)
    flags = ["--temperature", str(temperature), "--output_dir", "outputs/bench/grpo_live_share", "--report_to", "none"]
    trainer = build_grpo_trainer(load_config("grpo", recipe, flags))
    trainer.train_dataset = trainer.train_dataset.select(range(min(prompts, len(trainer.train_dataset))))
    rewards: list[float] = []
    real = trainer._generate_and_score_completions

    def recording(inputs):  # noqa: ANN001, ANN202 - TRL's rows
        out = real(inputs)
        rewards.append(trainer._metrics["train"]["reward"][-1])  # the call's mean reward, before the screen clears it
        return out

    trainer._generate_and_score_completions = recording
    record = screen(trainer)
    kept = set(record["kept"])
    by_type: dict[str, list[int]] = {}
    for i, step_type in enumerate(trainer.train_dataset["step_type"]):
        by_type.setdefault(step_type, []).append(i in kept)
    return {"live": len(kept) / record["total"], "n": record["total"], "seconds": record["seconds"],
            "reward": sum(rewards) / len(rewards), "by_type": {t: sum(v) / len(v) for t, v in by_type.items()},
            "counts": {t: len(v) for t, v in by_type.items()}}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="configs/train/smollm2_router_chain_v2_grpo_lora_cpu.yaml")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    p.add_argument("--prompts", type=int, default=32, help="the recipe's first N train prompts (after its caps)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rows = [(t, measure(args.recipe, t, args.prompts, args.seed)) for t in args.temperatures]
    types = sorted({k for _, r in rows for k in r["by_type"]})
    n = rows[0][1]["n"]
    counts = ", ".join(f"{t} {rows[0][1]['counts'][t]}" for t in types)
    print(f"\n{args.recipe}: {n} prompts ({counts}), G = rollouts each, from its init_adapter")
    print(f"{'temperature':>11} {'live share':>14} " + " ".join(f"{t + ' live':>11}" for t in types)
          + f" {'mean reward':>11} {'seconds':>8}")  # fmt: skip
    for t, r in rows:
        se = math.sqrt(r["live"] * (1 - r["live"]) / r["n"])
        print(f"{t:>11.2f} {r['live']:>8.2f} ± {se:.2f} " + " ".join(f"{r['by_type'].get(k, 0):>11.2f}" for k in types)
              + f" {r['reward']:>11.3f} {r['seconds']:>8.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
