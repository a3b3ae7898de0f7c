"""Hand-made tables the unit tests share: items, attempts with their verdicts, a shard's publication."""

from __future__ import annotations

from typing import Any

import pandas as pd

from batchgen.assemble import assemble
from batchgen.retry import latest_attempts
from batchgen.shards import shard_dir
from tests.publications import generated, publish_frames

COLUMNS = ["name", "feature"]


def make_items(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame({
        "item_id": pd.Series([r[0] for r in rows], dtype="string"),
        "row_number": pd.Series(range(2, len(rows) + 2), dtype="int64"),
        "name": [r[1] for r in rows],
        "feature": [r[2] for r in rows],
    })


def with_verdicts(rows: list[Any], failed: list[list[str]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["failed"] = failed
    frame["passed"] = [not f for f in failed]
    return frame


def publish_shard(out, index, count, ids, rejected_ids=()):
    """A shard's publication as the publish step writes it: accepted ids pass, the others fail `keyword`."""
    every = list(ids) + list(rejected_ids)
    items = make_items([(i, f"name {i}", "feature") for i in every])
    attempts = pd.concat([with_verdicts(generated(i, [f"text {i}"]), [[] if i in ids else ["keyword"]])
                          for i in every], ignore_index=True)
    result = assemble(items, COLUMNS, [], latest_attempts(attempts))
    manifest = {"counts": {"items": len(every), "accepted": len(ids), "rejected": len(rejected_ids),
                           "rejected_by_reason": {"keyword": len(rejected_ids)}},
                "tokens": {"prompt": 10, "output": 5, "generated_this_run": 5},
                "timings_seconds": {"engine_calls": 1.0}, "flow_run_id": f"run-{index}"}
    publish_frames(shard_dir(out, index, count), result.accepted, result.rejected, attempts, [], manifest,
                   jsonl=False)
