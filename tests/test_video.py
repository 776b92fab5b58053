"""Video rows: the video budget, reading clips (files, frame lists, arrays), and GRPO steps through TRL on each
video-capable tiny family, with the video tokens of training equal to the budget's count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from trl import GRPOConfig, ModelConfig

from suzak import SuzakError
from suzak.data.motion import moving_ball
from suzak.media.video import Clip, VideoBudget, clip_key, processor_kwargs, read_clip, video_of, with_video
from suzak.media.vision import PixelBudget
from suzak.models.loading import load_model_and_processor
from suzak.scoring.parsing import completion_text
from suzak.training.trainer import VLMGRPOTrainer

VIDEO_FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
BUDGET = VideoBudget(fps=4.0, min_frames=4, max_frames=8, min_pixels=3136, max_pixels=12544)


def write_mp4(path, frames: list[Image.Image], fps: int = 8) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _frames(n: int, size=(64, 48)) -> list[Image.Image]:
    return [Image.new("RGB", size, (20 * i, 100, 255 - 20 * i)) for i in range(n)]


# --- the budget ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("total", "fps", "expected"), [(80, 8.0, 8), (12, 8.0, 6), (5, 8.0, 4), (3, 8.0, 2)])
def test_frame_count_follows_qwen_vl_utils(total, fps, expected):
    budget = BUDGET.for_model(_config("qwen2_5_vl"))
    assert budget.frame_count(total, fps) == expected
    indices = budget.frame_indices(total, fps)
    assert len(indices) == expected and indices[0] == 0 and indices[-1] == total - 1


def test_total_pixels_lowers_the_frame_size_as_qwen_vl_utils_does():
    budget = VideoBudget(max_frames=8, max_pixels=50176, total_pixels=100352, factor=28)
    low, high = budget.frame_bounds(8)
    assert (low, high) == (3136, 25088)  # 100352 / 8 frames x 2
    h, w = budget.size(8, 480, 640)
    assert h * w <= high and h % 28 == 0 and w % 28 == 0


def test_a_budget_takes_the_model_factor_and_refuses_bad_bounds():
    assert VideoBudget().for_model(_config("qwen3_vl")).factor == 32
    assert VideoBudget().for_model(_config("qwen2_vl")).factor == 28
    with pytest.raises(ValueError, match="min_frames"):
        VideoBudget(min_frames=1)
    with pytest.raises(ValueError, match="total_pixels"):
        VideoBudget(max_frames=16, total_pixels=1000)


def _config(model_type):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type)


# --- reading clips -------------------------------------------------------------------------------------------------


def test_a_file_a_frame_list_and_frame_files_read_to_the_same_clip(tmp_path):
    budget = BUDGET.for_model(_config("qwen2_5_vl"))
    frames = _frames(16)
    write_mp4(tmp_path / "clip.mp4", frames, fps=8)
    paths = []
    for i, frame in enumerate(frames):
        frame.save(tmp_path / f"f{i:02d}.png")
        paths.append(str(tmp_path / f"f{i:02d}.png"))
    from_file = read_clip(str(tmp_path / "clip.mp4"), budget)
    from_list = read_clip(frames, budget, fps=8.0)
    from_paths = read_clip(paths, budget, fps=8.0)
    from_array = read_clip(np.stack([np.asarray(f) for f in frames]), budget, fps=8.0)
    expected = tuple(budget.frame_indices(16, 8.0))  # 2 s at the budget's 4 fps: 8 frames
    assert from_file.indices == from_list.indices == from_paths.indices == from_array.indices == expected
    assert len(expected) == 8 and expected[0] == 0 and expected[-1] == 15
    assert from_file.frames.shape == from_list.frames.shape == (8, *budget.size(8, 48, 64), 3)
    assert np.array_equal(from_list.frames, from_paths.frames) and np.array_equal(from_list.frames, from_array.frames)
    assert np.abs(from_file.frames.astype(int) - from_list.frames.astype(int)).mean() < 12  # lossy mpeg4
    assert from_file.fps == 8.0 and from_file.total_frames == 16 and from_file.sampled_fps == 4.0


@pytest.mark.parametrize("fps", [2.67, 1.78, 3.0, 29.97])
def test_a_clips_frame_pairs_last_seconds_that_bfloat16_holds_exactly(family_model_dir, fps):
    """The processor's ``second_per_grid_ts`` for a clip is the same number in float32 (the policy) and bfloat16
    (vLLM's copy on a GPU), within 0.4% of the true 2 / fps, so both floor Qwen2.5-VL's time positions alike."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(family_model_dir("qwen2_5_vl"))
    budget = VideoBudget(fps=fps, min_frames=8, max_frames=8, max_pixels=3136).for_model(processor)
    clip = read_clip(_frames(8), budget, fps=fps)
    out = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt", **processor_kwargs([clip]))
    seconds = out["second_per_grid_ts"]
    assert seconds.dtype == torch.float32 and torch.equal(seconds.to(torch.bfloat16).float(), seconds)
    assert seconds.item() == pytest.approx(2 / fps, rel=4e-3) and clip.sampled_fps == pytest.approx(fps, rel=4e-3)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.mp4", r"video .*missing.mp4 does not exist$"),
        (lambda d: (d / "bad.mp4").write_bytes(b"not a video") and d / "bad.mp4", r"video .*bad.mp4 cannot be decoded"),
        (lambda d: [str(d / "gone.png")] * 4, r"video frame .*gone.png does not exist$"),
        (lambda d: [], r"a video has no frames$"),
        (lambda d: (d / "empty.mp4").write_bytes(b"") or d / "empty.mp4", r"video .*empty.mp4 cannot be decoded"),
        (lambda d: _frames(1), r"a video of list: a video needs at least 2 frames, this one has 1$"),
        (lambda d: np.zeros((4, 8, 8)), r"must be an array of shape \(frames, height, width, 3\)"),
        (lambda d: 3, r"a video must be a file path, a list of frames"),
    ],
)
def test_an_unreadable_or_empty_video_is_one_line(tmp_path, make, message):
    with pytest.raises(SuzakError, match=message) as error:
        read_clip(make(tmp_path), BUDGET.for_model(_config("qwen2_5_vl")))
    assert "\n" not in str(error.value)


def test_clip_keys_and_placing_a_clip_in_a_row():
    assert clip_key(_frames(3)) == clip_key(_frames(3)) != clip_key(_frames(4))
    row = {"prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]}], "video": "a"}
    placed = with_video(row, "clip")
    assert placed["prompt"][0]["content"][0] == {"type": "video", "video": "clip"}
    assert row["prompt"][0]["content"][0] == {"type": "video"}  # the dataset's row is left as it was
    assert video_of(placed) == "clip" and video_of(row) == "a"  # the read clip once placed, the column before


def test_moving_ball_controls():
    aligned, still = moving_ball(6, seed=1), moving_ball(6, seed=1, videos="still")
    assert [r["solution"] for r in aligned] == [r["solution"] for r in still]
    first, last = (np.asarray(aligned[0]["video"][i]) for i in (0, -1))
    assert not np.array_equal(first, last)
    with pytest.raises(ValueError, match="aligned, shuffled or still"):
        moving_ball(2, videos="grey")


# --- processor and training ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_the_processor_counts_the_budgets_video_tokens(family_model_dir, family):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(family_model_dir(family))
    budget = BUDGET.for_model(processor)
    clip = read_clip(_frames(12, size=(100, 70)), budget, fps=6.0)
    out = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt", **processor_kwargs([clip]))
    video_token = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert (out["input_ids"] == video_token).sum().item() == budget.tokens(len(clip.indices), 70, 100)


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion_text(c))) for c in completions]


class VideoCheck:
    """A reward that checks each row arrives with its own clip, and records the video tokens TRL fed the model."""

    __name__ = "video_check"

    def __init__(self):
        self.rows = 0

    def __call__(self, prompts, completions, solution, **kwargs):
        for prompt in prompts:
            clip = video_of({"prompt": prompt})
            assert isinstance(clip, Clip)
            self.rows += 1
        return [0.0] * len(completions)


class VideoTokens(VLMGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        token = self.processing_class.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        counts = (out["prompt_ids"] == token).sum(dim=1).tolist()
        expected = [self.video_budget.tokens(len(video_of(r)) if isinstance(video_of(r), list) else 0, 56, 56)
                    for r in inputs]  # fmt: skip
        self.token_checks = [*getattr(self, "token_checks", []), (counts, expected)]
        return out


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_a_video_grpo_step_trains_through_the_frames(family_model_dir, tmp_path, family):
    model_dir = family_model_dir(family)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=2, learning_rate=1e-2, bf16=False, use_cpu=True,
                      report_to="none", logging_steps=1, save_strategy="no", seed=0, beta=0.0)  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(model_dir)), args)
    check = VideoCheck()
    trainer = VideoTokens(model=model, reward_funcs=[length_reward, check], args=args,
                          train_dataset=moving_ball(8, seed=0), processing_class=processor,
                          pixel_budget=PixelBudget(3136, 50176), video_budget=BUDGET)  # fmt: skip
    visual = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "visual" in n}
    trainer.train()
    assert check.rows == 8  # 2 steps of 4 completions
    for counts, expected in trainer.token_checks:
        assert counts == expected and all(c > 0 for c in counts)
    moved = [n for n, p in trainer.model.named_parameters() if "visual" in n and not torch.equal(visual[n], p)]
    assert moved, "no vision-tower weight moved: the frames never reached the loss"


def mixed_media(rows: int = 8):
    """A dataset whose rows alternate between a colour square (an ``image``) and a moving ball clip (a ``video``)."""
    import datasets

    from suzak.data.colors import color_squares

    images, clips = color_squares(rows // 2, seed=0).to_list(), moving_ball(rows // 2, seed=0).to_list()
    mixed = [row for pair in zip(images, clips, strict=True) for row in pair]
    columns = set().union(*mixed)
    features = datasets.Features({**moving_ball(1).features, "image": datasets.Image()})
    return datasets.Dataset.from_list([{c: row.get(c) for c in columns} for row in mixed], features=features)


class MixedLogps(VLMGRPOTrainer):
    """Records, for every generation batch, TRL's log-probabilities of the completions (computed in chunks of
    ``per_device_train_batch_size`` rows) beside the same rows' log-probabilities computed one row at a time."""

    def _generate_and_score_completions(self, inputs):
        from suzak.trl_internals.video import VIDEO_FIELDS

        out = super()._generate_and_score_completions(inputs)
        token = self.processing_class.tokenizer.convert_tokens_to_ids
        kinds = ["video" if isinstance(video_of(r), (list, str)) else "image" for r in inputs]
        grids = out.get("image_grid_thw")
        patches = [0, *grids.prod(-1).cumsum(0).tolist()] if grids is not None else [0]
        for row in range(out["completion_ids"].size(0)):
            prompt, completion = out["prompt_ids"][row], out["completion_ids"][row]
            keep = out["prompt_mask"][row].bool()  # the row alone: no padding, marks from its own ids
            ids = torch.cat([prompt[keep], completion])[None]
            types = torch.zeros_like(ids)
            types[:, : int(keep.sum())][ids[:, : int(keep.sum())] == token("<|image_pad|>")] = 1
            types[:, : int(keep.sum())][ids[:, : int(keep.sum())] == token("<|video_pad|>")] = 2
            media = dict((out.get(VIDEO_FIELDS) or [None] * len(inputs))[row] or {})
            if kinds[row] == "image":
                image = sum(out["num_images"][:row])
                media = {"pixel_values": out["pixel_values"][patches[image] : patches[image + 1]],
                         "image_grid_thw": grids[image : image + 1]}  # fmt: skip
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types,
                                    logits_to_keep=completion.size(0) + 1, **media).logits[0, :-1]  # fmt: skip
            alone = logits.float().log_softmax(-1).gather(-1, completion[:, None])[:, 0]
            mask = out["completion_mask"][row].bool()
            self.checks = [
                *getattr(self, "checks", []),
                (kinds[row], out["old_per_token_logps"][row][mask], alone[mask]),
            ]
        return out


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
@pytest.mark.parametrize(("prompts", "iterations"), [(4, 1), (1, 2)])
def test_a_dataset_mixing_image_rows_and_video_rows_trains_each_row_on_its_own_media(family_model_dir, tmp_path,
                                                                                     family, prompts, iterations):  # fmt: skip
    """Image rows and video rows in one dataset, in batches of 4 prompts (mixed) or of 1 (a video batch whose
    ``image`` column is None throughout): TRL hands the processor None for a row without images and the model empty
    image tensors for a chunk without any. Each row's log-probabilities, computed by TRL in chunks of 2 rows
    (image-only, video-only or mixed), equal that row's computed alone with its own image or clip."""
    model_dir = family_model_dir(family)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      steps_per_generation=prompts, num_iterations=iterations, max_completion_length=6, max_steps=8,
                      learning_rate=1e-2, bf16=False, use_cpu=True, report_to="none", logging_steps=1,
                      save_strategy="no", seed=0, beta=0.0, temperature=1.0)  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(model_dir)), args)
    trainer = MixedLogps(model=model, reward_funcs=[length_reward], args=args, train_dataset=mixed_media(8),
                         processing_class=processor, pixel_budget=PixelBudget(3136, 50176), video_budget=BUDGET)  # fmt: skip
    visual = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "visual" in n}
    trainer.train()
    assert {kind for kind, _, _ in trainer.checks} == {"image", "video"}
    for kind, batched, alone in trainer.checks:
        torch.testing.assert_close(batched, alone, atol=1e-4, rtol=1e-4, msg=lambda m, kind=kind: f"{kind} row: {m}")
    assert any(not torch.equal(visual[n], p) for n, p in trainer.model.named_parameters() if "visual" in n)


def test_dynamic_sampling_refills_a_dataset_mixing_image_rows_and_video_rows(tiny_model_dir, tmp_path):
    """Dynamic sampling on image and video rows (issue 51's reproduction: a refill round without a video row
    stopped step 1 with "generation rounds returned different fields"): rounds with and without clips merge, each
    kept row trains on its own media, three steps."""
    from suzak.trl_internals.rounds import DynamicSampling
    from suzak.trl_internals.video import VIDEO_FIELDS

    def video_signal(completions, solution, **kwargs) -> list[float]:  # a signal on the video rows only
        return [float(len(completion_text(c))) if s in ("left", "right") else 1.0
                for c, s in zip(completions, solution, strict=True)]  # fmt: skip

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=3, learning_rate=1e-3, bf16=False, use_cpu=True,
                      report_to="none", logging_steps=1, save_strategy="no", seed=0, beta=0.0)  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(tiny_model_dir)), args)
    trainer = VLMGRPOTrainer(model=model, reward_funcs=[video_signal], args=args, train_dataset=mixed_media(8),
                             processing_class=processor, pixel_budget=PixelBudget(3136, 50176), video_budget=BUDGET)  # fmt: skip
    trainer.dynamic_sampling = DynamicSampling(max_rounds=3)
    rounds, one_round = [], trainer._generate_and_score_round

    def spy(inputs):
        output = one_round(inputs)
        rounds.append(VIDEO_FIELDS in output)
        return output

    trainer._generate_and_score_round = spy
    trainer.train()
    assert True in rounds and False in rounds  # rounds with and without a clip were merged
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3 and sum(entry["dynamic_sampling/kept_groups"] for entry in logs) > 0


def test_tools_with_video_rows_stop_before_step_1_in_one_line(tiny_model_dir, tmp_path):
    """A zoom tool on a dataset with clips crashed at the first tool turn (issue 51: TRL indexes the video tensors
    by batch row, vLLM's requests by calling row); refused before step 1 until the two can share a batch."""
    from suzak.media.vision import configure_processor
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.models.tools import resolve_tools

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=128, max_steps=1, bf16=False, use_cpu=True, report_to="none",
                      save_strategy="no", max_tool_calling_iterations=1)  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(tiny_model_dir)), args)
    budget = PixelBudget(3136, 50176).for_model(processor)
    prepare_tool_calling(processor, model.config.model_type)
    configure_processor(processor, budget)
    trainer = VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=mixed_media(8),
                             processing_class=processor, pixel_budget=budget, video_budget=BUDGET,
                             **resolve_tools(["zoom"], budget).trainer_kwargs())  # fmt: skip
    with pytest.raises(SuzakError, match=r"^tools with video rows \(4 of 8, first: row 1\)"):
        trainer.train()


def test_a_row_with_images_and_a_video_is_one_line(tiny_model_dir, tmp_path):
    from datasets import Dataset

    rows = moving_ball(4, seed=0).to_list()
    for row in rows:
        row["image"] = Image.new("RGB", (56, 56))
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, max_steps=1, bf16=False, use_cpu=True, report_to="none",
                      save_strategy="no")  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(tiny_model_dir)), args)
    trainer = VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=processor, video_budget=BUDGET)  # fmt: skip
    with pytest.raises(SuzakError, match=r"index \d+ holds images and a video"):
        trainer.train()


# --- before step 1, and evaluation ---------------------------------------------------------------------------------


def test_a_bad_video_budget_flag_is_one_line():
    from suzak.training.configs import SuzakArguments

    with pytest.raises(SuzakError, match=r"^video budget: need 2 <= video min_frames <= max_frames, got 1 and 16"):
        SuzakArguments(video_min_frames=1)
    assert SuzakArguments(video_fps=1.0, video_max_frames=8).video_budget() == VideoBudget(fps=1.0, max_frames=8)


def test_validation_names_a_missing_or_broken_video_before_step_1(tmp_path):
    from datasets import Dataset

    from suzak.training.checks import validate_rows

    write_mp4(tmp_path / "good.mp4", _frames(6))
    (tmp_path / "broken.mp4").write_bytes(b"\x00" * 64)
    rows = [{"video": str(tmp_path / name), "solution": "left"} for name in ("good.mp4", "gone.mp4", "broken.mp4")]
    problems = validate_rows(Dataset.from_list(rows), PixelBudget(factor=28))
    assert [(p.index, p.column) for p in problems] == [(1, "video"), (2, "video")]
    assert problems[0].reason.endswith("gone.mp4 does not exist") and "cannot be decoded" in problems[1].reason
    frames = validate_rows(moving_ball(3, seed=0), PixelBudget(factor=28))
    assert frames == []


def test_validation_of_a_dataset_mixing_image_rows_and_video_rows(tmp_path):
    """Each row is checked for its own media: an image row needs no video, a video row no image; a row holding both,
    or neither, is named before step 1."""
    import datasets

    from suzak.training.checks import validate_rows

    write_mp4(tmp_path / "good.mp4", _frames(6))
    Image.new("RGB", (32, 32)).save(tmp_path / "red.png")
    red, good = str(tmp_path / "red.png"), str(tmp_path / "good.mp4")
    rows = [(red, None), (None, good), (red, good), (None, None), (None, str(tmp_path / "gone.mp4"))]
    features = datasets.Features({"image": datasets.Image(), "video": datasets.Value("string"),
                                  "solution": datasets.Value("string")})  # fmt: skip
    dataset = datasets.Dataset.from_list(
        [{"image": i, "video": v, "solution": "x"} for i, v in rows], features=features
    )
    problems = validate_rows(dataset, PixelBudget(factor=28))
    assert [(p.index, p.column) for p in problems] == [(2, "video"), (3, "image"), (4, "video")]
    assert [p.reason for p in problems][:2] == ["the row holds images and a video: suzak trains on rows with one or "
                                                "the other", "no image"]  # fmt: skip
    assert problems[2].reason.endswith("gone.mp4 does not exist")


def test_precheck_counts_video_tokens_and_stops_a_video_prompt_past_the_context(tiny_processor):
    from suzak.training.checks import precheck

    dataset = moving_ball(4, seed=0)
    budget = BUDGET.for_model(tiny_processor)
    report = precheck(dataset, tiny_processor, PixelBudget(factor=28), video_budget=BUDGET, context_length=4096)
    assert report["video_tokens"]["max"] == budget.tokens(8, 56, 56) == 16  # 4 grids of 2x2
    with pytest.raises(SuzakError, match=r"^row 0: its prompt is \d+ tokens \(16 of them video\).*video_max_frames"):
        precheck(dataset, tiny_processor, PixelBudget(factor=28), video_budget=BUDGET, context_length=60)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_eval_engine_reads_videos_as_training_does(family_model_dir, family):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.eval.engine import HFEngine

    model_dir = family_model_dir(family)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    engine = HFEngine(model, processor, PixelBudget(3136, 50176), batch_size=3, max_new_tokens=3, progress=False)
    engine.use_video_budget(BUDGET)
    rows = list(moving_ball(5, seed=2, size=50))
    encoded = engine.encode(rows)
    token = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    budget = BUDGET.for_model(processor)
    assert (encoded["input_ids"] == token).sum(dim=1).tolist() == [budget.tokens(8, 50, 50)] * 5
    outputs = engine.generate(rows, temperature=1.0, seed=0)
    assert len(outputs) == 5 and all(isinstance(o, str) for o in outputs)


def test_video_r1_reads_a_local_copy_and_counts_missing_videos(tmp_path, caplog):
    import json

    from suzak.data.builders import build_dataset

    (tmp_path / "CLEVRER").mkdir()
    write_mp4(tmp_path / "CLEVRER" / "a.mp4", _frames(6))
    entries = [
        {"problem_id": 1, "problem": "What moves first?", "data_type": "video", "problem_type": "multiple choice",
         "options": ["A. the cube", "B. the ball"], "solution": "<answer>B</answer>", "path": "./CLEVRER/a.mp4",
         "data_source": "CLEVRER"},
        {"problem_id": 2, "problem": "How many?", "data_type": "video", "problem_type": "numerical", "options": [],
         "solution": "<answer>3</answer>", "path": "./CLEVRER/a.mp4", "data_source": "CLEVRER"},
        {"problem_id": 3, "problem": "Which?", "data_type": "video", "problem_type": "multiple choice",
         "options": ["A. x", "B. y"], "solution": "<answer>A</answer>", "path": "./STAR/gone.mp4", "data_source": "STAR"},
        {"problem_id": 4, "problem": "An image", "data_type": "image", "problem_type": "multiple choice",
         "options": ["A. x"], "solution": "<answer>A</answer>", "path": "./General/i.png", "data_source": "General"},
    ]  # fmt: skip
    (tmp_path / "Video-R1-260k.json").write_text(json.dumps(entries))
    with caplog.at_level("WARNING"):
        dataset = build_dataset("video_r1", data_root=str(tmp_path))
    assert len(dataset) == 1 and dataset[0]["solution"] == "B" and dataset[0]["line"] == 0
    assert dataset[0]["video"] == str((tmp_path / "CLEVRER" / "a.mp4").resolve())
    assert "Options:\nA. the cube\nB. the ball" in dataset[0]["prompt"][0]["content"][1]["text"]
    assert "1 video rows left out" in caplog.text
    numerical = build_dataset("video_r1", data_root=str(tmp_path), problem_types=["numerical"])
    assert numerical["solution"] == ["3"]
    with pytest.raises(SuzakError, match=r"^video_r1: no video rows of \['free-form'\]"):
        build_dataset("video_r1", data_root=str(tmp_path), problem_types=["free-form"])
    with pytest.raises(SuzakError, match=r"Video-R1-260k.json does not exist"):
        build_dataset("video_r1", data_root=str(tmp_path / "nowhere"))
    (tmp_path / "General").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "General" / "i.png")
    both = build_dataset("video_r1", data_root=str(tmp_path), data_types=["image", "video"])  # Video-R1's own mix
    assert both["line"] == [0, 3] and both[0]["image"] is None and both[1]["video"] is None
    assert both[1]["image"].size == (32, 32) and both[1]["prompt"][0]["content"][0]["type"] == "image"
    with pytest.raises(SuzakError, match=r"^video_r1: data_types are image and/or video, got \['audio'\]$"):
        build_dataset("video_r1", data_root=str(tmp_path), data_types=["audio"])


def test_video_r1_from_the_hub_fails_offline_in_one_line(monkeypatch):
    import suzak.data.hub

    monkeypatch.setattr(suzak.data.hub, "hub_reachable", lambda timeout=3.0: False)
    from suzak.data.builders import build_dataset

    with pytest.raises(SuzakError, match=r"^cannot load Hub dataset 'Video-R1/Video-R1-data'.*unreachable.*data_root"):
        build_dataset("Video-R1/Video-R1-data")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_video_smoke_recipe_trains_and_evaluates_held_out_clips(family, tmp_path, run_env):
    import csv
    import subprocess
    import sys

    from conftest import ROOT

    model = "tiny" if family == "qwen2_5_vl" else f"tiny:{family}"
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/video_smoke.yaml",
                             "--model_name_or_path", model, "--output_dir", str(tmp_path / "out")], cwd=ROOT,
                            env=run_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "have a video: video tokens/prompt min 16 mean 16.0 max 16" in result.stderr
    with open(tmp_path / "out" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows if r["eval/accuracy"]] == [0, 2, 4]  # held-out clips through the eval engine
    assert sum(1 for r in rows if r["loss"]) == 4


def write_mixed_jsonl(folder: Path, rows: int = 4) -> Path:
    """``mixed.jsonl`` in ``folder``: colour-square image lines and moving-ball video lines (mp4 files), alternating."""
    import json

    from suzak.data.colors import color_squares

    (folder / "media").mkdir()
    squares, balls, lines = color_squares(rows, seed=0), moving_ball(rows, seed=0), []
    for i in range(rows):
        squares[i]["image"].save(folder / "media" / f"square{i}.png")
        write_mp4(folder / "media" / f"ball{i}.mp4", balls[i]["video"], fps=4)
        lines += [{"image": f"media/square{i}.png", "problem": "Red or blue?", "solution": squares[i]["solution"]},
                  {"video": f"media/ball{i}.mp4", "problem": "Left or right?", "solution": balls[i]["solution"]}]  # fmt: skip
    (folder / "mixed.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder / "mixed.jsonl"


def test_a_jsonl_file_of_image_lines_and_video_lines(tmp_path):
    """``video`` lines (a file, or frame files with their ``video_fps``) beside image lines, paths relative to the
    file; a line with both, a file mixing video files and frame lists, a bad rate and a missing video are one line."""
    import json

    from suzak.data.builders import build_dataset
    from suzak.training.checks import validate_rows

    dataset = build_dataset(str(write_mixed_jsonl(tmp_path)))
    assert [r["line"] for r in dataset if r["video"] is not None] == [2, 4, 6, 8]
    assert dataset[1]["video"] == str(tmp_path / "media" / "ball0.mp4") and dataset[1]["image"] is None
    assert [p["type"] for p in dataset[0]["prompt"][0]["content"]] == ["image", "text"]
    assert [p["type"] for p in dataset[1]["prompt"][0]["content"]] == ["video", "text"]
    assert validate_rows(dataset, PixelBudget(factor=28)) == []

    for i, frame in enumerate(_frames(4)):
        frame.save(tmp_path / f"f{i}.png")
    frames = [f"f{i}.png" for i in range(4)]
    lines = tmp_path / "frames.jsonl"
    lines.write_text(json.dumps({"video": frames, "video_fps": 2, "question": "?", "answer": "left"}) + "\n")
    clip = build_dataset(str(lines))[0]
    assert len(clip["video"]) == 4 and clip["video_fps"] == 2.0 and clip["solution"] == "left"

    def error(*lines_: dict) -> str:
        lines.write_text("".join(json.dumps(line) + "\n" for line in lines_))
        with pytest.raises(SuzakError) as raised:
            build_dataset(str(lines))
        assert "\n" not in str(raised.value)
        return str(raised.value)

    ball = {"video": "media/ball0.mp4", "problem": "?", "solution": "left"}
    assert error({**ball, "image": "f0.png"}).endswith(
        "frames.jsonl:1: an image and a video: a line holds one or the other"
    )
    assert error({**ball, "video": frames}, ball).endswith(
        "frames.jsonl:2: a video file, where line 1 has a list of frames: one file holds video files or frame lists, "
        "not both")  # fmt: skip
    assert error({**ball, "video_fps": "fast"}).endswith(
        "frames.jsonl:1: video_fps must be a positive number, got 'fast'"
    )
    assert error({**ball, "video": 7}).endswith(
        "frames.jsonl:1: video must be a file path or a list of frame paths, got 7"
    )
    assert "1 image or video file(s) missing, first " in error({**ball, "video": "gone.mp4"})


def test_suzak_train_on_a_jsonl_file_mixing_image_and_video_questions(tmp_path, run_env):
    """The user's path: a local JSONL of image and video questions, trained by ``suzak.train`` with the video
    recipe; its held-out rows (images and clips) evaluate through the same engine."""
    import csv
    import subprocess
    import sys

    from conftest import ROOT

    data = write_mixed_jsonl(tmp_path, rows=8)
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/video_smoke.yaml",
                             "--dataset_name", str(data), "--dataset_options", "{}", "--eval_rows", "4",
                             "--output_dir", str(tmp_path / "out")], cwd=ROOT, env=run_env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "pre-check: 6 of 12 rows have a video: video tokens/prompt min 16 mean 16.0 max 16" in result.stderr
    with open(tmp_path / "out" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows if r["eval/accuracy"]] == [0, 2, 4]
    assert sum(1 for r in rows if r["loss"]) == 4


class _WordEngine:
    """Answers 'red' for a row with an image and 'left' for one with a video (the rows ``suzak.eval`` hands its
    engine), so each item's verdict is known."""

    batch_size = 4

    def generate(self, rows, temperature=0.0, seed=None, on_batch=None):
        outputs = ["left" if video_of(row) is not None else "red" if "image" in row else "?" for row in rows]
        on_batch(list(range(len(rows))), outputs)
        return outputs


def test_suzak_eval_jsonl_scores_a_users_image_and_video_questions(tiny_model_dir, tmp_path, capsys):
    """``python -m suzak.eval jsonl``: a file in training's JSONL format (image and video lines read by training's
    own line reader), scored by the training reward the user names; each item's verdict is that reward's; the
    real engine answers a batch mixing images and clips; every misuse is one line before any model loads."""
    import json

    from suzak.eval import cli
    from suzak.eval.runner import EvalConfig, evaluate

    data = write_mixed_jsonl(tmp_path, rows=3)
    flags = {"video_fps": 4.0, "video_max_frames": 8, "video_max_pixels": 4096}
    config = EvalConfig(task="jsonl", model_path=str(tiny_model_dir), prompt_path=str(data), reward="word_match",
                        prompt_template="plain", output_path=str(tmp_path / "w.json"), progress=False, **flags)  # fmt: skip
    report = evaluate(config, engine=_WordEngine())
    results = json.loads((tmp_path / "w.json").read_text())["results"]
    golds = [json.loads(line)["solution"] for line in data.read_text().splitlines()]
    assert [r["ground_truth"] for r in results] == golds and [r["question"]["problem"] for r in results[:2]] == [
        "Red or blue?", "Left or right?"]  # fmt: skip
    assert [r["is_correct"] for r in results] == [
        r["model_output"] == gold for r, gold in zip(results, golds, strict=True)
    ]
    assert report.greedy.correct == sum(gold in ("red", "left") for gold in golds) > 0

    out = tmp_path / "hf.json"
    cli.main(["jsonl", "--model_path", str(tiny_model_dir), "--prompt_path", str(data), "--reward", "word_match",
              "--prompt_template", "plain", "--max_new_tokens", "4", "--video_fps", "4", "--video_max_frames", "8",
              "--video_max_pixels", "4096", "--output_path", str(out), "--no_progress"])  # fmt: skip
    assert len(json.loads(out.read_text())["results"]) == 6
    summary = (tmp_path / "hf.md").read_text()
    assert "reward=word_match" in summary and "video=fps 4, 4-8 frames" in summary

    def error(task: str, *args: str) -> str:
        with pytest.raises(SystemExit) as raised:
            cli.main([task, "--model_path", "no-such-model", *args])
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert error("jsonl", "--prompt_path", str(data)).startswith("error: jsonl: --reward names the training reward")
    assert error("jsonl", "--prompt_path", str(data), "--reward", "f1") == (
        "error: --reward 'f1': no eval scorer agrees with it; one of: clevr_count, math_accuracy, gsm8k_accuracy, "
        "word_match")  # fmt: skip
    assert error("clevr_synthetic", "--reward", "clevr_count") == (
        "error: --reward is for the jsonl task; clevr_synthetic is scored by its own rules"
    )
    assert error("jsonl", "--prompt_path", str(data), "--reward", "word_match", "--scoring", "r1v").startswith(
        "error: jsonl has no 'r1v' scoring rule (R1-V's rules belong to its own test sets)"
    )
    assert error("jsonl", "--reward", "word_match").startswith("error: jsonl: pass --prompt_path FILE.jsonl")
    (tmp_path / "media" / "ball1.mp4").unlink()
    assert error("jsonl", "--prompt_path", str(data), "--reward", "word_match") == (
        f"error: {data}:4: video {tmp_path / 'media' / 'ball1.mp4'} does not exist (1 of 6 items bad; --skip_missing "
        "evaluates the others and counts the skipped)")  # fmt: skip
    skipped = evaluate(EvalConfig(task="jsonl", model_path=str(tiny_model_dir), prompt_path=str(data),
                                  reward="word_match", skip_missing=True, output_path=str(tmp_path / "s.json"),
                                  progress=False, **flags), engine=_WordEngine())  # fmt: skip
    assert (skipped.greedy.total, skipped.skipped_missing) == (5, 1)


def _video_trainer(model_dir, tmp_path, **config):
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=4, max_steps=1, bf16=False, use_cpu=True, report_to="none",
                      save_strategy="no", **config)  # fmt: skip
    model, processor = load_model_and_processor(ModelConfig(model_name_or_path=str(model_dir)), args)
    return VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, train_dataset=moving_ball(4),
                          processing_class=processor, video_budget=BUDGET)  # fmt: skip


@pytest.mark.parametrize(("mode", "tensor_parallel", "message"), [
    ("server", 1, r"^use_vllm with video rows runs in vllm_mode colocate: .*set vllm_mode: colocate"),
    ("colocate", 2, r"^use_vllm with video rows runs with vllm_tensor_parallel_size 1 .*got 2$"),
])  # fmt: skip
def test_video_rows_with_vllm_outside_colocate_are_one_line(tiny_model_dir, tmp_path, mode, tensor_parallel, message):
    """Colocated vLLM gets each row's clip (tests/test_vllm_tier.py trains so); TRL's server mode sends the server
    image features only, and a tensor-parallel group would pool other ranks' rows: both stop before step 1."""
    trainer = _video_trainer(tiny_model_dir, tmp_path, vllm_mode=mode, vllm_tensor_parallel_size=tensor_parallel)
    trainer.use_vllm = True  # as GRPOConfig(use_vllm=True) sets it, without building an engine here
    with pytest.raises(SuzakError, match=message):
        trainer.run_pre_checks()


class FakeLLM:
    def __init__(self):
        self.received = []

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.received.append(prompts)
        return ["out"] * len(prompts)


def test_colocated_requests_get_their_rows_videos_in_order():
    from suzak.trl_internals.video import vllm_requests_with_videos

    llm = FakeLLM()
    frames = np.zeros((4, 28, 28, 3), np.uint8)
    videos = [(frames, {"video_metadata": [{"fps": 4.0}]}), None]
    prompts = [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3], "multi_modal_data": {"image": "picture"}}]
    with vllm_requests_with_videos(llm, videos):
        assert llm.generate(prompts, sampling_params="p", use_tqdm=False) == ["out", "out"]
        with pytest.raises(SuzakError, match="vLLM was handed 1 prompts for 2 rows"):
            llm.generate(prompts[:1])
    first, second = llm.received[0]
    assert first["multi_modal_data"]["video"] is frames and first["mm_processor_kwargs"] == videos[0][1]
    assert first["prompt_token_ids"] == [1, 2] and second == prompts[1]  # a row without a video is left as it was
    assert "generate" not in vars(llm)  # the class's method again after the block


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_the_vllm_eval_engine_sends_a_clip_with_its_placeholder(family_model_dir, family):
    """The video request: the HF engine's prompt ids with the video back to vLLM's placeholder (what vLLM makes of
    it is checked against vLLM itself in tests/test_vllm_boundary.py), the clip's frames and how to read them."""
    from transformers import AutoProcessor

    from suzak.eval.engine import HFEngine, VLLMEngine

    processor = AutoProcessor.from_pretrained(family_model_dir(family))
    engine = VLLMEngine("some/model", processor, PixelBudget(3136, 50176), vllm_module=object(), progress=False)
    engine.use_video_budget(BUDGET)
    row = moving_ball(1, seed=3)[0]
    request = engine.request(row)
    clip = engine.clip(row)
    tokens = processor.tokenizer.convert_tokens_to_ids
    start, end, pad = tokens("<|vision_start|>"), tokens("<|vision_end|>"), tokens("<|video_pad|>")
    ids = request["prompt_token_ids"]
    hf = HFEngine(None, processor, PixelBudget(3136, 50176), progress=False)
    hf.use_video_budget(BUDGET)
    expanded = hf.encode([row])["input_ids"][0].tolist()
    assert ids.count(pad) == 1 and expanded.count(pad) == BUDGET.for_model(processor).tokens(8, 56, 56)
    video, kwargs = request["multi_modal_data"]["video"], request["mm_processor_kwargs"]
    assert {k: kwargs[k] for k in ("do_sample_frames", "do_resize")} == {"do_sample_frames": False, "do_resize": False}
    if family == "qwen3_vl":  # timestamps from the metadata beside the frames; the template's wrapper kept
        frames, metadata = video
        assert metadata["frames_indices"] == list(clip.indices) and metadata["do_sample_frames"] is False
        assert [start, start, pad, end, end] == ids[ids.index(start) : ids.index(start) + 5]
    else:  # the prompt as the template wrote it; the clip's times through the processor's video_metadata
        frames = video
        assert kwargs["video_metadata"] == [clip.metadata()]
        assert ids == processor.tokenizer(engine.prompt_text(row), add_special_tokens=False)["input_ids"]
    assert frames is clip.frames


def test_suzak_eval_moving_ball_reads_held_out_clips_to_the_video_flags(tiny_model_dir, tmp_path):
    """``python -m suzak.eval moving_ball``: held-out clips (not the training seed's), read to the --video_* budget
    the run was trained with, scored with word_match's parser; the budget is in the settings a resume compares."""
    import json

    from suzak.eval.runner import EvalConfig, evaluate, prepare_items
    from suzak.eval.tasks import get_task

    flags = {"video_fps": 4.0, "video_max_frames": 8, "video_max_pixels": 4096}
    config = EvalConfig(task="moving_ball", model_path=str(tiny_model_dir), num_rows=4, output_path=str(tmp_path / "r.json"),
                        progress=False, **flags)  # fmt: skip
    items, _ = prepare_items(config, get_task("moving_ball"))
    training = moving_ball(4, seed=0)
    assert all(
        not np.array_equal(np.asarray(i.video[0]), np.asarray(r["video"][0]))
        for i, r in zip(items, training, strict=True)
    )
    report = evaluate(config)
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results["results"]) == 4 and {r["ground_truth"] for r in results["results"]} <= {"left", "right"}
    assert report.greedy.correct == sum(r["is_correct"] for r in results["results"])
    summary = (tmp_path / "r.md").read_text()
    assert "video=fps 4, 4-8 frames, 3136-4096 pixels a frame" in summary
    with pytest.raises(SuzakError, match=r"^video budget: .*\(the --video_\* flags\)$"):
        EvalConfig(task="moving_ball", model_path="tiny", video_min_frames=9, video_max_frames=8)
