"""The shared runner: build the tiny model, train each condition (its prior, then GRPO with suzak's trainer), answer
held-out rows greedily through the evaluation engine, and judge the runs against the task's bars."""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

from suzak import SuzakError
from suzak.selftest import priors
from suzak.selftest.config import SelfTestConfig
from suzak.selftest.report import (
    condition_of,
    floor_margin,
    heldout_needs,
    margins,
    needs,
    quiet_progress,
    verdicts,
    windows,
)
from suzak.selftest.spec import NO_TOOL

__all__ = ["CONDITION_IMPORTS", "PORTS_FROM", "conditions_context", "run_selftest", "unsuppressed_tokens"]

logger = logging.getLogger(__name__)


class RewardTrace:
    """Collects the mean reward of every training step from the trainer's logs: ``rewards[""]`` the figure ``key``;
    for a mixture (``sources``) ``rewards[source]`` each source's instead (``sources/<name>/reward``, logged by the
    trainer for a step holding rows of it)."""

    def __init__(self, key: str = "reward", sources: tuple[str, ...] = ()):
        from transformers import TrainerCallback

        trace = self
        keys = {source: f"sources/{source}/reward" for source in sources} or {"": key}

        class Callback(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                for part, name in keys.items():
                    if logs and name in logs:
                        trace.rewards[part].append(float(logs[name]))

        self.rewards: dict[str, list[float]] = {part: [] for part in keys}
        self.callback = Callback()


def train(config: SelfTestConfig, model_dir: Path, images: str, output_dir: Path, prior: Path | None = None):
    """One condition's run: its prior (unless ``prior``, the folder of a model that had it), GRPO, held-out."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig

    from suzak.training.trainer import VLMGRPOTrainer

    spec = config.spec
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(prior or model_dir)
    budget, video_budget = config.budgets(processor)
    toolset, crops = None, budget.for_crops(budget.max_pixels)  # crops at the whole image's budget
    names = spec.control_tools if images == spec.control else spec.tools  # zoom's control: none; episodes': blank
    if names:  # the tool, its template and parser
        from suzak.media.vision import configure_processor
        from suzak.models.tool_calling import prepare_tool_calling
        from suzak.models.tools import resolve_tools

        prepare_tool_calling(processor, model.config.model_type)
        configure_processor(processor, budget)
        toolset = resolve_tools(list(names), crops, max_steps=spec.tool_rounds)
    kept = priors.prior_folder(config, model_dir, images) if prior is None and spec.prior_steps else None
    if kept is not None:
        prior = priors.cached_prior(kept, images)  # its folder is TRL's reference model, as below
        if prior is not None:
            model = AutoModelForImageTextToText.from_pretrained(prior)
    if prior is None:
        priors.train_prior(config, images, model, processor, budget, video_budget, crops, output_dir)
        if spec.beta or (spec.prior_steps and config.prior_cache):  # TRL builds the reference model from the
            model.save_pretrained(output_dir / "prior-model")  # model's folder: the prior's policy
            processor.save_pretrained(output_dir / "prior-model")
            priors.keep_prior(kept, output_dir / "prior-model")
            model = AutoModelForImageTextToText.from_pretrained(output_dir / "prior-model")
    logger.info("%s run: %d GRPO steps (%s task)", images, config.steps, config.task)
    train_rows, heldout_rows = config.task_module.datasets(config, images, output_dir, budget.factor)
    args = GRPOConfig(
        output_dir=str(output_dir), seed=config.seed, max_steps=config.steps, learning_rate=config.learning_rate,
        lr_scheduler_type=spec.lr_scheduler_type,
        per_device_train_batch_size=config.prompts_per_step * config.generations,
        num_generations=config.generations, max_completion_length=spec.max_completion_length,
        temperature=config.temperature, beta=spec.beta, loss_type=config.loss_type,
        logging_steps=1, save_strategy="no", report_to="none", bf16=False, gradient_checkpointing=False,
        use_cpu=config.device == "cpu", disable_tqdm=True, **vllm_settings(config),
        **({"max_tool_calling_iterations": spec.tool_rounds} if toolset else {}),
    )  # fmt: skip
    rewards, weights, figure = config.task_module.rewards(config, processor.tokenizer)
    args.reward_weights = weights
    trace = RewardTrace(figure, spec.sources)
    trainer = VLMGRPOTrainer(
        model=model, reward_funcs=rewards, args=args, train_dataset=train_rows,
        processing_class=processor, pixel_budget=budget, video_budget=video_budget, callbacks=[trace.callback],
        **(toolset.trainer_kwargs() if toolset else {}),
    )  # fmt: skip
    quiet_progress(trainer)  # the table below replaces hundreds of printed log dicts
    trainer.train()
    loaded = prior is not None and config.prior_cache is not None and prior.parent == Path(config.prior_cache)
    return (trace.rewards, *heldout(trainer, config, list(heldout_rows), toolset),
            [list(gap) for gap in trainer.sampler_guard.gaps], str(prior) if loaded else None)  # fmt: skip


def vllm_settings(config: SelfTestConfig) -> dict:
    """GRPOConfig fields for vLLM generation: colocated, a small share of the GPU (the tiny model needs little; on
    the CPU vLLM sizes its KV cache by ``VLLM_CPU_KVCACHE_SPACE`` instead)."""
    if not config.vllm:
        return {}
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.15,
            "vllm_max_model_length": 2048 if config.spec.tools else 1024}  # fmt: skip


def train_in_process(config: SelfTestConfig, model_dir: Path, images: str, output_dir: Path,
                     prior: Path | None = None):  # fmt: skip
    """:func:`train`; with vLLM in a fresh process, since a colocated vLLM engine keeps the GPU (or its CPU memory) and
    its process group until its process ends and each condition starts its own."""
    if not config.vllm:
        return train(config, model_dir, images, output_dir, prior)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(train, config, model_dir, images, output_dir, prior).result()


PORTS_FROM = 30000  # the self-test's rendezvous ports are drawn from here up to the kernel's ephemeral range


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports, held together while they are checked, drawn at random below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) may go to any outgoing connection in the
    minute before a condition's process binds it, and did (EADDRINUSE in a CI run, vLLM's and the other pytest
    worker's sockets on the same host); below it only an explicit bind takes a port."""
    import random
    import socket

    end = ephemeral_start()
    if end - PORTS_FROM < 16 * count:  # a kernel that hands out (almost) every port: its own choice
        candidates = [0] * count
    else:
        candidates = random.Random().sample(range(PORTS_FROM, end), 16 * count)
    sockets: list = []
    try:
        for port in candidates:
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
            if len(sockets) == count:
                return [sock.getsockname()[1] for sock in sockets]
        raise SuzakError(f"no {count} free TCP ports between {PORTS_FROM} and {end} for the conditions' vLLM groups")
    finally:
        for sock in sockets:
            sock.close()


def ephemeral_start(default: int = 32768) -> int:
    """The first port of the kernel's ephemeral range (Linux: ``ip_local_port_range``); ``default`` (Linux's) where
    it cannot be read."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def train_on_port(port: int | None, *args):
    """:func:`train` in a condition's process; with vLLM, TRL's colocate group meets on ``port``: TRL's own choice (the
    first free of 29500, 23456, ...) is made by both processes at once and gives both the same port."""
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    return train(*args)


def train_conditions(config: SelfTestConfig, model_dir: Path, conditions: tuple[str, ...], tmp: Path) -> dict:
    """:func:`train_in_process` for each condition; on the CPU the conditions run at once, each in its own process on
    its share of the cores: the tiny model's small matrices keep two threads of one run far from twice one thread's
    speed (the colour self-test on 2 cores: 75 s per condition one after the other, 91 s for both at once). With
    vLLM's CPU build each process holds its own colocated engine (a port each for TRL's one-process group; in colocate
    mode vLLM binds no threads, so each keeps its share) and ends with its run. The runs are the same up to the order
    of float sums, so their curves match one after the other's to the noise of sampling. On a GPU they run one after
    the other (one device). A prior the conditions share (:func:`suzak.selftest.priors.shared_prior`) is trained once,
    first, on as many threads as each condition gets."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    together = config.device == "cpu" and len(conditions) > 1 and cores > 1
    threads = max(1, cores // len(conditions)) if together else torch.get_num_threads()
    context = conditions_context(config) if together else None  # its imports start beside the shared prior
    prior = priors.shared_prior(config, model_dir, conditions, tmp / "prior", threads)
    if not together:
        return {images: train_in_process(config, model_dir, images, tmp / images, prior) for images in conditions}
    from concurrent.futures import ProcessPoolExecutor

    ports = free_ports(len(conditions)) if config.vllm else [None] * len(conditions)
    with ProcessPoolExecutor(len(conditions), mp_context=context, max_tasks_per_child=1,
                             initializer=torch.set_num_threads, initargs=(threads,)) as pool:  # fmt: skip
        runs = {images: pool.submit(train_on_port, port, config, model_dir, images, tmp / images, prior)
                for images, port in zip(conditions, ports, strict=True)}  # fmt: skip
        return {images: run.result() for images, run in runs.items()}


# what a condition's process imports before it trains (TRL, transformers, torch and suzak's trainer: ~9 s of one core)
CONDITION_IMPORTS = ["suzak.selftest.runner", "suzak.training.trainer", "trl", "datasets"]


def conditions_context(config: SelfTestConfig):
    """The start method of the conditions' processes. With HF generation, ``forkserver``: one fresh process imports
    :data:`CONDITION_IMPORTS` once (started here, so it imports while this process builds the shared prior) and each
    condition's process is forked from it with those modules loaded and no torch thread pool started: on 2 cores the
    imports of two spawned processes took ~18 s of CPU per self-test, a quarter of the colour self-test's. With vLLM,
    ``spawn`` (vLLM's CPU build starts its own processes by spawn and wants a process of its own). The processes are
    fresh either way: no state of this one (its prior's threads, a test's patches) reaches a condition."""
    import multiprocessing

    if config.vllm:
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(CONDITION_IMPORTS)
    forkserver.ensure_running()
    return context


def unsuppressed_tokens(trainer, engine) -> list[str]:
    """Tokens training kept out of the sampled completions that ``engine`` would let the policy generate.

    Training suppresses the vision placeholders (``<|image_pad|>`` …) while sampling, so the policy is never taught
    to avoid them and may still favour them: an evaluation that does not suppress them too scores a different
    policy from the one trained. The tiny policy here puts ~1e-4 of its mass on ``<|image_pad|>`` after training
    (docs/selftest.md), so held-out accuracy alone would not notice a missing suppression; this check does. The
    trained side is read from what generation is handed (HF ``suppress_tokens`` or vLLM's logit bias).
    """
    missing = sorted(set(trainer.suppressed_token_ids) - set(engine.suppress_ids))
    return trainer.processing_class.tokenizer.convert_ids_to_tokens(missing)


def heldout(trainer, config: SelfTestConfig, rows: list[dict], toolset=None) -> tuple[dict[str, float], list[str]]:
    """(accuracy of greedy answers on unseen aligned rows through the evaluation engine, unsuppressed tokens); with
    ``toolset``, answered through the evaluation's tool loop (:mod:`suzak.eval.tool_loop`) as training rolled out.
    The accuracy is ``{"": all rows}``, or for a mixture ``{source: its rows}``."""
    from suzak.eval.engine import HFEngine
    from suzak.media.boxes import with_box_frame

    engine = HFEngine(trainer.model, trainer.processing_class, trainer.pixel_budget, batch_size=64,
                      max_new_tokens=config.spec.max_completion_length, progress=False)  # fmt: skip
    engine.use_video_budget(trainer.video_budget)
    engine.model_type = trainer.model_type  # as suzak.eval's runner sets it (box frames, the tool loop)
    # each row as training puts it to the model: boxes in the question (zoom) and the answer's frame (grounding)
    rows = [with_box_frame(row, trainer.model_type, trainer.pixel_budget) for row in rows]
    trainer.model.eval()
    episodes = None
    if toolset is None:
        outputs = engine.generate(rows)
    else:
        from suzak.eval.tool_loop import ToolLoop, episodes_of

        records = ToolLoop(engine, toolset, max_iterations=config.spec.tool_rounds).generate(rows)
        outputs = [r["model_output"] for r in records]
        episodes = episodes_of(records)
    if episodes is not None:  # an episode is scored by its environment: success
        scores = [float(episode["success"]) for episode in episodes]
    else:
        scores = config.task_module.score(config, outputs, rows)
    parts = {source: [s for s, row in zip(scores, rows, strict=True) if row["source"] == source]
             for source in config.spec.sources} or {"": scores}  # fmt: skip
    return {part: statistics.fmean(values) for part, values in parts.items()}, unsuppressed_tokens(trainer, engine)


def run_selftest(config: SelfTestConfig, conditions: tuple[str, ...] | None = None) -> dict:
    """Train each condition (default: aligned and the task's control), evaluate held-out, return the report
    (``passed`` and the numbers behind it).

    An aligned run passes when its mean reward over the last 10 steps reaches the task's ``pass_at`` and, where the
    task sets one, its held-out greedy accuracy reaches ``heldout_pass_at``; a control run (shuffled, grey, no_tool)
    passes when its reward stays inside the task's ``control_band`` around chance and its held-out accuracy below
    ``heldout_control_below`` (:func:`suzak.selftest.report.verdicts`). Against a no-tool control the aligned run's
    held-out accuracy must also pass the best the control reached (any 10-step window, or its held-out accuracy).
    """
    import torch

    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.selftest.zoom import zoom_corpus

    start = time.monotonic()
    spec = config.spec
    conditions = conditions or ("aligned", spec.control)
    torch.manual_seed(config.seed)
    with tempfile.TemporaryDirectory(prefix="suzak-selftest-") as tmp:
        # vLLM's CPU attention needs head_dim >= 32; the grounding task learns faster on that shape with HF too
        corpus = []  # the tool format in the tiny vocabulary: the task's own text, or the zoom's
        if spec.tools:
            task_corpus = getattr(config.task_module, "corpus", None)
            corpus = task_corpus(config.family) if task_corpus else zoom_corpus(config.family)
        tiny = TinyConfig.shaped(config.family, for_vllm=config.vllm or spec.vllm_shape, extra_corpus=corpus,
                                 **spec.tiny)  # fmt: skip
        model_dir = build_tiny_model(Path(tmp) / "model", tiny)
        prepared, prepared_bars = {}, {}  # work the conditions share, done once (the judge task trains its judge)
        if hasattr(config.task_module, "prepare"):
            config, prepared, prepared_bars = config.task_module.prepare(config, Path(tmp))
        runs = {}  # a condition's run, or for a mixture each source's rows of it ("aligned/colour", ...)
        for images, (rewards, accuracy, unsuppressed, checks, kept) in train_conditions(config, model_dir, conditions,
                                                                                        Path(tmp)).items():  # fmt: skip
            for part, values in rewards.items():
                runs[f"{images}/{part}" if part else images] = {
                    "rewards": values, "heldout": accuracy[part], "unsuppressed": unsuppressed, "checks": checks,
                    "kept_prior": kept}  # fmt: skip
    last = {name: statistics.fmean(run["rewards"][-10:]) for name, run in runs.items()}
    accuracies = {name: run["heldout"] for name, run in runs.items()}
    ok = verdicts(spec, last, accuracies) | {name: value >= bar for name, (value, bar) in prepared_bars.items()}
    if "aligned" in runs and NO_TOOL in runs:  # the tool must beat the best the model reached without it
        best = max([*windows(runs[NO_TOOL]["rewards"]), runs[NO_TOOL]["heldout"]])
        ok["beats_no_tool"] = runs["aligned"]["heldout"] > best
    controls = [name for name in runs if condition_of(name) != "aligned"]
    aligned = [name for name in runs if condition_of(name) == "aligned"]
    unsuppressed = sorted({token for run in runs.values() for token in run["unsuppressed"]})
    return {
        "task": config.task,
        "family": config.family,
        "seed": config.seed,
        # a mixture's: its weakest source's aligned figures and the control's source farthest above chance
        "aligned_accuracy": min(last[name] for name in aligned) if aligned else None,
        "control_accuracy": max(last[name] for name in controls) if controls else None,
        "last10": last,
        "needs": {name: needs(spec, name) for name in last},
        "chance": spec.chance,
        "heldout_accuracy": min(accuracies[name] for name in aligned) if aligned else None,
        "heldout": accuracies,
        "heldout_needs": heldout_needs(spec, list(runs)),
        "verdicts": ok,
        # {bar: [how far inside it, how far it must be to be safe]} (report.margins; docs/selftest.md)
        "margins": {name: [round(got, 4), need] for name, (got, need) in margins(spec, last, accuracies).items()}
        | {name: list(floor_margin(value, bar)) for name, (value, bar) in prepared_bars.items()},
        "windows": {name: windows(run["rewards"]) for name, run in runs.items()},
        "steps": config.steps,
        "generation": "vllm" if config.vllm else "hf",
        # with vLLM: the stale-sampler guard's checks, [step, mean gap, max gap, suppressed mass] (nats per token)
        "sampler_checks": {name: run["checks"] for name, run in runs.items()},
        "unsuppressed_in_eval": unsuppressed,
        # --prior_cache: the folder each condition's prior was loaded from, or None where it was trained in this run
        "kept_priors": {name: run["kept_prior"] for name, run in runs.items()},
        "seconds": round(time.monotonic() - start, 1),
        **({config.task: prepared} if prepared else {}),  # the judge task's judge: its SFT steps and accuracy
        "passed": all(ok.values()) and not unsuppressed,
    }
