"""Job files the unit tests build: a full job with some sections changed, a job publishing to a URL."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from batchgen.job import ExpectationsSpec

BASE: dict[str, Any] = {
    "name": "products",
    "input": {"path": "data/products.csv", "id_column": "product_id"},
    "prompt": {"style": "chat", "system": "You write copy.", "template": "Describe {{ name }} for {{ audience }}."},
    "engine": {"seed": 7, "max_model_len": 2048},
    "sampling": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 80, "stop": "\n\n", "n": 2},
    "expectations": {"min_chars": 10, "max_chars": 400, "keyword_column": "name",
                     "must_not_match": ["https?://"]},
    "retry": {"max_passes": 2, "strategy": "continue", "growth_factor": 2, "max_tokens_cap": 320},
    "output": {"dir": "../out/products", "jsonl": True},
}


def job_with(**changes: dict[str, Any]) -> dict[str, Any]:
    """BASE with some sections updated (a value of None removes the key)."""
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        for key, value in values.items():
            if value is None:
                data[section].pop(key, None)
            else:
                data[section][key] = value
    return data


def job_publishing_to(tmp_path: Path, publish_to: str | None) -> dict:
    """A one-row job whose output.publish_to is the given URL (None: no publish_to)."""
    (tmp_path / "items.csv").write_text("id,name\n1,Mug\n", encoding="utf-8")
    output = {"dir": str(tmp_path / "out")} | ({"publish_to": publish_to} if publish_to is not None else {})
    return {"input": {"path": str(tmp_path / "items.csv"), "id_column": "id"},
            "prompt": {"template": "Describe {{ name }}."}, "output": output}


SPEC = ExpectationsSpec(
    min_chars=20, max_chars=120, keyword_column="name",
    must_match=[r"[.!。]$"],  # ends a sentence
    must_not_match=[r"https?://", r"(?i)\bbuy now\b"],
    require_stop=True,
)
