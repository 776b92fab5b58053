#!/usr/bin/env bash
# bench/gpu/run.sh STAGE... - on the benchmark GPU machine (no network): install the carried wheels once, then run.
#
#   bash bench/gpu/run.sh check              # vLLM imports, the vLLM boundary and GPU tests
#   bash bench/gpu/run.sh train [ARGS...]    # bench_grpo_speed.py --device cuda (ARGS go to it, e.g. --rows suzak:vllm:64)
#   bash bench/gpu/run.sh eval [ARGS...]     # bench_eval_speed.py --device cuda
#   bash bench/gpu/run.sh selftest           # python -m suzak.selftest --device cuda --vllm
#   bash bench/gpu/run.sh qlora              # the QLoRA tests on CUDA bitsandbytes, then the 7B QLoRA memory row
#
# The wheels come from bench/gpu/wheelhouse.sh, unpacked by the carry-chunks pieces under /tmp/carried/.whl-gpu
# (WHEELS=DIR for another folder); they are installed into /tmp/site, which lasts while the machine stays warm.
# Logs and results go to $OUT (the device tool brings them back): copy results_*.jsonl rows into bench/.
set -uo pipefail
cd "$(dirname "$0")/../.."
site=/tmp/site wheels=${WHEELS:-/tmp/carried/.whl-gpu} out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ ! -f "$site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
    >"$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
  touch "$site/.installed"
fi
export PYTHONPATH=$site:$PWD/src PYTHONUNBUFFERED=1 SUZAK_COMMIT=${SUZAK_COMMIT:-?}
stage=${1:?usage: run.sh check|train|eval|qlora|selftest [ARGS...]}
shift
case $stage in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
    python3 bench/gpu/trace_vllm_imports.py >"$out/trace.txt" 2>&1; echo "trace exit $?"
    python3 -m pytest -q -p no:cacheprovider tests/test_vllm_boundary.py tests/test_vllm_colocate.py \
      tests/test_gpu.py tests/test_eval_gpu.py 2>&1 | tee "$out/check.log" | tail -15 ;;
  train)
    python3 bench/bench_grpo_speed.py --device cuda --results "$out/results_grpo_speed.jsonl" --log_dir "$out/logs" "$@" 2>&1 \
      | tee -a "$out/train.log" | grep -v '^{' ;;
  eval)
    python3 bench/bench_eval_speed.py --device cuda --results "$out/results_eval_speed.jsonl" --log_dir "$out/logs" "$@" 2>&1 \
      | tee "$out/eval.log" | grep -v '^{' ;;
  qlora)
    python3 -c "import bitsandbytes, torch; print('bitsandbytes', bitsandbytes.__version__, torch.cuda.get_device_name())" \
      2>&1 | tee "$out/qlora.log"
    python3 -m pytest -q -p no:cacheprovider tests/test_qlora.py 2>&1 | tee -a "$out/qlora.log" | tail -5
    python3 bench/bench_grpo_memory.py --shape 7b --mode qlora --steps 3 --results "$out/results_grpo_memory.jsonl" \
      2>&1 | tee -a "$out/qlora.log" | grep '^{' ;;
  selftest)
    python3 -m suzak.selftest --device cuda --vllm --json "$out/selftest-vllm.json" "$@" 2>&1 | tee "$out/selftest.log" ;;
  *) echo "unknown stage $stage (check, train, eval, qlora, selftest)" >&2; exit 2 ;;
esac
