"""Per-row sampling overrides: a column may set max_tokens or temperature for its own row.

A blank cell keeps the job's value; a value that is not usable rejects that row (reason
`invalid_override`, the detail names the row, the field and the column) before the engine
sees it, since vLLM refuses a whole call for one bad SamplingParams.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Optional

import pandas as pd

from batchgen.items import Rejection
from batchgen.job import JobError, SamplingSpec
from batchgen.prompts import BuiltPrompts, is_blank


def check_override_columns(sampling: SamplingSpec, columns: list[str]) -> None:
    """Fail before the engine loads when an override names a column the input lacks."""
    for name, column in sampling.overrides.items():
        if columns and column not in columns:  # no columns: no row could be read, each is rejected for that
            raise JobError(f"sampling.overrides.{name}: {column!r} is not a column of the input "
                           f"(columns: {', '.join(columns) or 'none'})")


def _number(value: Any, expected: str) -> float:
    """A cell's value as a float (text, int or float; not a bool); ValueError "... is not {expected}" otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not {expected}")
    try:
        return float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not {expected}") from None


def parse_max_tokens(value: Any, sampling: SamplingSpec) -> int:
    """A row's max_tokens: a whole number >= 1 and >= sampling.min_tokens (text, int or integral float)."""
    number = _number(value, "a whole number")
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{value!r} is not a whole number")
    budget = int(number)
    if budget < 1:
        raise ValueError(f"{budget} is below 1")
    if budget < sampling.min_tokens:
        raise ValueError(f"{budget} is below sampling.min_tokens ({sampling.min_tokens})")
    return budget


def parse_temperature(value: Any) -> float:
    """A row's temperature: a finite number >= 0."""
    number = _number(value, "a number")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a number >= 0")
    return number


PARSERS = {
    "max_tokens": lambda value, sampling: parse_max_tokens(value, sampling),
    "temperature": lambda value, sampling: parse_temperature(value),
}


Check = Callable[[Optional[int], Optional[float]], Optional[tuple[str, str]]]


def vllm_check(sampling: SamplingSpec, model_config: Any = None, tokenizer: Any = None) -> Check:
    """The installed vLLM's verdict on a row's (max_tokens, temperature), asked once per distinct pair; with the
    model's config and tokenizer, vLLM's checks against the model too."""
    from batchgen.vllm_checks import sampling_problem

    return functools.lru_cache(maxsize=4096)(
        lambda max_tokens, temperature: sampling_problem(sampling, model_config, tokenizer, max_tokens, temperature))


def apply_overrides(built: BuiltPrompts, items: pd.DataFrame, sampling: SamplingSpec,
                    columns: list[str], check: Check | None = None) -> BuiltPrompts:
    """Add each prompt's own max_tokens / temperature (null: the job's); reject rows whose value is unusable.

    A value is parsed here (a number in a cell) and then judged by vLLM's own validation, the
    job's other sampling values included (`check`, by default `vllm_check`): a temperature of 3
    rejects its row, not the batch.
    """
    if not sampling.overrides:
        return built
    check = check or vllm_check(sampling)
    positions = {item_id: i for i, item_id in enumerate(items["item_id"].tolist())}
    numbers = items["row_number"].tolist()
    cells = {name: items[name].tolist() if name in items else [None] * len(items)
             for name in set(columns) | set(sampling.overrides.values())}
    values: dict[str, list[Any]] = {name: [] for name in sampling.overrides}
    keep, rejected = [], list(built.rejected)
    for position, item_id in enumerate(built.prompts["item_id"].tolist()):
        at = positions[item_id]
        problems, parsed = [], {}
        for name, column in sampling.overrides.items():
            cell = cells[column][at]
            if is_blank(cell):
                parsed[name] = None
                continue
            try:
                parsed[name] = PARSERS[name](cell, sampling)
            except ValueError as exc:
                problems.append(f"sampling.overrides.{name} (column {column}): {exc}")
        if not problems and any(value is not None for value in parsed.values()):
            verdict = check(parsed.get("max_tokens"), parsed.get("temperature"))
            if verdict is not None:
                field, message = verdict
                name = field if field in sampling.overrides else next(iter(
                    n for n in sampling.overrides if parsed.get(n) is not None))
                problems.append(f"sampling.overrides.{name} (column {sampling.overrides[name]}): "
                                f"{parsed[name]!r} is refused by vLLM: {message}")
        if problems:
            number = int(numbers[at])
            rejected.append(Rejection(str(item_id), number, "prompt", ["invalid_override"],
                                      f"row {number}: " + "; ".join(problems),
                                      {name: cells[name][at] for name in columns}))
            continue
        keep.append(position)
        for name in sampling.overrides:
            values[name].append(parsed[name])
    prompts = built.prompts.iloc[keep].reset_index(drop=True)
    if "max_tokens" in values:
        prompts["max_tokens"] = pd.array(values["max_tokens"], dtype="Int64")
    if "temperature" in values:
        prompts["temperature"] = pd.array(values["temperature"], dtype="Float64")
    return BuiltPrompts(prompts=prompts, rejected=rejected)
