"""Models: loading a checkpoint for training or evaluation (dtype, attention, LoRA adapters) and the offline tiny
Qwen2.5-VL that tests and demos use (``python -m suzak.tiny``)."""
