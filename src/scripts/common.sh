# common.sh - sourced by the launch scripts: repo root, virtualenv, .env, GPU count, and the launcher.
#   launch MODULE ARGS...   runs `python -m MODULE` (no GPU) or torchrun (suzak.runs.launch) over every GPU, multi-node via
#                           NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT (src/scripts/slurm/ sets them from
#                           SLURM's variables). SUZAK_DRY_RUN=1 prints the command instead of running it.
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
# The command that started this run: the resume line of a run stopped by a signal repeats it (suzak.runs.faults).
SUZAK_LAUNCH=${SUZAK_LAUNCH:-$(printf '%q ' bash "$0" "$@")}
export SUZAK_LAUNCH
# torchrun passes SIGUSR1 (SLURM's --signal) to the workers as it does SIGTERM, and waits this long for them to finish
# the step under way and write a checkpoint before it kills them (its default is 30 s).
export TORCHELASTIC_SIGNALS_TO_HANDLE=${TORCHELASTIC_SIGNALS_TO_HANDLE:-SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1}
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-900}

launch() {
  local module=$1 cmd; shift
  if [ "$NPROC" -eq 0 ]; then
    cmd=(python -m "$module" "$@")
  else
    # torchrun through suzak.runs.launch: a failed rank's own error line ends the output, not torchrun's traceback
    cmd=(python -m suzak.runs.launch --nnodes "${NNODES:-1}" --node_rank "${NODE_RANK:-0}" --nproc_per_node "$NPROC"
         --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}" -m "$module" "$@")
  fi
  if [ -n "${SUZAK_DRY_RUN:-}" ]; then  # print the command instead of running it (a check of a cluster's setup)
    echo "dry run: ${cmd[*]}"
    return
  fi
  "${cmd[@]}"
}

# output_dir the run will use: --output_dir on the command line, else OUTPUT_DIR, else the recipe's.
output_dir_of() {
  local recipe=$1; shift
  while [ $# -gt 0 ]; do [ "$1" = --output_dir ] && { echo "$2"; return; }; shift; done
  [ -n "${OUTPUT_DIR:-}" ] && { echo "$OUTPUT_DIR"; return; }
  python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get("output_dir", "?"))' "$recipe"
}

# checkpoints_in DIR: what the run left in DIR ("3 (newest DIR/checkpoint-300)", or "none saved" with save_strategy no).
checkpoints_in() {
  local path step count=0 newest=-1
  for path in "$1"/checkpoint-*; do
    [ -d "$path" ] || continue
    step=${path##*/checkpoint-}
    case $step in ''|*[!0-9]*) continue ;; esac
    count=$((count + 1)); [ "$step" -gt "$newest" ] && newest=$step
  done
  if [ "$count" -eq 0 ]; then echo "none saved"; else echo "$count (newest $1/checkpoint-$newest)"; fi
}

# preset_recipe NAME PRESETS: the recipe of preset NAME in PRESETS ("smoke=recipes/smoke.yaml demo=...").
preset_recipe() {
  local name=$1 pair
  for pair in $2; do [ "${pair%%=*}" = "$name" ] && { echo "${pair#*=}"; return; }; done
  local known; known=$(for pair in $2; do printf '%s ' "${pair%%=*}"; done)
  echo "unknown preset $name (known: ${known% })" >&2; return 2
}

# quantized_run RECIPE ARGS...: whether the run loads its model through bitsandbytes (load_in_4bit/load_in_8bit true
# in the recipe, or a flag turning it on; a flag turning it off wins over the recipe).
quantized_run() {
  local recipe=$1 found=1 i; shift
  grep -Eq '^load_in_(4|8)bit:[[:space:]]*(true|True|yes)' "$recipe" 2>/dev/null && found=0
  local args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[$i]} in
      --load_in_4bit|--load_in_8bit)
        case ${args[$((i + 1))]:-true} in true|True|yes|1|--*) found=0 ;; *) found=1 ;; esac ;;
      --load_in_4bit=*|--load_in_8bit=*)
        case ${args[$i]#*=} in true|True|yes|1) found=0 ;; *) found=1 ;; esac ;;
    esac
  done
  return $found
}

# run_recipe MODULE DEFAULT_RECIPE PRESETS ARGS...: the body of every launch script.
#   --preset NAME -> that preset's recipe from PRESETS ("smoke=recipes/smoke.yaml demo=recipes/demo.yaml"), CPU
#   recipes, so no DeepSpeed; --recipe PATH; everything else overrides the recipe.
#   On GPUs DeepSpeed ZeRO-2 with `--deepspeed auto`: each rank picks the fastest config predicted to fit its GPU
#   (the optimizer on the GPU, else offloaded to host RAM: suzak.models.memory, docs/benchmarks.md) and rank 0 says
#   which and why in one line; none for a QLoRA run (quantized_run); `--deepspeed PATH` (or none) overrides.
run_recipe() {
  local module=$1 recipe=$2 presets=$3 deepspeed=auto args=() out
  shift 3
  while [ $# -gt 0 ]; do
    case $1 in
      --preset) recipe=$(preset_recipe "$2" "$presets") || return 2
                deepspeed=""; shift 2 ;;
      --recipe) recipe=$2; shift 2 ;;
      --deepspeed) deepspeed=$2; [ "$2" = none ] && deepspeed=""; shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  if [ "$deepspeed" = auto ] && { [ "$NPROC" -eq 0 ] || quantized_run "$recipe" "${args[@]}"; }; then
    deepspeed=""  # no GPU: no DeepSpeed; QLoRA: the adapters fit every GPU, several GPUs run plain DDP
  fi
  [ -n "$deepspeed" ] && args=(--deepspeed "$deepspeed" "${args[@]}")
  out=$(output_dir_of "$recipe" "${args[@]}")
  echo "recipe $recipe | deepspeed ${deepspeed:-off}$([ "$deepspeed" = auto ] && echo ' (the fastest that fits: chosen by rank 0 below)') | GPUs $NPROC x nodes ${NNODES:-1} | output $out"
  local rc=0
  launch "$module" --config "$recipe" "${args[@]}" || rc=$?
  if [ "$rc" -ne 0 ] && [ -f "$out/preempted.json" ]; then  # stopped by a signal after a checkpoint (exit 75)
    echo "stopped after a checkpoint; resume with: $(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["resume"])' "$out/preempted.json")" >&2
    return 75
  fi
  [ "$rc" -eq 0 ] || return "$rc"
  echo "checkpoints: $(checkpoints_in "$out")   final model + processor: $out   log: $out/train.log   metrics: $out/metrics.csv"
  echo "plots: $out/plots/*.png   live view: python -m suzak.watch $out"
}
