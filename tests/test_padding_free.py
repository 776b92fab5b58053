"""Padding-free passes (``suzak.models.packing``, docs/padding_free.md): TRL's fused-head call on a chunk of rows
padded as TRL pads them (prompts left, completions right, to the batch's widest) gives, packed, every completion
token's log-probability and entropy within 1e-5 and every trainable parameter's gradient within 1e-4 (relative) of
the padded call: per family and text-only model, several images in a row, a row without images, video, LoRA with
gradient checkpointing, vision reuse; a model it cannot keep exact (Qwen3.5) is refused and its calls run padded."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from suzak.models.packing import (
    ROW_ATTENTION,
    PackingCount,
    packing_refusal,
    packing_rows,
    use_row_attention,
)

EXACT = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_text", "qwen3_text"]
ANSWERS = ["red", "the ball is red and big and round", "blue", "green green green green green green green", "no"]


def _picture(seed: int, size: tuple[int, int]) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def _load(folder, text_only: bool, attention: str = "sdpa"):
    from trl.trainer.utils import add_fused_lm_head

    if text_only:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        processor = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention)
    else:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        processor = AutoProcessor.from_pretrained(folder)
        model = AutoModelForImageTextToText.from_pretrained(folder, attn_implementation=attention)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    model.train()
    return processor, model


def _batch(processor, text_only: bool, video: list | None = None) -> tuple[dict, torch.Tensor, int]:
    """TRL's layout: left-padded prompts (a group's image twice, a row of two pictures of two sizes, a row without
    images; ``video``: one more row with a clip) and right-padded completions of different lengths; the labels TRL
    builds; the completion width (``logits_to_keep``)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    a, b, c = _picture(1, (56, 56)), _picture(2, (84, 56)), _picture(3, (56, 56))
    rows = [[a], [a], [b, c], []]
    prompts, images = [], []
    for pictures in rows:
        question = "What color is the image? " * (1 + len(pictures))
        content = (
            question if text_only else [{"type": "image"} for _ in pictures] + [{"type": "text", "text": question}]
        )
        prompts.append(processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                     add_generation_prompt=True))  # fmt: skip
        images.extend(pictures)
    kwargs = {}
    if video is not None:
        content = [{"type": "video"}, {"type": "text", "text": "What color does the ball turn?"}]
        prompts.append(processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                     add_generation_prompt=True))  # fmt: skip
        kwargs = {"videos": [video], "do_sample_frames": False}
    tokenizer.padding_side = "left"
    prompt = processor(text=prompts, padding=True, return_tensors="pt", **({} if text_only else {"images": images}),
                       **kwargs)  # fmt: skip
    answers = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ANSWERS[: len(prompts)]]
    width = max(map(len, answers))
    completion = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, ids in enumerate(answers):
        completion[row, : len(ids)], mask[row, : len(ids)] = torch.tensor(ids), 1
    inputs = {"input_ids": torch.cat([prompt["input_ids"], completion], 1),
              "attention_mask": torch.cat([prompt["attention_mask"], mask], 1)}  # fmt: skip
    for key, value in prompt.items():
        if key == "mm_token_type_ids":
            inputs[key] = torch.cat([value, torch.zeros_like(completion)], 1)
        elif key not in ("input_ids", "attention_mask"):
            inputs[key] = value
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    labels[:, :-width] = -100  # as GRPOTrainer._get_per_token_logps_and_entropies
    return inputs, labels, width


def _passes(model, inputs, labels, keep: int, packed: bool):
    """The completion tokens' log-probs and entropies, every trainable parameter's gradient of a weighted sum of
    them, and the call's (real tokens, positions computed)."""
    model.zero_grad(set_to_none=True)
    count = PackingCount()
    with packing_rows(model, count, enabled=packed):
        out = model(**inputs, labels=labels, fused_lm_head=True)
    logps, entropy = out.log_probs[:, -keep:], out.entropy[:, -keep:]
    weights = torch.linspace(0.5, 1.5, logps.numel()).view_as(logps)
    ((logps * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), entropy.detach(), grads, count.take()


def _same(padded, packed) -> None:
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], rtol=0, atol=1e-5)
    assert set(packed[2]) == set(padded[2]) and padded[2]
    for name, grad in padded[2].items():
        error = (packed[2][name] - grad).norm() / grad.norm().clamp(min=1e-12)
        assert error <= 1e-4, f"{name}: gradient {error:.2e} off (relative)"


@pytest.mark.parametrize("family", EXACT)
def test_packed_rows_give_the_padded_log_probs_entropies_and_gradients(family_model_dir, family):
    text_only = "text" in family
    processor, model = _load(family_model_dir(family), text_only)
    assert packing_refusal(model) is None
    use_row_attention(model)
    assert model.config.get_text_config()._attn_implementation == ROW_ATTENTION
    inputs, labels, keep = _batch(processor, text_only)
    padded = _passes(model, inputs, labels, keep, packed=False)
    packed = _passes(model, inputs, labels, keep, packed=True)
    real = int(inputs["attention_mask"].sum())
    assert padded[3] == (real, inputs["input_ids"].numel()) and packed[3] == (real, real)
    assert real < inputs["input_ids"].numel()  # the batch has padding to leave out
    _same(padded, packed)
    # unlabelled positions stay zero, as TRL's head gives them
    assert (packed[0][labels[:, -keep:] == -100] == 0).all()


def test_a_row_padded_inside_runs_as_it_came(family_model_dir):
    """Rows whose attended tokens are not one run each (a hole in the mask) are not packed: the call runs padded."""
    processor, model = _load(family_model_dir("qwen2_5_text"), True)
    use_row_attention(model)
    inputs, labels, keep = _batch(processor, True)
    inputs["attention_mask"][0, -keep - 2] = 0  # a hole in the first row's prompt
    labels = labels.masked_fill(inputs["attention_mask"] == 0, -100)
    counted = _passes(model, inputs, labels, keep, packed=True)[3]
    assert counted[1] == inputs["input_ids"].numel()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_clip_beside_images(family_model_dir, family):
    """A row with a video clip (its 3-D positions from the model's own video positions) beside image rows."""
    processor, model = _load(family_model_dir(family), False)
    use_row_attention(model)
    side = 56 if family == "qwen2_5_vl" else 64
    clip = [_picture(10 + i, (side, side)) for i in range(4)]
    inputs, labels, keep = _batch(processor, False, video=clip)
    assert "pixel_values_videos" in inputs
    _same(_passes(model, inputs, labels, keep, False), _passes(model, inputs, labels, keep, True))


def test_lora_gradient_checkpointing_and_vision_reuse(family_model_dir):
    """LoRA on the language and vision layers under gradient checkpointing (each layer recomputed in the backward,
    the rows' lengths handed to it again), with each picture encoded once: the same equality, the adapters'
    gradients included."""
    from peft import LoraConfig, get_peft_model

    from suzak.models.vision_reuse import share_vision_encodings

    processor, model = _load(family_model_dir("qwen2_5_vl"), False)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=r".*(q_proj|v_proj|qkv)", init_lora_weights=False)
    model = get_peft_model(model, config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    stats = share_vision_encodings(model)
    assert packing_refusal(model) is None
    use_row_attention(model)
    inputs, labels, keep = _batch(processor, False)
    padded = _passes(model, inputs, labels, keep, False)
    packed = _passes(model, inputs, labels, keep, True)
    assert any("lora_" in name and ".visual." in name for name in packed[2])
    assert any("lora_" in name and "language_model" in name for name in packed[2])
    assert stats.encoded < stats.images
    _same(padded, packed)


def test_eager_attention_packs_with_transformers_block_mask(family_model_dir):
    processor, model = _load(family_model_dir("qwen2_5_vl"), False, attention="eager")
    use_row_attention(model)  # sdpa only: eager keeps its own, with transformers' packed mask
    assert model.config.get_text_config()._attn_implementation == "eager"
    inputs, labels, keep = _batch(processor, False)
    _same(_passes(model, inputs, labels, keep, False), _passes(model, inputs, labels, keep, True))


def test_row_attention_is_sdpa_where_a_call_is_not_packed(family_model_dir):
    """Generation and every unpacked call (HF eval, a padded pass) get sdpa's own result under the row attention."""
    processor, model = _load(family_model_dir("qwen2_5_vl"), False)
    inputs, labels, keep = _batch(processor, False)
    before = _passes(model, inputs, labels, keep, False)
    use_row_attention(model)
    after = _passes(model, inputs, labels, keep, False)
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=1e-6)
    model.eval()
    with torch.no_grad():
        ids = inputs["input_ids"][:2]
        out = model.generate(input_ids=ids, attention_mask=inputs["attention_mask"][:2], max_new_tokens=3,
                             do_sample=False, pixel_values=None)  # fmt: skip
    assert out.shape[1] == ids.shape[1] + 3


def test_qwen3_5_runs_padded_and_says_why(family_model_dir):
    """Qwen3.5's linear-attention layers read across rows when packed (their short convolution on this path): the
    model is refused, and with ``enabled`` as a trainer sets it from the refusal its calls are padded (counted)."""
    processor, model = _load(family_model_dir("qwen3_5"), False)
    reason = packing_refusal(model)
    assert reason is not None and "linear-attention" in reason and "padded" in reason
    inputs, labels, keep = _batch(processor, False)
    padded = _passes(model, inputs, labels, keep, False)
    packed = _passes(model, inputs, labels, keep, True)  # what packing would give: not exact for this model
    assert (packed[0] - padded[0]).abs().max() > 1e-4  # the refusal is needed (remove it when this fails)


def test_a_run_logs_the_real_token_fraction_and_tokens_per_s(tmp_path, run_env):
    """``suzak train`` packs by default (perf/real_token_fraction 1.0 in metrics.csv, with perf/tokens_per_s);
    ``--padding_free false`` computes the padding (the fraction below 1 on rows of different lengths); a Qwen3.5 run
    says in one line why it runs padded."""
    common = [sys.executable, "-m", "suzak", "train", "--config", "recipes/smoke.yaml", "--max_steps", "2",
              "--logging_steps", "1", "--max_completion_length", "24", "--temperature", "1.5"]  # fmt: skip
    fractions = {}
    for packed in ("true", "false"):
        out = tmp_path / packed
        result = subprocess.run([*common, "--padding_free", packed, "--output_dir", str(out)], env=run_env,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        with open(out / "metrics.csv", newline="") as file:
            rows = [row for row in csv.DictReader(file) if row.get("loss")]
        assert rows and all(float(row["perf/tokens_per_s"]) > 0 for row in rows)
        fractions[packed] = [float(row["perf/real_token_fraction"]) for row in rows]
    assert fractions["true"] == [1.0, 1.0]
    assert all(fraction < 1.0 for fraction in fractions["false"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_a_zero_run_trains_the_same_packed_and_padded(tmp_path, run_env, stage):
    """Under DeepSpeed ZeRO-2/3 (one CPU rank, gloo), the hooks on the model TRL calls (DeepSpeed's engine) pack the
    policy's and the reference model's passes: two steps with ``beta`` 0.04 log the same loss, KL and entropy as the
    padded run (the second step's completions sampled from the weights the first step's packed gradients made)."""
    runs = {}
    env = {**run_env, "PYTHONPATH": str(Path(__file__).parent)}  # test_trainer.length_reward: non-zero advantages
    for packed in ("true", "false"):
        out = tmp_path / packed
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "suzak.train",
                   "--config", "recipes/smoke.yaml", "--max_steps", "2", "--beta", "0.04", "--save_strategy", "no",
                   "--rewards", "test_trainer.length_reward", "--reward_weights", "1.0", "--preflight_rows", "0",
                   "--deepspeed", f"ds_configs/{stage}.json", "--padding_free", packed, "--output_dir", str(out)]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        with open(out / "metrics.csv", newline="") as file:
            runs[packed] = [row for row in csv.DictReader(file) if row.get("loss")]
    assert len(runs["true"]) == len(runs["false"]) == 2
    for packed, padded in zip(runs["true"], runs["false"], strict=True):
        assert float(packed["perf/real_token_fraction"]) == 1.0 > float(padded["perf/real_token_fraction"])
        assert packed["completions/mean_length"] == padded["completions/mean_length"]
        for name in ("loss", "kl", "entropy"):
            assert float(packed[name]) == pytest.approx(float(padded[name]), rel=1e-4, abs=1e-6), name
    assert float(runs["true"][1]["kl"]) > 0  # the second step's reference pass saw changed weights
