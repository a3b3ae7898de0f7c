"""Shared fixtures of the unit tests: the real tokenizer of the default model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The converted default model (with its tokenizer) lives in the project's cache.
os.environ.setdefault("BATCHGEN_CACHE", str(Path(__file__).resolve().parents[2] / ".cache"))
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

MODEL_DIR = Path(os.environ["BATCHGEN_CACHE"]) / "models" / "SmolLM2-135M-Instruct-98362432"


@pytest.fixture(scope="session")
def tokenizer():
    """The real tokenizer (and chat template) of the default model, loaded once."""
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.fail(f"the default model's tokenizer is not cached at {MODEL_DIR}; set BATCHGEN_CACHE")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR))

