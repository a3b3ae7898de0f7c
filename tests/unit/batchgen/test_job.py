"""The job file: load_job, its error messages, overrides and the fingerprint."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchgen.job import JobError, JobSpec, job_from_dict, load_job, parse_overrides
from tests.jobs import BASE, job_with


def write_job(folder: Path, data: Any, name: str = "job.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def test_valid_job_loads_with_its_values(tmp_path):
    job = load_job(write_job(tmp_path / "jobs", BASE))

    assert isinstance(job, JobSpec)
    assert job.name == "products"
    assert job.input.id_column == "product_id"
    assert job.prompt.style == "chat"
    assert job.prompt.system == "You write copy."
    assert job.engine.seed == 7 and job.engine.max_model_len == 2048
    assert job.sampling.max_tokens == 80 and job.sampling.n == 2 and job.sampling.temperature == 0.7
    assert job.sampling.stop == ["\n\n"]  # one stop string becomes a list
    assert job.expectations.must_not_match == ["https?://"]
    assert job.retry.strategy == "continue" and job.retry.max_tokens_cap == 320
    assert job.output.jsonl is True
    # defaults of the sections the file does not set
    assert job.expectations.require_stop is True
    assert job.chunk_size == 512


def test_relative_paths_resolve_against_the_job_file_folder(tmp_path, monkeypatch):
    job_dir = tmp_path / "project" / "jobs"
    path = write_job(job_dir, BASE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter

    job = load_job(path)

    assert Path(job.input.path) == (job_dir / "data" / "products.csv").resolve()
    assert Path(job.output.dir) == (tmp_path / "project" / "out" / "products").resolve()


def test_absolute_paths_are_kept(tmp_path):
    data = job_with(input={"path": str(tmp_path / "in.jsonl")}, output={"dir": str(tmp_path / "out")})
    job = load_job(write_job(tmp_path / "jobs", data))
    assert job.input.path == str(tmp_path / "in.jsonl")
    assert job.output.dir == str(tmp_path / "out")


BAD_JOBS = [
    pytest.param(job_with(sampling={"max_tokn": 64}), ["sampling.max_tokn", "unknown field"], id="unknown-field"),
    pytest.param(job_with(prompt={"template": None}), ["prompt.template is missing", "messages_column"],
                 id="missing-template"),
    pytest.param(job_with(prompt={"messages_column": "chat"}), ["prompt", "either template or messages_column"],
                 id="template-and-messages"),
    pytest.param(job_with(sampling={"best_of": 3, "n": 2}), ["sampling", "best_of (3) with n (2)"],
                 id="best-of-and-n"),
    pytest.param(job_with(sampling={"selection": "longest"}), ["sampling.selection", "first_passing"],
                 id="unknown-selection"),
    pytest.param(job_with(sampling={"beam_width": 3}), ["sampling", "beam_width needs use_beam_search"],
                 id="beam-width-without-beam-search"),
    pytest.param(job_with(sampling={"json_schema": {"type": "objekt"}}), ["sampling", "not a valid JSON schema"],
                 id="bad-json-schema"),
    pytest.param(job_with(sampling={"json_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}),
                 ["sampling.json_schema", "property 'text'", "rename"], id="json-field-shadows-column"),
    # the example base job continues cut-off outputs; vLLM would start a constraint over after the cut
    pytest.param(job_with(sampling={"json_schema": {"type": "object", "properties": {"title": {"type": "string"}}}}),
                 ["retry.strategy: continue cannot extend an output constrained by sampling.json_schema",
                  "retry.strategy: grow"], id="continue-structured"),
    pytest.param(job_with(sampling={"regex": "[A-Z][a-z ]+"}, retry={"strategy": "continue_then_grow"}),
                 ["retry.strategy: continue_then_grow cannot extend", "sampling.regex"],
                 id="continue-then-grow-regex"),
    # max_tokens raised past the cap (1024 unless set): cut-off outputs would be rejected, never retried
    pytest.param(job_with(sampling={"max_tokens": 2048}, retry={"max_tokens_cap": None}),
                 ["retry.max_tokens_cap: 1024 is not above sampling.max_tokens 2048", "e.g. 8192",
                  "retry.max_passes: 0"], id="budget-cannot-grow"),
    # retry.ahead where it would start nothing (the base job continues cut-off outputs)
    pytest.param(job_with(retry={"ahead": True}),
                 ["retry.ahead: under retry.strategy: continue there is nothing to start ahead", "continue_then_grow"],
                 id="ahead-continue"),
    pytest.param(job_with(retry={"ahead": True, "strategy": "grow", "in_stream": False}),
                 ["retry.ahead: it starts retries in the generate task's stream", "retry.in_stream: true"],
                 id="ahead-in-passes"),
    pytest.param(job_with(sampling={"use_beam_search": True, "beam_width": 2},
                          retry={"ahead": True, "strategy": "grow"}),
                 ["retry.ahead: with sampling.use_beam_search cut-off outputs are retried in passes"],
                 id="ahead-beam-search"),
    pytest.param(job_with(sampling={"overrides": {"top_p": "p"}}), ["sampling.overrides", "max_tokens"],
                 id="override-not-allowed"),
    pytest.param(job_with(sampling={"max_tokens": 0}), ["sampling.max_tokens", "greater than or equal to 1"],
                 id="max-tokens-0"),
    pytest.param(job_with(expectations={"min_chars": 50, "max_chars": 10}),
                 ["expectations", "min_chars (50)", "max_chars (10)"], id="min-above-max"),
    pytest.param(job_with(expectations={"must_match": ["(unclosed"]}),
                 ["expectations.must_match", "'(unclosed' is not a valid regex"], id="bad-regex"),
    pytest.param(job_with(sampling={"bad_words": "cheap"}), ["sampling.bad_words: Expected `array | null`, got `str`"],
                 id="vllm-type"),
    pytest.param(job_with(prompt={"style": "completion"}), ["prompt", "system message needs style 'chat'"],
                 id="system-with-completion"),
    # YAML's true where a number belongs: pydantic alone reads it as 1 (`limit: true` would read one row)
    pytest.param(job_with(input={"limit": True}), ["input.limit", "a number is expected, not true"],
                 id="limit-true"),
    pytest.param(job_with(sampling={"temperature": False}), ["sampling.temperature", "a number is expected, not false"],
                 id="temperature-false"),
    pytest.param(job_with(retry={"max_tokens_cap": True}), ["retry.max_tokens_cap", "a number is expected"],
                 id="cap-true"),
]


@pytest.mark.parametrize(("data", "expected"), BAD_JOBS)
def test_bad_job_raises_job_error_naming_the_field(tmp_path, data, expected):
    path = write_job(tmp_path, data)
    with pytest.raises(JobError) as info:
        load_job(path)
    message = str(info.value)
    assert message.startswith(f"{path}: the job is not valid")
    for fragment in expected:
        assert fragment in message


def test_true_and_false_still_set_the_fields_that_take_them(tmp_path):
    job = load_job(write_job(tmp_path, job_with(sampling={"ignore_eos": True}, output={"jsonl": False},
                                                engine={"enforce_eager": True})))
    assert job.sampling.ignore_eos is True and job.output.jsonl is False and job.engine.enforce_eager is True


def test_min_tokens_above_max_tokens_is_rejected_before_the_engine_starts(tmp_path):
    # vLLM's SamplingParams refuses min_tokens > max_tokens; the job must say so up front,
    # not after the engine has loaded.
    path = write_job(tmp_path, job_with(sampling={"max_tokens": 16, "min_tokens": 32}))
    with pytest.raises(JobError, match=r"sampling.*min_tokens"):
        load_job(path)


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("input: [data.csv\n  prompt: {template: x}\n", encoding="utf-8")
    with pytest.raises(JobError, match=r"job\.yaml: not valid YAML"):
        load_job(path)


def test_missing_job_file(tmp_path):
    with pytest.raises(JobError, match=r"nope\.yaml: no such job file"):
        load_job(tmp_path / "nope.yaml")


def test_directory_is_not_a_job_file(tmp_path):
    with pytest.raises(JobError, match=r": is not a file"):
        load_job(tmp_path)


def test_job_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("- input\n- prompt\n", encoding="utf-8")
    with pytest.raises(JobError, match="must be a mapping"):
        load_job(path)


def test_overrides_apply_on_top_of_the_file(tmp_path):
    path = write_job(tmp_path, BASE)
    job = load_job(path, overrides=parse_overrides(["sampling.max_tokens=64", "input.limit=5"]))
    assert job.sampling.max_tokens == 64
    assert job.input.limit == 5
    assert job.sampling.temperature == 0.7  # the rest of the section stays


@pytest.mark.parametrize(("pairs", "expected"), [
    (["sampling.max_tokens=64"], {"sampling": {"max_tokens": 64}}),
    (["sampling.temperature=0.5", "sampling.n=2"], {"sampling": {"temperature": 0.5, "n": 2}}),
    (["output.jsonl=true", "name=my job"], {"output": {"jsonl": True}, "name": "my job"}),
    (["sampling.stop=[END, '###']"], {"sampling": {"stop": ["END", "###"]}}),
    (["input.limit="], {"input": {"limit": None}}),
])
def test_parse_overrides(pairs, expected):
    assert parse_overrides(pairs) == expected


@pytest.mark.parametrize("pair", ["foo", "=3", " =x"])
def test_parse_overrides_rejects_a_bad_pair(pair):
    with pytest.raises(JobError, match=r"expected key=value"):
        parse_overrides([pair])


def test_parse_overrides_rejects_a_key_set_as_value_and_section():
    with pytest.raises(JobError, match="set twice"):
        parse_overrides(["sampling=1", "sampling.n=2"])


def _fingerprint(tmp_path: Path, data: dict[str, Any]) -> str:
    return load_job(write_job(tmp_path, data)).fingerprint()


def test_fingerprint_is_stable(tmp_path):
    assert _fingerprint(tmp_path, BASE) == _fingerprint(tmp_path, copy.deepcopy(BASE))


@pytest.mark.parametrize("changes", [
    {"sampling": {"temperature": 0.2}},
    {"sampling": {"max_tokens": 81}},
    {"prompt": {"template": "Describe {{ name }}."}},
    {"engine": {"seed": 8}},
    {"expectations": {"min_chars": 11}},
])
def test_fingerprint_changes_with_what_shapes_the_outputs(tmp_path, changes):
    assert _fingerprint(tmp_path, job_with(**changes)) != _fingerprint(tmp_path, BASE)


@pytest.mark.parametrize("data", [
    job_with(output={"dir": "/somewhere/else"}),
    job_with(output={"jsonl": False}),
    {**copy.deepcopy(BASE), "name": "renamed"},
], ids=["output-dir", "output-jsonl", "name"])
def test_fingerprint_ignores_where_outputs_go(tmp_path, data):
    assert _fingerprint(tmp_path, data) == _fingerprint(tmp_path, BASE)


@pytest.mark.parametrize(("sampling", "n", "selection"), [
    ({"best_of": 4, "n": 1}, 4, "max_logprob"),
    ({"best_of": 4, "n": 4}, 4, "max_logprob"),
    ({"best_of": 3, "n": 1, "selection": "first_passing"}, 3, "first_passing"),
])
def test_best_of_is_read_as_n_candidates_and_a_selection(tmp_path, sampling, n, selection):
    job = load_job(write_job(tmp_path, job_with(sampling=sampling)))
    assert (job.sampling.n, job.sampling.selection, job.sampling.candidates) == (n, selection, n)
    assert any("best_of" in note and "vLLM V1 has no best_of" in note for note in job.sampling.notes())
    # a dumped job validates to the same job (the Prefect UI and --set overrides re-validate it)
    assert job_from_dict(job.model_dump(mode="json")).sampling == job.sampling


def test_beam_search_candidates_are_the_beam_width(tmp_path):
    job = load_job(write_job(tmp_path, job_with(sampling={"use_beam_search": True, "beam_width": 3, "n": 1})))
    assert job.sampling.candidates == 3 and job.sampling.n == 1
    assert any("beam search" in note for note in job.sampling.notes())
    with pytest.raises(JobError, match="beam_width .3. and n .2. disagree"):
        load_job(write_job(tmp_path, job_with(sampling={"use_beam_search": True, "beam_width": 3, "n": 2})))


@pytest.mark.parametrize("pair, problem", [
    ('sampling.stop=["\\n\\n"', "expected ',' or ']', but got '<stream end>'"),
    ("engine.extra_args={block_size: 16", "expected ',' or '}', but got '<stream end>'"),
    ('prompt.system="unterminated', "found unexpected end of stream"),
])
def test_parse_overrides_names_a_value_that_is_not_yaml(pair, problem):
    with pytest.raises(JobError) as caught:
        parse_overrides(["sampling.max_tokens=8", pair])
    assert str(caught.value).startswith(f"override {pair!r}: the value is not valid YAML ({problem})")


@pytest.mark.parametrize("changes", [{"retry": {"max_passes": 0}}, {"retry": {"on": ["keyword"]}},
                                     {"sampling": {"max_tokens": 319}},
                                     {"sampling": {"overrides": {"max_tokens": "budget"}}}],
                         ids=["no-retries", "resampled-only", "below", "budgets-per-row"])
def test_a_first_budget_at_the_cap_is_valid_where_cut_off_outputs_are_not_grown(tmp_path, changes):
    data = job_with(sampling={"max_tokens": 320}, retry={"max_tokens_cap": 320})
    for section, values in changes.items():
        data[section].update(values)
    assert job_from_dict(data, base_dir=tmp_path).retry.max_tokens_cap == 320


@pytest.mark.parametrize("strategy", ["grow", "continue_then_grow"])
def test_retries_started_ahead_load_where_there_is_a_draw_afresh_to_start(tmp_path, strategy):
    job = job_from_dict(job_with(retry={"ahead": True, "strategy": strategy}), base_dir=tmp_path)
    assert job.retry.ahead and job.retry.strategy == strategy


@pytest.mark.parametrize("retry", [{"strategy": "grow"}, {"max_passes": 0}, {"on": ["json_schema"]}],
                         ids=["grow", "no-retries", "resampled-only"])
def test_a_structured_output_is_retried_by_a_fresh_draw_or_not_continued(tmp_path, retry):
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    job = job_from_dict(job_with(sampling={"json_schema": schema}, retry=retry), base_dir=tmp_path)
    assert job.sampling.json_schema == schema


def test_retry_on_defaults_to_cut_off_outputs_and_names_the_jobs_expectations(tmp_path):
    assert JobSpec.model_validate({**BASE, "output": {"dir": str(tmp_path)}}).retry.on == ["truncated"]
    job = job_from_dict(job_with(retry={"on": ["truncated", "keyword", "regex", "length"],
                                        "temperature_step": 0.2}), base_dir=tmp_path)
    assert job.retry.on == ["truncated", "keyword", "regex", "length"] and job.retry.temperature_step == 0.2


@pytest.mark.parametrize(("changes", "message"), [
    ({"retry": {"on": ["keywords"]}}, "retry.on: 'keywords' is not an expectation of this job; it has keyword, "
                                      "length, must_not_match, truncated"),
    ({"retry": {"on": ["json_schema"]}}, "'json_schema' is not an expectation of this job"),
    ({"retry": {"on": ["must_match"]}}, "'must_match' is not an expectation of this job"),  # no must_match regex
    ({"retry": {"on": []}}, "retry.on: List should have at least 1 item"),
    ({"retry": {"on": ["keyword"]}, "sampling": {"temperature": 0}}, "resamples at temperature 0"),
    ({"retry": {"on": ["keyword"]}, "sampling": {"use_beam_search": True, "n": 2}}, "beam search is deterministic"),
])
def test_retry_on_that_cannot_work_is_a_job_error(tmp_path, changes, message):
    with pytest.raises(JobError) as err:
        job_from_dict(job_with(**changes), base_dir=tmp_path)
    assert message in str(err.value)


def test_resampling_greedy_outputs_works_with_a_temperature_step(tmp_path):
    job = job_from_dict(job_with(retry={"on": ["keyword"], "temperature_step": 0.3}, sampling={"temperature": 0}),
                        base_dir=tmp_path)
    assert job.retry.temperature_step == 0.3


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


def test_retry_on_may_name_a_gx_expectation(tmp_path):
    job = job_from_dict(job_with(expectations={"gx": [{"type": "expect_column_values_to_match_regex", "id": "caps",
                                                       "kwargs": {"column": "text", "regex": "^[A-Z]"}}]},
                                 retry={"on": ["truncated", "caps"]}), base_dir=tmp_path)
    assert job.retry.on == ["truncated", "caps"]
