#!/usr/bin/env bash
# Two-process CPU DDP (gloo) smoke test of Step-GRPO: 2 steps of configs/train/smollm2_grpo_cpu.yaml under
# `accelerate launch`, printing each process's throughput.
#
#   scripts/ddp_grpo_smoke.sh                      # defaults below
#   scripts/ddp_grpo_smoke.sh --max_steps 4        # extra `--key value` overrides go to the recipe
#
# Why the multi-GPU launcher with ACCELERATE_USE_CPU=1: scripts/ddp_common.sh.
# Per step: 2 completions per process x 2 processes = 4 completions = 2 step prompts with G = 2.
set -euo pipefail
source "$(dirname "$0")/ddp_common.sh"
OUT=${OUT:-/tmp/kbrouter_ddp_grpo_smoke}
mkdir -p "$OUT"
start=$(date +%s)
launch_grpo configs/train/smollm2_grpo_cpu.yaml "$OUT/launch.log" --max_steps 2 --num_generations 2 \
    --per_device_train_batch_size 2 --max_completion_length 16 --output_dir "$OUT" "$@"
grep -E "process [0-9]+/[0-9]+ on|throughput process|finished" "$OUT/launch.log" | sed -E 's/^.*INFO training\.trainers: //; s/^.*(grpo finished)/\1/'
echo "wall time incl. startup: $(( $(date +%s) - start )) s   (full log: $OUT/launch.log)"
