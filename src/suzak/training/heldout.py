"""``suzak heldout``: a GRPO recipe's held-out evaluation, on any checkpoint.

The rows the recipe holds out (``eval_rows``; a mixture: each source's own), each scored by its source's first
reward, at the budgets, template and tools the run trains with, answered greedily by the evaluation's HF engine:
exactly what training logs at any step (the same code, :class:`suzak.runs.generation_eval.GenerationEvalCallback`):
``eval/accuracy`` and ``eval/<source>/accuracy`` (the answers correct at the reward's threshold or the recipe's
``eval_correct_at``), ``eval/score`` and ``eval/<source>/score`` (the mean score), for a saved run, a
``checkpoint-N``, a LoRA adapter, the base model or another run's model. For a task with a benchmark of its own
(SuperCLEVR, GeoQA, RefCOCO, ...) use ``suzak eval``; this is the recipe's own yardstick, per source, for tasks that
have none (a judge-scored source, a procedural one).

    suzak heldout --config recipes/mixture_smoke.yaml --model_path outputs/mixture-smoke/checkpoint-300

Prints each source's accuracy and mean score and writes a JSON of the figures and every row's prompt, answer, gold
and verdict, in ``suzak eval``'s results format (accuracy in %; ``suzak release`` puts it in the model card)
(``--output_path``; default ``logs/heldout_<recipe>_results_<model>.json``, as ``suzak eval`` names its files). Any
recipe field may follow as a flag (``--eval_rows 64``, ``--eval_max_new_tokens 512``).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from suzak import SuzakError

__all__ = ["evaluate_heldout", "main"]

logger = logging.getLogger(__name__)

OWN_FLAGS = ("--model_path", "--output_path")
USAGE = ("usage: suzak heldout --config RECIPE [--model_path PATH] [--output_path FILE] [RECIPE FLAGS...]  (the "
         "recipe's flags: suzak train --help)")  # fmt: skip


def _own_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """(``--model_path``/``--output_path`` values, the recipe's flags).

    >>> _own_flags(["--config", "r.yaml", "--model_path", "out/ckpt", "--eval_rows", "8"])
    ({'--model_path': 'out/ckpt'}, ['--config', 'r.yaml', '--eval_rows', '8'])
    """
    own, rest, items = {}, [], iter(argv)
    for flag in items:
        name, sep, value = flag.partition("=")
        if name in OWN_FLAGS:
            value = value if sep else next(items, None)
            if not value:
                raise SuzakError(f"{name} needs a value")
            own[name] = value
        else:
            rest.append(flag)
    return own, rest


def evaluate_heldout(argv: list[str]) -> dict:
    """The held-out figures of ``argv``'s recipe on its ``--model_path`` (default: the recipe's model), as the
    results JSON that :func:`main` writes."""
    from suzak.eval.models import load_eval_model
    from suzak.models.loading import adapter_base, resolve_model_path
    from suzak.training.build import RunInputs, build_datasets, eval_callback, run_tools
    from suzak.training.configs import _split_config, parse_args

    own, flags = _own_flags(argv)
    model_path = own.get("--model_path")
    if model_path is not None:  # the model's config (patch size, family) for the budgets: an adapter's is its base's
        local = Path(resolve_model_path(model_path))
        flags += ["--model_name_or_path", (adapter_base(local) if local.is_dir() else None) or model_path]
    suzak_args, args, model_args = parse_args([*flags, "--eval_steps", "1"])  # one evaluation: no cadence to check
    model_path = model_path or model_args.model_name_or_path
    inputs = RunInputs.read(suzak_args, model_args)
    _, heldout = build_datasets(suzak_args, args, inputs)
    if not heldout:
        raise SuzakError("the recipe holds out no rows (eval_rows 0): set eval_rows (e.g. --eval_rows 64)")
    toolset = run_tools(suzak_args, inputs, args.max_tool_calling_iterations)
    model, processing_class = load_eval_model(model_path)
    callback = eval_callback(suzak_args, args, heldout, inputs.scorer, processing_class, inputs.budget,
                             inputs.video_budget, toolset, inputs.scorers)  # fmt: skip
    accuracy, table = callback.evaluate(model, step=0)
    # each mixture source that has held-out rows: its accuracy and mean score, as training logs them
    sources = [s.name for s, _, _ in inputs.sources if f"eval/{s.name}/accuracy" in callback.figures]
    counts = {name: sum(row.get("source") == name for row in heldout) for name in sources}
    recipe = _split_config(argv)[0]
    # suzak eval's results format (accuracy in %, R1-V's per-result keys), so suzak release puts it in the model card
    payload = {
        "task": f"heldout ({Path(recipe).stem})" if recipe else "heldout",
        "recipe": recipe,
        "model_path": model_path,
        "accuracy": 100 * accuracy,
        "score": callback.figures["eval/score"],
        "correct": sum(bool(row[-1]) for row in table),
        "total": len(table),
        "sources": {name: {"accuracy": 100 * callback.figures[f"eval/{name}/accuracy"],
                           "score": callback.figures[f"eval/{name}/score"], "total": counts[name]} for name in sources},
        "figures": callback.figures,
        "results": [{"source": source, "question": prompt, "ground_truth": gold, "model_output": output,
                     "is_correct": bool(correct)}
                    for (_, _, prompt, output, gold, correct), source in
                    zip(table, [row.get("source") for row in heldout], strict=True)],
    }  # fmt: skip
    return payload


def main(argv: list[str] | None = None) -> None:
    from suzak.eval.runner import default_results_path

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(flag in ("-h", "--help") for flag in argv):
        print(USAGE, "", __doc__, sep="\n")
        raise SystemExit(0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        payload = evaluate_heldout(argv)
        own, _ = _own_flags(argv)
        task = f"heldout_{Path(payload['recipe']).stem}" if payload["recipe"] else "heldout"
        path = Path(own.get("--output_path") or default_results_path(task, payload["model_path"]))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as error:
            raise SuzakError(f"--output_path {path}: cannot write it ({error.strerror or error})") from None
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    whole = f"{payload['accuracy']:.2f}% of {payload['total']} rows (mean score {payload['score']:.3f})"
    print(f"held-out accuracy of {payload['model_path']}: {whole}")
    for name, figures in payload["sources"].items():
        print(f"  {name}: {figures['accuracy']:.2f}% of {figures['total']} rows (mean score {figures['score']:.3f})")
    print(f"results saved to {path} (suzak release --eval_results takes it for the model card)")


if __name__ == "__main__":
    main()
