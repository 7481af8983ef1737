"""Does Step-GRPO learn on this machine? Held-out step reward before and after a fixed CPU budget of training.

Trains SmolLM2-135M-Instruct with the CPU recipe (configs/train/smollm2_grpo_cpu.yaml, overridden as below) on plan
steps of the paper's step-level dev set, holding out the plan steps of the last `--heldout` trajectories. Before and after training, every
held-out prompt gets `--samples` sampled completions (same seed), scored by the recipe's rewards; the script prints
the mean weighted step reward and each component (None rows left out), plus the format-violation rate.

    python benchmarks/step_grpo_learning.py --minutes 8
    python benchmarks/step_grpo_learning.py --minutes 8 --learning_rate 3e-5 --step_types '[plan, final]'

Figures are noisy: a few dozen prompts, sampled completions, a shared 2-core machine. Read them as a sanity check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "train" / "smollm2_grpo_cpu.yaml"


def evaluate(model, tokenizer, dataset, reward_funcs, weights, samples: int, max_new_tokens: int, seed: int) -> dict:
    """Mean weighted reward and per-component means over `samples` sampled completions per held-out prompt."""
    import torch

    torch.manual_seed(seed)
    model.eval()
    per_func: list[list[float]] = [[] for _ in reward_funcs]
    totals: list[float] = []
    columns = [c for c in dataset.column_names if c != "prompt"]
    for row in dataset:
        inputs = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)  # fmt: skip
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0,
                                 num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id,
                                 use_cache=True)  # fmt: skip
        texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        kwargs = {c: [row[c]] * samples for c in columns}
        scores = [f(completions, **kwargs) for f in reward_funcs]
        for i, s in enumerate(scores):
            per_func[i] += [x for x in s if x is not None]
        for j in range(samples):
            totals.append(sum(w * s[j] for w, s in zip(weights, scores, strict=True) if s[j] is not None))
    model.train()
    result = {"reward": sum(totals) / len(totals)}
    for f, vals in zip(reward_funcs, per_func, strict=True):
        result[f.__name__] = sum(vals) / len(vals) if vals else math.nan
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget (wall clock)")
    parser.add_argument("--heldout", type=int, default=4, help="trajectories held out for evaluation")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per held-out prompt")
    parser.add_argument("--seed", type=int, default=0)
    args, overrides = parser.parse_known_args(argv)

    from transformers import TrainerCallback

    from training.config import load_config
    from training.step_data import load_step_records
    from training.trainers import build_grpo_trainer, train

    # Settings that give learning a chance in minutes: plan steps only (routing + format are learnable), G = 4 and one
    # prompt per step, a high lr, and a dense reward: no format gate, format added with weight 0.5, so partially
    # well-formed plans already earn routing/similarity credit (the untrained model rarely writes all three tags).
    defaults = ["--step_types", "[plan]", "--learning_rate", "5e-5", "--num_generations", "4",
                "--per_device_train_batch_size", "4", "--max_completion_length", "32", "--max_steps", "1000",
                "--save_strategy", "no", "--beta", "0.0", "--logging_steps", "1", "--format_gate", "false",
        "--gradient_checkpointing", "false",
                "--rewards", "[{name: ask, weight: 0.5}, {name: route, weight: 0.5}, {name: format, weight: 0.5}]"]  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="kbr_learning_"))
    cfg = load_config("grpo", RECIPE, [*defaults, *overrides, "--output_dir", str(tmp / "run")])
    records = load_step_records(cfg.train_file, cfg.train_format)
    ids = list(dict.fromkeys(r.trajectory_id for r in records))
    held = set(ids[-args.heldout :])
    for name, keep in (
        ("train", lambda r: r.trajectory_id not in held),
        ("heldout", lambda r: r.trajectory_id in held),
    ):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records if keep(r)))
    cfg.train_file, cfg.train_format, cfg.eval_file = str(tmp / "train.jsonl"), "steps", str(tmp / "heldout.jsonl")

    class Budget(TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            if time.perf_counter() - start > args.minutes * 60:
                control.should_training_stop = True

    trainer = build_grpo_trainer(cfg)
    heldout = trainer.eval_dataset
    trainer.eval_dataset = None  # evaluated below with sampled completions, not TRL's eval loop
    weights = list(cfg.reward_weights)
    ev = dict(tokenizer=trainer.processing_class, dataset=heldout, reward_funcs=trainer.reward_funcs, weights=weights,
              samples=args.samples, max_new_tokens=cfg.max_completion_length, seed=args.seed)  # fmt: skip
    print(f"train prompts: {len(trainer.train_dataset)}  held-out prompts: {len(heldout)} x {args.samples} samples")
    print(f"settings: G={cfg.num_generations} lr={cfg.learning_rate} beta={cfg.beta} step_types={cfg.step_types} "
          f"max_completion_length={cfg.max_completion_length} budget={args.minutes} min")  # fmt: skip
    t = time.perf_counter()
    before = evaluate(trainer.model, **ev)
    print(f"evaluated before training in {time.perf_counter() - t:.0f} s")
    trainer.add_callback(Budget())
    start = time.perf_counter()
    train(trainer, cfg)
    trained = time.perf_counter() - start
    after = evaluate(trainer.model, **ev)
    history = trainer.state.log_history
    train_rewards = [h["reward"] for h in history if "reward" in h]
    print(
        f"trained {trainer.state.global_step} steps in {trained:.0f} s "
        f"({trainer.state.global_step * cfg.per_device_train_batch_size // cfg.num_generations} step prompts)"
    )
    if train_rewards:
        k = max(1, len(train_rewards) // 3)
        print(
            f"training-batch reward: first {k} steps {sum(train_rewards[:k]) / k:.3f}, "
            f"last {k} steps {sum(train_rewards[-k:]) / k:.3f}"
        )
    print(f"{'held-out mean':<22}{'before':>10}{'after':>10}{'change':>10}")
    for key in before:
        print(f"{key:<22}{before[key]:>10.3f}{after[key]:>10.3f}{after[key] - before[key]:>+10.3f}")
    print(
        "format violation rate".ljust(22) + f"{1 - before['format_reward']:>10.3f}{1 - after['format_reward']:>10.3f}"
    )
    verdict = "ROSE" if after["reward"] > before["reward"] else "DID NOT RISE"
    print(f"held-out step reward {verdict}: {before['reward']:.3f} -> {after['reward']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
