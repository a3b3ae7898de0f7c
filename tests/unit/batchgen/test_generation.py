"""Generation helpers: vLLM's sampling parameters from the job, flattening engine outputs (logprobs, beam
search), request keys, and run_requests with a stand-in engine."""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any, Callable

import pandas as pd
import pytest

from batchgen.generation import (
    GenRequest,
    beam_rows,
    engine_budget,
    first_pass_requests,
    output_rows,
    request_key,
    request_keys,
    run_requests,
    sampling_kwargs,
    sampling_params,
    top_logprobs,
)
from batchgen.job import RetrySpec, SamplingSpec, job_from_dict
from batchgen.retry import plan_retries
from tests.engines import stand_in_engine
from tests.jobs import job_with
from tests.sampling import PASSTHROUGH_VALUES, SCHEMA, params_of

MODEL = '{"model": "/models/smollm2", "dtype": "auto"}'


def completion(index: int = 0, text: str = "A sturdy mug.", token_ids=(11, 12, 13), logprob=-1.25,
               finish_reason="stop", stop_reason=None) -> SimpleNamespace:
    return SimpleNamespace(index=index, text=text, token_ids=list(token_ids), cumulative_logprob=logprob,
                           finish_reason=finish_reason, stop_reason=stop_reason)


def request_output(request_id: str, *completions: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, outputs=list(completions))


def request(item_id: str = "p1", **kwargs: Any) -> GenRequest:
    values = {"prompt": f"<prompt {item_id}>", "prompt_token_ids": [1, 2, 3, 4], "max_tokens": 16}
    values.update(kwargs)
    return GenRequest(item_id=item_id, **values)


# ---------------------------------------------------------------- output_rows

def test_output_rows_keeps_every_field():
    req = request("p1", max_tokens=16, n=2)
    out = request_output("req-7", completion(0, "A sturdy mug.", [11, 12, 13], -1.25, "stop", None),
                         completion(1, "Keeps coffee hot and", [21, 22, 23, 24], -3.5, "length", None))

    rows = output_rows(req, out, "key-1", 0.75)

    assert [dataclasses.asdict(r) for r in rows] == [  # every field, as the store writes it
        {"item_id": "p1", "candidate": 0, "attempt": 1, "strategy": "first", "request_key": "key-1",
         "request_id": "req-7", "prompt": "<prompt p1>", "prompt_token_ids": [1, 2, 3, 4], "n_prompt_tokens": 4,
         "text": "A sturdy mug.", "token_ids": [11, 12, 13], "n_output_tokens": 3, "new_output_tokens": 3,
         "cumulative_logprob": -1.25, "finish_reason": "stop", "stop_reason": None, "max_tokens": 16,
         "temperature": None, "lora": None, "logprobs": None, "prompt_logprobs": None, "chunk_seconds": 0.75, "chunk_finished_at": None},
        {"item_id": "p1", "candidate": 1, "attempt": 1, "strategy": "first", "request_key": "key-1",
         "request_id": "req-7", "prompt": "<prompt p1>", "prompt_token_ids": [1, 2, 3, 4], "n_prompt_tokens": 4,
         "text": "Keeps coffee hot and", "token_ids": [21, 22, 23, 24], "n_output_tokens": 4,
         "new_output_tokens": 4, "cumulative_logprob": -3.5, "finish_reason": "length", "stop_reason": None,
         "max_tokens": 16, "temperature": None, "lora": None, "logprobs": None, "prompt_logprobs": None, "chunk_seconds": 0.75, "chunk_finished_at": None},
    ]


def test_output_rows_of_a_retry_keep_the_retried_candidate():
    req = request("p1", attempt=2, strategy="grow", candidate=3, n=1, max_tokens=32)
    rows = output_rows(req, request_output(9, completion(0)), "k", 0.1)
    assert [(r.candidate, r.attempt, r.strategy, r.max_tokens) for r in rows] == [(3, 2, "grow", 32)]
    assert rows[0].request_id == "9"  # request ids are text


def test_output_rows_stop_reason_and_missing_finish_reason():
    rows = output_rows(request(), request_output("r", completion(stop_reason=2, finish_reason=None),
                                                 completion(index=1, stop_reason="\n\n")), "k", 0.0)
    assert rows[0].stop_reason == "2"  # a stop token id, as text
    assert rows[0].finish_reason == "unknown"
    assert rows[1].stop_reason == "\n\n"


def test_continuation_concatenates_the_prefix_and_sums_logprobs():
    req = request("p1", attempt=2, strategy="continue", candidate=0, max_tokens=32,
                  prefix_text="The mug keeps ", prefix_token_ids=[11, 12, 13], prefix_logprob=-2.0)
    out = request_output("r2", completion(0, "coffee hot.", [14, 15], -0.5, "stop"))

    [row] = output_rows(req, out, "k2", 0.2)

    assert row.text == "The mug keeps coffee hot."
    assert row.token_ids == [11, 12, 13, 14, 15]
    assert row.n_output_tokens == 5
    assert row.new_output_tokens == 2
    assert row.cumulative_logprob == pytest.approx(-2.5)
    assert row.prompt_token_ids == [1, 2, 3, 4]  # the prompt does not absorb the prefix
    assert row.n_prompt_tokens == 4


def test_continuation_with_an_unknown_prefix_logprob_has_no_logprob():
    req = request(strategy="continue", attempt=2, candidate=0, prefix_text="ab", prefix_token_ids=[5],
                  prefix_logprob=None)
    [row] = output_rows(req, request_output("r", completion(logprob=-1.0)), "k", 0.0)
    assert row.cumulative_logprob is None


# ---------------------------------------------------------------- request_key

BASE_SAMPLING = sampling_kwargs(SamplingSpec(temperature=0.7, max_tokens=16))


def key(req: GenRequest | None = None, sampling: dict[str, Any] | None = None, model: str = MODEL) -> str:
    return request_key(req or request(), sampling or BASE_SAMPLING, model)


def test_request_key_is_stable():
    assert key() == key(request(), sampling_kwargs(SamplingSpec(temperature=0.7, max_tokens=16)), MODEL)
    assert len(key()) == 32


@pytest.mark.parametrize("changed", [
    pytest.param(lambda: key(request(max_tokens=32)), id="max_tokens"),
    pytest.param(lambda: key(request(prompt_token_ids=[1, 2, 3, 5])), id="prompt-ids"),
    pytest.param(lambda: key(model='{"model": "/models/other", "dtype": "auto"}'), id="model"),
    pytest.param(lambda: key(sampling=sampling_kwargs(SamplingSpec(temperature=0.8, max_tokens=16))),
                 id="temperature"),
    pytest.param(lambda: key(sampling=sampling_kwargs(SamplingSpec(temperature=0.7, max_tokens=16, stop=["\n"]))),
                 id="stop"),
    pytest.param(lambda: key(request("p2")), id="item"),
    pytest.param(lambda: key(request(n=2)), id="n"),
    pytest.param(lambda: key(request(attempt=2, strategy="grow", candidate=0)), id="attempt"),
    pytest.param(lambda: key(request(prefix_token_ids=[9])), id="prefix"),
])
def test_request_key_changes_with_what_shapes_the_output(changed):
    assert changed() != key()


def test_request_key_tells_apart_token_ids_split_differently_between_prompt_and_prefix():
    # the ids are hashed as bytes one after another: their counts keep [1, 2] + [3] apart from [1] + [2, 3]
    assert key(request(prompt_token_ids=[1, 2], prefix_token_ids=[3])) != \
        key(request(prompt_token_ids=[1], prefix_token_ids=[2, 3]))
    assert key(request(prompt_token_ids=[1, 2, 3])) != key(request(prompt_token_ids=[1, 2, 3, 0]))


def test_request_keys_of_a_list_are_each_request_s_own_key():
    requests = [request("p1"), request("p2", max_tokens=32), request("p1", attempt=2, strategy="grow", candidate=0),
                request("p3", temperature=0.2), request("p3", temperature=0.7)]  # 0.7: the job's, not a row's own
    keys = request_keys(requests, BASE_SAMPLING, MODEL)
    assert keys == [key(r) for r in requests]
    assert len(set(keys)) == 5 and keys[0] == key() and keys[4] == key(request("p3"))


def test_request_key_ignores_the_job_level_budget_and_prompt_text():
    # the request's own budget counts, not the job's first-pass max_tokens; the text is a view of the ids
    other_budget = sampling_kwargs(SamplingSpec(temperature=0.7, max_tokens=999))
    assert key(sampling=other_budget) == key()
    assert key(request(prompt="same ids, other text")) == key()


# ---------------------------------------------------------------- run_requests with a stand-in engine

class FakeLLM:
    """Answers like vllm.LLM.generate: one RequestOutput per prompt, n completions each, in order."""

    def __init__(self, finish_reason: str = "stop"):
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.finish_reason = finish_reason

    def generate(self, prompts, sampling_params, use_tqdm=True):
        assert use_tqdm is False
        assert len(prompts) == len(sampling_params)
        self.calls.append((list(prompts), list(sampling_params)))
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            ids = list(prompt["prompt_token_ids"])
            outputs.append(request_output(
                f"req-{len(self.calls)}-{len(outputs)}",
                *[completion(i, f"out {ids[0]}/{i}", [900 + i] * params.max_tokens, -0.1 * params.max_tokens,
                             self.finish_reason) for i in range(params.n)],
            ))
        return outputs


class Factory:
    """An engine over the fake LLM, fed through batchgen's engine stream (one step answers what was added)."""

    def __init__(self, llm: FakeLLM):
        self.llm = llm
        self.engine = stand_in_engine(llm)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.engine


def many_requests(count: int, n: int = 1) -> list[GenRequest]:
    return [request(f"p{i}", prompt_token_ids=[1000 + i, 7, 8], max_tokens=4, n=n) for i in range(count)]


def test_run_requests_sends_every_request_with_its_budget_and_sampling():
    llm = FakeLLM()
    factory = Factory(llm)
    sampling = SamplingSpec(temperature=0.7, top_p=0.9, max_tokens=4, n=2, stop=["\n\n"])
    reqs = many_requests(3, n=2)

    rows, reused, *_ = run_requests(factory, reqs, sampling, MODEL, commit_every=10)

    assert reused == 0 and factory.calls == 1 and len(llm.calls) == 1
    prompts, params = llm.calls[0]
    assert [p["prompt_token_ids"] for p in prompts] == [[1000, 7, 8], [1001, 7, 8], [1002, 7, 8]]
    for p in params:
        assert (p.max_tokens, p.n, p.temperature, p.top_p, p.stop) == (4, 2, 0.7, 0.9, ["\n\n"])
    assert len(rows) == 6  # 3 requests x 2 candidates
    assert sorted((r.item_id, r.candidate) for r in rows) == [
        (f"p{i}", c) for i in range(3) for c in range(2)]
    keys = {r.item_id: r.request_key for r in rows}
    assert keys == {q.item_id: request_key(q, sampling_kwargs(sampling), MODEL) for q in reqs}


@pytest.mark.parametrize(("count", "chunk_size"), [(10, 3), (9, 3), (1, 512), (7, 1)])
def test_run_requests_feeds_every_request_at_once_and_commits_in_chunks(count, chunk_size):
    llm = FakeLLM()
    seen: list[dict[str, Any]] = []
    progress: list[tuple[int, int]] = []

    def on_chunk(new_rows, finished, total):
        seen.extend(new_rows)
        progress.append((finished, total))

    rows, reused, *_ = run_requests(Factory(llm), many_requests(count), SamplingSpec(max_tokens=4), MODEL,
                                commit_every=chunk_size, on_commit=on_chunk)

    assert [len(prompts) for prompts, _ in llm.calls] == [count]  # no drain between chunks: one engine step
    commits = [b - a for (a, _), (b, _) in zip([(0, count)] + progress, progress)]
    assert commits == [min(chunk_size, count - start) for start in range(0, count, chunk_size)]
    assert len(seen) == count == len(rows)
    assert sorted(r.item_id for r in seen) == sorted(f"p{i}" for i in range(count))  # each row once
    assert seen == rows
    assert progress[-1] == (count, count)
    assert [f for f, _ in progress] == sorted(f for f, _ in progress)


def test_run_requests_reuses_done_results_without_asking_the_engine():
    sampling = SamplingSpec(max_tokens=4)
    reqs = many_requests(5)
    first_rows, *_ = run_requests(Factory(FakeLLM()), reqs[:3], sampling, MODEL, commit_every=2)
    done: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in first_rows:
        done[row.request_key].append(row)

    llm = FakeLLM()
    seen: list[dict[str, Any]] = []
    progress: list[tuple[int, int]] = []

    def on_chunk(new_rows, finished, total):
        seen.extend(new_rows)
        progress.append((finished, total))

    rows, reused, *_ = run_requests(Factory(llm), reqs, sampling, MODEL, commit_every=2, done=done, on_commit=on_chunk)

    assert reused == 3
    sent = [p["prompt_token_ids"][0] for prompts, _ in llm.calls for p in prompts]
    assert sent == [1003, 1004]  # only p3 and p4 reach the engine
    assert len(llm.calls) == 1
    assert sorted(r.item_id for r in rows) == [f"p{i}" for i in range(5)]
    assert [r for r in rows if r.item_id in ("p0", "p1", "p2")] == first_rows  # reused as committed
    assert sorted(r.item_id for r in seen) == ["p3", "p4"]  # only new rows are handed on for commit
    assert progress == [(3, 5), (5, 5)]


def test_run_requests_asks_a_loader_once_for_exactly_its_requests_keys(tmp_path):
    from batchgen.store import ResultStore

    sampling = SamplingSpec(max_tokens=4)
    reqs = many_requests(5)
    store = ResultStore(tmp_path / "results")
    first_rows, *_ = run_requests(Factory(FakeLLM()), reqs[:3], sampling, MODEL, commit_every=2)
    store.commit(first_rows)
    asked: list[set[str]] = []

    def loader(keys: set[str]):
        asked.append(keys)
        return store.load(keys)

    llm = FakeLLM()
    rows, reused, *_ = run_requests(Factory(llm), reqs[1:], sampling, MODEL, commit_every=2, done=loader)

    assert len(asked) == 1 and len(asked[0]) == 4  # p1..p4, each key once
    assert {r.request_key for r in first_rows[1:]} <= asked[0]
    assert first_rows[0].request_key not in asked[0]  # p0 is not this call's
    assert reused == 2
    assert [p["prompt_token_ids"][0] for prompts, _ in llm.calls for p in prompts] == [1003, 1004]
    assert sorted(r.item_id for r in rows) == [f"p{i}" for i in range(1, 5)]


def test_run_requests_never_builds_the_engine_when_nothing_is_pending():
    sampling = SamplingSpec(max_tokens=4)
    reqs = many_requests(2)
    first_rows, *_ = run_requests(Factory(FakeLLM()), reqs, sampling, MODEL, commit_every=8)
    done = {row.request_key: [row] for row in first_rows}

    def factory():
        raise AssertionError("the engine was started although every request was done")

    rows, reused, *_ = run_requests(factory, reqs, sampling, MODEL, commit_every=8, done=done)
    assert reused == 2 and rows == first_rows

    rows, reused, *_ = run_requests(factory, [], sampling, MODEL, commit_every=8)
    assert (rows, reused) == ([], 0)


def test_run_requests_with_another_model_does_not_reuse_results():
    sampling = SamplingSpec(max_tokens=4)
    reqs = many_requests(2)
    first_rows, *_ = run_requests(Factory(FakeLLM()), reqs, sampling, MODEL, commit_every=8)
    done = {row.request_key: [row] for row in first_rows}
    llm = FakeLLM()
    _, reused, *_ = run_requests(Factory(llm), reqs, sampling, '{"model": "/models/other"}', commit_every=8, done=done)
    assert reused == 0 and len(llm.calls) == 1


def _cut_first_pass(sampling: SamplingSpec) -> pd.DataFrame:
    prompts = pd.DataFrame({"item_id": ["p1"], "prompt": ["<p1>"], "prompt_token_ids": [[1, 2, 3]],
                            "n_prompt_tokens": [3]})
    rows, *_ = run_requests(Factory(FakeLLM("length")), first_pass_requests(prompts, sampling), sampling, MODEL, 8)
    return pd.DataFrame(rows)


def test_continue_retry_sends_prompt_plus_prefix_and_asks_only_for_the_rest():
    sampling = SamplingSpec(max_tokens=8)
    first = _cut_first_pass(sampling)
    assert first["n_output_tokens"].tolist() == [8]
    [retry] = plan_retries(first, RetrySpec(strategy="continue", growth_factor=2), max_model_len=2048)
    llm = FakeLLM()

    [row], *_ = run_requests(Factory(llm), [retry], sampling, MODEL, commit_every=8)

    [prompt], [params] = llm.calls[0]
    assert prompt["prompt_token_ids"] == [1, 2, 3] + [900] * 8
    assert params.max_tokens == 8  # 16 in all, 8 already there
    assert row.n_output_tokens == 16 and row.new_output_tokens == 8
    assert row.text == "out 1/0out 1/0"
    assert row.cumulative_logprob == pytest.approx(-1.6)


def test_continue_retry_with_min_tokens_is_a_valid_engine_request():
    # min_tokens counts the whole output; a continuation already holds the prefix, so the engine
    # must not be asked for more new tokens than the remaining budget allows.
    sampling = SamplingSpec(max_tokens=8, min_tokens=8)
    first = _cut_first_pass(sampling)
    [retry] = plan_retries(first, RetrySpec(strategy="continue", growth_factor=1.5), max_model_len=2048)
    assert (retry.max_tokens, len(retry.prefix_token_ids)) == (12, 8)
    llm = FakeLLM()

    [row], *_ = run_requests(Factory(llm), [retry], sampling, MODEL, commit_every=8)

    [_], [params] = llm.calls[0]
    assert params.max_tokens == 4
    assert params.min_tokens <= params.max_tokens
    assert row.n_output_tokens == 12


def test_json_schema_goes_to_the_engine_as_structured_outputs():
    kwargs = sampling_kwargs(SamplingSpec(json_schema=SCHEMA, max_tokens=32))
    assert kwargs["structured_outputs"] == {"json": SCHEMA}
    assert not {"json_schema", "selection", "best_of", "overrides", "use_beam_search"} & set(kwargs)

    params = sampling_params(engine_budget(kwargs, GenRequest("p1", "x", [1], max_tokens=32)))
    assert params.structured_outputs.json == SCHEMA and params.max_tokens == 32


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


# ---------------------------------------------------------------- cut-off outputs retried in the stream

class FitsAt(FakeLLM):
    """Cut off ("length") while the budget is below `fits`, stopped at or above it; `seconds` a call."""

    def __init__(self, fits: int, seconds: float = 0.0):
        super().__init__()
        self.fits, self.seconds = fits, seconds

    def generate(self, prompts, sampling_params, use_tqdm=True):
        time.sleep(self.seconds)
        outputs = super().generate(prompts, sampling_params, use_tqdm)
        for output, params in zip(outputs, sampling_params):
            for c in output.outputs:
                c.finish_reason = "stop" if params.max_tokens >= self.fits else "length"
        return outputs


def grows(retry: RetrySpec):
    from batchgen.retry import stream_retry

    return stream_retry(retry, max_model_len=2048)


def test_cut_off_outputs_rejoin_the_stream_while_the_first_pass_still_runs_and_grow_until_they_fit():
    llm = FitsAt(16, seconds=0.05)
    factory = Factory(llm)
    factory.engine = stand_in_engine(llm, per_step=2)  # two requests a step: the first pass takes 5 steps
    core = llm.llm_engine
    waiting_when_added = []  # the budgets still in the engine when each request was added
    add = core.add_request
    core.add_request = lambda request_id, prompt, params: (
        waiting_when_added.append((params.max_tokens, [p.max_tokens for _, _, p in core.pending])),
        add(request_id, prompt, params))[1]
    retry = RetrySpec(max_passes=3, growth_factor=2, max_tokens_cap=64)
    totals = []

    ran = run_requests(factory, many_requests(10), SamplingSpec(max_tokens=4), MODEL, commit_every=1,
                       on_commit=lambda rows, finished, total: totals.append(total), follow_up=grows(retry))

    attempts = sorted((r.item_id, r.attempt, r.max_tokens, r.finish_reason) for r in ran.rows)
    assert attempts == sorted((f"p{i}", a, b, "stop" if b == 16 else "length")
                              for i in range(10) for a, b in ((1, 4), (2, 8), (3, 16)))
    assert ran.follow_ups == 20 and ran.reused == 0 and totals[-1] == 30
    first_grown = next(waiting for budget, waiting in waiting_when_added if budget == 8)
    assert first_grown.count(4) >= 6  # it joined while most of the first pass was still in the engine
    # the same requests (keys) a retry pass would have made of the first pass's cut-off outputs
    first = pd.DataFrame([dataclasses.asdict(r) for r in ran.rows if r.attempt == 1])
    planned = plan_retries(first, retry, max_model_len=2048)
    base = sampling_kwargs(SamplingSpec(max_tokens=4))
    assert ({request_key(q, base, MODEL) for q in planned}
            == {r.request_key for r in ran.rows if r.attempt == 2})


def test_stream_retries_stop_at_max_passes_and_at_the_cap():
    ran = run_requests(Factory(FitsAt(1000)), many_requests(3), SamplingSpec(max_tokens=4), MODEL, commit_every=2,
                       follow_up=grows(RetrySpec(max_passes=5, growth_factor=2, max_tokens_cap=12)))
    assert sorted({(r.attempt, r.max_tokens) for r in ran.rows}) == [(1, 4), (2, 8), (3, 12)]  # 16 > cap: 12
    ran = run_requests(Factory(FitsAt(1000)), many_requests(3), SamplingSpec(max_tokens=4), MODEL, commit_every=2,
                       follow_up=grows(RetrySpec(max_passes=1)))
    assert sorted({(r.attempt, r.max_tokens) for r in ran.rows}) == [(1, 4), (2, 8)]
    assert grows(RetrySpec(in_stream=False)) is None and grows(RetrySpec(on=["keyword"])) is None


def test_a_rerun_reuses_the_committed_attempts_and_their_follow_ups_and_generates_only_the_rest():
    # no spare requests (retry.ahead): the engine is asked for exactly what is left (spares: the test below)
    retry = RetrySpec(max_passes=3, growth_factor=2, max_tokens_cap=64, ahead=False)
    sampling = SamplingSpec(max_tokens=4)
    first = run_requests(Factory(FitsAt(16)), many_requests(4), sampling, MODEL, commit_every=1,
                         follow_up=grows(retry))
    # a crash after p0's and p1's second attempts were committed, before their third; p2 and p3 only cut off once
    committed = [r for r in first.rows if r.attempt == 1 or (r.attempt == 2 and r.item_id in ("p0", "p1"))]
    store: dict[str, list] = defaultdict(list)
    for row in committed:
        store[row.request_key].append(row)
    asked: list[set[str]] = []

    def load(keys: set[str]) -> dict[str, list]:
        asked.append(keys)
        return {key: store[key] for key in keys if key in store}

    llm = FitsAt(16)
    again = run_requests(Factory(llm), many_requests(4), sampling, MODEL, commit_every=1, done=load,
                         follow_up=grows(retry))
    sent = sorted((p["prompt_token_ids"][0], q.max_tokens) for prompts, params in llm.calls
                  for p, q in zip(prompts, params))
    assert sent == [(1000, 16), (1001, 16), (1002, 8), (1002, 16), (1003, 8), (1003, 16)]
    assert again.reused == 6 and len(asked) == 3  # the requests, then reused attempts' follow-ups, then theirs
    assert sorted((r.item_id, r.attempt) for r in again.rows) == sorted(
        (f"p{i}", a) for i in range(4) for a in (1, 2, 3))
    assert {r.request_key for r in again.rows} == {r.request_key for r in first.rows}  # the same requests


def test_requests_done_is_said_once_the_requests_have_their_outputs_while_their_retries_still_run():
    llm = FitsAt(32, seconds=0.05)
    factory = Factory(llm)
    factory.engine = stand_in_engine(llm, per_step=2)
    said: list[tuple[int, list]] = []  # (rows already read, rows handed over) when requests_done was called
    rows_read: list[int] = [0]

    def on_commit(new_rows, finished, total):
        rows_read[0] += len(new_rows)

    ran = run_requests(factory, many_requests(4), SamplingSpec(max_tokens=4), MODEL, commit_every=1,
                       on_commit=on_commit, follow_up=grows(RetrySpec(max_passes=3, max_tokens_cap=64)),
                       on_requests_done=lambda rows: said.append((rows_read[0], rows)))
    assert len(ran.rows) == 16  # 4, 8, 16, 32 tokens each
    assert len(said) == 1 and 4 <= said[0][0] < 16  # after the 4 first outputs, long before the last retry
    handed = said[0][1]
    assert len(handed) == said[0][0]  # the rows committed so far, every first attempt among them
    assert sorted(r.item_id for r in handed if r.attempt == 1) == ["p0", "p1", "p2", "p3"]
    assert [r for r in ran.rows if r.attempt == 1] == [r for r in handed if r.attempt == 1]
    said.clear()
    done = {row.request_key: [row] for row in ran.rows}
    run_requests(factory, many_requests(4), SamplingSpec(max_tokens=4), MODEL, commit_every=1, done=done,
                 follow_up=grows(RetrySpec(max_passes=3, max_tokens_cap=64)),
                 on_requests_done=lambda rows: said.append((0, rows)))
    assert len(said) == 1 and len(said[0][1]) == 16  # all reused: said at once, with every reused attempt


class FitsByItem(FakeLLM):
    """Even items' outputs fit at a budget of 16, odd items' at 32; cut off ("length") below that."""

    def generate(self, prompts, sampling_params, use_tqdm=True):
        outputs = super().generate(prompts, sampling_params, use_tqdm)
        for prompt, output, params in zip(prompts, outputs, sampling_params):
            fits = 16 if prompt["prompt_token_ids"][0] % 2 == 0 else 32
            for c in output.outputs:
                c.finish_reason = "stop" if params.max_tokens >= fits else "length"
        return outputs


class TokenSteps:
    """A stand-in core's step as a GPU's: every request in the engine makes one token a step (4 a step here, 5 ms),
    and is answered once it has its budget (or the tokens it stops at: FitsByItem's fit)."""

    def __init__(self, core, needs: Callable[[Any], int] = lambda prompt: 16 if prompt["prompt_token_ids"][0] % 2 == 0
                 else 32):
        self.core, self.made, self.needs = core, {}, needs  # needs(prompt): the new tokens it stops after

    def __call__(self):
        time.sleep(0.005)
        core, done = self.core, []
        for request_id, prompt, params in core.pending:
            self.made[request_id] = self.made.get(request_id, 0) + 4
            if self.made[request_id] >= min(params.max_tokens, self.needs(prompt)):
                done.append((request_id, prompt, params))
        core.pending = [p for p in core.pending if p not in done]
        outputs = core.answer([prompt for _, prompt, _ in done], [params for _, _, params in done])
        for (request_id, _, _), output in zip(done, outputs):
            output.request_id, output.finished = request_id, True
        return outputs


def test_a_retry_s_own_retry_runs_beside_it_and_is_kept_only_when_the_retry_is_cut_off_too():
    """retry.ahead: when a cut-off output's retry is sent (budgets 4, 8, 16, ...), the attempt after it is sent as
    a spare that runs while the engine has room: every item needs the 16 beside its 8; odd items need the 32 beside
    their 16 (adopted: committed after it), even items do not (withdrawn: never committed). The attempts, outputs
    and keys are those of the chain without spares."""
    def run(ahead: bool, done=None):
        events: list[tuple] = []
        llm = FitsByItem()
        factory = Factory(llm)
        factory.engine = stand_in_engine(llm, max_num_seqs=64)
        core = llm.llm_engine
        core.step = TokenSteps(core)
        add = core.add_request
        core.add_request = lambda request_id, prompt, params: (
            events.append(("add", prompt["prompt_token_ids"][0], params.max_tokens)),
            add(request_id, prompt, params))[1]
        retry = RetrySpec(max_passes=3, growth_factor=2, max_tokens_cap=64, ahead=ahead)
        ran = run_requests(factory, many_requests(6), SamplingSpec(max_tokens=4), MODEL, commit_every=1, done=done,
                           on_commit=lambda rows, finished, total: events.extend(
                               ("commit", r.item_id, r.attempt, r.max_tokens) for r in rows),
                           follow_up=grows(retry),
                           on_attempt_done=lambda attempt, rows: events.append(
                               ("said", attempt, sorted(r.item_id for r in rows))))
        return ran, events

    def said_when_done(ran, events):
        """Each attempt number was said once, in order, with all its rows, after the last commit of it and of every
        number below it, before any commit of a number above it that came later (nothing of it was still open)."""
        said = [(events.index(e), e[1], e[2]) for e in events if e[0] == "said"]
        numbers = sorted({r.attempt for r in ran.rows})
        assert [attempt for _, attempt, _ in said] == numbers
        for at, attempt, items in said:
            assert items == sorted(r.item_id for r in ran.rows if r.attempt == attempt)
            assert not [e for e in events[at:] if e[0] == "commit" and e[2] <= attempt]
        return said

    def chain(ran):
        return sorted((r.item_id, r.attempt, r.max_tokens, r.finish_reason, r.text, r.request_key) for r in ran.rows)

    plain, plain_events = run(ahead=False)
    ran, events = run(ahead=True)
    assert chain(ran) == chain(plain)
    assert sorted((r.item_id, r.attempt, r.max_tokens) for r in ran.rows) == sorted(
        [(f"p{i}", a, b) for i in range(6) for a, b in ((1, 4), (2, 8), (3, 16))]
        + [(f"p{i}", 4, 32) for i in range(1, 6, 2)])
    assert ran.follow_ups == plain.follow_ups == 15
    commits = [e[1:] for e in events if e[0] == "commit"]
    for i in range(6):  # each item's attempts committed in their order, once each
        assert [a for item, a, _ in commits if item == f"p{i}"] == sorted({a for item, a, _ in commits
                                                                          if item == f"p{i}"})
    for i in range(1, 6, 2):  # odd items' 32-token attempt was in the engine before their 16 was committed
        assert events.index(("add", 1000 + i, 32)) < events.index(("commit", f"p{i}", 3, 16))
    # without spares, only after it
    assert plain_events.index(("add", 1001, 32)) > plain_events.index(("commit", "p1", 3, 16))
    # on_attempt_done: the first attempts and the first retries said while the odd items' retries still ran
    for one, its_events in ((plain, plain_events), (ran, events)):
        said = said_when_done(one, its_events)
        assert [(attempt, len(items)) for _, attempt, items in said] == [(1, 6), (2, 6), (3, 6), (4, 3)]
        assert said[1][0] < max(i for i, e in enumerate(its_events) if e[0] == "commit")

    # a rerun after a crash that had committed the first attempts and p1's second: the same rows, and nothing
    # committed asked of the engine again, spares included
    store: dict[str, list] = defaultdict(list)
    for row in ran.rows:
        if row.attempt == 1 or (row.item_id == "p1" and row.attempt == 2):
            store[row.request_key].append(row)
    again, again_events = run(ahead=True, done=lambda keys: {k: store[k] for k in keys if k in store})
    assert chain(again) == chain(plain)
    said_when_done(again, again_events)  # reused attempts included
    assert again.reused == 6 + 1
    sent = [e[1:] for e in again_events if e[0] == "add"]
    assert not [s for s in sent if s[1] == 4] and (1001, 8) not in sent


class FitsInAll(FakeLLM):
    """Continuations (the prompt's 3 tokens and the cut-off ones) count the tokens they continue: even items' outputs
    fit in 8 tokens in all, odd items' in 16; cut off ("length") below that."""

    @staticmethod
    def fits(prompt) -> int:
        return 8 if prompt["prompt_token_ids"][0] % 2 == 0 else 16

    def needs(self, prompt) -> int:
        return self.fits(prompt) - (len(prompt["prompt_token_ids"]) - 3)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        outputs = super().generate(prompts, sampling_params, use_tqdm)
        for prompt, output, params in zip(prompts, outputs, sampling_params):
            for c in output.outputs:
                c.finish_reason = "stop" if params.max_tokens >= self.needs(prompt) else "length"
        return outputs


def test_continue_then_grow_starts_the_draw_afresh_beside_a_continuation_and_keeps_it_only_when_that_is_cut_off():
    """retry.ahead with continue_then_grow: a first attempt cut off at 4 tokens is continued to 8; beside the
    continuation the draw afresh at 16 that it gets if cut off again starts as a spare. Odd items' continuations
    are cut off (adopted: their 16 was in the engine before the continuation was committed, committed after it);
    even items' are not (withdrawn). The attempts, outputs and keys are those of the chain without spares; a first
    attempt gets no spare (its follow-up continues its output)."""
    def run(ahead: bool):
        events: list[tuple] = []
        llm = FitsInAll()
        factory = Factory(llm)
        factory.engine = stand_in_engine(llm, max_num_seqs=64)
        core = llm.llm_engine
        core.step = TokenSteps(core, llm.needs)
        add = core.add_request
        core.add_request = lambda request_id, prompt, params: (
            events.append(("add", prompt["prompt_token_ids"][0], len(prompt["prompt_token_ids"]), params.max_tokens)),
            add(request_id, prompt, params))[1]
        retry = RetrySpec(max_passes=2, strategy="continue_then_grow", growth_factor=2, max_tokens_cap=64,
                          ahead=ahead)
        ran = run_requests(factory, many_requests(6), SamplingSpec(max_tokens=4), MODEL, commit_every=1,
                           on_commit=lambda rows, finished, total: events.extend(
                               ("commit", r.item_id, r.attempt, r.max_tokens) for r in rows),
                           follow_up=grows(retry))
        return ran, events, core.aborted

    def chain(ran):
        return sorted((r.item_id, r.attempt, r.strategy, r.max_tokens, r.finish_reason, r.text, r.request_key)
                      for r in ran.rows)

    plain, plain_events, plain_aborted = run(ahead=False)
    ran, events, aborted = run(ahead=True)
    assert chain(ran) == chain(plain)
    assert sorted((r.item_id, r.attempt, r.strategy, r.max_tokens, r.finish_reason) for r in ran.rows) == sorted(
        [(f"p{i}", 1, "first", 4, "length") for i in range(6)]
        + [(f"p{i}", 2, "continue", 8, "stop" if i % 2 == 0 else "length") for i in range(6)]
        + [(f"p{i}", 3, "grow", 16, "stop") for i in range(1, 6, 2)])
    assert (ran.spares_kept, ran.spares_dropped) == (3, 3) and len(aborted) <= 3 and not plain_aborted
    for i in range(6):
        # the continuation: the prompt and the 4 cut-off tokens, asked for 4 more
        assert ("add", 1000 + i, 7, 4) in events
    for i in range(1, 6, 2):  # the draw afresh (3 prompt tokens, 16) was in the engine before the continuation's commit
        assert events.index(("add", 1000 + i, 3, 16)) < events.index(("commit", f"p{i}", 2, 8))
        assert events.index(("commit", f"p{i}", 2, 8)) < events.index(("commit", f"p{i}", 3, 16))
    assert plain_events.index(("add", 1001, 3, 16)) > plain_events.index(("commit", "p1", 2, 8))
    committed = [e[1:] for e in events if e[0] == "commit"]
    assert not [c for c in committed if c[0] in ("p0", "p2", "p4") and c[1] == 3]  # withdrawn: never committed
    adds_before_first_commit = [e for e in events[:events.index(next(e for e in events if e[0] == "commit"))]
                                if e[0] == "add"]
    assert {e[3] for e in adds_before_first_commit} == {4}  # no spare beside a first attempt
