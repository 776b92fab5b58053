"""VLMGRPOTrainer on the tiny model: a few real GRPO steps through TRL with images, mixed sizes, LoRA, beta > 0."""

from __future__ import annotations

import re

import pytest
import torch
from datasets import Dataset
from PIL import Image
from trl import GRPOConfig, ModelConfig

from suzak.media.vision import PixelBudget, fit_row_images
from suzak.models.loading import load_model_and_processor, vision_parameters
from suzak.scoring.parsing import completion_text
from suzak.scoring.prompts import build_conversation, render_prompt
from suzak.training.trainer import VLMGRPOTrainer

BUDGET = PixelBudget(3136, 50176, factor=28)  # the tiny Qwen2.5-VL's 28-pixel visual tokens
SIZES = [(320, 240), (100, 700), (640, 200), (50, 50), (200, 90), (90, 300), (400, 400), (150, 60)]  # (w, h)


def _image(key: int, size) -> Image.Image:
    return Image.new("RGB", size, (10 * key, 255 - 10 * key, 7))


def image_dataset(n: int = 8, images_per_row: int = 1) -> Dataset:
    """Rows whose prompt, solution and image colour all encode the row's key, so misalignment is detectable."""
    rows = []
    for key in range(n):
        problem = f"How many items are there in scene {key}?"
        images = [_image(key, SIZES[(key + j) % len(SIZES)]) for j in range(images_per_row)]
        row = {
            "prompt": build_conversation(render_prompt("r1v", problem), images_per_row),
            "solution": f"<answer> {key} </answer>",
        }
        row |= {"image": images[0]} if images_per_row == 1 else {"images": images}
        rows.append(row)
    return Dataset.from_list(rows)


def length_reward(completions, **kwargs) -> list[float]:
    """Varies across a group, so advantages (and gradients) are non-zero."""
    return [float(len(completion_text(c))) for c in completions]


class AlignmentCheck:
    """A reward that asserts each prompt arrives with its own gold solution and its own (fitted) image."""

    __name__ = "alignment_check"

    def __init__(self):
        self.rows_checked = 0

    def __call__(self, prompts, completions, solution, **kwargs):
        images = kwargs.get("images") or [[img] if img else [] for img in kwargs.get("image", [None] * len(prompts))]
        for prompt, gold, row_images in zip(prompts, solution, images, strict=True):
            key = int(re.search(r"\d+", gold).group())
            text = next(p["text"] for p in prompt[0]["content"] if p["type"] == "text")
            assert f"scene {key}?" in text, (text, gold)
            for img in row_images or []:
                assert img.getpixel((0, 0))[0] == 10 * key
                assert BUDGET.fit(img) is img or BUDGET.size(img.height, img.width) == (img.height, img.width)
            self.rows_checked += 1
        return [0.0] * len(completions)


class TokenCountingTrainer(VLMGRPOTrainer):
    """Records, per prompt, the image tokens TRL fed the model and the trainer's budget's prediction (the model's
    patch factor) from the raw images."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        pad = self.model.config.image_token_id
        counts = (out["prompt_ids"] == pad).sum(dim=1).tolist()
        expected = []
        for row in inputs:
            images = row.get("images") or ([row["image"]] if row.get("image") is not None else [])
            expected.append(sum(self.pixel_budget.tokens(img.height, img.width) for img in images))
        self.token_checks = getattr(self, "token_checks", []) + [(counts, expected)]
        return out


def make_args(tmp_path, **overrides) -> GRPOConfig:
    values = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "num_generations": 2,
        "max_completion_length": 8, "max_steps": 2, "learning_rate": 1e-2, "bf16": False, "use_cpu": True,
        "gradient_checkpointing": False, "report_to": "none", "logging_steps": 1, "save_strategy": "no", "seed": 0,
        "beta": 0.0,
    }  # fmt: skip
    return GRPOConfig(**(values | overrides))


def make_trainer(tiny_model_dir, tmp_path, dataset, rewards, cls=VLMGRPOTrainer, model_overrides=None, budget=BUDGET,
                 **args):  # fmt: skip
    model_args = ModelConfig(model_name_or_path=str(tiny_model_dir), **(model_overrides or {}))
    grpo_args = make_args(tmp_path, **args)
    model, processor = load_model_and_processor(model_args, grpo_args)
    peft_config = None
    if model_args.use_peft:
        from trl import get_peft_config

        peft_config = get_peft_config(model_args)
    return cls(
        model=model, reward_funcs=rewards, args=grpo_args, train_dataset=dataset, processing_class=processor,
        pixel_budget=budget, peft_config=peft_config,
    )  # fmt: skip


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before, model) -> dict[str, bool]:
    return {n: not torch.equal(before[n], p.detach()) for n, p in model.named_parameters()}


def test_fit_row_images_covers_every_image_path():
    big = Image.new("RGBA", (1000, 800))
    row = {"image": big, "images": [big, "not-an-image"], "prompt": [{"role": "user", "content": [{"type": "image", "image": big}, {"type": "text", "text": "q"}]}]}  # fmt: skip
    fitted = fit_row_images(row, BUDGET)
    expected = BUDGET.size(800, 1000)
    assert (fitted["image"].height, fitted["image"].width) == expected and fitted["image"].mode == "RGB"
    assert (fitted["images"][0].height, fitted["images"][0].width) == expected and fitted["images"][1] == "not-an-image"
    part = fitted["prompt"][0]["content"][0]["image"]
    assert (part.height, part.width) == expected
    assert row["image"] is big  # the dataset row itself is not modified


def test_copies_of_one_image_in_a_batch_are_resized_once(monkeypatch):
    """TRL repeats each prompt num_generations times, each a separately decoded copy: one resize serves them all."""
    import suzak.media.vision

    calls = []
    original = suzak.media.vision.fit_image
    monkeypatch.setattr(
        suzak.media.vision, "fit_image", lambda image, *a, **k: calls.append(image.size) or original(image, *a, **k)
    )
    copies = [_image(3, (320, 240)) for _ in range(8)] + [_image(4, (320, 240))]  # equal content, distinct objects
    memo: dict = {}
    fitted = [fit_row_images({"image": img}, BUDGET, memo)["image"] for img in copies]
    assert len(calls) == 2  # two distinct images
    assert all(f is fitted[0] for f in fitted[:8]) and fitted[8] is not fitted[0]
    assert fitted[0].tobytes() == BUDGET.fit(copies[0]).tobytes()
    assert fit_row_images({"image": copies[0]}, BUDGET)["image"] is not fitted[0]  # no memo: no sharing


def _tokenizing_trainer(processor, calls: list) -> VLMGRPOTrainer:
    """A VLMGRPOTrainer holding just what TRL's ``_tokenize_prompts`` reads, its processor counting the rows of
    each call."""
    render = processor.apply_chat_template

    def counted(conversation, **kwargs):
        calls.append(len(conversation))
        return render(conversation=conversation, **kwargs)

    processor.apply_chat_template = counted
    trainer = object.__new__(VLMGRPOTrainer)
    vars(trainer).update(_is_vlm=True, environment_factories=None, processing_class=processor, tools=None,
                         chat_template=None, chat_template_kwargs={})  # fmt: skip
    return trainer


def _same_tokenized(ours, trls) -> None:
    (ids, images, fields), (want_ids, want_images, want_fields) = ours, trls
    assert ids == want_ids and fields.keys() == want_fields.keys()
    for key, value in want_fields.items():
        assert torch.equal(fields[key], value) if torch.is_tensor(value) else fields[key] == value, key
    assert [[image.tobytes() for image in row] for row in images] == [
        [image.tobytes() for image in row] for row in want_images
    ]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_each_distinct_prompt_is_tokenized_once_in_trls_layout(family, tmp_path):
    """A batch repeats each prompt num_generations times: the processor renders each distinct prompt once (copies
    with equal pixels count as one), and the ids, images and every field (pixel values, grids, token types) are
    TRL's own call on every row, to the bit, in the batch's order; several images to a prompt included."""
    import copy

    from transformers import AutoProcessor
    from trl import GRPOTrainer
    from trl.data_utils import prepare_multimodal_messages

    from suzak.models.tiny import TinyConfig, build_tiny_model

    processor = AutoProcessor.from_pretrained(build_tiny_model(tmp_path / family, TinyConfig.shaped(family)))
    calls: list = []
    trainer = _tokenizing_trainer(processor, calls)

    def prompt(text, *images):
        return prepare_multimodal_messages(build_conversation(text, len(images)), images=list(images))

    a = prompt("What colour?", _image(1, (56, 56)))
    a[0]["content"][0]["text"] = (
        None  # as TRL's own batches hold an image part: {"type": "image", "image": ..., "text": None}
    )
    b = prompt("What colour?", _image(2, (84, 56)))
    c = prompt("Which is larger?", _image(3, (56, 56)), _image(4, (56, 84)))
    batch = [a, b, copy.deepcopy(a), c, b, copy.deepcopy(c), a]
    ours = trainer._tokenize_each_prompt_once(batch)
    assert calls == [3]
    _same_tokenized(ours, GRPOTrainer._tokenize_prompts(trainer, batch))
    assert ours[0][0] is not ours[0][2]  # each row its own ids list (TRL extends them per rollout)
    calls.clear()
    trainer._tokenize_each_prompt_once([a, b, c])  # nothing repeated: TRL's call as it is
    assert calls == [3]


def test_each_distinct_prompt_and_environment_is_tokenized_once(tmp_path, tiny_model_dir):
    """With ``environment_factory`` TRL renders each row with its environment's tools: a prompt is the same only
    within one environment, and the rows' environments are back as they were after the call."""
    from transformers import AutoProcessor
    from trl import GRPOTrainer
    from trl.data_utils import prepare_multimodal_messages

    calls: list = []
    trainer = _tokenizing_trainer(AutoProcessor.from_pretrained(tiny_model_dir), calls)
    environments = ["x", "y", "x", "x", "y", "x"]
    vars(trainer).update(
        environment_factories=[object], _batch_environments=environments, _env_tools={"x": [], "y": []}
    )
    a = prepare_multimodal_messages(build_conversation("What colour?"), images=[_image(1, (56, 56))])
    b = prepare_multimodal_messages(build_conversation("What colour?"), images=[_image(2, (56, 56))])
    batch = [a, a, a, b, b, a]
    ours = trainer._tokenize_each_prompt_once(batch)
    assert calls == [1] * 4 and trainer._batch_environments is environments  # (x, a), (y, a), (x, b), (y, b)
    _same_tokenized(ours, GRPOTrainer._tokenize_prompts(trainer, batch))


def test_grpo_steps_with_images_train_every_parameter(tiny_model_dir, tmp_path):
    check = AlignmentCheck()
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_reward, check], cls=TokenCountingTrainer)
    before = snapshot(trainer.model)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2
    assert check.rows_checked >= 8
    unchanged = [n for n, c in changed(before, trainer.model).items() if not c]
    assert unchanged == [], f"parameters that did not train: {unchanged}"
    assert vision_parameters(trainer.model), "the vision tower is among the trained parameters"
    for counts, expected in trainer.token_checks:  # every row of the dataset has its own size
        assert counts == expected and len(set(expected)) > 1


def test_frozen_vision_tower_stays_unchanged(tiny_model_dir, tmp_path):
    from suzak.models.loading import freeze_vision_tower

    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_reward])
    freeze_vision_tower(trainer.model)
    before = snapshot(trainer.model)
    trainer.train()
    flags = changed(before, trainer.model)
    vision = {n for n, _ in vision_parameters(trainer.model)}
    assert vision and not any(flags[n] for n in vision)
    assert all(flags[n] for n in flags if n not in vision)


def test_multi_image_prompts(tiny_model_dir, tmp_path):
    check = AlignmentCheck()
    dataset = image_dataset(images_per_row=2)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, dataset, [length_reward, check], cls=TokenCountingTrainer, max_steps=1
    )
    trainer.train()
    assert check.rows_checked >= 2
    for counts, expected in trainer.token_checks:
        assert counts == expected


def test_text_only_prompts(tiny_model_dir, tmp_path, gsm8k_jsonl):
    from suzak.data.builders import gsm8k

    trainer = make_trainer(tiny_model_dir, tmp_path, gsm8k(path=str(gsm8k_jsonl)), [length_reward], max_steps=1)
    trainer.train()
    assert any("loss" in log for log in trainer.state.log_history)


@pytest.mark.parametrize("column", ["image", "images"])
def test_rows_with_and_without_images_mix_in_a_batch(tiny_model_dir, tmp_path, column):
    """A dataset whose rows alternate between an image question and a text question (None or ``[]`` in the image
    column): plain TRL 1.16 hands the processor None for the text rows and fails; suzak trains, in chunks of 2 rows
    (image-only and text-only chunks), each image row with its own image tokens."""
    import datasets

    from suzak.scoring.prompts import build_conversation

    rows = []
    for key, row in enumerate(image_dataset(4).to_list()):
        text = {"prompt": build_conversation(f"How many items are there in scene {key + 4}?", 0),
                "solution": f"<answer> {key + 4} </answer>"}  # fmt: skip
        if column == "image":
            rows += [row, {**text, "image": None}]
        else:
            rows += [{**row, "images": [row.pop("image")]}, {**text, "images": []}]
    image = datasets.Image()
    features = datasets.Features({"prompt": datasets.Dataset.from_list([rows[1]]).features["prompt"],
                                  "solution": datasets.Value("string"),
                                  column: image if column == "image" else datasets.List(image)})  # fmt: skip
    dataset = datasets.Dataset.from_list([{k: row[k] for k in features} for row in rows], features=features)
    check = AlignmentCheck()
    trainer = make_trainer(tiny_model_dir, tmp_path, dataset, [length_reward, check], cls=TokenCountingTrainer,
                           per_device_train_batch_size=2, steps_per_generation=4, max_steps=8)  # fmt: skip
    before = snapshot(trainer.model)
    trainer.train()
    assert check.rows_checked == 16  # 2 generation batches of 4 prompts x 2
    vision = {n for n, _ in vision_parameters(trainer.model)}
    assert any(changed(before, trainer.model)[n] for n in vision)
    assert any(0 in counts and max(counts) > 0 for counts, _ in trainer.token_checks)  # a mixed generation batch
    for counts, expected in trainer.token_checks:
        assert counts == expected


def test_lora_leaves_base_weights_unchanged(tiny_model_dir, tmp_path):
    lora = {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]}
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_reward], model_overrides=lora)
    before = snapshot(trainer.model)
    trainer.train()
    flags = changed(before, trainer.model)
    lora_b = [n for n in flags if "lora_B" in n]
    assert lora_b and all(flags[n] for n in lora_b)
    assert not any(flags[n] for n in flags if "lora_" not in n)


def test_beta_positive_uses_reference_model(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_reward], beta=0.04, max_steps=2)
    trainer.train()
    kl = [log["kl"] for log in trainer.state.log_history if "kl" in log]
    assert len(kl) == 2 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0


def test_train_runs_preflight_first(tiny_model_dir, tmp_path):
    from suzak import SuzakError
    from suzak.scoring.rewards import REWARDS

    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [REWARDS["clevr_count"]])
    trainer.answer_format = "gsm8k_hash"  # deliberately not what clevr_count parses
    with pytest.raises(SuzakError, match="clevr_count"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer.answer_format = "think_answer"
    trainer.run_pre_checks()
    assert trainer.precheck_report["visual_tokens"]["max"] == max(BUDGET.tokens(h, w) for w, h in SIZES)


@pytest.mark.parametrize(
    "bf16,deepspeed,use_peft,expected",
    [
        (False, None, False, torch.float32),
        (True, "ds_configs/zero2.json", False, torch.bfloat16),
        (True, None, True, torch.bfloat16),
        (True, None, False, torch.float32),  # pure-bf16 AdamW would round lr-1e-6 updates away
    ],
)
def test_weights_dtype_keeps_fp32_master_weights(bf16, deepspeed, use_peft, expected):
    from types import SimpleNamespace

    from suzak.models.loading import _dtype

    args = SimpleNamespace(bf16=bf16, fp16=False, deepspeed=deepspeed, learning_rate=1e-6)
    assert _dtype(ModelConfig(model_name_or_path="x", use_peft=use_peft), args) == expected
    w = torch.tensor([0.02], dtype=torch.bfloat16)
    assert torch.equal(w + 1e-6, w)  # the reason: a bf16 weight cannot take a 1e-6 step


def test_an_earlier_trainers_autocast_is_taken_off_the_model(tiny_model_dir, tmp_path):
    """A model an earlier trainer ran in bf16 in this process (an SFT prior: TRL's SFTConfig turns bf16 on even on a
    CPU) keeps accelerate's autocast wrapper on its forward; a GRPO run without bf16 takes it off, so the policy
    scores in fp32 what colocated vLLM samples in fp32 (left on, they differed by up to 0.09 nats)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    rows = [
        {"prompt": [{"role": "user", "content": "How many?"}], "completion": [{"role": "assistant", "content": "3"}]}
    ]
    sft = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=1, use_cpu=True,
                    report_to="none", save_strategy="no", disable_tqdm=True)  # fmt: skip
    assert sft.bf16  # TRL's default, even on a CPU
    SFTTrainer(model=model, args=sft, train_dataset=Dataset.from_list(rows * 2), processing_class=processor).train()
    assert "_original_forward" in vars(model)
    VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=make_args(tmp_path), train_dataset=image_dataset(4),
                   processing_class=processor, pixel_budget=BUDGET)  # fmt: skip
    assert "_original_forward" not in vars(model)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():  # the forward the model's own class defines, in fp32
        assert torch.equal(model(input_ids=ids).logits, type(model).forward(model, input_ids=ids).logits)


def test_load_best_model_at_end_loads_the_best_checkpoints_weights(tiny_model_dir, tmp_path, caplog):
    """transformers 5.17's ``_load_best_model`` reads a checkpoint with a plain ``load_state_dict``, which misses every
    key ``save_pretrained`` wrote in the checkpoint's layout (the resume's bug): the model saved at the end was the last
    step's. ``TrainerHooks._load_best_model`` loads it again with the model's key conversion."""
    from transformers import AutoModelForImageTextToText

    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(), [length_reward], save_strategy="steps",
                           save_steps=1)  # fmt: skip
    trainer.train()
    best = tmp_path / "out" / "checkpoint-1"
    want = AutoModelForImageTextToText.from_pretrained(best).state_dict()
    last = {key: value.clone() for key, value in trainer.model.state_dict().items()}
    assert any(not torch.equal(last[key], want[key]) for key in want)  # step 2 moved the weights: the test can fail
    trainer.state.best_model_checkpoint = str(best)
    with caplog.at_level("INFO", logger="suzak.trl_internals"):
        trainer._load_best_model()
    got = trainer.model.state_dict()
    assert all(torch.equal(got[key], want[key]) for key in want)
    assert f"best model's weights: 56 tensors from {best}" in caplog.text and "missing keys" not in caplog.text
