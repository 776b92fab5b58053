r"""What a LoRA config adapts, counted by PEFT's own matching rules, and a check that every target matches something.

PEFT stops only when *no* target matches: a target that matches nothing beside others that do (``--lora_target_modules
q_proj v_projx``, ``--lora_target_parameters mlp.expert.gate_up_proj``) trains less than asked, with a warning at
most. :func:`check_lora_targets` (called by the GRPO and SFT trainers' builders) stops such a run before step 1 with
one line naming the flag, the target and the closest names the model has.

- ``lora_target_modules`` (PEFT's ``target_modules``): a list of names; one matches a module called that name or
  ending in ``.NAME``. A single string is a regular expression PEFT matches against whole module names, and TRL's
  ``ModelConfig`` turns a one-name list into one, so ``--lora_target_modules q_proj`` alone matches nothing (write
  ``'.*\.q_proj'``, or name two modules). ``all-linear``: every linear layer but the output head.
- ``lora_target_parameters`` (PEFT's ``target_parameters``): a parameter named that or ending in ``.NAME``. This is
  how LoRA reaches MoE experts kept as fused 3-D tensors, which are no ``nn.Linear``: Qwen3.5 MoE's and Qwen3-VL MoE's
  ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj`` (checkpoints store them per expert,
  ``mlp.experts.0.gate_proj.weight``; transformers fuses them on load, and PEFT matches the fused names).

    python -m suzak.models.lora_targets tiny:qwen3_5_moe --parameters mlp.experts.gate_up_proj mlp.experts.down_proj
    python -m suzak.models.lora_targets /models/Qwen3.5-35B-A3B --targets q_proj k_proj v_proj o_proj

The command builds the model from its ``config.json`` on the meta device (no weights are read), prints what each
target matches and exits 2 with one line when a target matches nothing.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import logging
import sys
from typing import NamedTuple

from suzak import SuzakError

__all__ = [
    "LANGUAGE_MODEL_TARGETS",
    "MODULES_FLAG",
    "PARAMETERS_FLAG",
    "TargetRow",
    "check_lora_targets",
    "count_targets",
    "format_table",
    "language_model_linear_names",
    "main",
    "meta_model",
    "with_default_targets",
]

logger = logging.getLogger(__name__)

MODULES_FLAG = "lora_target_modules"
PARAMETERS_FLAG = "lora_target_parameters"


class TargetRow(NamedTuple):
    """What one LoRA target matches."""

    flag: str  # MODULES_FLAG or PARAMETERS_FLAG
    target: str
    matched: list[str]  # module names (MODULES_FLAG) or parameter names (PARAMETERS_FLAG)
    parameters: int  # weights in what it matched (a module's: all of its parameters)


def _numel(param) -> int:
    """A parameter's size, also when DeepSpeed ZeRO-3 has partitioned it away (``ds_numel``)."""
    return getattr(param, "ds_numel", None) or param.numel()


def _default_modules(model):
    """PEFT's LoRA targets for the model type when ``target_modules`` is None (``LoraModel._prepare_adapter_config``:
    e.g. q_proj and v_proj for qwen2; none for the Qwen VL families)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type)


def _module_rows(model, config) -> list[TargetRow]:
    """One row per ``target_modules`` entry, each matched alone by PEFT's ``check_target_module_exists`` (which also
    applies ``exclude_modules``, ``modules_to_save`` and ``layers_to_transform``)."""
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers, check_target_module_exists

    targets = config.target_modules
    named = [(name, module) for name, module in model.named_modules() if name]  # PEFT skips the root module
    rows = []
    for target in [targets] if isinstance(targets, str) else sorted(targets):
        single = copy.copy(config)
        single.target_modules = target if isinstance(targets, str) else {target}  # a string stays PEFT's regex
        single = _maybe_include_all_linear_layers(single, model)  # "all-linear" -> the names of the linear layers
        modules = [(name, module) for name, module in named if check_target_module_exists(single, name)]
        weights = {id(p): _numel(p) for _, module in modules for p in module.parameters()}
        rows.append(TargetRow(MODULES_FLAG, target, [name for name, _ in modules], sum(weights.values())))
    return rows


def _held_parameters(model) -> list[tuple[str, object]]:
    """(name, parameter) for each parameter under the module that holds it, as PEFT's ``_inject_parameters`` walks
    them; parameters of the root module are left out (PEFT refuses to wrap them)."""
    return [(f"{module_name}.{name}", param) for module_name, module in model.named_modules() if module_name
            for name, param in module.named_parameters(recurse=False)]  # fmt: skip


def _parameter_rows(model, targets) -> list[TargetRow]:
    """One row per ``target_parameters`` entry. PEFT 0.21's rule (``BaseTuner._inject_parameters``): a parameter
    matches when its full name is the target or ends in ``.TARGET``; it has no helper to call for it."""
    held = _held_parameters(model)
    rows = []
    for target in sorted(set(targets)):
        matched = [(name, p) for name, p in held if name == target or name.endswith(f".{target}")]
        rows.append(
            TargetRow(PARAMETERS_FLAG, target, [name for name, _ in matched], sum(_numel(p) for _, p in matched))
        )
    return rows


def count_targets(model, target_modules=None, target_parameters=None, *, peft_config=None) -> list[TargetRow]:
    """What each of ``target_modules`` (a list of names, a regex string or ``all-linear``) and ``target_parameters``
    matches in ``model``, by PEFT's rules; ``peft_config`` supplies the rest of a LoRA config (``exclude_modules``,
    ``modules_to_save``, ``layers_to_transform``). Without ``target_modules``, PEFT's default modules for the model
    type, if it has one.
    """
    from peft import LoraConfig

    config = copy.copy(peft_config) if peft_config is not None else LoraConfig()
    config.target_modules = list(target_modules) if isinstance(target_modules, (set, tuple)) else target_modules
    config.target_parameters = list(target_parameters) if target_parameters else None
    if config.target_modules is None:  # PEFT's default, added even beside target_parameters
        config.target_modules = _default_modules(model)
    rows = _module_rows(model, config) if config.target_modules else []
    return rows + (_parameter_rows(model, config.target_parameters) if config.target_parameters else [])


def _closest(target: str, names: list[str], n: int = 3) -> list[str]:
    """The names' dotted suffixes (of about the target's depth, no layer index first) closest to ``target``."""
    depth = target.count(".") + 1
    suffixes = set()
    for name in names:
        parts = name.split(".")
        for k in range(max(1, depth - 1), min(depth + 1, len(parts)) + 1):
            if not parts[-k].isdigit():
                suffixes.add(".".join(parts[-k:]))
    return difflib.get_close_matches(target, sorted(suffixes), n=n, cutoff=0.5)


def _miss(model, row: TargetRow) -> str:
    """Why ``row``'s target matched nothing, with the nearest names the model has."""
    if row.flag == MODULES_FLAG:
        names, what = [name for name, _ in model.named_modules() if name], "module"
    else:
        names, what = [name for name, _ in _held_parameters(model)], "parameter"
    line = f"{row.flag} {row.target!r} matches no {what} of {type(model).__name__}"
    if close := _closest(row.target, names):
        line += f" (closest names in the model: {', '.join(close)})"
    if row.flag == MODULES_FLAG and any(name.endswith(f".{row.target}") for name in names):
        # As a name in a list it would have matched: it was the single value PEFT reads as a whole-name regex.
        line += (f"; a single {MODULES_FLAG} value is a regular expression PEFT matches against whole module names "
                 f"(TRL makes one of a one-name list): write '.*\\.{row.target}' or name two modules")  # fmt: skip
    return line


# PEFT's whole-name regular expression for modules of those names outside the vision tower (``visual``)
LANGUAGE_MODEL_TARGETS = r"(?!(.*\.)?visual\.).*\.({})"


def language_model_linear_names(model) -> list[str]:
    r"""The names of the linear layers of ``model``'s language model: those PEFT's ``all-linear`` finds (the output head
    left out) outside the vision tower (``visual``), by their last name part.

    >>> import torch
    >>> class Tower(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.visual, self.layers = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(2, 2)}), torch.nn.ModuleDict(
    ...             {"q_proj": torch.nn.Linear(2, 2), "up_proj": torch.nn.Linear(2, 2)})
    >>> names = language_model_linear_names(Tower()); print(names, LANGUAGE_MODEL_TARGETS.format("|".join(names)))
    ['q_proj', 'up_proj'] (?!(.*\.)?visual\.).*\.(q_proj|up_proj)
    """
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    linear = _maybe_include_all_linear_layers(LoraConfig(target_modules="all-linear"), model).target_modules
    return sorted({name.rsplit(".", 1)[-1] for name in linear if ".visual." not in f".{name}."})  # full names


def with_default_targets(model, peft_config) -> list[str]:
    """Put LoRA on the language model's linear layers (:func:`language_model_linear_names`) in ``peft_config`` when it
    names no target and PEFT has no default for the model type (none for the Qwen VL families); returns the layer
    names it targeted, [] when it left the config as it was. The vision tower is not adapted, as suzak's LoRA
    recipes do."""
    if (peft_config is None or getattr(peft_config, "target_modules", False) is not None
            or getattr(peft_config, "target_parameters", None) or _default_modules(model)):  # fmt: skip
        return []
    if names := language_model_linear_names(model):
        peft_config.target_modules = LANGUAGE_MODEL_TARGETS.format("|".join(names))
    return names


def check_lora_targets(model, peft_config) -> list[TargetRow]:
    """Stop (:class:`~suzak.SuzakError`, one line) when any LoRA target of ``peft_config`` matches nothing in
    ``model``, before PEFT wraps it; log the counts when all match. Configs without targets (not LoRA) pass; a LoRA
    config with none, for a model PEFT has no default for, gets the language model's linear layers
    (:func:`with_default_targets`, in place)."""
    if peft_config is None or not hasattr(peft_config, "target_modules"):
        return []
    defaulted = with_default_targets(model, peft_config)
    modules, parameters = peft_config.target_modules, getattr(peft_config, "target_parameters", None)
    if parameters and (getattr(peft_config, "lora_dropout", 0) or getattr(peft_config, "use_dora", False)):
        # PEFT's ParamWrapper raises on either, as a traceback from inside the trainer's constructor.
        raise SuzakError(f"{PARAMETERS_FLAG} needs lora_dropout 0 and no use_dora (PEFT cannot apply either to a "
                         f"parameter; TRL's lora_dropout default is 0.05): add --lora_dropout 0"
                         f"{' --use_dora false' if getattr(peft_config, 'use_dora', False) else ''}")  # fmt: skip
    rows = count_targets(model, modules, parameters, peft_config=peft_config)
    if not rows:
        raise SuzakError(f"use_peft is set but neither {MODULES_FLAG} nor {PARAMETERS_FLAG} names what LoRA adapts, "
                         f"and PEFT has no default for model type {getattr(model.config, 'model_type', None)!r}: e.g. "
                         f"--{MODULES_FLAG} q_proj k_proj v_proj o_proj (or all-linear)")  # fmt: skip
    if misses := [row for row in rows if not row.matched]:
        raise SuzakError("; ".join(_miss(model, row) for row in misses) + ": LoRA would not train what it names")
    if defaulted:
        logger.info("use_peft with no %s: LoRA on the language model's %d linear layers (%s), not on the vision "
                    "tower; name targets to change it", MODULES_FLAG, len(rows[0].matched), ", ".join(defaulted))  # fmt: skip
    default = " (PEFT's default for the model type)" if modules is None and rows[0].flag == MODULES_FLAG else ""
    logger.info("LoRA targets%s: %s", default, ", ".join(
        f"{row.flag} {row.target}: {len(row.matched)} {'modules' if row.flag == MODULES_FLAG else 'parameters'} "
        f"({row.parameters:,} weights)" for row in rows))  # fmt: skip
    return rows


def meta_model(name: str, revision: str | None = None):
    """The model ``name`` (a folder, ``tiny``, ``tiny:<family>`` or a Hub id) built from its config on the meta
    device: every module and parameter name and shape, no weights read or allocated."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from suzak.models.loading import _checked_config

    _, config = _checked_config(SimpleNamespace(model_name_or_path=name, model_revision=revision))
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=False)


def format_table(rows: list[TargetRow]) -> str:
    """The rows as a small aligned table: flag, target, matches, parameters."""
    table = [("flag", "target", "matches", "parameters")]
    table += [(row.flag, row.target, str(len(row.matched)), f"{row.parameters:,}") for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    lines = []
    for flag, target, matches, parameters in table:  # names left-aligned, numbers right-aligned
        cells = [flag.ljust(widths[0]), target.ljust(widths[1]), matches.rjust(widths[2]), parameters.rjust(widths[3])]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.models.lora_targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model folder, tiny, tiny:<family> or a Hub id (its config.json only)")
    parser.add_argument("--targets", nargs="+", metavar="NAME", help=f"{MODULES_FLAG}, as the training flag takes them")
    parser.add_argument("--parameters", nargs="+", metavar="NAME", help=f"{PARAMETERS_FLAG}, as the training flag "
                        "takes them (MoE experts: mlp.experts.gate_up_proj mlp.experts.down_proj)")  # fmt: skip
    parser.add_argument("--revision", help="the Hub revision of a Hub id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from trl import ModelConfig, get_peft_config

    # The training flags' own path: TRL's ModelConfig turns a one-name --targets into PEFT's regex, as in training.
    # Dropout 0: this counts targets; a training run with lora_target_parameters is told to set it by the check.
    model_args = ModelConfig(model_name_or_path=args.model, use_peft=True, lora_target_modules=args.targets,
                             lora_target_parameters=args.parameters, lora_dropout=0.0)  # fmt: skip
    try:
        model = meta_model(args.model, args.revision)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    peft_config = get_peft_config(model_args)
    rows = count_targets(model, peft_config.target_modules, peft_config.target_parameters, peft_config=peft_config)
    print(f"{args.model} ({type(model).__name__}): what each LoRA target matches")
    print(format_table(rows))
    try:
        check_lora_targets(model, peft_config)
    except SuzakError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
