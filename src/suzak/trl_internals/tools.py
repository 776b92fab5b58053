"""TRL's tool loop, read and reused: its parser, its tools, its tool turns and their tokens.

- :func:`tool_call_parser`: TRL's response templates for Qwen's two tool-call forms (``trl.chat_template_utils``'s
  ``qwen3_template``, the ``<tool_call>`` JSON form, and ``qwen3_5_template``, the XML form), which
  ``tokenizer.parse_response`` reads the model's calls with;
- :func:`parse_turn`, :func:`environment_tools` and :func:`tool_message`: how ``GRPOTrainer._tool_call_loop`` reads a
  turn (``trl.chat_template_utils.parse_response``), which of an environment's methods it offers as tools, and the
  tool turn it appends for a result or a failed call (``{"error": ...}``), for the evaluation's tool loop
  (:mod:`suzak.eval.tool_loop`) to run the same loop outside the trainer;
- :func:`tool_turn_key` / :func:`tool_turn_length`: ``GRPOTrainer._get_tool_suffix_ids`` (each distinct tool turn
  rendered once; a tool turn's length for the pre-check, called before the trainer exists on the attributes it reads:
  ``processing_class``, ``chat_template``, ``chat_template_kwargs``, ``_is_vlm``, ``_tokenizer``).

Contract tests (tests/test_trl_contract.py): ``test_tool_loop_internals_the_zoom_relies_on``,
``test_the_tool_loop_steps_the_eval_repeats``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from trl import GRPOTrainer


def tool_call_parser(form: str) -> dict:
    """TRL's response template for a tool-call ``form``: ``json`` (Qwen2.5, Qwen3, Qwen3-VL and suzak's Qwen2-VL /
    Qwen2.5-VL template) or ``xml`` (Qwen3.5)."""
    from trl import chat_template_utils

    return {"json": chat_template_utils.qwen3_template, "xml": chat_template_utils.qwen3_5_template}[form]


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list) -> dict:
    """One generated turn as the assistant message TRL's tool loop reads it (``content``, ``tool_calls``): its ids
    parsed by ``parse_response`` with the tokenizer's response template, after the prompt ids ``prefix``, the
    arguments typed by ``tools``' schemas (an unparsable call falls back to plain text, as in training)."""
    from trl.chat_template_utils import parse_response

    if not ids:
        return {"role": "assistant", "content": ""}
    return parse_response(tokenizer, ids, prefix=prefix, tools=tools)


def environment_tools(environment: Any) -> list[Callable]:
    """The methods of ``environment`` that TRL offers the policy as tools: its class's public functions but ``reset``
    and ``get_reward``, in name order (``GRPOTrainer``'s rule, per rollout)."""
    import inspect

    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]  # fmt: skip


def tool_message(name: str, result: Any = None, error: Exception | str | None = None) -> dict:
    """The tool turn TRL appends for a call: a list of content blocks (an image crop) as it is, anything else as its
    ``str``; a failed call as ``str({"error": ...})``, the text the policy reads in training.

    >>> tool_message("zoom", error=ValueError("zoom: no image"))
    {'role': 'tool', 'name': 'zoom', 'content': "{'error': 'zoom: no image'}"}
    """
    if error is not None:
        result = {"error": str(error)}
    return {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}


def tool_turn_key(tool_messages: list[dict], chat_template_kwargs: Mapping | None) -> tuple | None:
    """What the tokens of a tool turn (``GRPOTrainer._get_tool_suffix_ids``) depend on: each message's role, name and
    texts, an image by its size alone (a Qwen processor gives an image one token per patch of its size, resized by
    size), and the template's keyword arguments; None where a message holds anything else (then nothing is reused).

    >>> from PIL import Image
    >>> turn = lambda size: [{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": Image.new("RGB", size)}]}]
    >>> tool_turn_key(turn((56, 28)), {}) == tool_turn_key(turn((56, 28)), {}) != tool_turn_key(turn((28, 56)), {})
    True
    >>> tool_turn_key([{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": "crop.png"}]}], {}) is None
    True
    """
    from PIL import Image

    key = []
    for message in tool_messages:
        if not set(message) <= {"role", "name", "content"}:
            return None
        content = message.get("content")
        if isinstance(content, list):
            blocks = []
            for block in content:
                if block.get("type") == "text" and set(block) == {"type", "text"}:
                    blocks.append(("text", block["text"]))
                elif (
                    block.get("type") == "image"
                    and set(block) == {"type", "image"}
                    and isinstance(block["image"], Image.Image)
                ):
                    blocks.append(("image", block["image"].size))
                else:
                    return None
            content = tuple(blocks)
        elif not isinstance(content, str):
            return None
        key.append((message.get("role"), message.get("name"), content))
    return tuple(key), repr(chat_template_kwargs)


def tool_turn_length(processing_class: Any, tool_messages: list[dict], chat_template_kwargs: dict | None = None) -> int:
    """What :meth:`.hooks.GRPOHooks.tool_turn_length` counts, before any trainer or weights exist: TRL's own
    ``GRPOTrainer._get_tool_suffix_ids`` on the attributes it reads, set as ``GRPOTrainer.__init__`` sets them for a
    run with tools on a VLM (the processor's template, or TRL's prefix-preserving training template in its place).
    ``processing_class`` must already render tool calls (:func:`suzak.models.tool_calling.prepare_tool_calling`)."""
    from types import SimpleNamespace

    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    preserving = is_chat_template_prefix_preserving(processing_class)
    reader = SimpleNamespace(
        processing_class=processing_class,
        chat_template=None if preserving else get_training_chat_template(processing_class),
        chat_template_kwargs=chat_template_kwargs or {},
        _is_vlm=True,
        _tokenizer=processing_class.tokenizer,
    )
    return len(GRPOTrainer._get_tool_suffix_ids(reader, tool_messages))


def log_tool_problems(trainer) -> None:
    """This batch's failed tool calls by reason (the trainer's ``tool_problem_counts`` over TRL's per-rollout
    ``environments``), summed over ranks into the step's log as ``tools/<reason>``."""
    counts = trainer.tool_problem_counts(trainer.environments or [])
    if not counts:
        return
    totals = trainer.accelerator.gather(torch.tensor([list(counts.values())], device=trainer.accelerator.device))
    mode = "train" if trainer.model.training else "eval"
    for reason, total in zip(counts, totals.sum(0).tolist(), strict=True):
        trainer._metrics[mode][f"tools/{reason}"].append(float(total))
