"""Atomic checkpoints and a resume's weights: transformers' ``Trainer._save_checkpoint`` and ``_get_output_dir``
(checkpoints written to a staging folder, :data:`STAGING`, renamed when whole), ``_load_from_checkpoint``,
``_load_best_model`` and ``_issue_warnings_after_load`` (a resume's weights loaded with the model's key conversion,
which transformers 5.17's resume leaves out).

Contract tests (tests/test_trl_contract.py): ``test_trainer_hooks``,
``test_save_checkpoint_asks_get_output_dir_for_its_folder_and_rotates_there``,
``test_trainer_save_checkpoint_is_what_a_save_step_runs``,
``test_the_trainer_still_loads_resumed_weights_without_key_conversion``, ``test_key_conversion_helpers``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from suzak import SuzakError

logger = logging.getLogger(__name__)

STAGING = ".suzak-staging"  # in output_dir: checkpoints are written here, then renamed into place when whole


def save_checkpoint_atomically(trainer, save: Callable, output_dir: Callable, model, trial) -> None:
    """TRL's ``save`` (``Trainer._save_checkpoint``) into ``OUTPUT/.suzak-staging`` (``trainer._staging_dir``, which
    :meth:`~.hooks.TrainerHooks._get_output_dir` hands the Trainer), renamed into place once every rank has written
    its part; ``output_dir`` is the Trainer's own ``_get_output_dir``."""
    import os
    import shutil
    from pathlib import Path

    from transformers.trainer_utils import rotate_checkpoints

    run_dir = Path(output_dir(trial))
    name = f"checkpoint-{trainer.state.global_step}"
    staging = run_dir / STAGING
    writer = trainer.args.should_save
    if writer:
        shutil.rmtree(staging / name, ignore_errors=True)  # a save killed earlier
    trainer.accelerator.wait_for_everyone()
    trainer._staging_dir = str(staging)
    try:
        save(model, trial)
        if writer:
            trainer.save_run_state(staging / name)
    except BaseException:
        if writer:
            shutil.rmtree(staging / name, ignore_errors=True)
            with contextlib.suppress(OSError):
                staging.rmdir()
        raise
    finally:
        trainer._staging_dir = None
    trainer.accelerator.wait_for_everyone()  # every rank's files (RNG states, ZeRO shards) are in staging
    if writer:
        if (trainer.state.best_model_checkpoint or "").startswith(str(staging)):
            trainer.state.best_model_checkpoint = str(run_dir / Path(trainer.state.best_model_checkpoint).name)
            trainer.state.save_to_json(str(staging / name / "trainer_state.json"))
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
        rotate_checkpoints(output_dir=str(run_dir), save_total_limit=trainer.args.save_total_limit,
                           best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)  # fmt: skip
    trainer.accelerator.wait_for_everyone()


def load_converted_weights(trainer, folder: str, model, flag: str, what: str) -> None:
    """``folder``'s ``model.safetensors`` (or shards) into ``model``, each key renamed as ``from_pretrained``
    renames it; a weight the folder lacks stops the run (one line naming ``flag``). DeepSpeed, FSDP and PEFT
    models load their own formats (PEFT models are no ``PreTrainedModel``: adapters load themselves)."""
    import json
    import os

    from safetensors.torch import load_file
    from transformers import PreTrainedModel
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled or not isinstance(model, PreTrainedModel):
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
