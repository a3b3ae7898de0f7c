"""Which outputs go back to the engine, and with what budget.

A candidate earns another attempt when its latest attempt failed one of `retry.on`:

- `truncated` (cut off by max_tokens, finish_reason == "length"): after pass k the total
  budget is min(first_budget * growth_factor**k, max_tokens_cap, room left in the context).
  `grow` regenerates with that budget; `continue` keeps the cut-off tokens and asks for the
  rest. A candidate whose budget cannot grow any more is not grown again.
- any other expectation (`keyword`, `length`, ...): the candidate is sampled again
  (strategy `resample`) at its budget, with the temperature moved by `temperature_step`,
  but only while its item has no passing candidate (one passing candidate is enough).

A candidate gets at most `max_passes` attempts after its first. Cut-off outputs are known as soon as they
finish: with `retry.in_stream` they are grown in the generate task's stream (`stream_retry`), the same requests
a retry pass would make; the passes after validation then retry only the other failures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from batchgen.records import GenRequest
from batchgen.job import RETRY_ALIASES, RetrySpec


def latest_attempts(attempts: pd.DataFrame) -> pd.DataFrame:
    """The newest attempt of every (item, candidate)."""
    if attempts.empty:
        return attempts
    ordered = attempts.sort_values(["item_id", "candidate", "attempt"], kind="stable")
    return ordered.groupby(["item_id", "candidate"], sort=False).tail(1).reset_index(drop=True)


def next_budget(current: int, retry: RetrySpec, n_prompt_tokens: int, max_model_len: int) -> int:
    grown = math.ceil(current * retry.growth_factor)
    return min(grown, retry.max_tokens_cap, max_model_len - n_prompt_tokens)


def _temperature(row: object) -> float | None:
    value = getattr(row, "temperature", None)
    return None if value is None or pd.isna(value) else float(value)


def _lora(row: object) -> str | None:
    value = getattr(row, "lora", None)
    return None if value is None or pd.isna(value) else str(value)


def plan_beam_retries(latest: pd.DataFrame, retry: RetrySpec, max_model_len: int, width: int) -> list[GenRequest]:
    """Beam search: an item with a cut-off beam searches again, all beams, with the grown budget (beams of
    different searches are not the same candidates, so `continue` does not apply)."""
    requests = []
    for item_id, beams in latest.groupby("item_id", sort=False):
        if not (beams["finish_reason"] == "length").any():
            continue
        row = next(beams.sort_values("attempt", ascending=False).itertuples(index=False))
        if row.attempt > retry.max_passes:
            continue
        budget = next_budget(int(row.max_tokens), retry, int(row.n_prompt_tokens), max_model_len)
        if budget <= row.max_tokens:
            continue
        requests.append(GenRequest(
            item_id=item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids), max_tokens=budget,
            attempt=int(row.attempt) + 1, strategy="grow", candidate=None, n=width, temperature=_temperature(row),
            lora=_lora(row)))
    return requests


def retry_on(retry: RetrySpec) -> set[str]:
    """The expectation ids retry.on names, aliases expanded."""
    return {name for entry in retry.on for name in RETRY_ALIASES.get(entry, (entry,))}


def _failed(row: object) -> list[str]:
    failed = getattr(row, "failed", None)
    return [] if failed is None or isinstance(failed, float) else list(failed)


def resample_temperature(current: float, retry: RetrySpec) -> float:
    return min(max(current + retry.temperature_step, 0.0), retry.max_temperature)


def plan_retries(latest: pd.DataFrame, retry: RetrySpec, max_model_len: int,
                 beam_width: int | None = None, temperature: float = 1.0) -> list[GenRequest]:
    """Requests for the next pass: one per candidate whose latest attempt failed one of retry.on (its own budget
    and temperature, so per-row overrides and every one of n candidates carry over); under beam search, one
    per item with a cut-off beam. `temperature` is the job's, the base of a resample's temperature."""
    if beam_width is not None:
        return plan_beam_retries(latest, retry, max_model_len, beam_width)
    on = retry_on(retry)
    passing = set(latest.loc[latest["passed"].astype(bool), "item_id"]) if "passed" in latest else set()
    requests = []
    for row in latest.itertuples(index=False):
        if row.attempt > retry.max_passes:  # its retries are spent (some perhaps in the stream)
            continue
        if row.finish_reason == "length" and "truncated" in on:
            request = grow_request(row, retry, max_model_len)
            if request is not None:
                requests.append(request)
                continue
        causes = [name for name in _failed(row) if name in on and name != "truncated"]
        if causes and row.item_id not in passing:
            requests.append(resample_request(row, retry, temperature))
    return requests


def stream_retry(retry: RetrySpec, max_model_len: int) -> Callable[[object], GenRequest | None] | None:
    """The follow-up of an attempt in the generate task's stream (batchgen.generation.run_requests): a cut-off
    output grown (or continued) while it has attempts left and its budget can grow; None when the job does not
    retry cut-off outputs in the stream."""
    if not retry.in_stream or retry.max_passes == 0 or "truncated" not in retry_on(retry):
        return None

    def follow_up(row: object) -> GenRequest | None:
        if row.finish_reason != "length" or row.attempt > retry.max_passes:  # type: ignore[attr-defined]
            return None
        return grow_request(row, retry, max_model_len)

    return follow_up


def resample_request(row: object, retry: RetrySpec, temperature: float) -> GenRequest:
    """The candidate sampled again, whole, at its last budget; the temperature moves by temperature_step."""
    own = _temperature(row)
    moved = own if retry.temperature_step == 0 else resample_temperature(temperature if own is None else own, retry)
    return GenRequest(
        item_id=row.item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids),
        max_tokens=int(row.max_tokens), attempt=int(row.attempt) + 1, strategy="resample",
        candidate=int(row.candidate), n=1, temperature=moved, lora=_lora(row))


def grow_request(row: object, retry: RetrySpec, max_model_len: int) -> GenRequest | None:
    """A cut-off candidate with a bigger budget (grow) or asked for the rest (continue); None when it cannot grow."""
    budget = next_budget(int(row.max_tokens), retry, int(row.n_prompt_tokens), max_model_len)
    if budget <= row.max_tokens:
        return None
    request = GenRequest(
        item_id=row.item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids),
        max_tokens=budget, attempt=int(row.attempt) + 1, strategy=retry.strategy,
        candidate=int(row.candidate), n=1, temperature=_temperature(row), lora=_lora(row),
    )
    if retry.strategy == "continue":
        request.prefix_text = row.text
        request.prefix_token_ids = list(row.token_ids)
        logprob = row.cumulative_logprob
        request.prefix_logprob = None if logprob is None or pd.isna(logprob) else float(logprob)
        logprobs = getattr(row, "logprobs", None)
        request.prefix_logprobs = list(logprobs) if isinstance(logprobs, list) else None
    return request


def rescued_by_reason(accepted: pd.DataFrame, attempts: pd.DataFrame) -> dict[str, int]:
    """Accepted items whose published candidate failed on an earlier attempt, by each reason it failed then
    (an item rescued from two failures counts under both; `truncated` also when only cut off)."""
    if accepted.empty or attempts.empty:
        return {}
    won = accepted.loc[accepted["attempt"] > 1, ["item_id", "candidate", "attempt"]]
    if won.empty:
        return {}
    earlier = attempts.merge(won, on=["item_id", "candidate"], suffixes=("", "_won"))
    earlier = earlier[earlier["attempt"] < earlier["attempt_won"]]
    reasons: dict[str, set] = {}
    for row in earlier.itertuples(index=False):
        names = set(_failed(row)) | ({"truncated"} if row.finish_reason == "length" else set())
        for name in names:
            reasons.setdefault(name, set()).add(row.item_id)
    return {name: len(ids) for name, ids in sorted(reasons.items())}
