"""Everything a run can know before the engine starts, checked in one place.

`batchgen check` reports it and `batchgen run` stops on it, with the same messages: the
output folder, the input, the templates (compiled, then rendered for every row: a row whose
render fails is that row's rejection), the model (folder, files, hub), `engine.max_model_len`
against the model's, and the sampling values against the installed vLLM's own validation
(`SamplingParams` and its `verify` against the model's config), the job's and every row's
overrides alike. A user's mistake raises JobError (the job) or DataError (the input).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgen.adapters import apply_adapters, check_adapter_column
from batchgen.items import DataError, LoadedItems, keep_for_next_load, load_items
from batchgen.job import EngineSpec, JobError, JobSpec, OutputSpec, SamplingSpec
from batchgen.models import ModelError, ModelRef
from batchgen.overrides import apply_overrides, check_override_columns
from batchgen.prompts import BuiltPrompts, build_prompts, check_keyword_column, check_template_columns
from batchgen.vllm_checks import cpu_problem, first_sentence, sampling_problem

__all__ = ["Checked", "DataError", "JobError", "check_engine", "check_output_dir", "check_sampling", "preflight"]


@dataclass
class Checked:
    loaded: LoadedItems
    built: BuiltPrompts
    model: ModelRef
    max_model_len: int


def check_output_dir(output: OutputSpec) -> None:
    """output.dir is a folder this user can write, or can be created: before anything is generated for it."""
    target = Path(output.dir)
    if target.exists():
        if not target.is_dir():
            raise JobError(f"output.dir: {target} is a file, not a folder")
        if not os.access(target, os.W_OK | os.X_OK):
            raise JobError(f"output.dir: {target} is not writable by this user")
        return
    if target.is_symlink():
        raise JobError(f"output.dir: {target} is a symbolic link to {os.readlink(target)}, which does not exist")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise JobError(f"output.dir: {target} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise JobError(f"output.dir: {target} cannot be created: {parent} is not writable by this user")


_CONFIGS: dict[str, Any] = {}


def _model_config(args: dict[str, Any]) -> Any:
    """vLLM's ModelConfig for these engine arguments, built once per process (a check, then the run's check)."""
    from vllm.engine.arg_utils import EngineArgs

    key = json.dumps(args, sort_keys=True, default=repr)
    if key not in _CONFIGS:
        _CONFIGS[key] = EngineArgs(**args).create_model_config()
    return _CONFIGS[key]


def _engine_arg_names() -> set[str]:
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)} | set(inspect.signature(LLM.__init__).parameters)


def check_engine(spec: EngineSpec) -> tuple[ModelRef, Any, int, Any]:
    """The model (folder, files, or hub), its tokenizer, the context length and vLLM's ModelConfig for it.

    vLLM builds the same ModelConfig when the engine starts: what it refuses here (a
    max_model_len above the model's, a dtype it does not know) would stop the run there.
    """
    from batchgen.engine import engine_args, on_cpu
    from batchgen.tokenizer import load_tokenizer

    try:
        model, tokenizer, max_len = load_tokenizer(spec)
    except ModelError as exc:
        raise JobError(str(exc)) from None
    from vllm.engine.arg_utils import EngineArgs

    args = engine_args(spec, model, on_cpu())
    unknown = sorted(set(spec.extra_args) - _engine_arg_names())
    if unknown:
        raise JobError(f"engine.extra_args: {unknown[0]!r} is not an argument of vllm.LLM")
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    try:
        config = _model_config({k: v for k, v in args.items() if k in fields})
    except (ValueError, TypeError, OSError) as exc:  # pydantic's ValidationError is a ValueError
        name, message = None, first_sentence(str(exc))
        errors = getattr(exc, "errors", None)
        if callable(errors) and errors() and errors()[0].get("loc"):  # pydantic: the field and its message
            name, message = str(errors()[0]["loc"][0]), first_sentence(errors()[0]["msg"])
        else:
            name = next((n for n in ("max_model_len", "dtype") if n in message), None)
        if name in spec.extra_args:
            where = f"engine.extra_args.{name}"
        elif name in EngineSpec.model_fields:
            where = f"engine.{name}"
        else:
            where = "engine" if not spec.extra_args else "engine (or engine.extra_args)"
        raise JobError(f"{where}: vLLM refuses it: {message}") from None
    return model, tokenizer, int(config.max_model_len or max_len), config


def check_cpu_limits(spec: JobSpec) -> None:
    """What the CPU build of vLLM cannot do (batchgen.vllm_checks.cpu_problem), as a JobError naming the field."""
    problem = cpu_problem(spec)
    if problem is not None:
        raise JobError(f"{problem[0]}: not on a CPU build of vLLM: {problem[1]}")


def check_sampling(sampling: SamplingSpec, model_config: Any = None, tokenizer: Any = None) -> None:
    """The job's sampling values against the installed vLLM's own validation: a JobError naming the field."""
    problem = sampling_problem(sampling, model_config, tokenizer)
    if problem is not None:
        name, message = problem
        field = f"sampling.{name}" if name in SamplingSpec.model_fields or name in sampling.passthrough else "sampling"
        raise JobError(f"{field}: vLLM refuses it: {message}")


def preflight(spec: JobSpec, model: bool = True) -> Checked | None:
    """Every check that needs no engine, in the order a user would fix them; the items and prompts it built.

    model=False (the sharded flow's coordinator, which may hold no model) checks the output folder,
    the input, the templates and the sampling values without the model, and returns None.
    """
    check_output_dir(spec.output)
    loaded = load_items(spec.input)
    if model:  # `batchgen run`: its load-items task takes this load instead of parsing the file again
        keep_for_next_load(spec.input, loaded)
    if spec.input.shard_count is not None:
        from batchgen.shards import select_shard

        loaded = select_shard(loaded, spec.input.shard_index, spec.input.shard_count)
    check_template_columns(spec.prompt, loaded.columns, spec.input.path)
    check_keyword_column(spec.expectations.keyword_column, loaded.columns)
    check_override_columns(spec.sampling, loaded.columns)
    check_adapter_column(spec.engine, loaded.columns)
    check_cpu_limits(spec)
    if not model:
        check_sampling(spec.sampling)
        return None
    ref, tokenizer, max_len, config = check_engine(spec.engine)
    check_sampling(spec.sampling, config, tokenizer)
    built = build_prompts(loaded.items, spec.prompt, tokenizer, max_len, loaded.columns,
                          spec.expectations.keyword_column)
    row_check = functools.lru_cache(maxsize=4096)(
        lambda max_tokens, temperature: sampling_problem(spec.sampling, config, tokenizer, max_tokens, temperature))
    built = apply_overrides(built, loaded.items, spec.sampling, loaded.columns, check=row_check)
    built = apply_adapters(built, loaded.items, spec.engine, loaded.columns)
    return Checked(loaded=loaded, built=built, model=ref, max_model_len=max_len)
