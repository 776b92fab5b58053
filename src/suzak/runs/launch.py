"""torchrun without its failure block: ``python -m suzak.runs.launch`` takes torchrun's arguments, runs it, and when a
rank fails exits with that rank's exit code, leaving the rank's own ``error: …`` line (and, for a run stopped by a
signal, the resume line) as the last thing printed instead of torchrun's ``ChildFailedError`` traceback and table.
The launch scripts use it (``src/scripts/common.sh``) wherever they would call ``torchrun``.

    python -m suzak.runs.launch --nproc_per_node 8 -m suzak.train --config recipes/clevr_qwen2.5vl_3b.yaml
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    """torchrun's ``run`` on ``argv``; a failed rank ends the process with its exit code (1 when killed by a
    signal), the torchrun lines naming it kept, the traceback and failure table left out."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        logger.debug("rank %s failed: %s", rank, failure)
        sys.exit(failure.exitcode if failure.exitcode > 0 else 1)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
