"""What a user does with a publication in other tools: datasets, duckdb, polars and pandas, one line each.

`check_readers` opens `<out>/current` the way docs/datasets.md shows and checks that every tool sees the
same tables: accepted and rejected partition the items, and no table mixes in another's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def check_readers(out: Path, manifest: dict[str, Any], cache_dir: Path) -> dict[str, pd.DataFrame]:
    """Open `<out>/current` with every reader; returns pandas' accepted and rejected tables."""
    import datasets
    import duckdb
    import polars as pl

    current = Path(out) / "current"
    counts = manifest["counts"]

    # datasets: one config per table, `accepted` the default, each a train split
    assert datasets.get_dataset_config_names(str(current)) == ["accepted", "rejected", "attempts"]
    loaded = datasets.load_dataset(str(current), cache_dir=str(cache_dir))
    assert list(loaded) == ["train"] and loaded["train"].num_rows == counts["accepted"]
    hf_rejected = datasets.load_dataset(str(current), "rejected", split="train", cache_dir=str(cache_dir))
    hf_attempts = datasets.load_dataset(str(current), "attempts", split="train", cache_dir=str(cache_dir))
    assert hf_rejected.num_rows == counts["rejected"]
    assert hf_attempts.num_rows == manifest["files"]["attempts/attempts.parquet"]["rows"]

    # duckdb: a glob over a table's folder reads that table only
    def duck(sql: str) -> list[tuple]:
        return duckdb.sql(sql.replace("CURRENT", str(current))).fetchall()

    assert duck("SELECT count(*) FROM 'CURRENT/accepted/*.parquet'") == [(counts["accepted"],)]
    assert duck("SELECT count(*) FROM 'CURRENT/rejected/*.parquet'") == [(counts["rejected"],)]
    ids = duck("SELECT item_id FROM 'CURRENT/accepted/*.parquet' UNION ALL "
               "SELECT item_id FROM 'CURRENT/rejected/*.parquet'")
    assert len(ids) == len(set(ids)) == counts["items"]  # every item once

    # polars: the folder, or a glob
    pl_accepted = pl.read_parquet(current / "accepted")
    pl_rejected = pl.scan_parquet(f"{current}/rejected/*.parquet").collect()
    assert pl_accepted.height == counts["accepted"] and pl_rejected.height == counts["rejected"]

    # pandas: the folder
    accepted = pd.read_parquet(current / "accepted")
    rejected = pd.read_parquet(current / "rejected")

    # every reader sees the same columns and rows
    for columns, frame in ((loaded["train"].column_names, accepted), (hf_rejected.column_names, rejected),
                           (pl_accepted.columns, accepted), (pl_rejected.columns, rejected)):
        assert list(columns) == list(frame.columns)
    assert sorted(loaded["train"]["item_id"]) == sorted(pl_accepted["item_id"].to_list()) == \
        sorted(accepted["item_id"])
    assert sorted(hf_rejected["item_id"]) == sorted(rejected["item_id"])
    assert "input" not in accepted.columns  # the input's columns are flat
    assert accepted["item_id"].is_unique and rejected["item_id"].is_unique
    return {"accepted": accepted, "rejected": rejected}
