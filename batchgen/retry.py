"""Which outputs go back to the engine, and with what budget.

Only candidates cut off by max_tokens (finish_reason == "length") are retried. After pass
k the total budget is min(first_budget * growth_factor**k, max_tokens_cap, room left in the
context). `grow` regenerates with that budget; `continue` keeps the cut-off tokens and asks
for the rest. A candidate whose budget cannot grow any more is not retried: it stays
truncated and is rejected with reason `truncated`.
"""

from __future__ import annotations

import math

import pandas as pd

from batchgen.generation import GenRequest
from batchgen.job import RetrySpec


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


def plan_beam_retries(latest: pd.DataFrame, retry: RetrySpec, max_model_len: int, width: int) -> list[GenRequest]:
    """Beam search: an item with a cut-off beam searches again, all beams, with the grown budget (beams of
    different searches are not the same candidates, so `continue` does not apply)."""
    requests = []
    for item_id, beams in latest.groupby("item_id", sort=False):
        if not (beams["finish_reason"] == "length").any():
            continue
        row = next(beams.sort_values("attempt", ascending=False).itertuples(index=False))
        budget = next_budget(int(row.max_tokens), retry, int(row.n_prompt_tokens), max_model_len)
        if budget <= row.max_tokens:
            continue
        requests.append(GenRequest(
            item_id=item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids), max_tokens=budget,
            attempt=int(row.attempt) + 1, strategy="grow", candidate=None, n=width, temperature=_temperature(row)))
    return requests


def plan_retries(latest: pd.DataFrame, retry: RetrySpec, max_model_len: int,
                 beam_width: int | None = None) -> list[GenRequest]:
    """Requests for the next pass: one per cut-off candidate whose budget can still grow (its own budget and
    temperature, so per-row overrides and every one of n candidates carry over); under beam search, one per item."""
    if beam_width is not None:
        return plan_beam_retries(latest, retry, max_model_len, beam_width)
    requests = []
    cut = latest[latest["finish_reason"] == "length"]
    for row in cut.itertuples(index=False):
        budget = next_budget(int(row.max_tokens), retry, int(row.n_prompt_tokens), max_model_len)
        if budget <= row.max_tokens:
            continue
        request = GenRequest(
            item_id=row.item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids),
            max_tokens=budget, attempt=int(row.attempt) + 1, strategy=retry.strategy,
            candidate=int(row.candidate), n=1, temperature=_temperature(row),
        )
        if retry.strategy == "continue":
            request.prefix_text = row.text
            request.prefix_token_ids = list(row.token_ids)
            logprob = row.cumulative_logprob
            request.prefix_logprob = None if logprob is None or pd.isna(logprob) else float(logprob)
            logprobs = getattr(row, "logprobs", None)
            request.prefix_logprobs = list(logprobs) if isinstance(logprobs, list) else None
        requests.append(request)
    return requests
