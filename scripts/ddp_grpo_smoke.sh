#!/usr/bin/env bash
# Two-process CPU DDP (gloo) smoke test of Step-GRPO: 2 steps of configs/train/smollm2_grpo_cpu.yaml under
# `accelerate launch`, printing each process's throughput.
#
#   scripts/ddp_grpo_smoke.sh                      # defaults below
#   scripts/ddp_grpo_smoke.sh --max_steps 4        # extra `--key value` overrides go to the recipe
#
# accelerate's `--cpu` starts ONE process (env-probe §9); the multi-GPU (torchrun) launcher with ACCELERATE_USE_CPU=1
# gives two processes over gloo (DistributedType.MULTI_CPU). Each process holds a full SmolLM2 (~3 GB RSS).
# Per step: 2 completions per process x 2 processes = 4 completions = 2 step prompts with G = 2.
set -euo pipefail
cd "$(dirname "$0")/.."
export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
OUT=${OUT:-/tmp/kbrouter_ddp_grpo_smoke}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
start=$(date +%s)
"$PY" -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
    --dynamo_backend no -m training.cli grpo --config configs/train/smollm2_grpo_cpu.yaml \
    --max_steps 2 --num_generations 2 --per_device_train_batch_size 2 --max_completion_length 16 \
    --save_strategy no --output_dir "$OUT" --log_level_replica info "$@" >"$OUT/launch.log" 2>&1 \
    || { tail -40 "$OUT/launch.log"; exit 1; }
grep -E "process [0-9]+/[0-9]+ on|throughput process|finished" "$OUT/launch.log" | sed -E 's/^.*INFO training\.trainers: //; s/^.*(grpo finished)/\1/'
echo "wall time incl. startup: $(( $(date +%s) - start )) s   (full log: $OUT/launch.log)"
