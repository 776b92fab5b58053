"""``deepspeed: auto``'s memory arithmetic (suzak.models.memory) against every GPU row the benchmarks measured, and
the choices it makes for the shapes and machines those rows came from."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.models.memory import ModelShape, Workload, choose, peak_gib, prompt_tokens_bound, usable_gib

ROOT = Path(__file__).resolve().parents[1]
GPU_GIB = {"NVIDIA H100 80GB HBM3": 79.19, "NVIDIA H200": 140.4}  # torch's total_memory of the machines measured
MARGIN = 0.06  # every prediction within 6% of the measured peak


@pytest.fixture(scope="module")
def shapes() -> dict[str, ModelShape]:
    sys.path.insert(0, str(ROOT / "bench"))
    from shapes import SHAPES, VISION
    from transformers import Qwen2_5_VLConfig

    return {name: ModelShape.of(Qwen2_5_VLConfig(text_config=text, tie_word_embeddings=text["tie_word_embeddings"],
                                                 vision_config=VISION | {"out_hidden_size": text["hidden_size"]}))
            for name, text in SHAPES.items()}  # fmt: skip


def _speed_rows():
    for line in (ROOT / "bench" / "results_grpo_speed.jsonl").read_text().splitlines():
        row = json.loads(line)
        if (
            row.get("status") == "ok"
            and row.get("device") in GPU_GIB
            and row.get("deepspeed") in ("zero2", "zero2_offload")
        ):
            yield row


def test_the_shapes_have_the_parameters_the_benchmark_counted(shapes):
    counted = {row["shape"]: row["params"] for row in _speed_rows()}
    assert counted["3b"] == shapes["3b"].params == 3_754_622_976


def test_predicted_peaks_match_every_measured_gpu_row(shapes):
    checked = []
    for row in _speed_rows():
        beta = 0.0 if "--beta 0" in row["overrides"] else row["beta"]
        work = Workload(row["completions"], round(row["prompt_tokens"]), row["completion_tokens"], beta,
                        0.3 if row["generation"] == "vllm" else 0.0)  # fmt: skip
        predicted = peak_gib(shapes[row["shape"]], work, row["deepspeed"], GPU_GIB[row["device"]])
        checked.append((row["device"], row["deepspeed"], row["completions"], row["peak_gib"], round(predicted, 1)))
        assert predicted == pytest.approx(row["peak_gib"], rel=MARGIN), checked[-1]
    for line in (ROOT / "bench" / "results_grpo_memory.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["status"] == "ok" and row["deepspeed"] in ("zero2", "zero2_offload"):
            work = Workload(row["batch_completions"], 178, row["completion_tokens"], row["beta"])  # 99 visual tokens
            predicted = peak_gib(shapes[row["shape"]], work, row["deepspeed"], GPU_GIB[row["device"]])
            assert predicted == pytest.approx(row["peak_allocated_gib"], rel=MARGIN)
            checked.append(row["deepspeed"])
    assert len(checked) >= 8 and {c[1] for c in checked[:-1] if isinstance(c, tuple)} == {"zero2", "zero2_offload"}


def test_auto_keeps_the_optimizer_on_an_h200_for_3b_with_vllm(shapes):
    plan = choose(shapes["3b"], Workload(64, 177, 256, 0.04, 0.3), GPU_GIB["NVIDIA H200"], host_ram_gib=125)
    assert (plan.deepspeed, plan.fits, plan.config_path) == ("zero2", True, "ds_configs/zero2.json")
    assert "fastest" in plan.line() and "--deepspeed PATH overrides" in plan.line()


def test_auto_offloads_where_the_h100_ran_out_of_memory(shapes):
    # results_grpo_memory.jsonl: 3B ZeRO-2 on one H100 (HF generation, 8 completions) was out of memory
    hf = Workload(8, 178, 256, 0.04)
    assert peak_gib(shapes["3b"], hf, "zero2", 79.19) > usable_gib(79.19)
    for work in (hf, Workload(64, 177, 256, 0.04, 0.3)):
        plan = choose(shapes["3b"], work, 79.19, host_ram_gib=125)
        assert (plan.deepspeed, plan.fits) == ("zero2_offload", True) and "host RAM" in plan.why


def test_auto_says_when_nothing_fits_and_shards_on_eight_gpus(shapes):
    # results_grpo_memory.jsonl: 7B with optimizer offload was killed at 128 GiB of host RAM on one H100
    alone = choose(shapes["7b"], Workload(8, 178, 256, 0.04), 79.19, host_ram_gib=125)
    assert (alone.deepspeed, alone.fits) == ("zero2_offload", False) and "use LoRA" in alone.why
    eight = choose(shapes["7b"], Workload(8, 640, 512, 0.04, gpus=8), 79.19, host_ram_gib=1000, gpus_per_node=8)
    assert (eight.deepspeed, eight.fits) == ("zero2", True)
    lora = choose(shapes["7b"], Workload(8, 640, 512, 0.04, trains_all_weights=False), 79.19, host_ram_gib=125)
    assert (lora.deepspeed, lora.fits) == ("zero2", True) and "adapters" in lora.why


def test_prompt_bound_is_a_full_pixel_budget_of_visual_tokens():
    assert prompt_tokens_bound(401408, 28) == 512 + 128 and prompt_tokens_bound(401408, None) == 128


def test_deepspeed_auto_without_a_gpu_is_one_line():
    from suzak.training.configs import parse_args

    with pytest.raises(SuzakError, match="deepspeed auto: no GPU here"):
        parse_args(["--config", "recipes/smoke.yaml", "--deepspeed", "auto"])


def test_deepspeed_auto_picks_a_config_on_a_gpu(monkeypatch, caplog):
    """With a GPU (its size faked), ``deepspeed: auto`` becomes the chosen config's flag, said in one line."""
    from argparse import Namespace

    import torch

    from suzak.training.configs import _resolve_auto_deepspeed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: Namespace(total_memory=80 * 2**30))
    caplog.set_level("INFO")
    namespace = Namespace(deepspeed="auto", model_name_or_path="tiny", model_revision="main", use_vllm=False,
                          per_device_train_batch_size=8, max_pixels=401408, max_completion_length=256, beta=0.04,
                          gradient_checkpointing=False, use_peft=False)  # fmt: skip
    assert _resolve_auto_deepspeed(namespace, ["--x"]) == ["--x", "--deepspeed", "ds_configs/zero2.json"]
    assert "deepspeed auto -> ds_configs/zero2.json: predicted peak 3 GiB of 80 GiB per GPU" in caplog.text
    assert _resolve_auto_deepspeed(Namespace(deepspeed="ds_configs/zero3.json"), ["--x"]) == ["--x"]


def test_an_8bit_optimizer_and_vllms_sleep_mode_are_counted_and_suggested(shapes):
    """The optimizer term is ZeRO-2's fp32 master weights and gradients (8 bytes a parameter) plus the optimizer's
    state by ``optim`` (AdamW 8, 8-bit AdamW 2); with vLLM's sleep mode its share and the training pass's
    activations are not held at once. Where AdamW's state does not fit, the plan says which of the two would."""
    from dataclasses import replace

    from suzak.models.memory import GIB, activation_gib, optimizer_gib, optimizer_state_bytes

    three, h100 = shapes["3b"], GPU_GIB["NVIDIA H100 80GB HBM3"]
    adamw = Workload(64, 177, 256, 0.0, 0.3)
    eight_bit = replace(adamw, optimizer_state_bytes=optimizer_state_bytes("adamw_bnb_8bit"))
    asleep = replace(adamw, vllm_sleeps=True)
    assert optimizer_gib(three, adamw) == pytest.approx(16 * three.params / GIB)
    assert peak_gib(three, adamw, "zero2", h100) - peak_gib(three, eight_bit, "zero2", h100) == pytest.approx(
        6 * three.params / GIB)  # fmt: skip
    vllm, activations = 0.3 * h100, activation_gib(three, adamw)
    assert peak_gib(three, adamw, "zero2", h100) - peak_gib(three, asleep, "zero2", h100) == pytest.approx(
        vllm + activations - max(vllm, activations))  # fmt: skip
    # 3B, 64 completions, vLLM colocated, beta 0 on an H100: AdamW's state goes to host RAM; both changes keep it
    plan = choose(three, adamw, h100, host_ram_gib=125)
    assert plan.deepspeed == "zero2_offload" and re.search(
        r"\(with vllm_enable_sleep_mode: true and optim: adamw_bnb_8bit it would stay on the GPU: \d+ GiB\)",
        plan.why), plan.why  # fmt: skip
    both = choose(three, replace(eight_bit, vllm_sleeps=True), h100, host_ram_gib=125)
    assert (both.deepspeed, both.fits) == ("zero2", True)
    # HF generation (no vLLM to put to sleep): the 8-bit state alone is the suggestion
    hf = choose(three, Workload(8, 178, 256, 0.04), h100, host_ram_gib=125)
    assert "(with optim: adamw_bnb_8bit it would stay on the GPU" in hf.why and "sleep" not in hf.why
    # 7B on one H100: nothing keeps it on the GPU, and no suggestion is made
    assert "would stay on the GPU" not in choose(shapes["7b"], Workload(8, 178, 256, 0.04), h100, 125).why


def test_gpu_memory_gib_caps_torch_and_the_plan_and_its_mistakes_are_one_line(monkeypatch, caplog):
    """``gpu_memory_gib``: torch's allocator capped to it (its fraction of the card), ``deepspeed auto`` planning
    against it with vLLM's share still a fraction of the card; a cap above the card, at 0, or without a GPU is one
    line."""
    from argparse import Namespace

    import torch

    from suzak.models.memory import cap_gpu_memory
    from suzak.training.configs import _resolve_auto_deepspeed, parse_args

    with pytest.raises(SuzakError, match=r"^gpu_memory_gib 80: no GPU here; leave it unset on the CPU$"):
        parse_args(["--config", "recipes/smoke.yaml", "--gpu_memory_gib", "80"])
    capped = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: Namespace(total_memory=140 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: capped.append((f, d)))
    assert cap_gpu_memory(80, 0) == pytest.approx(80 / 140) and capped == [(pytest.approx(80 / 140), 0)]
    for gib, said in ((150, r"gpu_memory_gib 150 is more than GPU 0 has \(140.0 GiB\)"), (0, "must be above 0")):
        with pytest.raises(SuzakError, match=said):
            cap_gpu_memory(gib, 0)
    caplog.set_level("INFO")
    recipe = dict(deepspeed="auto", model_name_or_path="tiny", model_revision="main", use_vllm=True,
                  vllm_mode="colocate", per_device_train_batch_size=8, max_pixels=401408, max_completion_length=256,
                  beta=0.0, gradient_checkpointing=True, use_peft=False, vllm_gpu_memory_utilization=0.3 * 80 / 140)  # fmt: skip
    _resolve_auto_deepspeed(Namespace(**recipe, gpu_memory_gib=80.0), [])
    _resolve_auto_deepspeed(Namespace(**recipe), [])
    capped_line, card_line = re.findall(r"predicted peak (\d+) GiB of (\d+) GiB", caplog.text)
    assert capped_line[1] == "80" and card_line[1] == "140" and capped_line[0] == card_line[0]


def test_a_token_budget_caps_the_activations_the_plan_counts(shapes):
    """``max_tokens_per_micro_batch``: a pass holds at most the budget's tokens (one row at least), so the plan
    counts those (as completion tokens too, an upper bound): 3B with 64 completions a pass without gradient
    checkpointing needs optimizer offload on an H200, 2,048 tokens a pass keep the optimizer on the GPU."""
    from dataclasses import replace

    from suzak.models.memory import activation_gib, pass_tokens

    full = Workload(64, 177, 256, 0.04, 0.3, gradient_checkpointing=False)
    cut = replace(full, tokens_per_pass=2048)
    assert pass_tokens(cut) == (2048, 2048) and pass_tokens(replace(full, tokens_per_pass=10)) == (433, 433)
    assert activation_gib(shapes["3b"], cut) < activation_gib(shapes["3b"], full) / 4
    h200 = GPU_GIB["NVIDIA H200"]
    assert choose(shapes["3b"], full, h200, host_ram_gib=125).deepspeed == "zero2_offload"
    assert choose(shapes["3b"], cut, h200, host_ram_gib=125).deepspeed == "zero2"
