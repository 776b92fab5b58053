"""A batch's prompts tokenized once each: TRL's ``_tokenize_prompts`` on each distinct prompt, laid out for every row.

A batch holds each prompt ``num_generations`` times; :func:`prompt_keys` says which rows are the same prompt (with
``environment_factories``, per prompt and ``_batch_environments`` entry, whose tools TRL renders into each) and
:func:`expand_tokenized_prompts` lays TRL's output out for every row. :func:`_empty_for_none` and
:func:`_none_for_empty` turn TRL's per-row image lists into what its processor call and its vLLM requests take.

Contract tests (tests/test_trl_contract.py):
``test_tokenize_prompts_reads_the_rows_environments_and_returns_ids_images_and_fields``,
``test_a_row_without_images_is_none_in_trls_image_lists``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def prompt_keys(prompts: list, environments: Sequence | None = None) -> list[tuple] | None:
    """One key per prompt, equal for prompts the processor renders alike: each message's role and text, each
    image's mode, size and pixels (a hash of them), and the row's environment where there is one; None when a prompt
    holds anything else (a video, a message with other fields), which is then not compared."""
    import hashlib

    from PIL import Image

    keys, hashed = [], {}  # a batch's copies of one prompt mostly share their (fitted) image objects: hashed once
    for row, prompt in enumerate(prompts):
        if not isinstance(prompt, list):
            return None
        key: list = [environments[row] if environments is not None else None]
        for message in prompt:
            if not isinstance(message, dict) or set(message) - {"role", "content"}:
                return None
            content = message.get("content")
            if isinstance(content, str):
                key.append((message.get("role"), content))
                continue
            if not isinstance(content, list):
                return None
            parts = []
            for part in content:  # TRL's parts may carry the other kind's key as None ({"type": "image", "text": None})
                part = (
                    {name: value for name, value in part.items() if value is not None} if isinstance(part, dict) else {}
                )
                kind = part.get("type")
                if kind == "text" and set(part) == {"type", "text"}:
                    parts.append(("text", part["text"]))
                elif kind == "image" and set(part) == {"type", "image"} and isinstance(part["image"], Image.Image):
                    image = part["image"]
                    if id(image) not in hashed:
                        hashed[id(image)] = hashlib.blake2b(image.tobytes(), digest_size=16).digest()
                    parts.append(("image", image.mode, image.size, hashed[id(image)]))
                else:
                    return None
            key.append((message.get("role"), tuple(parts)))
        keys.append(tuple(key))
    return keys


def expand_tokenized_prompts(prompt_ids: list, images: list | None, fields: dict, rows: list[int]):
    """``_tokenize_prompts``' output for distinct prompts laid out for the batch's ``rows`` (row ``i`` is distinct
    prompt ``rows[i]``): ids and per-token fields copied per row, images per row, and ``pixel_values`` /
    ``image_grid_thw`` (Qwen's layout: each image's patches, one after another) concatenated in row order. None for
    any other field (the caller then tokenizes every row)."""
    images_fields = {"pixel_values", "image_grid_thw"}
    per_row = {key: value for key, value in fields.items()
               if key not in images_fields and isinstance(value, list) and len(value) == len(prompt_ids)}  # fmt: skip
    if set(fields) - set(per_row) - images_fields:
        return None
    out_fields: dict[str, Any] = {key: [list(value[row]) for row in rows] for key, value in per_row.items()}
    if "pixel_values" in fields:
        grids = fields.get("image_grid_thw")
        counts = [len(row or []) for row in images or []]
        if grids is None or len(counts) != len(prompt_ids) or sum(counts) != grids.size(0):
            return None
        patches = grids.prod(-1).tolist()
        if sum(patches) != fields["pixel_values"].size(0):
            return None
        starts = np.cumsum([0, *counts]).tolist()
        pixels = torch.split(fields["pixel_values"], [sum(patches[a:b]) for a, b in itertools.pairwise(starts)])
        out_fields["pixel_values"] = torch.cat([pixels[row] for row in rows])
        out_fields["image_grid_thw"] = torch.cat([grids[starts[row] : starts[row + 1]] for row in rows])
    elif "image_grid_thw" in fields:
        return None
    return (
        [list(prompt_ids[row]) for row in rows],
        None if images is None else [images[row] for row in rows],
        out_fields,
    )


def _empty_for_none(images: list | None) -> list | None:
    """TRL's per-row image lists with ``[]`` for a row without images where the batch has some: the processor TRL
    calls on the batch takes an empty list for such a row, not None (TRL builds None)."""
    return images if images is None else [[] if row is None else row for row in images]


def _none_for_empty(images: list | None) -> list | None:
    """TRL's per-row image lists with None for a row without images: TRL's vLLM requests send ``row[0]`` unless the
    row is None."""
    return images if images is None else [row or None for row in images]


def tokenize_each_prompt_once(trainer, tokenize: Callable, prompts: list):
    """TRL's ``tokenize`` (``_tokenize_prompts``) on each distinct prompt once, its output then laid out for every row as TRL's
    own call on all rows gives it (the same ids, pixel values and grids, tested to the bit): a batch holds each
    prompt ``num_generations`` times (the sampler repeats it), and the processor resized and patched every copy
    of its images again (the counting trainer-test: 166 ms a step for 128 rows, 12 ms for their 16 prompts). Prompts
    are the same when their messages' text and images' pixels are (and, with ``environment_factory``, their
    environment, whose tools TRL renders into each): :func:`prompt_keys`. Anything else falls back to TRL's call."""
    environments = trainer._batch_environments if trainer.environment_factories is not None else None
    keys = prompt_keys(prompts, environments)
    if keys is None or len(set(keys)) == len(keys):
        return tokenize(prompts)
    first: dict = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    if environments is not None:
        trainer._batch_environments = [environments[row] for row in first.values()]
    try:
        prompt_ids, images, fields = tokenize([prompts[row] for row in first.values()])
    finally:
        if environments is not None:
            trainer._batch_environments = environments
    position = {key: index for index, key in enumerate(first)}
    rows = [position[key] for key in keys]
    expanded = expand_tokenized_prompts(prompt_ids, images, fields, rows)
    return expanded if expanded is not None else tokenize(prompts)
