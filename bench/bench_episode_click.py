"""How fast the episodes self-test's first click learns where the door is, outside TRL and the environment
(docs/episodes.md, "Status": the learning proof does not pass yet, and this measures why).

    python bench/bench_episode_click.py --mode pg --steps 200        # policy gradient on the task as specified
    python bench/bench_episode_click.py --mode sft --steps 100       # supervised clicks: the plateau before the door
    python bench/bench_episode_click.py --mode pg --screens grounding --tools_turn false --steps 400
    python bench/bench_episode_click.py --table bench/results_episode_click.jsonl

The tiny model of the task (its vocabulary and shape) is taught the task's call prior first, exactly as
``suzak selftest --task episodes`` does (:func:`suzak.selftest.episodes.prior`: clicks at random cells, the task's
200 SFT steps unless ``--prior_steps``); it is saved in ``--prior_dir`` and reused from there, whatever
``--prior_steps`` says. Then, on the first screen alone (one call, no environment, no TRL):

- ``pg``: ``--prompts`` screens a step, ``--samples`` calls sampled for each; reward 1 for a click on the door, group-
  normalised advantages, the loss their weighted log-probabilities over the call's tokens (no KL), AdamW;
- ``sft``: ``--prompts`` screens a step, each with the call that clicks its door, AdamW.

Every ``--every`` steps a row: the door rate (and the share of well-formed calls) of the steps' samples (pg), or of
``--samples`` / 2 calls sampled on each of 8 new screens after the step (sft). ``--screens task`` draws the door as the task does (a white cell on dark);
``grounding`` as the grounding self-test's scenes (one shape filling the cell on the noisy grey). ``--tools_turn
false`` leaves the tools' system turn out of the prompt (~60 tokens instead of ~260). The call format parsed is the
JSON one of Qwen2-VL, Qwen2.5-VL and Qwen3-VL.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from stamp import append_rows, commit, markdown_table  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_episode_click.jsonl"
SIZES = "bench_tiny.json"  # beside a prior: the --tiny sizes it was built with
FIELDS = ("mode", "tiny", "screens", "tools_turn", "formed_only", "advantage", "adam_epsilon", "lr", "prompts", "samples",
          "step", "door_rate",
          "well_formed", "commit", "date")  # fmt: skip


def prior_model(args, config, spec) -> Path:
    """The task's tiny model after its call prior, saved in ``--prior_dir`` (built there when it is not yet)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.media.vision import configure_processor
    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.selftest import episodes

    folder = Path(args.prior_dir)
    if (folder / "config.json").exists():
        built = json.loads((folder / SIZES).read_text()) if (folder / SIZES).exists() else {}
        if args.tiny and args.tiny != built:
            sizes = json.dumps(built) if built else "the task's sizes"
            sys.exit(f"--tiny {json.dumps(args.tiny)}: the prior in {folder} was built with {sizes}; name another "
                     "--prior_dir")  # fmt: skip
        args.tiny = built  # the rows name the sizes of the model they ran
        return folder
    work = Path(tempfile.mkdtemp(prefix="suzak-bench-click-"))
    tiny = TinyConfig.shaped(args.family, for_vllm=spec.vllm_shape, extra_corpus=episodes.episode_corpus(args.family),
                             **spec.tiny | args.tiny)  # fmt: skip
    model_dir = build_tiny_model(work / "model", tiny)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    budget, _ = config.budgets(processor)
    prepare_tool_calling(processor, args.family)
    configure_processor(processor, budget)
    episodes.prior(config, "aligned", model, processor, budget, None, None, work, steps=args.prior_steps)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    (folder / SIZES).write_text(json.dumps(args.tiny))
    return folder


def screens(kind: str, count: int, side: int, rng):
    """``count`` (first screen, door cell) pairs drawn at ``side`` pixels."""
    from suzak.data.doors import CELLS, DOOR, cell_of, draw_cell
    from suzak.data.grounding import grounding_rows

    if kind == "task":
        doors = [int(d) for d in rng.integers(0, CELLS, count)]
        return [(draw_cell(d, side, DOOR), d) for d in doors]
    rows = grounding_rows(count, seed=int(rng.integers(1 << 30)), grid=2, width=side, height=side, distractors=(0, 0))
    boxes = [json.loads(row["solution"]) for row in rows]
    return [
        (row["image"], cell_of((b[0] + b[2]) / 2, (b[1] + b[3]) / 2, side)) for row, b in zip(rows, boxes, strict=True)
    ]


def clicked_cell(tokenizer, ids: list[int], prefix: list[int], tools: list, frame, side: int) -> int | None:
    """The cell of the first click in the completion ``ids`` (after the prompt ids ``prefix``), read as TRL's tool
    loop reads a turn (:func:`suzak.trl_internals.tools.parse_turn`); None where it holds no well-formed click."""
    from suzak.data.doors import cell_of
    from suzak.trl_internals.tools import parse_turn

    calls = parse_turn(tokenizer, ids, prefix, tools).get("tool_calls") or []
    try:
        arguments = calls[0]["function"]["arguments"]
        point = frame.point_from_model((float(arguments["x"]), float(arguments["y"])))
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return cell_of(*point, side)


def run(args) -> list[dict]:
    import numpy as np
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import get_json_schema

    from suzak.data.doors import DOOR, INSTRUCTION, DoorsEnvironment, cell_box, draw_cell
    from suzak.media.boxes import BoxFrame
    from suzak.scoring.prompts import episode_prompt
    from suzak.selftest.config import SelfTestConfig
    from suzak.selftest.episodes import click_turn

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    config = SelfTestConfig(task="episodes", family=args.family, seed=args.seed)
    spec = config.spec
    folder = prior_model(args, config, spec)
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    tokenizer = processor.tokenizer
    budget, _ = config.budgets(processor)
    side = spec.image_tokens[0] * budget.factor * spec.image_scale
    frame = BoxFrame.of(args.family, side, side, budget)
    click = DoorsEnvironment.bound_to(budget)().click
    tools = [click]  # what the completions' calls are parsed against (TRL's tool loop's)
    schemas = [get_json_schema(click)] if args.tools_turn else None
    prompt = processor.apply_chat_template(episode_prompt(INSTRUCTION, "episode"), tools=schemas, tokenize=False,
                                           add_generation_prompt=True)  # fmt: skip
    answers = [processor.apply_chat_template([click_turn(frame.click_point(cell_box(cell, side)))], tokenize=False)
               .split("<|im_start|>assistant\n", 1)[1].rstrip("\n") for cell in range(4)]  # fmt: skip
    # every screen is the same size, so the prompt's tokens (the supervised targets start after them) are too
    prompt_length = len(processor(text=[prompt], images=[budget.fit(draw_cell(0, side, DOOR))])["input_ids"][0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, eps=args.adam_epsilon)
    image_token = model.config.image_token_id
    rows, hits, formed, seen = [], 0, 0, 0

    def sample(pairs, samples: int):
        """The calls sampled for each pair (samples each), their cells and the batch they came from."""
        inputs = processor(text=[prompt] * len(pairs), images=[budget.fit(image) for image, _ in pairs],
                           return_tensors="pt")  # fmt: skip
        inputs = {key: _repeat(key, value, samples, len(pairs)) for key, value in inputs.items()}
        model.eval()
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=40, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        length = inputs["input_ids"].shape[1]
        completion = out[:, length:].clone()
        sampled_image = (completion == image_token) | (completion == model.config.vision_start_token_id)
        completion[sampled_image] = tokenizer.pad_token_id  # a sampled image token has no pixels: treated as the end
        prefix = inputs["input_ids"][0].tolist()
        turns = [row[: _turn_length(row, tokenizer)] for row in completion.tolist()]
        cells = [clicked_cell(tokenizer, ids, prefix, tools, frame, side) for ids in turns]
        return inputs, length, completion, cells

    for step in range(1, args.steps + 1):
        pairs = screens(args.screens, args.prompts, side, rng)
        if args.mode == "pg":
            inputs, length, completion, cells = sample(pairs, args.samples)
            doors = [door for _, door in pairs for _ in range(args.samples)]
            reward = torch.tensor([float(c == d) for c, d in zip(cells, doors, strict=True)]).view(
                args.prompts, args.samples
            )
            advantages = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)).view(-1)
            if args.advantage == "hits":  # a diagnostic: the hits alone, weight 1 (supervised on the policy's own hits)
                advantages = reward.view(-1)
            hits += int(reward.sum())
            formed += sum(c is not None for c in cells)
            seen += len(cells)
            ids = torch.cat([inputs["input_ids"], completion], 1)
            mask = _call_mask(completion, tokenizer)
            if args.formed_only:  # a diagnostic: the calls that parse alone carry the loss
                mask *= torch.tensor([float(c is not None) for c in cells])[:, None]
            model.train()
            optimizer.zero_grad()
            for start in range(0, len(ids), 32):
                part = slice(start, start + 32)
                logps = _logps(model, ids[part], inputs, part, length, args.temperature)
                loss = -(advantages[part, None] * logps * mask[part]).sum() / mask.sum().clamp(min=1)
                loss.backward()
            optimizer.step()
        else:
            texts, images = [prompt + answers[door] for _, door in pairs], [budget.fit(image) for image, _ in pairs]
            batch = processor(text=texts, images=images, return_tensors="pt", padding=True)
            model.train()
            optimizer.zero_grad()
            logits = model(**batch).logits[:, prompt_length - 1 : -1]
            target = batch["input_ids"][:, prompt_length:]
            mask = batch["attention_mask"][:, prompt_length:].float()
            logps = logits.log_softmax(-1).gather(-1, target[..., None])[..., 0]
            (-(logps * mask).sum() / mask.sum()).backward()
            optimizer.step()
            if step % args.every == 0:
                probe = screens(args.screens, 8, side, rng)
                _, _, _, cells = sample(probe, args.samples // 2 or 1)
                doors = [door for _, door in probe for _ in range(args.samples // 2 or 1)]
                hits = sum(c == d for c, d in zip(cells, doors, strict=True))
                formed, seen = sum(c is not None for c in cells), len(cells)
        if step % args.every == 0:
            rows.append({"mode": args.mode, "screens": args.screens, "tools_turn": args.tools_turn,
                         "formed_only": args.formed_only, "advantage": args.advantage,
                         "adam_epsilon": args.adam_epsilon, "lr": args.lr, "tiny": json.dumps(args.tiny) if args.tiny else "",
                         "prompts": args.prompts, "samples": args.samples, "step": step, "door_rate": hits / seen,
                         "well_formed": formed / seen, "commit": commit(),
                         "date": datetime.date.today().isoformat()})  # fmt: skip
            print(markdown_table(rows[-1:], FIELDS).splitlines()[-1], flush=True)
            hits, formed, seen = 0, 0, 0
    return rows


def _repeat(key: str, value, samples: int, prompts: int):
    """``value`` (a processor output for ``prompts`` prompts) for each prompt's ``samples`` samples in turn."""
    if key == "pixel_values":  # one row per patch, the same count for every screen
        return value.view(prompts, -1, value.shape[-1]).repeat_interleave(samples, 0).reshape(-1, value.shape[-1])
    return value.repeat_interleave(samples, 0)


def _turn_length(row: list[int], tokenizer) -> int:
    """The tokens of a completion ``row`` through its first end of turn (padding after it, or in its place, left out)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return next((j + (token == end) for j, token in enumerate(row) if token in (end, tokenizer.pad_token_id)), len(row))


def _call_mask(completion, tokenizer):
    """1 on each completion's tokens through its first end of turn, 0 after (and on padding)."""
    import torch

    mask = torch.ones_like(completion, dtype=torch.float)
    for i, row in enumerate(completion.tolist()):
        mask[i, _turn_length(row, tokenizer) :] = 0
    return mask


def _logps(model, ids, inputs, part, length: int, temperature: float):
    """Per-token log-probabilities of ``ids``' completions (after ``length``) under ``model``, with grad."""
    import torch

    patches = inputs["pixel_values"].view(len(inputs["input_ids"]), -1, inputs["pixel_values"].shape[-1])
    pixel_values = patches[part].reshape(-1, patches.shape[-1])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixel_values,
                   image_grid_thw=inputs["image_grid_thw"][part]).logits[:, length - 1:-1]  # fmt: skip
    return (logits / temperature).log_softmax(-1).gather(-1, ids[:, length:, None])[..., 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("pg", "sft"), default="pg")
    parser.add_argument("--screens", choices=("task", "grounding"), default="task")
    parser.add_argument("--tools_turn", type=lambda v: v.lower() in ("1", "true", "yes"), default=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--formed_only", action="store_true", help="pg: only the well-formed calls carry the loss")
    parser.add_argument(
        "--advantage",
        choices=("grpo", "hits"),
        default="grpo",
        help="pg: group-normalised advantages, or weight 1 on the hits and 0 elsewhere (a diagnostic)",
    )
    parser.add_argument("--adam_epsilon", type=float, default=1e-8, help="AdamW's epsilon (TrainingArguments')")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--family", default="qwen2_5_vl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prior_dir", default=os.path.join(tempfile.gettempdir(), "suzak-bench-click-prior"))
    parser.add_argument("--prior_steps", type=int, default=None, help="the prior's SFT steps (default: the task's)")
    parser.add_argument(
        "--tiny",
        type=json.loads,
        default={},
        help="the tiny model's sizes where they differ from the "
        "task's (JSON, TinyConfig's fields: '{\"hidden_size\": 128, \"num_attention_heads\": 4}'); "
        "the prior in --prior_dir is reused as it is, whatever they say",
    )
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", help="print the rows of this results file and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown_table([json.loads(line) for line in Path(args.table).read_text().splitlines()], FIELDS))
        return
    rows = run(args)
    append_rows(args.results, rows)
    print(markdown_table(rows, FIELDS))


if __name__ == "__main__":
    sys.exit(main())
