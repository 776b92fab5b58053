"""Releasing a trained model: the release folder and Hub upload (``python -m suzak.release``), its model card, and
exporting DeepSpeed or LoRA checkpoints to plain model folders (``suzak export``)."""
