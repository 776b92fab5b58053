"""Qwen2-VL and Qwen2.5-VL place a video's tokens, and the text after it, where Qwen trained them (and vLLM runs them:
tests/test_vllm_boundary.py), not where transformers 5.17 puts them (suzak.models.positions)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from suzak.models import positions
from suzak.models.positions import qwen_rope_index, use_qwen_video_positions

TEXT, IMAGE, VIDEO = 0, 1, 2


def _model(tokens_per_second: float | None = 2):
    vision = SimpleNamespace(spatial_merge_size=2)
    if tokens_per_second is not None:
        vision.tokens_per_second = tokens_per_second
    return SimpleNamespace(config=SimpleNamespace(vision_config=vision))


def _prompt(*runs: tuple[int, int], pad: int = 0):
    """input_ids, mm_token_type_ids, attention_mask for runs of (kind, length), left-padded by ``pad``."""
    types = [TEXT] * pad + [kind for kind, length in runs for _ in range(length)]
    mask = [0] * pad + [1] * (len(types) - pad)
    return torch.zeros(1, len(types), dtype=torch.long), torch.tensor([types]), torch.tensor([mask])


def _transformers_rope_index(cls):
    """transformers' own ``get_rope_index`` of ``cls``, also after :func:`use_qwen_video_positions` replaced it."""
    return positions._REPLACED.get(cls, cls.get_rope_index)


def test_a_clip_at_1_6_fps_gets_qwens_time_positions_and_the_text_after_it_starts_past_them():
    """Two text tokens, a clip of 4 frame pairs of 2 x 4 merged patches at 1.25 s a pair (1.6 fps) and 2 tokens per
    second (Qwen2.5-VL's), three text tokens; one pad on the left."""
    ids, types, mask = _prompt((TEXT, 2), (VIDEO, 4 * 2 * 4), (TEXT, 3), pad=1)
    grid = torch.tensor([[4, 4, 8]])
    position_ids, deltas = qwen_rope_index(_model(), ids, types, video_grid_thw=grid,
                                           second_per_grid_ts=torch.tensor([1.25]), attention_mask=mask)  # fmt: skip
    time, height, width = position_ids[:, 0, 3:35]
    assert sorted(set(time.tolist())) == [2, 4, 7, 9]  # 2 + floor(pair * 1.25 * 2)
    assert time.tolist() == [2] * 8 + [4] * 8 + [7] * 8 + [9] * 8
    assert height.tolist() == ([2] * 4 + [3] * 4) * 4 and width.tolist() == [2, 3, 4, 5] * 8
    assert position_ids[:, 0, :3].tolist() == [[0, 0, 1]] * 3  # the pad keeps 0
    assert position_ids[:, 0, 35:].tolist() == [[10, 11, 12]] * 3  # one past the clip's last time position
    assert deltas.tolist() == [[13 - 37]]  # generation continues at 13 after the 37 unpadded tokens


def test_qwen2_vl_steps_one_time_position_per_frame_pair_and_images_are_one_step():
    ids, types, mask = _prompt((TEXT, 1), (IMAGE, 4), (TEXT, 1), (VIDEO, 3 * 1 * 1), (TEXT, 2))
    position_ids, deltas = qwen_rope_index(_model(None), ids, types, image_grid_thw=torch.tensor([[1, 4, 4]]),
                                           video_grid_thw=torch.tensor([[3, 2, 2]]), attention_mask=mask)  # fmt: skip
    assert position_ids[:, 0].tolist() == [
        [0, 1, 1, 1, 1, 3, 4, 5, 6, 7, 8],
        [0, 1, 1, 2, 2, 3, 4, 4, 4, 7, 8],
        [0, 1, 2, 1, 2, 3, 4, 4, 4, 7, 8],
    ]
    assert deltas.tolist() == [[9 - 11]]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_transformers_still_departs_from_qwen_on_video_and_agrees_on_images(family_model_dir, family):
    """The contract: if this fails on video, transformers places a clip as Qwen does again and
    suzak.models.positions (with its two calls) should go; on images both must agree, or the patch changes image
    training."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(family_model_dir(family)).model
    own = _transformers_rope_index(type(model))
    ids, types, mask = _prompt((TEXT, 3), (IMAGE, 6), (TEXT, 2))
    images = {"image_grid_thw": torch.tensor([[1, 4, 6]]), "attention_mask": mask}
    expected = qwen_rope_index(model, ids, types, **images)
    for theirs, ours in zip(own(model, ids, types, **images), expected, strict=True):
        assert torch.equal(theirs, ours)
    ids, types, mask = _prompt((TEXT, 3), (VIDEO, 8 * 1 * 1), (TEXT, 2))
    clip = {"video_grid_thw": torch.tensor([[8, 2, 2]]), "attention_mask": mask}
    if family == "qwen2_5_vl":
        clip["second_per_grid_ts"] = torch.tensor([0.5])
    theirs, ours = own(model, ids, types, **clip), qwen_rope_index(model, ids, types, **clip)
    assert not torch.equal(theirs[0], ours[0]), "transformers now places video as Qwen does: remove the patch"


def test_the_patch_reaches_every_instance_once():
    use_qwen_video_positions()
    use_qwen_video_positions()
    for cls in positions._model_classes():
        assert cls.get_rope_index is qwen_rope_index
        assert positions._REPLACED[cls] is not qwen_rope_index


@pytest.fixture(scope="module")
def qwen2_5_vl(family_model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.data.motion import moving_ball
    from suzak.media.video import VideoBudget, processor_kwargs, row_clip

    path = family_model_dir("qwen2_5_vl")
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    budget = VideoBudget(fps=4, min_frames=8, max_frames=8, max_pixels=3136).for_model(processor)
    clip = row_clip(moving_ball(1, seed=0)[0], budget)
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    inputs = processor(text=[text], videos=[clip.frames], return_tensors="pt", **processor_kwargs([clip]))
    inputs["second_per_grid_ts"] = torch.tensor([2.0])  # a clip read at 1 fps: its time outruns the text after it
    return model, inputs


def _completed(model, inputs) -> tuple[dict, float]:
    """(prompt + a greedy completion as one forward pass's inputs, the largest difference between the completion's
    log-probabilities as generation computed them and as that forward pass, the policy's in training, does)."""
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True)
    prompt = inputs["input_ids"].shape[1]
    completion = out.sequences[:, prompt:]
    full = dict(inputs, input_ids=out.sequences, attention_mask=torch.ones_like(out.sequences),
                mm_token_type_ids=torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, completion.shape[1])))  # fmt: skip
    model.model.rope_deltas = None
    with torch.no_grad():
        forward = model(**full).logits[:, prompt - 1 : -1]
    generated = torch.stack(out.logits, dim=1)
    picked = [torch.log_softmax(x.float(), -1).gather(-1, completion[..., None]) for x in (generated, forward)]
    return full, (picked[0] - picked[1]).abs().max().item()


def test_the_model_runs_qwens_positions_in_training_and_generation_alike(qwen2_5_vl):
    """A clip read at 1 fps (2 s a frame pair): Qwen puts its pairs 8 positions apart (tiny's 4 tokens a second) and
    the text after it past them; the forward pass runs those positions, and generation agrees with it."""
    model, inputs = qwen2_5_vl
    use_qwen_video_positions()
    full, gap = _completed(model, inputs)
    assert gap < 1e-5
    names = ("input_ids", "mm_token_type_ids", "video_grid_thw", "second_per_grid_ts", "attention_mask")
    index = {name: full[name] for name in names}
    ours, _ = qwen_rope_index(model.model, **index)
    theirs, _ = positions._REPLACED[type(model.model)](model.model, **index)
    with torch.no_grad():
        logits = [model(**full, position_ids=given).logits for given in (None, ours, theirs)]
    assert torch.allclose(logits[0], logits[1], atol=1e-6) and not torch.allclose(logits[0], logits[2], atol=1e-3)


def test_a_row_whose_completion_images_get_no_attention_shifts_the_next_rows_images():
    """Why dynamic sampling and truncated tool rollouts leave the loss through ``tool_mask``, not ``completion_mask``
    (:func:`suzak.trl_internals.rounds.masked_out_of_the_loss`): positions skip attention-0 tokens, but take image grids
    from one iterator over the batch, so a row whose crop (in its completion) has no attention leaves that crop's grid
    to the next row, whose image then gets the crop's layout (here 1x4 merged tokens instead of 2x2)."""
    row0 = [(TEXT, 1), (IMAGE, 4), (TEXT, 1), (IMAGE, 4), (TEXT, 1)]  # its prompt's image, then a crop it zoomed into
    row1 = [(TEXT, 1), (IMAGE, 4), (TEXT, 3)]
    ids0, types0, mask0 = _prompt(*row0)
    ids1, types1, mask1 = _prompt(*row1, pad=3)  # left-padded to row 0's 11 tokens
    ids, types, attended = torch.cat([ids0, ids1]), torch.cat([types0, types1]), torch.cat([mask0, mask1])
    grids = torch.tensor([[1, 4, 4], [1, 2, 8], [1, 4, 4]])  # row 0's image, row 0's crop, row 1's image
    crop_masked = attended.clone()
    crop_masked[0, 6:] = 0  # row 0's completion (its crop and the text after it) masked as TRL masks a filler row
    alone, _ = qwen_rope_index(_model(None), ids1, types1, image_grid_thw=grids[2:], attention_mask=mask1)
    kept, _ = qwen_rope_index(_model(None), ids, types, image_grid_thw=grids, attention_mask=attended)
    shifted, _ = qwen_rope_index(_model(None), ids, types, image_grid_thw=grids, attention_mask=crop_masked)
    assert torch.equal(kept[:, 1], alone[:, 0])
    assert not torch.equal(shifted[:, 1], alone[:, 0])
