"""Evaluation: R1-V's SuperCLEVR counting and GeoQA protocols, GSM8K and held-out CLEVR, on HF or vLLM engines.

- :mod:`suzak.eval.tasks`: items, prompt templates and the scoring rules (``strict``: the reward parsers; ``r1v``:
  R1-V's eval scripts' rule, exactly);
- :mod:`suzak.eval.engine`: ``HFEngine`` (batched ``generate``) and ``VLLMEngine`` (GPU), the same rows in and text out;
- :mod:`suzak.eval.models`: loading base models, full checkpoints, LoRA adapters and DeepSpeed output dirs;
- :mod:`suzak.eval.runner`: resumable, rank-sharded passes (greedy + seeds) writing R1-V's JSON;
- :mod:`suzak.eval.report`: the JSON, the markdown summary and the published reference numbers;
- :mod:`suzak.eval.rescore`: re-scoring any results file in R1-V's format under both rules, without a model;
- :mod:`suzak.eval.multigpu`: R1-V's multi-GPU GeoQA command line, one torchrun process per listed GPU;
- :mod:`suzak.eval.fixtures`: small R1-V-format files with drawn images, for tests and dry runs.

See docs/evaluate.md for the commands.
"""

from suzak.eval.engine import HFEngine, VLLMEngine
from suzak.eval.report import REFERENCES
from suzak.eval.runner import EvalConfig, evaluate
from suzak.eval.tasks import TASKS, score

__all__ = ["REFERENCES", "TASKS", "EvalConfig", "HFEngine", "VLLMEngine", "evaluate", "score"]
