"""``python -m suzak.train`` with a probe on TRL's colocated vLLM, for the vLLM tier (tests/test_vllm_tier.py).

    python tests/vllm_probe.py --record FILE [--frozen-lm-head] -- SUZAK_TRAIN_FLAGS...

``--record`` writes, when the run ends (also when it stops on an error), what the real engine was handed and gave
back: the prompt ids training uses (``_tokenize_prompts`` as TRL's ``_generate`` calls it: suzak's, which tokenizes
each distinct prompt once and lays the ids out for every row), the prompt ids vLLM ran (its ``prompt_token_ids``: the
prompt after its own expansion of each image placeholder), every sampled completion's ids, and the sampling settings
TRL passed (suzak's logit bias among them).

``--frozen-lm-head`` puts vLLM's own CPU dispatch back on the LM head (and embeddings) while suzak keeps the linear
layers live: vLLM then samples from the LM head's packed copy made at load, whatever the weight sync writes, which
is the silent frozen sampler suzak fixes (``suzak.trl_internals.vllm_engine.keep_vllm_cpu_weights_live``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import sys


def _record(path: str) -> None:
    from trl.generation import vllm_generation

    from suzak.trl_internals.hooks import GRPOHooks

    seen: dict[str, list] = {"training_prompt_ids": [], "vllm_prompt_ids": [], "completion_ids": [], "logit_bias": [],
                             "vllm_images": [], "vllm_encoded": []}  # fmt: skip
    atexit.register(lambda: open(path, "w").write(json.dumps(seen)))

    tokenize = GRPOHooks._tokenize_prompts
    generate = vllm_generation.VLLMGeneration.generate

    def recorded_tokenize(self, prompts):
        result = tokenize(self, prompts)
        seen["training_prompt_ids"] += [list(ids) for ids in result[0]]
        return result

    def recorded_generate(self, *args, **kwargs):
        if self.mode == "colocate":
            self.llm.apply_model(_count_encoded)
        prompt_ids, completion_ids, *rest = generate(self, *args, **kwargs)
        if self.mode == "colocate":  # the images of this call's requests, and how many vLLM's tower encoded
            images = kwargs.get("images", args[1] if len(args) > 1 else None) or []
            seen["vllm_images"].append(sum(len(row) for row in images if row))
            seen["vllm_encoded"].append(sum(self.llm.apply_model(_taken_count)))
        seen["vllm_prompt_ids"] += [list(ids) for ids in prompt_ids]
        seen["completion_ids"] += [list(ids) for ids in completion_ids]
        bias = self.generation_kwargs.get("logit_bias") or {}
        seen["logit_bias"].append({str(token): value for token, value in bias.items()})
        return (prompt_ids, completion_ids, *rest)

    GRPOHooks._tokenize_prompts = recorded_tokenize
    vllm_generation.VLLMGeneration.generate = recorded_generate


def _count_encoded(model) -> None:
    """A hook on vLLM's vision tower (in its worker) counting the images (grid rows) it encodes; installed once."""
    tower = getattr(model, "visual", None)
    if tower is None or hasattr(tower, "probe_encoded"):
        return

    def count(module, args, kwargs):
        grid = kwargs.get("grid_thw", args[1] if len(args) > 1 else None)
        module.probe_encoded += len(grid) if grid is not None else 0

    tower.probe_encoded = 0
    tower.register_forward_pre_hook(count, with_kwargs=True)


def _taken_count(model) -> int:
    """The images vLLM's tower encoded since the last call (0 for a text model: no tower)."""
    tower = getattr(model, "visual", None)
    if tower is None:
        return 0
    count, tower.probe_encoded = tower.probe_encoded, 0
    return count


def _freeze_lm_head() -> None:
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from suzak.trl_internals.vllm_engine import keep_vllm_cpu_weights_live

    keep_vllm_cpu_weights_live()
    live = layer_utils.dispatch_cpu_unquantized_gemm

    def frozen_head(layer, remove_weight):
        if isinstance(layer, VocabParallelEmbedding):  # the LM head is one (ParallelLMHead), tied or not
            return live.vllm_dispatch(layer, remove_weight)
        return live(layer, remove_weight)

    frozen_head.keeps_weights_live = True
    layer_utils.dispatch_cpu_unquantized_gemm = frozen_head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", required=True)
    parser.add_argument("--frozen-lm-head", action="store_true")
    args, train_argv = parser.parse_known_args()
    _record(args.record)
    if args.frozen_lm_head:
        _freeze_lm_head()
    from suzak.train import main as train

    train([a for a in train_argv if a != "--"])


if __name__ == "__main__":
    sys.exit(main())


def hash_or_length(completions, **kwargs) -> list[float]:
    """A reward by dotted path (``vllm_probe.hash_or_length``): 1.0 for a ``####`` answer line (so the pre-flight's
    ideal GSM8K answers score full marks), else a share of the length, which varies within every group of a random
    model's completions, so each step moves the weights (GSM8K's own rewards score a tiny model's completions 0)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [1.0 if "####" in text else min(len(text), 100) / 200 for text in texts]
