"""Which distributions does vLLM's generate path for Qwen2.5-VL import? (how bench/gpu/device-requirements.txt was made)

Run it with the Python of a virtualenv that has the GPU path's pins (vllm 0.24.0, torch 2.11.0, transformers 5.17.0,
trl 1.16.0); no GPU is needed, only imports happen:

    python bench/gpu/trace_vllm_imports.py                                   # distributions imported
    python bench/gpu/trace_vllm_imports.py --have machine-packages.txt       # ... that the GPU machine lacks
    python bench/gpu/trace_vllm_imports.py --hide flashinfer-cubin,av        # as if these were not installed

It imports vLLM's offline ``LLM``, its engine, scheduler, GPU worker and model runner, the Qwen2-VL/Qwen2.5-VL/Qwen3-VL
models, the attention backends, the sampler, the multimodal processing and the structured-output modules, plus TRL's
GRPO trainer and its vLLM backend. Exit code 1 when any of them fails to import.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import re
import sys

MODULES = [
    "vllm", "vllm.entrypoints.llm", "vllm.sampling_params", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core",
    "vllm.v1.engine.core_client", "vllm.v1.engine.input_processor", "vllm.v1.engine.output_processor",
    "vllm.v1.engine.detokenizer", "vllm.v1.executor.uniproc_executor", "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner",
    "vllm.model_executor.models.qwen2_5_vl", "vllm.model_executor.models.qwen2_vl",
    "vllm.model_executor.models.qwen3_vl", "vllm.model_executor.models.qwen2",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.flashinfer", "vllm.v1.sample.sampler", "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.structured_output", "vllm.v1.core.sched.scheduler", "vllm.multimodal.processing", "vllm.multimodal.image",
    "vllm.compilation.backends", "vllm.compilation.decorators", "vllm.model_executor.model_loader.default_loader",
    "vllm.distributed.parallel_state", "vllm.lora.request", "vllm.transformers_utils.processor", "vllm.tokenizers",
    "vllm.renderers", "vllm.v1.worker.gpu_input_batch", "vllm.v1.kv_cache_interface",
    "vllm.model_executor.layers.rotary_embedding", "vllm.model_executor.layers.linear",
    "vllm.model_executor.layers.logits_processor", "vllm.model_executor.layers.vocab_parallel_embedding",
    "trl.generation.vllm_generation", "trl.trainer.grpo_trainer",
]  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def hide(distributions: set[str]) -> set[str]:
    """Make the top-level modules owned only by ``distributions`` unimportable (and unfindable by find_spec)."""
    owners = importlib.metadata.packages_distributions()
    hidden = {top for top, dists in owners.items() if all(norm(d) in distributions for d in dists)}

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in hidden:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    original = importlib.util.find_spec

    def find_spec(name, package=None):
        return None if name.split(".")[0] in hidden else original(name, package)

    importlib.util.find_spec = find_spec
    sys.meta_path.insert(0, Hide())
    return hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--have", help="file of distribution names already installed where the list is for")
    parser.add_argument("--hide", default="", help="comma-separated distributions to treat as not installed")
    args = parser.parse_args()
    hidden = hide({norm(d) for d in args.hide.split(",") if d}) if args.hide else set()
    before = set(sys.modules)
    failed = {}
    for module in MODULES:
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - every failure is reported, not just the first
            failed[module] = f"{type(error).__name__}: {error}"
    owners = importlib.metadata.packages_distributions()
    tops = {name.split(".")[0] for name in set(sys.modules) - before}
    dists = {norm(d) for top in tops for d in owners.get(top, [])}
    have = {norm(n) for n in open(args.have).read().split()} if args.have else set()
    for dist in sorted(dists - have):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue  # a vendored module (setuptools' _vendor) with no distribution of its own
        print(f"{dist}=={version}")
    if hidden:
        print(f"# hidden top-level modules: {', '.join(sorted(hidden))}", file=sys.stderr)
    for module, error in failed.items():
        print(f"FAILED {module}: {error}", file=sys.stderr)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
