"""`batchgen run-batch` on the real engine: an OpenAI Batch file written from OpenAI's documented format (chat and
completion forms, and four lines that cannot run) in, OpenAI Batch output and error files out, through the
batch-generation flow with a job's expectations and retries; a rerun resumes from the result store.

One run of the command for the module (two groups of sampling settings: two flow runs), then the rerun.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchgen.models import default_model_path
from tests.test_cli import run_cli

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
BUDGET = 12
GROWTH = 4  # a cut-off output is retried once with BUDGET * GROWTH tokens
CHAT_HELLO = [{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": "Hello world!"}]
LINES = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": CHAT_HELLO, "max_tokens": BUDGET, "temperature": 0}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "max_completion_tokens": BUDGET - 4, "temperature": 0.5, "messages": [
         {"role": "user", "content": [{"type": "text", "text": "Name one colour of the rainbow."}]}]}},
    {"custom_id": "request-3", "method": "POST", "url": "/v1/completions",
     "body": {"model": MODEL, "prompt": "The capital of France is", "max_tokens": BUDGET, "temperature": 0,
              "logprobs": 1}},
    "{\"custom_id\": \"request-4\", \"method\": \"POST\", \"url\": ",
    {"custom_id": "request-5", "method": "POST", "url": "/v1/completions",
     "body": {"model": MODEL, "prompt": "Water boils at", "max_tokens": BUDGET - 4, "temperature": 0, "logprobs": 1}},
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": CHAT_HELLO}},
    {"custom_id": "request-7", "method": "POST", "url": "/v1/embeddings",
     "body": {"model": MODEL, "input": "Hello"}},
    {"custom_id": "request-8", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": MODEL, "messages": CHAT_HELLO, "temperature": "hot"}},
]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def summary(stdout: str) -> dict:
    """The command's closing JSON summary."""
    return json.JSONDecoder().raw_decode(stdout[stdout.index('{\n  "output_file"'):])[0]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The batch file, the job, and two runs of the same command as a user runs it (the second one resumes)."""
    tmp = tmp_path_factory.mktemp("openai-batch")
    requests = tmp / "requests.jsonl"
    requests.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in LINES),
                        encoding="utf-8")
    job = tmp / "job.yaml"
    job.write_text(f"expectations: {{require_stop: true}}\n"
                   f"retry: {{max_passes: 1, growth_factor: {GROWTH}, max_tokens_cap: 64}}\n", encoding="utf-8")
    command = ["run-batch", "-i", str(requests), "-o", str(tmp / "results.jsonl"), "--job", str(job),
               "--max-model-len", "1024"]
    first = run_cli(command, tmp, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    outputs = [(tmp / name).read_text(encoding="utf-8") for name in ("results.jsonl", "results.errors.jsonl")]
    second = run_cli(command, tmp, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    yield {"dir": tmp, "first": outputs, "summary": summary(second.stdout)}


def test_every_line_once_in_input_order(batch):
    out, err = records(batch["dir"] / "results.jsonl"), records(batch["dir"] / "results.errors.jsonl")
    lines = [r["error"]["line"] for r in err]
    assert lines == sorted(lines) and {4, 6, 7, 8} <= set(lines)
    answered = [r["custom_id"] for r in out]
    assert answered == [c for c in ("request-1", "request-2", "request-3", "request-5") if c in answered]
    assert len(out) + len(err) == len(LINES) == batch["summary"]["lines"]
    assert sorted(answered + [r["custom_id"] for r in err if r["error"]["line"] in (1, 2, 3, 5)]) == [
        "request-1", "request-2", "request-3", "request-5"]


def test_unusable_lines_name_the_line_and_field(batch):
    err = {r["error"]["line"]: r for r in records(batch["dir"] / "results.errors.jsonl")}
    assert err[4]["custom_id"] is None and err[4]["error"]["code"] == "invalid_json"
    assert err[6]["custom_id"] == "request-1" and err[6]["error"]["code"] == "duplicate_custom_id"
    assert "line 6" in err[6]["error"]["message"] and "line 1" in err[6]["error"]["message"]
    assert (err[7]["error"]["code"], err[7]["error"]["param"], err[7]["response"]["status_code"]) == (
        "invalid_url", "url", 404)
    assert (err[8]["error"]["code"], err[8]["error"]["param"]) == ("invalid_body", "body.temperature")
    assert all(err[n]["response"]["body"] is None for n in (4, 6, 7, 8))


def prompt_tokens(messages_or_text) -> int:
    if isinstance(messages_or_text, str):
        text = messages_or_text
    else:  # text parts are one message, joined by newlines
        messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                     else "\n".join(part["text"] for part in m["content"])} for m in messages_or_text]
        text = tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer()(text, add_special_tokens=False)["input_ids"])


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path()))


def eos_token() -> str:
    return tokenizer().eos_token


def test_responses_are_openai_bodies_with_real_usage(batch):
    out = records(batch["dir"] / "results.jsonl")
    err = [r for r in records(batch["dir"] / "results.errors.jsonl") if r["response"]["body"] is not None]
    by_id = {}
    for line in LINES[:5]:  # the lines that reach the engine (line 6 repeats request-1's custom_id)
        if isinstance(line, dict):
            by_id.setdefault(line["custom_id"], line)
    assert out, "no request passed the job's expectations"
    for record in out + err:
        request, body = by_id[record["custom_id"]], record["response"]["body"]
        chat = request["url"] == "/v1/chat/completions"
        assert set(record) == {"id", "custom_id", "response", "error"}
        assert body["object"] == ("chat.completion" if chat else "text_completion") and body["model"] == MODEL
        [choice] = body["choices"]
        text = choice["message"]["content"] if chat else choice["text"]
        assert choice["message"]["role"] == "assistant" if chat else "text" in choice
        usage = body["usage"]
        asked = request["body"].get("max_tokens") or request["body"].get("max_completion_tokens")
        assert usage["prompt_tokens"] == prompt_tokens(request["body"]["messages"] if chat
                                                       else request["body"]["prompt"])
        assert 0 < usage["completion_tokens"] <= asked * GROWTH
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        if not chat:  # logprobs: 1, one entry per generated token, and the tokens spell the text
            logprobs = choice["logprobs"]
            spelled = "".join(logprobs["tokens"])  # an output that ended on the model's EOS token lists it too
            assert spelled == text or (choice["finish_reason"] == "stop" and spelled == text + eos_token())
            assert len(logprobs["tokens"]) == usage["completion_tokens"]
            assert all(lp <= 0 for lp in logprobs["token_logprobs"])
        if record in out:
            assert record["error"] is None and record["response"]["status_code"] == 200
            assert choice["finish_reason"] == "stop"  # the job requires it; a cut-off output was retried
        else:  # generated, retried, still cut off: rejected by the job's expectation, with its last text
            assert record["error"]["code"] == "truncated" and record["response"]["status_code"] == 422
            assert choice["finish_reason"] == "length" and usage["completion_tokens"] == asked * GROWTH


def test_cut_off_outputs_were_retried_by_the_flow(batch):
    manifests = [json.loads((group / "current" / "manifest.json").read_text())
                 for group in sorted((batch["dir"] / "results.batchgen").iterdir())]
    assert len(manifests) == 2 == len(batch["summary"]["groups"])  # chat lines and completion lines
    assert sum(m["counts"]["items"] for m in manifests) == 4
    for manifest in manifests:
        counts = manifest["counts"]
        assert counts["retry_attempts"] == counts["truncated_first_pass"]
        assert counts["truncated_final"] == counts["rejected_by_reason"].get("truncated", 0)


def test_rerun_resumes_from_the_result_store(batch):
    again = [(batch["dir"] / name).read_text(encoding="utf-8") for name in ("results.jsonl", "results.errors.jsonl")]
    strip = lambda text: [{**r, "response": {**r["response"], "body": r["response"]["body"] and {
        k: v for k, v in r["response"]["body"].items() if k != "created"}}} for r in map(json.loads, text.splitlines())]
    assert [strip(t) for t in again] == [strip(t) for t in batch["first"]]
    for group in (batch["dir"] / "results.batchgen").iterdir():
        manifest = json.loads((group / "current" / "manifest.json").read_text())
        assert manifest["counts"]["reused"] == manifest["counts"]["attempts"] > 0
        attempts = pq.read_table(group / "current" / "attempts")
        assert attempts.num_rows == manifest["counts"]["attempts"]
