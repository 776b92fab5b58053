"""Seeing an episode (:mod:`suzak.models.episodes`): what a run keeps of its episodes and the strip drawn from it.

A training run with an episode environment keeps, at each step, the best and the worst episode of the batch's first
group (by the environment's reward): ``OUTPUT_DIR/episodes/step-<N>.json`` (the instruction, each rollout's reward and
actions) and each screen it acted on as a PNG beside it (at most :data:`SCREEN_HEIGHT` pixels high). ``suzak plot
episode RUN [--step N]`` draws them as a strip (``plots/episode-step-<N>.png``): one row per episode, one screen per
action, each click drawn where it landed, each typed text or key written under its screen; the run's end draws its
last step's.

    suzak plot episode outputs/miniwob-smoke --step 2
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from suzak import SuzakError

__all__ = ["EPISODES_DIR", "SCREEN_HEIGHT", "draw_episode", "episode_steps", "record_episodes"]

logger = logging.getLogger(__name__)

EPISODES_DIR = "episodes"
SCREEN_HEIGHT = 360  # a kept screen's most pixels high (a 1080p screenshot at a third of its size)
CLICK_COLOUR, TEXT_COLOUR = (230, 0, 0), (20, 20, 20)


def _kept(screen: Image.Image) -> tuple[Image.Image, float]:
    """The screen as kept (at most SCREEN_HEIGHT high) and its scale from the original."""
    scale = min(1.0, SCREEN_HEIGHT / screen.height)
    if scale < 1.0:
        screen = screen.resize((max(1, round(screen.width * scale)), SCREEN_HEIGHT))
    return screen.convert("RGB"), scale


def record_episodes(environments: Sequence[Any], group_size: int, output_dir: str | Path, step: int,
                    instruction: str = "") -> Path | None:  # fmt: skip
    """Keep the best and the worst episode of the first group of ``environments`` (TRL's per-rollout environments of
    one batch, :class:`suzak.models.episodes.ScreenEnvironment`), for step ``step``; returns the JSON's path."""
    group = [e for e in list(environments)[:group_size] if getattr(e, "steps", None) is not None]
    if not group:
        return None
    ranked = sorted(range(len(group)), key=lambda i: group[i].get_reward())
    chosen = [ranked[-1]] if ranked[0] == ranked[-1] else [ranked[-1], ranked[0]]
    folder = Path(output_dir) / EPISODES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    rollouts = []
    for index in chosen:
        environment = group[index]
        screens = [step_.screen for step_ in environment.steps]
        if environment.final_screen is not None:
            screens.append(environment.final_screen)
        names, scales = [], []
        for number, screen in enumerate(screens):
            kept, scale = _kept(screen)
            name = f"step-{step:06d}-rollout-{index}-screen-{number}.png"
            kept.save(folder / name)
            names.append(name)
            scales.append(scale)
        rollouts.append({"rollout": index, "reward": environment.get_reward(),
                         "success": bool(environment.outcome.success), "screens": names, "scales": scales,
                         "steps": [s.as_dict() for s in environment.steps],
                         "problems": dict(environment.problems)})  # fmt: skip
    path = folder / f"step-{step:06d}.json"
    path.write_text(json.dumps({"step": step, "instruction": instruction, "rollouts": rollouts}, indent=1) + "\n",
                    encoding="utf-8")  # fmt: skip
    return path


def episode_steps(run_dir: str | Path) -> list[int]:
    """The steps whose episodes a run kept, in order."""
    folder = Path(run_dir) / EPISODES_DIR
    return sorted(int(p.stem.split("-")[1]) for p in folder.glob("step-*.json")) if folder.is_dir() else []


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _caption(step: dict) -> str:
    kind, text = step["kind"], step.get("text")
    point = step.get("model_point")
    where = f"({point[0]:g}, {point[1]:g})" if point else ""
    words = {"click": f"click {where}", "type_text": f"type {text!r}", "press_key": f"key {text}",
             "scroll": f"scroll {text} {where}"}  # fmt: skip
    caption = words.get(kind, kind)
    return caption + (f" [{step['problem']}]" if step.get("problem") else "")


def draw_episode(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """The strip of the episodes a run kept at ``step`` (default: the last), as a PNG (default
    ``RUN/plots/episode-step-<N>.png``); one line naming what is missing otherwise."""
    run_dir = Path(run_dir)
    steps = episode_steps(run_dir)
    if not steps:
        raise SuzakError(f"{run_dir}: no episodes kept ({EPISODES_DIR}/step-*.json): a run with an episode "
                         "environment (tools: [miniwob], or your own ScreenEnvironment) keeps them")  # fmt: skip
    step = steps[-1] if step is None else step
    path = run_dir / EPISODES_DIR / f"step-{step:06d}.json"
    if not path.is_file():
        raise SuzakError(f"{run_dir}: no episodes kept at step {step}; kept: {_ranges(steps)}")
    kept = json.loads(path.read_text(encoding="utf-8"))
    font, small = _font(14), _font(12)
    zoom = 2 if all(Image.open(run_dir / EPISODES_DIR / r["screens"][0]).height < 240 for r in kept["rollouts"]
                    if r["screens"]) else 1  # fmt: skip
    rows = []
    for rollout in kept["rollouts"]:
        tiles = []
        for number, name in enumerate(rollout["screens"]):
            screen = Image.open(run_dir / EPISODES_DIR / name).convert("RGB")
            screen = screen.resize((screen.width * zoom, screen.height * zoom), Image.NEAREST)
            tile = Image.new("RGB", (screen.width + 8, screen.height + 40), "white")
            tile.paste(screen, (4, 4))
            draw = ImageDraw.Draw(tile)
            if number < len(rollout["steps"]):
                action = rollout["steps"][number]
                point = action.get("point")
                if point is not None:
                    scale = rollout["scales"][number] * zoom
                    x, y = 4 + point[0] * scale, 4 + point[1] * scale
                    draw.ellipse((x - 7, y - 7, x + 7, y + 7), outline=CLICK_COLOUR, width=3)
                    draw.line((x - 11, y, x + 11, y), fill=CLICK_COLOUR, width=1)
                    draw.line((x, y - 11, x, y + 11), fill=CLICK_COLOUR, width=1)
                draw.text((4, screen.height + 8), f"{number + 1}. {_caption(action)}", fill=TEXT_COLOUR, font=small)
            else:
                draw.text((4, screen.height + 8), "end", fill=TEXT_COLOUR, font=small)
            tiles.append(tile)
        verdict = "success" if rollout["success"] else "failure"
        label = f"rollout {rollout['rollout']}: reward {rollout['reward']:g} ({verdict}), {len(rollout['steps'])} action(s)"
        width = max(sum(t.width for t in tiles), 400)
        height = max((t.height for t in tiles), default=0) + 24
        row = Image.new("RGB", (width, height), "white")
        ImageDraw.Draw(row).text((4, 4), label, fill=TEXT_COLOUR, font=font)
        x = 0
        for tile in tiles:
            row.paste(tile, (x, 24))
            x += tile.width
        rows.append(row)
    title = f"step {step}: {kept.get('instruction', '')}".strip()
    width = max(max(r.width for r in rows), 400)
    strip = Image.new("RGB", (width, sum(r.height for r in rows) + 28), "white")
    ImageDraw.Draw(strip).text((4, 6), title[:160], fill=TEXT_COLOUR, font=font)
    y = 28
    for row in rows:
        strip.paste(row, (0, y))
        y += row.height
    target = Path(out) if out else run_dir / "plots" / f"episode-step-{step}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    strip.save(target)
    return target


def _ranges(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]} ({len(steps)} steps)" if len(steps) > 1 else str(steps[0])
