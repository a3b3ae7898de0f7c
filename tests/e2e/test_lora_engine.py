"""LoRA adapters on the real engine: a tiny adapter made here for the default model, used by the rows that name
it (engine.lora_column), the base model for the rows that do not; greedy, so only the adapter can make a
difference. An engine of its own (LoRA enabled), few items, a budget of 8 tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import batchgen.engine
from batchgen.job import job_from_dict
from tests.conftest import product_job

pytestmark = pytest.mark.engine

ENGINE = {"max_model_len": 1024, "enable_lora": True, "max_lora_rank": 8}


def make_adapter(folder: Path, rank: int = 8, seed: int = 0) -> Path:
    """A PEFT-format LoRA adapter for the default model (q_proj and v_proj of every layer), random weights with a
    nonzero B matrix, so its outputs differ from the base model's."""
    import torch
    from safetensors.torch import save_file

    from batchgen.models import default_model_path

    config = json.loads((default_model_path() / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    shapes = {"q_proj": config["num_attention_heads"] * head_dim, "v_proj": config["num_key_value_heads"] * head_dim}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name, out in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=generator) * 0.3
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.3
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(shapes), "bias": "none", "base_model_name_or_path": str(default_model_path())}))
    return folder


def read(out: Path, name: str) -> pd.DataFrame:
    """A published table by its old name (results is the accepted table), from its folder."""
    return pd.read_parquet(out / "current" / {"results": "accepted"}.get(name, name))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_server):
    from flows.batch_generation import batch_generation

    root = tmp_path_factory.mktemp("lora")
    adapted = product_job(
        root / "adapted", 2, engine={**ENGINE, "lora_adapters": {"noisy": str(make_adapter(root / "noisy"))},
                                     "lora_column": "adapter"},
        sampling={"temperature": 0, "max_tokens": 8, "stop": []},
        expectations={"min_chars": None, "keyword_column": None, "require_stop": False},
        retry={"max_passes": 0},
    )
    # each product twice: once through the adapter, once (a blank cell) through the base model
    products = pd.read_csv(root / "adapted" / "products.csv", dtype=str)
    twice = pd.concat([products.assign(adapter="noisy"), products.assign(adapter="")], ignore_index=True)
    twice["product_id"] = twice["product_id"] + twice["adapter"].map({"noisy": "-lora", "": "-base"})
    twice.to_csv(root / "adapted" / "products.csv", index=False)
    manifest = batch_generation(job_from_dict(adapted))
    yield {"adapted": (root / "adapted" / "out", manifest)}
    batchgen.engine.shutdown_all()


def test_a_rows_lora_adapter_changes_its_output_and_a_blank_cell_keeps_the_base_model(runs):
    out, manifest = runs["adapted"]
    results = read(out, "results")
    assert manifest["counts"]["accepted"] == 4 and manifest["engine"]["enable_lora"] is True
    by_id = results.set_index("item_id")
    used = {item_id: (name if isinstance(name, str) else None) for item_id, name in by_id["lora"].items()}
    assert used == {item_id: ("noisy" if item_id.endswith("-lora") else None) for item_id in by_id.index}
    attempts = read(out, "attempts")
    assert set(attempts.loc[attempts["item_id"].str.endswith("-lora"), "lora"]) == {"noisy"}
    for base_id in [i for i in by_id.index if i.endswith("-base")]:
        lora_id = base_id.removesuffix("-base") + "-lora"
        assert by_id.at[base_id, "prompt"] == by_id.at[lora_id, "prompt"]  # the same prompt ...
        assert by_id.at[base_id, "text"] != by_id.at[lora_id, "text"]  # ... greedy, another model's answer
