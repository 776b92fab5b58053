"""The judge's figures over two ranks, for tests/test_judge.py::test_judge_figures_are_summed_over_two_ranks.

    torchrun --nproc_per_node 2 tests/rank_totals.py DIR

Each rank logs its own judge figures as the judge does (:class:`suzak.trl_internals.rewards.RankTotal`), runs
:meth:`suzak.trl_internals.hooks.GRPOHooks.total_over_ranks` as the trainer does after scoring, then TRL's flush of
``_pending_metrics`` (each name's sum over every rank's values divided by their count), and writes what TRL would
log to ``DIR/rank<R>.json``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from suzak.trl_internals.hooks import GRPOHooks
from suzak.trl_internals.rewards import RankTotal


def main(folder: str) -> None:
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    pending = defaultdict(list)
    pending["judge/a/calls"].append(RankTotal([3, 5][rank]))
    pending["judge/a/seconds"].append(RankTotal([2.0, 1.5][rank], "max"))
    if rank == 1:  # a source whose rows all went to rank 1
        pending["judge/b/calls"].append(RankTotal(4))
    trainer = SimpleNamespace(accelerator=accelerator, _pending_metrics=pending)
    GRPOHooks.total_over_ranks(trainer)
    logged = {}
    for name in sorted(set(gather_object(list(pending)))):  # TRL 1.16's flush (tests/test_trl_contract.py)
        values = pending.get(name, [])
        local = torch.tensor([sum(values), len(values)], dtype=torch.float32)
        total, count = accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
        logged[name] = total / count
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(logged))


if __name__ == "__main__":
    main(sys.argv[1])
