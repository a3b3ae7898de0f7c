"""Per-row overrides: the max_tokens and temperature cells, their row budgets and the rejections naming
the field."""

from __future__ import annotations

import pytest

from batchgen.generation import (
    GenRequest,
    engine_budget,
    first_pass_requests,
    request_key,
    sampling_kwargs,
)
from batchgen.items import load_items
from batchgen.job import InputSpec, JobError, PromptSpec, SamplingSpec
from batchgen.overrides import apply_overrides, check_override_columns, parse_max_tokens, parse_temperature
from batchgen.prompts import build_prompts


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
