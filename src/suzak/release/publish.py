"""Publishing a trained model to the Hugging Face Hub, with a model card.

    python -m suzak.release --checkpoint outputs/run --repo_id you/qwen2.5-vl-7b-clevr-grpo \\
        [--private] [--eval_results logs/superclevr_results_run.json ...] [--dry_run] [--output DIR]
    python -m suzak.release --upload outputs/run/release --repo_id you/qwen2.5-vl-7b-clevr-grpo   # upload / retry

The release folder (``--output``, default ``<checkpoint>/release``) holds exactly what is uploaded: the weights
(safetensors), config and generation config, the processor files (preprocessor config, tokenizer, chat template),
``README.md`` (the model card of :mod:`suzak.release.publish.model_card`), ``recipe.yaml`` and ``run_info.json`` (secrets masked),
``metrics.csv``, the training-curve PNGs under ``plots/`` and the evaluation results under ``eval/``. ``--dry_run``
stops there. Before anything is uploaded every text file is checked for secret values.

``push_to_hub: true`` in a training recipe runs the same release at the end of training (repo from
``hub_model_id`` or ``HUB_MODEL_ID``, token from ``HF_TOKEN``; ``release_dry_run: true`` builds the folder only).
A missing token stops before any network use; a failed upload keeps the folder and prints the command to retry.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from suzak import SuzakError
from suzak.release.model_card import CARD_SIGNATURE, EvalEntry, TrainingFacts, load_eval_result, render_card
from suzak.runs.redaction import find_secrets, redact

__all__ = ["Release", "build_release", "main", "release_request", "resolve_token", "upload_release"]

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Files of a model folder that belong in a release (weights, configs, processor); training state does not.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json", "tokenizer*",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.*")  # fmt: skip
MODEL_FILES = ("*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
               "adapter_config.json", *PROCESSOR_FILES)  # fmt: skip
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json")
_RUN_FILES = ("recipe.yaml", "run_info.json", "metrics.csv")
_TEXT_SUFFIXES = {".json", ".md", ".yaml", ".yml", ".txt", ".csv", ".jinja", ".jsonl"}


# --- tokens and requests -----------------------------------------------------------------------------------------


def resolve_token(explicit: str | None = None) -> str:
    """The Hub token (``explicit``, else ``HF_TOKEN`` / the stored login); missing or malformed is one clear line."""
    from huggingface_hub import get_token

    token = explicit or os.environ.get("HF_TOKEN") or get_token()
    if not token:
        raise SuzakError("no Hugging Face token: set HF_TOKEN in .env (a write token from "
                         "https://huggingface.co/settings/tokens) or run `hf auth login`")  # fmt: skip
    if len(token) < 8 or any(c.isspace() for c in token):
        raise SuzakError("HF_TOKEN is not a valid Hugging Face token (too short or contains spaces): copy a write "
                         "token from https://huggingface.co/settings/tokens into .env")  # fmt: skip
    return token


def _check_repo_id(repo_id: str | None) -> str:
    if not repo_id or not _REPO_ID.match(repo_id):
        raise SuzakError(f"repo id {repo_id!r} is not USER/NAME (or ORG/NAME)")
    return repo_id


@dataclass
class Release:
    """Where and how to publish; :meth:`publish` builds the folder and uploads it unless ``dry_run``."""

    repo_id: str
    private: bool = False
    dry_run: bool = False
    token: str | None = None
    eval_results: list[str] = field(default_factory=list)
    output: str | None = None

    def publish(self, checkpoint: str | Path) -> Path:
        folder = build_release(checkpoint, self.output, self.repo_id, self.eval_results)
        if self.dry_run:
            logger.info("dry run: release for %s written to %s, nothing uploaded", self.repo_id, folder)
        else:
            upload_release(folder, self.repo_id, private=self.private, token=self.token)
        return folder


def release_request(grpo_args, dry_run: bool = False) -> Release | None:
    """The release a training run asked for with ``push_to_hub``; repo id and token are checked before training."""
    if not grpo_args.push_to_hub:
        return None
    repo_id = grpo_args.hub_model_id or os.environ.get("HUB_MODEL_ID")
    if not repo_id:
        raise SuzakError("push_to_hub is set but no repo id: set hub_model_id in the recipe, HUB_MODEL_ID in .env, "
                         "or pass --hub_model_id USER/NAME")  # fmt: skip
    token = None if dry_run else resolve_token(grpo_args.hub_token)
    return Release(_check_repo_id(repo_id), private=bool(grpo_args.hub_private_repo), dry_run=dry_run, token=token)


# --- building the folder -----------------------------------------------------------------------------------------


def _check_weights(checkpoint: Path) -> None:
    if any(checkpoint.glob("*.safetensors")):
        return
    if any(checkpoint.glob("global_step*")):
        raise SuzakError(f"{checkpoint} holds DeepSpeed ZeRO shards but no safetensors weights: export it first with "
                         f"`suzak export zero {checkpoint} --output {checkpoint}-hf`, then release that")  # fmt: skip
    raise SuzakError(f"no safetensors weights in {checkpoint}: point --checkpoint at a run's output dir, a "
                     "checkpoint-N folder or an exported model folder")  # fmt: skip


def _prepare_output(output: Path) -> None:
    """An empty folder to write into; an earlier release folder (ours) is replaced, anything else is refused."""
    if output.exists() and any(output.iterdir()):
        readme = output / "README.md"
        if not (readme.is_file() and CARD_SIGNATURE in readme.read_text(encoding="utf-8", errors="replace")):
            raise SuzakError(f"{output} exists and is not a suzak release folder: choose another --output")
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link where possible (multi-GB weights cost no space or time), else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _model_files(checkpoint: Path, run_dir: Path | None) -> list[Path]:
    """The checkpoint's model files, with processor files from the run dir when the checkpoint has none."""
    files = {p.name: p for pattern in MODEL_FILES for p in checkpoint.glob(pattern) if p.is_file()}
    if not any(name in files for name in _PROCESSOR_FILES) and run_dir is not None and run_dir != checkpoint:
        files |= {p.name: p for pattern in PROCESSOR_FILES for p in run_dir.glob(pattern) if p.is_file()}
    if not any(name in files for name in _PROCESSOR_FILES):
        raise SuzakError(f"no processor files (tokenizer, preprocessor config) in {checkpoint}: save the processor "
                         "there (processor.save_pretrained) and run the release again")  # fmt: skip
    return sorted(files.values())


def _write_generation_config(checkpoint: Path, output: Path) -> None:
    """The generation config derived from the model config, when the checkpoint has none (LoRA adapters: none)."""
    if (output / "generation_config.json").is_file() or not (checkpoint / "config.json").is_file():
        return
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(checkpoint)).save_pretrained(output)


def _run_dir(checkpoint: Path) -> Path | None:
    """The training output dir the checkpoint came from: itself, or its parent for ``checkpoint-N``."""
    for folder in (checkpoint, checkpoint.parent):
        if any((folder / name).is_file() for name in _RUN_FILES):
            return folder
    return None


def _copy_run_files(run_dir: Path | None, output: Path) -> tuple[str | None, dict]:
    """recipe.yaml, run_info.json (secrets masked again) and metrics.csv; returns the recipe text and run info."""
    recipe_text, run_info = None, {}
    if run_dir is None:
        return recipe_text, run_info
    if (run_dir / "recipe.yaml").is_file():
        recipe_text = redact((run_dir / "recipe.yaml").read_text(encoding="utf-8"))
        (output / "recipe.yaml").write_text(recipe_text, encoding="utf-8")
    if (run_dir / "run_info.json").is_file():
        run_info = redact(json.loads((run_dir / "run_info.json").read_text()))
        (output / "run_info.json").write_text(json.dumps(run_info, indent=2) + "\n", encoding="utf-8")
    if (run_dir / "metrics.csv").is_file():
        shutil.copy2(run_dir / "metrics.csv", output / "metrics.csv")
    return recipe_text, run_info


def _heldout(run_dir: Path | None) -> dict:
    """Each held-out figure of metrics.csv (``eval/accuracy``, ``eval/<source>/accuracy``): its first and last
    evaluation, as ((step, value), (step, value)); {} without a metrics.csv or held-out rows."""
    import csv

    path = run_dir / "metrics.csv" if run_dir is not None else None
    if path is None or not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as file:
        rows = [row for row in csv.DictReader(file) if row.get("eval/accuracy")]
    names = [name for name in (rows[0] if rows else {}) if name.startswith("eval/") and name.endswith("/accuracy")]
    found = {}
    for name in ["eval/accuracy", *sorted(set(names) - {"eval/accuracy"})]:
        points = [(int(float(row["step"])), float(row[name])) for row in rows if row.get(name) not in (None, "")]
        if points:
            found[name] = (points[0], points[-1])
    return found


def _plots(run_dir: Path | None, output: Path) -> list[str]:
    """Training curves drawn afresh from the run's metrics into ``plots/``; relative paths."""
    from suzak.runs.plots import plot_run

    if run_dir is None:
        return []
    try:
        return [p.relative_to(output).as_posix() for p in plot_run(run_dir, output / "plots")]
    except SuzakError as error:
        logger.warning("no training curves in the release: %s", error)
        return []


def _read_evals(eval_results: list[str]) -> list[EvalEntry]:
    return [load_eval_result(name, f"eval/{Path(name).name}") for name in eval_results]


def _copy_evals(eval_results: list[str], output: Path) -> None:
    """Each results JSON, with the ``.md`` / ``.summary.json`` beside it, into ``eval/``."""
    for name in eval_results:
        source = Path(name)
        for sibling in (source, source.with_suffix(".md"), source.with_suffix(".summary.json")):
            if sibling.is_file():
                _link_or_copy(sibling, output / "eval" / sibling.name)


def _patch_factor(folder: Path) -> int | None:
    """Pixels per visual token along a side of the released image processor; None without one (a text model)."""
    from transformers import AutoImageProcessor

    from suzak.media.vision import patch_factor

    try:
        image_processor = AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError):
        return None
    return patch_factor(image_processor)


def _check_no_secrets(output: Path) -> None:
    """The last gate: no text file of the release may contain a secret value from the environment."""
    for path in sorted(output.rglob("*")):
        if path.is_file() and path.suffix in _TEXT_SUFFIXES:
            if find_secrets(path.read_text(encoding="utf-8", errors="replace")):
                raise SuzakError(f"{path} contains the value of a secret environment variable; nothing was uploaded")


def build_release(checkpoint: str | Path, output: str | Path | None, repo_id: str,
                  eval_results: list[str] | None = None) -> Path:  # fmt: skip
    """Write the release folder for ``checkpoint`` (see the module docstring); returns it."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise SuzakError(f"checkpoint {checkpoint} is not a folder")
    _check_repo_id(repo_id)
    _check_weights(checkpoint)
    output = Path(output) if output else checkpoint / "release"
    run_dir = _run_dir(checkpoint)
    files = _model_files(checkpoint, run_dir)
    evals = _read_evals(eval_results or [])  # a bad results file fails before anything is written
    _prepare_output(output)
    for path in tqdm(files, desc="release files", unit="file"):
        _link_or_copy(path, output / path.name)
    _write_generation_config(checkpoint, output)
    recipe_text, run_info = _copy_run_files(run_dir, output)
    recipe = yaml.safe_load(recipe_text) if recipe_text else {}
    _copy_evals(eval_results or [], output)
    facts = TrainingFacts(
        recipe,
        recipe_text,
        run_info,
        _plots(run_dir, output),
        (output / "adapter_config.json").is_file(),
        _patch_factor(output),
        _heldout(run_dir),
    )
    (output / "README.md").write_text(render_card(repo_id, facts, evals), encoding="utf-8")
    _check_no_secrets(output)
    size = sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    logger.info("release folder %s: %d files, %.1f MB", output, sum(1 for p in output.rglob("*") if p.is_file()),
                size / 1e6)  # fmt: skip
    return output


# --- upload ------------------------------------------------------------------------------------------------------


def _repo_url(repo_id: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo_id}"


def _retry_command(folder: Path, repo_id: str, private: bool) -> str:
    return f"python -m suzak.release --upload {folder} --repo_id {repo_id}" + (" --private" if private else "")


def upload_release(folder: str | Path, repo_id: str, *, private: bool = False, token: str | None = None) -> str:
    """Create the repo (if needed) and upload the folder; any failure is one line naming the kept folder and retry."""
    from huggingface_hub import HfApi, constants

    from suzak.data.hub import offline_unless_reachable

    folder, token = Path(folder), resolve_token(token)
    _check_repo_id(repo_id)
    if not (folder / "README.md").is_file():
        raise SuzakError(f"{folder} is not a release folder (no README.md): build it with --checkpoint first")
    _check_no_secrets(folder)
    kept = f"the release folder is kept at {folder}; retry with `{_retry_command(folder, repo_id, private)}`"
    if constants.HF_HUB_OFFLINE:  # the user's own switch, not the network: name it (air-gapped users set it)
        raise SuzakError(f"HF_HUB_OFFLINE is set, so nothing was uploaded (unset it on a machine that reaches the "
                         f"Hub): {kept}")  # fmt: skip
    with offline_unless_reachable() as offline:
        if offline:
            raise SuzakError(f"the Hub ({constants.ENDPOINT}) is unreachable, nothing was uploaded: {kept}")
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Release with suzak")
        except Exception as error:  # noqa: BLE001 - HTTP, network and filesystem errors all become the line below
            raise SuzakError(f"upload to {repo_id} failed ({_why(error)}): {kept}") from None
    logger.info("uploaded %s to %s", folder, _repo_url(repo_id))
    return _repo_url(repo_id)


def _why(error: Exception) -> str:
    """A short reason; HTTP 401/403 say the token was rejected."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return f"HTTP {status}: the Hub rejected HF_TOKEN; it needs write access to this repo"
    lines = str(error).strip().splitlines()
    return redact(f"{type(error).__name__}: {lines[0] if lines else ''}")


# --- command line ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m suzak.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="model folder: a run's output dir, checkpoint-N or an exported folder")
    parser.add_argument("--upload", metavar="DIR", help="upload a release folder built earlier (no rebuild)")
    parser.add_argument("--repo_id", required=True, help="Hub repo, USER/NAME or ORG/NAME")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--eval_results", nargs="+", action="extend", default=[], metavar="FILE",
                        help="results JSON from suzak.eval / src/eval (R1-V format); repeatable")  # fmt: skip
    parser.add_argument("--dry_run", action="store_true", help="write the release folder, upload nothing")
    parser.add_argument("--output", help="release folder (default: CHECKPOINT/release)")
    return parser


def _run(args: argparse.Namespace) -> str:
    if bool(args.checkpoint) == bool(args.upload):
        raise SuzakError("give exactly one of --checkpoint (build a release) and --upload (upload a built folder)")
    token = None if args.dry_run else resolve_token()  # before any work or network use
    if args.upload:
        url = upload_release(args.upload, args.repo_id, private=args.private, token=token)
        return f"uploaded {args.upload} to {url}"
    release = Release(args.repo_id, args.private, args.dry_run, token, args.eval_results, args.output)
    folder = release.publish(args.checkpoint)
    if args.dry_run:
        return f"dry run: release written to {folder}; upload it with `{_retry_command(folder, args.repo_id, args.private)}`"
    return f"uploaded {folder} to {_repo_url(args.repo_id)}"


def main(argv: list[str] | None = None) -> None:
    from dotenv import load_dotenv

    from suzak.runs.redaction import install_log_redaction

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    load_dotenv(os.environ.get("SUZAK_ENV_FILE", ".env"), override=False)
    try:
        print(_run(args))
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
