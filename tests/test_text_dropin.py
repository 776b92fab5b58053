"""``VLMGRPOTrainer`` is a drop-in for TRL's ``GRPOTrainer`` on text-only models too.

TRL's own GRPO tests (``tests/test_grpo_trainer.py`` of trl 1.16: ``test_train``, ``test_train_dataset_format``,
``test_train_loss_types``, ``test_train_multiple_iterations``, ``test_train_peft_config``, ``test_train_peft_model``,
``test_train_reward_func_*``, ``test_train_with_iterable_dataset``, ``test_train_with_sync_ref_model``,
``test_train_with_off_policy_mask``, ``test_train_eval_on_start``, ``test_evaluate_with_eval_dataset``, …) train a
tiny text model they download; here the same patterns run on the offline tiny Qwen2.5 and Qwen3 causal LMs
(``tiny:qwen2_5_text``, ``tiny:qwen3_text``), a tiny Qwen2 sequence classifier standing in for TRL's reward model.

Each test runs both trainers from the same seed. It asserts for suzak's trainer what TRL's test asserts (a training
loss logged, every trainable parameter moved, a LoRA run's base weights kept, ...) and that TRL's own trainer on the
same run logged the same losses, rewards and metrics and ended with the same weights: on a text model suzak adds its
checks and logs (``rewards/<name>/nonfinite_frac``) and changes nothing of what is trained. Until this module, every
test ran on the tiny VL models, and GRPO on any text model crashed at its first step (``processing_class.tokenizer``:
a text model's processing class is the tokenizer itself).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDatasetDict
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from suzak.models.tiny import TEXT
from suzak.training.trainer import VLMGRPOTrainer

# The first lines of the Zen of Python, as TRL's "zen" test dataset: prompts to be completed.
ZEN = [
    "Beautiful is better than", "Explicit is better than", "Simple is better than", "Complex is better than",
    "Flat is better than", "Sparse is better than", "Readability", "Special cases aren't special enough to",
    "Although practicality beats", "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse",
    "There should be one", "Although that way may not be", "Now is better than", "If the implementation is hard to",
    "Namespaces are one honking",
]  # fmt: skip
TRAIN, TEST = ZEN[:12], ZEN[12:]
SUZAK_ONLY = ("/nonfinite_frac", "generated_tokens", "perf/real_token_fraction", "perf/tokens_per_s")  # metrics suzak
# logs beside TRL's (rewards/<name>/nonfinite_frac, the tokens each step sampled, the training passes' real-token
# fraction and EasyR1's tokens/s)
TIMING = ("runtime", "_per_second", "step_time")  # wall clock: train_runtime, eval_data1_samples_per_second, ...
# TRL's tests use a high learning rate (tiny gradients); max_steps keeps each run to a few steps, on the CPU (the
# config would otherwise ask for bf16, which a CPU-only machine refuses).
DEFAULTS = {"learning_rate": 0.1, "per_device_train_batch_size": 3, "num_generations": 3, "max_completion_length": 8,
            "report_to": "none", "max_steps": 3, "logging_steps": 1, "save_strategy": "no", "seed": 0,
            "use_cpu": True}  # fmt: skip


def zen(prompts: list[str] = TRAIN, conversational: bool = False) -> Dataset:
    """TRL's ``standard_prompt_only`` / ``conversational_prompt_only`` layout."""
    if conversational:
        return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    return Dataset.from_list([{"prompt": p} for p in prompts])


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion)) for completion in completions]


@pytest.fixture(scope="module")
def text_model(family_model_dir):
    """``text_model(family)``: the folder of the family's tiny causal LM (default: Qwen2.5's)."""
    return lambda family="qwen2_5_text": str(family_model_dir(family))


@pytest.fixture(scope="module")
def reward_model(family_model_dir, tmp_path_factory) -> str:
    """A tiny ``Qwen2ForSequenceClassification`` (one label) on the text tiny's tokenizer: TRL's tiny reward model."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    base = family_model_dir("qwen2_5_text")
    tokenizer = AutoTokenizer.from_pretrained(base)
    config = AutoConfig.from_pretrained(base, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("reward-model")
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@dataclass
class Run:
    trainer: GRPOTrainer
    before: dict[str, torch.Tensor]  # the trainable parameters before training
    result: dict | None = None  # what ``action`` returned (evaluate's metrics)

    def moved(self) -> dict[str, bool]:
        return {n: not torch.equal(p, self.trainer.model.get_parameter(n)) for n, p in self.before.items()}


def run_both(model, reward_funcs, train_dataset, tmp_path, *, action=None, peft_config=None, eval_dataset=None,
             padding_free: bool = False, **config) -> Run:  # fmt: skip
    """Build TRL's ``GRPOTrainer`` and suzak's ``VLMGRPOTrainer`` on the same model (a folder, or a model object,
    deep-copied for each), data and config; ``action(trainer)`` each (default: ``train()``); assert both logged the
    same metrics (TRL's keys, same values but wall-clock ones) and hold the same weights; return suzak's run.

    suzak's trainer runs its passes padded, as TRL's (``padding_free`` False): the comparison is of the hooks, to
    float round-off. Packed passes give the same numbers to round-off but not bit for bit (another summation order;
    rotary angles, computed in float32, at each row's positions from 0 where TRL's padded pass counts a left-padded
    row's from its padding), GRPO's gradient is a difference of near-equal terms (float32 ``grad_norm`` moves ~1e-4
    relative, as far as the padded path's own is from the float64 one), and Adam's first steps at TRL's test learning
    rate (0.1) magnify such differences into the weights: ``test_padding_free_trains_as_trl_does_in_float64``."""
    runs = {}
    for cls in (GRPOTrainer, VLMGRPOTrainer):
        args = GRPOConfig(output_dir=str(tmp_path / cls.__name__), **(DEFAULTS | config))
        extra = {"padding_free": padding_free} if cls is VLMGRPOTrainer else {}
        trainer = cls(model=model if isinstance(model, str) else copy.deepcopy(model), reward_funcs=reward_funcs,
                      args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, peft_config=peft_config,
                      **extra)  # fmt: skip
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        result = action(trainer) if action else trainer.train() and None
        runs[cls] = Run(trainer, before, result)
    assert_same_run(runs[GRPOTrainer], runs[VLMGRPOTrainer])
    return runs[VLMGRPOTrainer]


def assert_same_run(trl: Run, ours: Run) -> None:
    theirs, mine = trl.trainer.state.log_history, ours.trainer.state.log_history
    assert len(mine) == len(theirs) and len(mine) > 0
    for expected, got in zip(theirs, mine, strict=True):
        assert_same_metrics(expected, got)
    if isinstance(trl.result, dict) and all(isinstance(v, float | int) for v in trl.result.values()):  # metrics
        assert_same_metrics(trl.result, ours.result)
    theirs_params = dict(trl.trainer.model.named_parameters())
    for name, param in ours.trainer.model.named_parameters():
        torch.testing.assert_close(param, theirs_params[name], rtol=1e-5, atol=1e-6, msg=name)


def assert_same_metrics(expected: dict, got: dict) -> None:
    """Every metric TRL logged, with the same value (wall-clock ones aside); suzak logs only its own besides."""
    assert set(expected) <= set(got), f"metrics TRL logs that suzak does not: {set(expected) - set(got)}"
    extra = {k for k in set(got) - set(expected) if not k.endswith(SUZAK_ONLY)}
    assert not extra, f"metrics only suzak logs: {extra}"
    for key, value in expected.items():
        if key.endswith(TIMING):
            continue
        if isinstance(value, float | int):
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, expected.get("step"))
        else:
            assert got[key] == value, (key, expected.get("step"))


def assert_trained(run: Run) -> None:
    """TRL's assertions after ``train()``: a training loss, and every trainable parameter changed."""
    assert run.trainer.state.log_history[-1]["train_loss"] is not None
    unchanged = [name for name, moved in run.moved().items() if not moved]
    assert unchanged == [], f"parameters that did not change: {unchanged}"


# --- TRL's test_train, test_train_dataset_format, test_train_loss_types, test_train_multiple_iterations ------------


@pytest.mark.parametrize("family", TEXT)
def test_train(text_model, reward_model, tmp_path, family):
    """TRL's ``test_train``: a reward model, every parameter trained; on Qwen2.5 and Qwen3."""
    run = run_both(text_model(family), reward_model, zen(), tmp_path)
    classes = {"qwen2_5_text": "Qwen2ForCausalLM", "qwen3_text": "Qwen3ForCausalLM"}
    assert type(run.trainer.model).__name__ == classes[family]
    assert_trained(run)


def test_train_conversational_dataset(text_model, reward_model, tmp_path):
    """TRL's ``test_train_dataset_format`` (conversational prompts, rendered by the model's chat template)."""
    assert_trained(run_both(text_model(), reward_model, zen(conversational=True), tmp_path))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_train_loss_types(text_model, reward_model, tmp_path, loss_type):
    """TRL's ``test_train_loss_types``: each loss, over 2 accumulated micro-batches (luspo at the sequence level)."""
    run = run_both(text_model(), reward_model, zen(), tmp_path, loss_type=loss_type, gradient_accumulation_steps=2,
                   max_completion_length=32, max_steps=2,
                   importance_sampling_level="sequence" if loss_type == "luspo" else "token")  # fmt: skip
    assert_trained(run)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_padding_free_trains_as_trl_does_in_float64(text_model, reward_model, tmp_path, loss_type):
    """suzak's default, packed passes, against TRL's padded ones, over 2 accumulated micro-batches of prompts of
    different lengths: the same metrics and weights (to 1e-5) in float64 at a learning rate of 1e-3, where round-off
    does not reach them (see :func:`run_both`)."""
    run = run_both(text_model(), reward_model, zen(), tmp_path, loss_type=loss_type, gradient_accumulation_steps=2,
                   max_completion_length=32, max_steps=2, padding_free=True, learning_rate=1e-3,
                   model_init_kwargs={"dtype": torch.float64})  # fmt: skip
    assert run.trainer.padding_free
    fractions = [log["perf/real_token_fraction"] for log in run.trainer.state.log_history if "loss" in log]
    assert fractions == [1.0, 1.0]
    assert_trained(run)


def test_train_multiple_iterations(text_model, reward_model, tmp_path):
    """TRL's ``test_train_multiple_iterations``: num_iterations 2 (each generation trained on twice, old log-probs)."""
    run = run_both(text_model(), reward_model, zen(), tmp_path, num_iterations=2, max_steps=4)
    assert_trained(run)
    assert any("clip_ratio/region_mean" in log for log in run.trainer.state.log_history)


def test_train_with_iterable_dataset(text_model, reward_model, tmp_path):
    """TRL's ``test_train_with_iterable_dataset`` (max_steps is required: no length)."""
    run = run_both(text_model(), reward_model, zen().to_iterable_dataset(), tmp_path)
    assert run.trainer.args.accelerator_config.dispatch_batches is False
    assert_trained(run)


# --- LoRA: test_train_peft_config, test_train_peft_model --------------------------------------------------------


def _lora_moved_base_kept(run: Run, base_names: set[str]) -> None:
    assert run.trainer.state.log_history[-1]["train_loss"] is not None
    moved = run.moved()
    base = [n for n in moved if n in base_names]
    adapters = [n for n in moved if n not in base_names and "base_layer" not in n]
    assert adapters and all(moved[n] for n in adapters), [n for n in adapters if not moved[n]]
    for name in base:
        torch.testing.assert_close(run.before[name], run.trainer.model.get_parameter(name))


def test_train_peft_config(text_model, reward_model, tmp_path):
    """TRL's ``test_train_peft_config``: the trainer wraps the model in LoRA; adapters train, the base stays."""
    from peft import LoraConfig

    model = AutoModelForCausalLM.from_pretrained(text_model(), dtype="float32")
    base_names = {f"base_model.model.{n}" for n, _ in model.named_parameters()}
    run = run_both(model, reward_model, zen(), tmp_path, peft_config=LoraConfig())
    _lora_moved_base_kept(run, base_names)


def test_train_peft_model(text_model, reward_model, tmp_path):
    """TRL's ``test_train_peft_model``: a model already wrapped in LoRA."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(text_model("qwen3_text"), dtype="float32"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    base_names = {n for n, p in model.named_parameters() if not p.requires_grad}
    run = run_both(model, reward_model, zen(), tmp_path)
    _lora_moved_base_kept(run, base_names)


# --- reward functions: test_train_reward_func_*, test_train_multiple_reward_funcs*, test_train_different_reward_model


def _conversational_length(completions, **kwargs) -> list[float]:
    return [float(len(completion[0]["content"])) for completion in completions]


def _unique_letters(completions, **kwargs) -> list[float]:
    return [float(len(set(completion))) for completion in completions]


def _ones(completions, **kwargs) -> list[int]:
    return [1 for _ in completions]


async def _async_length(completions, **kwargs) -> list[float]:
    return [float(len(completion)) for completion in completions]


def _not_applicable(completions, **kwargs) -> list[None]:
    return [None] * len(completions)


@pytest.mark.parametrize(
    ("rewards", "conversational", "config"),
    [
        pytest.param([length_reward], False, {}, id="standard"),
        pytest.param([_conversational_length], True, {}, id="conversational"),
        pytest.param([length_reward, _unique_letters], False, {}, id="multiple"),
        pytest.param([length_reward, _ones, _async_length], False, {}, id="sync_and_async"),
        pytest.param([length_reward, _not_applicable], False, {}, id="None_output"),
        pytest.param([length_reward, _unique_letters], False, {"reward_weights": [0.7, 0.3]}, id="weights"),
        pytest.param(["model", length_reward], False, {}, id="mixed_model_and_function"),
    ],
)  # fmt: skip
def test_train_reward_funcs(text_model, reward_model, tmp_path, rewards, conversational, config):
    """TRL's reward-function tests: plain, conversational, several, sync beside async, one returning None for every
    completion, weighted, a reward model beside a function."""
    rewards = [reward_model if r == "model" else r for r in rewards]
    run = run_both(text_model(), rewards, zen(conversational=conversational), tmp_path, **config)
    assert_trained(run)


def test_train_reward_func_additional_column(text_model, tmp_path):
    """TRL's ``test_train_reward_func_additional_column``, and the rewards see the same columns under both
    trainers (suzak's own row names never reach them)."""
    seen = []

    def closer_to_value(completions, some_values, **kwargs):
        seen.append(sorted(kwargs))
        return [float(abs(len(c) - v)) for c, v in zip(completions, some_values, strict=True)]

    dataset = zen().add_column("some_values", list(range(len(TRAIN))))
    run = run_both(text_model(), closer_to_value, dataset, tmp_path)
    assert_trained(run)
    half = len(seen) // 2
    assert seen[:half] == seen[half:] and "some_values" not in seen[0] and "prompts" in seen[0]


# --- reference model and the off-policy mask --------------------------------------------------------------------


def test_train_with_sync_ref_model(text_model, reward_model, tmp_path):
    """TRL's ``test_train_with_sync_ref_model`` (beta 0.1, so a reference model exists and is synced)."""

    def ref_before(trainer):
        before = {n: p.clone() for n, p in trainer.ref_model.named_parameters()}
        trainer.train()
        return before

    run = run_both(text_model(), reward_model, zen(), tmp_path, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2,
                   action=ref_before)  # fmt: skip
    assert_trained(run)
    ref = dict(run.trainer.ref_model.named_parameters())
    assert all(not torch.equal(before, ref[n]) for n, before in run.result.items())
    assert any(log.get("kl", 0) > 0 for log in run.trainer.state.log_history)


def test_train_with_off_policy_mask(text_model, reward_model, tmp_path):
    """TRL's ``test_train_with_off_policy_mask``."""
    assert_trained(run_both(text_model(), reward_model, zen(), tmp_path, off_policy_mask_threshold=0.5))


# --- evaluation: test_train_eval_on_start, test_evaluate_with_eval_dataset ----------------------------------------


def test_train_eval_on_start(text_model, reward_model, tmp_path):
    """TRL's ``test_train_eval_on_start`` (loss_type grpo, evaluation before the first step and every 2 steps)."""
    run = run_both(text_model(), reward_model, zen(), tmp_path, eval_dataset=zen(TEST), loss_type="grpo", max_steps=4,
                   per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2, eval_on_start=True)  # fmt: skip
    assert [log["step"] for log in run.trainer.state.log_history if "eval_loss" in log] == [0, 2, 4]


@pytest.mark.parametrize("kind", ["dataset", "iterable_dataset", "dataset_dict", "iterable_dataset_dict",
                                  "dict_of_dataset", "dict_of_iterable_dataset"])  # fmt: skip
def test_evaluate_with_eval_dataset(text_model, reward_model, tmp_path, kind):
    """TRL's ``test_evaluate_with_eval_dataset``: ``evaluate(eval_dataset=...)`` with each kind of eval set."""
    split = zen(TEST).to_iterable_dataset() if "iterable" in kind else zen(TEST)
    if kind in ("dataset", "iterable_dataset"):
        eval_dataset = split
    elif kind.endswith("_dict"):
        eval_dataset = (IterableDatasetDict if "iterable" in kind else DatasetDict)({"data1": split, "data2": split})
    else:
        eval_dataset = {"data1": split, "data2": split}
    run = run_both(text_model(), reward_model, zen(), tmp_path, per_device_eval_batch_size=3,
                   action=lambda trainer: trainer.evaluate(eval_dataset=eval_dataset))  # fmt: skip
    keys = ["eval_loss"] if kind in ("dataset", "iterable_dataset") else ["eval_data1_loss", "eval_data2_loss"]
    assert all(run.result[key] is not None for key in keys)


# --- more of TRL's options, as TRL's tests set them ----------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"importance_sampling_level": "sequence"}, id="sequence_importance_sampling"),
        pytest.param({"top_entropy_quantile": 0.2}, id="entropy_filter"),
        pytest.param({"scale_rewards": "batch"}, id="scale_rewards_batch"),
        pytest.param({"generation_kwargs": {"do_sample": True, "top_k": 50, "length_penalty": -0.1}},
                     id="generation_kwargs"),
        pytest.param({"chat_template_kwargs": {"enable_thinking": False}}, id="chat_template_kwargs"),
        pytest.param({"beta": 0.1}, id="beta_non_zero"),
    ],
)  # fmt: skip
def test_train_with_options(text_model, reward_model, tmp_path, config):
    """TRL's tests of these options (``test_train_sequence_importance_sampling``, ``..._entropy_filter``, ``..._scale_rewards``, ``..._generation_kwargs``, ``..._chat_template_kwargs``,
    ``test_train_beta_non_zero``); chat_template_kwargs on Qwen3, whose template reads enable_thinking."""
    family = "qwen3_text" if "chat_template_kwargs" in config else "qwen2_5_text"
    dataset = zen(conversational="chat_template_kwargs" in config)
    assert_trained(run_both(text_model(family), reward_model, dataset, tmp_path, **config))


def test_train_with_mask_truncated_completions_all_masked(text_model, reward_model, tmp_path):
    """TRL's ``test_train_with_mask_truncated_completions_all_masked``: the random tiny model never ends a completion
    within 8 tokens, so every completion is truncated, masked out of the loss, and no weight moves."""
    run = run_both(text_model(), reward_model, zen(), tmp_path, mask_truncated_completions=True)
    assert all(log["completions/clipped_ratio"] == 1.0 for log in run.trainer.state.log_history if "loss" in log)
    assert not any(run.moved().values())


def test_prepare_input_called_with_correct_data(text_model, tmp_path):
    """TRL's ``test_prepare_input_called_with_correct_data``: ``training_step`` gets each generation batch's rows,
    every prompt ``num_generations`` times in dataset order, the batch repeated for ``steps_per_generation ×
    num_iterations`` micro-steps. suzak's rows are TRL's plus ``suzak_row`` (the row's position, which names it in
    error messages where the dataset has no id column; docs/reliability.md), and no reward function sees it."""
    from unittest.mock import patch

    seen_by_rewards = []

    def recording_reward(completions, **kwargs) -> list[float]:
        seen_by_rewards.append(set(kwargs))
        return length_reward(completions)

    config = {"gradient_accumulation_steps": 3, "steps_per_generation": 4, "num_generations": 4,
              "per_device_train_batch_size": 6, "num_iterations": 2, "shuffle_dataset": False, "max_steps": 2}  # fmt: skip
    expected = [{"prompt": prompt} for prompt in TRAIN[:6] for _ in range(4)]
    for cls in (GRPOTrainer, VLMGRPOTrainer):
        args = GRPOConfig(output_dir=str(tmp_path / cls.__name__), **(DEFAULTS | config))
        trainer = cls(model=text_model(), reward_funcs=recording_reward, args=args, train_dataset=zen())
        with patch.object(cls, "training_step", wraps=trainer.training_step) as step:
            trainer.train()
        assert step.call_count == 6  # 2 steps x 3 micro-steps, all from the first generation batch
        batches = [call.args[1] for call in step.call_args_list]
        if cls is VLMGRPOTrainer:
            assert all([row.pop("suzak_row") for row in batch] == [i // 4 for i in range(24)] for batch in batches)
        assert all(batch == expected for batch in batches)
    assert seen_by_rewards and all("suzak_row" not in keys for keys in seen_by_rewards)
