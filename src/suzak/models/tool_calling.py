"""Each Qwen family's tool-call format: a chat template that renders tool calls and tool results (with images), and
the parser TRL reads the model's calls with.

==============  ================================================  =========================================
family          template                                          a call as the model writes it
==============  ================================================  =========================================
qwen2_vl,       suzak's ``chat_templates/qwen2_vl_tools.jinja``   ``<tool_call>\\n{"name": ..., "arguments":
qwen2_5_vl      (their own has no tool format, verl#2949): the    {...}}\\n</tool_call>`` (Qwen2.5's JSON
                model's own turns, Qwen2.5-Instruct's tools      convention)
qwen3_vl        the checkpoint's own (native tool format)         the same JSON form
qwen3_5(_moe)   the checkpoint's own (native tool format)         ``<tool_call>\\n<function=zoom>\\n<parameter=
                                                                  bbox_2d>...</parameter>...`` (XML)
==============  ================================================  =========================================

Tool results come back in a user turn as ``<tool_response>...</tool_response>``, images inside it as the family's
``<|vision_start|><|image_pad|><|vision_end|>``. Text models (Qwen2.5, Qwen3) use the JSON form with their own
templates.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from suzak import SuzakError

__all__ = ["CALL_FORMS", "TOOL_TEMPLATES", "prepare_tool_calling", "tool_template"]

logger = logging.getLogger(__name__)

TEMPLATES_DIR = Path(__file__).with_name("chat_templates")
# Families whose checkpoints' templates cannot render tools: the template suzak gives them.
TOOL_TEMPLATES = {"qwen2_vl": "qwen2_vl_tools", "qwen2_5_vl": "qwen2_vl_tools"}
# model_type -> how the model writes a call (the parser TRL reads it with).
# Every vision-language family suzak sizes (suzak.media.vision.FAMILIES) has one; an MoE variant writes as its family.
CALL_FORMS = {"qwen2_vl": "json", "qwen2_5_vl": "json", "qwen3_vl": "json", "qwen3_vl_moe": "json", "qwen3_5": "xml",
              "qwen3_5_moe": "xml", "qwen2": "json", "qwen3": "json"}  # fmt: skip


def tool_template(family: str) -> str:
    """The chat template suzak ships for ``family``'s tool calls (only for the families in :data:`TOOL_TEMPLATES`)."""
    return (TEMPLATES_DIR / f"{TOOL_TEMPLATES[family]}.jinja").read_text(encoding="utf-8")


def prepare_tool_calling(processing_class: Any, model_type: str | None) -> None:
    """Make ``processing_class`` render and parse ``model_type``'s tool calls, in place, before TRL checks it.

    Qwen2-VL and Qwen2.5-VL get :func:`tool_template` unless their template already renders a tool conversation; the
    tokenizer gets the parser of the family's call form unless it has one (a checkpoint may ship its own). A family
    suzak has no form for is one line.
    """
    from trl.chat_template_utils import supports_tool_calling

    # TRL's trainer stack (~3 s of imports): only where tools run
    from suzak.trl_internals.tools import tool_call_parser

    if model_type not in CALL_FORMS:
        raise SuzakError(f"tools: suzak knows the tool-call format of {', '.join(CALL_FORMS)}, not {model_type!r}")
    if model_type in TOOL_TEMPLATES and not supports_tool_calling(processing_class):
        processing_class.chat_template = tool_template(model_type)
        logger.info("tools: %s's chat template has no tool format; using suzak's %s.jinja (Qwen2.5's <tool_call> "
                    "JSON convention)", model_type, TOOL_TEMPLATES[model_type])  # fmt: skip
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        tokenizer.response_template = tool_call_parser(CALL_FORMS[model_type])
