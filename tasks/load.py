"""Load the input table."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.items import LoadedItems, load_items
from batchgen.job import JobSpec


# Inputs are files that may change under the same path: never served from a cache.
@task(name="load-items", cache_policy=NO_CACHE)
def load_items_task(job: JobSpec) -> LoadedItems:
    """Read the input file; unusable rows become rejections."""
    loaded = load_items(job.input)
    print(f"load: {len(loaded.items)} items from {job.input.path}, {len(loaded.rejected)} rejected")
    return loaded
