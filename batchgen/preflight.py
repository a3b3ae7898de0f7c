"""Everything a run can know before the engine starts, checked in one place.

`batchgen check` reports it and `batchgen run` stops on it, with the same messages: the
output folder, the input, the templates (compiled, then rendered for every row: a row whose
render fails is that row's rejection), the model (folder, files, hub), `engine.max_model_len`
against the model's, and the sampling values against the installed vLLM's own validation
(`SamplingParams` and its `verify` against the model's config), the job's and every row's
overrides alike. A user's mistake raises JobError (the job) or DataError (the input). (The job's
own GX expectations are tried on a sample output by expectations.check, a layer above.)
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchgen.items import DataError, LoadedItems, keep_for_next_load, load_items
from batchgen.job import EngineSpec, JobError, JobSpec, OutputSpec, SamplingSpec
from batchgen.models import ModelError, ModelRef
from batchgen.overrides import vllm_check
from batchgen.prepare import check_columns, render_prompts
from batchgen.prompts import BuiltPrompts
from batchgen.vllm_checks import cpu_problem, first_sentence, sampling_problem

if TYPE_CHECKING:
    from batchgen.store import ResultStore

__all__ = ["Checked", "DataError", "JobError", "check_engine", "check_output_dir", "check_sampling",
           "committed_first_pass", "preflight", "preview_prompts", "sample_outputs", "truncation_estimate"]


@dataclass
class Checked:
    loaded: LoadedItems
    built: BuiltPrompts
    model: ModelRef
    max_model_len: int
    tokenizer: Any = None


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
    check_columns(spec, loaded.columns)
    check_cpu_limits(spec)
    if not model:
        check_sampling(spec.sampling)
        return None
    ref, tokenizer, max_len, config = check_engine(spec.engine)
    check_sampling(spec.sampling, config, tokenizer)
    built = render_prompts(spec, loaded, tokenizer, max_len, check=vllm_check(spec.sampling, config, tokenizer))
    return Checked(loaded=loaded, built=built, model=ref, max_model_len=max_len, tokenizer=tokenizer)


PREVIEW = 3  # prompts `check` shows as the model will see them
RATIO_PROMPTS = 64  # prompts the tokenizer's characters per token are measured on


def committed_first_pass(spec: JobSpec, checked: Checked, store: ResultStore) -> dict[str, Any]:
    """How much of the job its output already holds, without the engine: the first-pass requests (one per prompt,
    as the flow asks them) whose outputs the result store has committed, which a run reuses (after a crash, or a
    rerun), and how many it would generate."""
    from batchgen.engine import engine_identity, planned_engine_args
    from batchgen.generation import first_pass_requests, request_keys, sampling_kwargs

    requests = first_pass_requests(checked.built.prompts, spec.sampling)
    keys = request_keys(requests, sampling_kwargs(spec.sampling), engine_identity(planned_engine_args(spec.engine)))
    committed = len(store.committed(set(keys)))
    return {"committed": committed, "to_generate": len(keys) - committed, "store": str(store.root)}


def preview_prompts(checked: Checked, count: int = PREVIEW) -> list[dict[str, Any]]:
    """The first prompts as the engine gets them: after the template and the model's chat template."""
    prompts = checked.built.prompts.head(count)
    rows = dict(zip(checked.loaded.items["item_id"].astype(str), checked.loaded.items["row_number"]))
    return [{"item_id": str(p.item_id), "row": int(rows.get(str(p.item_id), 0)) or None,
             "n_prompt_tokens": int(p.n_prompt_tokens), "text": p.prompt}
            for p in prompts.itertuples(index=False)]


def chars_per_token(checked: Checked) -> float | None:
    """Characters per token of this tokenizer on this job's text: the first prompts, without special tokens."""
    tokenizer = checked.tokenizer
    texts = list(checked.built.prompts["prompt"].head(RATIO_PROMPTS))
    if tokenizer is None or not texts:
        return None
    special = sorted(getattr(tokenizer, "all_special_tokens", []) or [], key=len, reverse=True)
    chars = tokens = 0
    for text in texts:
        for token in special:
            text = text.replace(token, "")
        chars += len(text)
        tokens += len(tokenizer.encode(text, add_special_tokens=False))
    return chars / tokens if tokens else None


def truncation_estimate(spec: JobSpec, checked: Checked, sample: dict[str, Any] | None = None
                        ) -> tuple[dict[str, Any], list[str]]:
    """What the first pass's budget holds against the expected length, and the warnings a user needs first.

    Without the engine the expected length is the shortest the expectations accept (min_chars), turned into
    tokens at this tokenizer's characters per token on the job's own prompts. A `sample` (outputs of the
    first prompts, generated by `sample_outputs`) measures the cut-off rate itself.
    """
    ratio = chars_per_token(checked)
    budget = spec.sampling.max_tokens
    bounds = spec.expectations
    estimate: dict[str, Any] = {
        "max_tokens": budget,
        "chars_per_token": round(ratio, 2) if ratio else None,
        "budget_chars": round(budget * ratio) if ratio else None,
        "min_chars": bounds.min_chars,
        "min_chars_tokens": -(-bounds.min_chars // ratio) if ratio and bounds.min_chars else None,
        "max_chars": bounds.max_chars,
        "basis": "expectations" if sample is None else "sample",
    }
    if estimate["min_chars_tokens"] is not None:
        estimate["min_chars_tokens"] = int(estimate["min_chars_tokens"])
    warnings = []
    if estimate["min_chars_tokens"] and budget < estimate["min_chars_tokens"]:
        warnings.append(
            f"sampling.max_tokens {budget} holds about {estimate['budget_chars']} characters (~{ratio:.1f} per token "
            f"here), fewer than expectations.min_chars {bounds.min_chars}: every output would be cut off or too short")
    if sample is not None:
        estimate["sample"] = sample
        cut, total = sample["cut_off"], sample["outputs"]
        if total and cut * 2 > total:
            needed = sample.get("needed_tokens") or {}
            hint = (f"; at {sample['retry_budget']} tokens they ended after a median {needed['median']} and at most "
                    f"{needed['max']} tokens: try sampling.max_tokens={needed['suggested']}") if needed else ""
            warnings.append(f"{cut} of {total} sampled outputs were cut off at sampling.max_tokens {budget}{hint}")
    elif not warnings:
        estimate["note"] = ("the model's own length is not known without the engine: `batchgen check --sample N` "
                            "generates the first N prompts and measures how many are cut off")
    return estimate, warnings


def sample_outputs(spec: JobSpec, checked: Checked, count: int) -> dict[str, Any]:
    """Generate the first `count` prompts with the job's sampling on the real engine: how many are cut off at the
    first pass's budget, and, for those, how long they run at the retry cap (the budget they would need)."""
    from batchgen.engine import get_engine
    from batchgen.engine_process import generate as generate_outputs
    from batchgen.generation import engine_budget, first_pass_requests, sampling_kwargs, sampling_params

    requests = first_pass_requests(checked.built.prompts.head(count), spec.sampling)
    if not requests or spec.sampling.use_beam_search:
        return {"prompts": 0, "outputs": 0, "cut_off": 0, "output_tokens": None}
    engine = get_engine(spec.engine)
    base = sampling_kwargs(spec.sampling)

    def generate(batch, budget=None):
        params = [sampling_params({**engine_budget(base, r), **({"max_tokens": budget} if budget else {})})
                  for r in batch]
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in batch]
        # once the engine is idle, where it runs: the engine is never used from two threads
        return engine.run(generate_outputs, prompts, params)

    first = generate(requests)
    outputs = [c for out in first for c in out.outputs]
    lengths = sorted(len(c.token_ids) for c in outputs)
    result: dict[str, Any] = {"prompts": len(requests), "outputs": len(outputs),
                              "cut_off": sum(c.finish_reason == "length" for c in outputs),
                              "output_tokens": {"median": lengths[len(lengths) // 2], "max": lengths[-1]}}
    cut = [r for r, out in zip(requests, first) if any(c.finish_reason == "length" for c in out.outputs)]
    room = min(checked.max_model_len - len(r.prompt_token_ids) for r in cut) if cut else 0
    retry_budget = min(spec.retry.max_tokens_cap, room)
    if cut and retry_budget > spec.sampling.max_tokens:
        ended = sorted(len(c.token_ids) for out in generate(cut, retry_budget) for c in out.outputs
                       if c.finish_reason != "length")
        result["retry_budget"] = retry_budget
        if ended:
            p90 = ended[min(len(ended) - 1, (9 * len(ended)) // 10)]
            result["needed_tokens"] = {"median": ended[len(ended) // 2], "max": ended[-1],
                                       "suggested": min(retry_budget, -(-p90 // 16) * 16)}
    return result

