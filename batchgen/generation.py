"""Generation requests, the engine call, and one row per (item, candidate, attempt).

Pending requests go into the engine's stream (batchgen.stream) all at once, so vLLM's
continuous batching stays full across tasks; finished outputs are committed to the result
store in batches while the engine goes on, so a crash loses at most the uncommitted ones.
"""

from __future__ import annotations

import hashlib
import json
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

import pandas as pd

from batchgen.job import SamplingSpec
from batchgen.records import Attempt, GenRequest


# Job fields that are not SamplingParams arguments: they shape requests or selection instead.
NOT_SAMPLING_PARAMS = {"selection", "best_of", "use_beam_search", "beam_width", "length_penalty", "json_schema",
                       "regex", "choice", "grammar", "overrides", "keep_logprob"}
# The job's structured output constraint, as StructuredOutputsParams names it.
STRUCTURED_NAMES = {"json_schema": "json", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def sampling_kwargs(spec: SamplingSpec) -> dict[str, Any]:
    """Engine keyword arguments shared by every request of a job (JSON-able: they are part of request keys).

    Sampling: SamplingParams arguments under vLLM's names (the job's own fields and any other field of
    SamplingParams it names), the structured output constraint as `structured_outputs`. Beam search:
    BeamSearchParams arguments, marked with `beam_search`.
    """
    if spec.use_beam_search:
        return {"beam_search": True, "beam_width": spec.candidates, "max_tokens": spec.max_tokens,
                "length_penalty": spec.length_penalty, "temperature": spec.temperature,
                "ignore_eos": spec.ignore_eos, "logprobs": spec.logprobs}
    kwargs = spec.model_dump(exclude=NOT_SAMPLING_PARAMS)
    kwargs["stop"] = kwargs["stop"] or None
    kwargs["stop_token_ids"] = kwargs["stop_token_ids"] or None
    if kwargs["top_k"] is None:
        kwargs.pop("top_k")
    if kwargs["seed"] is None:
        kwargs.pop("seed")
    # logprobs=0 returns only the sampled token's logprob: enough for cumulative_logprob. Asked for only
    # when the job needs it: on an H200 it cut a small model's throughput by ~40% (15.6k against 26.0k tokens/s).
    if spec.logprobs is not None:
        kwargs["logprobs"] = spec.logprobs
    elif spec.needs_logprob:
        kwargs["logprobs"] = 0
    else:
        kwargs.pop("logprobs")
    if spec.structured is not None:
        name, value = spec.structured
        kwargs["structured_outputs"] = {STRUCTURED_NAMES[name]: value}
    return kwargs


def sampling_params(kwargs: dict[str, Any]) -> Any:
    """vllm.SamplingParams from engine_budget's arguments."""
    import msgspec
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from batchgen.vllm_sampling import vllm_values

    kwargs = vllm_values(dict(kwargs))
    if kwargs.get("structured_outputs") is not None:
        kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
    if isinstance(kwargs.get("logit_bias"), dict):  # token ids are text once the job has been through JSON
        kwargs["logit_bias"] = {int(token): float(bias) for token, bias in kwargs["logit_bias"].items()}
    if isinstance(kwargs.get("repetition_detection"), dict):  # a struct of its own in vLLM
        from vllm.sampling_params import RepetitionDetectionParams

        kwargs["repetition_detection"] = msgspec.convert(kwargs["repetition_detection"], RepetitionDetectionParams)
    return SamplingParams(**kwargs)


def top_logprobs(positions: Any) -> list[list[dict[str, Any]]] | None:
    """vLLM's per-token logprobs (a list of {token_id: Logprob}, or FlatLogprobs) as plain rows, best first."""
    if positions is None:
        return None
    rows = []
    for position in positions:
        entries = [{"token_id": int(token_id), "token": lp.decoded_token, "logprob": float(lp.logprob),
                    "rank": None if lp.rank is None else int(lp.rank)}
                   for token_id, lp in (position or {}).items()]
        rows.append(sorted(entries, key=lambda e: -e["logprob"]))
    return rows


def request_key(request: GenRequest, sampling: dict[str, Any], model_identity: str) -> str:
    """What makes a result reusable: item, prompt, model, sampling, budget and prefix."""
    return request_keys([request], sampling, model_identity)[0]


def request_keys(requests: list[GenRequest], sampling: dict[str, Any], model_identity: str) -> list[str]:
    """`request_key` of many requests: the run-wide part (model, sampling) is hashed once, then each request
    adds its own fields and its token ids as bytes (no JSON per request: this runs for every item)."""
    shared = {k: v for k, v in sampling.items() if k not in ("max_tokens", "n")}
    base = hashlib.sha256(json.dumps({"model": model_identity, "sampling": shared}, sort_keys=True,
                                     default=str).encode())
    job_temperature = sampling.get("temperature")
    keys = []
    for r in requests:
        temperature = r.temperature if r.temperature is not None and r.temperature != job_temperature else None
        h = base.copy()
        # repr of a tuple of str/int/float/None is unambiguous; the token ids follow with their counts
        h.update(repr((r.item_id, temperature, r.max_tokens, r.n, r.candidate, r.attempt, r.strategy, r.lora,
                       len(r.prompt_token_ids), len(r.prefix_token_ids))).encode())
        h.update(array("q", r.prompt_token_ids).tobytes())
        h.update(array("q", r.prefix_token_ids).tobytes())
        if r.fresh_seed:  # only then: the keys of every other request stay as they were
            h.update(b"fresh_seed")
        keys.append(h.hexdigest()[:32])
    return keys


def _optional(prompts: pd.DataFrame, name: str) -> list[Any]:
    """A column's values with missing ones as None; all None when the column is absent."""
    if name not in prompts:
        return [None] * len(prompts)
    return [None if value is None or pd.isna(value) else value for value in prompts[name].tolist()]


def first_pass_requests(prompts: pd.DataFrame, sampling: SamplingSpec) -> list[GenRequest]:
    """One request per prompt for all its candidates; a row's own max_tokens / temperature (overrides) wins.
    Built from whole columns: this runs for every item, on the path to the engine."""
    return [GenRequest(item_id=item_id, prompt=prompt, prompt_token_ids=list(token_ids),
                       max_tokens=sampling.max_tokens if budget is None else int(budget), n=sampling.candidates,
                       temperature=None if temperature is None else float(temperature),
                       lora=None if lora is None else str(lora))
            for item_id, prompt, token_ids, budget, temperature, lora in zip(
                prompts["item_id"].tolist(), prompts["prompt"].tolist(), prompts["prompt_token_ids"].tolist(),
                _optional(prompts, "max_tokens"), _optional(prompts, "temperature"), _optional(prompts, "lora"))]


def output_rows(request: GenRequest, output: Any, key: str, seconds: float,
                finished_at: datetime | None = None, keep_logprobs: bool = False,
                keep_prompt_logprobs: bool = False) -> list[Attempt]:
    """One vLLM RequestOutput as attempts, a candidate each, keeping every field the seeds list."""
    attempts = []
    for completion in output.outputs:
        logprob = completion.cumulative_logprob
        if logprob is not None and request.prefix_logprob is not None:
            logprob = logprob + request.prefix_logprob
        elif request.prefix_token_ids:
            logprob = None
        token_ids = request.prefix_token_ids + list(completion.token_ids)
        attempts.append(_attempt(
            request, key, str(output.request_id), seconds, finished_at,
            candidate=completion.index if request.candidate is None else request.candidate,
            text=request.prefix_text + completion.text, token_ids=token_ids,
            new_output_tokens=len(completion.token_ids), cumulative_logprob=logprob,
            finish_reason=completion.finish_reason or "unknown",
            stop_reason=None if completion.stop_reason is None else str(completion.stop_reason),
            logprobs=((request.prefix_logprobs or []) + (top_logprobs(completion.logprobs) or [])
                      if keep_logprobs else None),
            prompt_logprobs=top_logprobs(getattr(output, "prompt_logprobs", None)) if keep_prompt_logprobs else None))
    return attempts


def _attempt(request: GenRequest, key: str, request_id: str, seconds: float, finished_at: datetime | None, *,
             candidate: int, text: str, token_ids: list[int], new_output_tokens: int,
             cumulative_logprob: float | None, finish_reason: str, stop_reason: str | None,
             logprobs: list | None, prompt_logprobs: list | None) -> Attempt:
    """An attempt of `request`: what the request says of it, and what the engine returned."""
    return Attempt(
        item_id=request.item_id, candidate=candidate, attempt=request.attempt, strategy=request.strategy,
        request_key=key, request_id=request_id, prompt=request.prompt,
        prompt_token_ids=list(request.prompt_token_ids), n_prompt_tokens=len(request.prompt_token_ids),
        text=text, token_ids=token_ids, n_output_tokens=len(token_ids), new_output_tokens=new_output_tokens,
        cumulative_logprob=cumulative_logprob, finish_reason=finish_reason, stop_reason=stop_reason,
        max_tokens=request.max_tokens, temperature=request.temperature, lora=request.lora, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs, chunk_seconds=seconds, chunk_finished_at=finished_at)


def beam_rows(request: GenRequest, output: Any, key: str, seconds: float, finished_at: datetime | None,
              tokenizer: Any, keep_logprobs: int | None) -> list[Attempt]:
    """Attempts of one beam search: candidate = rank by vLLM's beam score (0 is best)."""
    attempts = []
    prompt_len = len(request.prompt_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    for rank, beam in enumerate(output.sequences):
        new = list(beam.tokens[prompt_len:])
        ended = bool(new) and eos is not None and new[-1] == eos
        logprobs = None
        if keep_logprobs is not None:  # vLLM keeps 2*beam_width per step; publish the k asked for
            steps = top_logprobs(beam.logprobs[len(beam.logprobs) - len(new):]) if new else []
            logprobs = [entries[:max(keep_logprobs, 1)] for entries in steps]
        attempts.append(_attempt(
            request, key, f"beam-{key}", seconds, finished_at, candidate=rank,
            text=tokenizer.decode(new, skip_special_tokens=True), token_ids=new, new_output_tokens=len(new),
            cumulative_logprob=float(beam.cum_logprob),
            finish_reason="stop" if ended or len(new) < request.max_tokens else "length", stop_reason=None,
            logprobs=logprobs, prompt_logprobs=None))
    return attempts


def engine_budget(base: dict[str, Any], request: GenRequest) -> dict[str, Any]:
    """SamplingParams for one request: a continuation asks only for what the prefix has not used."""
    done = len(request.prefix_token_ids)
    kwargs = {**base, "max_tokens": request.max_tokens - done, "n": request.n,
              "min_tokens": max(0, base.get("min_tokens", 0) - done)}
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if base.get("seed") is not None and request.candidate is not None:
        # vLLM seeds candidate i of a request with seed+i: a grown or continued candidate keeps its seed, a
        # resampled one (or one drawn afresh after a continuation) gets a seed no other candidate or attempt of
        # the item has.
        offset = request.candidate
        if request.strategy == "resample" or request.fresh_seed:
            offset += base.get("n", 1) * (request.attempt - 1)
        kwargs["seed"] = base["seed"] + offset
    return kwargs


def chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class EngineLike(Protocol):
    stream: Any  # batchgen.stream.EngineStream, or engine_process.RemoteStream

    def run(self, fn: Callable[..., Any], *args: Any) -> Any: ...  # fn(llm, *args) where the engine runs


def engine_requests(pending: list[tuple[str, GenRequest]], base: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """vLLM prompts and SamplingParams for the pending requests; requests with the same budget share one
    SamplingParams (vLLM copies it per request), since building one costs more than the rest of a request."""
    from vllm import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    shared: dict[tuple, Any] = {}
    prompts, params = [], []
    for _, request in pending:
        kwargs = engine_budget(base, request)
        marker = (kwargs["max_tokens"], kwargs["n"], kwargs["min_tokens"], kwargs.get("temperature"), kwargs.get("seed"))
        if marker not in shared:
            shared[marker] = sampling_params(kwargs)
            # One output per request, when it is done (as LLM.generate asks): all n completions together, and no
            # output objects built at every step for requests still running.
            shared[marker].output_kind = RequestOutputKind.FINAL_ONLY
        prompts.append(TokensPrompt(prompt_token_ids=request.prompt_token_ids + request.prefix_token_ids))
        params.append(shared[marker])
    return prompts, params


FOLLOW_UP_COMMIT_SECONDS = 0.25  # the longest a cut-off output waits for its commit (and its retry to be sent)


def cut_off(output: Any) -> bool:
    """Whether a vLLM RequestOutput has a completion cut off by max_tokens (one a stream retry follows up)."""
    return any(completion.finish_reason == "length" for completion in output.outputs)


def retries_first(engine: Any) -> bool:
    """Whether the engine schedules by priority (batchgen builds its engines so, `engine_args`): then a retry
    goes into the running batch ahead of first attempts still waiting (priority 1 - attempt: 0, -1, -2, ...),
    so that an item's chain of attempts is not left to run alone at the end of the job."""
    args = getattr(engine, "args", None) or {}
    return args.get("scheduling_policy") == "priority"


class Spares:
    """Follow-ups started before they are known to be needed (`ahead`, batchgen.retry.stream_retry): when a cut-off
    output's retry is sent, the attempt after it (its own retry, should it be cut off too) is sent as a spare
    request, which the engine starts only while it has room (EngineStream.submit). When the retry's output is
    committed, the spare is adopted if it is that output's follow-up (its output then committed right after it,
    as if it had been sent then), else withdrawn; an output that comes before that is held. Nothing is committed
    out of order, so a rerun after a crash finds what it found without spares."""

    def __init__(self, ahead: Callable[[GenRequest], GenRequest | None] | None, key: Callable[[GenRequest], str]):
        self._ahead, self._key = ahead, key
        self._of: dict[int, tuple[int, str, Any]] = {}  # request index -> its spare's (index, key, submission)
        self._open: set[int] = set()  # spares whose request's output has not been committed
        self._held: dict[int, Any] = {}  # outputs of open spares
        self._dropped: set[int] = set()  # withdrawn spares whose output (or None) is still to come
        self.kept = self.withdrawn = 0

    def ahead(self, request: GenRequest) -> tuple[str, GenRequest] | None:
        """(key, request) of the spare to start beside `request`, or None."""
        if self._ahead is None:
            return None
        spare = self._ahead(request)
        return None if spare is None else (self._key(spare), spare)

    def started(self, index: int, spare_index: int, key: str, submission: Any) -> None:
        """The spare for request `index` is request `spare_index` (its key), sent as `submission`."""
        self._of[index] = (spare_index, key, submission)
        self._open.add(spare_index)

    def decided_by(self, index: int) -> bool:
        """Whether request `index` has a spare that its output decides on."""
        return index in self._of

    def sort(self, batch: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """The outputs of `batch` to commit now: not those of spares still open (held) or withdrawn (dropped)."""
        ready = []
        for index, output in batch:
            if index in self._dropped:
                self._dropped.discard(index)
            elif index in self._open:
                self._held[index] = output
            elif output is not None:
                ready.append((index, output))
        return ready

    def resolve(self, index: int, follow_up: GenRequest | None) -> tuple[int, Any] | None:
        """Request `index`'s output is being committed and its follow-up is `follow_up`: None when it had no
        spare or the spare is not that follow-up (then withdrawn); else the spare is adopted: (its index, its
        output if it came already, else None)."""
        if index not in self._of:
            return None
        spare_index, key, submission = self._of.pop(index)
        self._open.discard(spare_index)
        held = self._held.pop(spare_index, None)
        if follow_up is not None and self._key(follow_up) == key:
            self.kept += 1
            if held is None:
                submission.promote()  # it runs now, room or not
            return spare_index, held
        self.withdrawn += 1
        if held is None:
            self._dropped.add(spare_index)
            submission.withdraw()
        return None


class AttemptsDone:
    """run_requests' `on_attempt_done`: which attempt numbers can have no more attempts. Requests sent for good
    (not spares still undecided) are counted by attempt number until their output is committed; an attempt number
    is done once nothing of it or below is open, since a follow-up always has a higher number than its attempt."""

    def __init__(self, rows: list[Attempt], said: Callable[[int, list[Attempt]], None] | None):
        self._rows, self._said = rows, said
        self._open: Counter[int] = Counter()
        self._by_attempt: dict[int, list[Attempt]] = {}
        self._read = 0  # rows[:_read] are in _by_attempt
        self._done: set[int] = set()

    def sent(self, requests: Iterable[GenRequest]) -> None:
        for request in requests:
            self._open[request.attempt] += 1

    def answered(self, requests: Iterable[GenRequest]) -> None:
        for request in requests:
            self._open[request.attempt] -= 1
            if not self._open[request.attempt]:
                del self._open[request.attempt]

    def check(self) -> None:
        """Say each attempt number now done (rows committed so far, none of it or below open), once."""
        if self._said is None:
            return
        for row in self._rows[self._read:]:
            if row.attempt not in self._done:  # (none come: the window's validation checks the counts)
                self._by_attempt.setdefault(row.attempt, []).append(row)
        self._read = len(self._rows)
        lowest_open = min(self._open, default=None)
        for attempt in sorted(self._by_attempt):
            if lowest_open is not None and attempt >= lowest_open:
                break
            self._done.add(attempt)
            self._said(attempt, self._by_attempt.pop(attempt))


class Ran(NamedTuple):
    rows: list[Attempt]  # every request's attempts, reused ones included
    reused: int  # requests answered from `done`
    first_added_at: float | None = None  # perf_counter: the first new request entered the engine
    last_output_at: float | None = None  # perf_counter: the last new output came back
    follow_ups: int = 0  # follow-up requests (run_requests' follow_up), reused ones included
    spares_kept: int = 0  # spare requests (Spares) that were the follow-up of their request's output
    spares_dropped: int = 0  # those that were not, withdrawn


def run_requests(
    engine_factory: Callable[[], EngineLike],
    requests: list[GenRequest],
    sampling: SamplingSpec,
    model_identity: str,
    commit_every: int,
    commit_seconds: float = 10.0,
    done: dict[str, list[Attempt]] | Callable[[set[str]], dict[str, list[Attempt]]] | None = None,
    on_commit: Callable[[list[Attempt], int, int], None] | None = None,
    adapters: dict[str, str] | None = None,
    follow_up: Callable[[Attempt], GenRequest | None] | None = None,
    on_requests_done: Callable[[list[Attempt]], None] | None = None,
    on_attempt_done: Callable[[int, list[Attempt]], None] | None = None,
) -> Ran:
    """Generate every request not already in `done` (keyed by request_key); return all rows and the reuse count.

    `done` is the committed rows by key, or a loader called with the requests' keys
    (e.g. `ResultStore.load`), so the keys are computed once.

    The engine is asked for (`engine_factory()`) only when something is left to generate. Every
    pending request goes into the engine's stream at once; finished outputs come back as they
    finish and are handed to `on_commit(new_rows, requests_done, requests_total)` every
    `commit_every` outputs or `commit_seconds`, whichever comes first (the caller commits them
    there). Other tasks may feed the same stream meanwhile: the engine never drains between them.
    `adapters` ({name: folder}, engine.lora_adapters) resolves each request's `lora` to a LoRARequest.

    `follow_up(attempt)` is another request for an attempt, or None (a cut-off output grown or continued,
    batchgen.retry.stream_retry): follow-ups of new outputs join the same submission as soon as their outputs
    are committed, so they run while the engine is still full; those of reused attempts are looked up in `done`
    first, as a rerun after a crash finds them there. With `follow_up.ahead` (retry.ahead), each follow-up's own
    follow-up is started beside it as a spare request (Spares), committed only after it and only if it is needed.
    `on_requests_done(rows)` is called once every one of `requests` has its output committed (what is left, if
    anything, is follow-ups), with the rows so far: every attempt of `requests`, and the follow-ups' that came
    before. `on_attempt_done(attempt, rows)` is called once per attempt number, in ascending order, as soon as no
    request of that number or a lower one is still waiting for its output (no more attempts of it can come): with
    the rows of that attempt number (reused ones included), so a window's first pass and each retry can be
    validated while later retries still run.
    """
    from batchgen.adapters import lora_request

    base = sampling_kwargs(sampling)
    loader = done if callable(done) else None
    known = {} if loader is not None else (done or {})
    rows: list[Attempt] = []
    pending: list[tuple[str, GenRequest]] = []
    reused = total = 0

    def reuse(wave: list[GenRequest]) -> list[GenRequest]:
        """Rows of the wave's committed requests, the others into `pending`; the follow-ups of what was reused."""
        nonlocal known, reused, total
        keyed = list(zip(request_keys(wave, base, model_identity), wave))
        total += len(keyed)
        if loader is not None:
            known = loader({key for key, _ in keyed})
        more = []
        for key, request in keyed:
            if key in known:
                rows.extend(known[key])
                reused += 1
                if follow_up is not None:
                    more.extend(next_request for row in known[key] if (next_request := follow_up(row)) is not None)
            else:
                pending.append((key, request))
        return more

    wave = reuse(requests)
    n_first = len(pending)  # pending[:n_first] are `requests`; follow-ups come after them
    while wave:  # the follow-ups of what was reused, and theirs, ...
        wave = reuse(wave)
    finished = reused
    if on_commit is not None and reused:
        on_commit([], finished, total)
    first_left = n_first  # `requests` still waiting for their output: pending[:n_first]
    if not first_left and on_requests_done is not None:
        on_requests_done(list(rows))
    attempts = AttemptsDone(rows, on_attempt_done)
    attempts.sent(request for _, request in pending)
    attempts.check()
    if not pending:
        return Ran(rows, reused, follow_ups=total - len(requests))
    engine = engine_factory()
    if base.get("beam_search"):  # LLM.beam_search runs whole calls: in chunks, on the stream's thread
        started = time.perf_counter()
        for chunk in chunks(pending, commit_every):
            new_rows = engine.run(beam_search_chunk, chunk, base, sampling.logprobs)
            rows.extend(new_rows)
            finished += len(chunk)
            if on_commit is not None:
                on_commit(new_rows, finished, total)
        if on_requests_done is not None:
            on_requests_done(list(rows))
        attempts.answered(request for _, request in pending)
        attempts.check()
        return Ran(rows, reused, started, time.perf_counter(), total - len(requests))

    keep = sampling.logprobs is not None
    keep_prompt = sampling.passthrough.get("prompt_logprobs") is not None

    ranked = retries_first(engine)

    def submit(new: list[tuple[str, GenRequest]], into: Any = None, spare: bool = False) -> Any:
        prompts, params = engine_requests(new, base)
        loras = [lora_request(adapters or {}, request.lora) for _, request in new] if adapters else None
        priorities = [1 - request.attempt for _, request in new] if ranked else None
        return engine.stream.submit(prompts, params, loras, into=into, priorities=priorities, spare=spare)

    submission = submit(pending)
    since = time.perf_counter()
    spares = Spares(getattr(follow_up, "ahead", None), lambda request: request_keys([request], base, model_identity)[0])
    # A cut-off output's follow-up is sent once the output is committed: its batch is committed within
    # FOLLOW_UP_COMMIT_SECONDS, not after commit_seconds (10 s by default), so retries join the stream at once. So is
    # an output with a spare beside it: its commit decides whether the spare is kept or withdrawn (a withdrawn
    # spare's place in the engine is freed, and the submission does not end before it is decided).
    urgent = (lambda index, output: cut_off(output) or spares.decided_by(index)) if follow_up is not None else None

    def commit(ready: list[tuple[int, Any]], seconds: float, finished_at: datetime) -> list[tuple[int, Any]]:
        """Commit finished outputs, send their follow-ups; returns held spare outputs that this commit adopted."""
        nonlocal finished, total, first_left
        new_rows: list[Attempt] = []
        more: list[GenRequest] = []
        adopted: list[tuple[int, Any]] = []
        chain: list[int] = []  # requests now sent for good (follow-ups, adopted spares): each gets its spare
        attempts.answered(pending[index][1] for index, _ in ready)
        for index, output in ready:
            key, request = pending[index]
            for row in output_rows(request, output, key, seconds, finished_at, keep, keep_prompt):
                new_rows.append(row)
                next_request = None if follow_up is None else follow_up(row)
                taken = spares.resolve(index, next_request)  # its spare, if it is the follow-up
                if taken is not None:
                    total += 1
                    spare_index, spare_output = taken
                    attempts.sent([pending[spare_index][1]])  # adopted: now a request like any other
                    if spare_output is None:  # still running: it may be cut off too
                        chain.append(spare_index)
                    else:
                        adopted.append((spare_index, spare_output))
                elif next_request is not None:
                    more.append(next_request)
        rows.extend(new_rows)
        finished += len(ready)
        total += len(more)
        if on_commit is not None:  # committed before their follow-ups exist: a rerun finds what they grow
            on_commit(new_rows, finished, total)
        attempts.sent(more)
        if more:
            new = list(zip(request_keys(more, base, model_identity), more))
            submit(new, into=submission)  # indexed after `pending`'s requests so far
            chain.extend(range(len(pending), len(pending) + len(new)))
            pending.extend(new)
        for index in chain:  # the attempt after each, started while the engine has room
            spare = spares.ahead(pending[index][1])
            if spare is not None:
                spares.started(index, len(pending), spare[0], submit([spare], into=submission, spare=True))
                pending.append(spare)
        if first_left:
            first_left -= sum(index < n_first for index, _ in ready)
            if not first_left and on_requests_done is not None:
                on_requests_done(list(rows))
        attempts.check()
        return adopted

    try:
        for batch in submission.batches(commit_every, commit_seconds, urgent,
                                        min(commit_seconds, FOLLOW_UP_COMMIT_SECONDS)):
            now = time.perf_counter()
            seconds, since = now - since, now
            finished_at = datetime.now(timezone.utc)
            ready = spares.sort(batch)
            while ready:  # a spare output adopted by this commit is committed right after it
                ready = commit(ready, seconds, finished_at)
    except BaseException:
        submission.cancel()  # a failed commit: the engine stops working for this task
        raise
    return Ran(rows, reused, submission.first_added_at, submission.last_output_at, total - len(requests),
               spares.kept, spares.withdrawn)


def beam_search_chunk(llm: Any, chunk: list[tuple[str, GenRequest]], base: dict[str, Any],
                      keep_logprobs: int | None) -> list[Attempt]:
    """One LLM.beam_search call per (budget, temperature) in the chunk: BeamSearchParams apply to a whole call."""
    from vllm import TokensPrompt
    from vllm.sampling_params import BeamSearchParams

    tokenizer = llm.get_tokenizer()
    groups: dict[tuple[int, float], list[tuple[str, GenRequest]]] = {}
    for key, request in chunk:
        temperature = base["temperature"] if request.temperature is None else request.temperature
        groups.setdefault((request.max_tokens, temperature), []).append((key, request))
    started = time.perf_counter()
    searched = []
    for (budget, temperature), group in groups.items():
        params = BeamSearchParams(beam_width=base["beam_width"], max_tokens=budget, temperature=temperature,
                                  length_penalty=base["length_penalty"], ignore_eos=base["ignore_eos"])
        outputs = llm.beam_search([TokensPrompt(prompt_token_ids=r.prompt_token_ids) for _, r in group], params)
        searched.extend(zip(group, outputs))
    # one chunk, one time: the generate task's rates read chunk_seconds from the chunk's first row
    seconds, finished_at = time.perf_counter() - started, datetime.now(timezone.utc)
    return [row for (key, request), output in searched
            for row in beam_rows(request, output, key, seconds, finished_at, tokenizer, keep_logprobs)]
