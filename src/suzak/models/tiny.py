"""Build a tiny, real Qwen model offline (a VL family, or a text-only one): for tests, the smoke run and the self-test.

============  ======================================  ===================  =============  =======================
``--family``  model class                             processor            patch × merge  chat template
============  ======================================  ===================  =============  =======================
qwen2_vl      ``Qwen2VLForConditionalGeneration``     Qwen2VLProcessor     14 × 2 = 28    Qwen2-VL-Instruct's
qwen2_5_vl    ``Qwen2_5_VLForConditionalGeneration``  Qwen2_5_VLProcessor  14 × 2 = 28    Qwen2.5-VL-Instruct's
qwen3_vl      ``Qwen3VLForConditionalGeneration``     Qwen3VLProcessor     16 × 2 = 32    Qwen3-VL-Instruct's
qwen3_5       ``Qwen3_5ForConditionalGeneration``     Qwen3VLProcessor     16 × 2 = 32    Qwen3.5's (thinking)
qwen3_5_moe   ``Qwen3_5MoeForConditionalGeneration``  Qwen3VLProcessor     16 × 2 = 32    Qwen3.5's (thinking)
qwen2_5_text  ``Qwen2ForCausalLM``                    (tokenizer only)     (no images)    Qwen2.5-Instruct's
qwen3_text    ``Qwen3ForCausalLM``                    (tokenizer only)     (no images)    Qwen3's (thinking)
============  ======================================  ===================  =============  =======================

No weights or tokenizers can be downloaded here, so this writes a complete model folder from scratch:

- the family's real conditional-generation model from a small config (random init, seeded): Qwen3-VL with its
  DeepStack layer and interleaved M-RoPE, Qwen3.5 with one linear-attention (Gated DeltaNet) and one full-attention
  layer, Qwen3.5 MoE the same with a sparse MoE block in each layer (4 experts, top 2, and a shared expert) whose
  experts are fused 3-D parameters (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``: LoRA reaches them
  through ``lora_target_parameters``, :mod:`suzak.models.lora_targets`);
- a byte-level BPE tokenizer trained on the fly with the family's tokenizer class and pre-tokenizer (``Qwen2Tokenizer``,
  or ``Qwen3_5Tokenizer``), the family's added tokens in their real order at the end of the vocabulary and its chat
  template (``chat_templates/``), so digits, ``<think>``/``<answer>`` and the CLEVR and GSM8K words are reachable in
  a few tokens;
- the family's real processor (Qwen2-VL image processor with the family's patch size, merge 2, mean and std).

``AutoProcessor.from_pretrained(DIR)`` and ``AutoModelForImageTextToText.from_pretrained(DIR)`` load the result. The
two text families (:data:`TEXT`) stand in for the text-only checkpoints a user trains on GSM8K (Qwen2.5-1.5B-Instruct,
Qwen3): a plain causal LM with the same offline tokenizer layout (Qwen's vocabulary has the vision placeholders
too) and the model's own chat template, and no processor: ``AutoTokenizer`` and ``AutoModelForCausalLM`` load them.

    suzak tiny --output outputs/tiny-qwen2.5-vl
    suzak tiny --output outputs/tiny-qwen3-vl --family qwen3_vl
    suzak tiny --output outputs/tiny-vllm --vllm                       # head_dim 32: what vLLM's CPU build runs
    suzak tiny --output outputs/tiny-qwen2.5 --family qwen2_5_text             # a text-only causal LM
    suzak tiny --output outputs/tiny-wide --hidden_size 256 --num_hidden_layers 4 --intermediate_size 1024 \
        --vision_depth 4 --vision_hidden_size 128 --vision_intermediate_size 256   # bench/bench_vision_reuse.py's
"""

from __future__ import annotations

import argparse
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from suzak import SuzakError
from suzak.media.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

__all__ = [
    "CHAT_TEMPLATE",
    "FAMILIES",
    "SPECIAL_TOKENS",
    "TEXT",
    "TinyConfig",
    "build_tiny_model",
    "build_tokenizer",
    "chat_template",
    "training_corpus",
]

logger = logging.getLogger(__name__)

TEMPLATES_DIR = Path(__file__).with_name("chat_templates")


def chat_template(family: str) -> str:
    """The chat template the family's Instruct checkpoints ship, verbatim (``chat_templates/<file>.jinja``).

    Qwen2-VL and Qwen2.5-VL share one (a default system prompt, nothing after the assistant header); Qwen3-VL's has no
    default system prompt; Qwen3.5's opens ``<think>\\n`` after the assistant header unless ``enable_thinking`` is
    false.
    """
    return (TEMPLATES_DIR / f"{_spec(family).template}.jinja").read_text(encoding="utf-8")


# Qwen's added tokens in their real order (ids follow the BPE vocabulary here instead of 151643+ or 248044+).
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
# Qwen3's tokenizers (Qwen3-VL, Qwen3.5) add these after the file separator, also not special.
QWEN3_ADDED_TOKENS = ["<tool_response>", "</tool_response>", "<think>", "</think>"]


@dataclass(frozen=True)
class _Family:
    """What differs between the families' tiny models: classes, tokenizer, template, vision tower (none for a text
    family: no processor, video processor or patch size)."""

    model_class: str
    config_class: str
    processor_class: str | None
    video_processor: str | None  # "qwen2_vl" or "qwen3_vl": the module of the family's video processor
    tokenizer_class: str  # "qwen2" or "qwen3_5": the module of the family's tokenizer (and pre-tokenizer regex)
    template: str  # chat_templates/<template>.jinja
    patch_size: int | None
    image_mean: tuple[float, float, float] | None  # None: the image processor's default (OpenAI CLIP's)
    added_tokens: tuple[str, ...]
    rotary_fraction: float = 1.0  # of head_dim under M-RoPE (Qwen3.5 rotates a quarter)
    mrope_split: tuple[int, int, int] = (2, 3, 3)  # (t, h, w) shares of the rotated half: Qwen2.5-VL's 16:24:24

    @property
    def text_only(self) -> bool:
        return self.processor_class is None


_QWEN2_ADDED = tuple(ADDED_TOKENS)
_QWEN3_ADDED = tuple(ADDED_TOKENS + QWEN3_ADDED_TOKENS)
FAMILIES: dict[str, _Family] = {
    "qwen2_vl": _Family("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", "Qwen2VLProcessor", "qwen2_vl", "qwen2",
                        "qwen2_vl", 14, None, _QWEN2_ADDED),
    "qwen2_5_vl": _Family("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", "Qwen2_5_VLProcessor", "qwen2_vl",
                          "qwen2", "qwen2_vl", 14, None, _QWEN2_ADDED),
    "qwen3_vl": _Family("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", "Qwen3VLProcessor", "qwen3_vl", "qwen2",
                        "qwen3_vl", 16, (0.5, 0.5, 0.5), _QWEN3_ADDED),
    "qwen3_5": _Family("Qwen3_5ForConditionalGeneration", "Qwen3_5Config", "Qwen3VLProcessor", "qwen3_vl", "qwen3_5",
                       "qwen3_5", 16, (0.5, 0.5, 0.5), _QWEN3_ADDED, rotary_fraction=0.25, mrope_split=(11, 11, 10)),
    "qwen3_5_moe": _Family("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig", "Qwen3VLProcessor", "qwen3_vl",
                           "qwen3_5", "qwen3_5", 16, (0.5, 0.5, 0.5), _QWEN3_ADDED, rotary_fraction=0.25,
                           mrope_split=(11, 11, 10)),
    "qwen2_5_text": _Family("Qwen2ForCausalLM", "Qwen2Config", None, None, "qwen2", "qwen2_5", None, None, _QWEN2_ADDED),
    "qwen3_text": _Family("Qwen3ForCausalLM", "Qwen3Config", None, None, "qwen2", "qwen3", None, None, _QWEN3_ADDED),
}  # fmt: skip
TEXT = ("qwen2_5_text", "qwen3_text")  # text-only causal LMs (Qwen2.5-Instruct's and Qwen3's layout): no images
QWEN3_5 = ("qwen3_5", "qwen3_5_moe")  # Gated DeltaNet + full attention, a quarter of head_dim rotated
MOE = ("qwen3_5_moe",)  # a sparse MoE block (routed experts + a shared expert) in place of each layer's MLP
DEFAULT_FAMILY = "qwen2_5_vl"


def _spec(family: str) -> _Family:
    try:
        return FAMILIES[family]
    except KeyError:
        raise SuzakError(f"unknown tiny model family {family!r}; known: {', '.join(FAMILIES)}") from None


CHAT_TEMPLATE = chat_template(DEFAULT_FAMILY)  # Qwen2.5-VL-Instruct's (and Qwen2-VL-Instruct's)


# vLLM's CPU attention refuses head_dim 16 (the default tiny's): "Unsupported CPU attention configuration". The
# vLLM-ready tiny keeps the default's width with 2 heads of 32 (one KV head), which it runs.
VLLM_HEADS = 2
VLLM_MIN_HEAD_DIM = 32


def mrope_sections(rotated_half: int, split: tuple[int, ...] = (2, 3, 3)) -> list[int]:
    """M-RoPE's (temporal, height, width) sections for ``rotated_half`` rotary frequencies (the rotated head_dim / 2):
    ``split``'s shares (Qwen2.5-VL's 16:24:24 by default), rounded by largest remainder so they sum exactly.

    >>> mrope_sections(8), mrope_sections(16), mrope_sections(64), mrope_sections(2, (11, 11, 10))
    ([2, 3, 3], [4, 6, 6], [16, 24, 24], [1, 1, 0])
    """
    total = sum(split)
    exact = [rotated_half * share / total for share in split]
    sections = [int(value) for value in exact]
    by_remainder = sorted(range(len(split)), key=lambda i: (sections[i] - exact[i], i))
    for i in by_remainder[: rotated_half - sum(sections)]:
        sections[i] += 1
    return sections


@dataclass
class TinyConfig:
    """Sizes of the tiny model. Defaults: ~0.3M parameters, builds in a few seconds on one core.

    Any ``hidden_size`` that ``num_attention_heads`` divides works: the M-RoPE sections follow from the head dimension
    (:func:`mrope_sections`). :meth:`shaped` with ``for_vllm`` gives the shape vLLM's CPU build runs (head_dim 32).
    """

    family: str = DEFAULT_FAMILY  # FAMILIES: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_5_moe
    vocab_size: int = 1536  # BPE vocabulary before special tokens
    hidden_size: int = 64
    intermediate_size: int = 128  # the dense MLP's (the MoE family: the shared expert's)
    num_experts: int = 4  # the MoE family only: routed experts per layer, top num_experts_per_tok of them per token
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32  # each routed expert's
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    mrope_section: list[int] | None = None  # sums to the rotated head_dim / 2; None: derived (mrope_sections)
    max_position_embeddings: int = 8192
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_heads: int = 2
    min_pixels: int = DEFAULT_MIN_PIXELS  # the processor saved with the model resizes into the default budget
    max_pixels: int = DEFAULT_MAX_PIXELS
    seed: int = 0
    extra_corpus: list[str] = field(default_factory=list)  # more text the BPE should learn whole words from

    def __post_init__(self):
        spec = _spec(self.family)
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise SuzakError(f"hidden_size {self.hidden_size} / num_attention_heads {self.num_attention_heads} / "
                             f"num_key_value_heads {self.num_key_value_heads}: each must divide the one before")  # fmt: skip
        rotated = int(self.head_dim * spec.rotary_fraction)
        if rotated < 2 or rotated % 2:
            raise SuzakError(f"hidden_size {self.hidden_size} gives head_dim {self.head_dim}, {rotated} of it rotated: "
                             "M-RoPE needs an even rotated width")  # fmt: skip
        if self.mrope_section is None and not spec.text_only:  # text models: plain 1-D RoPE
            self.mrope_section = mrope_sections(rotated // 2, spec.mrope_split)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def shaped(cls, family: str = DEFAULT_FAMILY, *, for_vllm: bool = False, **sizes) -> TinyConfig:
        """The tiny model of ``family``; ``for_vllm``: the shape vLLM's CPU build runs, the default tiny's sizes with
        2 attention heads of 32 (one KV head), since its CPU attention refuses head_dim 16. ``sizes`` override (the
        expert sizes apply to the MoE family only)."""
        vllm_shape = {"num_attention_heads": VLLM_HEADS, "num_key_value_heads": 1} if for_vllm else {}
        return cls(family=family, **vllm_shape | sizes)

    @property
    def vllm_ready(self) -> bool:
        return self.head_dim >= VLLM_MIN_HEAD_DIM


# The prompt templates the tokenizer learns whole words from: the ones it always learned them from. A template added
# later stays out, so the tiny vocabulary (and with it every tiny model, and the self-tests' measured schedules) does
# not change with it.
CORPUS_TEMPLATES = ("r1v", "r1v_eval", "r1v_geoqa", "gsm8k", "gsm8k_think", "plain")


def training_corpus(seed: int = 0) -> list[str]:
    """Text the tokenizer is trained on: the project's prompts, CLEVR questions, GSM8K-style text and answers.

    Built from the same templates the data builders use, so every prompt and ideal answer tokenizes compactly.
    """
    from suzak.scoring.prompts import TEMPLATES, render_answer

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
        for name in CORPUS_TEMPLATES:
            lines.append(TEMPLATES[name].render(q))
    for n in range(0, 1001):
        lines.append(render_answer("think_answer", str(n), f"I count {n} objects, so the answer is {n}."))
        lines.append(render_answer("gsm8k_hash", str(n), f"{n} + {n % 7} = {n + n % 7} and {n} * 2 = {2 * n}."))
        lines.append(f"<answer> {n} </answer> <answer>{n}</answer> #### {n:,} ${n}.{n % 100:02d} -{n}")
    lines += [f"There is a {a} {c} {s}." for a in attrs for c in colors for s in shapes[:4]]
    lines += [f"The image is {c}. {c} {c.capitalize()}" for c in colors]
    lines += colors * 4  # bare words, as an answer right after "assistant\n" starts: one token each (self-test)
    return lines


def build_tokenizer(config: TinyConfig | None = None):
    """The family's tokenizer (real class and pre-tokenizer: ``Qwen2Tokenizer``, ``Qwen3_5Tokenizer`` for Qwen3.5)
    with a BPE vocabulary trained here, the family's added tokens and chat template."""
    import importlib

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    config = config or TinyConfig()
    spec = _spec(config.family)
    module = importlib.import_module(f"transformers.models.{spec.tokenizer_class}.tokenization_{spec.tokenizer_class}")
    tokenizer_class = next(getattr(module, name) for name in module.__all__ if name.endswith("Tokenizer"))
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(module.PRETOKENIZE_REGEX), behavior="isolated", invert=False),
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
    tokenizer = tokenizer_class(
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
    tokenizer.add_tokens(list(spec.added_tokens), special_tokens=False)
    tokenizer.chat_template = chat_template(config.family)
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
    """The family's real processor around ``tokenizer``: patch size and mean/std of the family, merge 2, temporal
    patch 2, the budget's min/max pixels."""
    import importlib

    import transformers
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    spec = _spec(config.family)
    size = {"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels}
    grid = {"patch_size": spec.patch_size, "temporal_patch_size": 2, "merge_size": 2}
    colour = {"image_mean": list(spec.image_mean), "image_std": list(spec.image_mean)} if spec.image_mean else {}
    video_module = importlib.import_module(
        f"transformers.models.{spec.video_processor}.video_processing_{spec.video_processor}"
    )
    video_class = next(getattr(video_module, n) for n in video_module.__all__ if n.endswith("VideoProcessor"))
    return getattr(transformers, spec.processor_class)(
        image_processor=Qwen2VLImageProcessor(size=size, **grid, **colour),
        tokenizer=tokenizer,
        video_processor=video_class(size=size, **grid, **colour),
        chat_template=chat_template(config.family),
    )


def _text_config(ids: dict[str, int], vocab_size: int, config: TinyConfig, spec: _Family) -> dict:
    head_dim = config.hidden_size // config.num_attention_heads
    rotated = int(head_dim * spec.rotary_fraction)
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    if not spec.text_only:
        if sum(config.mrope_section) * 2 != rotated:
            raise ValueError(f"mrope_section {config.mrope_section} must sum to the rotated head_dim/2 = "
                             f"{rotated // 2}")  # fmt: skip
        rope["mrope_section"] = config.mrope_section
    text = {
        "vocab_size": vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_parameters": rope,
        "bos_token_id": None,  # Qwen's tokenizer has no BOS token
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": True,
    }
    if config.family == "qwen3_text":
        text["head_dim"] = head_dim
    if config.family in ("qwen3_vl", *QWEN3_5):
        text["head_dim"] = head_dim
        rope["mrope_interleaved"] = True
    if config.family in MOE:  # every layer's MLP is a sparse MoE block (Qwen3.5 MoE has no dense layers)
        del text["intermediate_size"]
        text |= {"num_experts": config.num_experts, "num_experts_per_tok": config.num_experts_per_tok,
                 "moe_intermediate_size": config.moe_intermediate_size,
                 "shared_expert_intermediate_size": config.intermediate_size}  # fmt: skip
    if config.family in QWEN3_5:  # Gated DeltaNet layers, then full attention, as in Qwen3.5's 3:1 pattern
        rope["partial_rotary_factor"] = spec.rotary_fraction
        linear = max(1, config.num_hidden_layers - 1)
        text |= {"layer_types": ["linear_attention"] * linear + ["full_attention"] * (config.num_hidden_layers - linear),
                 "linear_conv_kernel_dim": 4, "linear_key_head_dim": head_dim, "linear_value_head_dim": head_dim,
                 "linear_num_key_heads": config.num_key_value_heads,
                 "linear_num_value_heads": config.num_attention_heads}  # fmt: skip
    return text


def _vision_config(config: TinyConfig, spec: _Family) -> dict:
    common = {"depth": config.vision_depth, "num_heads": config.vision_num_heads, "patch_size": spec.patch_size,
              "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
    if config.family == "qwen2_vl":
        return common | {"embed_dim": config.vision_hidden_size, "hidden_size": config.hidden_size,
                         "mlp_ratio": config.vision_intermediate_size // config.vision_hidden_size}  # fmt: skip
    common |= {"hidden_size": config.vision_hidden_size, "intermediate_size": config.vision_intermediate_size,
               "out_hidden_size": config.hidden_size}  # fmt: skip
    if config.family == "qwen2_5_vl":
        return common | {"window_size": 112, "fullatt_block_indexes": [config.vision_depth - 1]}
    common["num_position_embeddings"] = 256  # a 16x16 grid of learned positions, interpolated to each image's
    if config.family == "qwen3_vl":
        common["deepstack_visual_indexes"] = [0]  # one DeepStack feature, merged into the first text layer
    return common


def build_model(tokenizer, config: TinyConfig):
    """A randomly initialised model of the family sized by ``config`` (seeded)."""
    import torch
    import transformers
    from transformers import GenerationConfig

    spec = _spec(config.family)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config_class = getattr(transformers, spec.config_class)
    text_config = _text_config(ids, len(tokenizer), config, spec)
    if spec.text_only:
        model_config = config_class(**text_config)
    else:
        model_config = config_class(
            text_config=text_config,
            vision_config=_vision_config(config, spec),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=True,
        )
    torch.manual_seed(config.seed)
    model = getattr(transformers, spec.model_class)(model_config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    return model


def build_tiny_model(output: str | Path, config: TinyConfig | None = None) -> Path:
    """Write tokenizer, processor (none for a text family) and a random-init tiny model of ``config.family`` to
    ``output``; return the folder."""
    import json

    config = config or TinyConfig()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config)
    processing_class = tokenizer if _spec(config.family).text_only else build_processor(tokenizer, config)
    model = build_model(tokenizer, config)
    model.save_pretrained(output)
    processing_class.save_pretrained(output)
    (output / "suzak_tiny.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("tiny %s (%d parameters, vocab %d) written to %s", config.family, n_params, len(tokenizer), output)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="suzak tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder to write the model, tokenizer and processor to")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the tokenizer corpus")
    parser.add_argument("--vllm", action="store_true",
                        help=f"the size vLLM's CPU build runs ({VLLM_HEADS} heads of 32; head_dim 16 it refuses)")  # fmt: skip
    parser.add_argument("--hidden_size", type=int, default=None,
                        help=f"text width (default {TinyConfig.hidden_size}; any multiple of the attention heads, the "
                        "M-RoPE sections follow from the head dimension)")  # fmt: skip
    parser.add_argument("--num_hidden_layers", type=int, default=TinyConfig.num_hidden_layers)
    parser.add_argument("--intermediate_size", type=int, default=TinyConfig.intermediate_size, help="text MLP width")
    parser.add_argument("--vision_depth", type=int, default=TinyConfig.vision_depth, help="vision tower blocks")
    parser.add_argument("--vision_hidden_size", type=int, default=TinyConfig.vision_hidden_size,
                        help="vision tower width (its 2 heads split it)")  # fmt: skip
    parser.add_argument("--vision_intermediate_size", type=int, default=TinyConfig.vision_intermediate_size,
                        help="vision MLP width")  # fmt: skip
    parser.add_argument("--vocab_size", type=int, default=TinyConfig.vocab_size, help="BPE vocabulary size")
    parser.add_argument("--family", default=DEFAULT_FAMILY, choices=list(FAMILIES),
                        help=f"the Qwen VL generation to build, or a text-only Qwen ({', '.join(TEXT)}; default "
                        f"{DEFAULT_FAMILY})")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    sizes = {"seed": args.seed, "num_hidden_layers": args.num_hidden_layers, "vocab_size": args.vocab_size,
             "intermediate_size": args.intermediate_size, "vision_depth": args.vision_depth,
             "vision_hidden_size": args.vision_hidden_size, "vision_intermediate_size": args.vision_intermediate_size}  # fmt: skip
    if args.hidden_size is not None:
        sizes["hidden_size"] = args.hidden_size
    try:
        config = TinyConfig.shaped(args.family, for_vllm=args.vllm, **sizes)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    path = build_tiny_model(args.output, config)
    print(f"wrote {path}")
