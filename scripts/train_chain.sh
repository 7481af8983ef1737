#!/usr/bin/env bash
# Train a chain of recipes in order, resumably, and log each stage's wall time and peak memory.
#
#   bash scripts/train_chain.sh                      # the router chain (stop 47): stages 1, 1b, 1c, 1d, 2, 2c
#   bash scripts/train_chain.sh sft:A.yaml grpo:B.yaml   # any chain: STAGE:RECIPE, trained in the order given
#
# A stage whose output_dir already holds its final adapter is skipped; a stage stopped part-way (killed, Ctrl-C,
# out of memory) resumes from its newest checkpoint. So rerunning the same command after any stop finishes the chain.
# Times go to runs/train/chain_times.tsv (stage, recipe, wall seconds, peak RSS KiB, exit code), one line a run.
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
    set -- sft:configs/train/smollm2_router_chain_sft_lora_cpu.yaml \
        sft:configs/train/smollm2_router_chain_sft_decisions_lora_cpu.yaml \
        sft:configs/train/smollm2_router_chain_sft_routing_lora_cpu.yaml \
        sft:configs/train/smollm2_router_chain_sft_video_lora_cpu.yaml \
        grpo:configs/train/smollm2_router_chain_grpo_lora_cpu.yaml \
        grpo:configs/train/smollm2_router_chain_grpo3_lora_cpu.yaml
fi
PY=${PYTHON:-.venv/bin/python}
TIMES=${CHAIN_TIMES:-runs/train/chain_times.tsv}
mkdir -p "$(dirname "$TIMES")"

for item in "$@"; do  # every item checked before the first stage trains
    stage=${item%%:*}
    if [[ "$stage" != sft && "$stage" != grpo ]] || [[ ! -f "${item#*:}" ]]; then
        echo "train_chain: '$item' is not STAGE:RECIPE with STAGE sft or grpo and RECIPE an existing file" >&2
        exit 2
    fi
done

for item in "$@"; do
    stage=${item%%:*}
    recipe=${item#*:}
    # the recipe's output_dir, with its `base:` chain applied (one reader of recipes: training.config.read_recipe)
    out=$("$PY" -c 'import sys; from training.config import read_recipe; print(read_recipe(sys.argv[1])["output_dir"])' "$recipe")
    if [[ -f "$out/adapter_model.safetensors" ]]; then
        echo "train_chain: $recipe: done already ($out), skipped"
        continue
    fi
    mkdir -p "$(dirname "$out")"
    echo "train_chain: $stage $recipe -> $out"
    start=$(date +%s)
    rc=0
    # resume from the newest complete checkpoint, or start from scratch if none; the peak RSS (KiB) of the training
    # process is what getrusage reports for the children (no /usr/bin/time needed)
    "$PY" -c 'import resource, subprocess, sys
rc = subprocess.call([sys.executable, "-m", "training.cli", *sys.argv[2:]])
open(sys.argv[1], "w").write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\n")
sys.exit(rc)' "$out.rss" "$stage" --config "$recipe" --resume_from_checkpoint true || rc=$?
    printf '%s\t%s\t%s\t%s\t%s\n' "$stage" "$recipe" "$(($(date +%s) - start))" "$(tail -1 "$out.rss" 2>/dev/null)" "$rc" >> "$TIMES"
    rm -f "$out.rss"
    if [[ $rc -ne 0 ]]; then
        echo "train_chain: $recipe failed (exit $rc); rerun the same command to resume from its newest checkpoint" >&2
        exit "$rc"
    fi
done
echo "train_chain: done; times in $TIMES"
