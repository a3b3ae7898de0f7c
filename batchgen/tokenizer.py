"""The model's tokenizer and context length, without starting the engine."""

from __future__ import annotations

import functools
import os
from typing import Any

from batchgen.job import EngineSpec
from batchgen.models import ModelError, ModelRef, model_max_len, resolve_model


def load_tokenizer(spec: EngineSpec) -> tuple[ModelRef, Any, int]:
    """The model reference, its tokenizer, and the context length the engine will use."""
    from transformers import AutoConfig

    model = resolve_model(spec.model)
    try:
        tokenizer = _tokenizer(model.path)
        max_len = spec.max_model_len or model_max_len(model.path)
        if max_len is None:
            config = AutoConfig.from_pretrained(model.path)
            max_len = getattr(config, "max_position_embeddings", None) or 2048
    except (OSError, ValueError, KeyError) as exc:  # transformers' "cannot load": a missing hub, a broken folder
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        if os.path.isdir(model.path):
            raise ModelError(f"engine.model: {model.path}: the model folder cannot be loaded: {reason}") from None
        raise ModelError(f"engine.model: {spec.model!r} is not a local folder, and as a hub id it cannot be "
                         f"loaded: {reason}") from None
    return model, tokenizer, int(max_len)


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    """Loaded once per process and model: a run asks for it once per window."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
