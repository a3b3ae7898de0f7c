"""Sampling features on the real engine, checked in the published data: n candidates and selection,
best_of, beam search, vLLM's sampling controls and logprobs, per-row overrides, structured output,
conversations.

Every job here uses the same engine section, so the whole module loads one engine (batchgen
caches it per process and engine spec); items are few and budgets small.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pandas as pd
import pytest

import batchgen.engine
from batchgen.job import job_from_dict
from tests.conftest import product_job

pytestmark = pytest.mark.engine

ENGINE = {"max_model_len": 1024}


@pytest.fixture(scope="module", autouse=True)
def stop_engines():
    yield
    batchgen.engine.shutdown_all()


def published(out: Path) -> Path:
    """The folder readers read: `<out>/current` when publications are switched by a symlink, else `<out>`."""
    return out / "current" if (out / "current").exists() else out


def read(out: Path, name: str) -> pd.DataFrame:
    """One published table, read from its folder: results (the accepted table), rejected or attempts."""
    return pd.read_parquet(published(out) / {"results": "accepted"}.get(name, name))


def run(job: dict) -> dict:
    from flows.batch_generation import batch_generation

    return batch_generation(job_from_dict(job))


def latest(attempts: pd.DataFrame) -> pd.DataFrame:
    ordered = attempts.sort_values(["item_id", "candidate", "attempt"])
    return ordered.groupby(["item_id", "candidate"]).tail(1)


def test_n_candidates_selection_and_best_of_on_the_same_candidates(tmp_path, prefect_server):
    loads = batchgen.engine.LOADS
    job = product_job(tmp_path, 6, engine=ENGINE,
                      sampling={"temperature": 1.0, "top_p": 1.0, "n": 3, "max_tokens": 12, "stop": ["."]},
                      retry={"max_passes": 1, "growth_factor": 2, "max_tokens_cap": 24})
    out = tmp_path / "out"
    first = run(job)
    names = dict(zip(pd.read_csv(tmp_path / "products.csv", dtype=str)["product_id"],
                     pd.read_csv(tmp_path / "products.csv", dtype=str)["name"]))
    attempts, results, rejected = read(out, "attempts"), read(out, "results"), read(out, "rejected")

    # Every candidate is generated, validated and kept: 3 per item on the first pass, each with a verdict, and
    # its cumulative_logprob (asked of the engine since n > 1 candidates are ranked by it).
    first_pass = attempts[attempts["attempt"] == 1]
    assert attempts["cumulative_logprob"].notna().all() and (attempts["cumulative_logprob"] <= 0).all()
    assert first_pass.groupby("item_id")["candidate"].apply(sorted).tolist() == [[0, 1, 2]] * 6
    assert attempts["passed"].notna().all()
    assert (attempts["passed"] == attempts["failed"].map(len).eq(0)).all()
    # Cut-off candidates are retried one by one, each with its own grown budget.
    retried = attempts[attempts["attempt"] == 2]
    assert len(retried) > 0 and set(retried["max_tokens"]) == {24}
    cut = first_pass[first_pass["finish_reason"] == "length"]
    assert set(zip(retried["item_id"], retried["candidate"])) == set(zip(cut["item_id"], cut["candidate"]))

    # first_passing: the published candidate passes, and every better-scored candidate of the item failed.
    final = latest(attempts)
    assert len(results) + len(rejected) == 6 == first["counts"]["items"]
    overtaken = 0
    for row in results.itertuples():
        pool = final[final["item_id"] == row.item_id]
        chosen = pool[pool["candidate"] == row.candidate].iloc[0]
        assert chosen["passed"] and chosen["text"] == row.text
        assert names[row.item_id].casefold() in row.text.casefold()
        better = pool[pool["cumulative_logprob"] > chosen["cumulative_logprob"]]
        assert not better["passed"].any()
        overtaken += len(better) > 0
        assert row.n_candidates == 3 and row.n_passing == pool["passed"].sum() and row.selection == "first_passing"
    assert overtaken > 0, "no item published a candidate that a better-scored failing one preceded"
    for row in rejected[rejected["stage"] == "validate"].itertuples():
        assert not final[final["item_id"] == row.item_id]["passed"].any()

    # max_logprob over the same candidates (same request keys: reused, nothing generated).
    job["sampling"]["selection"] = "max_logprob"
    second = run(job)
    assert second["tokens"]["generated_this_run"] == 0
    results, rejected = read(out, "results"), read(out, "rejected")
    for item_id, pool in latest(read(out, "attempts")).groupby("item_id"):
        top = pool.sort_values(["cumulative_logprob", "candidate"], ascending=[False, True]).iloc[0]
        if top["passed"]:
            published_row = results[results["item_id"] == item_id].iloc[0]
            assert published_row["candidate"] == top["candidate"] and published_row["selection"] == "max_logprob"
        else:
            rejected_row = rejected[rejected["item_id"] == item_id].iloc[0]
            assert rejected_row["candidate"] == top["candidate"]
            assert "highest cumulative_logprob" in rejected_row["detail"]

    # best_of: read as n=3 plus max_logprob; the same candidates again.
    job["sampling"] = {**job["sampling"], "n": 1, "best_of": 3}
    del job["sampling"]["selection"]
    third = run(job)
    assert third["tokens"]["generated_this_run"] == 0
    assert set(read(out, "results")["selection"]) <= {"max_logprob"}
    assert third["sampling"]["n"] == 3 and third["sampling"]["selection"] == "max_logprob"
    pd.testing.assert_frame_equal(read(out, "results").drop(columns=["request_id"]),
                                  results.drop(columns=["request_id"]))
    assert batchgen.engine.LOADS - loads <= 1


def test_beam_search_returns_beam_width_ranked_candidates(tmp_path, prefect_server):
    job = product_job(tmp_path, 3, engine=ENGINE,
                      sampling={"use_beam_search": True, "beam_width": 3, "length_penalty": 1.0,
                                "max_tokens": 8, "temperature": 0.0, "stop": []},
                      expectations={"min_chars": 1, "keyword_column": None, "require_stop": False},
                      retry={"max_passes": 0})
    job["sampling"].pop("top_p")
    run(job)
    out = tmp_path / "out"
    attempts, results = read(out, "attempts"), read(out, "results")

    from transformers import AutoTokenizer

    from batchgen.models import default_model_path

    eos = AutoTokenizer.from_pretrained(str(default_model_path())).eos_token_id
    assert attempts.groupby("item_id")["candidate"].apply(sorted).tolist() == [[0, 1, 2]] * 3
    for _, beams in attempts.groupby("item_id"):
        beams = beams.sort_values("candidate")
        assert beams["text"].str.len().gt(0).all() and beams["n_output_tokens"].le(8).all()
        assert beams["text"].nunique() == 3  # distinct beams
        # vLLM's beam score: cumulative_logprob / (prompt + output tokens, EOS not counted) ** length_penalty
        lengths = [p + n - (1 if len(ids) and ids[-1] == eos else 0)
                   for p, n, ids in zip(beams["n_prompt_tokens"], beams["n_output_tokens"], beams["token_ids"])]
        scores = [lp / length for lp, length in zip(beams["cumulative_logprob"], lengths)]
        assert scores == sorted(scores, reverse=True)
        assert set(beams["finish_reason"]) <= {"stop", "length"}
        assert all((r == "length") == (n == 8 and ids[-1] != eos)
                   for r, n, ids in zip(beams["finish_reason"], beams["n_output_tokens"], beams["token_ids"]))
    # first_passing under beam search publishes the best beam that passes: here the best beam.
    assert sorted(results["item_id"]) == sorted(attempts["item_id"].unique())
    assert (results["candidate"] == 0).all() and (results["n_candidates"] == 3).all()


def test_sampling_controls_logprobs_and_per_row_overrides(tmp_path, prefect_server):
    job = product_job(tmp_path, 5, engine=ENGINE,
                      sampling={"temperature": 0.8, "top_p": 0.95, "top_k": 20, "max_tokens": 16, "min_tokens": 2,
                                "stop": ["."], "presence_penalty": 0.2, "frequency_penalty": 0.2,
                                "repetition_penalty": 1.1, "logprobs": 2,
                                "overrides": {"max_tokens": "budget", "temperature": "temp"}},
                      expectations={"min_chars": 1, "keyword_column": None},
                      retry={"max_passes": 1, "growth_factor": 2, "max_tokens_cap": 64})
    products = pd.read_csv(tmp_path / "products.csv", dtype=str)
    budgets = ["3", "5", "", "abc", "8"]
    temps = ["0", "", "0.5", "0.5", "-1"]
    products["budget"], products["temp"] = budgets, temps
    products.to_csv(tmp_path / "products.csv", index=False)
    run(job)
    out = tmp_path / "out"
    attempts, results, rejected = read(out, "attempts"), read(out, "results"), read(out, "rejected")
    ids = list(products["product_id"])

    # Bad per-row values reject that row, naming the field and the column.
    by_id = rejected.set_index("item_id")
    assert list(by_id.loc[ids[3], "reasons"]) == ["invalid_override"]
    assert "sampling.overrides.max_tokens (column budget): 'abc' is not a whole number" in by_id.loc[ids[3], "detail"]
    assert "sampling.overrides.temperature (column temp): '-1' is not a number >= 0" in by_id.loc[ids[4], "detail"]
    assert set(attempts["item_id"]) == set(ids[:3])

    # Each row's own budget is honoured on the first pass and grows from there on a retry.
    first = attempts[attempts["attempt"] == 1].set_index("item_id")
    for item_id, budget in zip(ids[:3], (3, 5, 16)):
        assert first.loc[item_id, "max_tokens"] == budget
        assert 2 <= first.loc[item_id, "n_output_tokens"] <= budget  # min_tokens 2
    for row in attempts[attempts["attempt"] == 2].itertuples():
        assert row.max_tokens == 2 * first.loc[row.item_id, "max_tokens"]
        assert row.n_output_tokens <= row.max_tokens
    assert len(attempts[attempts["attempt"] == 2]) > 0  # the 3-token row is certainly cut off
    # The row's temperature is recorded (null: the job's) and kept on its retry.
    temps_seen = attempts.groupby("item_id")["temperature"].agg(lambda s: set(s.dropna()))
    assert temps_seen[ids[0]] == {0.0} and temps_seen[ids[1]] == set() and temps_seen[ids[2]] == {0.5}

    # Stop strings end generation and are not kept; logprobs hold the top 2 (plus the sampled token) per token.
    for row in attempts.itertuples():
        assert "." not in row.text
        if row.finish_reason == "stop" and row.stop_reason is not None:
            assert row.stop_reason == "."
        assert len(row.logprobs) == row.n_output_tokens
        for token_id, position in zip(row.token_ids, row.logprobs):
            assert 2 <= len(position) <= 3
            assert token_id in [entry["token_id"] for entry in position]
            assert all(entry["logprob"] <= 0 for entry in position)
    assert results["logprobs"].map(len).eq(results["n_output_tokens"]).all()


def test_structured_output_is_json_matching_the_schema_with_fields_as_columns(tmp_path, prefect_server):
    schema = {"type": "object",
              "properties": {"title": {"type": "string", "maxLength": 40},
                             "price": {"type": "integer", "minimum": 1, "maximum": 999},
                             "in_stock": {"type": "boolean"}},
              "required": ["title", "price", "in_stock"], "additionalProperties": False}
    job = product_job(tmp_path, 3, engine=ENGINE,
                      prompt={"template": "Give {{ name }} a title, a price in dollars and whether it is in stock, "
                                          "as JSON."},
                      sampling={"temperature": 0.7, "max_tokens": 64, "stop": [], "json_schema": schema},
                      expectations={"min_chars": 2, "keyword_column": None},
                      retry={"max_passes": 1, "growth_factor": 2, "max_tokens_cap": 128})
    manifest = run(job)
    out = tmp_path / "out"
    results, attempts = read(out, "results"), read(out, "attempts")

    assert manifest["counts"]["accepted"] >= 2
    for row in results.itertuples():
        value = json.loads(row.text)
        jsonschema.validate(value, schema)
        assert (row.title, row.price, row.in_stock) == (value["title"], value["price"], value["in_stock"])
    assert results["price"].dtype.kind == "i" and results["in_stock"].dtype == bool
    # Every attempt either is valid JSON under the schema or failed the json_schema expectation.
    for row in attempts.itertuples():
        try:
            jsonschema.validate(json.loads(row.text), schema)
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        assert valid == ("json_schema" not in list(row.failed))
    validation = json.loads((published(out) / "validation.json").read_text())
    assert "expect_output_to_match_json_schema" in json.dumps(validation)


def test_a_conversation_column_is_answered(tmp_path, prefect_server):
    chats = [
        {"id": "c1", "chat": [{"role": "user", "content": "What colour is the sky on a clear day?"},
                              {"role": "assistant", "content": "Blue."},
                              {"role": "user", "content": "And what colour is grass?"}]},
        {"id": "c2", "chat": [{"role": "system", "content": "You answer with one word."},
                              {"role": "user", "content": "Name a big animal."}]},
        {"id": "c3", "chat": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]},
    ]
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats), encoding="utf-8")
    job = {
        "name": "chats",
        "input": {"path": str(tmp_path / "chats.jsonl"), "id_column": "id"},
        "prompt": {"messages_column": "chat"},
        "engine": ENGINE,
        "sampling": {"temperature": 0.0, "max_tokens": 24},
        "expectations": {"min_chars": 1, "require_stop": False},
        "retry": {"max_passes": 0},
        "output": {"dir": str(tmp_path / "out")},
    }
    run(job)
    out = tmp_path / "out"
    results, rejected = read(out, "results"), read(out, "rejected")

    assert sorted(results["item_id"]) == ["c1", "c2"]
    c1 = results.set_index("item_id").loc["c1"]
    # every turn went through the chat template, and the answer is the assistant's next turn
    for turn in ("What colour is the sky on a clear day?", "Blue.", "And what colour is grass?"):
        assert turn in c1["prompt"]
    assert c1["prompt"].endswith("<|im_start|>assistant\n")
    assert results["text"].str.strip().str.len().gt(0).all()
    assert "green" in c1["text"].casefold()  # greedy: the small model does know this one
    row = rejected.set_index("item_id").loc["c3"]
    assert list(row["reasons"]) == ["invalid_messages"] and "last message is from the assistant" in row["detail"]
