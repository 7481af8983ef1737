# Sourced by scripts/ddp_*_smoke.sh: the CPU DDP environment and the two-process `accelerate launch` of one recipe.
#
# accelerate's `--cpu` starts ONE process (env-probe §9); the multi-GPU (torchrun) launcher with ACCELERATE_USE_CPU=1
# gives two processes over gloo (DistributedType.MULTI_CPU). Each process holds a full SmolLM2 (~3 GB RSS).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export ACCELERATE_USE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
PY=${PYTHON:-.venv/bin/python}

# launch_grpo RECIPE LOG [--key value ...]: Step-GRPO in two CPU processes; on failure, the log's tail and exit 1
launch_grpo() {
  local recipe=$1 log=$2
  shift 2
  "$PY" -m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
      --dynamo_backend no -m training.cli grpo --config "$recipe" --save_strategy no --log_level_replica info \
      "$@" >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
}
