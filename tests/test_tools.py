"""Tools in GRPO rollouts (suzak.models.tools, suzak.models.tool_calling): the zoom's crops and errors, each family's tool
template and parser, the settings' checks, and multi-turn GRPO with the zoom on the tiny model."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT
from suzak import SuzakError
from suzak.media.boxes import BoxFrame
from suzak.media.vision import PixelBudget
from suzak.models.tools import ORIGINAL_IMAGE_COLUMN, ZOOM_PROBLEMS, ToolError, ZoomEnvironment, resolve_tools

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _zoom(image: Image.Image, family: str, seen: PixelBudget, crops: PixelBudget, cap: int | None = None):
    zoom = ZoomEnvironment(crops, cap)
    frame = BoxFrame.of(family, image.width, image.height, seen)
    zoom.reset(**{ORIGINAL_IMAGE_COLUMN: image, "box_frame": frame.as_dict()})
    return zoom, frame


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_zoom_crops_the_original_image_at_a_box_in_the_model_frame(family):
    """The crop is the original's pixels under the box (not the downscaled view's), fitted to the crop budget."""
    factor = 28 if family == "qwen2_5_vl" else 32
    image = _noise(1280, 960)
    seen = PixelBudget(factor * factor, 4 * factor * factor, factor=factor)  # the model sees a 2x2-token thumbnail
    crops = PixelBudget(factor * factor, 64 * factor * factor, factor=factor)
    zoom, frame = _zoom(image, family, seen, crops)
    region = (320, 240, 640, 480)  # original pixels
    model_box = list(frame.to_model(region))
    crop = zoom.zoom(model_box)[0]["image"]
    left, top, right, bottom = frame.from_model(model_box)
    expected = crops.fit(image.crop((math.floor(left), math.floor(top), math.ceil(right), math.ceil(bottom))))
    assert crop.size == expected.size and crop.tobytes() == expected.tobytes()
    assert crop.width % factor == 0 and crop.height % factor == 0
    assert zoom.visual_tokens == crops.tokens(crop.height, crop.width) > 4  # more detail than the whole view had
    assert zoom.crops == [[math.floor(left), math.floor(top), math.ceil(right), math.ceil(bottom)]]
    if family == "qwen2_5_vl":  # absolute pixels of the 2x2-token view: the box is coarse, the crop still original
        assert max(model_box) <= 2 * factor


def test_zoom_errors_are_tool_messages_counted_by_reason():
    budget = PixelBudget(784, 3136, factor=28)
    zoom, _ = _zoom(_noise(560, 560), "qwen2_vl", PixelBudget(784, 3136, factor=28), budget, cap=8)
    calls = {
        "unparsable": ["a", "b", "c", "d"],
        "out_of_range": [500, 500, 400, 600],
        "too_small": [0, 0, 10, 10],  # 5.6 x 5.6 pixels of the original: less than one 28-pixel patch
    }
    for box in calls.values():
        with pytest.raises(ToolError, match=r"^zoom: "):
            zoom.zoom(box)
    zoom.zoom([0, 0, 500, 500])  # 4 visual tokens
    zoom.zoom([500, 500, 999, 999])  # 4 more: the cap of 8
    with pytest.raises(ToolError, match="visual tokens"):
        zoom.zoom([0, 0, 500, 500])
    assert dict(zoom.problems) == {"unparsable": 1, "out_of_range": 1, "too_small": 1, "budget": 1}
    assert set(zoom.problems) <= set(ZOOM_PROBLEMS) and zoom.calls == 6
    zoom.reset(prompt="a row without an image")
    with pytest.raises(ToolError, match="no single image"):
        zoom.zoom([0, 0, 500, 500])
    assert dict(zoom.problems) == {"no_image": 1} and zoom.visual_tokens == 0


def tool_for_tests(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return query.upper()


class EnvironmentForTests:
    def reset(self, **row):
        return None

    def look(self, query: str) -> str:
        """Look.

        Args:
            query: What to look at.
        """
        return query


def test_resolve_tools_takes_zoom_functions_and_one_environment():
    budget = PixelBudget(factor=28)
    toolset = resolve_tools(["zoom", "tests.test_tools.tool_for_tests"], budget)
    kwargs = toolset.trainer_kwargs()
    assert [tool.__name__ for tool in kwargs["tools"]] == ["tool_for_tests"]  # (imported by its dotted path)
    assert isinstance(kwargs["environment_factory"](), ZoomEnvironment)
    environment = resolve_tools(["tests.test_tools.EnvironmentForTests"], None).environment_factory
    assert environment.__name__ == "EnvironmentForTests" and callable(environment.reset)
    for names, message in [
        (["zoom", "tests.test_tools.EnvironmentForTests"], "second environment"),
        (["zoomm"], "unknown tool 'zoomm'"),
        (["tests.test_tools.nothing"], "cannot import tool"),
        (["tests.test_tools.FAMILIES"], "not a function or an environment class"),
        (["tests.test_tools.ToolError"], "without a reset method"),
    ]:
        with pytest.raises(SuzakError, match=message):
            resolve_tools(names, budget)


def test_every_vision_family_has_a_call_form():
    """Every family suzak sizes images for can call tools, its MoE variant as its family (issue: Qwen3-VL-MoE
    stopped after its weights loaded with tools: [zoom])."""
    from suzak.media import vision
    from suzak.models.tool_calling import CALL_FORMS

    assert set(vision.FAMILIES) <= set(CALL_FORMS)
    assert CALL_FORMS["qwen3_vl_moe"] == CALL_FORMS["qwen3_vl"] and CALL_FORMS["qwen3_5_moe"] == CALL_FORMS["qwen3_5"]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_renders_and_parses_a_zoom_call(family, family_model_dir):
    """Each family's tool template (suzak's for Qwen2-VL / Qwen2.5-VL, the native one for Qwen3-VL and Qwen3.5)
    renders a call and a tool turn with an image, TRL's checks accept it, and the parser reads the call back."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from suzak.models.tool_calling import prepare_tool_calling

    processor = AutoProcessor.from_pretrained(family_model_dir(family))
    prepare_tool_calling(processor, family)
    assert supports_tool_calling(processor) and is_chat_template_prefix_preserving(processor)
    zoom = ZoomEnvironment(PixelBudget(factor=28)).zoom
    image = Image.new("RGB", (64, 64))
    user = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Where?"}]}]
    call = [{"type": "function", "function": {"name": "zoom", "arguments": {"bbox_2d": [10, 20, 300, 400]}}}]
    prompt = processor.apply_chat_template(user, tools=[zoom], add_generation_prompt=True, tokenize=False)
    assert '"name": "zoom"' in prompt and "bbox_2d" in prompt
    with_call = processor.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": call}],
                                              tools=[zoom], tokenize=False)  # fmt: skip
    assert with_call.startswith(prompt)
    tokenizer = processor.tokenizer
    parsed = tokenizer.parse_response(tokenizer(with_call[len(prompt) :])["input_ids"],
                                      prefix=tokenizer(prompt)["input_ids"], tools=[zoom])  # fmt: skip
    assert parsed["tool_calls"] == call
    crop = {"role": "tool", "name": "zoom", "content": [{"type": "image", "image": image}]}
    full = processor.apply_chat_template(user + [{"role": "assistant", "content": "", "tool_calls": call}, crop],
                                         tools=[zoom], add_generation_prompt=True, tokenize=False)  # fmt: skip
    tool_turn = full[len(with_call) :]
    assert "<tool_response>" in tool_turn and tool_turn.count("<|image_pad|>") == 1


def test_tool_settings_are_checked_before_the_model_loads(tmp_path):
    from suzak.training.configs import parse_args

    base = ["--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "out"), "--tools", "zoom",
            "--min_pixels", "3136", "--max_pixels", "50176"]  # fmt: skip
    with pytest.raises(SuzakError, match="tool_max_pixels 1000 must lie between min_pixels 3136 and max_pixels 50176"):
        parse_args([*base, "--tool_max_pixels", "1000"])
    with pytest.raises(SuzakError, match="tool_max_visual_tokens must be at least 1"):
        parse_args([*base, "--tool_max_visual_tokens", "0"])
    with pytest.raises(SuzakError, match="--rewards zoom_used pays a rollout's zoom calls: it needs --tools zoom"):
        parse_args(
            [*base[:-6], "--min_pixels", "3136", "--max_pixels", "50176", "--rewards", "word_match", "zoom_used"]
        )
    suzak_args, config, _ = parse_args([*base, "--tool_max_pixels", "12544", "--max_tool_calling_iterations", "2"])
    assert suzak_args.tools == ["zoom"] and suzak_args.tool_max_pixels == 12544
    assert config.max_tool_calling_iterations == 2


def zoom_rollouts(model_dir, tmp_path, env: dict, vllm: bool = False) -> dict:
    """tests/zoom_rollouts.py's record: two GRPO steps with the zoom from ``model_dir``, taught the call
    (conftest.zoom_prior_model)."""
    import sys

    from conftest import ROOT, run_ok

    record = tmp_path / "record.json"
    command = [sys.executable, str(ROOT / "tests" / "zoom_rollouts.py"), str(model_dir), str(record)]
    run_ok(command + (["--vllm"] if vllm else []), env, timeout=900)
    return json.loads(record.read_text())


def check_zoom_rollouts(record: dict) -> None:
    """The calls were parsed and answered with crops of the original image (224 pixels a side, not the 56-pixel
    view), the crops joined the next turn and the training forward, the tool turns carried no loss, the failed calls
    were counted by reason, every step's loss is finite, the packed training passes gave the padded passes' numbers, and
    W&B's completions table shows each turn and crop."""
    assert record["seen"] and {tuple(size) for size in record["seen"]} == {(224, 224)}
    logs = [entry for entry in record["logs"] if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert min(entry["tools/call_frequency"] for entry in logs) > 0.5
    assert all(f"tools/zoom_{reason}" in entry for entry in logs for reason in ZOOM_PROBLEMS)
    answered = [batch for batch in record["batches"] if batch["tool_tokens"] > 0]
    assert answered and all(batch["images"] > batch["rows"] for batch in answered)  # crops beside the rows' images
    crops = [box for rollout in record["crops"] for box in rollout]  # completions.csv's zoom_crops, every rollout
    assert len(record["crops"]) == 8 and crops and all(0 <= a < c <= 224 and 0 <= b < d <= 224 for a, b, c, d in crops)
    assert all(batch["post_tool_tokens"] > 0 for batch in answered)  # the model went on after seeing the crop
    # padding_free (the default): the passes packed, crops and tool turns in the completions, as exact as padded
    assert all(entry["perf/real_token_fraction"] == 1.0 for entry in logs)
    assert record["packed_gaps"] and max(record["packed_gaps"]) <= 1e-5, record["packed_gaps"]
    # the W&B table (offline run, log_completions): every turn as text, the prompt's image and then each crop
    rows = [dict(zip(table["columns"], row, strict=True)) for table in record["tables"] for row in table["data"]]
    assert rows and any("[zoom] <image>" in row["completion"] for row in rows)
    assert all(len(row["image"]) == 1 + len(json.loads(row["zoom_crops"])) for row in rows)
    assert any(len(row["image"]) > 1 for row in rows)


def test_grpo_with_zoom_runs_multi_turn_rollouts_with_hf(zoom_prior_dir, tmp_path, run_env):
    check_zoom_rollouts(zoom_rollouts(zoom_prior_dir, tmp_path, run_env))


def test_a_zoom_turn_that_cannot_fit_stops_before_step_1(tiny_model_dir, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig

    from suzak.scoring.rewards import word_match
    from suzak.selftest import zoom_dataset  # noqa: F401
    from suzak.training.trainer import VLMGRPOTrainer

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    budget = PixelBudget(784, 50176).for_model(processor)

    def trainer(crops: PixelBudget, length: int):
        args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=length, report_to="none", use_cpu=True)  # fmt: skip
        return VLMGRPOTrainer(model=model, reward_funcs=[word_match], args=args, processing_class=processor,
                              train_dataset=zoom_dataset(4, 0), pixel_budget=budget,
                              **resolve_tools(["zoom"], crops).trainer_kwargs())  # fmt: skip

    with pytest.raises(SuzakError, match=r"a zoom's tool turn takes up to \d+ tokens \(a crop of up to 64 visual "
                                         r"tokens at tool_max_pixels 50176\) and max_completion_length 64"):  # fmt: skip
        trainer(budget.for_crops(50176), 64).run_pre_checks()
    with pytest.raises(SuzakError, match="must lie within the pixel budget"):
        trainer(PixelBudget(784, 100352, factor=28), 512).run_pre_checks()
    fits = trainer(budget.for_crops(12544), 512)  # 16-token crops
    fits.run_pre_checks()
    image = Image.new("RGB", (112, 112))  # a 16-token crop: the tool turn the pre-check sized
    assert fits.tool_turn_length([{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": image}]}]) \
        == fits.tool_turn_length([{"role": "tool", "name": "zoom", "content": [{"type": "image", "image":
            Image.new("RGB", (28, 28))}]}]) + 15  # fmt: skip


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_tool_turn_is_counted_alike_before_the_weights_load(family, family_model_dir, tmp_path):
    """suzak.trl_internals.tools.tool_turn_length (the pre-check before any weight loads) counts what the trainer's TRL
    ``_get_tool_suffix_ids`` counts, for Qwen2.5-VL's prefix-preserving tool template and for Qwen3-VL's, which TRL
    replaces by its training template."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig

    from suzak.media.vision import configure_processor
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.scoring.rewards import word_match
    from suzak.selftest import zoom_dataset
    from suzak.training.trainer import VLMGRPOTrainer
    from suzak.trl_internals.tools import tool_turn_length

    folder = family_model_dir(family)
    processor = AutoProcessor.from_pretrained(folder)
    budget = PixelBudget(784, 50176).for_model(processor)
    prepare_tool_calling(processor, family)
    configure_processor(processor, budget)
    turns = [[{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": Image.new("RGB", size)}]}]
             for size in [(64, 64), (112, 224), (224, 224)]]  # fmt: skip
    before = [tool_turn_length(processor, turn, chat_template_kwargs={"enable_thinking": False}) for turn in turns]
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      chat_template_kwargs={"enable_thinking": False}, report_to="none", use_cpu=True)  # fmt: skip
    trainer = VLMGRPOTrainer(model=AutoModelForImageTextToText.from_pretrained(folder), reward_funcs=[word_match],
                             args=args, processing_class=AutoProcessor.from_pretrained(folder),
                             train_dataset=zoom_dataset(4, 0), pixel_budget=budget,
                             **resolve_tools(["zoom"], budget.for_crops(12544)).trainer_kwargs())  # fmt: skip
    assert before == [trainer.tool_turn_length(turn) for turn in turns]
    assert before[0] < before[1] < before[2]  # the crop's visual tokens are in it
    # the trainer renders each distinct turn once (trl_internals.tools.tool_turn_key): another crop of a size seen, or the
    # same failed call's text, reuses it, and every answer is TRL's own
    from trl import GRPOTrainer

    noise = np.random.default_rng(0).integers(0, 255, (224, 112, 3), dtype=np.uint8)
    again = [{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": Image.fromarray(noise)}]}]
    error = [{"role": "tool", "name": "zoom", "content": "{'error': 'zoom: bbox_2d [1, 2] is not a box'}"}]
    for turn in [*turns, again, error, error]:
        assert trainer._get_tool_suffix_ids(turn) == GRPOTrainer._get_tool_suffix_ids(trainer, turn)
    assert len(trainer._tool_suffixes) == 4  # three crop sizes and one error text


def test_suzak_train_stops_on_a_zoom_turn_that_cannot_fit_before_the_weights_load(tmp_path, run_env):
    """A recipe whose max_completion_length cannot hold one zoom's tool turn stops with one line before any weight
    loads (issue 51: after the weights, and after vLLM, had loaded)."""
    import sys

    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/zoom_smoke.yaml",
                             "--max_completion_length", "12", "--output_dir", str(tmp_path / "out")], cwd=ROOT,
                            env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr and "loaded " not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: tools: a zoom's tool turn takes up to "), result.stderr
    assert "max_completion_length 12 holds the whole multi-turn completion" in errors[0]


def test_zoom_recipe_trains_through_suzak_train(tmp_path, run_env):
    """`python -m suzak.train` with recipes/zoom_smoke.yaml: the Qwen2.5-VL tool template is put in, the pre-check
    sizes the zoom's tool turn, each step logs the tool metrics, and the saved processor renders tools."""
    import csv
    import json
    import sys

    from conftest import run_ok

    out = tmp_path / "run"
    result = run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/zoom_smoke.yaml", "--max_steps", "1",
                     "--eval_rows", "0", "--output_dir", str(out), "--rewards", "word_match", "zoom_used",
                     "--reward_weights", "1.0", "0.1"], run_env)  # fmt: skip
    assert "using suzak's qwen2_vl_tools.jinja" in result.stderr
    assert "tools: zoom crops fitted to 784-3136 pixels (at most 4 visual tokens" in result.stderr
    with open(out / "metrics.csv", newline="") as file:
        (log,) = [row for row in csv.DictReader(file) if row.get("reward")]
    assert log["tools/call_frequency"] and log["tools/zoom_out_of_range"]
    with open(out / "completions.csv", newline="") as file:
        rollouts = list(csv.DictReader(file))
    crops = [json.loads(row["zoom_crops"]) for row in rollouts]  # each rollout's crops, original pixels
    assert len(crops) == 8 and all(isinstance(c, list) for c in crops)
    assert [float(row["reward/zoom_used"]) for row in rollouts] == [float(bool(c)) for c in crops]  # the shaping reward
    assert "<tool_call>" in (out / "chat_template.jinja").read_text()


def test_the_held_out_eval_during_training_answers_through_the_tool_loop(zoom_prior_dir, tmp_path, run_env):
    """A run with tools and eval_rows: the held-out rows are answered as the rollouts are, with the zoom (each
    question's box in the model's frame), and the step's line gets eval/tool_calls beside eval/accuracy."""
    import csv
    import sys

    from conftest import run_ok

    out = tmp_path / "run"
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/zoom_smoke.yaml", "--model_name_or_path",
            str(zoom_prior_dir), "--max_steps", "1", "--eval_rows", "4", "--eval_steps", "1", "--output_dir",
            str(out)], run_env)  # fmt: skip
    with open(out / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("eval/accuracy")]
    assert [int(row["step"]) for row in rows] == [0, 1]  # the untrained model's baseline, then step 1
    assert all(float(row["eval/tool_calls"]) >= 0.5 for row in rows), rows  # the prior's calls, in the eval too
    with open(out / "eval_samples.csv", newline="") as file:
        samples = list(csv.DictReader(file))
    assert len(samples) == 8 and all("{box}" not in row["prompt"] and "[" in row["prompt"] for row in samples)


@pytest.mark.parametrize(("side", "pixels"), [(224, 3136), (448, 12544), (896, 50176)])  # smoke recipe, self-test, 8x8
def test_zoom_checks_hide_the_colour_from_the_whole_view_and_show_it_in_a_crop(side, pixels):
    """The zoom task's premise: fitted whole to a quarter of its side every colour's square is the same grey (to
    within 2 of 255; up to 5 on the square's rim at 896), while a crop of the square at the same budget is the checks themselves (cells of 2 pixels at
    896: with 4, one cell to a pixel of the view, the view kept the checks at a std of 52)."""
    from suzak.data.zoom import zoom_checks

    budget = PixelBudget(pixels, pixels, factor=28)
    rows = {row["solution"]: row for row in zoom_checks(30, seed=0, slots=1, side=side)}
    assert set(rows) == {"red", "green", "blue"}
    views = [np.asarray(budget.fit(row["image"]), dtype=int) for row in rows.values()]
    inside = slice(
        side // 16 + 1, side // 8 - 1
    )  # the square's view (slot 1: the second cell of the 4x4 grid) less its rim
    assert max(np.abs(a - b)[inside, inside].max() for a in views for b in views) <= 2
    assert max(np.abs(a - b).max() for a in views for b in views) <= 5  # 896: 28 rim pixels where grey meets the checks
    crops = {name: np.asarray(budget.fit(row["image"].crop(tuple(row["question_boxes"][0]))), dtype=int)
             for name, row in rows.items()}  # fmt: skip
    cell = max(1, side // 448)
    assert crops["red"][0, 0].tolist() == [255, 0, 0] and crops["red"][0, cell].tolist() == [0, 255, 255]
    assert min(np.abs(crops[a] - crops[b]).max() for a in crops for b in crops if a != b) == 255
