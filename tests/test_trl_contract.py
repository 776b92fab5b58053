"""TRL internals suzak relies on (all used in src/suzak/trl_internals/; tests and bench use two more), and the one
transformers ``Trainer`` internal it calls (``_save_checkpoint``), one contract each: a TRL upgrade that renames or
reshapes one fails here, by name.

The behaviour behind each is tested elsewhere too (tests/test_trainer.py, tests/test_metrics.py,
tests/test_vllm_colocate.py); these pin the names and signatures so the failure says what moved.
"""

from __future__ import annotations

import inspect
import re

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
        ("_tokenize_prompts", ["self", "prompts"]),  # video clips' metadata; tests read the prompt ids here
        ("_compute_loss", ["self", "model", "inputs"]),  # the batch's video tensors, while TRL runs the model
        (
            "_get_per_token_logps_and_entropies",  # video rows: chunks with their video tensors (feeding_videos)
            ["self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"],
        ),
        ("_calculate_rewards", ["self"]),  # bench/bench_grpo_speed.py times scoring here
        ("_prepare_inputs", ["self", "generation_batch"]),  # dynamic sampling: which steps train on a kept group
        ("_get_train_sampler", ["self", "dataset"]),  # each epoch's order replayed from the seed (epochs)
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


def test_colocated_generation_sends_llm_generate_one_request_per_prompt():
    """``vllm_requests_with_videos`` gives each request ``llm.generate`` receives its row's video: TRL's colocated
    path must build one ``{"prompt_token_ids": ...}`` dict per prompt, in order, and hand the list to
    ``self.llm.generate`` as its first argument."""
    source = inspect.getsource(VLLMGeneration.generate)
    assert '"n": 1,  # vLLM on each GPU generates only 1 in colocate mode' in source
    assert 'row = {"prompt_token_ids": ids}' in source
    assert 'vllm_prompts = [{"prompt_token_ids": ids} for ids in all_prompts]' in source
    assert "self.llm.generate(vllm_prompts, sampling_params=sampling_params" in source


def test_grpo_trainer_builds_vllm_generation_from_this_module_name():
    """tests/test_vllm_colocate.py replaces ``trl.trainer.grpo_trainer.VLLMGeneration`` with a stand-in."""
    import trl.trainer.grpo_trainer as module

    assert module.VLLMGeneration is VLLMGeneration
    assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)


def test_logs_layout_read_by_completion_rows():
    """``completion_rows`` reads these deques of ``GRPOTrainer._logs`` (the newest entries are the scored batch)."""
    source = inspect.getsource(GRPOTrainer.__init__)
    for key in ("prompt", "completion", "advantages"):
        assert f'"{key}": deque(maxlen=args.generation_batch_size)' in source
    for key in ("rewards", "extra"):
        assert f'"{key}": defaultdict(lambda: deque(maxlen=args.generation_batch_size))' in source


def test_logs_images_hold_each_rollouts_tool_images():
    """The W&B table's image column shows each rollout's crops after its prompt's images, as TRL builds it: the tool
    images are appended to each rollout's images, which TRL gathers into ``_logs["images"]`` (with
    ``log_multimodal``) and turns into the table's column in ``log``; ``log`` makes the completions text first."""
    generate = inspect.getsource(GRPOTrainer._generate)
    assert "images = [(existing or []) + new for existing, new in zip(images, tool_images, strict=True)]" in generate
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert (
        'self._logs["images"].extend(gather_object(images))' in score
        and "if images is not None and self.log_multimodal" in score
    )
    log = inspect.getsource(GRPOTrainer.log)
    assert 'for image_list in self._logs["images"]:' in log
    assert '"completion": [strip_images_from_messages(messages) for messages in self._logs["completion"]],' in log


def test_reward_call_kwargs_match_calculate_rewards():
    """The pre-flight calls rewards with ``suzak.trl_internals.rewards.reward_call_kwargs``: TRL's own set of names."""
    from suzak.trl_internals.rewards import REWARD_CALL_KWARGS

    source = inspect.getsource(GRPOTrainer._calculate_rewards) + inspect.getsource(GRPOTrainer)
    trl_set = {"trainer_state", "log_extra", "log_metric", "environments"}
    for name in trl_set:
        assert f'reward_kwargs["{name}"]' in source
    assert 'key not in ["prompt", "completion", "completion_ids"]' in source  # every other column is passed
    assert "prompts=prompts, completions=completions, completion_ids=completion_ids_list" in source
    assert set(REWARD_CALL_KWARGS) == trl_set | {"prompts", "completions", "completion_ids"}


def test_reward_name_is_the_name_trl_logs_a_reward_under():
    """The pre-flight's and the held-out eval's messages name a reward as TRL's ``reward_func_names`` do."""
    source = inspect.getsource(GRPOTrainer.__init__)
    assert "self.reward_func_names.append(get_callable_name(reward_funcs[i]))" in source


def test_hf_generation_reads_generation_config_and_kwargs():
    """suzak extends TRL's ``suppress_tokens`` in both objects TRL hands HF generate."""
    source = inspect.getsource(GRPOTrainer.__init__)
    assert 'generation_kwargs["suppress_tokens"] = [model.config.image_token_id]' in source
    assert "self.generation_config = GenerationConfig(**generation_kwargs" in source
    assert "self.generation_kwargs = generation_kwargs" in source


def test_a_rewards_log_extra_column_reaches_completions_csv(tiny_model_dir, tmp_path):
    """End to end through TRL's ``log_extra`` -> ``_log_completion_extra`` -> ``_logs["extra"]`` -> completions.csv."""
    import csv
    from pathlib import Path

    from suzak.runs.streams import add_run_callbacks
    from test_trainer import image_dataset, make_trainer

    def length_with_note(completions, log_extra=None, **kwargs):
        lengths = [float(len(c[0]["content"])) for c in completions]
        log_extra("note/length", [f"len={int(n)}" for n in lengths])
        return lengths

    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_with_note])
    add_run_callbacks(trainer)
    trainer.train()
    with (Path(trainer.args.output_dir) / "completions.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 and all(r["note/length"] == f"len={int(float(r['reward/length_with_note']))}" for r in rows)


# --- reward screening and the checkpoint before a mid-run stop (suzak.trl_internals.hooks.GRPOHooks) ---------------------


def test_calculate_rewards_calls_self_reward_funcs_by_keyword_at_call_time():
    """GRPOHooks wraps ``self.reward_funcs`` for the length of one ``_calculate_rewards`` call (RewardGuard): TRL must
    read the list then, tell async and module rewards apart the same way, call them by keyword only, turn None into
    NaN, and return the scores gathered over ranks (every rank screens the same tensor)."""
    params = ["self", "inputs", "prompts", "completions", "completion_ids_list"]
    assert _params(GRPOTrainer._calculate_rewards) == params
    source = inspect.getsource(GRPOTrainer._calculate_rewards)
    assert "zip(self.reward_funcs, self.reward_processing_classes, self.reward_func_names, strict=True)" in source
    assert "isinstance(reward_func, nn.Module)" in source and "elif is_async_callable(reward_func):" in source
    call = "prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs"
    assert source.count(call) == 2  # sync and async
    assert "[reward if reward is not None else torch.nan for reward in output_reward_func]" in source
    assert "rewards_per_func = gather(rewards_per_func)\n        return rewards_per_func" in source


def test_generate_and_score_completions_uses_the_screened_rewards_then_flushes_log_metric():
    """The tensor ``_calculate_rewards`` returns is what TRL computes advantages from and logs; ``nonfinite_frac``
    goes through ``_log_metric``, whose values TRL flushes into the step's metrics after scoring."""
    assert _params(GRPOTrainer._log_metric) == ["self", "name", "value"]
    assert "self._pending_metrics[name].append(value)" in inspect.getsource(GRPOTrainer._log_metric)
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    scored = source.index("rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids")
    assert scored < source.index("unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)")
    assert scored < source.index("self._pending_metrics.clear()")
    init = inspect.getsource(GRPOTrainer.__init__)
    assert "self.reward_func_names.append(" in init and "self.reward_weights = torch." in init


def test_log_metric_is_flushed_as_each_names_mean_over_every_ranks_values():
    """``GRPOHooks.total_over_ranks`` writes each :class:`suzak.trl_internals.rewards.RankTotal` (a judge's calls) into
    ``_pending_metrics`` as the total over the ranks, on every rank, from ``_calculate_rewards``: TRL must flush that
    dict after scoring as each name's sum over every rank's values divided by their count (the mean of equal totals
    is the total), its names gathered over the ranks."""
    assert "self._pending_metrics = defaultdict(list)" in inspect.getsource(GRPOTrainer.__init__)
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    flush = source.index("for name in sorted(set(gather_object(list(self._pending_metrics)))):")
    assert source.index("rewards_per_func = self._calculate_rewards(inputs, prompts, completions,") < flush
    assert "local_stats = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=device)" in source
    assert "total, count = self.accelerator.gather(local_stats).view(-1, 2).sum(dim=0).tolist()" in source
    assert "self._metrics[mode][name].append(total / count)" in source


def test_trainer_save_checkpoint_is_what_a_save_step_runs():
    """``GRPOHooks.save_checkpoint`` does what transformers does at a save step, in the same order."""
    from transformers import Trainer

    assert _params(Trainer._save_checkpoint) == ["self", "model", "trial"]
    assert 'checkpoint_folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in inspect.getsource(
        Trainer._save_checkpoint
    )
    assert (
        "self._save_checkpoint(model, trial)\n"
        "            self.control = self.callback_handler.on_save(self.args, self.state, self.control)"
    ) in inspect.getsource(Trainer._maybe_log_save_evaluate)


# --- the stale-sampler guard and vLLM on the CPU (suzak.trl_internals.sampler_guard.SamplerGuard, colocated_vllm_on_cpu) ---------


def test_the_scored_batch_holds_what_the_sampler_guard_reads():
    """``suzak.trl_internals.sampler_guard.check_sampler`` scores rows of the batch ``_generate_and_score_completions``
    returns: prompt and completion ids and masks, the images (Qwen's ``pixel_values`` / ``image_grid_thw`` /
    ``num_images``), the multimodal token types, and vLLM's own log-probabilities of the sampled tokens, at TRL's
    sampling temperature."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert f'"{key}": {key},' in source
    for key in ("sampling_per_token_logps", "pixel_values", "image_grid_thw", "mm_token_type_ids", "num_images"):
        assert f'output["{key}"] = ' in source
    assert "if sampling_per_token_logps is not None:" in source  # vLLM's logprobs, whatever the IS correction
    assert "self.temperature = args.temperature" in inspect.getsource(GRPOTrainer.__init__)
    assert "logprobs=0," in inspect.getsource(GRPOTrainer.__init__)  # vLLM returns the sampled tokens' logprobs
    # its figures go to this step's log line: a list per name in _metrics[mode], averaged and cleared by log()
    assert 'self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}' in inspect.getsource(
        GRPOTrainer.__init__
    )
    log = inspect.getsource(GRPOTrainer.log)
    assert "for key, val in self._metrics[mode].items():" in log and "self._metrics[mode].clear()" in log


def test_colocated_vllm_is_built_from_the_module_name_with_no_dtype():
    """``colocated_vllm_on_cpu`` swaps ``trl.generation.vllm_generation.LLM`` while TRL builds the engine, to pass the
    policy's dtype and eager on the CPU; TRL must build it by that name, and pass neither of its own."""
    import trl.generation.vllm_generation as module

    source = inspect.getsource(module)
    assert "from vllm import LLM" in source
    init = source[source.index("self.llm = LLM(") :]
    call = init[: init.index("\n            )\n")]
    assert "model=model.name_or_path" in call and "dtype" not in call and "enforce_eager" not in call
    assert 'logprobs_mode="processed_logprobs"' in call  # the sampler guard compares after temperature and bias


def test_weight_sync_resets_the_prefix_cache_but_not_vllms_encoder_cache():
    """``forget_vision_features_on_sync`` wraps ``VLLMGeneration.sync_weights`` and then resets vLLM's encoder cache
    (``self.llm.llm_engine`` in colocate mode; the client's ``session`` and ``base_url`` for the server). The day TRL
    resets it itself, this fails and the wrapper can go."""
    source = inspect.getsource(VLLMGeneration.sync_weights)
    assert "self.llm.reset_prefix_cache()" in source and "self.vllm_client.reset_prefix_cache()" in source
    assert "encoder_cache" not in source
    client = inspect.getsource(__import__("trl.generation.vllm_client", fromlist=["VLLMClient"]).VLLMClient.__init__)
    assert "self.session = requests.Session()" in client and "self.base_url = " in client


# --- transformers Trainer internals behind suzak.trl_internals.hooks.TrainerHooks ------------------------------------------


@pytest.mark.parametrize(
    ("method", "leading"),
    [
        ("_save_checkpoint", ["self", "model", "trial"]),  # atomic checkpoints: written to staging, then renamed
        ("_get_output_dir", ["self", "trial"]),  # the folder _save_checkpoint writes checkpoint-N into
        ("_get_grad_norm", ["self", "model", "grad_norm"]),  # the norm, after clipping, before optimizer.step()
        ("_load_from_checkpoint", ["self", "resume_from_checkpoint", "model"]),  # weights reloaded with key conversion
        ("_issue_warnings_after_load", ["self", "load_result"]),  # its missing-keys warning, silenced for that load
        ("_load_best_model", ["self"]),  # load_best_model_at_end: the best checkpoint reloaded with key conversion
    ],
)
def test_trainer_hooks(method, leading):
    from transformers import Trainer

    assert _params(getattr(Trainer, method))[: len(leading)] == leading


def test_save_checkpoint_asks_get_output_dir_for_its_folder_and_rotates_there():
    from transformers import Trainer

    source = inspect.getsource(Trainer._save_checkpoint)
    assert "run_dir = self._get_output_dir(trial=trial)" in source
    assert "output_dir = os.path.join(run_dir, checkpoint_folder)" in source
    assert "rotate_checkpoints(" in source and "output_dir=run_dir" in source


def test_the_trainer_still_loads_resumed_weights_without_key_conversion():
    """The bug TrainerHooks._load_from_checkpoint repairs (transformers 5.17): when this fails, transformers loads
    checkpoints with the model's key conversion, and the repair can go."""
    from transformers import Trainer

    for method in (Trainer._load_from_checkpoint, Trainer._load_best_model):  # (load_best_model_at_end's too)
        assert "load_result = model.load_state_dict(state_dict, False)" in inspect.getsource(method)


def test_key_conversion_helpers():
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    from transformers.trainer_utils import rotate_checkpoints

    assert _params(get_model_conversion_mapping)[0] == "model" and WeightRenaming and WeightConverter
    assert _params(rename_source_key)[:5] == ["source_key", "weight_renamings", "weight_converters",
                                              "base_model_prefix", "meta_state_dict"]  # fmt: skip
    assert _params(rotate_checkpoints)[:4] == ["output_dir", "save_total_limit", "best_model_checkpoint", "use_mtime"]


@pytest.mark.parametrize("trainer", ["GRPOTrainer", "SFTTrainer"])
def test_trl_casts_a_quantized_models_adapters_to_bf16(trainer):
    """What TrainerHooks undoes with keep_adapters_fp32 (suzak.trl_internals): TRL's __init__ casts every trainable
    parameter of a 4/8-bit model to bf16. When this fails, TRL keeps them as PEFT made them, and the cast can go."""
    import trl

    source = inspect.getsource(getattr(trl, trainer).__init__)
    assert 'getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)' in source
    assert "param.data = param.data.to(torch.bfloat16)" in source


def test_tokenize_prompts_hands_chat_template_kwargs_to_the_processor():
    """suzak passes each batch's video metadata as ``processor_kwargs`` through ``chat_template_kwargs``."""
    source = inspect.getsource(GRPOTrainer._tokenize_prompts)
    assert "self.processing_class.apply_chat_template(" in source
    assert source.count("**self.chat_template_kwargs") >= 2  # with and without environments


def test_per_token_logps_calls_the_model_with_keyword_inputs_per_chunk():
    """feeding_videos adds each call's rows' video tensors to the model call's keyword arguments, taking the rows in
    order: TRL calls the model once per chunk of ``batch_size`` rows, from the first row on, and slices a chunk's
    images (``pixel_values[row_start:row_end]``: empty for a chunk without any, which feeding_videos drops)."""
    source = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "for start in range(0, input_ids.size(0), batch_size):" in source
    assert "model(**model_inputs, labels=labels, fused_lm_head=True)" in source
    assert 'model_inputs = {"input_ids": input_ids_batch, "attention_mask": attention_mask_batch}' in source
    assert 'model_inputs["pixel_values"] = pixel_values[row_start:row_end]' in source
    assert 'model_inputs["mm_token_type_ids"] = mm_token_type_ids[start:end]' in source
    assert "return logps, entropies, aux_loss" in source


def test_a_row_without_images_is_none_in_trls_image_lists():
    """Batches mixing rows with and without images: TRL's per-row image lists hold None for a row without images,
    which the processor refuses (suzak hands it ``[]``) and which TRL's vLLM requests need (suzak hands them None, as
    ``row[0]`` is sent otherwise); an ``image`` column that is None in every row of a batch gives a list of Nones
    (suzak leaves such a column out: image_gaps_filled); the image marks of the forward pass come from prompts
    rendered without their videos expanded (feeding_videos pads them)."""
    tokenize = inspect.getsource(GRPOTrainer._tokenize_prompts)
    assert "images.append(prompt_images if prompt_images else None)" in tokenize
    assert "return prompt_ids, images, multimodal_fields" in tokenize
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert (
        'images = [[example.get("image")] if example.get("image") is not None else None for example in inputs]' in score
    )
    assert "if images is not None and all(img_list == [] for img_list in images):" in score
    assert "prompt_inputs = self.processing_class(images=images, text=prompts_text, padding=True" in score
    generate = inspect.getsource(VLLMGeneration.generate)
    assert "if img_list is not None:" in generate
    assert 'row["multi_modal_data"] = {"image": img_list if len(img_list) > 1 else img_list[0]}' in generate


def test_a_list_in_the_scored_batch_is_shuffled_and_split_with_the_rows():
    """The per-row video tensors travel in the scored batch as a list (``VIDEO_FIELDS``)."""
    import torch
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    batch = {"prompt_ids": torch.arange(6)[:, None], "videos": [{"row": i} for i in range(6)]}
    shuffled = shuffle_sequence_dict(batch)
    assert [v["row"] for v in shuffled["videos"]] == shuffled["prompt_ids"][:, 0].tolist()
    halves = split_tensor_dict(shuffled, 2)
    assert [len(h["videos"]) for h in halves] == [3, 3]
    assert [v["row"] for v in halves[1]["videos"]] == halves[1]["prompt_ids"][:, 0].tolist()
    source = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "shuffle_sequence_dict(generation_batch)" in source and "split_tensor_dict(generation_batch" in source


def test_the_generation_batch_is_shuffled_through_the_modules_shuffle_sequence_dict():
    """``vision_reuse`` keeps a group's rows in one micro-batch (:func:`suzak.trl_internals.rounds.groups_kept_together`)
    by swapping the ``shuffle_sequence_dict`` that ``_prepare_inputs`` calls from ``trl.trainer.grpo_trainer``'s
    globals while it runs."""
    from trl.trainer import grpo_trainer
    from trl.trainer.utils import shuffle_sequence_dict

    from suzak.trl_internals.rounds import groups_kept_together

    assert grpo_trainer.shuffle_sequence_dict is shuffle_sequence_dict
    prepare = inspect.unwrap(GRPOTrainer._prepare_inputs)  # under TRL's profiling decorator
    assert "shuffle_sequence_dict" in prepare.__code__.co_names and prepare.__globals__ is vars(grpo_trainer)
    with groups_kept_together(2):
        rows = grpo_trainer.shuffle_sequence_dict({"row": list(range(8))})["row"]
    assert sorted(rows) == list(range(8)) and all(rows[i] // 2 == rows[i + 1] // 2 for i in range(0, 8, 2))
    assert grpo_trainer.shuffle_sequence_dict is shuffle_sequence_dict


def test_tool_loop_internals_the_zoom_relies_on():
    """The zoom (suzak.models.tools, VLMGRPOTrainer): TRL resets one environment per rollout with the row's columns as
    keywords and keeps them in ``self.environments``; ``_get_tool_suffix_ids`` gives a tool turn's tokens (the
    pre-check's size); the scored batch's ``tool_mask`` marks the tool turns (masked out of the sampler guard, whose
    logprobs TRL fills with 0 there); the response templates of Qwen's two call forms live in chat_template_utils."""
    from trl import chat_template_utils

    from suzak.trl_internals.tools import tool_call_parser

    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self.environments.append(pool[index])" in score
    assert "observation = environment.reset(**reset_kwargs)" in score
    assert 'output["tool_mask"] = tool_mask' in score
    assert _params(GRPOTrainer._get_tool_suffix_ids) == ["self", "tool_messages"]
    # suzak.trl_internals.tools.tool_turn_length calls it before a trainer exists, on these attributes alone, set as
    # __init__ sets them for a VLM with tools
    suffix = inspect.getsource(GRPOTrainer._get_tool_suffix_ids)
    read = set(re.findall(r"self\.(\w+)", suffix))
    assert read == {"processing_class", "chat_template", "chat_template_kwargs", "_is_vlm", "_tokenizer"}, read
    init = inspect.getsource(GRPOTrainer.__init__)
    assert "if self.tools and not is_chat_template_prefix_preserving(processing_class):" in init
    assert "self.chat_template = get_training_chat_template(processing_class)" in init
    assert "self._tokenizer = processing_class.tokenizer" in init
    assert "self.chat_template_kwargs = args.chat_template_kwargs or {}" in init
    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    assert "logprobs[idx_with_tool] += [0.0] * tool_length + post_tool_logprobs[idx]" in loop
    assert "self._generate_single_turn(" in loop  # tool turns reach vLLM through suzak's placeholder collapse
    assert tool_call_parser("json") is chat_template_utils.qwen3_template
    assert tool_call_parser("xml") is chat_template_utils.qwen3_5_template


def test_the_tool_loop_steps_the_eval_repeats():
    """suzak.eval.tool_loop runs training's tool loop outside the trainer (suzak.trl_internals.tools.parse_turn,
    environment_tools, tool_message): TRL parses each turn with ``parse_response`` and the tools it was rendered with,
    offers an environment's public functions but reset and get_reward, and appends a list result as it is, anything
    else (a failed call's ``{"error": ...}`` too) as its str."""
    from trl.chat_template_utils import parse_response

    from suzak.trl_internals.tools import environment_tools, tool_message

    assert _params(parse_response)[:4] == ["tokenizer", "ids", "prefix", "tools"]
    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    assert "self._tokenizer, ids, prefix=prompt_completion_tool_ids[idx], tools=per_prompt_tools[idx]" in loop
    assert 'result = {"error": str(e)}' in loop
    assert "content = result if isinstance(result, list) else str(result)" in loop
    assert 'raise ValueError(f"Tool {name} not found.")' in loop
    batch = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert 'if member_name not in ("reset", "get_reward") and not member_name.startswith("_")' in batch

    class Environment:
        def reset(self, **row): ...
        def get_reward(self): ...
        def _helper(self): ...
        def zoom(self, bbox_2d: list[int]) -> str: ...
        def look(self, query: str) -> str: ...

    assert [tool.__name__ for tool in environment_tools(Environment())] == ["look", "zoom"]
    assert tool_message("zoom", [{"type": "text", "text": "x"}])["content"] == [{"type": "text", "text": "x"}]


def test_generate_returns_completion_ids_and_tool_masks_second_and_third():
    """Generated tokens per step (``generated_tokens``) are read from ``_generate``'s result: completion ids second,
    tool masks (1 on the model's own tokens) third."""
    assert _params(GRPOTrainer._generate) == ["self", "prompts"]
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert ("(\n            prompt_ids_list,\n            completion_ids_list,\n            tool_mask_list,\n"
            "            completions,") in source  # fmt: skip
    assert "= self._generate(prompts)" in source


def test_scored_batch_fields_are_the_ones_dynamic_sampling_merges():
    """Dynamic sampling merges rounds of ``_generate_and_score_completions``' output field by field
    (``suzak.trl_internals.rounds.merge_scored_rows``): every field TRL can return is either one it knows how to pad or
    one of the other models' image fields it refuses by name."""
    import re

    from suzak.trl_internals.rounds import COMPLETION_FIELDS, PROMPT_FIELDS, ROW_FIELDS, SEQUENCE_FIELDS

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    returned = set(re.findall(r'output\["(\w+)"\] =', source)) | set(re.findall(r'^\s+"(\w+)": \w+,$', source, re.M))
    others = {"pixel_attention_mask", "spatial_shapes", "image_sizes", "image_position_ids", "num_tiles"}  # not Qwen
    known = {*PROMPT_FIELDS, *COMPLETION_FIELDS, *SEQUENCE_FIELDS, *ROW_FIELDS, "num_items_in_batch"}
    assert returned - others == known - {"suzak_video_fields"}, returned


def test_pixel_values_split_and_merge_by_image_grid():
    """``split_pixel_values_by_grid`` turns Qwen's flat ``pixel_values``/``image_grid_thw`` into one entry per row
    (``num_images`` each) and ``unsplit_pixel_values_by_grid`` back; ``nanstd`` takes ``dim``."""
    import torch
    from trl.trainer.utils import nanstd, split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    batch = {"pixel_values": torch.arange(12.0)[:, None], "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 4]]),
             "num_images": [1, 1]}  # fmt: skip
    split = split_pixel_values_by_grid(batch)
    assert [len(rows) for rows in split["pixel_values"]] == [4, 8] and len(split["image_grid_thw"]) == 2
    assert torch.equal(unsplit_pixel_values_by_grid(split)["pixel_values"], batch["pixel_values"])
    assert nanstd(torch.tensor([[1.0, 1.0], [0.0, 2.0]]), dim=1).tolist() == [0.0, 1.4142135381698608]


def test_the_fused_lm_head_asks_use_triton_whether_to_score_labelled_positions_only(monkeypatch):
    """score_labelled_positions_only replaces ``trl.trainer.utils._use_triton``, which TRL's fused LM head reads at
    call time to pick between scoring the labelled positions (``compact``) and every position; the kernel's own tile
    choice (``trl.kernels.chunked_logprob._use_triton``) stays TRL's. Patched, a CPU forward hands the kernel only the
    labelled positions and returns the same log-probabilities and entropies as unpatched."""
    from types import SimpleNamespace

    import torch
    import trl.kernels.chunked_logprob as kernel
    import trl.trainer.utils as trl_utils
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from suzak.trl_internals.precision import score_labelled_positions_only

    source = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "compact = _use_triton(hidden_states.device)" in source
    assert "hidden_states[mask] if compact else hidden_states.reshape(-1, hidden_states.size(-1))" in source
    assert trl_utils._use_triton is kernel._use_triton or getattr(trl_utils._use_triton, "compact_on_cpu", False)
    assert not kernel._use_triton(torch.device("cpu"))

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, 64, (3, 12))
    labels = ids.clone()
    labels[:, :8] = -100  # the prompt: 7 of the 11 shifted positions of each row carry no label
    scored = []
    apply = kernel.ChunkedLogProbFunction.apply

    def counting(hidden, *args):
        scored.append(hidden.shape[0])
        return apply(hidden, *args)

    assert trl_utils._ChunkedLogProbFunction is kernel.ChunkedLogProbFunction
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", SimpleNamespace(apply=counting))
    monkeypatch.setattr(trl_utils, "_use_triton", kernel._use_triton)  # TRL's own choice first
    every = model(input_ids=ids, labels=labels, fused_lm_head=True)
    score_labelled_positions_only()
    compact = model(input_ids=ids, labels=labels, fused_lm_head=True)
    assert scored == [3 * 11, 3 * 4]
    assert torch.equal(every.log_probs, compact.log_probs) and torch.equal(every.entropy, compact.entropy)
    assert kernel._use_triton is trl_utils._use_triton.trl_use_triton  # the kernel's tiles: TRL's choice still
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # traced by torch.compile: TRL's fixed shapes
    assert not trl_utils._use_triton(torch.device("cpu"))


def test_the_fused_lm_head_takes_shift_labels_for_packed_rows():
    """suzak.models.packing hands TRL's fused head ``shift_labels`` (each row's next-token labels, -100 at a row's
    last token) so no packed row predicts the next row's first token, and puts the per-token fields
    (``FusedCausalLMOutput``'s, one per position with ``shift_labels``) back in the padded layout: the same
    log-probabilities as ``labels`` give, one column more."""
    import torch
    import trl.trainer.utils as trl_utils
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from suzak.models.packing import _PER_TOKEN

    source = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "fused_lm_head=False, labels=None, shift_labels=None" in source
    fields = set(trl_utils.FusedCausalLMOutput.__dataclass_fields__)
    assert set(_PER_TOKEN) <= fields and fields - set(_PER_TOKEN) == {"loss", "aux_loss"}
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, 64, (2, 10))
    labels = ids.clone()
    labels[:, :4] = -100
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]
    plain = model(input_ids=ids, labels=labels, fused_lm_head=True)
    given = model(input_ids=ids, shift_labels=shifted, fused_lm_head=True)
    assert plain.log_probs.shape == (2, 9) and given.log_probs.shape == (2, 10)
    torch.testing.assert_close(given.log_probs[:, :-1], plain.log_probs, rtol=0, atol=1e-6)
    assert (given.log_probs[:, -1] == 0).all() and given.label_mask[:, :-1].equal(plain.label_mask)


def test_grpo_records_each_optimizer_steps_time_in_step_time():
    """``perf/tokens_per_s`` divides the tokens the loss passes trained since the last log by the sum of TRL's
    ``step_time`` entries (one per optimizer step, ``training_step``'s time summed over its micro-batches),
    read from ``_metrics["train"]`` before TRL's ``log`` averages and clears them."""
    source = inspect.getsource(GRPOTrainer.training_step)
    assert "self._current_train_step_time += time_after - time_before" in source
    assert 'self._metrics["train"]["step_time"].append(self._current_train_step_time)' in source
    assert "self._metrics[mode].clear()" in inspect.getsource(GRPOTrainer.log)


def test_tokenize_prompts_reads_the_rows_environments_and_returns_ids_images_and_fields():
    """What ``GRPOHooks._tokenize_each_prompt_once`` relies on: TRL renders each row with its environment's tools
    (``_batch_environments``, zipped with the prompts) when ``environment_factories`` is set, and returns unpadded
    ids, the per-row images and the processor's other fields (tests/test_trainer.py checks the layout to the bit)."""
    source = inspect.getsource(GRPOTrainer._tokenize_prompts)
    assert "if self.environment_factories is not None:" in source
    assert "for prompt, name in zip(prompts, self._batch_environments, strict=True):" in source
    assert (
        'multimodal_fields = {k: v for k, v in tokenized.items() if k not in ("input_ids", "attention_mask")}' in source
    )
    assert "return prompt_ids, images, multimodal_fields" in source


def test_step_counts_training_step_calls_and_picks_the_buffered_batch():
    """Dynamic sampling's refill seed reads ``_step`` (micro-steps so far) to tell apart the generations of one
    optimizer step (:meth:`suzak.trl_internals.hooks.GRPOHooks.extra_prompts`)."""
    assert "self._step += 1" in inspect.getsource(GRPOTrainer.training_step)
    source = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert "self._step % generate_every == 0" in source and "self._step % self.args.steps_per_generation" in source


def test_mask_truncated_completions_is_read_at_call_time_and_zeroes_completion_mask():
    """Tool rollouts: suzak turns TRL's truncation mask off for the call and masks the loss through ``tool_mask``
    instead (:func:`suzak.trl_internals.rounds.masked_out_of_the_loss`): TRL must read the flag when it scores, and still
    build the attention mask from ``completion_mask``."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "if self.mask_truncated_completions:" in source and "self.eos_token_ids" in source
    assert "attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)" in source


def test_the_repeat_sampler_draws_one_permutation_an_epoch_from_its_seed():
    """suzak.trl_internals.epochs replays a resumed run's earlier epochs on TRL's RepeatSampler: it reads its
    ``shuffle``, ``seed``, ``generator`` and ``num_samples``, and relies on one ``randperm`` of the dataset a pass,
    from the generator seeded with ``seed``; GRPOTrainer's ``_get_train_sampler`` returns one (GRPOHooks wraps it)."""
    import inspect

    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(range(10), mini_repeat_count=2, batch_size=5, seed=3)
    assert sampler.shuffle and sampler.seed == 3 and sampler.num_samples == 10
    assert isinstance(sampler.generator, torch.Generator) and not hasattr(sampler, "set_epoch")
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        order = torch.randperm(10, generator=generator).tolist()
        assert list(sampler) == [i for i in order for _ in range(2)]
    assert "RepeatSampler(" in inspect.getsource(GRPOTrainer._get_train_sampler)


def test_split_tensor_dict_cuts_the_shuffled_generation_batch():
    """``max_tokens_per_micro_batch`` deals a generation batch into micro-batches by tokens
    (:func:`suzak.trl_internals.micro_batches.splitting_by_tokens`) by swapping the ``split_tensor_dict`` that
    ``_prepare_inputs`` calls from ``trl.trainer.grpo_trainer``'s globals, after the shuffle, on pixel values split per
    row (``split_pixel_values_by_grid``), the micro-batches joined again (``unsplit_pixel_values_by_grid``)."""
    import torch
    from trl.trainer import grpo_trainer
    from trl.trainer.utils import split_tensor_dict

    from suzak.trl_internals.micro_batches import NOMINAL_ROWS, splitting_by_tokens

    assert grpo_trainer.split_tensor_dict is split_tensor_dict
    prepare = inspect.unwrap(GRPOTrainer._prepare_inputs)
    names = prepare.__code__.co_names
    assert {"split_pixel_values_by_grid", "split_tensor_dict"} <= set(names)  # (unsplit: in a comprehension)
    assert prepare.__globals__ is vars(grpo_trainer)
    source = inspect.getsource(prepare)
    order = [source.index(name) for name in ("shuffle_sequence_dict(", "split_tensor_dict(", "unsplit_pixel")]
    assert order == sorted(order)
    batch = {"prompt_mask": torch.ones(4, 2, dtype=torch.long),
             "completion_mask": torch.tensor([[1] * 6, [1] * 6, [1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])}  # fmt: skip
    with splitting_by_tokens(1, window=2):  # one optimizer step of two micro-batches
        parts = grpo_trainer.split_tensor_dict(batch, 2)
    assert [part["completion_mask"].sum().item() for part in parts] == [7, 7]
    assert all(float(part[NOMINAL_ROWS]) == 2.0 for part in parts)
    assert grpo_trainer.split_tensor_dict is split_tensor_dict


def test_training_step_divides_the_loss_by_the_accumulation_steps():
    """:func:`suzak.trl_internals.micro_batches.backward_now` back-propagates a pass as ``Trainer.training_step``
    back-propagates ``compute_loss``'s value: divided by ``current_gradient_accumulation_steps`` unless the trainer
    scales it itself (TRL's GRPO: ``loss_is_scaled_for_ga``, which TRL turns into a non-None ``compute_loss_func``
    before transformers 5.19), and DeepSpeed told not to divide again (``scale_wrt_gas``). The update's equality
    is tested in tests/test_token_budget.py."""
    from transformers import Trainer
    from trl.trainer import base_trainer

    source = inspect.getsource(Trainer.training_step)
    assert "loss = loss / self.current_gradient_accumulation_steps" in source
    assert "and self.compute_loss_func is None" in source and 'kwargs["scale_wrt_gas"] = False' in source
    assert "self.accelerator.backward(loss, **kwargs)" in source
    assert GRPOTrainer.loss_is_scaled_for_ga is True
    assert 'self.compute_loss_func = "non-None value to disable scaling"' in inspect.getsource(base_trainer)


def test_accelerate_gradient_state_sets_sync():
    """A pass back-propagated inside ``_compute_loss`` runs with accelerate's ``sync_gradients`` off (its private
    setter), which DeepSpeed's engine wrapper reads as "not a boundary, no step"."""
    import inspect as inspect_

    from accelerate.state import GradientState
    from accelerate.utils.deepspeed import DeepSpeedEngineWrapper

    state = GradientState()
    synced = state.sync_gradients
    state._set_sync_gradients(False)
    assert state.sync_gradients is False
    state._set_sync_gradients(synced)
    source = inspect_.getsource(DeepSpeedEngineWrapper.backward)
    assert "set_gradient_accumulation_boundary(is_boundary=sync_gradients)" in source and "if sync_gradients" in source
