"""The trainer hook classes: the overrides of TRL's and transformers' private methods, each handing over to the concern
module that does the work (:mod:`suzak.trl_internals`'s modules).

- :class:`TrainerHooks` (both trainers; :class:`SFTHooks` for SFT) overrides transformers' ``Trainer._save_checkpoint``
  and ``_get_output_dir`` (checkpoints written to a staging folder, renamed when whole: :mod:`.checkpoints`),
  ``_get_grad_norm`` (a nan/inf step stopped or skipped before the optimizer applies it: :mod:`.precision`) and
  ``_load_from_checkpoint``/``_issue_warnings_after_load`` (a resume's weights loaded with the model's key conversion,
  which transformers 5.17's resume leaves out), and ``_load_best_model`` (load_best_model_at_end's load, the same flaw);
- :class:`GRPOHooks` overrides TRL's private hooks ``_get_train_sampler`` (each epoch's order replayed from the seed,
  so a resume draws the uninterrupted run's rows: :mod:`.epochs`), ``_generate_and_score_completions``,
  ``_generate_single_turn``,
  ``_log_completion_extra``, ``_calculate_rewards`` and ``_generate`` (each calls ``super()`` and hands suzak's part
  to a public method of the subclass; ``_generate``'s completion ids and tool masks count the tokens sampled), reads
  the per-rollout tool ``environments``, overrides ``_get_tool_suffix_ids`` (:mod:`.tools`), masks ``tool_mask``'s
  tool turns out of the stale-sampler guard (:mod:`.sampler_guard`), calls ``_tokenize_prompts`` once per distinct
  prompt of a batch (:mod:`.prompts`), and for video rows ``_tokenize_prompts``, ``_compute_loss`` and
  ``_get_per_token_logps_and_entropies`` (:mod:`.video`), reads the scored batch from ``_logs``
  (:mod:`.completions`), logs through ``_log_metric``, ``_metrics`` and ``_pending_metrics`` (:mod:`.rewards`,
  :mod:`.rounds`), saves a checkpoint with transformers' ``Trainer._save_checkpoint``, and sets the vision-token
  suppression where TRL's two generation paths read it (``generation_config``/``generation_kwargs`` for HF,
  ``vllm_generation.generation_kwargs`` for vLLM).

Contract tests (tests/test_trl_contract.py): ``test_grpo_trainer_hooks`` and ``test_trainer_hooks`` (each overridden
method's signature), ``test_generate_single_turn_returns_completions_and_logprobs_only``,
``test_generate_returns_completion_ids_and_tool_masks_second_and_third``,
``test_hf_generation_reads_generation_config_and_kwargs``,
``test_vllm_generation_takes_generation_kwargs_into_sampling_params``,
``test_a_rewards_log_extra_column_reaches_completions_csv``, and each concern module's own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from trl import GRPOTrainer, SFTTrainer

from suzak import SuzakError
from suzak.media.video import Clip, video_of
from suzak.trl_internals.checkpoints import load_converted_weights, save_checkpoint_atomically
from suzak.trl_internals.completions import completion_rows, plain_text_logs
from suzak.trl_internals.epochs import epoch_seeded
from suzak.trl_internals.micro_batches import loss_in_passes, per_token_logps_by_tokens, splitting_by_tokens
from suzak.trl_internals.precision import (
    checked_grad_norm,
    drop_earlier_autocast,
    keep_adapters_fp32,
    score_labelled_positions_only,
)
from suzak.trl_internals.prompts import (
    _empty_for_none,
    tokenize_each_prompt_once,
)
from suzak.trl_internals.rewards import (
    batch_positions,
    screened_rewards,
    total_over_ranks,
)
from suzak.trl_internals.rounds import (
    DynamicSampling,
    dynamically_sampled,
    extra_prompts,
    groups_kept_together,
    loss_tokens,
    masked_out_of_the_loss,
    note_group_signals,
)
from suzak.trl_internals.sampler_guard import SamplerGuard, check_sampler
from suzak.trl_internals.tools import log_tool_problems, tool_turn_key
from suzak.trl_internals.video import (
    VIDEO_FIELDS,
    clips_of,
    feeding_videos_of,
    holding_videos,
    tokenized_with_frames,
    video_fields,
)
from suzak.trl_internals.vllm_engine import colocated_vllm_on_cpu, forget_vision_features_on_sync, generate_single_turn

logger = logging.getLogger(__name__)


class TrainerHooks:
    """A transformers ``Trainer`` mixin (put it before the Trainer class) for every suzak trainer, GRPO and SFT:

    - **atomic checkpoints**: ``_save_checkpoint`` writes ``checkpoint-N`` into ``OUTPUT/.suzak-staging`` (through
      ``_get_output_dir``, which the Trainer asks for the folder) and renames it into place once every rank has
      written its part; ``save_total_limit`` then rotates in output_dir (``transformers.trainer_utils.
      rotate_checkpoints``, as the Trainer does). A save that fails or is killed leaves no ``checkpoint-N`` at all,
      and the folders before it as they were; the half-written one in staging is removed (at once, or at the next
      save). :meth:`save_run_state` adds suzak's own state to the folder before it is renamed into place.
    - **non-finite steps**: ``_get_grad_norm`` (after clipping, before the optimizer step) sees a nan or inf norm and
      either raises :class:`NonFiniteStep` (``on_nonfinite = "stop"``: no weight has changed) or drops the step's
      gradients so the optimizer leaves every weight as it was (``"skip"``, counted in ``nonfinite/skipped_steps``).
      Under DeepSpeed the engine has already stepped when the norm is known: such a run stops and saves nothing.
    - **fp32 adapters on a quantized base**: TRL's ``__init__`` casts a 4/8-bit model's trainable parameters to bf16;
      :func:`keep_adapters_fp32` casts them back before the optimizer exists.
    """

    def __init__(self, *args, **kwargs):
        score_labelled_positions_only()
        super().__init__(*args, **kwargs)
        keep_adapters_fp32(self.model)

    on_nonfinite = "stop"
    nonfinite_skipped = 0
    _staging_dir: str | None = None

    def _get_output_dir(self, trial) -> str:
        return self._staging_dir or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        save_checkpoint_atomically(self, super()._save_checkpoint, super()._get_output_dir, model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """The Trainer's resume, then the weights loaded again with the model's key conversion.

        transformers 5.17's ``Trainer._load_from_checkpoint`` reads ``model.safetensors`` (or its shards) into the
        model with a plain ``load_state_dict(strict=False)``, but ``save_pretrained`` writes the keys with the model's
        conversion reverted (Qwen2.5-VL: ``visual.*``, ``model.layers.*``): every key missed, the run went on from
        the base model's weights with the checkpoint's optimizer state, after a warning. Here each key is renamed as
        ``from_pretrained`` renames it (``transformers.core_model_loading.rename_source_key``), and a key still
        missing is an error, never a silent fresh start.
        """
        with self._reloading_weights():
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_converted_weights(self, resume_from_checkpoint, self.model if model is None else model,
                               "resume_from_checkpoint", "resumed")  # fmt: skip

    def _load_best_model(self) -> None:
        """The Trainer's ``load_best_model_at_end``, then the best checkpoint's weights loaded again with the model's
        key conversion: the Trainer's own load has the resume's flaw (:meth:`_load_from_checkpoint`), so the model
        saved at the end was the last step's, not the best one's, after a warning."""
        with self._reloading_weights():
            super()._load_best_model()
        load_converted_weights(self, self.state.best_model_checkpoint, self.model, "load_best_model_at_end",
                               "best model's")  # fmt: skip

    @contextmanager
    def _reloading_weights(self):
        """While the Trainer's own load runs: its "missing keys" warning is about the load repaired after it."""
        self._reloading = True
        try:
            yield
        finally:
            self._reloading = False

    def _issue_warnings_after_load(self, load_result) -> None:
        if not getattr(self, "_reloading", False):
            super()._issue_warnings_after_load(load_result)

    def _get_grad_norm(self, model, grad_norm=None):
        return checked_grad_norm(self, model, super()._get_grad_norm(model, grad_norm=grad_norm))

    def step_rows(self) -> list[str]:
        """Names of the dataset rows the current step trains on, when the trainer knows them."""
        return []

    def save_run_state(self, folder) -> None:
        """Write more of the run's state into the checkpoint ``folder`` being saved (the main process, after the
        Trainer's files, before the folder is renamed into place and marked complete)."""

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self.nonfinite_skipped and "loss" in logs:
            logs["nonfinite/skipped_steps"] = self.nonfinite_skipped
        super().log(logs, *args, **kwargs)


class GRPOHooks(TrainerHooks, GRPOTrainer):
    """``GRPOTrainer`` with TRL's private hooks overridden; a subclass fills in the public methods they call.

    - ``row_names(inputs) -> names``: how messages name each row of a batch (the dataset row it came from);
    - ``prepare_batch(inputs) -> inputs``: the rows TRL then tokenizes, generates from and scores;
    - ``batch_scored(inputs)``: after TRL has scored a training batch (:meth:`newest_completions` reads it);
    - ``plain_text(messages) -> str``: a prompt or completion as the completions log shows it;
    - colocated vLLM gets each image's placeholder unexpanded (below).

    Rewards are screened as TRL scores a batch (:func:`.rewards.screen_rewards`); a failure raises
    :class:`~.rewards.RewardFault`.
    """

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        model = kwargs.get("model", args[0] if args else None)
        drop_earlier_autocast(model)
        colocated = getattr(config, "use_vllm", False) and config.vllm_mode == "colocate"
        with colocated_vllm_on_cpu(model) if colocated and isinstance(model, torch.nn.Module) else nullcontext():
            super().__init__(*args, **kwargs)  # TRL builds vllm.LLM in here
        if self.use_vllm:
            forget_vision_features_on_sync(self.vllm_generation, self.accelerator.is_main_process)
        self._batch_extra_columns: set[str] = set()
        self._batch_rows: list[str] = []
        self._nonfinite_said: set[str] = set()
        self.sampler_guard = SamplerGuard()
        self._video_rows: list[dict | None] | None = None  # the rows' video tensors while TRL runs the model
        self._batch_clips: list[Clip | None] | None = None  # the rows' clips while TRL generates (vLLM takes them)
        self.dynamic_sampling: DynamicSampling | None = None
        self._group_std = torch.zeros(0)  # the last scored batch's reward std per group, over ranks
        self._round_rewards = torch.zeros(0)  # the last scored batch's rewards (ranks x rows, functions)
        self._generated_tokens = 0  # completion tokens the last generation sampled, over ranks
        self._short_batches = 0
        self._generation_trains = True  # the last generation batch kept a group on some rank (dynamic sampling)
        self._step_trains = False  # some micro-batch of the current optimizer step came from such a batch
        self.skipped_empty_steps = 0  # optimizer steps skipped: dynamic sampling kept no group for them
        self._tool_suffixes: dict[tuple, list[int]] = {}  # each distinct tool turn's tokens (_get_tool_suffix_ids)
        self.keep_groups_together = False  # shuffle a generation batch by whole groups (vision_reuse: shuffle_groups)
        self._step_tokens = 0  # prompt and completion tokens the loss passes trained since the last log (this rank)
        self.max_tokens_per_micro_batch: int | None = None  # micro-batches cut by tokens (:mod:`.micro_batches`)

    # --- hooks ---------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return self._generate_and_score_round(inputs)
        if self.dynamic_sampling is None:
            output = self._generate_and_score_round(inputs)
            self._metrics["train"]["generated_tokens"].append(float(self._generated_tokens))
            return output
        return dynamically_sampled(self, inputs)

    def _get_train_sampler(self, dataset=None):
        """TRL's sampler, whose order at each epoch is an uninterrupted run's, resumed or not (:mod:`.epochs`)."""
        return epoch_seeded(super()._get_train_sampler(dataset))

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        group = self.num_generations if self.keep_groups_together else 1
        budget, window, padded = self.max_tokens_per_micro_batch, self.args.gradient_accumulation_steps, self.padded
        with (groups_kept_together(group) if self.keep_groups_together else nullcontext(),
              splitting_by_tokens(group, window, padded) if budget else nullcontext()):  # fmt: skip
            inputs = super()._prepare_inputs(generation_batch)  # a slice of the last generation batch, in training
        if self.model.training:
            self._step_trains |= self._generation_trains
        return inputs

    def _get_grad_norm(self, model, grad_norm=None):
        """Dynamic sampling that kept no group on any rank for any micro-batch of this optimizer step leaves a zero
        loss; TRL would still step the optimizer, and AdamW's momentum and weight decay would move the weights. The
        gradients are dropped instead, so the optimizer leaves every weight and its state as they were (counted in
        ``dynamic_sampling/skipped_steps``; the learning-rate schedule still counts the step, as global_step does).
        Under DeepSpeed the engine has stepped already (docs/reliability.md)."""
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        trains, self._step_trains = self._step_trains, False
        if self.dynamic_sampling is not None and not trains and not self.is_deepspeed_enabled:
            model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
            self.skipped_empty_steps += 1
        return norm

    def extra_prompts(self, groups: int, extra: int) -> list[dict[str, Any]]:
        """``groups`` rows of the training set for an extra round of dynamic sampling (:func:`.rounds.extra_prompts`)."""
        return extra_prompts(self, groups, extra)

    def _generate(self, prompts: list):
        generated = super()._generate(prompts)
        completion_ids, tool_mask = generated[1], generated[2]
        counts = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        total = torch.tensor(float(sum(counts)), device=self.accelerator.device)
        self._generated_tokens = int(self.accelerator.gather(total).sum().item())  # sampled, not tool turns: all ranks
        return generated

    def _generate_and_score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_extra_columns.clear()
        self._batch_rows = self.row_names(inputs)
        prepared = self.prepare_batch(inputs)
        videos = video_fields(self.processing_class, self.accelerator.device, prepared)
        clips = [clip if isinstance(clip := video_of(row), Clip) else None for row in prepared]
        self._batch_clips = clips if any(clip is not None for clip in clips) else None
        truncation = bool(self.mask_truncated_completions and self.tools)  # TRL's would zero attention: done below
        try:
            if truncation:
                self.mask_truncated_completions = False
            with holding_videos(self, videos):
                output = super()._generate_and_score_completions(prepared)
        finally:
            self._batch_clips = None
            if truncation:
                self.mask_truncated_completions = True
        if truncation:
            pad_id = getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id
            output = masked_out_of_the_loss(output, self.eos_token_ids, pad_id)
            output["num_items_in_batch"] = loss_tokens(self, output)
        if videos is not None:
            output[VIDEO_FIELDS] = videos
        log_tool_problems(self)
        if self.model.training:
            check_sampler(self, output)
            self.batch_scored(inputs)
        return output

    def _get_tool_suffix_ids(self, tool_messages):
        # TRL renders a dummy conversation twice for every tool call, the processor going over the result's images;
        # a turn's tokens depend on its texts and its images' sizes alone, so each distinct turn is rendered once
        key = tool_turn_key(tool_messages, self.chat_template_kwargs)
        if key is None:
            return super()._get_tool_suffix_ids(tool_messages)
        rendered = self._tool_suffixes
        if len(rendered) >= 4096:  # failed calls' texts differ call by call: keep the memo bounded
            rendered.clear()
        if key not in rendered:
            rendered[key] = list(super()._get_tool_suffix_ids(tool_messages))
        return list(rendered[key])

    def tool_turn_length(self, tool_messages: list[dict]) -> int:
        """Tokens TRL adds to a completion for these tool messages (the tool turn and the next assistant header),
        from TRL's own ``_get_tool_suffix_ids``."""
        return len(self._get_tool_suffix_ids(tool_messages))

    def _generate_single_turn(self, prompt_ids, images, *args, **kwargs):
        return generate_single_turn(self, super()._generate_single_turn, prompt_ids, images, *args, **kwargs)

    def _tokenize_prompts(self, prompts: list):
        """Each distinct prompt tokenized once (:func:`.prompts.tokenize_each_prompt_once`); prompts with video clips
        as their frames, with the clips' metadata (:func:`.video.tokenized_with_frames`)."""
        clips = clips_of(prompts)
        if not clips:
            prompt_ids, images, fields = self._tokenize_each_prompt_once(prompts)
        else:
            prompt_ids, images, fields = tokenized_with_frames(self, super()._tokenize_prompts, clips, prompts)
        return prompt_ids, _empty_for_none(images), fields

    def _tokenize_each_prompt_once(self, prompts: list):
        """TRL's ``_tokenize_prompts`` on each distinct prompt once (:func:`.prompts.tokenize_each_prompt_once`)."""
        return tokenize_each_prompt_once(self, super()._tokenize_prompts, prompts)

    def _compute_loss(self, model, inputs):
        """TRL's loss; with ``max_tokens_per_micro_batch`` in training, in passes of at most that many tokens
        (:func:`.micro_batches.loss_in_passes`)."""
        if not self.model.training:
            return self._loss_of_rows(model, inputs)
        # EasyR1's throughput counts each trained row's prompt (with its visual tokens)
        self._step_tokens += int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
        if not self.max_tokens_per_micro_batch:
            return self._loss_of_rows(model, inputs)
        group = self.num_generations if self.keep_groups_together else 1
        return loss_in_passes(self, self._loss_of_rows, model, inputs, self.max_tokens_per_micro_batch, group,
                              self.padded)  # fmt: skip

    def _loss_of_rows(self, model, inputs):
        with holding_videos(self, inputs.get(VIDEO_FIELDS)):
            return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's model call for each chunk of rows gets the chunk's video tensors added, and no empty image tensors
        for a chunk of rows without images (:func:`feeding_videos`); TRL itself gives each chunk its rows' images.
        Then :meth:`packed_calls` may pack the chunk's rows (after the video tensors are added). With
        ``max_tokens_per_micro_batch``, a call with a chunk size (old log-probs, reference) goes over the rows in
        runs of at most that many tokens instead (:func:`.micro_batches.per_token_logps_by_tokens`)."""
        rows = self._video_rows if self._video_rows is not None else [None] * input_ids.size(0)
        if len(rows) != input_ids.size(0):
            raise SuzakError(f"a batch of {input_ids.size(0)} rows came with {len(rows)} rows of video tensors")
        if self.max_tokens_per_micro_batch and not args and kwargs.get("batch_size"):
            flags = {k: kwargs.pop(k) for k in ("batch_size", "compute_entropy", "compute_aux_loss") if k in kwargs}

            def run(ids, mask, fields, videos):
                with holding_videos(self, videos):
                    return self._get_per_token_logps_and_entropies(model, ids, mask, logits_to_keep,
                                                                   **{**flags, **fields, "batch_size": None})  # fmt: skip

            videos = self._video_rows
            return per_token_logps_by_tokens(self, run, input_ids, attention_mask, self.max_tokens_per_micro_batch,
                                             kwargs, videos, self.padded)  # fmt: skip
        with feeding_videos_of(self.processing_class, model, rows), self.packed_calls(model):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)  # fmt: skip

    def _calculate_rewards(self, inputs, *args, **kwargs):
        rewards = screened_rewards(self, super()._calculate_rewards, inputs, *args, **kwargs)
        if self.dynamic_sampling is not None and self.model.training:  # (ranks x rows, functions) -> group std
            note_group_signals(self, rewards, inputs)
        return rewards

    def total_over_ranks(self) -> None:
        """Each :class:`~.rewards.RankTotal` the rewards logged this batch becomes its total over every rank, on every
        rank (:func:`.rewards.total_over_ranks`)."""
        total_over_ranks(self)

    def _log_completion_extra(self, column: str, values: list):
        self._batch_extra_columns.add(column)
        super()._log_completion_extra(column, values)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """With ``log_completions``, prompts and completions are plain text (``<image>`` for an image, each tool call
        and tool turn on its own line) while TRL builds its table: W&B types a table column from its values and
        rejects VLM prompts, whose content parts differ in shape, and TRL's parquet copy of the table fails on a
        multi-turn completion (pyarrow: "cannot mix list and non-list"). TRL's image column already holds each
        rollout's tool images (the zoom's crops) after its prompt's."""
        if self.dynamic_sampling is not None and "loss" in logs:
            logs["dynamic_sampling/skipped_steps"] = self.skipped_empty_steps
        if "loss" in logs:
            step_seconds = sum(self._metrics["train"].get("step_time", []))  # TRL's, this rank's, since the last log
            tokens, self._step_tokens = self._step_tokens, 0
            if step_seconds > 0 and tokens:
                logs["perf/tokens_per_s"] = tokens / step_seconds
        if not self.log_completions:
            return super().log(logs, start_time)
        with plain_text_logs(self._logs, self.plain_text):
            super().log(logs, start_time)

    def tool_problem_counts(self, environments: list) -> dict[str, int]:
        """Failed tool calls of this batch by reason, the same keys on every rank ({} : nothing to log)."""
        return {}

    def rollout_columns(self, environments: list) -> dict[str, list]:
        """Columns of the completions log (``completions.csv``, the W&B table) read from each rollout's environment,
        the same keys on every rank ({}: none)."""
        return {}

    def row_columns(self, inputs: list[dict]) -> dict[str, list]:
        """Columns of the completions log read from each completion's row, the same keys on every rank ({}: none)."""
        return {}

    def batch_metrics(self, inputs: list[dict], rewards: torch.Tensor, lengths: list[int] | None) -> dict[str, float]:
        """More of the step's figures from a scored batch: ``rewards`` (completions of every rank, rewards) after
        the screen, ``lengths`` this rank's completion lengths; the same keys on every rank ({}: none)."""
        return {}

    def reward_rows(self, inputs: list[dict]) -> torch.Tensor | None:
        """(completions of every rank, rewards): True where a reward scores the row (a mixture's reward scores its
        own source's rows alone); None: every reward scores every row."""
        return None

    def packed_calls(self, model: torch.nn.Module):
        """A context within which TRL's model calls on a chunk of rows run (a subclass packs them: padding-free
        passes); here, the calls as TRL makes them."""
        return nullcontext()

    @property
    def padded(self) -> bool:
        """Whether the training passes compute every row at the generation batch's width (a subclass packs them)."""
        return True

    def plain_text(self, messages: Any) -> str:
        """A prompt or completion as people read it in the completions log and TRL's table (a string as it is): the
        subclass reads its messages (images, tool calls and tool turns)."""
        return messages if isinstance(messages, str) else str(messages)

    def step_rows(self) -> list[str]:
        return list(dict.fromkeys(self._batch_rows))  # each prompt is in the batch num_generations times

    def row_names(self, inputs: list[dict[str, Any]]) -> list[str]:
        return batch_positions(len(inputs))

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs

    def batch_scored(self, inputs: list[dict[str, Any]]) -> None:
        """Called on every rank after a training batch is scored."""

    # --- reading and setting TRL's state -------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Save ``checkpoint-{global_step}`` now, as the Trainer does at a save step: ``_save_checkpoint`` (model,
        optimizer, scheduler, RNG, trainer state; then the ``save_total_limit`` rotation), then the ``on_save``
        callbacks (suzak's completion marker among them). Every rank calls it."""
        self._save_checkpoint(self.model_wrapped, trial=None)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def newest_completions(self, image_refs: Sequence[str], step: int) -> list[dict]:
        """Rows of the batch just scored (TRL gathers ``_logs`` over ranks, in rank order; so must ``image_refs``)."""
        weights = self.reward_weights.tolist()
        return completion_rows(self._logs, image_refs, step, weights, self._batch_extra_columns, text=self.plain_text)

    def suppress_in_generation(self, ids: Iterable[int]) -> None:
        """Never sample ``ids``: TRL's ``suppress_tokens`` for HF generation, a -100 logit bias for vLLM.

        TRL itself suppresses ``<|image_pad|>`` in HF generation only. vLLM takes the bias in colocate mode and over
        its OpenAI API in server mode. The recipe's own ``generation_kwargs`` are copied, never modified.
        """
        ids = list(ids)
        if self.use_vllm:
            kwargs = dict(self.vllm_generation.generation_kwargs)
            kwargs["logit_bias"] = {**dict.fromkeys(ids, -100.0), **(kwargs.get("logit_bias") or {})}
            self.vllm_generation.generation_kwargs = kwargs
        else:
            suppressed = sorted(set(self.generation_config.suppress_tokens or []) | set(ids))
            self.generation_config.suppress_tokens = suppressed
            self.generation_kwargs["suppress_tokens"] = suppressed

    @property
    def suppressed_token_ids(self) -> list[int]:
        """Token ids generation can never sample, read from what TRL hands HF generate or vLLM."""
        if self.use_vllm:
            bias = self.vllm_generation.generation_kwargs.get("logit_bias") or {}
            return sorted(int(token) for token, value in bias.items() if value <= -100)
        return sorted(self.generation_config.suppress_tokens or [])


class SFTHooks(TrainerHooks, SFTTrainer):
    """TRL's ``SFTTrainer`` with suzak's atomic checkpoints and non-finite-step handling (:class:`TrainerHooks`)."""
