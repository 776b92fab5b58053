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

STAGING = ".suzak-staging"  # in output_dir: checkpoints are written here, then renamed into place when whole
