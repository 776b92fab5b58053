"""LoRA on MoE experts (``lora_target_parameters``) on the tiny Qwen3.5 MoE, and the check that every LoRA target
matches something: counts by PEFT's rules, a GRPO run that trains the experts' adapters, one line for a target that
matches nothing (training and ``python -m suzak.models.lora_targets``)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl import ModelConfig, get_peft_config

from suzak import SuzakError
from suzak.models.lora_targets import check_lora_targets, count_targets

ROOT = Path(__file__).resolve().parents[1]
MOE = "tiny:qwen3_5_moe"
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
LAYERS = ["model.language_model.layers.0", "model.language_model.layers.1"]
# The tiny MoE: 2 layers of 4 experts, hidden 64, expert width 32 (gate and up fused: 2 x 32).
EXPERT_WEIGHTS = {"mlp.experts.gate_up_proj": 2 * 4 * 64 * 64, "mlp.experts.down_proj": 2 * 4 * 64 * 32}


@pytest.fixture(scope="module")
def moe(run_env):
    """The tiny Qwen3.5 MoE through ``tiny:qwen3_5_moe`` (built once into the session's cache) and the loader."""
    from suzak.models.loading import load_model_and_processor

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SUZAK_CACHE", run_env["SUZAK_CACHE"])
        model, processor = load_model_and_processor(ModelConfig(model_name_or_path=MOE), SimpleNamespace())
    return model, processor


def test_tiny_moe_is_qwen3_5_moe_with_fused_experts(moe):
    model, processor = moe
    assert (
        type(model).__name__ == "Qwen3_5MoeForConditionalGeneration" and type(processor).__name__ == "Qwen3VLProcessor"
    )
    text = model.config.text_config
    assert (text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size) == (4, 2, 32)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if ".mlp.experts." in n}
    assert shapes == {f"{layer}.{name}": shape for layer in LAYERS for name, shape in
                      [(EXPERTS[0], (4, 64, 64)), (EXPERTS[1], (4, 64, 32))]}  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        {"target_parameters": EXPERTS},
        {"target_modules": ["q_proj", "v_proj", "shared_expert.down_proj"], "target_parameters": EXPERTS},
        {"target_modules": r".*language_model.*\.(q_proj|o_proj)"},
        {"target_modules": "all-linear", "exclude_modules": ["out_proj"]},
    ],
    ids=["parameters", "modules+parameters", "regex", "all-linear"],
)
def test_counts_are_what_peft_adapts(moe, config):
    """count_targets against PEFT's own injection: the same modules and parameters, target by target."""
    model, _ = moe
    lora = LoraConfig(r=2, **config)
    rows = count_targets(model, lora.target_modules, lora.target_parameters, peft_config=lora)
    wrapped = get_peft_model(copy.deepcopy(model), copy.deepcopy(lora)).base_model
    modules = sorted(name for row in rows if row.flag == "lora_target_modules" for name in row.matched)
    parameters = sorted(name for row in rows if row.flag == "lora_target_parameters" for name in row.matched)
    assert modules == sorted(wrapped.targeted_module_names)
    assert parameters == sorted(getattr(wrapped, "targeted_parameter_names", []))
    assert all(row.matched and row.parameters > 0 for row in rows)


def test_expert_parameters_are_counted_exactly(moe):
    rows = count_targets(moe[0], None, EXPERTS)
    assert [(r.flag, r.target, r.matched, r.parameters) for r in rows] == [
        ("lora_target_parameters", name, [f"{layer}.{name}" for layer in LAYERS], EXPERT_WEIGHTS[name])
        for name in sorted(EXPERTS)
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            {"lora_target_modules": ["q_projx", "v_proj"]},
            ["lora_target_modules 'q_projx' matches no module", "closest names in the model: q_proj"],
        ),
        (
            {"lora_target_parameters": ["mlp.expert.gate_up"], "lora_dropout": 0.0},
            ["lora_target_parameters 'mlp.expert.gate_up' matches no parameter", "mlp.experts.gate_up_proj"],
        ),
        (
            {"lora_target_modules": ["q_proj"]},  # TRL makes PEFT's whole-name regex of a one-name list
            ["lora_target_modules 'q_proj' matches no module", r"write '.*\.q_proj' or name two modules"],
        ),
        (
            {"lora_target_parameters": EXPERTS},  # TRL's lora_dropout 0.05: PEFT's ParamWrapper raises (a traceback)
            ["lora_target_parameters needs lora_dropout 0", "add --lora_dropout 0"],
        ),
    ],  # fmt: skip
    ids=["typo-module", "typo-parameter", "one-module-name", "dropout"],
)
def test_check_is_one_line_naming_the_flag_and_a_close_name(moe, flags, expected):
    peft_config = get_peft_config(ModelConfig(model_name_or_path=MOE, use_peft=True, **flags))
    with pytest.raises(SuzakError) as error:
        check_lora_targets(moe[0], peft_config)
    message = str(error.value)
    assert "\n" not in message and all(part in message for part in expected), message


def test_check_logs_the_counts_when_every_target_matches(moe, caplog):
    peft_config = get_peft_config(ModelConfig(model_name_or_path=MOE, use_peft=True, lora_dropout=0.0,
                                              lora_target_modules=["q_proj", "v_proj"], lora_target_parameters=EXPERTS))  # fmt: skip
    with caplog.at_level("INFO", logger="suzak.models.lora_targets"):
        rows = check_lora_targets(moe[0], peft_config)
    assert [(r.target, len(r.matched)) for r in rows] == [
        ("q_proj", 1),
        ("v_proj", 1),
        (EXPERTS[1], 2),
        (EXPERTS[0], 2),
    ]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "suzak.models.lora_targets"]
    assert "lora_target_parameters mlp.experts.gate_up_proj: 2 parameters (32,768 weights)" in line
    assert check_lora_targets(moe[0], None) == []  # no LoRA: nothing to check


def test_use_peft_with_no_target_adapts_the_language_models_linear_layers(moe, caplog):
    """PEFT has no default target for the Qwen VL families: ``use_peft: true`` alone puts LoRA on every linear layer
    of the language model (attention, linear attention, MLP; not the vision tower, not the output head), said in one
    line, as LLaMA-Factory and ms-swift users expect; PEFT then wraps exactly those."""
    model = moe[0]
    peft_config = get_peft_config(ModelConfig(model_name_or_path=MOE, use_peft=True))
    with caplog.at_level("INFO", logger="suzak.models.lora_targets"):
        (row,) = check_lora_targets(model, peft_config)
    linear = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    vision = {name for name in linear if ".visual." in f".{name}."}
    assert vision and "lm_head" in linear  # (the model has both: the test could fail)
    assert set(row.matched) == linear - vision - {"lm_head"} and row.target == peft_config.target_modules
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("use_peft with no"))
    assert f"LoRA on the language model's {len(row.matched)} linear layers (" in line and "vision tower" in line
    wrapped = get_peft_model(copy.deepcopy(model), peft_config)
    adapted = {name.split(".lora_A")[0].removeprefix("base_model.model.") for name, _ in wrapped.named_parameters()
               if ".lora_A." in name}  # fmt: skip
    assert adapted == set(row.matched)
    named = get_peft_config(
        ModelConfig(model_name_or_path=MOE, use_peft=True, lora_target_modules=["q_proj", "o_proj"])
    )
    assert [r.target for r in check_lora_targets(model, named)] == ["o_proj", "q_proj"]  # named targets stay


def _grpo_args(tmp_path, *flags):
    from suzak.train import parse_args

    return parse_args([
        "--config", "recipes/smoke.yaml", "--model_name_or_path", MOE, "--output_dir", str(tmp_path / "out"),
        "--max_steps", "2", "--save_strategy", "no", "--prompt_template", "plain", "--preflight_rows", "0",
        "--rewards", "test_trainer.length_reward", "--reward_weights", "1.0", "--dataset_options", '{"num_rows": 8}',
        "--use_peft", "true", "--lora_r", "4", *flags,
    ])  # fmt: skip


@pytest.fixture
def train_env(run_env, monkeypatch, tmp_path):
    for name in ("MODEL", "DATASET", "OUTPUT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SUZAK_CACHE", run_env["SUZAK_CACHE"])
    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))


def test_grpo_lora_on_the_experts_trains_their_adapters(train_env, tmp_path):
    """Two GRPO steps with --lora_target_parameters: every expert adapter changes, the experts themselves do not; the
    saved adapter holds them and ``suzak export lora`` merges them into the experts."""
    from peft.tuners.lora.layer import ParamWrapper
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from suzak.release.export import export_lora
    from suzak.train import build_trainer

    trainer = build_trainer(*_grpo_args(tmp_path, "--learning_rate", "1e-2", "--lora_dropout", "0",
                                        "--lora_target_parameters", *EXPERTS))  # fmt: skip
    wrappers = {name: m.parameter_name for name, m in trainer.model.named_modules() if isinstance(m, ParamWrapper)}
    assert sorted(wrappers.values()) == ["down_proj", "down_proj", "gate_up_proj", "gate_up_proj"]
    adapters = {f"{name}.{ab}.default.weight" for name in wrappers for ab in ("lora_A", "lora_B")}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2 and any("loss" in log for log in trainer.state.log_history)
    after = dict(trainer.model.named_parameters())
    assert {n for n, p in after.items() if p.requires_grad} == adapters
    assert {n for n in before if not torch.equal(before[n], after[n].detach())} == adapters  # and nothing else
    trainer.save_model(str(tmp_path / "adapter"))
    with safe_open(str(tmp_path / "adapter" / "adapter_model.safetensors"), "pt") as saved:
        expert_keys = [key for key in saved.keys() if ".mlp.experts." in key]
    assert len(expert_keys) == 8, expert_keys
    merged = AutoModelForImageTextToText.from_pretrained(export_lora(tmp_path / "adapter", tmp_path / "merged"))
    tokens = torch.arange(5, 25).unsqueeze(0)  # (1, 20)
    with torch.no_grad():
        trained = trainer.model.eval()(input_ids=tokens).logits  # (1, 20, V)
        assert torch.allclose(merged(input_ids=tokens).logits, trained, atol=1e-5)
        with trainer.model.disable_adapter():  # the base model: the experts' adapters made a difference
            assert not torch.allclose(trainer.model(input_ids=tokens).logits, trained, atol=1e-3)


def _flags(tmp_path) -> list[str]:
    return ["--config", "recipes/smoke.yaml", "--model_name_or_path", MOE, "--output_dir", str(tmp_path / "out"),
            "--max_steps", "1", "--prompt_template", "plain", "--preflight_rows", "0", "--rewards", "think_format",
            "--reward_weights", "1.0", "--dataset_options", '{"num_rows": 4}', "--use_peft", "true"]  # fmt: skip


def test_a_target_that_matches_nothing_stops_training_before_step_1(run_env, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "suzak.train", *_flags(tmp_path), "--lora_dropout", "0",
         "--lora_target_modules", "q_proj", "v_proj", "--lora_target_parameters", "mlp.experts.gate_up_proj",
         "mlp.expert.down"],
        cwd=ROOT, env=run_env | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env")}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "lora_target_parameters 'mlp.expert.down' matches no parameter" in line
    assert "closest names in the model: mlp.experts.down_proj" in line and "gate_up_proj'" not in line
    assert not re.search(r"^step \d", result.stdout, re.M) and not list((tmp_path / "out").glob("checkpoint-*"))


def _cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suzak.models.lora_targets", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_cli_counts_and_exits_2_on_a_target_that_matches_nothing(run_env):
    result = _cli(run_env, MOE, "--targets", "q_proj", "v_proj", "--parameters", *EXPERTS)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()  # (DeepSpeed prints its accelerator line to stdout when it is first imported)
    table = [line.split() for line in lines[lines.index(f"{MOE} (Qwen3_5MoeForConditionalGeneration): what each "
                                                        "LoRA target matches") + 1 :]]  # fmt: skip
    assert table == [
        ["flag", "target", "matches", "parameters"],
        ["lora_target_modules", "q_proj", "1", "8,192"],
        ["lora_target_modules", "v_proj", "1", "2,048"],
        ["lora_target_parameters", "mlp.experts.down_proj", "2", "16,384"],
        ["lora_target_parameters", "mlp.experts.gate_up_proj", "2", "32,768"],
    ]
    bad = _cli(run_env, MOE, "--parameters", "mlp.experts.gate_up_proj", "mlp.expert.gate_up")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert "mlp.expert.gate_up  " in bad.stdout  # the table still shows what did match and what did not
    (line,) = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert "lora_target_parameters 'mlp.expert.gate_up' matches no parameter" in line
    assert "closest names in the model: mlp.experts.gate_up_proj" in line


def test_cli_on_a_hub_id_offline_is_the_loaders_one_line(run_env, tmp_path):
    env = run_env | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    result = _cli(env, "Qwen/Qwen3.5-35B-A3B", "--parameters", *EXPERTS)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "cannot load model 'Qwen/Qwen3.5-35B-A3B': the Hub is unreachable and it is not in the local cache" in line
