"""Build a tiny, real Qwen2.5-VL offline: for tests, the smoke run and the self-test.

No weights or tokenizers can be downloaded here, so this writes a complete model folder from scratch:

- the real ``Qwen2_5_VLForConditionalGeneration`` from a small config (random init, seeded);
- a byte-level BPE tokenizer trained on the fly with Qwen2's pre-tokenizer, Qwen's special tokens at the end of the
  vocabulary and Qwen2.5-VL's chat template, so digits, ``<think>``/``<answer>`` and the CLEVR and GSM8K words are
  reachable in a few tokens;
- the real ``Qwen2_5_VLProcessor`` (Qwen2-VL image processor, patch 14, merge 2).

``AutoProcessor.from_pretrained(DIR)`` and ``AutoModelForImageTextToText.from_pretrained(DIR)`` load the result.

    python -m suzak.tiny --output outputs/tiny-qwen2.5-vl
"""

from __future__ import annotations

import argparse
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from suzak.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TinyConfig", "build_tiny_model", "build_tokenizer", "training_corpus"]

logger = logging.getLogger(__name__)

# Qwen2.5-VL-Instruct's chat template (the one its processor ships), verbatim.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content"
    " or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video'"
    " or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5-VL's added tokens in their real order (ids follow the BPE vocabulary here instead of 151643+).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
# Added but not special in Qwen's tokenizer (they are meant to be generated and decoded).
ADDED_TOKENS = [
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip


@dataclass
class TinyConfig:
    """Sizes of the tiny model. Defaults: ~0.3M parameters, builds in a few seconds on one core."""

    vocab_size: int = 1536  # BPE vocabulary before special tokens
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    mrope_section: list[int] = field(default_factory=lambda: [2, 3, 3])  # sums to head_dim / 2
    max_position_embeddings: int = 8192
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    min_pixels: int = DEFAULT_MIN_PIXELS  # the processor saved with the model resizes into the default budget
    max_pixels: int = DEFAULT_MAX_PIXELS
    seed: int = 0
    architecture: str = "qwen2_5_vl"  # or "qwen2_vl": the real Qwen2VLForConditionalGeneration
    extra_corpus: list[str] = field(default_factory=list)  # more text the BPE should learn whole words from


def training_corpus(seed: int = 0) -> list[str]:
    """Text the tokenizer is trained on: the project's prompts, CLEVR questions, GSM8K-style text and answers.

    Built from the same templates the data builders use, so every prompt and ideal answer tokenizes compactly.
    """
    from suzak.prompts import TEMPLATES, render_answer

    rng = random.Random(seed)
    colors = ["gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow"]
    shapes = ["cube", "sphere", "cylinder", "ball", "block", "thing", "object", "item"]
    shapes += [s + "s" for s in shapes]
    attrs = ["large", "small", "big", "tiny", "rubber", "metal", "metallic", "shiny", "matte"]
    questions = [
        "How many items are there in the image?",
        "How many different items are there in the image?",
        "What color is the image?",
    ]
    for _ in range(400):
        words = [rng.choice(attrs), rng.choice(colors), rng.choice(shapes)]
        lead = rng.choice(["How many", "What number of"])
        questions.append(f"{lead} {' '.join(words)} are there?")
    gsm = [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she "
        "earn? Each day, the total cost, per week, dollars, apples, minutes, hours, times, twice, half, left, more, "
        "less, than, each, every, of, the, and, then, so, she, he, they, it, is, are, was, were, has, have, had.",
    ]
    lines = []
    for q in questions + gsm:
        for t in TEMPLATES.values():
            lines.append(t.render(q))
    for n in range(0, 1001):
        lines.append(render_answer("think_answer", str(n), f"I count {n} objects, so the answer is {n}."))
        lines.append(render_answer("gsm8k_hash", str(n), f"{n} + {n % 7} = {n + n % 7} and {n} * 2 = {2 * n}."))
        lines.append(f"<answer> {n} </answer> <answer>{n}</answer> #### {n:,} ${n}.{n % 100:02d} -{n}")
    lines += [f"There is a {a} {c} {s}." for a in attrs for c in colors for s in shapes[:4]]
    lines += [f"The image is {c}. {c} {c.capitalize()}" for c in colors]
    lines += colors * 4  # bare words, as an answer right after "assistant\n" starts: one token each (self-test)
    return lines


def build_tokenizer(config: TinyConfig | None = None):
    """A Qwen2 tokenizer (real ``Qwen2Tokenizer`` class and pre-tokenizer) with a BPE vocabulary trained here."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    config = config or TinyConfig()
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_corpus(config.seed) + list(config.extra_corpus), trainer=trainer)
    state = bpe.model  # BPE model with the learned vocab and merges
    vocab = bpe.get_vocab()
    merges = _merges_of(state)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.add_tokens(ADDED_TOKENS, special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _merges_of(bpe_model) -> list[tuple[str, str]]:
    """The merges of a trained ``tokenizers`` BPE model (read back from the merges file it saves)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        files = bpe_model.save(tmp)
        merges_file = next(f for f in files if f.endswith("merges.txt"))
        lines = Path(merges_file).read_text(encoding="utf-8").splitlines()
    return [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]


def build_processor(tokenizer, config: TinyConfig):
    """The real Qwen2.5-VL (or Qwen2-VL) processor around ``tokenizer``, with the budget's min/max pixels."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    size = {"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels}
    image_processor = Qwen2VLImageProcessor(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    video_processor = Qwen2VLVideoProcessor(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    processor_class = Qwen2VLProcessor if config.architecture == "qwen2_vl" else Qwen2_5_VLProcessor
    return processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def build_model(tokenizer, config: TinyConfig):
    """A randomly initialised Qwen2.5-VL (or Qwen2-VL) conditional-generation model sized by ``config`` (seeded)."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = config.hidden_size // config.num_attention_heads
    if sum(config.mrope_section) * 2 != head_dim:
        raise ValueError(f"mrope_section {config.mrope_section} must sum to head_dim/2 = {head_dim // 2}")
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": config.mrope_section},
        "bos_token_id": None,  # Qwen's tokenizer has no BOS token
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
    }
    vision_common = {"depth": config.vision_depth, "num_heads": config.vision_num_heads, "patch_size": 14,
                     "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
    if config.architecture == "qwen2_5_vl":
        config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        vision_config = vision_common | {
            "hidden_size": config.vision_hidden_size, "intermediate_size": config.vision_intermediate_size,
            "out_hidden_size": config.hidden_size, "window_size": 112, "fullatt_block_indexes": [config.vision_depth - 1],
        }  # fmt: skip
    elif config.architecture == "qwen2_vl":
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
        vision_config = vision_common | {"embed_dim": config.vision_hidden_size, "hidden_size": config.hidden_size,
                                         "mlp_ratio": config.vision_intermediate_size // config.vision_hidden_size}  # fmt: skip
    else:
        raise ValueError(f"unknown architecture {config.architecture!r}: use 'qwen2_5_vl' or 'qwen2_vl'")
    model_config = config_class(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(config.seed)
    model = model_class(model_config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    return model


def build_tiny_model(output: str | Path, config: TinyConfig | None = None) -> Path:
    """Write tokenizer, processor and a random-init tiny Qwen2.5-VL to ``output``; return the folder."""
    import json

    config = config or TinyConfig()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config)
    processor = build_processor(tokenizer, config)
    model = build_model(tokenizer, config)
    model.save_pretrained(output)
    processor.save_pretrained(output)
    (output / "suzak_tiny.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("tiny Qwen2.5-VL (%d parameters, vocab %d) written to %s", n_params, len(tokenizer), output)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder to write the model, tokenizer and processor to")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the tokenizer corpus")
    parser.add_argument("--hidden_size", type=int, default=TinyConfig.hidden_size)
    parser.add_argument("--num_hidden_layers", type=int, default=TinyConfig.num_hidden_layers)
    parser.add_argument("--vocab_size", type=int, default=TinyConfig.vocab_size, help="BPE vocabulary size")
    parser.add_argument("--architecture", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen2_vl"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = TinyConfig(
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        vocab_size=args.vocab_size,
    )
    path = build_tiny_model(args.output, config)
    print(f"wrote {path}")
