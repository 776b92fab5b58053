"""Model loading choices that do not need a GPU to test: the attention implementation picked for ``auto``."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from suzak.models.loading import pick_attn_implementation


def test_auto_is_sdpa_without_a_gpu(monkeypatch, caplog):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    caplog.set_level(logging.INFO, logger="suzak.models.loading")
    assert pick_attn_implementation("auto") == "sdpa" and pick_attn_implementation(None) == "sdpa"
    assert "attention implementation: sdpa" in caplog.text


def test_auto_falls_back_to_sdpa_when_flash_attn_is_broken(monkeypatch, caplog, tmp_path):
    """A GPU with a flash-attn build that fails to import (built for another torch, say): a warning, then sdpa."""
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c10")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    caplog.set_level(logging.INFO, logger="suzak.models.loading")
    assert pick_attn_implementation("auto") == "sdpa"
    assert "flash-attn unavailable (ImportError): using sdpa" in caplog.text
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed at all: the same fallback
    assert pick_attn_implementation("auto") == "sdpa"


def test_auto_takes_flash_attention_when_it_imports_on_a_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    assert pick_attn_implementation("auto") == "flash_attention_2"


@pytest.mark.parametrize("name", ["sdpa", "eager", "flash_attention_2"])
def test_explicit_choices_pass_through(name, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert pick_attn_implementation(name) == name
