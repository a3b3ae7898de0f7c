"""Sampling beyond one sample: selection among candidates, beam-search rows and retries, per-row
overrides, conversations, structured-output fields (pure logic; the engine tests are in
tests/e2e/test_sampling_engine.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from batchgen.assemble import assemble, choose_candidate, rank_candidates, structured_values
from batchgen.generation import (
    GenRequest, beam_rows, engine_budget, first_pass_requests, output_rows, request_key, sampling_kwargs,
    top_logprobs,
)
from batchgen.items import load_items
from batchgen.job import InputSpec, JobError, PromptSpec, RetrySpec, SamplingSpec
from batchgen.overrides import apply_overrides, check_override_columns, parse_max_tokens, parse_temperature
from batchgen.prompts import MessagesError, build_prompts, check_template_columns, conversation
from batchgen.retry import latest_attempts, plan_retries
from batchgen.records import LOGPROBS_TYPE
from batchgen.schema import accepted_schema
from expectations.suite import matches_json_schema


def candidates(texts_logprobs_passed: list[tuple[str, float | None, bool]], item_id: str = "p1") -> pd.DataFrame:
    return pd.DataFrame([
        {"item_id": item_id, "candidate": i, "attempt": 1, "text": text, "cumulative_logprob": logprob,
         "passed": passed, "failed": [] if passed else ["keyword"], "finish_reason": "stop"}
        for i, (text, logprob, passed) in enumerate(texts_logprobs_passed)
    ])


# --- selection ---------------------------------------------------------------------------------

def test_first_passing_publishes_the_best_scored_passing_candidate():
    pool = candidates([("fails, best score", -1.0, False), ("passes", -5.0, True), ("passes, better", -3.0, True)])
    chosen, ok = choose_candidate(pool, "first_passing")
    assert ok and chosen["candidate"] == 2


def test_first_passing_rejects_with_the_best_scored_candidate_when_none_passes():
    pool = candidates([("a", -4.0, False), ("b", -2.0, False)])
    chosen, ok = choose_candidate(pool, "first_passing")
    assert not ok and chosen["candidate"] == 1


def test_max_logprob_publishes_the_highest_cumulative_logprob_and_rejects_it_when_it_fails():
    pool = candidates([("a", -4.0, True), ("b", -0.5, True), ("c", -2.0, True)])
    assert choose_candidate(pool, "max_logprob")[0]["candidate"] == 1
    pool = candidates([("a", -4.0, True), ("b", -0.5, False)])
    chosen, ok = choose_candidate(pool, "max_logprob")
    assert not ok and chosen["candidate"] == 1  # not the passing one: max_logprob does not look at verdicts


def test_unknown_logprobs_rank_last_and_ties_go_to_the_lower_index():
    pool = candidates([("a", None, True), ("b", -1.0, True), ("c", -1.0, True)])
    assert list(rank_candidates(pool)["candidate"]) == [1, 2, 0]


def test_beam_candidates_rank_by_beam_order_not_by_logprob():
    # vLLM ranks beams by the length-penalised score: beam 0 may have the lower cumulative_logprob.
    pool = candidates([("long beam", -6.0, True), ("short beam", -2.0, True)])
    assert choose_candidate(pool, "first_passing", beam=True)[0]["candidate"] == 0
    assert choose_candidate(pool, "max_logprob", beam=True)[0]["candidate"] == 1


def items_frame(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"item_id": pd.Series(ids, dtype="string"),
                         "row_number": pd.Series(range(2, len(ids) + 2), dtype="int64"),
                         "name": [f"name {i}" for i in ids]})


def test_assemble_keeps_candidate_counts_and_the_selection_and_rejects_a_failing_max_logprob():
    final = pd.concat([
        candidates([("a", -4.0, True), ("b", -0.5, False), ("c", -2.0, True)], "p1"),
        candidates([("x", -1.0, True), ("y", -3.0, False)], "p2"),
    ], ignore_index=True)
    for column, value in (("attempt", 1), ("strategy", "first"), ("n_prompt_tokens", 5), ("n_output_tokens", 3),
                          ("max_tokens", 8), ("request_id", "r"), ("prompt", "p")):
        final[column] = value

    first = assemble(items_frame(["p1", "p2"]), ["name"], [], final, SamplingSpec(n=3))
    rows = first.accepted.set_index("item_id")
    assert rows.at["p1", "candidate"] == 2 and rows.at["p2", "candidate"] == 0
    assert (rows.at["p1", "n_candidates"], rows.at["p1", "n_passing"], rows.at["p1", "selection"]) == (
        3, 2, "first_passing")

    best = assemble(items_frame(["p1", "p2"]), ["name"], [], final, SamplingSpec(n=3, selection="max_logprob"))
    assert list(best.accepted["item_id"]) == ["p2"]
    rejected = best.rejected.set_index("item_id")
    assert rejected.at["p1", "candidate"] == 1
    assert "candidate 1 (highest cumulative_logprob) of 3 failed: keyword" == rejected.at["p1", "detail"]


# --- structured output -------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "price": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "price"]}


@pytest.mark.parametrize(("text", "ok"), [
    ('{"name": "Mug", "price": 12}', True),
    ('{"name": "Mug", "price": 12, "tags": ["a"]}', True),
    ('{"name": "Mug", "price": "12"}', False),  # wrong type
    ('{"name": "Mug"}', False),  # required field missing
    ('{"name": "Mug", "pri', False),  # cut off: not JSON, fails rather than errors
    (None, False),
])
def test_json_schema_check(text, ok):
    assert matches_json_schema(text, SCHEMA) is ok


def test_structured_fields_become_typed_result_columns():
    values = structured_values('{"name": "Mug", "price": 12, "tags": ["a", "b"]}', ["name", "price", "tags"])
    assert values == {"name": "Mug", "price": 12, "tags": '["a", "b"]'}
    assert structured_values("not json", ["name"]) == {"name": None}
    frame = pd.DataFrame([{"item_id": "p1", "name": "Mug", "price": 12, "tags": '["a"]', "n_candidates": 2,
                           "logprobs": None}])
    schema = accepted_schema(pa.string(), frame)
    assert schema.field("price").type == pa.int64() and schema.field("name").type == pa.string()
    assert schema.field("n_candidates").type == pa.int32() and schema.field("logprobs").type == LOGPROBS_TYPE


def test_json_schema_goes_to_the_engine_as_structured_outputs():
    kwargs = sampling_kwargs(SamplingSpec(json_schema=SCHEMA, max_tokens=32))
    assert kwargs["structured_outputs"] == {"json": SCHEMA}
    assert not {"json_schema", "selection", "best_of", "overrides", "use_beam_search"} & set(kwargs)
    from batchgen.generation import sampling_params

    params = sampling_params(engine_budget(kwargs, GenRequest("p1", "x", [1], max_tokens=32)))
    assert params.structured_outputs.json == SCHEMA and params.max_tokens == 32


# --- logprobs ----------------------------------------------------------------------------------

def lp(value: float, rank: int, token: str) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=token)


def test_top_logprobs_are_kept_per_token_best_first_and_continuations_keep_the_prefix():
    positions = [{5: lp(-2.0, 3, "x"), 1: lp(-0.1, 1, "a")}, {7: lp(-0.3, 1, "b")}]
    assert top_logprobs(positions) == [
        [{"token_id": 1, "token": "a", "logprob": -0.1, "rank": 1},
         {"token_id": 5, "token": "x", "logprob": -2.0, "rank": 3}],
        [{"token_id": 7, "token": "b", "logprob": -0.3, "rank": 1}],
    ]
    prefix = [[{"token_id": 9, "token": "z", "logprob": -1.0, "rank": 1}]]
    request = GenRequest("p1", "x", [1, 2], max_tokens=8, prefix_token_ids=[9], prefix_text="z",
                         prefix_logprobs=prefix, strategy="continue", attempt=2, candidate=0)
    out = SimpleNamespace(request_id="r", outputs=[SimpleNamespace(
        index=0, text="b", token_ids=[7], cumulative_logprob=-0.3, finish_reason="stop", stop_reason=None,
        logprobs=[{7: lp(-0.3, 1, "b")}])])
    row = output_rows(request, out, "k", 0.1, keep_logprobs=True)[0]
    assert row.logprobs == prefix + [[{"token_id": 7, "token": "b", "logprob": -0.3, "rank": 1}]]
    assert output_rows(request, out, "k", 0.1)[0].logprobs is None  # not asked: not kept


# --- beam search -------------------------------------------------------------------------------

class FakeTokenizer:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"t{i}" for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def test_beam_rows_hold_only_the_generated_tokens_ranked_with_finish_reasons():
    request = GenRequest("p1", "prompt", [100, 101], max_tokens=3, n=2)
    output = SimpleNamespace(sequences=[
        SimpleNamespace(tokens=[100, 101, 7, 2], cum_logprob=-1.5, logprobs=[{7: lp(-1.0, 1, "7")}, {2: lp(-.5, 1, "")}]),
        SimpleNamespace(tokens=[100, 101, 8, 9, 10], cum_logprob=-4.0, logprobs=[{}, {}, {}]),
    ])
    rows = beam_rows(request, output, "key", 0.5, None, FakeTokenizer(), keep_logprobs=None)
    assert [r.candidate for r in rows] == [0, 1]
    assert rows[0].token_ids == [7, 2] and rows[0].text == "t7" and rows[0].finish_reason == "stop"
    assert rows[1].n_output_tokens == 3 and rows[1].finish_reason == "length"
    assert rows[0].cumulative_logprob == -1.5 and rows[0].logprobs is None
    kept = beam_rows(request, output, "key", 0.5, None, FakeTokenizer(), keep_logprobs=1)
    assert kept[0].logprobs == [[{"token_id": 7, "token": "7", "logprob": -1.0, "rank": 1}],
                                   [{"token_id": 2, "token": "", "logprob": -0.5, "rank": 1}]]


def test_beam_search_kwargs_are_beam_search_params():
    kwargs = sampling_kwargs(SamplingSpec(use_beam_search=True, beam_width=3, length_penalty=0.5, max_tokens=9))
    assert kwargs == {"beam_search": True, "beam_width": 3, "max_tokens": 9, "length_penalty": 0.5,
                      "temperature": 1.0, "ignore_eos": False, "logprobs": None}


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


# --- per-row overrides -------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [("12", 12), (12, 12), (12.0, 12), (" 7 ", 7)])
def test_row_max_tokens_accepts_whole_numbers(value, expected):
    assert parse_max_tokens(value, SamplingSpec()) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("lots", "not a whole number"), (2.5, "not a whole number"), (0, "below 1"), ("-3", "below 1"),
    (True, "not a whole number"), (3, "below sampling.min_tokens (4)"),
])
def test_row_max_tokens_rejects_unusable_values(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_max_tokens(value, SamplingSpec(min_tokens=4))


@pytest.mark.parametrize(("value", "ok"), [("0.3", True), (0, True), (1.5, True), ("-0.1", False),
                                           ("warm", False), (float("inf"), False)])
def test_row_temperature(value, ok):
    if ok:
        assert parse_temperature(value) == float(value)
    else:
        with pytest.raises(ValueError):
            parse_temperature(value)


def test_overrides_set_row_budgets_keep_blanks_and_reject_bad_rows_naming_the_field(tmp_path, tokenizer):
    path = tmp_path / "rows.csv"
    path.write_text("id,name,budget,temp\na,Mug,5,0.1\nb,Lamp,,\nc,Desk,many,0.2\nd,Pen,6,hot\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="id"))
    sampling = SamplingSpec(max_tokens=16, overrides={"max_tokens": "budget", "temperature": "temp"})
    check_override_columns(sampling, loaded.columns)
    built = build_prompts(loaded.items, PromptSpec(template="Describe {{ name }}."), tokenizer, 2048, loaded.columns)
    built = apply_overrides(built, loaded.items, sampling, loaded.columns)

    requests = {r.item_id: r for r in first_pass_requests(built.prompts, sampling)}
    assert (requests["a"].max_tokens, requests["a"].temperature) == (5, 0.1)
    assert (requests["b"].max_tokens, requests["b"].temperature) == (16, None)  # blank cells: the job's values
    rejected = {r.item_id: r for r in built.rejected}
    assert set(rejected) == {"c", "d"}
    assert rejected["c"].reasons == ["invalid_override"]
    assert rejected["c"].detail == "row 3: sampling.overrides.max_tokens (column budget): 'many' is not a whole number"
    assert "sampling.overrides.temperature (column temp): 'hot' is not a number" in rejected["d"].detail

    base = sampling_kwargs(sampling)
    assert engine_budget(base, requests["a"])["temperature"] == 0.1
    assert engine_budget(base, requests["b"])["temperature"] == sampling.temperature
    # a row's own temperature is part of what makes its result reusable
    assert request_key(requests["a"], base, "m") != request_key(
        GenRequest("a", requests["a"].prompt, requests["a"].prompt_token_ids, 5, n=1), base, "m")


def test_an_override_column_the_input_lacks_is_a_job_error():
    with pytest.raises(JobError, match=r"sampling.overrides.max_tokens: 'budget' is not a column"):
        check_override_columns(SamplingSpec(overrides={"max_tokens": "budget"}), ["name"])


# --- conversations -----------------------------------------------------------------------------

CHAT = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another one?"}]


@pytest.mark.parametrize("value", [CHAT, json.dumps(CHAT), tuple(CHAT)])
def test_conversation_accepts_lists_and_json_text(value):
    assert conversation(value, "chat") == CHAT


@pytest.mark.parametrize(("value", "message"), [
    ("[{", "chat is not a JSON list"),
    ([], "non-empty list"),
    ([{"role": "user"}], r"chat\[0\] must be an object with role and content"),
    ([{"role": "robot", "content": "x"}], r"chat\[0\].role is 'robot'"),
    ([{"role": "user", "content": 3}], r"chat\[0\].content must be text"),
    (CHAT[:2], "the last message is from the assistant"),
])
def test_conversation_rejects_what_is_not_a_chat(value, message):
    with pytest.raises(MessagesError, match=message):
        conversation(value, "chat")


def test_conversation_column_renders_every_turn_with_the_chat_template(tmp_path, tokenizer):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [
        {"id": "c1", "chat": CHAT},
        {"id": "c2", "chat": [{"role": "assistant", "content": "Hi"}]},
        {"id": "c3", "chat": "not a list"},
    ]) + "\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="id"))
    spec = PromptSpec(messages_column="chat", system="Answer in one word.")
    assert check_template_columns(spec, loaded.columns) == ["chat"]
    built = build_prompts(loaded.items, spec, tokenizer, 2048, loaded.columns)

    assert list(built.prompts["item_id"]) == ["c1"]
    expected = tokenizer.apply_chat_template([{"role": "system", "content": "Answer in one word."}, *CHAT],
                                             tokenize=False, add_generation_prompt=True)
    assert built.prompts["prompt"].iloc[0] == expected
    assert "Apple.<|im_end|>" in expected and expected.endswith("<|im_start|>assistant\n")
    reasons = {r.item_id: (r.reasons, r.detail) for r in built.rejected}
    assert reasons["c2"] == (["invalid_messages"], "row 2: chat: the last message is from the assistant; "
                                                   "the model answers a user message")
    assert reasons["c3"][0] == ["invalid_messages"]


def test_a_missing_conversation_column_is_a_job_error():
    with pytest.raises(JobError, match=r"prompt.messages_column: 'chat' is not a column"):
        check_template_columns(PromptSpec(messages_column="chat"), ["name"])
