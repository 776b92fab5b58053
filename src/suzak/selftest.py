"""Proof that training learns through the images: ``python -m suzak.selftest``.

A loss that moves and parameters that change prove little: a run whose images are mis-paired with their prompts
(TRL #5785/#6401, R1-V's batch bugs) passes those checks too. This self-test trains the offline tiny Qwen2.5-VL
with suzak's own trainer (pixel budget on) on a task it can only solve by looking at the right image: "What color
is the image?" over small red or blue squares, each channel jittered so no two images are equal, with a 0/1 reward
on the first answer token. Then it runs a held-out greedy evaluation through suzak's evaluation engine.

- aligned run: images paired with their labels; the reward must climb to ≥ 0.9 over the last 10 steps;
- control run: the same images shuffled across rows (labels kept), or all grey: the reward must stay at chance
  (0.3–0.7), because nothing in the pixels predicts the label.

PASS means gradients flow from the answer through the language model into the vision tower, for the image that
belongs to the prompt. Run it after installing on a new machine, before spending GPU hours:

    python -m suzak.selftest                        # aligned + shuffled control, seed 0, 150 steps each
    python -m suzak.selftest --device cuda --json selftest.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["SelfTestConfig", "color_dataset", "format_report", "main", "run_selftest", "windows"]

logger = logging.getLogger(__name__)

QUESTION = "What color is the image?"
COLORS = {"red": (200, 30, 30), "blue": (30, 30, 200)}
GREY = (120, 120, 120)


@dataclass
class SelfTestConfig:
    """Settings measured here (docs/selftest.md): lr 3e-3 and 2e-3 collapse onto one colour; 1e-3 passes by ~130."""

    seed: int = 0
    steps: int = 150
    rows: int = 2000
    heldout_rows: int = 200
    prompts_per_step: int = 16
    generations: int = 8
    learning_rate: float = 1e-3
    image_size: int = 56
    temperature: float = 1.0
    loss_type: str = "dapo"
    device: str = "cpu"


def _square(rng: np.random.Generator, rgb: tuple[int, int, int], size: int) -> Image.Image:
    jitter = rng.integers(-25, 26, size=3)  # per image, so no two images are equal
    color = np.clip(np.array(rgb) + jitter, 0, 255).astype(np.uint8)
    return Image.fromarray(np.broadcast_to(color, (size, size, 3)).copy(), "RGB")


def color_dataset(num_rows: int, seed: int, images: str = "aligned", size: int = 56):
    """Rows {prompt, image, solution}: a red or blue square and its colour word (``images`` picks the control)."""
    import datasets

    from suzak.prompts import build_conversation

    rng = np.random.default_rng(seed)
    labels = rng.choice(sorted(COLORS), size=num_rows)
    pictures = [_square(rng, GREY if images == "grey" else COLORS[label], size) for label in labels]
    if images == "shuffled":
        pictures = [pictures[i] for i in rng.permutation(num_rows)]
    elif images not in ("aligned", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    rows = [{"prompt": build_conversation(QUESTION), "image": image, "solution": str(label)}
            for image, label in zip(pictures, labels, strict=True)]  # fmt: skip
    return datasets.Dataset.from_list(rows)


def first_token_reward(answer_ids: dict[str, int]):
    """0/1 reward: the first generated token is the gold colour word (a single token in the tiny vocabulary).

    Partial credit for any colour word made one seed collapse onto a single answer and stall: keep it 0/1.
    """

    def color_first_token(completions, completion_ids, solution, **kwargs) -> list[float]:
        return [
            float(bool(ids) and ids[0] == answer_ids[gold]) for ids, gold in zip(completion_ids, solution, strict=True)
        ]

    return color_first_token


def _answer_ids(tokenizer) -> dict[str, int]:
    ids = {}
    for word in COLORS:
        pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise RuntimeError(
                f"the tiny vocabulary splits {word!r} into {len(pieces)} tokens; the self-test needs one"
            )
        ids[word] = pieces[0]
    return ids


class _RewardTrace:
    """Collects the mean reward of every training step from the trainer's logs."""

    def __init__(self):
        from transformers import TrainerCallback

        trace = self

        class Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "reward" in logs:
                    trace.rewards.append(float(logs["reward"]))

        self.rewards: list[float] = []
        self.callback = Callback()


def _train(config: SelfTestConfig, model_dir: Path, images: str, output_dir: Path):
    from transformers import AutoModelForImageTextToText, AutoProcessor, PrinterCallback
    from trl import GRPOConfig

    from suzak.trainer import VLMGRPOTrainer
    from suzak.vision import PixelBudget

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(output_dir), seed=config.seed, max_steps=config.steps, learning_rate=config.learning_rate,
        lr_scheduler_type="constant", per_device_train_batch_size=config.prompts_per_step * config.generations,
        num_generations=config.generations, max_completion_length=2, temperature=config.temperature, beta=0.0,
        loss_type=config.loss_type,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, gradient_checkpointing=False,
        use_cpu=config.device == "cpu", disable_tqdm=True,
    )  # fmt: skip
    trace = _RewardTrace()
    trainer = VLMGRPOTrainer(
        model=model, reward_funcs=[first_token_reward(_answer_ids(processor.tokenizer))], args=args,
        train_dataset=color_dataset(config.rows, config.seed, images, config.image_size), processing_class=processor,
        pixel_budget=PixelBudget(3136, 3136), callbacks=[trace.callback],
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the table below replaces 100 printed log dicts
    trainer.train()
    return trainer, trace.rewards


def _heldout_accuracy(trainer, config: SelfTestConfig) -> float:
    """Greedy answers on unseen aligned squares through the evaluation engine (vision tokens suppressed)."""
    from suzak.eval.engine import HFEngine

    rows = list(color_dataset(config.heldout_rows, config.seed + 10_000, "aligned", config.image_size))
    engine = HFEngine(trainer.model, trainer.processing_class, trainer.pixel_budget, batch_size=64,
                      max_new_tokens=2, progress=False)  # fmt: skip
    trainer.model.eval()
    outputs = engine.generate(rows)
    return statistics.fmean(
        float(out.strip().startswith(row["solution"])) for out, row in zip(outputs, rows, strict=True)
    )


def windows(rewards: list[float], size: int = 10) -> list[float]:
    """Mean reward over consecutive windows of ``size`` steps."""
    return [statistics.fmean(rewards[i : i + size]) for i in range(0, len(rewards), size)]


def run_selftest(config: SelfTestConfig, conditions: tuple[str, ...] = ("aligned", "shuffled")) -> dict:
    """Train each condition, evaluate held-out, return the report (``passed`` and the numbers behind it).

    An aligned run passes at >= 0.9 mean reward over its last 10 steps; a control run (shuffled, grey) passes when
    it stays at chance, 0.3-0.7.
    """
    import torch

    from suzak.tiny import build_tiny_model

    start = time.monotonic()
    torch.manual_seed(config.seed)
    with tempfile.TemporaryDirectory(prefix="suzak-selftest-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model")
        runs = {}
        for images in conditions:
            trainer, rewards = _train(config, model_dir, images, Path(tmp) / images)
            runs[images] = {"rewards": rewards, "heldout": _heldout_accuracy(trainer, config)}
    last = {name: statistics.fmean(run["rewards"][-10:]) for name, run in runs.items()}
    ok = {name: value >= 0.9 if name == "aligned" else 0.3 <= value <= 0.7 for name, value in last.items()}
    controls = [name for name in conditions if name != "aligned"]
    return {
        "aligned_accuracy": last.get("aligned"),
        "control_accuracy": last[controls[0]] if controls else None,
        "last10": last,
        "heldout_accuracy": runs["aligned"]["heldout"] if "aligned" in runs else None,
        "heldout": {name: run["heldout"] for name, run in runs.items()},
        "windows": {name: windows(run["rewards"]) for name, run in runs.items()},
        "steps": config.steps,
        "seconds": round(time.monotonic() - start, 1),
        "passed": all(ok.values()),
    }


def format_report(report: dict) -> str:
    names = list(report["windows"])
    lines = ["| steps | " + " | ".join(f"{n} reward" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in range(max(len(w) for w in report["windows"].values())):
        cells = [f"{report['windows'][n][i]:.3f}" if i < len(report["windows"][n]) else "" for n in names]
        lines.append(f"| {10 * i + 1}-{10 * i + 10} | " + " | ".join(cells) + " |")
    verdict = "PASS" if report["passed"] else "FAIL"
    needs = {name: ">= 0.9" if name == "aligned" else "0.3-0.7" for name in report["last10"]}
    runs = ", ".join(f"{name} {value:.3f} (needs {needs[name]})" for name, value in report["last10"].items())
    heldout = ", ".join(f"{name} {value:.3f}" for name, value in report["heldout"].items())
    lines.append(f"{verdict}: reward over the last 10 steps: {runs}; held-out greedy accuracy: {heldout}; "
                 f"{report['seconds']:.0f} s")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", choices=["aligned", "shuffled", "grey"], default=None,
                        help="run only this condition (default: aligned, then the shuffled control)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SelfTestConfig.steps)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = SelfTestConfig(seed=args.seed, steps=args.steps, device=args.device)
    report = run_selftest(config, ("aligned", "shuffled") if args.images is None else (args.images,))
    print(format_report(report))
    if args.json:
        keys = ["aligned_accuracy", "control_accuracy", "heldout_accuracy", "steps", "seconds", "passed"]
        Path(args.json).write_text(json.dumps({k: report[k] for k in keys} | {"detail": report}, indent=2) + "\n")
    raise SystemExit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
