"""The model's tokenizer and context length without the engine (batchgen.tokenizer), on the real default model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batchgen.job import EngineSpec
from batchgen.models import ModelError
from batchgen.tokenizer import load_tokenizer
from tests.unit.conftest import MODEL_DIR, cached_default_model


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((cached_default_model() / "config.json").read_text(encoding="utf-8"))


def test_the_default_model_gives_its_folder_tokenizer_and_own_context_length(config):
    model, tokenizer, max_len = load_tokenizer(EngineSpec())

    assert (model.name, Path(model.path)) == ("SmolLM2-135M-Instruct", MODEL_DIR)
    assert max_len == config["max_position_embeddings"]
    assert len(tokenizer) == config["vocab_size"]
    text = "A blue kettle that boils in two minutes."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    assert text in chat and chat.rstrip().endswith("assistant")


def test_engine_max_model_len_is_the_context_length_the_engine_will_use(config):
    _, _, max_len = load_tokenizer(EngineSpec(max_model_len=512))
    assert max_len == 512 < config["max_position_embeddings"]


def test_the_tokenizer_is_loaded_once_per_process_and_model():
    """A run asks for it once per window: the second call returns the same tokenizer object."""
    assert load_tokenizer(EngineSpec())[1] is load_tokenizer(EngineSpec(max_model_len=64))[1]


def test_a_model_folder_whose_tokenizer_cannot_be_loaded_is_an_engine_model_error(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(MODEL_DIR / "config.json", folder)
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    (folder / "tokenizer.json").write_text("not json", encoding="utf-8")

    with pytest.raises(ModelError) as err:
        load_tokenizer(EngineSpec(model=str(folder)))
    assert str(err.value).startswith(f"engine.model: {folder}: the model folder cannot be loaded: ")
