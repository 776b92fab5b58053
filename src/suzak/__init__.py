"""suzak: GRPO for Qwen VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) on verifiable rewards, a thin layer over
TRL's GRPOTrainer."""

__version__ = "0.1.0"


class SuzakError(Exception):
    """An error a user can act on; entry points print its message as one line instead of a traceback."""


def _quiet_bitsandbytes_cpu_kernel_notice() -> None:
    """bitsandbytes (imported by PEFT, so by every suzak command) warns at import, on a CPU with AVX-512 BF16, that
    its faster 4-bit kernel would come from the Hub's ``kernels`` package; its own fallback runs either way and Hub
    kernels cannot be downloaded offline. Only that notice is dropped; bitsandbytes' other messages pass."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        lambda record: "kernels-community" not in record.getMessage()
    )


_quiet_bitsandbytes_cpu_kernel_notice()
