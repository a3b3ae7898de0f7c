"""OpenAI Batch lines in and out: reading requests, error lines, grouping into jobs, response bodies (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from batchgen import openai_batch as ob
from batchgen.job import JobError, job_from_dict

MODEL = "SmolLM2-135M-Instruct"
SERVED = {MODEL}


def chat_line(custom_id: str, **body) -> str:
    """A line as OpenAI's Batch API documents it (chat completions)."""
    body = {"model": MODEL, "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                         {"role": "user", "content": "Hello world!"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ob.CHAT, "body": body})


def completion_line(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ob.COMPLETION,
                       "body": {"model": MODEL, "prompt": "Once upon a time", **body}})


def parse(raw: str, number: int = 1, seen: dict | None = None):
    return ob.parse_line(number, raw, {} if seen is None else seen, SERVED)


def test_documented_chat_line_reads_messages_and_budget():
    request = parse(chat_line("request-1", max_tokens=1000))
    assert isinstance(request, ob.BatchRequest)
    assert request.custom_id == "request-1" and request.url == ob.CHAT and request.max_tokens == 1000
    assert request.prompt == [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "Hello world!"}]
    assert request.temperature is None and request.sampling == {}


def test_sampling_fields_under_openai_names():
    request = parse(chat_line("a", max_completion_tokens=12, temperature=0.2, top_p=0.9, n=2, stop="\n",
                              logprobs=True, top_logprobs=3, presence_penalty=0.5,
                              response_format={"type": "json_schema",
                                               "json_schema": {"name": "x", "schema": {"type": "object"}}}))
    assert request.max_tokens == 12 and request.temperature == 0.2 and request.logprobs is True
    assert request.sampling == {"top_p": 0.9, "n": 2, "stop": ["\n"], "logprobs": 3, "presence_penalty": 0.5,
                                "json_schema": {"type": "object"}}
    completion = parse(completion_line("b", max_tokens=8, logprobs=2, stop=["."]))
    assert completion.prompt == "Once upon a time" and completion.sampling == {"logprobs": 2, "stop": ["."]}


def test_text_parts_are_joined_and_developer_is_a_system_message():
    raw = json.dumps({"custom_id": "a", "method": "POST", "url": ob.CHAT, "body": {"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]}})
    assert parse(raw).prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one\ntwo"}]


@pytest.mark.parametrize("raw, code, param, status", [
    ("{not json", "invalid_json", None, 400),
    ("[1, 2]", "invalid_json", None, 400),
    (json.dumps({"method": "POST", "url": ob.CHAT, "body": {}}), "invalid_request", "custom_id", 400),
    (json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}), "invalid_url", "url", 404),
    (json.dumps({"custom_id": "a", "method": "GET", "url": ob.CHAT, "body": {}}), "invalid_request", "method", 400),
    (json.dumps({"custom_id": "a", "method": "POST", "url": ob.CHAT, "body": []}), "invalid_body", "body", 400),
    (chat_line("a", model="gpt-4o-mini"), "model_not_found", "body.model", 404),
    (chat_line("a", temperature="hot"), "invalid_body", "body.temperature", 400),
    (chat_line("a", temperature=2.5), "invalid_body", "body.temperature", 400),
    (chat_line("a", n=0), "invalid_body", "body.n", 400),
    (chat_line("a", max_tokens=2.5), "invalid_body", "body.max_tokens", 400),
    (chat_line("a", max_tokens=8, max_completion_tokens=9), "invalid_body", "body.max_completion_tokens", 400),
    (chat_line("a", stop=[1]), "invalid_body", "body.stop", 400),
    (chat_line("a", top_logprobs=2), "invalid_body", "body.top_logprobs", 400),
    (chat_line("a", tools=[]), "invalid_body", "body.tools", 400),
    (chat_line("a", stream=True), "invalid_body", "body.stream", 400),
    (chat_line("a", colour="red"), "invalid_body", "body.colour", 400),
    (chat_line("a", response_format={"type": "json_schema"}), "invalid_body",
     "body.response_format.json_schema.schema", 400),
    (chat_line("a", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "invalid_body", "body.messages[0].content[0]", 400),
    (chat_line("a", messages=[{"role": "tool", "content": "x"}]), "invalid_body", "body.messages[0].role", 400),
    (chat_line("a", messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]),
     "invalid_body", "body.messages[1].role", 400),
    (chat_line("a", messages=[]), "invalid_body", "body.messages", 400),
    (completion_line("a", prompt=["one", "two"]), "invalid_body", "body.prompt", 400),
    (completion_line("a", echo=True), "invalid_body", "body.echo", 400),
])
def test_bad_lines_get_an_error_naming_the_line_and_field(raw, code, param, status):
    error = parse(raw, number=7)
    assert isinstance(error, ob.LineError), error
    assert (error.code, error.param, error.status_code, error.line) == (code, param, status, 7)
    assert error.message.startswith("line 7: ")
    if param:
        assert param in error.message


def test_duplicate_custom_id_names_the_first_line():
    seen: dict[str, int] = {}
    assert isinstance(parse(chat_line("same"), 2, seen), ob.BatchRequest)
    error = parse(chat_line("same"), 5, seen)
    assert error.code == "duplicate_custom_id" and error.custom_id == "same"
    assert "line 5" in error.message and "line 2" in error.message


def test_read_batch_counts_physical_lines_and_skips_blank_ones(tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join([chat_line("a"), "", "{oops", chat_line("a"), completion_line("b")]) + "\n")
    parsed = ob.read_batch(path, SERVED)
    assert [(r.line, r.custom_id) for r in parsed.requests] == [(1, "a"), (5, "b")]
    assert [(e.line, e.code) for e in parsed.errors] == [(3, "invalid_json"), (4, "duplicate_custom_id")]


def test_read_batch_refuses_a_missing_or_empty_file(tmp_path: Path):
    from batchgen.items import DataError

    with pytest.raises(DataError, match="input file not found"):
        ob.read_batch(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no lines"):
        ob.read_batch(tmp_path / "empty.jsonl")


def test_lines_differing_in_budget_and_temperature_share_a_group():
    a = parse(chat_line("a", max_tokens=8, temperature=0))
    b = parse(chat_line("b", max_tokens=16, temperature=0.9))
    c = parse(chat_line("c", max_tokens=8, top_p=0.5))
    d = parse(completion_line("d", max_tokens=8))
    groups = ob.group_requests([a, b, c, d])
    assert [[r.custom_id for r in group] for group in groups.values()] == [["a", "b"], ["c"], ["d"]]
    assert list(groups)[2].startswith("completion-") and ob.group_name(a) == ob.group_name(b)


def test_group_jobs_are_valid_batch_generation_jobs(tmp_path: Path):
    base = ob.base_job(None, {"max_model_len": 2048})
    chat = [parse(chat_line("a", max_tokens=8, stop=["\n"])), parse(chat_line("b", temperature=0))]
    spec = job_from_dict(ob.job_for_group(base, chat, tmp_path / "items.jsonl", tmp_path / "out"))
    assert spec.prompt.messages_column == ob.MESSAGES and spec.input.id_column == ob.ID
    assert spec.sampling.stop == ["\n"] and spec.sampling.overrides == {"max_tokens": ob.MAX_TOKENS,
                                                                         "temperature": ob.TEMPERATURE}
    assert spec.retry.max_passes == 0 and spec.expectations.require_stop is False  # answered as OpenAI would
    assert spec.engine.max_model_len == 2048
    assert ob.item_rows(chat) == [
        {ob.ID: "a", ob.LINE: 1, ob.MESSAGES: chat[0].prompt, ob.MAX_TOKENS: 8, ob.TEMPERATURE: None},
        {ob.ID: "b", ob.LINE: 1, ob.MESSAGES: chat[1].prompt, ob.MAX_TOKENS: None, ob.TEMPERATURE: 0.0}]
    completion = job_from_dict(ob.job_for_group(base, [parse(completion_line("c"))], tmp_path / "i.jsonl",
                                                tmp_path / "o"))
    assert completion.prompt.style == "completion" and completion.prompt.template == "{{ batch_prompt }}"


def test_job_file_gives_expectations_and_retries_but_not_input(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("expectations: {min_chars: 5, require_stop: true}\nretry: {max_passes: 2}\n"
                   "sampling: {max_tokens: 32}\n")
    base = ob.base_job(job, {"model": None, "seed": 3})
    assert base["expectations"] == {"min_chars": 5, "require_stop": True} and base["retry"] == {"max_passes": 2}
    assert base["sampling"]["max_tokens"] == 32 and base["engine"] == {"seed": 3}
    job.write_text("input: {path: x.csv}\n")
    with pytest.raises(JobError, match="input: run-batch takes it from the batch file"):
        ob.base_job(job, {})
    job.write_text("retry: {max_passes: -1}\n")
    with pytest.raises(JobError, match="retry.max_passes"):
        ob.base_job(job, {})


def test_a_job_that_continues_cut_off_outputs_refuses_the_group_of_structured_lines_only(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("expectations: {require_stop: true}\nretry: {max_passes: 2, strategy: continue}\n")
    base = ob.base_job(job, {})
    plain = [parse(chat_line("a", max_tokens=8))]
    structured = [parse(chat_line("b", response_format={"type": "json_object"}))]
    assert job_from_dict(ob.job_for_group(base, plain, tmp_path / "i.jsonl", tmp_path / "o")).retry.strategy == \
        "continue"
    with pytest.raises(JobError, match="retry.strategy: continue cannot extend an output constrained by "
                                       "sampling.json_schema"):
        job_from_dict(ob.job_for_group(base, structured, tmp_path / "s.jsonl", tmp_path / "so"))


def test_lines_budgets_are_their_own_so_a_job_cap_below_the_default_budget_is_valid(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("expectations: {require_stop: true}\nretry: {max_passes: 1, max_tokens_cap: 64}\n")
    base = ob.base_job(job, {})
    assert base["sampling"]["max_tokens"] > 64  # a line without max_tokens gets this one, and cannot grow
    spec = job_from_dict(ob.job_for_group(base, [parse(chat_line("a", max_tokens=8))], tmp_path / "i.jsonl",
                                          tmp_path / "o"))
    assert spec.retry.max_tokens_cap == 64 and spec.sampling.overrides["max_tokens"] == ob.MAX_TOKENS


def test_served_names():
    assert ob.served_names(None, None) == {MODEL}
    assert ob.served_names("/models/Qwen3-0.6B/", None) == {"/models/Qwen3-0.6B/", "Qwen3-0.6B"}
    assert ob.served_names("/models/x", ["gpt-4o-mini"]) == {"gpt-4o-mini"}


def attempt(item_id: str, candidate: int, number: int, text: str, token_ids: list[int], finish: str = "stop",
            prompt_tokens: int = 20, logprobs=None) -> dict:
    return {"item_id": item_id, "candidate": candidate, "attempt": number, "request_key": f"k{item_id}{number}",
            "n_prompt_tokens": prompt_tokens, "text": text, "token_ids": token_ids, "finish_reason": finish,
            "stop_reason": None, "logprobs": logprobs}


def test_response_body_takes_each_candidates_last_attempt_and_sums_usage():
    request = parse(chat_line("a", n=2))
    attempts = pd.DataFrame([attempt("a", 0, 1, "cut", [1, 2], "length"), attempt("a", 1, 1, "fine", [5, 6, 7]),
                             attempt("a", 0, 2, "cut no more", [1, 2, 3, 4])])
    body = ob.response_body(request, attempts, MODEL, 1700000000)
    assert body["object"] == "chat.completion" and body["model"] == MODEL and body["created"] == 1700000000
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "cut no more", "stop"), (1, "fine", "stop")]
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


def positions(*steps):
    return [[{"token_id": t, "token": s, "logprob": lp, "rank": r} for t, s, lp, r in step] for step in steps]


def test_logprobs_in_openai_shapes():
    steps = positions([(1, "Hi", -0.1, 1), (2, "Yo", -2.0, 2)], [(3, "!", -0.5, 1), (4, "?", -3.0, 3)])
    # the second token sampled was not among the top 1: it is listed, and top_logprobs keeps only rank 1
    rows = pd.DataFrame([attempt("a", 0, 1, "Hi?", [1, 4], logprobs=steps[:1] + [steps[1][::-1]])])
    chat = ob.response_body(parse(chat_line("a", logprobs=True, top_logprobs=1)), rows, MODEL, 0)
    content = chat["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"], c["bytes"]) for c in content] == [("Hi", -0.1, [72, 105]), ("?", -3.0, [63])]
    assert [[t["token"] for t in c["top_logprobs"]] for c in content] == [["Hi"], ["!"]]
    text = ob.response_body(parse(completion_line("a", logprobs=1)), rows, MODEL, 0)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "Hi?"
    assert text["choices"][0]["logprobs"] == {"text_offset": [0, 2], "token_logprobs": [-0.1, -3.0],
                                              "tokens": ["Hi", "?"], "top_logprobs": [{"Hi": -0.1},
                                                                                      {"?": -3.0, "!": -0.5}]}
    plain = ob.response_body(parse(chat_line("a")), rows, MODEL, 0)
    assert plain["choices"][0]["logprobs"] is None


def test_every_line_once_in_input_order_across_the_two_files(tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join([chat_line("ok"), "nope", chat_line("cut"), completion_line("later")]) + "\n")
    parsed = ob.read_batch(path, SERVED)
    publication = ob.Publication(
        accepted={"ok"}, created=0,
        rejected=pd.DataFrame([{"item_id": "cut", "stage": "validate", "reasons": ["truncated"],
                                "detail": "cut off at max_tokens"}]),
        attempts=pd.DataFrame([attempt("ok", 0, 1, "hello", [1]), attempt("cut", 0, 1, "hel", [1], "length")]))
    chat = [r for r in parsed.requests if r.url == ob.CHAT]
    done = ob.outcomes(chat, publication, MODEL)
    with pytest.raises(AssertionError, match="without a result"):
        ob.write_results(parsed, done, tmp_path / "out.jsonl", tmp_path / "err.jsonl", "b")
    done[4] = ob.LineError(4, "later", "prompt_too_long", "line 4: too long", None, 400)
    counts = ob.write_results(parsed, done, tmp_path / "out.jsonl", tmp_path / "err.jsonl", "b")
    assert counts == {"lines": 4, "completed": 1, "failed": 3}
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    err = [json.loads(line) for line in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["ok"] and out[0]["error"] is None
    assert out[0]["response"]["status_code"] == 200 and out[0]["response"]["body"]["choices"][0]["message"][
        "content"] == "hello"
    assert [(e["custom_id"], e["error"]["code"], e["error"]["line"]) for e in err] == [
        (None, "invalid_json", 2), ("cut", "truncated", 3), ("later", "prompt_too_long", 4)]
    assert err[1]["response"]["status_code"] == 422  # generated, then failed an expectation: its text is kept
    assert err[1]["response"]["body"]["choices"][0]["message"]["content"] == "hel"
    assert len({record["id"] for record in out + err}) == 4


def test_default_files_sit_beside_the_output():
    assert ob.default_error_file(Path("/d/results.jsonl")) == Path("/d/results.errors.jsonl")
    assert ob.default_work_dir(Path("/d/results.jsonl")) == Path("/d/results.batchgen")


def test_command_stops_on_a_missing_file_or_a_bad_job(tmp_path: Path):
    from typer.testing import CliRunner

    from batchgen.cli import EXIT_BAD_DATA, EXIT_BAD_JOB, app

    out = str(tmp_path / "results.jsonl")
    missing = CliRunner().invoke(app, ["run-batch", "-i", str(tmp_path / "nope.jsonl"), "-o", out])
    assert missing.exit_code == EXIT_BAD_DATA and "nope.jsonl: input file not found" in missing.output
    job = tmp_path / "job.yaml"
    job.write_text("prompt: {template: x}\n")
    bad = CliRunner().invoke(app, ["run-batch", "-i", str(tmp_path / "nope.jsonl"), "-o", out, "--job", str(job)])
    assert bad.exit_code == EXIT_BAD_JOB and "prompt: run-batch takes it from the batch file" in bad.output
    assert not (tmp_path / "results.jsonl").exists()
