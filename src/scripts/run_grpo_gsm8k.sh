#!/usr/bin/env bash
# GRPO on GSM8K (text) with gsm8k_accuracy + gsm8k_format rewards.
#
#   bash src/scripts/run_grpo_gsm8k.sh                                   # Qwen2.5-1.5B-Instruct, every GPU, ZeRO-2
#   bash src/scripts/run_grpo_gsm8k.sh --recipe recipes/gsm8k_qwen2.5vl_3b.yaml   # Qwen2.5-VL-3B on text
#   bash src/scripts/run_grpo_gsm8k.sh --preset smoke                    # offline CPU smoke run (tiny model)
#   bash src/scripts/run_grpo_gsm8k.sh --preset smoke --dataset_name my.jsonl --max_steps 2 --output_dir D
#   bash src/scripts/run_grpo_gsm8k.sh --model_name_or_path outputs/qwen2.5-1.5b-gsm8k-sft   # from an SFT warm start
#
# Any further flag overrides the recipe; .env supplies tokens and MODEL / DATASET / OUTPUT_DIR.
set -euo pipefail
source "$(dirname "$0")/common.sh"
run_recipe suzak.train recipes/gsm8k_qwen2.5_1.5b.yaml "smoke=recipes/gsm8k_smoke.yaml" "$@"
