"""``suzak``: one command with a subcommand for each thing suzak does (also ``python -m suzak``). ``suzak X --help``
is X's own help, the same as ``python -m suzak.X --help``, which keeps working for train, sft, eval, selftest and
watch (the names TRL users type).

    suzak train --config recipes/demo.yaml
    suzak eval --task superclevr --model_path outputs/demo
    suzak selftest --task zoom
"""

from __future__ import annotations

import difflib
import importlib
import sys

__all__ = ["COMMANDS", "main", "usage"]

# name: (the module whose main(argv) runs it, one line for ``suzak --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("suzak.train", "GRPO training from a YAML recipe (TRL's GRPOConfig flags and suzak's)"),
    "sft": ("suzak.sft", "supervised fine-tuning from a recipe (a warm start before GRPO)"),
    "eval": ("suzak.eval.cli", "evaluate a model (--task superclevr, geoqa, jsonl, rec, ...; HF or vLLM), or rescore"),
    "heldout": ("suzak.training.heldout", "a recipe's held-out eval (each mixture source by its own reward) on a checkpoint"),
    "selftest": ("suzak.selftest", "prove training learns through the images, on the offline tiny model"),
    "watch": ("suzak.watch", "follow a run's output folder: progress, reward curve, newest completions"),
    "tiny": ("suzak.models.tiny", "write the offline tiny model of a Qwen VL family (tests, demos)"),
    "export": ("suzak.release.export", "turn a checkpoint (DeepSpeed ZeRO, LoRA) into a plain model folder"),
    "release": ("suzak.release.publish", "write a run's release folder (model card, results) and upload it"),
    "data": ("suzak.data.builders", "build a dataset (procedural, Hub, JSONL) and write it to disk"),
    "plot": ("suzak.runs.plots", "draw a run's training curves as PNGs (plot episode RUN --step N: an episode's strip)"),
    "boxes": ("suzak.media.boxes", "a box in each Qwen family's frame, and back to pixels"),
    "lora-targets": ("suzak.models.lora_targets", "what each LoRA target matches in a model, before training"),
}


def usage() -> str:
    """``suzak --help``: the commands, one line each.

    >>> print(usage().splitlines()[0])
    usage: suzak COMMAND [ARGS...]   (suzak COMMAND --help: the command's own flags)
    """
    width = max(map(len, COMMANDS))
    lines = ["usage: suzak COMMAND [ARGS...]   (suzak COMMAND --help: the command's own flags)", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {line}" for name, (_, line) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run ``suzak COMMAND ARGS...``: the command's ``main(ARGS)``; an unknown command is one line (exit 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f"; commands: {', '.join(COMMANDS)}"
        print(f"error: unknown command {name!r}{hint}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [f"suzak {name}", *rest]
    importlib.import_module(COMMANDS[name][0]).main(rest)


if __name__ == "__main__":
    main()
