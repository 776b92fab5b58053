# common.sh - sourced by the launch scripts: repo root, virtualenv, .env, GPU count, and the launcher.
#   launch MODULE ARGS...   runs `python -m MODULE` (no GPU) or torchrun over every visible GPU, multi-node via
#                           NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi

# .env with python-dotenv semantics: values already in the environment win; never echoed.
if [ -f "${SUZAK_ENV_FILE:-.env}" ]; then
  eval "$(python - "${SUZAK_ENV_FILE:-.env}" <<'PY'
import os, shlex, sys
from dotenv import dotenv_values
for key, value in dotenv_values(sys.argv[1]).items():
    if value and key not in os.environ:
        print(f"export {key}={shlex.quote(value)}")
PY
)"
fi

if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  NPROC=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
elif command -v nvidia-smi >/dev/null 2>&1; then
  NPROC=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
else
  NPROC=0
fi
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

launch() {
  local module=$1; shift
  if [ "$NPROC" -eq 0 ]; then
    python -m "$module" "$@"
  else
    torchrun --nnodes "${NNODES:-1}" --node_rank "${NODE_RANK:-0}" --nproc_per_node "$NPROC" \
      --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}" -m "$module" "$@"
  fi
}

# output_dir the run will use: --output_dir on the command line, else OUTPUT_DIR, else the recipe's.
output_dir_of() {
  local recipe=$1; shift
  while [ $# -gt 0 ]; do [ "$1" = --output_dir ] && { echo "$2"; return; }; shift; done
  [ -n "${OUTPUT_DIR:-}" ] && { echo "$OUTPUT_DIR"; return; }
  python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get("output_dir", "?"))' "$recipe"
}

# run_recipe MODULE DEFAULT_RECIPE SMOKE_RECIPE ARGS...: the body of every launch script.
#   --preset smoke -> SMOKE_RECIPE, no DeepSpeed; --recipe PATH; everything else overrides the recipe.
#   DeepSpeed ZeRO-2 by default (ZeRO-2 + optimizer offload on a single GPU; see docs/benchmarks.md).
run_recipe() {
  local module=$1 recipe=$2 smoke=$3 deepspeed=ds_configs/zero2.json args=() out
  shift 3
  while [ $# -gt 0 ]; do
    case $1 in
      --preset) [ "$2" = smoke ] || { echo "unknown preset $2 (known: smoke)" >&2; return 2; }
                recipe=$smoke deepspeed=""; shift 2 ;;
      --recipe) recipe=$2; shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  if [ "$deepspeed" = ds_configs/zero2.json ] && [ "$NPROC" -eq 1 ] && [ "${NNODES:-1}" -eq 1 ]; then
    deepspeed=ds_configs/zero2_offload.json  # one GPU: ZeRO-2 alone runs out of memory even for 3B
  fi
  [ -n "$deepspeed" ] && args=(--deepspeed "$deepspeed" "${args[@]}")
  out=$(output_dir_of "$recipe" "${args[@]}")
  echo "recipe $recipe | deepspeed ${deepspeed:-off} | GPUs $NPROC x nodes ${NNODES:-1} | output $out"
  launch "$module" --config "$recipe" "${args[@]}"
  echo "checkpoints: $out/checkpoint-*   final model + processor: $out   metrics: $out/metrics.csv   plots: $out/plots/"
}
