"""R1-V's multi-GPU GeoQA command line, data parallel: ``test_qwen2vl_geoqa_multigpu.py … --gpu_ids 0,1``.

R1-V's script starts one model per listed GPU and splits the questions between them. Here the listed GPUs become one
torchrun process each (``CUDA_VISIBLE_DEVICES`` = those GPUs, rank *i* on the *i*-th), running the same evaluation as
``python -m suzak.eval geoqa``: each rank generates its shard of the items and rank 0 gathers, scores and writes
R1-V's JSON (``suzak.eval.runner``). Without a CUDA GPU it runs as one process on the CPU.

>>> parse_gpu_ids("0,2", device_count=4), visible_devices([0, 2], None), visible_devices([0, 1], "4,5,6")
([0, 2], '0,2', '4,5')
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from suzak import SuzakError
from suzak.eval import cli

__all__ = ["build_parser", "data_parallel_command", "main", "parse_gpu_ids", "visible_devices"]

logger = logging.getLogger(__name__)

TASK = "geoqa"
R1V_BATCH_SIZE = 4  # R1-V's multi-GPU script's default, per GPU


def build_parser():
    """R1-V's flags (``--model_path --batch_size --output_path --prompt_path --image_root --gpu_ids``) and suzak's."""
    parser = cli.build_parser(task=TASK, batch_size=R1V_BATCH_SIZE)
    parser.description = "Evaluate a checkpoint on GeoQA (R1-V), data parallel over the GPUs in --gpu_ids"
    parser.allow_abbrev = False  # --gpu_ids is removed from the command passed on: only its full spelling may appear
    parser.add_argument("--gpu_ids", help="comma-separated GPU indices, one process each (default: every visible "
                        "GPU; without a CUDA GPU one CPU process)")  # fmt: skip
    return parser


def parse_gpu_ids(text: str | None, device_count: int) -> list[int]:
    """The GPU indices of ``--gpu_ids`` (None: all ``device_count``); one line naming the flag when they are wrong.

    The spelling is checked even without a GPU; the indices are checked against ``device_count`` when there are GPUs.
    """
    if text is None:
        return list(range(device_count))
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise SuzakError(f"--gpu_ids: expected comma-separated GPU indices such as 0,1; got {text!r}") from None
    if len(set(ids)) != len(ids):
        raise SuzakError(f"--gpu_ids: a GPU is listed twice in {text!r}")
    bad = [i for i in ids if i < 0 or (device_count and i >= device_count)]
    if bad and bad[0] < 0:
        raise SuzakError(f"--gpu_ids: GPU indices are >= 0; got {bad[0]}")
    if bad:
        raise SuzakError(f"--gpu_ids: no GPU {bad[0]}; {device_count} GPU(s) visible, indices 0..{device_count - 1}")
    return ids


def visible_devices(ids: list[int], parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the workers: the listed GPUs, as the parent's own visible-devices list names them."""
    if not parent_visible:
        return ",".join(map(str, ids))
    names = [name.strip() for name in parent_visible.split(",")]
    return ",".join(names[i] for i in ids)


def _without_gpu_ids(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--gpu_ids":
            skip = True
        elif not arg.startswith("--gpu_ids="):
            kept.append(arg)
    return kept


def data_parallel_command(argv: list[str], args, num_processes: int) -> list[str]:
    """torchrun with one process per GPU, each running ``python -m suzak.eval geoqa`` with this script's flags.

    This script's own defaults (R1-V's batch size 4, ``--scoring r1v``) are passed explicitly, since the workers'
    command has other defaults.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(num_processes),
            "-m", "suzak.eval", TASK, *_without_gpu_ids(argv), "--batch_size", str(args.batch_size),
            "--scoring", args.scoring]  # fmt: skip


def _device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None, device_count: int | None = None) -> None:
    """Parse R1-V's command line, then evaluate: one CPU process without a GPU, else one torchrun process per GPU."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    count = _device_count() if device_count is None else device_count
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise SuzakError("already running under torchrun: start this script with python (it launches torchrun "
                             "itself), or run test_qwen2vl_geoqa.py under torchrun")  # fmt: skip
        ids = parse_gpu_ids(args.gpu_ids, count)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    if not count:
        logger.warning("no CUDA GPU: evaluating in one process on the CPU%s",
                       f" (--gpu_ids {args.gpu_ids} ignored)" if args.gpu_ids else "")  # fmt: skip
        cli.main(_without_gpu_ids(argv) + ["--batch_size", str(args.batch_size), "--scoring", args.scoring], task=TASK)
        return
    env = os.environ | {"CUDA_VISIBLE_DEVICES": visible_devices(ids, os.environ.get("CUDA_VISIBLE_DEVICES"))}
    command = data_parallel_command(argv, args, len(ids))
    logger.info("data parallel over GPU(s) %s: CUDA_VISIBLE_DEVICES=%s %s", ",".join(map(str, ids)),
                env["CUDA_VISIBLE_DEVICES"], " ".join(command))  # fmt: skip
    returncode = subprocess.run(command, env=env).returncode
    if returncode:
        raise SystemExit(returncode)
