"""TRL internals suzak relies on, one contract each: a TRL upgrade that renames or reshapes one fails here, by name.

The behaviour behind each is tested elsewhere (tests/test_trainer.py, tests/test_metrics.py,
tests/test_vllm_colocate.py); these pin the names and signatures so the failure says what moved.
"""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer
from trl.generation.vllm_generation import VLLMGeneration


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize(
    ("method", "leading"),
    [
        ("_generate_and_score_completions", ["self", "inputs"]),  # images fitted before TRL's processor calls
        ("_generate_single_turn", ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"]),  # vLLM
        ("_log_completion_extra", ["self", "column", "values"]),  # completions.csv extra columns
        ("_tokenize_prompts", ["self", "prompts"]),  # tests read the training prompt ids here
        ("_calculate_rewards", ["self"]),  # bench/bench_grpo_speed.py times scoring here
    ],
)
def test_grpo_trainer_hooks(method, leading):
    assert _params(getattr(GRPOTrainer, method))[: len(leading)] == leading


def test_generate_single_turn_returns_completions_and_logprobs_only():
    """suzak collapses the prompt ids it hands vLLM; TRL must not send them on to training from this method."""
    source = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "return completion_ids, logprobs" in source
    assert "self.vllm_generation.generate(\n                prompts=prompt_ids," in source


def test_vllm_generation_takes_generation_kwargs_into_sampling_params():
    """suzak adds its logit bias to ``VLLMGeneration.generation_kwargs``; TRL merges that into SamplingParams."""
    assert "generation_kwargs" in _params(VLLMGeneration.__init__)
    assert "self.generation_kwargs = generation_kwargs or {}" in inspect.getsource(VLLMGeneration.__init__)
    source = inspect.getsource(VLLMGeneration.generate)
    assert "generation_kwargs.update(self.generation_kwargs)" in source  # colocate
    assert '"generation_kwargs": self.generation_kwargs' in source  # server


def test_grpo_trainer_builds_vllm_generation_from_this_module_name():
    """tests/test_vllm_colocate.py replaces ``trl.trainer.grpo_trainer.VLLMGeneration`` with a stand-in."""
    import trl.trainer.grpo_trainer as module

    assert module.VLLMGeneration is VLLMGeneration
    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)


def test_hf_generation_reads_generation_config_and_kwargs():
    """suzak extends TRL's ``suppress_tokens`` in both objects TRL hands HF generate."""
    source = inspect.getsource(GRPOTrainer.__init__)
    assert 'generation_kwargs["suppress_tokens"] = [model.config.image_token_id]' in source
    assert "self.generation_config = GenerationConfig(**generation_kwargs" in source
    assert "self.generation_kwargs = generation_kwargs" in source
