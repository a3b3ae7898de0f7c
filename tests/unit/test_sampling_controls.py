"""Every SamplingParams field of the installed vLLM under its own name, seeds, structured outputs, and what the
CPU build cannot do: the job's fields mapped to vLLM's, checked on vLLM's own classes (no engine)."""

from __future__ import annotations

import pandas as pd
import pytest

from batchgen.generation import GenRequest, engine_budget, sampling_kwargs, sampling_params
from batchgen.job import JobError, SamplingSpec, job_from_dict
from batchgen.vllm_checks import cpu_problem
from batchgen.vllm_sampling import MANAGED_PARAMS, vllm_sampling_fields
from tests.unit.test_job import job_with

# A value other than vLLM's default for each SamplingParams field the job does not declare itself. The test
# below fails when the installed vLLM gains a field, so the table (and docs/generation.md) keep up with it.
PASSTHROUGH_VALUES = {
    "watermarking": True,
    "prompt_logprobs": 2,
    "prompt_logprob_token_ids": [[1, 2]],
    "prompt_logprob_start": 1,
    "logprob_token_ids": [5, 6],
    "flat_logprobs": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "logit_bias": {42: 5.0},
    "allowed_token_ids": [1, 2, 3],
    "extra_args": {"custom": 1},
    "bad_words": ["cheap"],
    "skip_reading_prefix_cache": True,
    "thinking_token_budget": 8,
    "routed_experts_prompt_start": 2,
    "trace_decode_token_ids": [7],
}


def params_of(spec: SamplingSpec, request: GenRequest | None = None):
    request = request or GenRequest(item_id="a", prompt="", prompt_token_ids=[1], max_tokens=spec.max_tokens,
                                    n=spec.candidates)
    return sampling_params(engine_budget(sampling_kwargs(spec), request))


def test_every_field_of_vllms_sampling_params_is_a_job_field_a_passthrough_or_set_by_batchgen():
    declared = set(SamplingSpec.model_fields)
    rest = set(vllm_sampling_fields()) - declared - set(MANAGED_PARAMS)
    assert rest == set(PASSTHROUGH_VALUES) | {"repetition_detection"}  # a struct: tested on its own below


@pytest.mark.parametrize("name", sorted(PASSTHROUGH_VALUES))
def test_a_sampling_params_field_named_in_the_job_reaches_vllm_unchanged(name):
    spec = SamplingSpec(max_tokens=8, **{name: PASSTHROUGH_VALUES[name]})

    params = params_of(spec)

    got = getattr(params, name)
    assert (got.tolist() if hasattr(got, "tolist") else got) == PASSTHROUGH_VALUES[name]
    assert spec.model_dump()[name] == PASSTHROUGH_VALUES[name]  # in the manifest and the job fingerprint


def test_logit_bias_keeps_its_token_ids_through_a_json_round_trip(tmp_path):
    job = job_from_dict(job_with(sampling={"logit_bias": {42: 5}}), base_dir=tmp_path)
    again = job_from_dict(job.model_dump(mode="json"))  # as a run with overrides or a deployment reads it
    assert params_of(again.sampling).logit_bias == {42: 5.0}
    assert sampling_kwargs(again.sampling)["logit_bias"] == {"42": 5}


def test_a_nested_vllm_struct_is_given_as_a_mapping():
    params = params_of(SamplingSpec(repetition_detection={"max_pattern_size": 4, "min_count": 3}))
    assert type(params.repetition_detection).__name__ == "RepetitionDetectionParams"
    assert params.repetition_detection.max_pattern_size == 4


@pytest.mark.parametrize(("sampling", "message"), [
    ({"bad_wordz": ["x"]}, "unknown field 'bad_wordz'"),
    ({"bad_words": "cheap"}, "sampling.bad_words: Expected `array | null`, got `str`"),
    ({"logit_bias": {"x": 1}}, "sampling.logit_bias"),
    ({"output_kind": "final"}, "sampling.output_kind: set by batchgen, not by the job"),
    ({"structured_outputs": {"regex": "a"}}, "use sampling.json_schema, regex, choice or grammar"),
    ({"regex": "a+", "choice": ["a"]}, "regex and choice: set one structured output constraint"),
    ({"regex": "(unclosed"}, "regex '(unclosed' is not a valid regex"),
    ({"grammar": "root ::= "}, "grammar is not a valid EBNF grammar"),
    ({"use_beam_search": True, "n": 2, "bad_words": ["x"]}, "bad_words with use_beam_search"),
    ({"use_beam_search": True, "n": 2, "choice": ["x"]}, "choice with use_beam_search is not supported"),
])
def test_sampling_fields_vllm_would_refuse_are_job_errors(tmp_path, sampling, message):
    with pytest.raises(JobError) as err:
        job_from_dict(job_with(sampling=sampling), base_dir=tmp_path)
    assert message in str(err.value)


def test_an_unknown_name_gets_the_list_of_valid_ones(tmp_path):
    with pytest.raises(JobError) as err:
        job_from_dict(job_with(sampling={"skip_special_token": False}), base_dir=tmp_path)
    valid = str(err.value).split("valid names: ")[1].split(", ")
    assert {"skip_special_tokens", "bad_words", "temperature", "seed", "regex", "selection"} <= set(valid)
    assert not set(MANAGED_PARAMS) & set(valid)


@pytest.mark.parametrize(("constraint", "value", "vllm_name"), [
    ("json_schema", {"type": "object"}, "json"),
    ("regex", "(yes|no)", "regex"),
    ("choice", ["yes", "no"], "choice"),
    ("grammar", 'root ::= "yes" | "no"', "grammar"),
])
def test_structured_output_goes_to_vllm_under_its_name(constraint, value, vllm_name):
    params = params_of(SamplingSpec(**{constraint: value}))
    assert getattr(params.structured_outputs, vllm_name) == value


def test_a_seed_is_per_candidate_and_fresh_for_each_resampled_attempt():
    base = sampling_kwargs(SamplingSpec(seed=100, n=3, max_tokens=8))

    def seed(**request):
        return engine_budget(base, GenRequest(item_id="a", prompt="", prompt_token_ids=[1], max_tokens=8,
                                              **request)).get("seed")

    assert seed(n=3) == 100  # vLLM gives candidate i seed+i
    assert seed(candidate=2, attempt=2, strategy="grow") == 102  # a grown candidate samples its path again
    resampled = [seed(candidate=c, attempt=a, strategy="resample") for c in range(3) for a in (2, 3)]
    assert sorted(resampled) == [103, 104, 105, 106, 107, 108]  # none equals another or a first-pass seed
    assert "seed" not in sampling_kwargs(SamplingSpec())


@pytest.mark.parametrize(("changes", "problem"), [
    ({"sampling": {"seed": 1, "temperature": 0.7}}, "sampling.temperature is 0.7"),
    ({"sampling": {"seed": 1, "temperature": 0, "overrides": {"temperature": "t"}}}, "overrides.temperature"),
    ({"sampling": {"seed": 1, "temperature": 0}, "retry": {"on": ["keyword"], "temperature_step": 0.2}},
     "retry.temperature_step"),
    ({"sampling": {"seed": 1, "temperature": 0}}, None),  # greedy: the seed is harmless
    ({"sampling": {"temperature": 0.7}}, None),
])
def test_a_per_request_seed_is_refused_on_cpu_only_where_it_would_crash_the_engine(tmp_path, changes, problem):
    spec = job_from_dict(job_with(**changes), base_dir=tmp_path)

    found = cpu_problem(spec, cpu=True)

    assert (found is None) == (problem is None)
    if problem:
        assert found[0] == "sampling.seed" and problem in found[1] and "crashes vLLM's CPU engine" in found[1]
    assert cpu_problem(spec, cpu=False) is None  # GPUs take per-request seeds


def test_prompt_logprobs_with_lora_enabled_is_refused_on_cpu_only(tmp_path):
    spec = job_from_dict(job_with(sampling={"prompt_logprobs": 1}, engine={"enable_lora": True}), base_dir=tmp_path)
    field, why = cpu_problem(spec, cpu=True)
    assert field == "sampling.prompt_logprobs" and "engine.enable_lora" in why
    assert cpu_problem(spec, cpu=False) is None


@pytest.mark.parametrize(("constraint", "value", "texts", "passed"), [
    ("regex", "(yes|no)", ["yes", "no!", "maybe"], [True, False, False]),
    ("choice", ["red", "green"], ["red", "Red", "green "], [True, False, False]),
    ("grammar", 'root ::= "(" [0-9]+ ")"', ["(12)", "(12", "12"], [True, False, False]),
])
def test_structured_outputs_are_checked_by_an_expectation_of_their_own(constraint, value, texts, passed):
    from batchgen.job import ExpectationsSpec
    from expectations.validate import validate_rows

    rows = pd.DataFrame({"item_id": list("abc"), "candidate": 0, "attempt": 1, "text": texts,
                         "finish_reason": "stop"})

    verdicts = validate_rows(rows, ExpectationsSpec(require_stop=False), None, "unit-structured",
                             structured=(constraint, value)).verdicts

    assert verdicts["passed"].tolist() == passed
    assert verdicts["failed"].tolist() == [[] if ok else [constraint] for ok in passed]
