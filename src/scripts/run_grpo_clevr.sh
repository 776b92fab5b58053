#!/usr/bin/env bash
# GRPO on CLEVR counting with Qwen2.5-VL.
#
#   bash src/scripts/run_grpo_clevr.sh                                   # 7B recipe, every visible GPU, ZeRO-2
#                                                                        # (one GPU: ZeRO-2 with optimizer offload)
#   bash src/scripts/run_grpo_clevr.sh --recipe recipes/clevr_qwen2.5vl_3b.yaml
#   bash src/scripts/run_grpo_clevr.sh --preset smoke                    # offline CPU smoke run (tiny model)
#   bash src/scripts/run_grpo_clevr.sh --max_steps 2 --output_dir D      # any further flag overrides the recipe
#   bash src/scripts/run_grpo_clevr.sh --resume_from_checkpoint latest   # newest complete checkpoint in output_dir
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash src/scripts/run_grpo_clevr.sh   # on each node (NODE_RANK 0, 1)
#
# .env (see .env.example) supplies tokens and MODEL / DATASET / OUTPUT_DIR overrides.
set -euo pipefail
source "$(dirname "$0")/common.sh"

recipe=recipes/clevr_qwen2.5vl_7b.yaml deepspeed=ds_configs/zero2.json args=()
while [ $# -gt 0 ]; do
  case $1 in
    --preset) [ "$2" = smoke ] || { echo "unknown preset $2 (known: smoke)" >&2; exit 2; }
              recipe=recipes/smoke.yaml deepspeed=""; shift 2 ;;
    --recipe) recipe=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$deepspeed" = ds_configs/zero2.json ] && [ "$NPROC" -eq 1 ] && [ "${NNODES:-1}" -eq 1 ]; then
  deepspeed=ds_configs/zero2_offload.json  # one GPU: ZeRO-2 alone runs out of memory even for 3B (docs/benchmarks.md)
fi
[ -n "$deepspeed" ] && args=(--deepspeed "$deepspeed" "${args[@]}")
out=$(output_dir_of "$recipe" "${args[@]}")

echo "recipe $recipe | deepspeed ${deepspeed:-off} | GPUs $NPROC x nodes ${NNODES:-1} | output $out"
launch suzak.train --config "$recipe" "${args[@]}"
echo "checkpoints: $out/checkpoint-*   final model + processor: $out   metrics: $out/checkpoint-*/trainer_state.json"
