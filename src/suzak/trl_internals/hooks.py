"""The trainer hook classes: the overrides of TRL's and transformers' private methods, each handing over to the concern
module that does the work (:mod:`suzak.trl_internals`'s modules).

- :class:`TrainerHooks` (both trainers; :class:`SFTHooks` for SFT) overrides transformers' ``Trainer._save_checkpoint``
  and ``_get_output_dir`` (checkpoints written to a staging folder, renamed when whole: :mod:`.checkpoints`),
  ``_get_grad_norm`` (a nan/inf step stopped or skipped before the optimizer applies it: :mod:`.precision`) and
  ``_load_from_checkpoint``/``_issue_warnings_after_load`` (a resume's weights loaded with the model's key conversion,
  which transformers 5.17's resume leaves out), and ``_load_best_model`` (load_best_model_at_end's load, the same flaw);
- :class:`GRPOHooks` overrides TRL's private hooks ``_generate_and_score_completions``, ``_generate_single_turn``,
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

import contextlib
import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer, SFTTrainer
from trl.trainer.utils import nanstd

from suzak import SuzakError
from suzak.media.video import Clip, processor_kwargs, video_of, vllm_video
from suzak.media.vision import collapse_runs, collapse_video_blocks
from suzak.scoring.parsing import message_text
from suzak.trl_internals.checkpoints import STAGING
from suzak.trl_internals.completions import completion_rows
from suzak.trl_internals.precision import (
    NonFiniteStep,
    drop_earlier_autocast,
    keep_adapters_fp32,
    score_labelled_positions_only,
)
from suzak.trl_internals.prompts import _empty_for_none, _none_for_empty, expand_tokenized_prompts, prompt_keys
from suzak.trl_internals.rewards import RankTotal, RewardFault, RewardGuard, _batch_positions
from suzak.trl_internals.rounds import (
    DynamicSampling,
    _tensor_bytes,
    group_reward_std,
    groups_kept_together,
    masked_out_of_the_loss,
    merge_scored_rows,
    trained_groups,
    weighted_rewards,
)
from suzak.trl_internals.sampler_guard import SamplerGuard, _row_model_inputs, sampling_logps
from suzak.trl_internals.tools import tool_turn_key
from suzak.trl_internals.video import VIDEO_FIELDS, _parts, _with_frames, feeding_videos, vllm_requests_with_videos
from suzak.trl_internals.vllm_engine import colocated_vllm_on_cpu, forget_vision_features_on_sync

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
        import os
        import shutil
        from pathlib import Path

        from transformers.trainer_utils import rotate_checkpoints

        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = run_dir / STAGING
        writer = self.args.should_save
        if writer:
            shutil.rmtree(staging / name, ignore_errors=True)  # a save killed earlier
        self.accelerator.wait_for_everyone()
        self._staging_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)
            if writer:
                self.save_run_state(staging / name)
        except BaseException:
            if writer:
                shutil.rmtree(staging / name, ignore_errors=True)
                with contextlib.suppress(OSError):
                    staging.rmdir()
            raise
        finally:
            self._staging_dir = None
        self.accelerator.wait_for_everyone()  # every rank's files (RNG states, ZeRO shards) are in staging
        if writer:
            if (self.state.best_model_checkpoint or "").startswith(str(staging)):
                self.state.best_model_checkpoint = str(run_dir / Path(self.state.best_model_checkpoint).name)
                self.state.save_to_json(str(staging / name / "trainer_state.json"))
            final = run_dir / name
            if final.exists():  # a resumed run at the step of an older folder: swap, then drop the old one
                old = staging / f"{name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(staging / name, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging / name, final)
            with contextlib.suppress(OSError):
                staging.rmdir()  # when empty
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)  # fmt: skip
        self.accelerator.wait_for_everyone()

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
        self._load_converted_weights(resume_from_checkpoint, self.model if model is None else model,
                                     "resume_from_checkpoint", "resumed")  # fmt: skip

    def _load_best_model(self) -> None:
        """The Trainer's ``load_best_model_at_end``, then the best checkpoint's weights loaded again with the model's
        key conversion: the Trainer's own load has the resume's flaw (:meth:`_load_from_checkpoint`), so the model
        saved at the end was the last step's, not the best one's, after a warning."""
        with self._reloading_weights():
            super()._load_best_model()
        self._load_converted_weights(self.state.best_model_checkpoint, self.model, "load_best_model_at_end",
                                     "best model's")  # fmt: skip

    @contextmanager
    def _reloading_weights(self):
        """While the Trainer's own load runs: its "missing keys" warning is about the load repaired after it."""
        self._reloading = True
        try:
            yield
        finally:
            self._reloading = False

    def _load_converted_weights(self, folder: str, model, flag: str, what: str) -> None:
        """``folder``'s ``model.safetensors`` (or shards) into ``model``, each key renamed as ``from_pretrained``
        renames it; a weight the folder lacks stops the run (one line naming ``flag``). DeepSpeed, FSDP and PEFT
        models load their own formats (PEFT models are no ``PreTrainedModel``: adapters load themselves)."""
        import json
        import os

        from safetensors.torch import load_file
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        if self.is_deepspeed_enabled or self.is_fsdp_enabled or not isinstance(model, PreTrainedModel):
            return
        single = os.path.join(folder, "model.safetensors")
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.isfile(single):
            files = [single]
        elif os.path.isfile(index):
            with open(index, encoding="utf-8") as handle:
                shards = sorted(set(json.load(handle)["weight_map"].values()))
            files = [os.path.join(folder, shard) for shard in shards]
        else:
            return
        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        own = model.state_dict()
        loaded: set[str] = set()
        for path in files:
            state = {rename_source_key(key, renamings, converters, model.base_model_prefix, own)[0]: tensor
                     for key, tensor in load_file(path, device="cpu").items()}  # fmt: skip
            result = model.load_state_dict(state, strict=False)
            loaded |= set(state) - set(result.unexpected_keys)
        tied = set(getattr(model, "all_tied_weights_keys", None) or {})
        missing = sorted(key for key in own if key not in loaded and key not in tied)
        if missing:
            raise SuzakError(f"{flag} {folder}: {len(missing)} of the model's weights are not in the checkpoint (first: "
                             f"{missing[0]}); it was saved from another model")  # fmt: skip
        logger.info("%s weights: %d tensors from %s", what, len(loaded), folder)

    def _issue_warnings_after_load(self, load_result) -> None:
        if not getattr(self, "_reloading", False):
            super()._issue_warnings_after_load(load_result)

    def _get_grad_norm(self, model, grad_norm=None):
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        value = norm.item() if isinstance(norm, torch.Tensor) else norm
        if value is None or math.isfinite(value):
            return norm
        step = self.state.global_step + 1
        rows = self.step_rows()
        where = f"step {step}" + (f" (rows of its batch: {', '.join(rows[:8])}{', ...' if len(rows) > 8 else ''})"
                                  if rows else "")  # fmt: skip
        if self.on_nonfinite == "skip" and not self.is_deepspeed_enabled:
            self.nonfinite_skipped += 1
            model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
            logger.warning("the gradient norm is %s at %s: the optimizer step is skipped, every weight stays as it "
                           "was (%d step(s) skipped so far; nonfinite/skipped_steps)", value, where,
                           self.nonfinite_skipped)  # fmt: skip
            return norm
        if self.is_deepspeed_enabled:
            raise NonFiniteStep(f"the gradient norm is {value} at {where}; DeepSpeed has already applied it, so "
                                "nothing is saved from this run state")  # fmt: skip
        raise NonFiniteStep(f"the gradient norm is {value} at {where} (a nan or inf loss); the step was not applied "
                            "and no weight changed (on_nonfinite skip would skip such steps and count them)")  # fmt: skip

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
    - colocated vLLM gets each image's placeholder unexpanded (below).

    Rewards are screened as TRL scores a batch (:meth:`screen_rewards`); a failure raises :class:`RewardFault`.
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

    # --- hooks ---------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return self._generate_and_score_round(inputs)
        if self.dynamic_sampling is None:
            output = self._generate_and_score_round(inputs)
            self._metrics["train"]["generated_tokens"].append(float(self._generated_tokens))
            return output
        return self._dynamically_sampled(inputs)

    def _dynamically_sampled(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """:class:`DynamicSampling`: rounds of generation until every rank holds as many groups with a signal as its
        batch has groups (or the cap), merged into one scored batch of the usual size."""
        sampling, size = self.dynamic_sampling, self.num_generations
        groups, rank = len(inputs) // size, self.accelerator.process_index
        batches, spare = [], []  # the rounds' scored batches; (round, group) dropped on this rank
        held = torch.zeros(self.accelerator.num_processes, dtype=torch.long)  # kept groups so far, each rank
        dropped = tokens = 0
        logged = {key: len(values) for key, values in self._metrics["train"].items()}  # before this batch's rounds
        signals, round_rewards = [], []  # each round's (ranks, groups) decisions and (ranks x rows, functions) rewards
        for extra in range(sampling.max_rounds + 1):
            batch = inputs if extra == 0 else self.extra_prompts(groups, extra)
            batches.append(self._generate_and_score_round(batch))
            tokens += self._generated_tokens
            signal = sampling.kept(self._group_std.cpu()).view(-1, groups)  # (ranks, groups): alike on every rank
            signals.append(signal)
            round_rewards.append(self._round_rewards)
            held += signal.sum(1)
            dropped += int((~signal).sum())
            spare += [(extra, g) for g in range(groups) if not signal[rank, g]]
            if bool((held >= groups).all()):
                break
        picked = trained_groups(signals, rank, groups)
        filler = spare[len(spare) - (groups - len(picked)) :] if len(picked) < groups else []
        rows = [(b, g * size + i) for b, g in picked + filler for i in range(size)]
        pad_id = getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id  # TRL's padding
        output = merge_scored_rows(batches, rows, range(len(picked) * size, len(rows)), pad_id)
        output["num_items_in_batch"] = self._loss_tokens(output)
        trained = int(held.clamp(max=groups).sum())
        self._generation_trains = trained > 0  # alike on every rank (held is gathered)
        short = held.numel() * groups - trained
        metrics = self._metrics["train"]
        # what the rounds held until the merge (every round's scored tensors, this rank): the memory max_rounds costs
        metrics["dynamic_sampling/rounds_mib"].append(sum(_tensor_bytes(batch) for batch in batches) / 2**20)
        self.log_kept_rewards(signals, round_rewards, groups, logged)
        for name, value in (("kept_groups", trained), ("dropped_groups", dropped), ("extra_rounds", extra)):
            metrics[f"dynamic_sampling/{name}"].append(float(value))
        metrics["generated_tokens"].append(float(tokens))  # every round's
        if short:
            logger.log(logging.INFO if not self._short_batches else logging.DEBUG,
                       "dynamic sampling: the batch for step %d trains on %d of %d groups after %d extra round(s) "
                       "(dynamic_sampling_max_rounds); the other %d have one reward for all their completions and "
                       "are masked out (dynamic_sampling/kept_groups in the metrics)", self.state.global_step + 1,
                       trained, trained + short, extra, short)  # fmt: skip
            self._short_batches += 1
        return output

    def _loss_tokens(self, output: dict[str, Any]) -> torch.Tensor:
        """Tokens of a scored batch in the loss, over every rank: TRL's ``num_items_in_batch``, recounted where suzak
        changed the masks (``completion_mask × tool_mask``, as TRL's loss reads them)."""
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        return self.accelerator.gather(loss_mask.sum()).sum()

    def log_kept_rewards(self, signals: list[torch.Tensor], round_rewards: list[torch.Tensor], groups: int,
                         logged: dict[str, int]) -> None:  # fmt: skip
        """TRL logged ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/<name>/mean|std`` once per
        round, over every round's rows, dropped groups included. They become the figures of the groups this step
        trains on, over every rank (each rank's first ``groups`` kept groups, in round order: what the merge keeps);
        the all-rounds ones move to ``dynamic_sampling/all_rounds/<name>``. A batch that kept no group keeps
        TRL's."""
        size = self.num_generations
        rows = []  # (round, row of the gathered rewards) of every kept completion, every rank
        for rank in range(signals[0].size(0)):
            kept = trained_groups(signals, rank, groups)
            rows += [(r, (rank * groups + g) * size + i) for r, g in kept for i in range(size)]
        if not rows:
            return
        per_func = torch.stack([round_rewards[r][row] for r, row in rows])  # (kept completions, functions)
        total = weighted_rewards(per_func, self.reward_weights)
        group_std = nanstd(total.view(-1, size), dim=1)
        figures = {"reward": torch.nanmean(total).item(), "reward_std": nanstd(total).item(),
                   "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item()}  # fmt: skip
        for i, name in enumerate(self.reward_func_names):
            figures[f"rewards/{name}/mean"] = torch.nanmean(per_func[:, i]).item()
            figures[f"rewards/{name}/std"] = nanstd(per_func[:, i]).item()
        metrics = self._metrics["train"]
        for key, value in figures.items():
            rounds = metrics[key][logged.get(key, 0) :]
            if not rounds:
                continue
            del metrics[key][logged.get(key, 0) :]
            metrics[key].append(value)
            metrics[f"dynamic_sampling/all_rounds/{key}"].append(sum(rounds) / len(rounds))

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        with groups_kept_together(self.num_generations) if self.keep_groups_together else nullcontext():
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
        """``groups`` rows of the training set drawn for an extra round of dynamic sampling, each ``num_generations``
        times: drawn from the seed, the step, the generation within the step, the round and the rank, so a resumed
        run draws the same. A step may hold several generations (``steps_per_generation × num_iterations`` below
        ``gradient_accumulation_steps``): TRL's micro-step counter ``_step`` (0 at a step's start, also after a
        resume) tells them apart, or each would draw the same refill rows."""
        dataset = self.train_dataset
        accumulation = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        within = self._step % accumulation  # TRL's count of training_step calls (tests/test_trl_contract.py)
        seed = [self.args.seed, self.state.global_step, within, extra, self.accelerator.process_index]
        picks = np.random.default_rng(seed).choice(len(dataset), size=groups, replace=len(dataset) < groups)
        return [dict(row) for row in (dataset[int(i)] for i in picks) for _ in range(self.num_generations)]

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
        videos = self.video_fields(prepared)
        clips = [clip if isinstance(clip := video_of(row), Clip) else None for row in prepared]
        self._batch_clips = clips if any(clip is not None for clip in clips) else None
        truncation = bool(self.mask_truncated_completions and self.tools)  # TRL's would zero attention: done below
        try:
            if truncation:
                self.mask_truncated_completions = False
            with self._videos(videos):
                output = super()._generate_and_score_completions(prepared)
        finally:
            self._batch_clips = None
            if truncation:
                self.mask_truncated_completions = True
        if truncation:
            pad_id = getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id
            output = masked_out_of_the_loss(output, self.eos_token_ids, pad_id)
            output["num_items_in_batch"] = self._loss_tokens(output)
        if videos is not None:
            output[VIDEO_FIELDS] = videos
        self._log_tool_problems()
        if self.model.training:
            self._check_sampler(output)
            self.batch_scored(inputs)
        return output

    def _log_tool_problems(self) -> None:
        """This batch's failed tool calls by reason (:meth:`tool_problem_counts` over TRL's per-rollout
        ``environments``), summed over ranks into the step's log as ``tools/<reason>``."""
        counts = self.tool_problem_counts(self.environments or [])
        if not counts:
            return
        totals = self.accelerator.gather(torch.tensor([list(counts.values())], device=self.accelerator.device))
        mode = "train" if self.model.training else "eval"
        for reason, total in zip(counts, totals.sum(0).tolist(), strict=True):
            self._metrics[mode][f"tools/{reason}"].append(float(total))

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
        images = _none_for_empty(images)
        colocated = self.use_vllm and self.vllm_mode == "colocate"
        if colocated and images is not None:
            # TRL hands colocated vLLM the processor-expanded prompt ids and vLLM expands every <|image_pad|> again
            # (TRL #6294): one placeholder per image instead. The server path places precomputed image features on
            # the runs of image tokens, so it keeps them expanded.
            token = self.processing_class.image_token_id
            prompt_ids = [collapse_runs(list(ids), token) for ids in prompt_ids]
        clips = self._batch_clips
        if not colocated or clips is None:  # (server mode with video rows stops before step 1)
            return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)
        # TRL's colocated call sends vLLM images only: each video row's request gets its clip, and its prompt ids
        # with the video back to the placeholder vLLM expands itself (to the same ids: tests/test_vllm_boundary.py).
        token = self.processing_class.tokenizer.convert_tokens_to_ids
        start, end, pad = token("<|vision_start|>"), token("<|vision_end|>"), token("<|video_pad|>")
        prompt_ids = [list(ids) if clip is None else collapse_video_blocks(list(ids), start, end, pad)
                      for ids, clip in zip(prompt_ids, clips, strict=True)]  # fmt: skip
        videos = [None if clip is None else vllm_video(clip, self.processing_class) for clip in clips]
        with vllm_requests_with_videos(self.vllm_generation.llm, videos):
            return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)

    def _tokenize_prompts(self, prompts: list):
        """Prompts with video clips reach the processor as their frames, with the clips' metadata (through
        ``apply_chat_template``'s ``processor_kwargs``, which TRL passes on from ``chat_template_kwargs``)."""
        clips = [part["video"] for prompt in prompts if isinstance(prompt, list) for part in _parts(prompt)
                 if part.get("type") == "video" and isinstance(part.get("video"), Clip)]  # fmt: skip
        if not clips:
            prompt_ids, images, fields = self._tokenize_each_prompt_once(prompts)
            return prompt_ids, _empty_for_none(images), fields
        saved = self.chat_template_kwargs
        given = dict(saved.get("processor_kwargs") or {})
        self.chat_template_kwargs = {**saved, "processor_kwargs": {**given, **processor_kwargs(clips)}}
        try:
            prompt_ids, images, fields = super()._tokenize_prompts([_with_frames(prompt) for prompt in prompts])
        finally:
            self.chat_template_kwargs = saved
        return prompt_ids, _empty_for_none(images), fields

    def _tokenize_each_prompt_once(self, prompts: list):
        """TRL's ``_tokenize_prompts`` on each distinct prompt once, its output then laid out for every row as TRL's
        own call on all rows gives it (the same ids, pixel values and grids, tested to the bit): a batch holds each
        prompt ``num_generations`` times (the sampler repeats it), and the processor resized and patched every copy
        of its images again (the counting self-test: 166 ms a step for 128 rows, 12 ms for their 16 prompts). Prompts
        are the same when their messages' text and images' pixels are (and, with ``environment_factory``, their
        environment, whose tools TRL renders into each): :func:`prompt_keys`. Anything else falls back to TRL's call."""
        environments = self._batch_environments if self.environment_factories is not None else None
        keys = prompt_keys(prompts, environments)
        if keys is None or len(set(keys)) == len(keys):
            return super()._tokenize_prompts(prompts)
        first: dict = {}
        for row, key in enumerate(keys):
            first.setdefault(key, row)
        if environments is not None:
            self._batch_environments = [environments[row] for row in first.values()]
        try:
            prompt_ids, images, fields = super()._tokenize_prompts([prompts[row] for row in first.values()])
        finally:
            if environments is not None:
                self._batch_environments = environments
        position = {key: index for index, key in enumerate(first)}
        rows = [position[key] for key in keys]
        expanded = expand_tokenized_prompts(prompt_ids, images, fields, rows)
        return expanded if expanded is not None else super()._tokenize_prompts(prompts)

    def _compute_loss(self, model, inputs):
        with self._videos(inputs.get(VIDEO_FIELDS)):
            return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's model call for each chunk of rows gets the chunk's video tensors added, and no empty image tensors
        for a chunk of rows without images (:func:`feeding_videos`); TRL itself gives each chunk its rows' images."""
        rows = self._video_rows if self._video_rows is not None else [None] * input_ids.size(0)
        if len(rows) != input_ids.size(0):
            raise SuzakError(f"a batch of {input_ids.size(0)} rows came with {len(rows)} rows of video tensors")
        with self._feeding_videos(model, rows):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)  # fmt: skip

    def _feeding_videos(self, model: torch.nn.Module, rows: Sequence[dict | None]):
        """:func:`feeding_videos` for a VL model's processor; nothing for a text model, whose tokenizer has no video
        placeholder (a dataset with images or video for a text model stops before step 1: ``suzak.training.session``)."""
        video_token = getattr(self.processing_class, "video_token_id", None)  # a VL processor's; a tokenizer has none
        if video_token is None:
            if any(row is not None for row in rows):
                raise SuzakError(f"{type(self.processing_class).__name__} has no video placeholder: a text model "
                                 "cannot take video rows")  # fmt: skip
            return nullcontext()
        return feeding_videos(model, rows, video_token)

    @contextmanager
    def _videos(self, rows: list[dict | None] | None):
        saved, self._video_rows = self._video_rows, rows
        try:
            yield
        finally:
            self._video_rows = saved

    def video_fields(self, inputs: list[dict[str, Any]]) -> list[dict | None] | None:
        """Each row's video tensors for the model (``pixel_values_videos``, ``video_grid_thw`` and, for Qwen2.5-VL,
        ``second_per_grid_ts``), from the processor on the row's clip; None for a batch without video. The copies of
        a prompt share one clip, and one set of tensors."""
        clips = [video_of(row) for row in inputs]
        if not any(isinstance(clip, Clip) for clip in clips):
            return None
        processor = self.processing_class
        computed: dict[int, dict] = {}
        for clip in clips:
            if isinstance(clip, Clip) and id(clip) not in computed:
                out = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt",
                                **processor_kwargs([clip]))  # fmt: skip
                fields = {k: torch.as_tensor(out[k]).to(self.accelerator.device)
                          for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts") if k in out}  # fmt: skip
                computed[id(clip)] = fields
        return [computed[id(clip)] if isinstance(clip, Clip) else None for clip in clips]

    def _calculate_rewards(self, inputs, *args, **kwargs):
        rows = self._batch_rows if len(self._batch_rows) == len(inputs) else _batch_positions(len(inputs))
        guard = RewardGuard(rows)
        funcs = self.reward_funcs
        self.reward_funcs = [guard.wrap(f, name) for f, name in zip(funcs, self.reward_func_names, strict=True)]
        try:
            rewards = super()._calculate_rewards(inputs, *args, **kwargs)  # (completions of every rank, rewards)
        finally:
            self.reward_funcs = funcs
        environments = self.environments or []
        if len(environments) == len(inputs):  # one per rollout, in the rollouts' order (TRL draws them per batch)
            for column, values in self.rollout_columns(environments).items():
                self._log_completion_extra(column, values)
        for column, values in self.row_columns(inputs).items():
            self._log_completion_extra(column, values)
        rewards = self.screen_rewards(rewards, guard, self.reward_rows(inputs))
        ids = args[2] if len(args) > 2 else kwargs.get("completion_ids_list")
        lengths = [len(row) for row in ids] if ids is not None and len(ids) == len(inputs) else None
        self.total_over_ranks()
        for name, value in self.batch_metrics(inputs, rewards, lengths).items():
            self._log_metric(name, value)
        if self.dynamic_sampling is not None and self.model.training:  # (ranks x rows, functions) -> group std
            self._group_std = group_reward_std(rewards, self.reward_weights, self.num_generations)
            self._round_rewards = rewards.detach().cpu()
            # completions.csv's group_signal: 1 where the row's group has a reward signal (kept, unless the batch
            # already had its groups), 0 where dynamic sampling drops it; this rank's rows, in order
            signal = self.dynamic_sampling.kept(self._group_std.cpu()).repeat_interleave(self.num_generations)
            start = self.accelerator.process_index * len(inputs)
            self._log_completion_extra("group_signal", [int(v) for v in signal[start : start + len(inputs)]])
        return rewards

    def total_over_ranks(self) -> None:
        """Each :class:`RankTotal` the rewards logged this batch becomes its total over every rank, on every rank
        (TRL flushes ``_pending_metrics`` after scoring as ``sum / count`` over the ranks' values, so it then logs
        that total); a rank that logged none of a name (a mixture's rank without that source's rows) counts 0."""
        pending = self._pending_metrics
        mine = sorted({(name, values[0].over) for name, values in pending.items()
                       if values and isinstance(values[0], RankTotal)})  # fmt: skip
        totals = dict(sorted(set(map(tuple, gather_object(mine)))))  # name -> over, alike on every rank
        device = self.accelerator.device
        for name, over in totals.items():
            values = [float(value) for value in pending.get(name, [])]
            local = sum(values) if over == "sum" else max(values, default=0.0)
            gathered = self.accelerator.gather(torch.tensor([local], dtype=torch.float64, device=device))  # (ranks,)
            total = gathered.sum() if over == "sum" else gathered.max()
            pending[name] = [RankTotal(total.item(), over)]

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
        if not self.log_completions:
            return super().log(logs, start_time)
        prompts, completions = self._logs["prompt"], self._logs["completion"]
        self._logs["prompt"] = deque((message_text(p) for p in prompts), maxlen=prompts.maxlen)
        self._logs["completion"] = deque((message_text(c) for c in completions), maxlen=completions.maxlen)
        try:
            super().log(logs, start_time)
        finally:
            self._logs["prompt"], self._logs["completion"] = prompts, completions

    def _check_sampler(self, batch: dict[str, Any]) -> None:
        """The stale-sampler guard (:class:`SamplerGuard`) on the batch TRL just generated with vLLM and scored:
        a few completions of each rank, the gap averaged over ranks, so every rank decides alike."""
        step = self.state.global_step + 1
        guard = self.sampler_guard
        if not self.use_vllm or not guard.due(step):
            return
        if (self.repetition_penalty or 1.0) != 1.0:
            logger.warning("the stale-sampler guard is off: with repetition_penalty %g vLLM's log-probabilities "
                           "depend on each prefix's penalties, which it does not reproduce", self.repetition_penalty)  # fmt: skip
            guard.every = 0
            return
        sums = torch.zeros(4, device=self.accelerator.device)  # |gap| summed, tokens, suppressed mass summed, max |gap|
        if batch.get("sampling_per_token_logps") is not None:
            count = batch["completion_ids"].size(0)
            for row in sorted({i * count // guard.rows for i in range(min(guard.rows, count))}):  # across prompts
                part = self._sampler_gap(batch, row)
                sums[:3] += part[:3]
                sums[3] = torch.maximum(sums[3], part[3])
        totals = self.accelerator.gather(sums[None])  # (ranks, 4)
        tokens = totals[:, 1].sum().item()
        if tokens == 0:
            return
        gap, largest, mass = (
            totals[:, 0].sum().item() / tokens,
            totals[:, 3].max().item(),
            totals[:, 2].sum().item() / tokens,
        )
        for name, value in (("logp_gap", gap), ("logp_gap_max", largest), ("suppressed_mass", mass)):
            self._metrics["train"][f"sampler_check/{name}"].append(value)  # this step's log line: metrics.csv, W&B
        guard.check(step, gap, largest, mass)

    @torch.no_grad()
    def _sampler_gap(self, batch: dict[str, Any], row: int) -> torch.Tensor:
        """(sum of |log p_vLLM - log p_policy|, tokens, sum of the suppressed mass, max gap) over one row's completion:
        the policy's log-probability of each sampled token under vLLM's sampling rule (:func:`sampling_logps`),
        against what vLLM returned."""
        length = batch["completion_ids"].size(1)
        videos = batch.get(VIDEO_FIELDS)
        with self.accelerator.autocast(), (nullcontext() if videos is None else
                                           self._feeding_videos(self.model, [videos[row]])):  # fmt: skip
            logits = self.model(**_row_model_inputs(batch, row), logits_to_keep=length + 1).logits[0, :-1]  # (C, V)
        bias = self.vllm_generation.generation_kwargs.get("logit_bias") or {}
        logps = sampling_logps(logits, temperature=self.temperature, logit_bias=bias, top_k=self.top_k or 0,
                               top_p=self.top_p if self.top_p is not None else 1.0, min_p=self.min_p)  # fmt: skip
        suppressed = self.suppressed_token_ids  # the biased-out ones, read from the same logit bias
        mass = (logits.float() / self.temperature).softmax(-1)[:, suppressed].sum(-1)  # (C,) the policy's own
        sampled = logps.gather(-1, batch["completion_ids"][row][:, None])[:, 0]  # (C,)
        vllm = batch["sampling_per_token_logps"][row].float()
        mask = batch["completion_mask"][row].bool() & ~torch.isnan(vllm)
        if "tool_mask" in batch:  # tool turns (TRL's 0 for logps vLLM never sampled) are not the sampler's
            mask &= batch["tool_mask"][row].bool()
        gap = (sampled - vllm).abs()[mask]
        if gap.numel() == 0:
            return torch.zeros(4, device=logits.device)
        return torch.stack([gap.sum(), torch.tensor(float(gap.numel()), device=gap.device), mass[mask].sum(),
                            gap.max()])  # fmt: skip

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

    def step_rows(self) -> list[str]:
        return list(dict.fromkeys(self._batch_rows))  # each prompt is in the batch num_generations times

    def row_names(self, inputs: list[dict[str, Any]]) -> list[str]:
        return _batch_positions(len(inputs))

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs

    def batch_scored(self, inputs: list[dict[str, Any]]) -> None:
        """Called on every rank after a training batch is scored."""

    # --- reading and setting TRL's state -------------------------------------------------------------------------

    def screen_rewards(self, rewards: torch.Tensor, guard: RewardGuard, scored: torch.Tensor | None = None
                       ) -> torch.Tensor:  # fmt: skip
        """What TRL goes on with after scoring a batch; ``rewards`` (completions of every rank, rewards) is the same
        on every rank, and so is every decision here.

        Stops on a failed reward call (any rank's); logs ``rewards/<name>/nonfinite_frac`` (None, NaN or inf) for each
        reward, over the rows it scores (``scored``: (completions of every rank, rewards), True where a reward scores
        the row; None: every row); in training, stops when no weighted reward scored any completion (TRL would train on advantages of
        0: loss 0, no warning); hands TRL inf as NaN, which it skips like None (inf would turn its group's
        advantages into NaN).
        """
        training = self.model.training
        where = f"step {self.state.global_step + 1}" if training else f"evaluation after step {self.state.global_step}"
        failures = gather_object(guard.failures)
        if failures:
            more = f" (and {len(failures) - 1} more failed reward call(s))" if len(failures) > 1 else ""
            raise RewardFault(failures[0].message(where) + more) from (guard.errors[0] if guard.errors else None)
        self._say_nonfinite(guard, where)
        finite = torch.isfinite(rewards)  # (N, R)
        scored = torch.ones_like(finite) if scored is None else scored.to(finite.device)
        for i, name in enumerate(self.reward_func_names):
            if scored[:, i].any():
                self._log_metric(f"rewards/{name}/nonfinite_frac", 1.0 - finite[scored[:, i], i].float().mean().item())
        weighted = [i for i, weight in enumerate(self.reward_weights.tolist()) if weight != 0]
        if training and weighted and not finite[:, weighted].any():
            names = ", ".join(repr(self.reward_func_names[i]) for i in weighted)
            raise RewardFault(
                f"no reward scored any completion at {where}: {names} gave None, nan or inf for all {len(rewards)} "
                "completions, so the step would train on nothing (loss 0)"
            )
        return rewards.masked_fill(~finite, float("nan"))

    def _say_nonfinite(self, guard: RewardGuard, where: str) -> None:
        for name, positions in guard.nonfinite.items():
            if name not in self._nonfinite_said:
                self._nonfinite_said.add(name)
                logger.warning(
                    "reward %r returned nan or inf for %d of %d completions at %s (first: %s); such values are "
                    "skipped like None and counted in rewards/%s/nonfinite_frac (said once per reward)",
                    name, len(positions), len(guard.rows), where, guard.rows[positions[0]], name,
                )  # fmt: skip

    def save_checkpoint(self) -> None:
        """Save ``checkpoint-{global_step}`` now, as the Trainer does at a save step: ``_save_checkpoint`` (model,
        optimizer, scheduler, RNG, trainer state; then the ``save_total_limit`` rotation), then the ``on_save``
        callbacks (suzak's completion marker among them). Every rank calls it."""
        self._save_checkpoint(self.model_wrapped, trial=None)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def newest_completions(self, image_refs: Sequence[str], step: int) -> list[dict]:
        """Rows of the batch just scored (TRL gathers ``_logs`` over ranks, in rank order; so must ``image_refs``)."""
        weights = self.reward_weights.tolist()
        return completion_rows(self._logs, image_refs, step, weights, self._batch_extra_columns)

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
