"""Build and tokenize prompts, before the engine loads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.progress import for_run, run_key
from batchgen.records import Window
from batchgen.job import JobSpec
from batchgen.models import ModelRef
from batchgen.prepare import prepare_prompts
from batchgen.prompts import BuiltPrompts


@dataclass
class PromptStep:
    built: BuiltPrompts
    model: ModelRef
    max_model_len: int
    seconds: float = 0.0  # the task's own time


@task(name="build-prompts", cache_policy=NO_CACHE, task_run_name="build-prompts-{loaded.label}")
def build_prompts_task(job: JobSpec, loaded: Window) -> PromptStep:
    """Render every item's prompt (of one window) with the model's chat template and count its tokens."""
    started = time.perf_counter()
    progress = for_run(run_key(job))
    if progress is not None:
        progress.window(loaded.label, len(loaded.items) + len(loaded.rejected))
    built, model, max_len = prepare_prompts(job, loaded)  # a bad template fails before any model work
    lengths = built.prompts["n_prompt_tokens"]
    print(
        f"prompts: {len(built.prompts)} built, {len(built.rejected)} rejected; "
        f"prompt tokens min/mean/max {lengths.min() if len(lengths) else 0}/"
        f"{lengths.mean() if len(lengths) else 0:.0f}/{lengths.max() if len(lengths) else 0} "
        f"(limit {max_len})"
    )
    return PromptStep(built=built, model=model, max_model_len=max_len, seconds=time.perf_counter() - started)
