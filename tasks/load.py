"""Load the input table."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.gcheap import give_back_freed
from batchgen.items import LoadedItems, load_items, take_kept_load
from batchgen.job import JobSpec
from batchgen.shards import select_shard


# Inputs are files that may change under the same path: never served from a cache.
@task(name="load-items", cache_policy=NO_CACHE, task_run_name="load-items")
def load_items_task(job: JobSpec) -> LoadedItems:
    """Read the input file; unusable rows become rejections. After `batchgen run`'s checks, their load of the
    same unchanged file is taken instead of parsing it again."""
    loaded = take_kept_load(job.input)
    if loaded is None:
        loaded = load_items(job.input)
    shard = ""
    if job.input.shard_count is not None:
        loaded = select_shard(loaded, job.input.shard_index, job.input.shard_count)
        shard = f" (shard {job.input.shard_index + 1} of {job.input.shard_count})"
    give_back_freed()  # what the parse (here or in the CLI's checks) and the shard's selection freed: gcheap.py
    print(f"load: {len(loaded.items)} items from {job.input.path}{shard}, {len(loaded.rejected)} rejected")
    return loaded
