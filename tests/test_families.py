"""Every Qwen VL generation suzak supports, on its own offline tiny model: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5;
and the text-only Qwen2.5 and Qwen3 causal LMs a user trains on GSM8K.

For each VL family: the tiny model is the family's real classes, template and tokens; the pixel budget's factor is
read from the model and its visual-token prediction equals what the processor makes of 8 mixed image sizes; a GRPO
step and an evaluation run; SFT, a LoRA export and a release. For each text family: the real classes and template,
no processor, nothing suppressed; a GRPO step, an evaluation run, SFT, a LoRA export and a release, each a text
model's (tests/test_text_dropin.py holds TRL's own GRPO test patterns on them). A family suzak does not know is one
line, and so are images for a text model.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from suzak import SuzakError
from suzak.media.vision import VISION_PLACEHOLDERS, PixelBudget, configure_processor, patch_factor, vision_token_ids
from suzak.models.tiny import SPECIAL_TOKENS, TEXT, chat_template
from suzak.scoring.prompts import build_conversation, render_prompt

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
# The published checkpoints' patch size x spatial merge size (their config.json / preprocessor_config.json).
FACTOR = {"qwen2_vl": 28, "qwen2_5_vl": 28, "qwen3_vl": 32, "qwen3_5": 32}
MODEL_CLASS = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
               "qwen3_vl": "Qwen3VLForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration"}  # fmt: skip
PROCESSOR_CLASS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
                   "qwen3_5": "Qwen3VLProcessor"}  # fmt: skip
TOKENIZER_CLASS = {"qwen2_vl": "Qwen2Tokenizer", "qwen2_5_vl": "Qwen2Tokenizer", "qwen3_vl": "Qwen2Tokenizer",
                   "qwen3_5": "Qwen3_5Tokenizer"}  # fmt: skip
# What the family's chat template puts around a one-image question (its own default system prompt, its own opener).
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What color is the image?<|im_end|>\n<|im_start|>assistant\n"
RENDERED = {"qwen2_vl": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + PROMPT,
            "qwen2_5_vl": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + PROMPT,
            "qwen3_vl": PROMPT, "qwen3_5": PROMPT + "<think>\n"}  # fmt: skip
SIZES = [(320, 240), (640, 480), (100, 700), (700, 100), (50, 50), (1000, 1000), (17, 900), (333, 257)]  # (w, h)


@pytest.fixture(scope="module")
def loaded(family_model_dir):
    cache = {}

    def load(family):
        if family not in cache:
            path = family_model_dir(family)
            cache[family] = (AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path))
        return cache[family]

    return load


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_is_the_familys_own(loaded, family_model_dir, family):
    processor, model = loaded(family)
    assert type(model).__name__ == MODEL_CLASS[family] and type(processor).__name__ == PROCESSOR_CLASS[family]
    assert model.config.model_type == family
    tokenizer = AutoTokenizer.from_pretrained(family_model_dir(family))
    assert type(tokenizer).__name__ == type(processor.tokenizer).__name__ == TOKENIZER_CLASS[family]
    assert processor.chat_template == tokenizer.chat_template == chat_template(family)
    text = processor.apply_chat_template(build_conversation("What color is the image?"), tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    assert text == RENDERED[family]
    for token in SPECIAL_TOKENS:
        assert tokenizer.tokenize(token) == [token]
    if family in ("qwen3_vl", "qwen3_5"):  # Qwen3's added tokens
        assert all(tokenizer.tokenize(t) == [t] for t in ("<think>", "</think>", "<tool_response>"))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_PLACEHOLDERS}
    assert (model.config.image_token_id, model.config.video_token_id) == (ids["<|image_pad|>"], ids["<|video_pad|>"])
    assert (model.config.vision_start_token_id, model.config.vision_end_token_id) == (
        ids["<|vision_start|>"], ids["<|vision_end|>"])  # fmt: skip
    assert sorted(vision_token_ids(processor)) == sorted(ids.values())  # the five placeholders, never sampled
    assert patch_factor(processor) == patch_factor(model) == patch_factor(model.config) == FACTOR[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_budget_predicts_the_processors_visual_tokens(loaded, family):
    """8 mixed sizes: the budget's count equals the image_grid_thw-derived count and the <|image_pad|> run of each
    image, fitted or left to the processor's own resize; a budget of the other generation's factor would not."""
    processor, model = loaded(family)
    budget = PixelBudget(3136, 401408).for_model(processor)
    assert budget.factor == FACTOR[family]
    processor = configure_processor(copy.deepcopy(processor), budget)  # the module's cached processor stays as loaded
    merge = processor.image_processor.merge_size
    images = [Image.new("RGB", size, (20 * i, 90, 200)) for i, size in enumerate(SIZES)]
    expected = [budget.tokens(h, w) for w, h in SIZES]
    text = processor.apply_chat_template(
        build_conversation("How many items?"), tokenize=False, add_generation_prompt=True
    )
    for inputs in ([budget.fit(image) for image in images], images):  # fitted once by suzak, or raw
        grids = processor.image_processor(images=inputs, return_tensors="pt")["image_grid_thw"]
        assert (grids.prod(-1) // merge**2).tolist() == expected
    batch = processor(
        text=[text] * len(images), images=[budget.fit(i) for i in images], padding=True, return_tensors="pt"
    )
    assert (batch["input_ids"] == model.config.image_token_id).sum(dim=1).tolist() == expected
    other = PixelBudget(3136, 401408, factor=60 - FACTOR[family])  # 28 <-> 32
    assert [other.tokens(h, w) for w, h in SIZES] != expected
    with pytest.raises(SuzakError, match=f"set for {60 - FACTOR[family]}x.* makes {FACTOR[family]}x"):
        other.for_model(processor)


@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_step_on_each_family(family_model_dir, tmp_path, family):
    """A real GRPO step through VLMGRPOTrainer: mixed image sizes, the model's factor, every parameter trained."""
    from test_trainer import TokenCountingTrainer, changed, image_dataset, length_reward, make_trainer, snapshot

    trainer = make_trainer(family_model_dir(family), tmp_path, image_dataset(8), [length_reward],
                           cls=TokenCountingTrainer, budget=PixelBudget(3136, 50176), max_steps=1,
                           per_device_train_batch_size=8)  # fmt: skip
    assert type(trainer.model).__name__ == MODEL_CLASS[family] and trainer.pixel_budget.factor == FACTOR[family]
    before = snapshot(trainer.model)
    trainer.train()
    assert [log["loss"] for log in trainer.state.log_history if "loss" in log]
    unchanged = [name for name, moved in changed(before, trainer.model).items() if not moved]
    assert unchanged == [], f"parameters that did not train: {unchanged}"
    for counts, expected in trainer.token_checks:  # the rows' images have 8 different sizes
        assert counts == expected and len(set(expected)) > 1


@pytest.mark.parametrize("family", FAMILIES)
def test_evaluation_run_on_each_family(family_model_dir, eval_fixture_dir, tmp_path, family):
    """suzak.eval (R1-V's SuperCLEVR protocol, HF engine) on the family's tiny model: the engine's budget is the
    model's, its prompts carry each image's visual tokens, the run writes R1-V's results file."""
    from suzak.eval.runner import EvalConfig, build_engine, evaluate, prepare_items
    from suzak.eval.tasks import get_task

    task = get_task("superclevr")
    config = EvalConfig(task="superclevr", model_path=str(family_model_dir(family)), image_root=str(eval_fixture_dir),
                        prompt_path=str(eval_fixture_dir / task.prompt_path), output_path=str(tmp_path / "sc.json"),
                        batch_size=4, max_new_tokens=8, progress=False)  # fmt: skip
    items, _ = prepare_items(config, task)
    engine = build_engine(config, task, PixelBudget(3136, 401408), items)
    assert engine.budget.factor == FACTOR[family]
    rows = [engine_row for engine_row in map(_engine_row, items)]
    inputs = engine.encode(rows)
    counts = (inputs["input_ids"] == engine.model.config.image_token_id).sum(dim=1).tolist()
    assert counts == [engine.budget.tokens(r["image"].height, r["image"].width) for r in rows]
    assert len({r["image"].size for r in rows}) > 1  # the fixture's mixed sizes
    report = evaluate(config, engine=engine)
    assert report.greedy.total == len(items) == 8
    results = json.loads((tmp_path / "sc.json").read_text())
    assert len(results["results"]) == 8 and all(isinstance(r["model_output"], str) for r in results["results"])
    assert f"pixels_per_visual_token={FACTOR[family]}x{FACTOR[family]}" in (tmp_path / "sc.md").read_text()


def _engine_row(item):
    from suzak.eval.runner import engine_row

    return engine_row(item)


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_step_on_each_family(family_model_dir, tmp_path, family):
    """suzak.sft's trainer (TRL's SFTTrainer, images fitted to the model's budget) takes optimizer steps."""
    from suzak.sft import build_sft_trainer
    from suzak.training.configs import parse_sft_args

    suzak_args, sft_args, model_args = parse_sft_args([
        "--config", str(ROOT / "recipes" / "sft_clevr_smoke.yaml"), "--model_name_or_path", str(family_model_dir(family)),
        "--dataset_options", '{"num_rows": 8}', "--eval_rows", "0", "--max_steps", "1", "--save_strategy", "no",
        "--output_dir", str(tmp_path / "sft")])  # fmt: skip
    trainer = build_sft_trainer(suzak_args, sft_args, model_args)
    assert trainer.train_dataset[0]["image"].size[0] % FACTOR[family] == 0  # fitted to the model's grid
    trainer.train()
    assert trainer.state.global_step == 1 and any("loss" in log for log in trainer.state.log_history)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_export_and_release_on_each_family(family_model_dir, loaded, tmp_path, family):
    """A LoRA adapter merges into the family's model with the same outputs, and its release card counts the
    visual tokens of the family's patch grid."""
    from huggingface_hub import ModelCard
    from peft import LoraConfig, get_peft_model

    from suzak.release.export import export_lora
    from suzak.release.publish import build_release
    from test_release import make_run_dir

    processor, _ = loaded(family)
    base = AutoModelForImageTextToText.from_pretrained(family_model_dir(family))
    text = processor.apply_chat_template(
        build_conversation("How many items?"), tokenize=False, add_generation_prompt=True
    )
    inputs = processor(text=[text], images=[Image.new("RGB", (128, 96), (200, 30, 30))], return_tensors="pt")
    adapted = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                              init_lora_weights=False))  # fmt: skip
    with torch.no_grad():
        expected = adapted.eval()(**inputs).logits
    adapter = tmp_path / "run-lora"
    adapted.save_pretrained(adapter)
    processor.save_pretrained(adapter)
    merged = AutoModelForImageTextToText.from_pretrained(export_lora(adapter))
    assert type(merged).__name__ == MODEL_CLASS[family]
    with torch.no_grad():
        assert torch.allclose(merged.eval()(**inputs).logits, expected, atol=1e-4)
    release = build_release(make_run_dir(tmp_path, family_model_dir(family)), tmp_path / "release", "me/tiny")
    card = ModelCard.load(release / "README.md").text
    tokens = 50176 // FACTOR[family] ** 2  # the smoke recipe's max_pixels
    assert f"3136..50176 pixels (at most {tokens} visual tokens of {FACTOR[family]}x{FACTOR[family]} pixels" in card


# --- the text-only families ------------------------------------------------------------------------------------------

TEXT_MODEL_CLASS = {"qwen2_5_text": "Qwen2ForCausalLM", "qwen3_text": "Qwen3ForCausalLM"}
QUESTION = "Natalia sold 48 clips. How many clips did Natalia sell?"
TEXT_RENDERED = {  # Qwen2.5-Instruct's default system prompt; Qwen3 has none
    "qwen2_5_text": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                    f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n",
    "qwen3_text": f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n",
}  # fmt: skip


@pytest.mark.parametrize("family", TEXT)
def test_text_tiny_model_is_the_familys_own(family_model_dir, family):
    """The real causal LM class and tokenizer, the template the real checkpoint ships (TRL's verbatim copy), Qwen's
    added tokens whole; no processor, so TRL's ``AutoProcessor`` gives the tokenizer, and no pixel budget factor or
    suppressed token: a text model samples the vision placeholders of its vocabulary as TRL lets it."""
    import trl
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor, model_budget

    path = family_model_dir(family)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == TEXT_MODEL_CLASS[family] and type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert model.config.model_type == {"qwen2_5_text": "qwen2", "qwen3_text": "qwen3"}[family]
    shipped = Path(trl.__file__).parent / "chat_templates" / f"{family.removesuffix('_text')}.jinja"
    assert tokenizer.chat_template == chat_template(family) == shipped.read_text(encoding="utf-8")
    conversation = build_conversation(QUESTION, 0)
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered == TEXT_RENDERED[family]
    if family == "qwen3_text":  # thinking off: the template closes an empty thinking block
        assert tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False).endswith("<think>\n\n</think>\n\n")  # fmt: skip
    assert all(tokenizer.tokenize(token) == [token] for token in SPECIAL_TOKENS)
    assert not {"processor_config.json", "preprocessor_config.json"} & {p.name for p in path.iterdir()}
    assert type(AutoProcessor.from_pretrained(path)).__name__ == "Qwen2Tokenizer"  # what TRL loads by name
    assert vision_token_ids(tokenizer) == [] and patch_factor(tokenizer) is None and patch_factor(model) is None
    loaded, processing_class = load_model_and_processor(ModelConfig(model_name_or_path=str(path)), None)
    assert type(loaded).__name__ == TEXT_MODEL_CLASS[family] and processing_class.padding_side in ("left", "right")
    assert model_budget(ModelConfig(model_name_or_path=str(path)), 3136, 401408).factor is None


@pytest.mark.parametrize("family", TEXT)
def test_grpo_step_on_each_text_family(family_model_dir, gsm8k_jsonl, tmp_path, family):
    """suzak's loader and trainer on GSM8K rows: every parameter trained, nothing suppressed in generation."""
    from suzak.data.builders import gsm8k
    from test_trainer import changed, length_reward, make_trainer, snapshot

    trainer = make_trainer(family_model_dir(family), tmp_path, gsm8k(path=str(gsm8k_jsonl)), [length_reward],
                           budget=PixelBudget(), max_steps=2)  # fmt: skip
    assert type(trainer.model).__name__ == TEXT_MODEL_CLASS[family] and trainer.suppressed_token_ids == []
    before = snapshot(trainer.model)
    trainer.train()
    assert len([log["loss"] for log in trainer.state.log_history if "loss" in log]) == 2
    assert [name for name, moved in changed(before, trainer.model).items() if not moved] == []


@pytest.mark.parametrize("family", TEXT)
def test_evaluation_run_on_each_text_family(family_model_dir, gsm8k_jsonl, tmp_path, family):
    """``suzak.eval gsm8k`` (HF engine) on the family's tiny causal LM: R1-V's results file, no pixel figures."""
    from suzak.eval import cli

    out = tmp_path / "gsm8k.json"
    cli.main(["gsm8k", "--model_path", str(family_model_dir(family)), "--prompt_path", str(gsm8k_jsonl),
              "--batch_size", "2", "--max_new_tokens", "6", "--output_path", str(out), "--no_progress"])  # fmt: skip
    results = json.loads(out.read_text())["results"]
    assert len(results) == 4 and all(isinstance(r["model_output"], str) for r in results)
    assert "pixels_per_visual_token" not in (tmp_path / "gsm8k.md").read_text()


@pytest.mark.parametrize("family", TEXT)
def test_sft_step_on_each_text_family(family_model_dir, tmp_path, family):
    """suzak.sft's trainer on GSM8K rows (the completion only in the loss) takes optimizer steps."""
    from suzak.sft import build_sft_trainer
    from suzak.training.configs import parse_sft_args

    suzak_args, sft_args, model_args = parse_sft_args([
        "--config", str(ROOT / "recipes" / "sft_smoke.yaml"), "--model_name_or_path", str(family_model_dir(family)),
        "--dataset_options", '{"num_rows": 8}', "--eval_rows", "0", "--max_steps", "2", "--save_strategy", "no",
        "--output_dir", str(tmp_path / "sft")])  # fmt: skip
    trainer = build_sft_trainer(suzak_args, sft_args, model_args)
    assert type(trainer.model).__name__ == TEXT_MODEL_CLASS[family]
    trainer.train()
    assert trainer.state.global_step == 2 and any("loss" in log for log in trainer.state.log_history)


@pytest.mark.parametrize("family", TEXT)
def test_lora_export_and_release_on_each_text_family(family_model_dir, tmp_path, family):
    """A LoRA adapter merges into the family's causal LM with the same outputs (the export names the causal LM class
    and GSM8K), and the release card is a text model's: text-generation, no pixel budget, AutoModelForCausalLM."""
    from huggingface_hub import ModelCard
    from peft import LoraConfig, get_peft_model

    from suzak.release.export import export_lora, loading_hint
    from suzak.release.publish import build_release
    from test_release import make_run_dir

    path = family_model_dir(family)
    tokenizer = AutoTokenizer.from_pretrained(path)
    inputs = tokenizer(TEXT_RENDERED[family], return_tensors="pt")
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(path), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))  # fmt: skip
    with torch.no_grad():
        expected = adapted.eval()(**inputs).logits
    adapter = tmp_path / "run-lora"
    adapted.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    merged_dir = export_lora(adapter)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert type(merged).__name__ == TEXT_MODEL_CLASS[family]
    with torch.no_grad():
        assert torch.allclose(merged.eval()(**inputs).logits, expected, atol=1e-4)
    assert loading_hint(merged_dir) == (f"exported to {merged_dir}: load with AutoModelForCausalLM.from_pretrained("
                                        f"'{merged_dir}'); evaluate with `python -m suzak.eval gsm8k --model_path "
                                        f"{merged_dir}`")  # fmt: skip
    run = make_run_dir(tmp_path, path, recipe=str(ROOT / "recipes" / "gsm8k_smoke.yaml"),
                       model="Qwen/Qwen2.5-1.5B-Instruct", dataset="gsm8k")  # fmt: skip
    card = ModelCard.load(build_release(run, tmp_path / "release", "me/tiny") / "README.md")
    assert card.data.pipeline_tag == "text-generation" and "vision-language" not in card.data.tags
    assert "| pixel budget | none (a text model: no images) |" in card.text
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny")' in card.text and "AutoProcessor" not in card.text


def test_images_for_a_text_model_are_one_line(tmp_path, run_env, eval_fixture_dir):
    """An image recipe or an image benchmark on a text model: one line each, before step 1 or before generating."""
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml",
                             "--model_name_or_path", "tiny:qwen2_5_text", "--output_dir", str(tmp_path / "run")],
                            cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1] == (
        "error: dataset clevr_synthetic has images or video (column image) but the model has no vision tower: use a "
        "vision-language model, or a text dataset")  # fmt: skip
    from suzak.eval.tasks import get_task

    prompts = eval_fixture_dir / get_task("superclevr").prompt_path
    result = subprocess.run([sys.executable, "-m", "suzak.eval", "superclevr", "--model_path", "tiny:qwen2_5_text",
                             "--image_root", str(eval_fixture_dir), "--prompt_path", str(prompts), "--output_path",
                             str(tmp_path / "sc.json"), "--no_progress"],
                            cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.rstrip().splitlines()[-1] == (
        f"error: model tiny:qwen2_5_text is a text model (no vision tower) but superclevr's questions have images or "
        f"video ({prompts}:1): evaluate it on text questions (gsm8k, with --prompt_path for your own GSM8K-format "
        "file)")  # fmt: skip


@pytest.mark.slow
def test_train_command_on_qwen3_vl(tmp_path, run_env):
    """``python -m suzak.train`` end to end on ``tiny:qwen3_vl``: the recipe's budget, the model's factor, a
    checkpoint whose processor keeps the budget."""
    from conftest import run_ok

    out = tmp_path / "run"
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--model_name_or_path",
            "tiny:qwen3_vl", "--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)], run_env)  # fmt: skip
    config = json.loads((out / "checkpoint-2" / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl"
    saved = json.loads((out / "checkpoint-2" / "processor_config.json").read_text())["image_processor"]
    assert (saved["patch_size"] * saved["merge_size"], saved["size"]["longest_edge"]) == (32, 50176)


# --- what is not a supported family, or not consistent, is one line ------------------------------------------------


def _unknown_family_folder(root: Path) -> Path:
    """A LLaVA checkpoint folder (config.json and a weights file): a VLM of a family suzak does not size images for."""
    from transformers import AutoConfig

    folder = root / "llava"
    AutoConfig.for_model("llava").save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_unknown_family_is_one_line_naming_model_type_and_families(tmp_path):
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor, model_budget

    folder = _unknown_family_folder(tmp_path)
    for call in (lambda: model_budget(ModelConfig(model_name_or_path=str(folder)), 3136, 401408),
                 lambda: load_model_and_processor(ModelConfig(model_name_or_path=str(folder)), None)):  # fmt: skip
        with pytest.raises(SuzakError) as error:
            call()
        message = str(error.value)
        assert "\n" not in message and "model type 'llava'" in message
        assert all(name in message for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5 (Qwen3.5)"))


def test_unknown_family_from_the_command_line(tmp_path, run_env):
    folder = _unknown_family_folder(tmp_path)
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml",
                             "--model_name_or_path", str(folder), "--output_dir", str(tmp_path / "out")], cwd=ROOT,
                            env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr and "loaded " not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: model '{folder}': model type 'llava' is a vision-language"
    )
    assert result.stderr.rstrip().endswith(errors[0])  # the last line, nothing after it


def test_processor_of_another_patch_grid_is_one_line(family_model_dir, tmp_path):
    """A Qwen3-VL folder whose processor config says 14-pixel patches: its images would be fitted to the
    wrong grid, so loading stops, before any weight loads (issue 51: after them)."""
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor

    folder = tmp_path / "mixed"
    shutil.copytree(family_model_dir("qwen3_vl"), folder)
    config = json.loads((folder / "processor_config.json").read_text())
    config["image_processor"]["patch_size"] = 14
    (folder / "processor_config.json").write_text(json.dumps(config))
    from transformers import AutoModelForImageTextToText

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded before the processor's patch grid was checked")

    with (pytest.raises(SuzakError, match="processor makes 28-pixel visual tokens but the model's vision tower 32"),
          pytest.MonkeyPatch.context() as patch):  # fmt: skip
        patch.setattr(AutoModelForImageTextToText, "from_pretrained", no_weights)
        load_model_and_processor(ModelConfig(model_name_or_path=str(folder)), None)


def test_budget_below_one_token_of_the_model(loaded):
    """900 pixels hold one 28x28 token but not one 32x32 token: the Qwen3 families stop, with the number to set."""
    processor, _ = loaded("qwen3_vl")
    assert PixelBudget(100, 900).for_model(loaded("qwen2_vl")[0]).factor == 28
    with pytest.raises(SuzakError, match=r"max_pixels 900 is below one visual token of this model \(32x32 = 1024"):
        PixelBudget(100, 900).for_model(processor)


def test_qwen3_5_thinking_prompt_stops_a_think_answer_run(loaded):
    """Qwen3.5's template opens <think> in the prompt: R1-V's think_answer format would score every completion 0."""
    from suzak.training.checks import check_answer_opening

    processor, _ = loaded("qwen3_5")
    with pytest.raises(SuzakError, match=r"ends every generation prompt with <think> \(Qwen3.5's thinking mode\)"):
        check_answer_opening(processor, "think_answer")
    check_answer_opening(processor, "plain")  # a bare answer is fine inside the thinking block
    check_answer_opening(processor, "think_answer", {"enable_thinking": False})  # the template closes it
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        check_answer_opening(loaded(family)[0], "think_answer")


def test_qwen3_5_grpo_with_think_format_stops_before_step_1(family_model_dir, tmp_path):
    from suzak.scoring.rewards import REWARDS
    from test_trainer import image_dataset, make_trainer

    trainer = make_trainer(family_model_dir("qwen3_5"), tmp_path, image_dataset(4), [REWARDS["think_format"]],
                           budget=PixelBudget(3136, 50176), max_steps=1)  # fmt: skip
    trainer.answer_format = "think_answer"
    with pytest.raises(SuzakError, match="<think>"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_render_prompt_reaches_each_familys_vocabulary(loaded):
    """R1-V's prompt and an ideal answer tokenize compactly in every family's tiny vocabulary."""
    for family in FAMILIES:
        tokenizer = loaded(family)[0].tokenizer
        prompt = render_prompt("r1v", "How many items are there in the image?")
        assert tokenizer.decode(tokenizer(prompt)["input_ids"]) == prompt
        assert all(tokenizer.tokenize(d) == [d] for d in "0123456789")


def test_tiny_command_builds_each_family(tmp_path):
    result = subprocess.run([sys.executable, "-m", "suzak", "tiny", "--output", str(tmp_path / "m"), "--family",
                             "qwen3_5"], cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen3_5"
    bad = subprocess.run([sys.executable, "-m", "suzak", "tiny", "--output", str(tmp_path / "n"), "--family", "qwen4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'qwen4'" in bad.stderr
