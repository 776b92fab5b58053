"""The training rows' order, epoch by epoch, the same for a resumed run as for an uninterrupted one.

TRL's ``RepeatSampler`` (``GRPOTrainer._get_train_sampler``) draws each epoch's order from one ``torch.Generator``
seeded once, advanced by one ``randperm`` of the dataset per pass, and has no ``set_epoch``. A run resumed in its
k-th epoch never ran the epochs before it, so its generator drew the first epoch's order again: from the resume on it
trained other rows than the uninterrupted run would (the long mixture bench: 0 of 200 steps after a resume in the
third epoch matched). :func:`epoch_seeded` gives the sampler a ``set_epoch``, which transformers' Trainer calls
before each epoch (accelerate's ``DataLoaderShard.set_epoch`` hands it to the batch sampler's ``sampler``): it seeds
the generator again and replays the epochs before (one ``randperm`` each, as the uninterrupted run drew them), so
epoch k's order is the uninterrupted run's, resumed or not. It relies on ``RepeatSampler``'s ``shuffle``, ``seed``,
``generator`` and ``num_samples`` and on one ``randperm`` an epoch (tests/test_trl_contract.py:
``test_the_repeat_sampler_draws_one_permutation_an_epoch_from_its_seed``; end to end:
tests/test_resume.py::test_a_resume_past_the_first_epoch_trains_the_rows_the_uninterrupted_run_did).

>>> from trl.trainer.utils import RepeatSampler
>>> whole = RepeatSampler(range(6), mini_repeat_count=1, seed=0)
>>> first, second, third = list(whole), list(whole), list(whole)
>>> resumed = epoch_seeded(RepeatSampler(range(6), mini_repeat_count=1, seed=0))
>>> resumed.set_epoch(2)
>>> list(resumed) == third != first
True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["EpochSeeded", "epoch_seeded"]


class EpochSeeded(Sampler):
    """``sampler`` (TRL's ``RepeatSampler``) whose order at epoch k is the one it draws at its k-th pass from its seed."""

    def __init__(self, sampler: Any):
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        generator = self.sampler.generator
        generator.manual_seed(self.sampler.seed)
        for _ in range(epoch):  # the passes an uninterrupted run drew before this one
            torch.randperm(self.sampler.num_samples, generator=generator)

    def __iter__(self) -> Iterator[int]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def epoch_seeded(sampler: Any) -> Any:
    """``sampler`` with a ``set_epoch`` that replays its seed's draws up to the epoch; a sampler that does not shuffle,
    or shuffles unseeded, as it is (its order is the same every epoch, or was never reproducible)."""
    if not getattr(sampler, "shuffle", False) or getattr(sampler, "seed", None) is None:
        return sampler
    return EpochSeeded(sampler)
