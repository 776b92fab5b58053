"""``python -m suzak.train`` recording each rank's rows, for the several-rank mixture test (tests/test_mixture.py).

    torchrun --nproc_per_node 2 tests/rank_probe.py --record DIR -- SUZAK_TRAIN_FLAGS...

Each rank writes ``DIR/rank<R>.json`` when its run ends: the first rows of the training dataset it built (source and
solution, so the ranks can be compared) and, per generation batch, the rows it trained on (source, solution and the
prompt's text), read where suzak's trainer takes a mixture's per-source figures (``batch_metrics``), before they are
gathered across ranks. A row is told apart by its image's pixels (md5), which no two rows of the smoke sources
share (each colour square's channels are jittered, each shapes scene drawn at random).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import sys
from pathlib import Path


def _record(folder: str) -> None:
    from suzak.scoring.prompts import question_text
    from suzak.training.trainer import VLMGRPOTrainer

    rank = int(os.environ.get("RANK", "0"))
    seen: dict[str, list] = {"dataset": [], "batches": []}
    path = Path(folder) / f"rank{rank}.json"
    atexit.register(lambda: path.write_text(json.dumps(seen)))
    metrics = VLMGRPOTrainer.batch_metrics

    def recorded(self, inputs, rewards, lengths):
        if not seen["dataset"]:
            seen["dataset"] = [[row["source"], row["solution"]] for row in self.train_dataset.select(range(32))]
        seen["batches"].append([[row["source"], row["solution"], question_text(row["prompt"]),
                                 hashlib.md5(row["image"].tobytes()).hexdigest()] for row in inputs])  # fmt: skip
        return metrics(self, inputs, rewards, lengths)

    VLMGRPOTrainer.batch_metrics = recorded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", required=True)
    args, rest = parser.parse_known_args()
    _record(args.record)
    from suzak.train import main as train

    train(rest[1:] if rest[:1] == ["--"] else rest)


if __name__ == "__main__":
    sys.exit(main())
