"""What does kbrouter add to a GRPO step? kbrouter's Step-GRPO against plain `trl.GRPOTrainer`, side by side.

Both runs train SmolLM2-135M on the same step prompts (the paper's dev set, plan and final steps), with the same
group size, batch, seed and generation settings; every completion is forced to exactly `--tokens` tokens
(`min_new_tokens`) so both do the same model work. kbrouter's run uses its step dataset and the recipe's rewards
(MiniLM query similarity, routing, F1-recall answer, format); the plain run uses a prompt-only dataset and a trivial
length reward. The script prints the median step time of each (first step excluded as warm-up) and the ratio.

    python benchmarks/grpo_overhead.py --steps 4

The machine is shared: run it when it is quiet, and compare the two runs of one invocation only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "train" / "smollm2_grpo_cpu.yaml"


def length_reward(completions, **kwargs) -> list[float]:
    """Trivial reward for the plain-TRL baseline."""
    return [float(len(c[-1]["content"])) for c in completions]


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.t0)

    return StepTimer()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the first is warm-up)")
    parser.add_argument("--tokens", type=int, default=16, help="completion length (forced)")
    args = parser.parse_args(argv)

    from trl import GRPOConfig, GRPOTrainer

    from training.config import load_config
    from training.trainers import build_grpo_trainer

    tmp = Path(tempfile.mkdtemp(prefix="kbr_overhead_"))
    common = {
        "max_steps": args.steps,
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": args.tokens,
        "generation_kwargs": {"min_new_tokens": args.tokens},
        "beta": 0.0,
        "learning_rate": 1e-5,
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": 0,
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "loss_type": "grpo",
        "entropy_coef": 0.0,
    }  # fmt: skip (one loss on both sides: only rewards and data differ)
    overrides = [x for k, v in common.items() for x in (f"--{k}", repr(v) if isinstance(v, dict) else str(v))]
    cfg = load_config("grpo", RECIPE, [*overrides, "--output_dir", str(tmp / "kbrouter")])
    ours = build_grpo_trainer(cfg)
    prompts = ours.train_dataset.select_columns(["prompt"])
    plain_args = GRPOConfig(output_dir=str(tmp / "plain"), **common)
    plain = GRPOTrainer(model=ours.model.config._name_or_path, reward_funcs=[length_reward], args=plain_args,
                        train_dataset=prompts, processing_class=ours.processing_class)  # fmt: skip
    print(f"{len(prompts)} step prompts, G=2, 2 prompts/step, {args.tokens} tokens per completion, "
          f"{args.steps} steps per run")  # fmt: skip
    results, times = {}, {}
    for name, trainer in (("plain TRL GRPOTrainer", plain), ("kbrouter Step-GRPO", ours)):
        timer = step_timer()
        trainer.add_callback(timer)
        trainer.train()
        steady = timer.times[1:] or timer.times
        times[name] = timer.times
        results[name] = statistics.median(steady)
        print(f"{name:<24} step times {[round(t, 1) for t in timer.times]} s, median (after warm-up) "
              f"{results[name]:.2f} s")  # fmt: skip
    ratio = results["kbrouter Step-GRPO"] / results["plain TRL GRPOTrainer"]
    # same seed, same sampler: step i sees the same prompts in both runs, so per-step ratios pair up
    paired = [o / p for p, o in zip(times["plain TRL GRPOTrainer"][1:], times["kbrouter Step-GRPO"][1:], strict=True)]
    print(f"ratio kbrouter / plain: {ratio:.3f}x of medians; per-step paired ratios {[round(r, 3) for r in paired]}, "
          f"median {statistics.median(paired):.3f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
