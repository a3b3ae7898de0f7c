"""Build and tokenize prompts, before the engine loads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from batchgen.progress import for_run, run_key
from batchgen.records import Window
from batchgen.adapters import apply_adapters, check_adapter_column
from batchgen.job import JobSpec
from batchgen.models import ModelRef
from batchgen.overrides import apply_overrides, check_override_columns
from batchgen.prompts import BuiltPrompts, build_prompts, check_keyword_column, check_template_columns
from batchgen.tokenizer import load_tokenizer


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
    check_template_columns(job.prompt, loaded.columns, job.input.path)  # a bad template fails before any model work
    check_keyword_column(job.expectations.keyword_column, loaded.columns)
    check_override_columns(job.sampling, loaded.columns)
    model, tokenizer, max_len = load_tokenizer(job.engine)
    built = build_prompts(loaded.items, job.prompt, tokenizer, max_len, loaded.columns,
                          job.expectations.keyword_column)
    built = apply_overrides(built, loaded.items, job.sampling, loaded.columns)
    check_adapter_column(job.engine, loaded.columns)
    built = apply_adapters(built, loaded.items, job.engine, loaded.columns)
    lengths = built.prompts["n_prompt_tokens"]
    print(
        f"prompts: {len(built.prompts)} built, {len(built.rejected)} rejected; "
        f"prompt tokens min/mean/max {lengths.min() if len(lengths) else 0}/"
        f"{lengths.mean() if len(lengths) else 0:.0f}/{lengths.max() if len(lengths) else 0} "
        f"(limit {max_len})"
    )
    return PromptStep(built=built, model=model, max_model_len=max_len, seconds=time.perf_counter() - started)
