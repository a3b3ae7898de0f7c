"""The prompt-preparation sequence, one for the build-prompts task and `batchgen check`/`run`'s preflight:
the input columns the job names are checked, then each row's prompt is built and tokenized, and its own
sampling overrides and LoRA adapter are applied."""

from __future__ import annotations

from typing import Any

from batchgen.adapters import apply_adapters, check_adapter_column
from batchgen.items import LoadedItems
from batchgen.job import JobSpec
from batchgen.models import ModelRef
from batchgen.overrides import Check, apply_overrides, check_override_columns
from batchgen.prompts import BuiltPrompts, build_prompts, check_keyword_column, check_template_columns


def check_columns(job: JobSpec, columns: list[str]) -> None:
    """Every input column the job reads is there (templates, keyword, overrides, adapter): a JobError before any
    model work otherwise."""
    check_template_columns(job.prompt, columns, job.input.path)
    check_keyword_column(job.expectations.keyword_column, columns)
    check_override_columns(job.sampling, columns)
    check_adapter_column(job.engine, columns)


def render_prompts(job: JobSpec, loaded: LoadedItems, tokenizer: Any, max_model_len: int,
                   check: Check | None = None) -> BuiltPrompts:
    """Every row's prompt, tokenized, with its own overrides (judged by `check`, see apply_overrides) and
    adapter; a row that cannot be used is a rejection."""
    built = build_prompts(loaded.items, job.prompt, tokenizer, max_model_len, loaded.columns,
                          job.expectations.keyword_column)
    built = apply_overrides(built, loaded.items, job.sampling, loaded.columns, check=check)
    return apply_adapters(built, loaded.items, job.engine, loaded.columns)


def prepare_prompts(job: JobSpec, loaded: LoadedItems) -> tuple[BuiltPrompts, ModelRef, int]:
    """The columns checked, the model's tokenizer loaded and the prompts rendered: (prompts, model, context
    length)."""
    from batchgen.tokenizer import load_tokenizer

    check_columns(job, loaded.columns)
    model, tokenizer, max_len = load_tokenizer(job.engine)
    return render_prompts(job, loaded, tokenizer, max_len), model, max_len
