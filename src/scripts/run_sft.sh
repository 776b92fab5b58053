#!/usr/bin/env bash
# SFT warm start (TRL SFTTrainer, loss on the completion only); the output is a GRPO recipe's model_name_or_path.
#
#   bash src/scripts/run_sft.sh                                          # GSM8K, Qwen2.5-1.5B-Instruct, ZeRO-2
#   bash src/scripts/run_sft.sh --recipe recipes/sft_clevr_qwen2.5vl_3b.yaml      # CLEVR warm start (images)
#   bash src/scripts/run_sft.sh --preset smoke                           # offline CPU smoke run (tiny model)
#   bash src/scripts/run_sft.sh --preset smoke --dataset_name my.jsonl --max_steps 2 --output_dir D
#
# Any further flag overrides the recipe; .env supplies tokens and MODEL / DATASET / OUTPUT_DIR.
set -euo pipefail
source "$(dirname "$0")/common.sh"
run_recipe suzak.sft recipes/sft_gsm8k_qwen2.5_1.5b.yaml "smoke=recipes/sft_smoke.yaml" "$@"
