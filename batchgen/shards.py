"""Shards: a stable split of a job's items, and the merge of the shard publications into one.

An item's shard depends only on its id (or, for a row rejected before it has one, the
rejection's key), so a rerun, a retry or another machine puts it in the same shard.
Each shard is an ordinary batch-generation run publishing into `<out>/shards/<i>-of-<n>/`;
the merge reads their current publications and publishes one dataset, with one manifest,
into `<out>/`, after checking that every input item is there exactly once. With
`output.publish_to`, shards publish to `<publish_to>/shards/<i>-of-<n>/` instead (batchgen.remote)
and the merge reads them from there, so `<out>/shards/` need not be shared.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.assemble import LostItemsError
from batchgen.items import LoadedItems
from batchgen.publish import ATTEMPTS, REJECTED, RESULTS, VALIDATION, current_publication, stage_tables, \
    verify_publication

SHARDS = "shards"
SUMMED = ("items", "accepted", "rejected", "generated_items", "truncated_first_pass", "truncated_final", "attempts",
          "retry_attempts", "reused")


def shard_of(key: str, count: int) -> int:
    """The shard (0-based) of an item id: a hash, not Python's salted hash(), so every process agrees."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % count


def select_shard(loaded: LoadedItems, index: int, count: int) -> LoadedItems:
    """The items and load-time rejections of one shard."""
    keep = [shard_of(item_id, count) == index for item_id in loaded.items["item_id"]]
    items = loaded.items[keep].reset_index(drop=True)
    rejected = [r for r in loaded.rejected if shard_of(r.item_id, count) == index]
    return replace(loaded, items=items, rejected=rejected)


def shard_dir(out_dir: str | Path, index: int, count: int) -> Path:
    return Path(out_dir) / SHARDS / f"{index + 1}-of-{count}"


def expected_ids(loaded: LoadedItems) -> list[str]:
    """Every id the merged publication must hold once: the items and the rows rejected on load."""
    return list(loaded.items["item_id"]) + [r.item_id for r in loaded.rejected]


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive")


def shard_url(url: str, index: int, count: int) -> str:
    """Where a shard publishes when the job has `output.publish_to`: `<url>/shards/<i>-of-<n>`."""
    return f"{url.rstrip('/')}/{SHARDS}/{index + 1}-of-{count}"


def _read_shard(source: Path | str, remote: bool) -> tuple[dict[str, Any], dict[str, pa.Table], list[dict[str, Any]]]:
    """A shard's current publication, verified: its manifest, tables and validation results."""
    names = (RESULTS, REJECTED, ATTEMPTS)
    if remote:  # `<url>/current.json` and the files it points at (batchgen.remote)
        from batchgen.remote import read_current_files

        manifest, files = read_current_files(str(source))
        tables = {name: pq.read_table(pa.BufferReader(files[name])) for name in names}
        return manifest, tables, json.loads(files[VALIDATION])
    publication = current_publication(Path(source))
    manifest = verify_publication(publication)
    tables = {name: pq.read_table(publication / name) for name in names}
    return manifest, tables, json.loads((publication / VALIDATION).read_text(encoding="utf-8"))


def merge_shards(out_dir: str | Path, shard_dirs: list[Path], ids: list[str], manifest: dict[str, Any],
                 jsonl: bool, shard_urls: list[str] | None = None) -> tuple[dict[str, Any], Path]:
    """Stage one publication from the shards' current publications; raises LostItemsError unless exactly once.

    With `shard_urls` the shards are read from there (each `<url>/current.json`) instead of `shard_dirs`.
    """
    sources = [_read_shard(url, True) for url in shard_urls] if shard_urls else \
        [_read_shard(d, False) for d in shard_dirs]
    manifests = [source[0] for source in sources]
    tables = {name: _concat([source[1][name] for source in sources]) for name in (RESULTS, REJECTED, ATTEMPTS)}
    published = tables[RESULTS].column("item_id").to_pylist() + tables[REJECTED].column("item_id").to_pylist()
    twice = sorted(k for k, n in Counter(published).items() if n > 1)
    missing = sorted(set(ids) - set(published))
    extra = sorted(set(published) - set(ids))
    if twice or missing or extra:
        raise LostItemsError(f"merging {len(sources)} shards: {len(missing)} items missing {missing[:5]}, "
                             f"{len(twice)} published twice {twice[:5]}, {len(extra)} not in the input {extra[:5]}")
    validation = []
    for index, (_, _, results) in enumerate(sources):
        for result in results:
            meta = {**(result.get("meta") or {}), "batchgen_shard": f"{index + 1}-of-{len(sources)}"}
            validation.append({**result, "meta": meta})
    first = manifests[0]
    counts: dict[str, Any] = {key: sum(m["counts"].get(key, 0) for m in manifests) for key in SUMMED}
    reasons = Counter()
    for m in manifests:
        reasons.update(m["counts"].get("rejected_by_reason", {}))
    counts["rejected_by_reason"] = dict(sorted(reasons.items()))
    generated = counts["generated_items"]
    tokens = {key: sum((m["tokens"].get(key) or 0) for m in manifests) for key in ("prompt", "output",
                                                                                     "generated_this_run")}
    engine_seconds = sum(m["timings_seconds"].get("engine_calls", 0.0) for m in manifests)
    tokens["output_per_second"] = round(tokens["generated_this_run"] / engine_seconds, 2) if engine_seconds else None
    merged = {
        **{k: v for k, v in first.items() if k not in ("publication", "files", "flow_run_id", "flow_name")},
        **manifest,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "counts": counts,
        "rates": {
            "pass_rate": round(counts["accepted"] / counts["items"], 4) if counts["items"] else None,
            "truncation_first_pass": round(counts["truncated_first_pass"] / generated, 4) if generated else None,
            "truncation_final": round(counts["truncated_final"] / generated, 4) if generated else None,
        },
        "tokens": tokens,
        "timings_seconds": {"engine_calls": round(engine_seconds, 3)},
        "shards": [
            {"shard": f"{i + 1}-of-{len(sources)}", "flow_run_id": m.get("flow_run_id"),
             "publication": m.get("publication"), "counts": m["counts"]}
            for i, m in enumerate(manifests)
        ],
    }
    return stage_tables(out_dir, tables, validation, merged, jsonl)
