"""Shared fixtures: the tiny offline Qwen2.5-VL is built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from suzak.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.5-vl")


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def gsm8k_jsonl() -> Path:
    return FIXTURES / "gsm8k_tiny.jsonl"


@pytest.fixture(scope="session")
def eval_fixture_dir(tmp_path_factory) -> Path:
    """R1-V-format SuperCLEVR-like (8 items, mixed image sizes) and GeoQA-like (6 items) files with their images."""
    from suzak.eval.fixtures import write_fixtures

    root = tmp_path_factory.mktemp("r1v-eval")
    write_fixtures(root, superclevr=8, geoqa=6)
    return root
