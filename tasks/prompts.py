"""Build and tokenize prompts, before the engine loads."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.items import LoadedItems
from batchgen.job import JobSpec
from batchgen.models import ModelRef
from batchgen.prepare import prepare_prompts
from batchgen.prompts import BuiltPrompts


@dataclass
class PromptStep:
    built: BuiltPrompts
    model: ModelRef
    max_model_len: int


@task(name="build-prompts", cache_policy=NO_CACHE)
def build_prompts_task(job: JobSpec, loaded: LoadedItems) -> PromptStep:
    """Render every item's prompt with the model's chat template and count its tokens."""
    built, model, max_len = prepare_prompts(job, loaded)  # a bad template fails before any model work
    lengths = built.prompts["n_prompt_tokens"]
    print(
        f"prompts: {len(built.prompts)} built, {len(built.rejected)} rejected; "
        f"prompt tokens min/mean/max {lengths.min() if len(lengths) else 0}/"
        f"{lengths.mean() if len(lengths) else 0:.0f}/{lengths.max() if len(lengths) else 0} "
        f"(limit {max_len})"
    )
    return PromptStep(built=built, model=model, max_model_len=max_len)
