"""Data: the dataset builders (one per source, the same columns), the procedural CLEVR generator and the GSM8K-style
word problems. ``python -m suzak.data BUILDER --output DIR`` writes a built dataset to disk."""

from suzak.data.builders import DATASETS, build_dataset, read_jsonl, save_dataset

__all__ = ["DATASETS", "build_dataset", "read_jsonl", "save_dataset"]
