"""Generation controls on the real engine, checked in the published data: vLLM's other SamplingParams fields
under their own names, selection all, a job's chat template, Great Expectations' own expectations, structured
output as choice, and resampling of outputs that fail an expectation (retry.on). (LoRA: test_lora_engine.py.)

Two flow runs share one engine (the same engine section): outputs are forced where a check needs them exact
(a logit bias of +100 on one token), few items, budgets of a few tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import batchgen.engine
from batchgen.job import job_from_dict
from batchgen.retry import rescued_by_reason
from tests.conftest import product_job

pytestmark = pytest.mark.engine

ENGINE = {"max_model_len": 1024}
BANANA = 21285  # " banana", one token of the default model (checked below with its tokenizer)
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant{{ mark }}>{% endif %}")
CHOICES = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]


def read(out: Path, name: str) -> pd.DataFrame:
    """A published table by its old name (results is the accepted table), from its folder."""
    return pd.read_parquet(out / "current" / {"results": "accepted"}.get(name, name))


def run(job: dict) -> dict:
    from flows.batch_generation import batch_generation

    return batch_generation(job_from_dict(job))


def newest_run_tagged(tag: str):
    """The newest flow run on the Prefect server with `tag`."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])),
                                     sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
    assert runs, f"no flow run tagged {tag}"
    return runs[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_server):
    """The two flow runs of the module (one engine), with their output folders and manifests."""
    root = tmp_path_factory.mktemp("controls")
    forced = product_job(
        root / "forced", 3, engine=ENGINE,
        prompt={"chat_template": CHAT_TEMPLATE, "chat_template_kwargs": {"mark": "!"}},
        sampling={"temperature": 0.8, "max_tokens": 4, "n": 2, "selection": "all", "stop": [" banana banana"],
                  "include_stop_str_in_output": True, "logit_bias": {BANANA: 100}, "prompt_logprobs": 1,
                  "skip_special_tokens": True},
        expectations={"min_chars": 5, "keyword_column": None,
                      "gx": [{"type": "expect_column_values_to_match_regex", "id": "says_banana",
                              "kwargs": {"column": "text", "regex": "banana"}},
                             {"type": "expect_column_values_to_be_between", "kwargs": {
                                 "column": "n_output_tokens", "min_value": 1, "max_value": 4}}]},
    )
    chosen = product_job(
        root / "chosen", 6, engine=ENGINE,
        prompt={"template": "Answer with one Greek letter name for {{ name }}."},
        sampling={"temperature": 1.5, "top_p": 1.0, "max_tokens": 6, "choice": CHOICES, "stop": []},
        expectations={"min_chars": None, "keyword_column": None,
                      "gx": [{"type": "expect_column_values_to_be_in_set", "id": "beta_or_gamma",
                              "kwargs": {"column": "text", "value_set": ["beta", "gamma"]}}]},
        retry={"max_passes": 3, "on": ["truncated", "beta_or_gamma"], "temperature_step": 0.25, "max_temperature": 2.0},
    )
    manifests = {"forced": run(forced), "chosen": run(chosen)}
    yield {name: (root / name / "out", manifests[name]) for name in manifests}
    batchgen.engine.shutdown_all()


def test_the_forced_token_is_one_token_of_the_default_model():
    from transformers import AutoTokenizer

    from batchgen.models import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    assert tokenizer.encode(" banana", add_special_tokens=False) == [BANANA]


def test_sampling_params_fields_under_their_own_names_took_effect(runs):
    out, manifest = runs["forced"]
    attempts = read(out, "attempts")

    # logit_bias forced every token to " banana"; include_stop_str_in_output kept the stop string in the text.
    assert set(attempts["text"]) == {" banana banana"}
    assert set(attempts["finish_reason"]) == {"stop"} and set(attempts["stop_reason"]) == {" banana banana"}
    assert attempts["token_ids"].map(list).tolist() == [[BANANA, BANANA]] * len(attempts)
    # prompt_logprobs: one entry per prompt token (the first has none), each holding the prompt's own token.
    for ids, logprobs in zip(attempts["prompt_token_ids"], attempts["prompt_logprobs"]):
        assert len(logprobs) == len(ids) and len(logprobs[0]) == 0
        assert all(int(token_id) in {int(e["token_id"]) for e in entries}
                   for token_id, entries in zip(list(ids)[1:], list(logprobs)[1:]))
    assert manifest["sampling"]["logit_bias"] == {str(BANANA): 100}
    assert manifest["sampling"]["include_stop_str_in_output"] is True


def test_the_jobs_chat_template_and_its_variables_render_the_prompts(runs):
    out, _ = runs["forced"]
    prompts = read(out, "attempts")["prompt"]
    assert prompts.str.startswith("<system>You are a copywriter for an online shop.\n<user>Write a short").all()
    assert prompts.str.endswith("<assistant!>").all()
    assert not prompts.str.contains("<|im_start|>", regex=False).any()


def test_selection_all_publishes_every_completion_and_each_item_once(runs):
    out, manifest = runs["forced"]
    results, rejected = read(out, "results"), read(out, "rejected")

    assert rejected.empty and manifest["counts"]["accepted"] == manifest["counts"]["items"] == 3
    assert sorted(results.groupby("item_id")["candidate"].apply(sorted).tolist()) == [[0, 1]] * 3
    assert set(results["selection"]) == {"all"} and set(results["n_passing"]) == {2}
    on_disk = json.loads((out / "current" / "manifest.json").read_text())
    assert on_disk["files"]["accepted/accepted.parquet"]["rows"] == 6


def test_gx_expectations_of_the_job_ran_on_every_output(runs):
    out, _ = runs["forced"]
    validation = json.loads((out / "current" / "validation.json").read_text())
    first = validation[0] if isinstance(validation, list) else validation
    ran = {r["expectation_config"]["meta"].get("batchgen_id"): r for r in first["results"]}
    assert {"says_banana", "expect_column_values_to_be_between"} <= set(ran)
    assert ran["says_banana"]["result"]["element_count"] == 6 and ran["says_banana"]["success"]


def test_choice_constrains_every_output_and_is_checked(runs):
    out, _ = runs["chosen"]
    attempts = read(out, "attempts")
    assert set(attempts["text"]) <= set(CHOICES)
    assert not any("choice" in failed for failed in attempts["failed"])


def test_outputs_failing_an_expectation_in_retry_on_are_resampled_and_the_manifest_counts_the_rescued(runs):
    out, manifest = runs["chosen"]
    attempts, results, rejected = read(out, "attempts"), read(out, "results"), read(out, "rejected")
    assert len(results) + len(rejected) == 6

    first = attempts[attempts["attempt"] == 1]
    assert (~first["passed"]).any()  # at temperature 1.5 over six choices some first answers are neither
    for item_id, tries in attempts.sort_values("attempt").groupby("item_id"):
        tries = tries.reset_index(drop=True)
        assert tries["attempt"].tolist() == list(range(1, len(tries) + 1))
        # another attempt exactly when the last one failed beta_or_gamma, up to max_passes
        assert all(not passed for passed in tries["passed"].iloc[:-1]), item_id
        assert tries["passed"].iloc[-1] or len(tries) == 4, item_id
        assert (tries["strategy"].iloc[1:] == "resample").all()
        assert (tries["max_tokens"] == 6).all()  # a resample keeps the budget
        # the temperature moves by temperature_step, capped at max_temperature (null: the job's 1.5)
        assert tries["temperature"].tolist()[1:] == [1.75, 2.0, 2.0][:len(tries) - 1]
    assert results["text"].isin(["beta", "gamma"]).all()
    assert all(list(reasons) == ["beta_or_gamma"] for reasons in rejected["reasons"])
    resampled_winners = results[results["attempt"] > 1]
    assert (resampled_winners["strategy"] == "resample").all()
    assert manifest["counts"]["rescued"] == len(resampled_winners)
    assert manifest["counts"]["rescued_by_reason"] == rescued_by_reason(results, attempts)
    assert manifest["counts"]["rescued_by_reason"].get("beta_or_gamma", 0) == len(resampled_winners)
    page = (out / "current" / "report.html").read_text(encoding="utf-8")
    if len(resampled_winners):
        assert f'data-rescued="beta_or_gamma">{len(resampled_winners)}<' in page


def test_an_expectation_gx_cannot_evaluate_mid_run_stops_it_and_the_rerun_reuses_its_outputs(runs, tmp_path,
                                                                                               monkeypatch):
    """The safety net behind the check before the engine (stood aside here): an expectation GX cannot evaluate on
    the real outputs stops the run with a job error naming it and publishes nothing, instead of passing every
    output, and at once: the flow run's own retry (FLOW_RETRIES) would meet the same mistake; once it is mended, the
    rerun reuses every generation the stopped run committed."""
    import tasks.check
    from batchgen.job import JOB_MISTAKE_TAG
    from expectations.validate import ExpectationError
    from flows.batch_generation import FLOW_RETRIES

    bad = {"type": "expect_column_values_to_be_between", "kwargs": {"column": "text", "min_value": 5}}
    job = product_job(tmp_path, 3, engine=ENGINE, sampling={"max_tokens": 6}, retry={"max_passes": 0},
                      expectations={"min_chars": None, "keyword_column": None, "require_stop": False, "gx": [bad]})
    checked: list[str] = []  # one per attempt of the flow run: its checks run first
    monkeypatch.setattr(tasks.check, "check_expectations", lambda spec: checked.append(spec.name))
    with pytest.raises(ExpectationError, match=r"^expectations\.gx\.0: Great Expectations could not evaluate "
                                               r"expect_column_values_to_be_between on the outputs: \S"):
        run(job)
    assert FLOW_RETRIES >= 1 and len(checked) == 1  # not retried
    assert not (tmp_path / "out" / "current").exists()
    stopped = newest_run_tagged(JOB_MISTAKE_TAG)  # tagged, so that a sharded run does not start it again either
    assert stopped.state.is_failed() and stopped.run_count == 1 and stopped.empirical_policy.retries == 0

    monkeypatch.undo()
    job["expectations"]["gx"] = [{**bad, "kwargs": {"column": "n_output_tokens", "min_value": 1}}]
    manifest = run(job)
    assert manifest["counts"]["items"] == 3 and manifest["counts"]["accepted"] == 3
    assert manifest["tokens"]["generated_this_run"] == 0
    assert manifest["counts"]["reused"] == manifest["counts"]["attempts"] == 3
