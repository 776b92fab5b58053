#!/usr/bin/env bash
# GRPO on CLEVR counting with Qwen2.5-VL.
#
#   bash src/scripts/run_grpo_clevr.sh                                   # 7B recipe, every visible GPU, ZeRO-2
#                                                                        # (deepspeed auto: optimizer on the GPU or offloaded, whichever fits)
#   bash src/scripts/run_grpo_clevr.sh --deepspeed ds_configs/zero2_offload.json   # your choice instead (or none)
#   bash src/scripts/run_grpo_clevr.sh --recipe recipes/clevr_qwen2.5vl_3b.yaml
#   bash src/scripts/run_grpo_clevr.sh --preset smoke                    # offline CPU smoke run (tiny model)
#   bash src/scripts/run_grpo_clevr.sh --preset demo                     # CPU demo that visibly learns (~2 min)
#   bash src/scripts/run_grpo_clevr.sh --max_steps 2 --output_dir D      # any further flag overrides the recipe
#   bash src/scripts/run_grpo_clevr.sh --resume_from_checkpoint latest   # newest complete checkpoint in output_dir
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash src/scripts/run_grpo_clevr.sh   # on each node (NODE_RANK 0, 1)
#
# .env (see .env.example) supplies tokens and MODEL / DATASET / OUTPUT_DIR overrides.
set -euo pipefail
source "$(dirname "$0")/common.sh"
run_recipe suzak.train recipes/clevr_qwen2.5vl_7b.yaml "smoke=recipes/smoke.yaml demo=recipes/demo.yaml" "$@"
