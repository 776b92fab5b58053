"""Releases: the dry-run folder, the model card (metadata, eval table beside the published numbers), no secrets,
clear failures (token, upload, bad inputs), and push_to_hub at the end of training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.release.publish import build_release, release_request
from suzak.runs.record import finish_run, save_recipe, start_run
from suzak.training.configs import full_argv, parse_args
from test_metrics import write_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")
SECRETS = {"HF_TOKEN": "hf_FAKEsecret123", "WANDB_API_KEY": "wandbFAKEkey456", "MY_SERVICE_TOKEN": "svcFAKEtok789"}


def assert_no_secrets(*roots: Path, texts: tuple[str, ...] = ()) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                leaked = [v for v in SECRETS.values() if v.encode() in data]
                assert not leaked, f"{path} contains {leaked}"
    for text in texts:
        assert not [v for v in SECRETS.values() if v in text]


@pytest.fixture
def secrets_env(monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    return SECRETS


def make_run_dir(root: Path, tiny_model_dir: Path, recipe: str = SMOKE, model: str = "Qwen/Qwen2.5-VL-3B-Instruct",
                 dataset: str = "clevr_cogen") -> Path:  # fmt: skip
    """A finished run's output dir without training: the tiny model, recipe.yaml, run_info.json, metrics.csv."""
    run = root / "run"
    shutil.copytree(tiny_model_dir, run)
    (run / "optimizer.pt").write_bytes(b"training state, never released")
    argv = ["--config", recipe, "--model_name_or_path", model, "--dataset_name", dataset,
            "--hub_token", SECRETS["HF_TOKEN"], "--output_dir", str(run)]  # fmt: skip
    parsed = parse_args(argv)
    save_recipe(run, full_argv(argv), parsed)
    start_run(run, argv, parsed)
    finish_run(run, global_step=5)
    write_metrics(run)
    return run


def make_eval_results(root: Path) -> Path:
    """A SuperCLEVR results file as suzak writes it: strict 3 / 4, r1v 2 / 4 (R1-V's regex misses ``3.0``)."""
    from suzak.eval.report import write_results
    from suzak.eval.runner import result_row
    from suzak.eval.tasks import EvalItem, get_task

    outputs = ["<answer>3</answer>", "<answer> 3 </answer>", "<answer>3.0</answer>", "<answer>4</answer>"]
    results = [result_row(get_task("superclevr"), EvalItem(i, str(i), {"image_path": f"./images/{i}.png"}, [], 3), o)
               for i, o in enumerate(outputs)]  # fmt: skip
    path = root / "logs" / "superclevr_results_run.json"
    write_results(path, results, "strict", "r1v")
    path.with_suffix(".md").write_text("# superclevr: run\n")
    return path


def online_env(tmp_path, **extra: str) -> dict:
    """The environment of an upload test: the user's, without an HF_HUB_OFFLINE they may have set (an air-gapped
    user's shell has it), with no .env and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return env | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env")} | extra


def run_release(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suzak.release", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env or os.environ.copy(), timeout=300)  # fmt: skip


# --- the dry run ---------------------------------------------------------------------------------------------------


def test_dry_run_release_with_model_card_eval_table_and_no_secret(tmp_path, tiny_model_dir, secrets_env):
    from huggingface_hub import ModelCard

    run, results = make_run_dir(tmp_path, tiny_model_dir), make_eval_results(tmp_path)
    env = os.environ | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env")}
    result = run_release(["--checkpoint", str(run), "--repo_id", "me/qwen-clevr", "--eval_results", str(results),
                          "--dry_run"], env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    release = run / "release"
    assert result.stdout.strip() == (f"dry run: release written to {release}; upload it with "
                                     f"`python -m suzak.release --upload {release} --repo_id me/qwen-clevr`")  # fmt: skip
    files = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json", "processor_config.json", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "README.md", "recipe.yaml", "run_info.json", "metrics.csv",
            "eval/superclevr_results_run.json", "eval/superclevr_results_run.md", "plots/rewards.png"} <= files  # fmt: skip
    assert not {"optimizer.pt", "suzak_tiny.json"} & files  # training state and other files stay home

    card = ModelCard.load(release / "README.md")
    assert card.data.base_model == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert card.data.datasets == ["leonardPKU/clevr_cogen_a_train"]
    assert {"suzak", "grpo", "trl"} <= set(card.data.tags) and card.data.pipeline_tag == "image-text-to-text"
    assert [(e.dataset_type, e.metric_type, e.metric_name, e.metric_value) for e in card.data.eval_results] == [
        ("superclevr", "accuracy", "accuracy (%), strict scoring", 75.0),
        ("superclevr", "accuracy", "accuracy (%), r1v scoring", 50.0)]  # fmt: skip
    text = card.text
    assert "| SuperCLEVR counting, 200 questions (R1-V) | strict | 75.00 | 3 / 4 |" in text
    assert "| SuperCLEVR counting, 200 questions (R1-V) | r1v | 50.00 | 2 / 4 |" in text
    published = text.split("### Published reference numbers")[1].split("## Training")[0]
    assert "| superclevr | Qwen2-VL-2B-Instruct | 48.00 | 82.50 | 50.00 |" in published  # beside the r1v figure
    assert "75.00" not in published and "**(UNVERIFIED)**" in published
    assert "| `clevr_count` | 1.0 |" in text and "3136..50176 pixels (at most 64 visual tokens" in text
    assert (
        "CPU (" in text
        and "optimizer steps | 5" in text
        and "\nhub_token:" not in (release / "recipe.yaml").read_text()
    )
    for png in (p for p in files if p.endswith(".png")):
        assert f"]({png})" in text and (release / png).stat().st_size > 5000
    assert_no_secrets(release, texts=(result.stdout, result.stderr))


def test_release_rebuilds_its_own_folder_and_refuses_others(tmp_path, tiny_model_dir):
    run = make_run_dir(tmp_path, tiny_model_dir)
    first = build_release(run, None, "me/x")
    (first / "stale.txt").write_text("from an earlier release")
    assert not (build_release(run, None, "me/x") / "stale.txt").exists()
    foreign = tmp_path / "my-notes"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(SuzakError, match="not a suzak release folder"):
        build_release(run, foreign, "me/x")
    assert (foreign / "notes.txt").is_file()


def test_release_of_a_checkpoint_reads_its_run_dir(tmp_path, tiny_model_dir):
    run = make_run_dir(tmp_path, tiny_model_dir)
    checkpoint = run / "checkpoint-5"
    checkpoint.mkdir()
    shutil.copy2(run / "model.safetensors", checkpoint)
    shutil.copy2(run / "config.json", checkpoint)  # no processor files in the checkpoint: taken from the run dir
    release = build_release(checkpoint, tmp_path / "rel", "me/x")
    assert (release / "tokenizer.json").is_file() and (release / "recipe.yaml").is_file()
    assert (release / "generation_config.json").is_file()  # derived from config.json when absent


@pytest.mark.parametrize(
    ("setup", "message"),
    [("zero", "holds DeepSpeed ZeRO shards but no safetensors weights: export it first with `suzak export zero"),
     ("bad_eval", "is not an evaluation results file"),
     ("bad_repo", "is not USER/NAME")],
)  # fmt: skip
def test_release_input_errors_are_one_line(tmp_path, tiny_model_dir, setup, message):
    run = make_run_dir(tmp_path, tiny_model_dir)
    evals, repo = [], "me/x"
    if setup == "zero":
        (run / "model.safetensors").unlink()
        (run / "global_step5").mkdir()
    elif setup == "bad_eval":
        evals = [str(tmp_path / "bad.json")]
        Path(evals[0]).write_text('{"acc": 1}')
    else:
        repo = "no-namespace"
    with pytest.raises(SuzakError, match=message.replace("(", r"\(")):
        build_release(run, None, repo, evals)
    assert not (run / "release").exists()


def test_card_rescores_files_that_do_not_name_their_rule(tmp_path):
    """R1-V's own log (no ``scoring``): both rules from its outputs; a file of an unknown task: its accuracy, rule not
    recorded, and no published numbers beside it."""
    from suzak.release.model_card import _eval_section, load_eval_result

    r1v_log = tmp_path / "superclevr_results_r1v_grpo100.json"
    shutil.copy(ROOT / "tests" / "fixtures" / "r1v" / "counting_results_superclevr_200_qwen2vl_2b_instruct_grpo100_legacy.json",
                r1v_log)  # fmt: skip
    entry = load_eval_result(r1v_log, "eval/a.json")
    assert (entry.task, entry.scores, entry.total, entry.accuracy) == (
        "superclevr", {"r1v": (82.5, 165), "strict": (82.5, 165)}, 200, 82.5)  # fmt: skip
    other = tmp_path / "mytask_results_run.json"
    other.write_text(json.dumps({"accuracy": 50.0, "results": [{"is_correct": True}, {"is_correct": False}]}))
    unknown = load_eval_result(other, "eval/b.json")
    assert unknown.scores == {None: (50.0, 1)}
    text = "\n".join(_eval_section([entry, unknown]))
    assert "| SuperCLEVR counting, 200 questions (R1-V) | r1v | 82.50 | 165 / 200 |" in text
    assert "| mytask | not recorded | 50.00 | 1 / 2 |" in text
    assert "| superclevr | Qwen2-VL-2B-Instruct | 48.00 | 82.50 | 82.50 |" in text and "| mytask |" not in (
        text.split("### Published")[1])  # fmt: skip
    broken = tmp_path / "geoqa_results_old.json"
    broken.write_text(json.dumps({"accuracy": 0.0, "results": [{"ground_truth": "1"}]}))
    with pytest.raises(SuzakError, match=r"geoqa_results_old\.json: results\[0\] has no 'model_output'"):
        load_eval_result(broken, "eval/c.json")


# --- tokens and uploads --------------------------------------------------------------------------------------------


def test_missing_token_is_one_line_before_any_work(tmp_path, tiny_model_dir):
    run = make_run_dir(tmp_path, tiny_model_dir)
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env |= {"HF_HOME": str(tmp_path / "hf-home"), "SUZAK_ENV_FILE": str(tmp_path / "absent.env")}
    result = run_release(["--checkpoint", str(run), "--repo_id", "me/x"], env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: no Hugging Face token: set HF_TOKEN in .env")
    assert not (run / "release").exists()


class FakeHub(BaseHTTPRequestHandler):
    """Answers every request with one status, like a Hub that rejects the token or fails."""

    status = 401

    def _answer(self):
        body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args):  # keep test output quiet
        return


@pytest.mark.parametrize(("status", "reason"), [(401, "HTTP 401: the Hub rejected HF_TOKEN"), (500, "failed (")])
def test_failed_upload_keeps_folder_and_prints_retry(tmp_path, tiny_model_dir, secrets_env, status, reason):
    run = make_run_dir(tmp_path, tiny_model_dir)
    handler = type("Hub", (FakeHub,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = online_env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}", HF_HUB_DISABLE_TELEMETRY="1")
    try:
        result = run_release(["--checkpoint", str(run), "--repo_id", "me/x", "--private"], env)
    finally:
        server.shutdown()
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("error: upload to me/x failed") and reason in last
    release = run / "release"
    assert last.endswith(f"the release folder is kept at {release}; retry with "
                         f"`python -m suzak.release --upload {release} --repo_id me/x --private`")  # fmt: skip
    assert (release / "model.safetensors").is_file() and (release / "README.md").is_file()
    assert_no_secrets(texts=(result.stdout, result.stderr))


def test_unreachable_hub_keeps_folder(tmp_path, tiny_model_dir, secrets_env):
    run = make_run_dir(tmp_path, tiny_model_dir)
    release = build_release(run, None, "me/x")
    env = online_env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    result = run_release(["--upload", str(release), "--repo_id", "me/x"], env)
    assert result.returncode == 1 and "is unreachable, nothing was uploaded" in result.stderr
    assert f"retry with `python -m suzak.release --upload {release} --repo_id me/x`" in result.stderr


def test_upload_with_hf_hub_offline_set_names_the_variable(tmp_path, tiny_model_dir, secrets_env):
    """An air-gapped user's HF_HUB_OFFLINE=1 is named as the reason, not mistaken for a network failure."""
    run = make_run_dir(tmp_path, tiny_model_dir)
    release = build_release(run, None, "me/x")
    env = online_env(tmp_path, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="1")
    result = run_release(["--upload", str(release), "--repo_id", "me/x"], env)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "HF_HUB_OFFLINE is set, so nothing was uploaded" in last
    assert "unreachable" not in last and (release / "README.md").is_file()


# --- push_to_hub in training ---------------------------------------------------------------------------------------


def test_push_to_hub_needs_a_repo_and_a_token_before_training(monkeypatch, tmp_path):
    import huggingface_hub

    monkeypatch.delenv("HUB_MODEL_ID", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    _, grpo, _ = parse_args(["--config", SMOKE, "--push_to_hub", "true"])
    with pytest.raises(SuzakError, match="no repo id"):
        release_request(grpo)
    monkeypatch.setenv("HUB_MODEL_ID", "me/from-env")
    with pytest.raises(SuzakError, match="no Hugging Face token"):
        release_request(grpo)
    request = release_request(grpo, dry_run=True)
    assert (request.repo_id, request.dry_run) == ("me/from-env", True)
    monkeypatch.setenv("HF_TOKEN", "hf_FAKEsecret123")
    _, grpo, _ = parse_args(["--config", SMOKE, "--push_to_hub", "true", "--hub_model_id", "me/cli"])
    assert release_request(grpo).repo_id == "me/cli"  # the recipe / CLI wins over HUB_MODEL_ID
    assert release_request(parse_args(["--config", SMOKE])[1]) is None


# --- end to end: a run with planted secrets ------------------------------------------------------------------------


@pytest.mark.slow
def test_secrets_never_leave_the_process(tmp_path, tiny_model_dir):
    """Fake secrets in the environment and in .env; a W&B (offline) run with completions tables, push_to_hub as a dry
    run, then a release with eval results: no secret value in any file written or any line printed."""
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"WANDB_API_KEY={SECRETS['WANDB_API_KEY']}\nMY_SERVICE_TOKEN={SECRETS['MY_SERVICE_TOKEN']}\n")
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    wandb_dirs = {"WANDB_DIR": tmp_path / "wandb", "WANDB_DATA_DIR": tmp_path / "wandb-data",
                  "WANDB_CACHE_DIR": tmp_path / "wandb-cache", "WANDB_CONFIG_DIR": tmp_path / "wandb-config"}  # fmt: skip
    for folder in wandb_dirs.values():
        folder.mkdir()
    env |= {"HF_TOKEN": SECRETS["HF_TOKEN"], "SUZAK_ENV_FILE": str(env_file), "WANDB_MODE": "offline",
            "HF_HOME": str(tmp_path / "hf-home"), "PYTHONUNBUFFERED": "1"} | {k: str(v) for k, v in wandb_dirs.items()}  # fmt: skip
    out = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--model_name_or_path", str(tiny_model_dir),
         "--output_dir", str(out), "--max_steps", "2", "--report_to", "wandb", "--log_completions", "true",
         "--push_to_hub", "true", "--hub_model_id", "x/y", "--release_dry_run", "true"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    assert (out / "release" / "README.md").is_file() and (out / "release" / "model.safetensors").is_file()
    assert "dry run: release for x/y written to" in train.stderr
    assert list((tmp_path / "wandb").rglob("completions_*.table.json")), "W&B got no completions table"
    staged = [p for p in (tmp_path / "wandb-data").rglob("*") if p.is_file()]  # the tables' media, synced later
    assert any(p.read_bytes()[:4] == b"\x89PNG" for p in staged), "the completions tables carry no images"
    assert json.loads((out / "run_info.json").read_text())["launches"][0]["status"] == "completed"

    results = make_eval_results(tmp_path)
    release = run_release(["--checkpoint", str(out), "--repo_id", "x/y", "--eval_results", str(results), "--dry_run",
                           "--output", str(tmp_path / "release")], env)  # fmt: skip
    assert release.returncode == 0, release.stderr[-3000:]
    assert "| SuperCLEVR counting" in (tmp_path / "release" / "README.md").read_text()
    assert_no_secrets(
        out,
        tmp_path / "release",
        *wandb_dirs.values(),
        texts=(train.stdout, train.stderr, release.stdout, release.stderr),
    )


def test_release_of_a_lora_adapter(tmp_path, tiny_model_dir):
    from huggingface_hub import ModelCard
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    adapter = tmp_path / "adapter"
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    release = build_release(adapter, None, "me/lora")
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= {p.name for p in release.iterdir()}
    card = ModelCard.load(release / "README.md")
    assert card.data.library_name == "peft" and "lora" in card.data.tags
    assert 'PeftModel.from_pretrained(model, "me/lora")' in card.text


def test_hub_token_reaches_no_file_and_the_release_still_gets_it(tmp_path, tiny_model_dir, monkeypatch):
    """``--hub_token`` on the command line: the Trainer pickles its arguments into ``training_args.bin`` (output dir and
    every checkpoint), so the token is taken for the release and cleared first. Every byte written is scanned; the
    upload (faked: no network) still gets the token."""
    import suzak.release.publish
    from suzak.train import main

    token = "hf_CLIonlyFAKEtoken42"
    uploads = []
    monkeypatch.setattr(suzak.release.publish, "upload_release",
                        lambda folder, repo_id, *, private=False, token=None: uploads.append((repo_id, token)) or "url")  # fmt: skip
    for name in ("HF_TOKEN", "HUB_MODEL_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))
    out = tmp_path / "run"
    main(["--config", SMOKE, "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--max_steps", "2",
          "--save_steps", "1", "--push_to_hub", "true", "--hub_model_id", "me/qwen-clevr", "--hub_token", token])  # fmt: skip
    written = [p for p in out.rglob("*") if p.is_file()]
    assert {"training_args.bin", "checkpoint-1/training_args.bin", "checkpoint-2/training_args.bin",
            "release/README.md"} <= {p.relative_to(out).as_posix() for p in written}  # fmt: skip
    assert [p for p in written if token.encode() in p.read_bytes()] == []
    assert uploads == [("me/qwen-clevr", token)]


def test_a_mixtures_card_names_each_source_and_its_held_out_figures(tmp_path, tiny_model_dir):
    """A mixture run's card says what it trained on: each source's dataset, options, weight and share, template,
    rewards and own pixel budget (not the unused one-dataset defaults), the Hub datasets behind the sources, and
    each source's held-out accuracy at the first and last evaluation (metrics.csv)."""
    from huggingface_hub import ModelCard

    from suzak.runs.streams import CSVStream

    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run)
    sources = [{"name": "geo", "dataset": "geoqa_r1v", "prompt_template": "r1v", "rewards": ["math_accuracy"]},
               {"name": "boxes", "dataset": "grounding_shapes", "options": {"num_rows": 32}, "weight": 3,
                "prompt_template": "rec", "rewards": ["iou", "box_format"], "reward_weights": [1.0, 0.5],
                "max_pixels": 100352}]  # fmt: skip
    argv = ["--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps(sources), "--output_dir", str(run)]
    parsed = parse_args(argv)
    save_recipe(run, full_argv(argv), parsed)
    start_run(run, argv, parsed)
    finish_run(run, global_step=4)
    stream = CSVStream(run / "metrics.csv")
    for step, geo, boxes in ((0, 0.25, 0.0), (2, 0.5, 0.125), (4, 0.75, 0.5)):
        stream.append([{"step": step, "eval/accuracy": (geo + boxes) / 2, "eval/geo/accuracy": geo,
                        "eval/boxes/accuracy": boxes}])  # fmt: skip
    build_release(run, run / "release", "me/mixed", [])
    card = ModelCard.load(run / "release" / "README.md")
    assert card.data.datasets == ["leonardPKU/GEOQA_R1V_Train_8K"]
    text = card.text
    assert "| datasets | a mixture of 2 sources: geo, boxes (below) |" in text and "clevr_synthetic" not in text
    assert "| geo | `geoqa_r1v` | {} | 1 (25%) | `r1v` | `math_accuracy` (1.0) | none | 3136..50176 |" in text
    assert ("| boxes | `grounding_shapes` | {\"num_rows\": 32} | 3 (75%) | `rec` | `iou` (1.0), `box_format` (0.5) | "
            "none | 3136..100352 |") in text  # fmt: skip
    assert "each source's own (below), within 3136..100352 pixels" in text and "`clevr_count`" not in text
    assert "| all | 0.125 (0) | 0.625 (4) |" in text
    assert "| geo | 0.250 (0) | 0.750 (4) |" in text and "| boxes | 0.000 (0) | 0.500 (4) |" in text
