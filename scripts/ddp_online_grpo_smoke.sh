#!/usr/bin/env bash
# Two-process CPU DDP (gloo) smoke test of *online* Step-GRPO: 2 optimizer steps of
# configs/train/smollm2_online_grpo_cpu.yaml under `accelerate launch`, both processes' rollouts searching one
# retrieval service (started here on 127.0.0.1 with a throwaway API key), printing each process's throughput.
#
#   scripts/ddp_online_grpo_smoke.sh                      # defaults below (~5-10 min on 2 busy cores)
#   scripts/ddp_online_grpo_smoke.sh --max_steps 3        # extra `--key value` overrides go to the recipe
#
# Each process rolls out one demo question per step (per_device_train_batch_size 2 / G 2) from the shipped router
# adapter; the demo questions have no gold steps, so they train on the outcome alone (allow_outcome_only).
# Why the multi-GPU launcher with ACCELERATE_USE_CPU=1: scripts/ddp_common.sh.
set -euo pipefail
source "$(dirname "$0")/ddp_common.sh"
OUT=${OUT:-/tmp/kbrouter_ddp_online_smoke}
PORT=${PORT:-8791}
mkdir -p "$OUT"
kb() {  # the demo passages and tables, BM25 (builds in seconds); $1 = options line of each KB
  cat <<YAML
knowledge_bases:
  - {name: text, display_name: Text Retriever, description: Wikipedia paragraphs., kind: text, granularity: paragraph,
     corpus: $PWD/data/demo/passages.jsonl, search: bm25, index_dir: $OUT/idx/text, k: 2, options: {$1}}
  - {name: table, display_name: Table Retriever, description: Wikipedia tables., kind: table, granularity: table,
     corpus: $PWD/data/demo/tables, search: bm25, index_dir: $OUT/idx/table, k: 2, options: {max_rows: 10, $1}}
YAML
}
kb "" >"$OUT/local.yaml"
kb "remote: http://127.0.0.1:$PORT, remote_retries: 2" >"$OUT/remote.yaml"
export KBROUTER_API_KEY=$("$PY" -c "import secrets; print(secrets.token_hex(16))")
"$PY" -m retrievers.service --kb "$OUT/local.yaml" --build --host 127.0.0.1 --port "$PORT" \
    --api-key "$KBROUTER_API_KEY" >"$OUT/service.log" 2>&1 &
SERVICE=$!
trap 'kill $SERVICE 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf -H "Authorization: Bearer $KBROUTER_API_KEY" "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
start=$(date +%s)
launch_grpo configs/train/smollm2_online_grpo_cpu.yaml "$OUT/launch.log" \
    --init_adapter models/smollm2-kbrouter --train_file data/demo/questions.jsonl \
    --online_rollout "{kb: $OUT/remote.yaml, max_steps: 1, top_k: 2, evidence_chars: 150, allow_outcome_only: true}" \
    --max_steps 2 --num_generations 2 --per_device_train_batch_size 2 --max_completion_length 64 \
    --output_dir "$OUT/run" "$@"
grep -E "process [0-9]+/[0-9]+ on|throughput process|online step|finished" "$OUT/launch.log" \
    | sed -E 's/^.*INFO training\.(trainers|online_grpo): //; s/^.*(grpo finished)/\1/'
echo "wall time incl. startup: $(( $(date +%s) - start )) s   (full log: $OUT/launch.log, service: $OUT/service.log)"
