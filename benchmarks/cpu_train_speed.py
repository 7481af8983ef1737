"""CPU training speed: the same short runs side by side, varying what costs time but not what is learnt from.

Variants, each a fresh `kbrouter train` process on the same data and seed, in one run:
  - `default malloc`: `KBROUTER_HUGEPAGES=0`, glibc's malloc as it comes;
  - `huge pages`: as `kbrouter` runs by default (`glibc.malloc.hugetlb=1`, kbrouter/hugepages.py);
  - `huge pages, no LoRA dropout`: also LoRA dropout 0 (SFT: `--lora {..., dropout: 0}`; Step-GRPO from an adapter:
    TRL's `--disable_dropout true`). peft draws a dropout mask over the input of every LoRA layer, 7 a block with
    `all-linear`: a py-spy profile of the budget SFT put 18 % of its samples in `dropout`.
With `--compare precision` the variants are instead float32 (`--bf16 false`) and bf16 autocast (`--bf16 true`), both
with huge pages: what `bf16: auto` (training/config.py) chooses between on this CPU. On a CPU without bf16 units the
bf16 variant is slow to the point of uselessness (stop 52, AVX2 only: step 1 60.4 s in float32, unfinished after 733 s
in bf16), so give it few steps there.
With `--compare lm_head` they are TRL's fused LM head as it ships on CPU (every position projected,
`KBROUTER_COMPACT_LM_HEAD=0`) and as kbrouter runs it (labelled positions only, training/cpu_lm_head.py), both with
huge pages and the recipe's precision: the same loss, different work. With `--compare prefill` they are Step-GRPO
rollouts that prefill every row (`KBROUTER_SHARED_PREFILL=0`) and that prefill each distinct prompt once
(training/shared_prefill.py): the same samples, different work. With `--compare prefix` they are training forwards
that run every row whole (`KBROUTER_SHARED_PREFIX=0`) and that run each batch's shared prompt prefix once
(training/shared_prefill.py `share_training_prefixes`): the same loss and gradients, different work. With
`--compare merge` they are Step-GRPO rollouts sampled through the LoRA layers (`KBROUTER_MERGED_ROLLOUTS=0`) and with
the adapter merged into the weights (training/merged_rollouts.py): the same samples, different work.
Per variant: wall seconds, the mean logged step time after the first (the first holds warm-up), user and kernel CPU
seconds and minor page faults of the child; then each variant's speed-up over `default malloc`.

    python benchmarks/cpu_train_speed.py --sft_steps 10 --grpo_steps 3
    python benchmarks/cpu_train_speed.py --compare precision --sft_steps 3
    python benchmarks/cpu_train_speed.py --compare lm_head --sft_steps 4 --grpo_steps 2 \
        --grpo_init_adapter models/smollm2-kbrouter
    python benchmarks/cpu_train_speed.py --compare prefill --sft_steps 0 --grpo_steps 3 \
        --grpo_init_adapter models/smollm2-kbrouter
    python benchmarks/cpu_train_speed.py --compare prefix --sft_config configs/train/smollm2_router_chain_sft_lora_cpu.yaml \
        --sft_steps 6
    python benchmarks/cpu_train_speed.py --compare merge --sft_steps 0 --grpo_steps 3 \
        --grpo_config configs/train/smollm2_router_chain_v2_grpo3_long_hot_lora_cpu.yaml

Adapters go to a temporary folder that is removed afterwards. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_RE = re.compile(r"step (\d+) took ([0-9.]+) s")
LOSS_RE = re.compile(r"'train_loss': '?([-+0-9.eE]+)")  # the trainer's final metrics: the mean loss of the run
SFT = "configs/train/smollm2_router_sft_budget_lora_cpu.yaml"
GRPO = "configs/train/smollm2_router_grpo_budget_lora_cpu.yaml"


def no_dropout_args(kind: str, config: str) -> list[str]:
    """Overrides that turn LoRA dropout off: the SFT recipe's own `lora` with dropout 0, or TRL's `disable_dropout`."""
    if kind == "grpo":
        return ["--disable_dropout", "true"]
    from training.config import read_recipe  # imports TRL: only when a LoRA SFT recipe is timed

    lora = read_recipe(config).get("lora")
    if not lora:
        raise SystemExit(f"{config}: no `lora` block, so there is no LoRA dropout to turn off; pass a LoRA SFT recipe")
    return ["--lora", json.dumps({**lora, "dropout": 0.0})]  # JSON is YAML: the override parser reads it


def run_train(kind: str, config: str, steps: int, env_set: dict, extra: list[str], out: Path) -> dict[str, float]:
    """One `kbrouter train KIND` of `steps` steps with `env_set` in its environment; its wall time, step times and
    child resource usage."""
    env = {
        **os.environ,
        "KBROUTER_HUGEPAGES": "1",
        "KBROUTER_COMPACT_LM_HEAD": "1",
        "KBROUTER_SHARED_PREFILL": "1",
        **env_set,
    }
    env.pop("GLIBC_TUNABLES", None)  # each variant chooses its own malloc setting
    log = out.with_suffix(".log")
    args = ["--config", config, "--max_steps", str(steps), "--save_steps", "1000000", "--output_dir", str(out)]
    cmd = [sys.executable, "-m", "kbrouter.cli", "train", kind, *args, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise SystemExit(f"`{' '.join(cmd)}` exited {rc}; the tail of its log {log}:\n{log.read_text()[-2000:]}")
    text = log.read_text()
    later = [float(v) for k, v in STEP_RE.findall(text) if int(k) > 1]
    losses = LOSS_RE.findall(text)
    return {
        "wall_s": wall,
        "step_s": sum(later) / len(later) if later else float("nan"),
        "user_s": after.ru_utime - before.ru_utime,
        "kernel_s": after.ru_stime - before.ru_stime,
        "faults_M": (after.ru_minflt - before.ru_minflt) / 1e6,
        "loss": float(losses[-1]) if losses else float("nan"),  # equal across variants that change no numbers
    }


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    keys = list(next(iter(rows.values())))
    base = next(iter(rows.values()))
    print(f"\n{title}")
    print(f"{'':30}" + "".join(f"{k:>11}" for k in keys) + f"{'speed-up':>11}")
    for name, row in rows.items():
        cells = "".join(f"{row[k]:11.6f}" if k == "loss" else f"{row[k]:11.2f}" for k in keys)
        print(f"{name:30}{cells}{base['step_s'] / row['step_s']:10.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft_config", default=SFT)
    ap.add_argument("--grpo_config", default=GRPO, help="a Step-GRPO recipe (its init_adapter must exist)")
    ap.add_argument("--sft_steps", type=int, default=10)
    ap.add_argument("--grpo_steps", type=int, default=0, help="0 = skip Step-GRPO (~100 s a step on 2 cores)")
    ap.add_argument("--grpo_init_adapter", default="", help="start Step-GRPO from this adapter, not the recipe's")
    ap.add_argument("--grpo_extra", default="", help="more Step-GRPO overrides, e.g. a smaller micro-batch")
    ap.add_argument(
        "--compare",
        choices=["malloc", "precision", "lm_head", "prefill", "prefix", "merge"],
        default="malloc",
        help="what to vary",
    )
    args = ap.parse_args()
    plan = [("sft", args.sft_config, args.sft_steps), ("grpo", args.grpo_config, args.grpo_steps)]
    with tempfile.TemporaryDirectory(prefix="kbrouter_train_speed_") as tmp:
        for kind, config, steps in plan:
            if steps <= 0:
                continue
            adapter = ["--init_adapter", args.grpo_init_adapter] if kind == "grpo" and args.grpo_init_adapter else []
            adapter += shlex.split(args.grpo_extra) if kind == "grpo" else []
            if args.compare == "precision":
                variants = {"float32": ({}, ["--bf16", "false"]), "bf16 autocast": ({}, ["--bf16", "true"])}
            elif args.compare == "lm_head":
                variants = {
                    "LM head: every position": ({"KBROUTER_COMPACT_LM_HEAD": "0"}, []),
                    "LM head: labelled only": ({}, []),
                }
            elif args.compare == "prefill":
                variants = {
                    "prefill: every row": ({"KBROUTER_SHARED_PREFILL": "0"}, []),
                    "prefill: once a prompt": ({}, []),
                }
            elif args.compare == "prefix":
                variants = {
                    "prefix: every row": ({"KBROUTER_SHARED_PREFIX": "0"}, []),
                    "prefix: once a batch": ({}, []),
                }
            elif args.compare == "merge":
                variants = {
                    "rollouts: LoRA unmerged": ({"KBROUTER_MERGED_ROLLOUTS": "0"}, []),
                    "rollouts: LoRA merged": ({}, []),
                }
            else:
                variants = {
                    "default malloc": ({"KBROUTER_HUGEPAGES": "0"}, []),
                    "huge pages": ({}, []),
                    "huge pages, no LoRA dropout": ({}, no_dropout_args(kind, config)),
                }
            rows = {
                name: run_train(kind, config, steps, env_set, [*adapter, *extra], Path(tmp) / f"{kind}_{i}")
                for i, (name, (env_set, extra)) in enumerate(variants.items())
            }
            print_table(f"{kind}: {steps} steps of {config}", rows)


if __name__ == "__main__":
    main()
