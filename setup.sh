#!/usr/bin/env bash
# setup.sh - install suzak in one idempotent command.
#
#   bash setup.sh                 # .venv in the repo; CPU or GPU path picked by whether nvidia-smi sees a GPU
#   bash setup.sh --use-active    # install into the virtualenv/conda env that is active now
#   bash setup.sh --cpu | --gpu   # force a path
#   bash setup.sh --no-dev        # skip pytest/ruff/scipy
#
# CPU path: torch 2.14.1 + torchvision 0.29.1, suzak, DeepSpeed (ops not prebuilt; ZeRO runs on CPU for tests).
# GPU path: torch 2.13.0 + torchvision 0.28.0 (the pair vllm 0.31.0 pins), suzak, vllm 0.31.0, DeepSpeed, and
#           flash-attn built against that torch; a failed flash-attn build is a warning (training then uses sdpa).
# torch goes in first: anything torch-dependent installed before it would pull another multi-GB torch build.
set -euo pipefail
cd "$(dirname "$0")"

path=auto use_active=0 dev=1
for arg in "$@"; do
  case $arg in
    --cpu) path=cpu ;; --gpu) path=gpu ;; --use-active) use_active=1 ;; --no-dev) dev=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$use_active" = 1 ]; then
  [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] || { echo "setup.sh: --use-active but no virtualenv/conda env is active" >&2; exit 2; }
else
  py=$(command -v python3.11 || command -v python3)
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup.sh: needs Python >= 3.11 ($py is older)" >&2; exit 2; }
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
pip() { python -m pip "$@"; }
pip install -q --upgrade pip setuptools wheel

if [ "$path" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then path=gpu; else path=cpu; fi
fi
if [ "$path" = gpu ]; then torch=2.13.0 vision=0.28.0; else torch=2.14.1 vision=0.29.1; fi

have=$(python -c 'import torch, torchvision as v; print(torch.__version__.split("+")[0], v.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" != "$torch $vision" ]; then
  echo "== installing torch $torch + torchvision $vision ($path path)"
  pip install "torch==$torch" "torchvision==$vision"
fi

extras=""; [ "$dev" = 1 ] && extras="[dev]"
echo "== installing suzak$extras"
pip install -q -e ".$extras"

# DeepSpeed's sdist imports torch while building: build it against the torch above, with no ops compiled ahead.
if ! python -c 'import deepspeed' >/dev/null 2>&1; then
  echo "== installing deepspeed"
  DS_BUILD_OPS=0 pip install -q --no-build-isolation "deepspeed==0.19.8"
fi

if [ "$path" = gpu ]; then
  echo "== installing vllm 0.31.0"
  pip install -q "vllm==0.31.0" "torch==$torch" "torchvision==$vision"
  if ! python -c 'import flash_attn' >/dev/null 2>&1; then
    echo "== building flash-attn (can take a while)"
    MAX_JOBS=${MAX_JOBS:-8} pip install -q --no-build-isolation flash-attn \
      || echo "WARNING: flash-attn did not build; training falls back to sdpa attention (slower, more memory)."
  fi
fi

python - <<'EOF'
import importlib.metadata as m
names = ["torch", "torchvision", "transformers", "trl", "accelerate", "datasets", "qwen-vl-utils", "math-verify",
         "peft", "deepspeed", "vllm", "flash-attn", "pytest"]
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
print("installed: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
[ "$use_active" = 1 ] || echo "activate with:  . .venv/bin/activate"
echo "next:  bash src/scripts/run_grpo_clevr.sh --preset smoke   (offline CPU smoke run)"
