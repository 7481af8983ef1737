"""Does Step-GRPO learn on this machine? Held-out step reward before and after a fixed CPU budget of training.

SmolLM2-135M-Instruct never writes the paper's tags from the paper's plan prompt (every sampled completion is
malformed, so every reward is 0 and GRPO has no signal: all advantages are 0). So, as in R1-style recipes, the run is
SFT warm start → Step-GRPO, both from the CPU recipes (configs/train/smollm2_{sft,grpo}_cpu.yaml, overridden below):

  1. the base model is scored on the held-out plan prompts;
  2. a short SFT warm start on the training plan steps (`--sft_steps`) teaches the tag format, partly;
  3. held-out score again: this is the Step-GRPO starting point ("before");
  4. Step-GRPO for `--minutes` of wall clock from the SFT model;
  5. held-out score ("after"). The verdict compares 5 with 3, i.e. what Step-GRPO itself added.

Held-out prompts are the plan steps of the last `--heldout` trajectories of the paper's step-level dev set; each gets
`--samples` sampled completions (temperature 1, same seed every time), scored by the GRPO recipe's rewards. The script
prints the mean weighted step reward and each component (None rows left out) and the format-violation rate.

    python benchmarks/step_grpo_learning.py                       # ~15 min on 2 quiet cores (17 held-out prompts)
    python benchmarks/step_grpo_learning.py --minutes 4 --sft_steps 10 --learning_rate 3e-5

Figures are noisy: a few dozen prompts, sampled completions, a 2-core machine. Read them as a sanity check.
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

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "train"


def evaluate(model, tokenizer, dataset, reward_funcs, weights, samples: int, max_new_tokens: int, seed: int,
             batch_prompts: int = 4) -> dict:  # fmt: skip
    """Mean weighted reward and per-component means over `samples` sampled completions per held-out prompt.

    Prompts are generated in left-padded batches of `batch_prompts` (× `samples` sequences each).
    """
    import torch

    torch.manual_seed(seed)
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    per_func: list[list[float]] = [[] for _ in reward_funcs]
    totals: list[float] = []
    columns = [c for c in dataset.column_names if c != "prompt"]
    for start in range(0, len(dataset), batch_prompts):
        rows = dataset.select(range(start, min(start + batch_prompts, len(dataset))))
        texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in rows["prompt"]]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0,
                                 num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        decoded = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in decoded]
        kwargs = {c: [v for v in rows[c] for _ in range(samples)] for c in columns}
        scores = [f(completions, **kwargs) for f in reward_funcs]
        for i, s in enumerate(scores):
            per_func[i] += [x for x in s if x is not None]
        for j in range(len(completions)):
            totals.append(sum(w * s[j] for w, s in zip(weights, scores, strict=True) if s[j] is not None))
    tokenizer.padding_side = side
    model.train()
    result = {"reward": sum(totals) / len(totals)}
    for f, vals in zip(reward_funcs, per_func, strict=True):
        result[f.__name__] = sum(vals) / len(vals) if vals else math.nan
    return result


def split_records(train_file: str, train_format: str, heldout: int, tmp: Path) -> tuple[str, str]:
    """Write the training and held-out step records (held-out = the last `heldout` trajectories) as JSONL."""
    from training.step_data import load_step_records

    records = load_step_records(train_file, train_format)
    ids = list(dict.fromkeys(r.trajectory_id for r in records))
    held = set(ids[-heldout:])
    paths = []
    for name, keep in (
        ("train", lambda r: r.trajectory_id not in held),
        ("heldout", lambda r: r.trajectory_id in held),
    ):
        path = tmp / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records if keep(r)))
        paths.append(str(path))
    return paths[0], paths[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=7.0, help="Step-GRPO budget (wall clock)")
    parser.add_argument("--sft_steps", type=int, default=8, help="SFT warm-start optimizer steps (0: none)")
    parser.add_argument("--sft_learning_rate", type=float, default=1e-4)
    parser.add_argument("--heldout", type=int, default=6, help="trajectories held out for evaluation")
    parser.add_argument("--samples", type=int, default=2, help="sampled completions per held-out prompt")
    parser.add_argument("--seed", type=int, default=0)
    args, overrides = parser.parse_known_args(argv)

    from transformers import TrainerCallback

    from training.config import load_config
    from training.trainers import build_grpo_trainer, build_sft_trainer, load_policy, train

    t_all = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="kbr_learning_"))
    # Plan steps only (routing + format + query similarity are learnable in minutes), G = 4, two prompts per step,
    # no KL (β = 0: no reference model, faster), and a dense reward: no format gate, format added with weight 0.5, so
    # a well-formed plan earns credit and a partly-formed one still earns routing/similarity credit.
    grpo_defaults = ["--step_types", "[plan]", "--learning_rate", "5e-5", "--num_generations", "4",
                     "--per_device_train_batch_size", "8", "--max_completion_length", "64", "--max_steps", "1000",
                     "--save_strategy", "no", "--beta", "0.0", "--logging_steps", "1", "--format_gate", "false",
                     "--gradient_checkpointing", "false",
                     "--rewards", "[{name: ask, weight: 0.5}, {name: route, weight: 0.5}, {name: format, weight: 0.5}]"]  # fmt: skip
    cfg = load_config(
        "grpo", RECIPES / "smollm2_grpo_cpu.yaml", [*grpo_defaults, *overrides, "--output_dir", str(tmp / "grpo")]
    )
    train_file, heldout_file = split_records(cfg.train_file, cfg.train_format, args.heldout, tmp)
    cfg.train_file, cfg.train_format, cfg.eval_file = train_file, "steps", heldout_file

    if args.sft_steps > 0:
        sft_cfg = load_config("sft", RECIPES / "smollm2_sft_cpu.yaml", [
            "--train_file", train_file, "--train_format", "steps", "--step_types", "[plan]",
            "--max_steps", str(args.sft_steps), "--learning_rate", str(args.sft_learning_rate),
            "--per_device_train_batch_size", "4", "--save_strategy", "no", "--gradient_checkpointing", "false",
            "--output_dir", str(tmp / "sft")])  # fmt: skip
        sft_cfg.seed = cfg.seed

    trainer = build_grpo_trainer(cfg)  # data, rewards and the base policy
    heldout = trainer.eval_dataset
    trainer.eval_dataset = None  # evaluated below with sampled completions, not TRL's eval loop
    ev = dict(tokenizer=trainer.processing_class, dataset=heldout, reward_funcs=trainer.reward_funcs,
              weights=list(cfg.reward_weights), samples=args.samples, max_new_tokens=cfg.max_completion_length,
              seed=args.seed)  # fmt: skip
    print(f"train prompts: {len(trainer.train_dataset)}  held-out prompts: {len(heldout)} x {args.samples} samples")
    print(f"GRPO: G={cfg.num_generations} lr={cfg.learning_rate} beta={cfg.beta} step_types={cfg.step_types} "
          f"max_completion_length={cfg.max_completion_length} budget={args.minutes} min; "
          f"SFT warm start: {args.sft_steps} steps at lr {args.sft_learning_rate}")  # fmt: skip
    scores: dict[str, dict] = {}
    t = time.perf_counter()
    scores["base"] = evaluate(trainer.model, **ev)
    print(f"base model evaluated in {time.perf_counter() - t:.0f} s")

    if args.sft_steps > 0:
        t = time.perf_counter()
        sft = build_sft_trainer(sft_cfg)
        train(sft, sft_cfg)
        print(f"SFT warm start: {sft.state.global_step} steps in {time.perf_counter() - t:.0f} s")
        del sft
        # the GRPO trainer's policy becomes the SFT model (same architecture: load its weights in place)
        trainer.model.load_state_dict(load_policy(str(tmp / "sft"), cfg.model_dtype).state_dict())
        t = time.perf_counter()
        scores["sft"] = evaluate(trainer.model, **ev)
        print(f"SFT model evaluated in {time.perf_counter() - t:.0f} s")

    class Budget(TrainerCallback):
        def on_step_end(self, a, state, control, **kwargs):
            if time.perf_counter() - start > args.minutes * 60:
                control.should_training_stop = True

    trainer.add_callback(Budget())
    start = time.perf_counter()
    train(trainer, cfg)
    trained = time.perf_counter() - start
    scores["grpo"] = evaluate(trainer.model, **ev)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    print(f"Step-GRPO: {trainer.state.global_step} steps in {trained:.0f} s "
          f"({trainer.state.global_step * cfg.per_device_train_batch_size // cfg.num_generations} step prompts)")  # fmt: skip
    if rewards:
        k = max(1, len(rewards) // 3)
        print(
            f"training-batch reward: first {k} steps {sum(rewards[:k]) / k:.3f}, last {k} {sum(rewards[-k:]) / k:.3f}"
        )

    stages = list(scores)
    print(f"\n{'held-out mean':<22}" + "".join(f"{s:>10}" for s in stages) + f"{'GRPO gain':>11}")
    ref = scores["sft"] if "sft" in scores else scores["base"]
    for key in scores["base"]:
        row = "".join(f"{scores[s][key]:>10.3f}" for s in stages)
        print(f"{key:<22}{row}{scores['grpo'][key] - ref[key]:>+11.3f}")
    print("format violation rate".ljust(22) + "".join(f"{1 - scores[s]['format_reward']:>10.3f}" for s in stages))
    verdict = "ROSE" if scores["grpo"]["reward"] > ref["reward"] else "DID NOT RISE"
    print(f"held-out step reward under Step-GRPO {verdict}: {ref['reward']:.3f} -> {scores['grpo']['reward']:.3f} "
          f"(total wall time {(time.perf_counter() - t_all) / 60:.1f} min)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
