"""Which outputs go back to the engine, and with what budget.

A candidate earns another attempt when its latest attempt failed one of `retry.on`:

- `truncated` (cut off by max_tokens, finish_reason == "length"): after pass k the total
  budget is min(first_budget * growth_factor**k, max_tokens_cap, room left in the context).
  `grow` regenerates with that budget; `continue` keeps the cut-off tokens and asks for the
  rest; `continue_then_grow` continues a candidate's first cut-off output and regenerates a
  continuation cut off again (`next_strategy`). A candidate whose budget cannot grow any more
  is not grown again.
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
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from batchgen.records import GenRequest
from batchgen.job import CONTINUES, RETRY_ALIASES, JobSpec, RetrySpec


def latest_attempts(attempts: pd.DataFrame) -> pd.DataFrame:
    """The newest attempt of every (item, candidate), ordered by item and candidate (of two rows with the same
    attempt number, the later one). Sorted by Arrow's stable `sort_indices` on the three key columns: on a window
    of 2,031 attempts 0.8 ms against 2.6-5.6 ms for pandas' sort and groupby, the same rows."""
    if attempts.empty:
        return attempts
    try:
        keys = pa.table({"item_id": pa.array(attempts["item_id"], pa.string()),
                         "candidate": pa.array(attempts["candidate"], pa.int64()),
                         "attempt": pa.array(attempts["attempt"], pa.int64())})
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):  # keys Arrow cannot take as they are
        ordered = attempts.sort_values(["item_id", "candidate", "attempt"], kind="stable")
        return ordered.groupby(["item_id", "candidate"], sort=False).tail(1).reset_index(drop=True)
    order = pc.sort_indices(keys, sort_keys=[("item_id", "ascending"), ("candidate", "ascending"),
                                             ("attempt", "ascending")]).to_numpy()
    items = keys["item_id"].take(order)
    candidates = keys["candidate"].to_numpy()[order]
    same_as_next = np.zeros(len(order), dtype=bool)  # the next row in order is of the same (item, candidate)
    same_as_next[:-1] = (pc.equal(items[:-1], items[1:]).to_numpy(zero_copy_only=False)
                         & (candidates[:-1] == candidates[1:]))
    return attempts.iloc[order[~same_as_next]].reset_index(drop=True)


def next_strategy(row: object, retry: RetrySpec) -> str:
    """How a cut-off candidate's next attempt is made: the job's strategy, except under `continue_then_grow`,
    where a first (or resampled) attempt is continued and a continuation cut off again, more often an output that
    runs on than one that needed a little more room, is drawn afresh (`grow`)."""
    if retry.strategy != "continue_then_grow":
        return retry.strategy
    return "continue" if getattr(row, "strategy", "first") in ("first", "resample") else "grow"


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
    return _failures(getattr(row, "failed", None))


def _failures(failed: Any) -> list[str]:
    """An attempt's `failed` value as a list (none: missing, or NaN where a frame lacked it)."""
    return [] if failed is None or isinstance(failed, float) else list(failed)


def resample_temperature(current: float, retry: RetrySpec) -> float:
    return min(max(current + retry.temperature_step, 0.0), retry.max_temperature)


def plan_retries(latest: pd.DataFrame, retry: RetrySpec, max_model_len: int,
                 beam_width: int | None = None, temperature: float = 1.0, seam: StopSeam | None = None) -> list[GenRequest]:
    """Requests for the next pass: one per candidate whose latest attempt failed one of retry.on (its own budget
    and temperature, so per-row overrides and every one of n candidates carry over); under beam search, one
    per item with a cut-off beam. `temperature` is the job's, the base of a resample's temperature; `seam` as in
    grow_request."""
    if beam_width is not None:
        return plan_beam_retries(latest, retry, max_model_len, beam_width)
    on = retry_on(retry)
    passing = set(latest.loc[latest["passed"].astype(bool), "item_id"]) if "passed" in latest else set()
    requests = []
    for row in latest.itertuples(index=False):
        if row.attempt > retry.max_passes:  # its retries are spent (some perhaps in the stream)
            continue
        if row.finish_reason == "length" and "truncated" in on:
            request = grow_request(row, retry, max_model_len, seam)
            if request is not None:
                requests.append(request)
                continue
        causes = [name for name in _failed(row) if name in on and name != "truncated"]
        if causes and row.item_id not in passing:
            requests.append(resample_request(row, retry, temperature))
    return requests


def passes_after_stream(job: JobSpec, max_model_len: int | None) -> int:
    """How many retry passes can still plan requests once a window's generate task has retried its cut-off outputs
    in its stream: none when the job retries nothing but cut-off outputs and the stream did (not beam search,
    `retry.in_stream`, the engine's context known): the stream followed up every cut-off output while it had passes
    left and its budget could grow, as a pass would (`grow_request` both ways); else `retry.max_passes`."""
    streamed = job_stream_retry(job, max_model_len) is not None
    return 0 if streamed and retry_on(job.retry) <= {"truncated"} else job.retry.max_passes


def job_stream_retry(job: JobSpec, max_model_len: int | None,
                     seam_of: Callable[[JobSpec], StopSeam | None] | None = None) -> \
        Callable[[object], GenRequest | None] | None:
    """`stream_retry` for a job's generate task (`seam_of(job)`: its StopSeam, job_stop_seam), or None where its
    stream retries nothing: the engine's context unknown, beam search (retried in passes), or as stream_retry says.
    The one place that decides it, for the stream and for the passes after it (passes_after_stream)."""
    if max_model_len is None or job.sampling.use_beam_search:
        return None
    return stream_retry(job.retry, max_model_len, seam_of(job) if seam_of is not None else None)


def stream_retry(retry: RetrySpec, max_model_len: int,
                 seam: StopSeam | None = None) -> Callable[[object], GenRequest | None] | None:
    """The follow-up of an attempt in the generate task's stream (batchgen.generation.run_requests): a cut-off
    output grown (or continued) while it has attempts left and its budget can grow; None when the job does not
    retry cut-off outputs in the stream. `seam` as in grow_request."""
    if not retry.in_stream or not retry.grows_cut_off:
        return None

    def follow_up(row: object) -> GenRequest | None:
        if row.finish_reason != "length" or row.attempt > retry.max_passes:  # type: ignore[attr-defined]
            return None
        return grow_request(row, retry, max_model_len, seam)

    def ahead(request: GenRequest) -> GenRequest | None:
        """The follow-up `request` will have if its output is cut off, so that it can start before that is known
        (run_requests' spare requests): a draw afresh (`grow`, or `continue_then_grow` after a continuation),
        never a continuation, which needs the output it continues."""
        row = SimpleNamespace(
            finish_reason="length", item_id=request.item_id, prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids, n_prompt_tokens=len(request.prompt_token_ids),
            max_tokens=request.max_tokens, attempt=request.attempt, candidate=request.candidate,
            temperature=request.temperature, lora=request.lora, strategy=request.strategy)
        return follow_up(row) if next_strategy(row, retry) == "grow" else None

    follow_up.ahead = ahead if retry.ahead else None  # type: ignore[attr-defined]
    return follow_up


def partial_stop(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` are the start of a stop string (0 when none): a continuation of
    such text would miss that stop, since vLLM looks for stop strings in the new text only."""
    return max((j for stop in stops for j in range(1, len(stop)) if text.endswith(stop[:j])), default=0)


class StopSeam:
    """For `continue` with stop strings of two or more characters: how many of a cut-off output's tokens its
    continuation keeps. Tokens are given back from the end until the kept text no longer ends in the start of a
    stop string, so the engine generates that stop string whole, in the new text where it looks for it.
    `decode(token_ids)` is the tokenizer's, as the engine detokenizes."""

    def __init__(self, stops: list[str], decode: Callable[[list[int]], str]):
        self.stops = [stop for stop in stops if len(stop) > 1]
        self.decode = decode

    def __call__(self, text: str, token_ids: list[int]) -> int:
        chars = partial_stop(text, self.stops)
        if not chars:
            return len(token_ids)
        for kept in range(len(token_ids) - 1, 0, -1):
            head = self.decode(token_ids[:kept])
            if len(head) <= len(text) - chars and not partial_stop(head, self.stops):
                return kept
        return 0

    def head(self, text: str, token_ids: list[int]) -> str:
        """The text of the kept tokens: the start of the output's own text where it decodes to that."""
        head = self.decode(token_ids) if token_ids else ""
        return text[:len(head)] if text.startswith(head) else head


def stop_seam(retry: RetrySpec, stops: list[str], tokenizer: Callable[[], object]) -> StopSeam | None:
    """The StopSeam a job's continuations need (`tokenizer()` loads the model's), or None: not `continue`, or no
    stop string that can be split."""
    if retry.strategy not in CONTINUES or not any(len(stop) > 1 for stop in stops):
        return None
    loaded = tokenizer()
    return StopSeam(stops, lambda ids: loaded.decode(ids, skip_special_tokens=True))  # type: ignore[attr-defined]


def job_stop_seam(job: JobSpec) -> StopSeam | None:
    """`stop_seam` for a job: its retry settings and stop strings, decoded with the model's tokenizer."""
    from batchgen.tokenizer import load_tokenizer

    return stop_seam(job.retry, job.sampling.stop, lambda: load_tokenizer(job.engine)[1])


def resample_request(row: object, retry: RetrySpec, temperature: float) -> GenRequest:
    """The candidate sampled again, whole, at its last budget; the temperature moves by temperature_step."""
    own = _temperature(row)
    moved = own if retry.temperature_step == 0 else resample_temperature(temperature if own is None else own, retry)
    return GenRequest(
        item_id=row.item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids),
        max_tokens=int(row.max_tokens), attempt=int(row.attempt) + 1, strategy="resample",
        candidate=int(row.candidate), n=1, temperature=moved, lora=_lora(row))


def grow_request(row: object, retry: RetrySpec, max_model_len: int,
                 seam: StopSeam | None = None) -> GenRequest | None:
    """A cut-off candidate with a bigger budget (grow) or asked for the rest (continue), as `next_strategy` says;
    None when it cannot grow. `seam(text, token_ids)` (stop_seam) is how many cut-off tokens a continuation keeps:
    the rest, the start of a stop string, are generated again. A draw afresh after a continuation
    (continue_then_grow) gets a seed of its own (`fresh_seed`): under the candidate's seed it would draw the same
    text again."""
    budget = next_budget(int(row.max_tokens), retry, int(row.n_prompt_tokens), max_model_len)
    if budget <= row.max_tokens:
        return None
    strategy = next_strategy(row, retry)
    request = GenRequest(
        item_id=row.item_id, prompt=row.prompt, prompt_token_ids=list(row.prompt_token_ids),
        max_tokens=budget, attempt=int(row.attempt) + 1, strategy=strategy,
        candidate=int(row.candidate), n=1, temperature=_temperature(row), lora=_lora(row),
        fresh_seed=strategy == "grow" and retry.strategy == "continue_then_grow",
    )
    if strategy == "continue":
        token_ids = list(row.token_ids)
        logprob = row.cumulative_logprob
        logprob = None if logprob is None or pd.isna(logprob) else float(logprob)
        logprobs = getattr(row, "logprobs", None)
        logprobs = list(logprobs) if isinstance(logprobs, (list, tuple)) else None
        kept = len(token_ids) if seam is None else seam(row.text, token_ids)
        if kept < len(token_ids):
            logprob = _without(logprob, token_ids[kept:], None if logprobs is None else logprobs[kept:])
            request.prefix_text = seam.head(row.text, token_ids[:kept])  # type: ignore[union-attr]
            token_ids = token_ids[:kept]
            logprobs = None if logprobs is None else logprobs[:kept]
        else:
            request.prefix_text = row.text
        request.prefix_token_ids = token_ids
        request.prefix_logprob = logprob
        request.prefix_logprobs = logprobs
    return request


def _without(logprob: float | None, dropped: list[int], positions: list | None) -> float | None:
    """The cumulative logprob less the dropped tokens' (each found among its position's logprobs, which vLLM
    gives for the sampled token too); None when it cannot be told."""
    if logprob is None or positions is None:
        return None
    for token_id, entries in zip(dropped, positions):
        found = next((e["logprob"] for e in (entries if entries is not None else [])
                      if int(e["token_id"]) == int(token_id)), None)
        if found is None:
            return None
        logprob -= float(found)
    return logprob


def rescued_by_reason(accepted: pd.DataFrame, attempts: pd.DataFrame) -> dict[str, int]:
    """Accepted items whose published candidate failed on an earlier attempt, by each reason it failed then
    (an item rescued from two failures counts under both; `truncated` also when only cut off). Read from a few
    columns as lists (not the texts; a pandas merge of a window's attempts cost more than the counting)."""
    if accepted.empty or attempts.empty:
        return {}
    won = {(item_id, candidate): number for item_id, candidate, number in zip(
        *(accepted[column].tolist() for column in ("item_id", "candidate", "attempt"))) if number > 1}
    if not won:
        return {}
    failed = attempts["failed"].tolist() if "failed" in attempts else [None] * len(attempts)
    reasons: dict[str, set] = {}
    for item_id, candidate, number, finish, failures in zip(*(attempts[column].tolist() for column in (
            "item_id", "candidate", "attempt", "finish_reason")), failed):
        published = won.get((item_id, candidate))
        if published is None or number >= published:
            continue
        names = set(_failures(failures)) | ({"truncated"} if finish == "length" else set())
        for name in names:
            reasons.setdefault(name, set()).add(item_id)
    return {name: len(ids) for name, ids in sorted(reasons.items())}
