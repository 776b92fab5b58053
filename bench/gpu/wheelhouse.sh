#!/usr/bin/env bash
# bench/gpu/wheelhouse.sh - on a connected CPU machine: the wheels the benchmark GPU machine lacks, ready to carry.
#
#   bash bench/gpu/wheelhouse.sh          # fills .whl-gpu/ (git-ignored), then splits it with carry-chunks.sh
#   bash bench/gpu/wheelhouse.sh --no-qlora   # the same without bitsandbytes (42 MB, only `run.sh qlora` needs it):
#                                             # 7 pieces instead of 8
#
# Downloads bench/gpu/device-requirements.txt as cp312 manylinux wheels (--no-deps: the list is the whole closure),
# builds DeepSpeed's wheel from its sdist (no ops compiled) with this checkout's .venv, and, when the workplace's
# ../shared/tools/carry-chunks.sh is there, splits .whl-gpu/ into pieces of one transfer each and prints the device
# commands to send them. On the GPU machine, bench/gpu/run.sh installs them into /tmp/site (no network needed).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.whl-gpu
mkdir -p "$out"
requirements=bench/gpu/device-requirements.txt
if [ "${1:-}" = --no-qlora ]; then  # the wheels of the list but bitsandbytes
  requirements=$(mktemp) && grep -v '^bitsandbytes==' bench/gpu/device-requirements.txt >"$requirements"
  mkdir -p .whl-gpu-aside && mv "$out"/bitsandbytes-*.whl .whl-gpu-aside/ 2>/dev/null || true
elif compgen -G ".whl-gpu-aside/bitsandbytes-*.whl" >/dev/null; then
  mv .whl-gpu-aside/bitsandbytes-*.whl "$out"/
fi
platforms=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
for n in $(seq 17 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$out" -r "$requirements"
if ! compgen -G "$out/deepspeed-*.whl" >/dev/null; then
  DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w "$out"
fi
echo "$(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
tool=../shared/tools/carry-chunks.sh
mkdir -p "$(dirname "$(git rev-parse --git-path info/exclude)")"  # carry-chunks.sh records .carry/ there
if [ -f "$tool" ]; then bash "$tool" "$out"; else echo "carry $out to the GPU machine as /tmp/carried/.whl-gpu"; fi
