"""Models: loading a checkpoint for training or evaluation (dtype, attention, LoRA adapters, the family check) and
the offline tiny model of each Qwen VL family that tests and demos use (``suzak tiny``)."""
