"""Random-init models of the real Qwen2.5-VL-3B/7B shapes, for the GPU benchmarks (no weights can be downloaded).

The architecture and sizes are the Hub checkpoints' (config.json); the weights are random (seed 0) and the tokenizer
and processor are the offline tiny model's, with its token ids wired into the config. Speed and memory at a fixed
completion length are then those of the real model.
"""

from __future__ import annotations

from pathlib import Path

import torch

# Real Qwen2.5-VL-3B/7B-Instruct shapes (config.json of the Hub checkpoints).
VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "patch_size": 14,
          "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}  # fmt: skip
SHAPES = {
    "3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False},
}  # fmt: skip


def make_random_model(shape: str, folder: Path) -> Path:
    """Save a random-init Qwen2.5-VL of the named shape with the tiny tokenizer/processor (token ids aligned)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from suzak.models.tiny import SPECIAL_TOKENS, TinyConfig, build_processor, build_tokenizer

    if (folder / "config.json").is_file():
        return folder
    tiny = TinyConfig(max_position_embeddings=32768)
    tokenizer = build_tokenizer(tiny)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = SHAPES[shape] | {
        "max_position_embeddings": 32768, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
        "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"], "bos_token_id": None,
    }  # fmt: skip
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=VISION | {"out_hidden_size": text["hidden_size"]},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    build_processor(tokenizer, tiny).save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder
