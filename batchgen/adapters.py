"""LoRA adapters: which adapter each request uses, and vLLM's LoRARequest for it.

The job names its adapters (`engine.lora_adapters: {name: folder}`); every request uses
`engine.lora` unless its row names another in `engine.lora_column` (a blank cell keeps the
job's). A row naming an adapter the job does not have is rejected (`invalid_override`)
before the engine sees it.
"""

from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from batchgen.items import Rejection
from batchgen.job import EngineSpec, JobError
from batchgen.prompts import BuiltPrompts, is_blank


def check_adapter_column(spec: EngineSpec, columns: list[str]) -> None:
    """Fail before the engine loads when engine.lora_column names a column the input lacks."""
    if spec.lora_column and columns and spec.lora_column not in columns:
        raise JobError(f"engine.lora_column: {spec.lora_column!r} is not a column of the input "
                       f"(columns: {', '.join(columns)})")


def apply_adapters(built: BuiltPrompts, items: pd.DataFrame, spec: EngineSpec, columns: list[str]) -> BuiltPrompts:
    """Add each prompt's adapter name (`lora`, null: the base model); reject rows naming an unknown adapter."""
    if not spec.lora and not spec.lora_column:
        return built
    prompts = built.prompts
    if not spec.lora_column:
        return BuiltPrompts(prompts=prompts.assign(lora=spec.lora), rejected=built.rejected)
    rows = items.set_index("item_id")
    keep, names, rejected = [], [], list(built.rejected)
    for position, item_id in enumerate(prompts["item_id"].tolist()):
        cell = rows.at[item_id, spec.lora_column]
        name = spec.lora if is_blank(cell) else str(cell).strip()
        if name is not None and name not in spec.lora_adapters:
            number = int(rows.at[item_id, "row_number"])
            rejected.append(Rejection(str(item_id), number, "prompt", ["invalid_override"],
                                      f"row {number}: engine.lora_column (column {spec.lora_column}): {name!r} is "
                                      f"not an adapter of engine.lora_adapters ({', '.join(spec.lora_adapters)})",
                                      {c: rows.at[item_id, c] for c in columns}))
            continue
        keep.append(position)
        names.append(name)
    prompts = prompts.iloc[keep].reset_index(drop=True)
    prompts["lora"] = pd.array(names, dtype="string")
    return BuiltPrompts(prompts=prompts, rejected=rejected)


@functools.lru_cache(maxsize=64)
def _lora_request(name: str, int_id: int, path: str) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, int_id, path)


def lora_request(adapters: dict[str, str], name: str | None) -> Any:
    """vLLM's LoRARequest for an adapter name (None: the base model); ids follow the names' sorted order."""
    if name is None:
        return None
    return _lora_request(name, sorted(adapters).index(name) + 1, adapters[name])
