"""Retry planning: which cut-off candidates go back to the engine, and with what budget."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from batchgen.job import RetrySpec
from batchgen.retry import latest_attempts, next_budget, plan_retries


def attempt(item_id: str, candidate: int = 0, attempt: int = 1, finish_reason: str = "length",
            max_tokens: int = 16, n_prompt_tokens: int = 10, **extra: Any) -> dict[str, Any]:
    n_out = extra.pop("n_out", max_tokens if finish_reason == "length" else 3)
    row = {
        "item_id": item_id, "candidate": candidate, "attempt": attempt, "finish_reason": finish_reason,
        "max_tokens": max_tokens, "n_prompt_tokens": n_prompt_tokens,
        "prompt": f"prompt of {item_id}", "prompt_token_ids": list(range(100, 100 + n_prompt_tokens)),
        "text": f"{item_id}/{candidate} attempt {attempt}", "token_ids": list(range(1, n_out + 1)),
        "cumulative_logprob": -0.5 * n_out,
    }
    row.update(extra)
    return row


def frame(*rows: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def test_latest_attempts_picks_the_newest_attempt_per_item_and_candidate():
    attempts = frame(
        attempt("b", 0, 1), attempt("a", 0, 2, "stop"), attempt("a", 0, 1),
        attempt("a", 1, 1, "stop"), attempt("b", 0, 3, "stop"), attempt("b", 0, 2),
    )

    latest = latest_attempts(attempts)

    got = sorted(zip(latest["item_id"], latest["candidate"], latest["attempt"], latest["finish_reason"]))
    assert got == [("a", 0, 2, "stop"), ("a", 1, 1, "stop"), ("b", 0, 3, "stop")]


def test_latest_attempts_come_in_item_then_candidate_order_and_a_repeated_attempt_keeps_its_later_row():
    attempts = frame(
        attempt("é", 0, 1, text="é first"), attempt("b", 1, 1), attempt("B", 0, 1), attempt("b", 0, 2, "stop"),
        attempt("é", 0, 1, "stop", text="é again"), attempt("b", 0, 1), attempt("中", 0, 1),
    )
    attempts["item_id"] = attempts["item_id"].astype("string[pyarrow]")

    latest = latest_attempts(attempts)

    # code point order, as the published rows of a window come: "B" < "b" < "é" < "中"
    assert list(zip(latest["item_id"], latest["candidate"], latest["attempt"])) == [
        ("B", 0, 1), ("b", 0, 2), ("b", 1, 1), ("é", 0, 1), ("中", 0, 1)]
    assert latest.loc[latest["item_id"] == "é", "text"].item() == "é again"
    assert list(latest.columns) == list(attempts.columns)


def test_latest_attempts_of_items_with_integer_ids_are_found_too():
    attempts = frame(attempt(3, 0, 1), attempt(1, 0, 1), attempt(1, 0, 2, "stop"), attempt(2, 0, 1))

    latest = latest_attempts(attempts)

    assert list(zip(latest["item_id"], latest["attempt"])) == [(1, 2), (2, 1), (3, 1)]


def test_latest_attempts_of_nothing_is_empty():
    empty = pd.DataFrame(columns=["item_id", "candidate", "attempt"])
    assert latest_attempts(empty).empty


def test_only_outputs_cut_off_by_max_tokens_are_retried():
    latest = frame(
        attempt("cut", finish_reason="length"),
        attempt("stopped", finish_reason="stop"),
        attempt("aborted", finish_reason="abort"),
        attempt("unknown", finish_reason="unknown"),
    )

    requests = plan_retries(latest, RetrySpec(), max_model_len=2048)

    assert [r.item_id for r in requests] == ["cut"]


@pytest.mark.parametrize(("max_tokens", "n_prompt", "cap", "max_len", "expected"), [
    (16, 10, 1024, 2048, 32),     # doubles
    (100, 10, 150, 2048, 150),    # capped by max_tokens_cap
    (100, 1900, 1024, 2048, 148),  # capped by the room left in the context
    (5, 10, 1024, 2048, 10),
])
def test_grow_doubles_the_budget_within_the_caps(max_tokens, n_prompt, cap, max_len, expected):
    retry = RetrySpec(strategy="grow", growth_factor=2, max_tokens_cap=cap)
    latest = frame(attempt("a", max_tokens=max_tokens, n_prompt_tokens=n_prompt))

    [request] = plan_retries(latest, retry, max_model_len=max_len)

    assert request.max_tokens == expected
    assert request.strategy == "grow"
    assert request.attempt == 2
    assert request.candidate == 0 and request.n == 1
    assert request.prompt == "prompt of a"
    assert request.prompt_token_ids == list(range(100, 100 + n_prompt))
    assert request.prefix_text == "" and request.prefix_token_ids == []  # grow starts over


def test_growth_factor_rounds_up():
    assert next_budget(15, RetrySpec(growth_factor=1.5), n_prompt_tokens=10, max_model_len=2048) == 23


@pytest.mark.parametrize(("max_tokens", "n_prompt", "cap", "max_len"), [
    (64, 10, 64, 2048),    # already at max_tokens_cap
    (64, 1984, 1024, 2048),  # already fills the context
    (80, 10, 64, 2048),    # the first pass was given more than the cap
])
def test_a_row_already_at_the_cap_is_not_retried(max_tokens, n_prompt, cap, max_len):
    retry = RetrySpec(growth_factor=2, max_tokens_cap=cap)
    latest = frame(attempt("at-cap", max_tokens=max_tokens, n_prompt_tokens=n_prompt), attempt("grows"))

    requests = plan_retries(latest, retry, max_model_len=max_len)

    assert [r.item_id for r in requests] == ["grows"]


def test_retries_follow_the_latest_attempt_of_each_candidate():
    retry = RetrySpec(growth_factor=2, max_tokens_cap=1024)
    attempts = frame(
        attempt("a", 0, 1, max_tokens=16), attempt("a", 0, 2, max_tokens=32),  # still cut off after one retry
        attempt("a", 1, 1, max_tokens=16, finish_reason="stop"),
        attempt("b", 0, 1, max_tokens=16), attempt("b", 0, 2, max_tokens=32, finish_reason="stop"),  # fixed
    )

    requests = plan_retries(latest_attempts(attempts), retry, max_model_len=2048)

    assert [(r.item_id, r.candidate, r.attempt, r.max_tokens) for r in requests] == [("a", 0, 3, 64)]


def test_continue_carries_the_prefix_and_the_total_budget():
    retry = RetrySpec(strategy="continue", growth_factor=2, max_tokens_cap=1024)
    latest = frame(attempt("a", candidate=1, attempt=1, max_tokens=16, text="The mug keeps coffee",
                           token_ids=list(range(500, 516)), cumulative_logprob=-7.25))

    [request] = plan_retries(latest, retry, max_model_len=2048)

    assert request.strategy == "continue"
    assert request.max_tokens == 32  # total budget, the prefix included
    assert request.prefix_text == "The mug keeps coffee"
    assert request.prefix_token_ids == list(range(500, 516))
    assert request.prefix_logprob == -7.25
    assert request.candidate == 1 and request.attempt == 2 and request.n == 1
    assert request.prompt_token_ids == list(range(100, 110))


def test_continue_then_grow_continues_a_first_cut_and_draws_a_cut_continuation_afresh():
    retry = RetrySpec(strategy="continue_then_grow", growth_factor=2, max_tokens_cap=1024)
    latest = frame(
        attempt("first", attempt=1, max_tokens=16, strategy="first", text="The mug keeps coffee"),
        attempt("again", attempt=2, max_tokens=32, strategy="continue", text="The lamp glows and glows and glows"),
        attempt("resampled", attempt=2, max_tokens=16, strategy="resample", text="A kettle"),
        attempt("regrown", attempt=2, max_tokens=32, strategy="grow", text="A bag"),
    )

    got = {r.item_id: r for r in plan_retries(latest, retry, max_model_len=2048)}

    assert {k: (r.strategy, r.attempt, r.max_tokens, r.fresh_seed) for k, r in got.items()} == {
        "first": ("continue", 2, 32, False), "resampled": ("continue", 3, 32, False),
        "again": ("grow", 3, 64, True), "regrown": ("grow", 3, 64, True)}
    assert got["first"].prefix_text == "The mug keeps coffee" and len(got["first"].prefix_token_ids) == 16
    assert got["again"].prefix_text == "" and got["again"].prefix_token_ids == []  # drawn afresh, whole


@pytest.mark.parametrize(("retry", "sampling", "max_model_len", "passes"), [
    ({}, {}, 2048, 0),  # cut-off outputs only, retried in the stream: no pass can plan more
    ({"in_stream": False}, {}, 2048, 2),  # retried in passes
    ({"on": ["truncated", "keyword"]}, {}, 2048, 2),  # a failed keyword is resampled in a pass
    ({"max_passes": 3}, {}, None, 3),  # the engine's context unknown: the stream retries nothing
    ({}, {"use_beam_search": True, "n": 2}, 2048, 2),  # beam search retries in passes
])
def test_retry_passes_run_after_the_stream_only_where_it_left_them_something(retry, sampling, max_model_len, passes):
    from batchgen.job import job_from_dict
    from batchgen.retry import passes_after_stream

    job = job_from_dict({"name": "j", "input": {"path": "items.csv"}, "prompt": {"template": "{{ x }}"},
                         "sampling": {"max_tokens": 16, **sampling}, "expectations": {"keyword_column": "x"},
                         "retry": retry, "output": {"dir": "out"}})
    assert passes_after_stream(job, max_model_len) == passes


def test_a_fresh_draw_gets_a_seed_and_a_key_of_its_own():
    from batchgen.generation import engine_budget, request_keys
    from batchgen.records import GenRequest

    grown = GenRequest("a", "p", [1, 2, 3], max_tokens=64, attempt=3, strategy="grow", candidate=0)
    fresh = GenRequest("a", "p", [1, 2, 3], max_tokens=64, attempt=3, strategy="grow", candidate=0, fresh_seed=True)
    base = {"temperature": 0.7, "max_tokens": 16, "n": 1, "seed": 7}

    assert engine_budget(base, grown)["seed"] == 7  # grow keeps the candidate's seed
    assert engine_budget(base, fresh)["seed"] == 7 + 2  # a fresh draw: none of the candidate's attempts had it
    keys = request_keys([grown, fresh], base, "model")
    assert keys[0] != keys[1]
    assert request_keys([grown], base, "model") == [keys[0]]


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_continue_without_a_logprob_has_no_prefix_logprob(missing):
    retry = RetrySpec(strategy="continue")
    latest = frame(attempt("a", cumulative_logprob=missing))
    [request] = plan_retries(latest, retry, max_model_len=2048)
    assert request.prefix_logprob is None


def test_nothing_cut_off_plans_nothing():
    latest = frame(attempt("a", finish_reason="stop"), attempt("b", finish_reason="stop"))
    assert plan_retries(latest, RetrySpec(), max_model_len=2048) == []


def failing(item_id: str, failed: list[str], candidate: int = 0, attempt_no: int = 1, finish_reason: str = "stop",
            **extra: Any) -> dict[str, Any]:
    return attempt(item_id, candidate, attempt_no, finish_reason, passed=not failed, failed=failed, **extra)


def test_by_default_only_cut_off_outputs_are_retried_not_other_failures():
    latest = frame(failing("no-keyword", ["keyword"]), failing("cut", ["truncated", "keyword"], finish_reason="length"))

    requests = plan_retries(latest, RetrySpec(), max_model_len=2048)

    assert [(r.item_id, r.strategy) for r in requests] == [("cut", "grow")]


def test_a_failure_named_in_on_is_resampled_at_its_budget_with_the_temperature_moved():
    retry = RetrySpec(on=["truncated", "keyword"], temperature_step=0.25, max_temperature=1.0)
    latest = frame(
        failing("no-keyword", ["keyword"], max_tokens=40),
        failing("row-temp", ["keyword"], temperature=0.9),  # the row's own temperature moves, capped at 1.0
        failing("too-short", ["length"]),  # not in retry.on
        failing("fine", []),
    )

    requests = plan_retries(latest, retry, max_model_len=2048, temperature=0.5)

    got = {r.item_id: (r.strategy, r.max_tokens, r.temperature, r.attempt, r.candidate, r.n) for r in requests}
    assert got == {"no-keyword": ("resample", 40, 0.75, 2, 0, 1), "row-temp": ("resample", 16, 1.0, 2, 0, 1)}
    assert all(r.prefix_token_ids == [] and r.prefix_text == "" for r in requests)


def test_a_resample_without_a_temperature_step_keeps_the_job_temperature():
    [request] = plan_retries(frame(failing("a", ["must_match"])), RetrySpec(on=["regex"]), max_model_len=2048)

    assert request.strategy == "resample" and request.temperature is None  # None: the job's own


def test_an_item_with_a_passing_candidate_is_not_resampled():
    latest = frame(failing("a", ["keyword"], candidate=0), failing("a", [], candidate=1),
                   failing("b", ["keyword"], candidate=0), failing("b", ["keyword"], candidate=1))

    requests = plan_retries(latest, RetrySpec(on=["keyword"]), max_model_len=2048)

    assert sorted((r.item_id, r.candidate) for r in requests) == [("b", 0), ("b", 1)]


def test_a_cut_off_output_that_cannot_grow_is_resampled_when_its_other_failure_is_in_on():
    retry = RetrySpec(on=["truncated", "keyword"], max_tokens_cap=16)
    latest = frame(failing("a", ["truncated", "keyword"], finish_reason="length", max_tokens=16),
                   failing("b", ["truncated"], finish_reason="length", max_tokens=16))

    requests = plan_retries(latest, retry, max_model_len=2048)

    assert [(r.item_id, r.strategy, r.max_tokens) for r in requests] == [("a", "resample", 16)]


def test_rescued_by_reason_counts_the_failures_of_earlier_attempts_of_the_published_candidate():
    from batchgen.retry import rescued_by_reason

    attempts = frame(
        failing("a", ["keyword"]), failing("a", [], attempt_no=2),
        failing("b", ["truncated", "keyword"], finish_reason="length"), failing("b", ["keyword"], attempt_no=2),
        failing("b", [], attempt_no=3),
        failing("c", []),
        failing("d", ["length"], candidate=0), failing("d", [], candidate=1),  # won by another candidate
    )
    accepted = pd.DataFrame({"item_id": ["a", "b", "c", "d"], "candidate": [0, 0, 0, 1], "attempt": [2, 3, 1, 1]})

    assert rescued_by_reason(accepted, attempts) == {"keyword": 2, "truncated": 1}


def attempt_row(item_id: str, candidate: int, finish: str, attempt: int = 1, max_tokens: int = 8,
                temperature: float | None = None) -> dict[str, Any]:
    return {"item_id": item_id, "candidate": candidate, "attempt": attempt, "finish_reason": finish,
            "max_tokens": max_tokens, "n_prompt_tokens": 4, "prompt": "p", "prompt_token_ids": [1, 2, 3, 4],
            "text": "t", "token_ids": [5] * max_tokens, "cumulative_logprob": -1.0, "temperature": temperature,
            "logprobs": None}


def test_a_cut_off_beam_searches_the_whole_item_again_with_a_bigger_budget():
    latest = latest_attempts(pd.DataFrame([attempt_row("a", 0, "stop"), attempt_row("a", 1, "length"),
                                           attempt_row("b", 0, "stop"), attempt_row("b", 1, "stop")]))
    requests = plan_retries(latest, RetrySpec(max_passes=2, growth_factor=2, max_tokens_cap=64), 2048, beam_width=2)
    assert [(r.item_id, r.n, r.candidate, r.max_tokens, r.attempt, r.strategy) for r in requests] == [
        ("a", 2, None, 16, 2, "grow")]


def test_retries_keep_each_candidate_and_its_own_budget_and_temperature():
    latest = latest_attempts(pd.DataFrame([
        attempt_row("a", 0, "length", max_tokens=4, temperature=0.2), attempt_row("a", 1, "stop", max_tokens=4),
        attempt_row("a", 2, "length", max_tokens=4, temperature=0.2), attempt_row("b", 0, "length", max_tokens=10),
    ]))
    requests = plan_retries(latest, RetrySpec(max_passes=2, growth_factor=2, max_tokens_cap=64), 2048)
    assert sorted((r.item_id, r.candidate, r.max_tokens, r.temperature) for r in requests) == [
        ("a", 0, 8, 0.2), ("a", 2, 8, 0.2), ("b", 0, 20, None)]


# --- continue and stop strings split across the cut -----------------------------------------------------------

def cut_off(tokenizer, text: str, **extra: Any) -> pd.DataFrame:
    """An output cut off right after `text`, with the tokens the tokenizer gives it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    return frame(attempt("a", max_tokens=len(ids), text=text, token_ids=ids, n_out=len(ids), **extra))


def seam_of(tokenizer, stops: list[str], strategy: str = "continue"):
    from batchgen.retry import stop_seam
    return stop_seam(RetrySpec(strategy=strategy), stops, lambda: tokenizer)


def test_partial_stop_is_the_longest_start_of_a_stop_string_the_text_ends_in():
    from batchgen.retry import partial_stop
    assert partial_stop("Warm.\n", ["\n\n"]) == 1
    assert partial_stop("Warm. ENDO", ["END OF", "\n\n"]) == 0
    assert partial_stop("Warm. END O", ["END OF"]) == 5
    assert partial_stop("Warm.", ["\n\n"]) == 0


def test_a_continuation_gives_back_the_start_of_a_stop_string_so_the_engine_generates_it_whole(tokenizer):
    latest = cut_off(tokenizer, "A sturdy mug that keeps coffee hot.\n", cumulative_logprob=-3.0)

    [request] = plan_retries(latest, RetrySpec(strategy="continue"), max_model_len=2048,
                             seam=seam_of(tokenizer, ["\n\n"]))

    assert request.prefix_text == "A sturdy mug that keeps coffee hot."
    assert tokenizer.decode(request.prefix_token_ids) == request.prefix_text
    assert len(request.prefix_token_ids) < len(latest.loc[0, "token_ids"])
    assert request.prefix_logprob is None  # the given-back tokens' logprobs were not kept: it cannot be told
    assert request.max_tokens == 2 * int(latest.loc[0, "max_tokens"])  # the total budget is the same


def test_the_given_back_tokens_logprobs_come_off_the_cumulative_logprob(tokenizer):
    text = "Warm and bright.\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    steps = [[{"token_id": t, "token": "", "logprob": -0.25 * (i + 1), "rank": 1}] for i, t in enumerate(ids)]
    latest = cut_off(tokenizer, text, cumulative_logprob=sum(s[0]["logprob"] for s in steps), logprobs=steps)

    [request] = plan_retries(latest, RetrySpec(strategy="continue"), max_model_len=2048,
                             seam=seam_of(tokenizer, ["\n\n"]))

    kept = len(request.prefix_token_ids)
    assert request.prefix_logprob == pytest.approx(sum(s[0]["logprob"] for s in steps[:kept]))
    assert request.prefix_logprobs == steps[:kept]


def test_text_that_ends_in_no_stop_string_start_is_kept_whole(tokenizer):
    latest = cut_off(tokenizer, "A sturdy mug that keeps coffee", cumulative_logprob=-3.0)
    [request] = plan_retries(latest, RetrySpec(strategy="continue"), max_model_len=2048,
                             seam=seam_of(tokenizer, ["\n\n", "END"]))
    assert request.prefix_text == "A sturdy mug that keeps coffee"
    assert request.prefix_token_ids == list(latest.loc[0, "token_ids"])
    assert request.prefix_logprob == -3.0


def test_an_output_that_is_all_the_start_of_a_stop_string_is_continued_from_nothing(tokenizer):
    latest = cut_off(tokenizer, "\n")
    [request] = plan_retries(latest, RetrySpec(strategy="continue"), max_model_len=2048,
                             seam=seam_of(tokenizer, ["\n\n"]))
    assert request.prefix_text == "" and request.prefix_token_ids == []


def test_no_seam_is_needed_for_grow_or_for_one_character_stop_strings(tokenizer):
    assert seam_of(tokenizer, ["\n\n"], strategy="grow") is None
    assert seam_of(tokenizer, ["\n", "."]) is None
    assert seam_of(tokenizer, []) is None


def test_the_stream_follow_up_gives_back_the_start_of_a_stop_string(tokenizer):
    from batchgen.retry import stream_retry
    row = next(cut_off(tokenizer, "Bright lamp.\n").itertuples(index=False))
    follow_up = stream_retry(RetrySpec(strategy="continue"), 2048, seam_of(tokenizer, ["\n\n"]))
    assert follow_up(row).prefix_text == "Bright lamp."
