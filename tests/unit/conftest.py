"""Shared fixtures of the unit tests: the real tokenizer of the default model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The converted default model (with its tokenizer) lives in the project's cache.
os.environ.setdefault("BATCHGEN_CACHE", str(Path(__file__).resolve().parents[2] / ".cache"))
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

MODEL_DIR = Path(os.environ["BATCHGEN_CACHE"]) / "models" / "SmolLM2-135M-Instruct-98362432"


def cached_default_model() -> Path:
    """The default model's folder in the cache, converted from the GGUF file of its package first when this is the
    first test process to need it (batchgen.models: locked, so test processes side by side convert it once)."""
    from batchgen.models import default_model_path

    path = default_model_path()
    if path != MODEL_DIR or not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.fail(f"the default model's tokenizer is not cached at {MODEL_DIR} (got {path}); set BATCHGEN_CACHE")
    return path


@pytest.fixture(scope="session")
def tokenizer():
    """The real tokenizer (and chat template) of the default model, loaded once."""
    cached_default_model()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_DIR))

