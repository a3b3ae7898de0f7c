"""Shards: a stable split of a job's items, and the merge of the shard publications into one.

An item's shard depends only on its id (or, for a row rejected before it has one, the
rejection's key), so a rerun, a retry or another machine puts it in the same shard.
Each shard is an ordinary batch-generation run publishing into `<out>/shards/<i>-of-<n>/`;
the merge reads their current publications and publishes one dataset, with one manifest,
into `<out>/`, after checking that every input item is there exactly once. It reads the
item ids first, then copies each table a batch of rows at a time, so its memory does not
grow with the number of items. With
`output.publish_to`, shards publish to `<publish_to>/shards/<i>-of-<n>/` instead (batchgen.remote)
and the merge reads them from there, so `<out>/shards/` need not be shared.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen.assemble import LostItemsError
from batchgen.items import LoadedItems
from batchgen.publish import ATTEMPTS, REJECTED, RESULTS, ROW_GROUP_ROWS, VALIDATION, Publication, \
    current_publication, unified_schema, verify_publication
from batchgen.records import Manifest, Tally, Tokens

SHARDS = "shards"
TABLES = (RESULTS, REJECTED, ATTEMPTS)
BATCH_ROWS = ROW_GROUP_ROWS  # rows per piece copied from a shard's table: a row group of a publication


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


def shard_url(url: str, index: int, count: int) -> str:
    """Where a shard publishes when the job has `output.publish_to`: `<url>/shards/<i>-of-<n>`."""
    return f"{url.rstrip('/')}/{SHARDS}/{index + 1}-of-{count}"


def _read_shard(source: Path | str, spill: Path | None) -> tuple[Manifest, dict[str, Path], list[dict[str, Any]]]:
    """A shard's current publication, verified: its manifest, the paths of its tables, its validation results.

    A remote shard (`spill` given; `<url>/current.json` and the files it points at, batchgen.remote) is
    written to `spill`, so that only one shard's files are in memory at a time.
    """
    if spill is not None:
        from batchgen.remote import read_current_files

        manifest, files = read_current_files(str(source))
        spill.mkdir(parents=True)
        for name in TABLES:
            (spill / name).parent.mkdir(parents=True, exist_ok=True)
            (spill / name).write_bytes(files[name])
        return (Manifest.model_validate(manifest), {name: spill / name for name in TABLES},
                json.loads(files[VALIDATION]))
    publication = current_publication(Path(source))
    manifest = verify_publication(publication)
    return (manifest, {name: publication / name for name in TABLES},
            json.loads((publication / VALIDATION).read_text(encoding="utf-8")))


def _pieces(paths: list[Path]) -> Iterator[pa.Table]:
    """The rows of the tables at `paths`, in order, a batch at a time."""
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
            yield pa.Table.from_batches([batch])


def merge_shards(publication: Publication, shard_dirs: list[Path], ids: list[str], identity: dict[str, Any],
                 shard_urls: list[str] | None = None) -> Manifest:
    """Seal one publication from the shards' current publications; raises LostItemsError unless every id is there
    exactly once. `identity`: the merging run's own manifest fields (job, flow run, start).

    With `shard_urls` the shards are read from there (each `<url>/current.json`) instead of `shard_dirs`.
    """
    with tempfile.TemporaryDirectory(prefix="batchgen-merge-") as spill:
        if shard_urls:
            sources = [_read_shard(url, Path(spill) / str(i)) for i, url in enumerate(shard_urls)]
        else:
            sources = [_read_shard(d, None) for d in shard_dirs]
        return _merge(publication, sources, ids, identity)


def _merge(publication: Publication, sources: list[tuple[Manifest, dict[str, Path], list[dict[str, Any]]]],
           ids: list[str], identity: dict[str, Any]) -> Manifest:
    manifests = [source[0] for source in sources]
    # An item with several results rows (selection `all`: one per published candidate) counts once.
    published = Counter(item_id for _, paths, _ in sources for name in (RESULTS, REJECTED)
                        for item_id in (dict.fromkeys if name == RESULTS else list)(
                            pq.read_table(paths[name], columns=["item_id"]).column("item_id").to_pylist()))
    twice = sorted(k for k, n in published.items() if n > 1)
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
    tally = sum((Tally(**m.counts.model_dump(), prompt_tokens=m.tokens.prompt, output_tokens=m.tokens.output)
                 for m in manifests), Tally())
    generated = sum(m.tokens.generated_this_run for m in manifests)
    engine_seconds = sum(m.timings_seconds.get("engine_calls", 0.0) for m in manifests)
    first = manifests[0].to_json()
    merged = Manifest.model_validate({
        **{k: v for k, v in first.items() if k not in ("publication", "files", "flow_run_id", "flow_name")},
        **identity,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "counts": tally.counts().to_json(),
        "rates": tally.rates().to_json(),
        "tokens": Tokens(prompt=tally.prompt_tokens, output=tally.output_tokens, generated_this_run=generated,
                         output_per_second=round(generated / engine_seconds, 2) if engine_seconds else None).to_json(),
        "timings_seconds": {"engine_calls": round(engine_seconds, 3)},
        "shards": [
            {"shard": f"{i + 1}-of-{len(sources)}", "flow_run_id": m.flow_run_id, "publication": m.publication,
             "counts": m.counts.to_json()}
            for i, m in enumerate(manifests)
        ],
    })
    streams = {}
    for name in TABLES:
        parts = [paths[name] for _, paths, _ in sources]
        streams[name] = (unified_schema([pq.read_schema(path) for path in parts]), _pieces(parts))
    return publication.seal(merged, validation, tables=streams)
