"""suzak: GRPO for Qwen VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) on verifiable rewards, a thin layer over
TRL's GRPOTrainer."""

__version__ = "0.1.0"


class SuzakError(Exception):
    """An error a user can act on; entry points print its message as one line instead of a traceback."""
