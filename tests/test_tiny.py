"""The offline tiny Qwen2.5-VL: loads through the Auto classes, generates with an image, is deterministic."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from suzak.models.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, TinyConfig, build_model, build_tokenizer
from suzak.scoring.prompts import build_conversation, render_answer, render_prompt


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    return processor, model


def test_loads_through_auto_classes(loaded, tiny_model_dir):
    processor, model = loaded
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert type(processor.image_processor).__name__.startswith("Qwen2VLImageProcessor")
    assert processor.chat_template == CHAT_TEMPLATE
    assert AutoTokenizer.from_pretrained(tiny_model_dir).chat_template == CHAT_TEMPLATE
    tokenizer = processor.tokenizer
    for token in SPECIAL_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id
        assert tokenizer.tokenize(token) == [token]
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")


def test_generates_with_an_image(loaded):
    processor, model = loaded
    prompt = build_conversation(render_prompt("r1v", "How many items are there in the image?"))
    text = processor.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>How many items" in text
    inputs = processor(text=[text], images=[Image.new("RGB", (320, 240), (173, 35, 35))], return_tensors="pt")
    assert (inputs["input_ids"] == model.config.image_token_id).sum().item() == 99  # (252/28)·(308/28)
    torch.manual_seed(0)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=True)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_vocabulary_reaches_the_rewards(loaded):
    """Digits are single tokens and the prompt/answer words are whole tokens, so rewards are reachable."""
    tokenizer = loaded[0].tokenizer
    for digit in "0123456789":
        assert tokenizer.tokenize(digit) == [digit]
    for word in ["items", "cube", "sphere", "cylinder", "red", "yellow", "metal", "rubber", "clips", "think", "answer"]:
        assert len(tokenizer.tokenize(" " + word)) == 1, word
    ideal = render_answer("think_answer", "7", "I count 7 objects.")
    assert tokenizer.decode(tokenizer(ideal)["input_ids"]) == ideal
    assert len(tokenizer(ideal)["input_ids"]) <= 20


def test_deterministic_for_a_seed():
    config = TinyConfig(seed=3)
    tok_a, tok_b = build_tokenizer(config), build_tokenizer(config)
    assert tok_a.get_vocab() == tok_b.get_vocab()
    state_a, state_b = build_model(tok_a, config).state_dict(), build_model(tok_b, config).state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    other = build_model(tok_a, TinyConfig(seed=4)).state_dict()
    assert not all(torch.equal(state_a[k], other[k]) for k in state_a)


def test_rejects_bad_mrope_section():
    config = TinyConfig(mrope_section=[1, 1])
    with pytest.raises(ValueError, match="mrope_section"):
        build_model(build_tokenizer(config), config)


@pytest.mark.parametrize(
    ("family", "hidden_size", "sections"),
    [
        ("qwen2_5_vl", 64, [2, 3, 3]),  # the default tiny's (unchanged)
        ("qwen2_5_vl", 128, [4, 6, 6]),  # the vLLM-ready size
        ("qwen2_5_vl", 96, [3, 5, 4]),  # 12 frequencies: 3, 4.5, 4.5 by largest remainder
        ("qwen2_vl", 256, [8, 12, 12]),
        ("qwen3_vl", 128, [4, 6, 6]),
        ("qwen3_5", 64, [1, 1, 0]),  # rotates a quarter of head_dim 16: 2 frequencies (the default tiny's)
        ("qwen3_5", 128, [2, 1, 1]),
    ],
)
def test_mrope_sections_follow_from_any_hidden_size(family, hidden_size, sections):
    config = TinyConfig(family=family, hidden_size=hidden_size)
    assert config.mrope_section == sections
    rotated = config.head_dim * (0.25 if family == "qwen3_5" else 1)
    assert 2 * sum(sections) == rotated


def test_cli_builds_any_hidden_size_and_the_vllm_size(tmp_path):
    """``suzak tiny --hidden_size 128`` was a traceback (mrope_section [2, 3, 3] for head_dim 32)."""
    import json

    from suzak.models.tiny import main

    main(["--output", str(tmp_path / "wide"), "--hidden_size", "128"])
    main(["--output", str(tmp_path / "vllm"), "--vllm", "--family", "qwen3_vl"])
    for name, family in (("wide", "Qwen2_5_VLForConditionalGeneration"), ("vllm", "Qwen3VLForConditionalGeneration")):
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["architectures"] == [family]
        text = config["text_config"]
        assert text["hidden_size"] == {"wide": 128, "vllm": 64}[name]
        assert text["hidden_size"] // text["num_attention_heads"] == 32  # vLLM's CPU attention refuses 16
        assert sum(text["rope_parameters"]["mrope_section"]) == 16
    assert TinyConfig.shaped("qwen2_vl", for_vllm=True).vllm_ready and not TinyConfig.shaped("qwen2_vl").vllm_ready


def test_cli_says_in_one_line_when_the_heads_do_not_divide_the_width(tmp_path):
    from suzak.models.tiny import main

    with pytest.raises(SystemExit, match=r"^error: hidden_size 66 / num_attention_heads 4 .* must divide"):
        main(["--output", str(tmp_path / "x"), "--hidden_size", "66"])
    assert not (tmp_path / "x").exists()
