"""Each distinct image encoded once per forward pass (``suzak.models.vision_reuse``, docs/vision_reuse.md): the
per-token log-probabilities and the gradient of every trainable parameter equal the unshared path's within float32
round-off, per family, with a trainable tower, a frozen one, LoRA on the tower, gradient checkpointing, several
images in a row, and images beside video."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from suzak.models.vision_reuse import share_vision_encodings, vision_tower

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]


def _picture(seed: int, size: tuple[int, int]) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def _inputs(processor, rows: list[list], video: list | None = None):
    """A batch of chat rows, each its pictures and a question, answered "red"; ``video``: one more row with a clip."""
    texts, images = [], []
    for pictures in rows:
        content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": "What color is the image?"}]
        texts.append(processor.apply_chat_template(
            [{"role": "user", "content": content}, {"role": "assistant", "content": "red"}], tokenize=False))  # fmt: skip
        images.extend(pictures)
    kwargs = {}
    if video is not None:
        content = [{"type": "video"}, {"type": "text", "text": "What color does the ball turn?"}]
        texts.append(processor.apply_chat_template(
            [{"role": "user", "content": content}, {"role": "assistant", "content": "blue"}], tokenize=False))  # fmt: skip
        kwargs = {"videos": [video], "do_sample_frames": False}
    processor.tokenizer.padding_side = "left"
    return processor(text=texts, images=images, padding=True, return_tensors="pt", **kwargs)


def _logps_and_grads(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each next token's log-probability (padding masked), and every trainable parameter's gradient of their sum."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    logps = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, inputs["input_ids"][:, 1:, None])[..., 0]
    logps = logps * inputs["attention_mask"][:, 1:]
    logps.sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), grads


def _load(folder):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return AutoProcessor.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder)


def _same(plain, shared) -> None:
    logps, grads = plain
    shared_logps, shared_grads = shared
    torch.testing.assert_close(shared_logps, logps, rtol=1e-5, atol=1e-5)
    assert set(shared_grads) == set(grads) and grads
    for name, grad in grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def _group_batch() -> list[list]:
    """Three pictures (two sizes: two grids) in seven images over six rows, as GRPO groups repeat them; one row holds
    two pictures."""
    a, b, c = _picture(1, (56, 56)), _picture(2, (56, 56)), _picture(3, (84, 56))
    return [[a], [a], [b], [a, c], [b], [c]]


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_encodings_give_the_unshared_log_probs_and_gradients(family_model_dir, family):
    """Seven images of three pictures: the tower encodes three, and every log-probability and gradient (the tower's
    included, the sum over the rows that share a picture) equals the unshared path's."""
    processor, plain = _load(family_model_dir(family))
    _, shared = _load(family_model_dir(family))
    stats = share_vision_encodings(shared)
    inputs = _inputs(processor, _group_batch())
    expected = _logps_and_grads(plain, inputs)
    got = _logps_and_grads(shared, inputs)
    assert (stats.images, stats.encoded) == (7, 3)
    assert any(".visual." in f".{name}" for name in got[1])  # the tower trains, through the shared features
    _same(expected, got)


def test_a_frozen_tower_lora_on_the_tower_and_gradient_checkpointing(family_model_dir):
    """The same equality with the tower frozen (only the language model's gradients), and with LoRA adapters on the
    tower's attention under gradient checkpointing (the adapters' gradients through shared features)."""
    from peft import LoraConfig, get_peft_model

    folder = family_model_dir("qwen2_5_vl")
    processor, plain = _load(folder)
    _, shared = _load(folder)
    for model in (plain, shared):
        for param in vision_tower(model).parameters():
            param.requires_grad_(False)
    share_vision_encodings(shared)
    inputs = _inputs(processor, _group_batch())
    expected, got = _logps_and_grads(plain, inputs), _logps_and_grads(shared, inputs)
    assert not any(".visual." in f".{name}" for name in got[1])
    _same(expected, got)

    def lora(model):
        config = LoraConfig(r=4, lora_alpha=8, target_modules=r".*visual.*\.qkv", init_lora_weights=False)
        torch.manual_seed(0)  # the same random adapters on both
        model = get_peft_model(model, config)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        return model

    _, plain = _load(folder)
    _, shared = _load(folder)
    plain, shared = lora(plain), lora(shared)
    stats = share_vision_encodings(shared)
    expected, got = _logps_and_grads(plain, inputs), _logps_and_grads(shared, inputs)
    assert stats.encoded == 3 and any("lora_" in name and ".visual." in name for name in got[1])
    _same(expected, got)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_images_beside_a_clip(family_model_dir, family):
    """A batch with image rows and a video row: the images are shared, the clip is encoded as before."""
    processor, plain = _load(family_model_dir(family))
    _, shared = _load(family_model_dir(family))
    stats = share_vision_encodings(shared)
    side = 56 if family == "qwen2_5_vl" else 64
    clip = [_picture(10 + i, (side, side)) for i in range(4)]
    inputs = _inputs(processor, _group_batch()[:3], video=clip)
    expected, got = _logps_and_grads(plain, inputs), _logps_and_grads(shared, inputs)
    assert (stats.images, stats.encoded) == (3 + 1, 2 + 1)  # two calls: the images (3 of 2 pictures), the clip
    _same(expected, got)


class _Tower(torch.nn.Module):
    """A tower's contract: patches and a grid per image in, outputs per patch and per merged token (2x2) out."""

    spatial_merge_size = 2

    def forward(self, hidden_states, grid_thw=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        self.seen = (hidden_states.shape[0], grid_thw.tolist(), sorted(kwargs))
        merged = hidden_states.view(-1, 4, hidden_states.shape[-1]).sum(1)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states * 2, pooler_output=merged)


def test_the_tower_sees_each_picture_once_and_a_call_it_cannot_read_as_it_came():
    """Images A, B, A (grids of 16 patches): the tower is handed A and B, and every output comes back per image in
    the call's order, as the unshared call gives it; the hooks are installed once; a call carrying a tensor keyword
    (a caller's precomputed ``cu_seqlens``) and a call of distinct images reach the tower untouched."""
    model = torch.nn.Module()
    model.visual = _Tower()
    stats = share_vision_encodings(model)
    assert share_vision_encodings(model) is stats and vision_tower(model) is model.visual
    a, b = torch.randn(16, 6), torch.randn(16, 6)
    pixels, grid = torch.cat([a, b, a]), torch.tensor([[1, 4, 4]] * 3)
    shared = model.visual(pixels, grid_thw=grid)
    assert model.visual.seen == (32, [[1, 4, 4]] * 2, []) and stats.take() == (3, 2)
    torch.testing.assert_close(shared.last_hidden_state, pixels * 2)
    torch.testing.assert_close(shared.pooler_output, pixels.view(-1, 4, 6).sum(1))
    model.visual(pixels, grid, cu_seqlens=torch.tensor([0, 16, 32, 48]))  # the grid positional, as some callers pass it
    assert model.visual.seen == (48, [[1, 4, 4]] * 3, ["cu_seqlens"]) and stats.take() == (0, 0)
    model.visual(torch.cat([a, b]), grid_thw=grid[:2])
    assert model.visual.seen[0] == 32 and stats.take() == (2, 2)


def test_a_run_logs_what_the_tower_encoded_and_trains_as_the_unshared_run(tmp_path, run_env):
    """``suzak train`` on the demo's 16 prompts x 8 completions a step in 4 micro-batches of 32 rows: TRL shuffles
    the generation batch's rows before it cuts it, which would spread each group over the micro-batches; by whole
    groups, every pass (generation, the reference's and the policy's) holds each image once per 8 rows
    (``vision/encoded_fraction`` 0.125 in metrics.csv), and the run's losses and rewards are the unshared run's
    (``--vision_reuse false``: rows shuffled, nothing shared) to float round-off."""
    import csv
    import sys

    from conftest import run_ok

    runs = {}
    for reuse in ("true", "false"):
        out = tmp_path / reuse
        run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/demo.yaml", "--max_steps", "3",
                "--eval_rows", "0", "--per_device_train_batch_size", "32", "--gradient_accumulation_steps", "4",
                "--beta", "0.04", "--output_dir", str(out), "--vision_reuse", reuse], run_env)  # fmt: skip
        with open(out / "metrics.csv", newline="") as file:
            runs[reuse] = [row for row in csv.DictReader(file) if row["loss"]]  # not the closing summary row
    shared, plain = runs["true"], runs["false"]
    assert [float(row["vision/encoded_fraction"]) for row in shared] == [0.125] * 3
    assert all(not row.get("vision/encoded_fraction") for row in plain)
    for a, b in zip(shared, plain, strict=True):
        assert float(a["reward"]) == pytest.approx(float(b["reward"]), abs=1e-6)
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4, abs=1e-6)
