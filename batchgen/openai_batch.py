"""OpenAI Batch files in and out: request lines become batch-generation jobs, publications become result lines.

A batch file's lines are grouped by their sampling settings (every field but max_tokens and
temperature, which travel as per-row overrides): each group is one run of the batch-generation
flow over a JSONL items file, in a folder of its own whose name is a hash of those settings,
so a rerun of the same file resumes each group from its result store. Lines that cannot be
read (not JSON, a duplicate custom_id, an unknown url, a bad body) never reach the flow: they
get an error line naming the line number and the field. Result lines are written in input
order; every input line ends in exactly one of the output and error files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from batchgen.files import replaced
from batchgen.items import DataError

CHAT, COMPLETION = "/v1/chat/completions", "/v1/completions"
URLS = (CHAT, COMPLETION)
# The items file's columns: prefixed, so none shadows a column of the publication.
ID, LINE, MESSAGES, PROMPT, MAX_TOKENS, TEMPERATURE = (
    "custom_id", "batch_line", "batch_messages", "batch_prompt", "batch_max_tokens", "batch_temperature")
# Body fields read under OpenAI's names, and vLLM's extra sampling fields (its server takes them too).
SHARED_FIELDS = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                 "stop_token_ids", "user", "metadata", "store", "service_tier", "stream"}
BODY_FIELDS = {CHAT: SHARED_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                      "response_format", "parallel_tool_calls"},
               COMPLETION: SHARED_FIELDS | {"prompt", "logprobs", "echo", "best_of"}}
UNSUPPORTED = {"tools", "tool_choice", "functions", "function_call", "logit_bias", "audio", "modalities",
               "prediction", "web_search_options", "reasoning_effort", "suffix", "stream_options"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class BodyError(ValueError):
    """One field of a request body that batchgen cannot use; `param` names it (e.g. body.messages[0].role)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class BatchRequest:
    """One usable input line: what goes into the items file, and the group's sampling settings."""

    line: int
    custom_id: str
    url: str
    model: str | None
    prompt: list[dict[str, str]] | str  # chat messages, or the completion prompt
    max_tokens: int | None
    temperature: float | None
    sampling: dict[str, Any]  # SamplingSpec fields shared by the line's group
    logprobs: bool = False  # chat: logprobs asked for (top_logprobs is sampling.logprobs)


@dataclass
class LineError:
    """An input line that gets an error line instead of a response."""

    line: int
    custom_id: str | None
    code: str
    message: str
    param: str | None = None
    status_code: int = 400
    body: dict[str, Any] | None = None  # the response of a generated but rejected request


@dataclass
class ParsedBatch:
    requests: list[BatchRequest] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)


def read_batch(path: Path, served_models: set[str] | None = None) -> ParsedBatch:
    """Every non-blank line of an OpenAI Batch input file, as a request or an error naming the line and field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: input file not found" if not path.exists() else f"{path}: is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    parsed, seen = ParsedBatch(), {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if raw.strip():
            outcome = parse_line(number, raw, seen, served_models)
            (parsed.errors if isinstance(outcome, LineError) else parsed.requests).append(outcome)
    if not parsed.requests and not parsed.errors:
        raise DataError(f"{path}: the batch file has no lines")
    return parsed


def parse_line(number: int, raw: str, seen: dict[str, int], served_models: set[str] | None = None
               ) -> BatchRequest | LineError:
    """One input line; `seen` maps the custom_ids read so far to their lines."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        return LineError(number, None, "invalid_json", f"line {number}: not valid JSON: {exc.msg} (column {exc.colno})")
    if not isinstance(record, dict):
        return LineError(number, None, "invalid_json", f"line {number}: expected a JSON object, got "
                                                        f"{type(record).__name__}")
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id.strip():
        return LineError(number, None, "invalid_request", f"line {number}: custom_id: a non-empty string is required",
                         "custom_id")
    if custom_id in seen:
        return LineError(number, custom_id, "duplicate_custom_id",
                         f"line {number}: custom_id {custom_id!r} is already used on line {seen[custom_id]}",
                         "custom_id")
    seen[custom_id] = number

    def error(code: str, param: str, message: str, status: int = 400) -> LineError:
        return LineError(number, custom_id, code, f"line {number}: {param}: {message}", param, status)

    extra = sorted(set(record) - {"custom_id", "method", "url", "body"})
    if extra:
        return error("invalid_request", extra[0], "unknown field (a line has custom_id, method, url and body)")
    if record.get("method", "POST") != "POST":
        return error("invalid_request", "method", f"{record.get('method')!r}: only POST is supported")
    url = record.get("url")
    if url not in URLS:
        return error("invalid_url", "url", f"{url!r} is not supported; use {CHAT} or {COMPLETION}", 404)
    body = record.get("body")
    if not isinstance(body, dict):
        return error("invalid_body", "body", f"expected a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or (served_models and model not in served_models)):
        return error("model_not_found", "body.model", f"the model {model!r} does not exist here; served: "
                     f"{', '.join(sorted(served_models or []))}", 404)
    try:
        return read_body(number, custom_id, url, body)
    except BodyError as exc:
        return error("invalid_body", exc.param, str(exc))


def _number(body: dict[str, Any], name: str, kind: type, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return None
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not whole) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise BodyError(f"body.{name}", f"{value!r} is not {'a whole number' if kind is int else 'a number'}")
    value = kind(value)
    if low is not None and (value <= low if low_open else value < low):
        raise BodyError(f"body.{name}", f"{value!r} is {'not above' if low_open else 'below'} {low}")
    if high is not None and value > high:
        raise BodyError(f"body.{name}", f"{value!r} is above {high}")
    return value


def _messages(value: Any) -> list[dict[str, str]]:
    """OpenAI chat messages as {role, content} text messages (text content parts joined, developer = system)."""
    if not isinstance(value, list) or not value:
        raise BodyError("body.messages", "a non-empty list of messages is required")
    messages = []
    for i, message in enumerate(value):
        where = f"body.messages[{i}]"
        if not isinstance(message, dict):
            raise BodyError(where, "expected an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BodyError(f"{where}.role", f"{role!r} is not supported; use one of {', '.join(ROLES)}")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise BodyError(f"{where}.content[{j}]", f"{kind!r} parts are not supported (text only)")
                texts.append(part["text"])
            content = "\n".join(texts)
        if not isinstance(content, str):
            raise BodyError(f"{where}.content", "text or a list of text parts is required")
        messages.append({"role": ROLES[role], "content": content})
    if messages[-1]["role"] != "user":
        raise BodyError(f"body.messages[{len(messages) - 1}].role", "the last message must be from the user")
    return messages


def _stop(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise BodyError(f"body.{name}", "a string or a list of non-empty strings is required")
    return values


def _json_schema(value: Any) -> dict[str, Any] | None:
    """response_format as a JSON schema for structured outputs (json_object: any object)."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise BodyError("body.response_format.type", "one of text, json_object, json_schema is required")
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return {"type": "object"}
    schema = (value.get("json_schema") or {}).get("schema") if isinstance(value.get("json_schema"), dict) else None
    if not isinstance(schema, dict):
        raise BodyError("body.response_format.json_schema.schema", "a JSON schema object is required")
    return schema


def read_body(number: int, custom_id: str, url: str, body: dict[str, Any]) -> BatchRequest:
    """The line's prompt and sampling settings, under SamplingSpec's names; a BodyError names the bad field."""
    for name in body:
        if name in UNSUPPORTED:
            raise BodyError(f"body.{name}", "not supported by batchgen run-batch")
        if name not in BODY_FIELDS[url]:
            raise BodyError(f"body.{name}", f"unknown field for {url}")
    if body.get("stream"):
        raise BodyError("body.stream", "streaming does not apply to a batch")
    sampling: dict[str, Any] = {}
    for name, kind, low, high in (("top_p", float, 0, 1), ("n", int, 1, 64), ("presence_penalty", float, -2, 2),
                                  ("frequency_penalty", float, -2, 2), ("top_k", int, -1, None),
                                  ("min_p", float, 0, 1), ("repetition_penalty", float, 0, None),
                                  ("min_tokens", int, 0, None)):
        value = _number(body, name, kind, low, high, low_open=name in ("top_p", "repetition_penalty"))
        if value is not None and not (name == "top_k" and value == -1):
            sampling[name] = value
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise BodyError("body.ignore_eos", "true or false is required")
        sampling["ignore_eos"] = body["ignore_eos"]
    if body.get("stop_token_ids") is not None:
        ids = body["stop_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BodyError("body.stop_token_ids", "a list of token ids is required")
        sampling["stop_token_ids"] = ids
    stop = _stop(body.get("stop"), "stop")
    if stop:
        sampling["stop"] = stop
    max_tokens = _number(body, "max_tokens", int, 1)
    chat_logprobs = False
    if url == CHAT:
        prompt: Any = _messages(body.get("messages"))
        limit = _number(body, "max_completion_tokens", int, 1)
        if limit is not None and max_tokens is not None and limit != max_tokens:
            raise BodyError("body.max_completion_tokens", f"{limit} disagrees with max_tokens {max_tokens}; set one")
        max_tokens = limit if limit is not None else max_tokens
        if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
            raise BodyError("body.logprobs", "true or false is required")
        chat_logprobs = bool(body.get("logprobs"))
        top = _number(body, "top_logprobs", int, 0, 20)
        if top is not None and not chat_logprobs:
            raise BodyError("body.top_logprobs", "needs logprobs: true")
        if chat_logprobs:
            sampling["logprobs"] = top or 0
        schema = _json_schema(body.get("response_format"))
        if schema is not None:
            sampling["json_schema"] = schema
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BodyError("body.prompt", "one text prompt is required (a list of prompts or token ids is not "
                            "supported: one line, one prompt)")
        logprobs = _number(body, "logprobs", int, 0, 20)
        if logprobs is not None:
            sampling["logprobs"] = logprobs
        if body.get("echo"):
            raise BodyError("body.echo", "echo is not supported")
        best_of = _number(body, "best_of", int, 1, 64)
        if best_of is not None and best_of != sampling.get("n", 1):
            raise BodyError("body.best_of", f"{best_of} differs from n: every candidate is returned, so set n")
    if "min_tokens" in sampling and max_tokens is not None and sampling["min_tokens"] > max_tokens:
        raise BodyError("body.min_tokens", f"{sampling['min_tokens']} is above max_tokens {max_tokens}")
    temperature = _number(body, "temperature", float, 0, 2)
    return BatchRequest(number, custom_id, url, body.get("model"), prompt, max_tokens, temperature, sampling,
                        chat_logprobs)


def group_name(request: BatchRequest) -> str:
    """The folder of a line's group: its endpoint and a hash of its shared sampling settings."""
    payload = json.dumps({"url": request.url, "sampling": request.sampling, "logprobs": request.logprobs},
                         sort_keys=True)
    kind = "chat" if request.url == CHAT else "completion"
    return f"{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"


def group_requests(requests: list[BatchRequest]) -> dict[str, list[BatchRequest]]:
    """Requests by group, groups in the order of their first line."""
    groups: dict[str, list[BatchRequest]] = {}
    for request in requests:
        groups.setdefault(group_name(request), []).append(request)
    return groups


def item_rows(requests: list[BatchRequest]) -> list[dict[str, Any]]:
    """The items file of one group: one row per request (a blank max_tokens / temperature keeps the job's)."""
    column = MESSAGES if requests and requests[0].url == CHAT else PROMPT
    return [{ID: r.custom_id, LINE: r.line, column: r.prompt, MAX_TOKENS: r.max_tokens, TEMPERATURE: r.temperature}
            for r in requests]


FORBIDDEN_SECTIONS = ("input", "prompt", "output")
# Without --job, a request is answered as OpenAI and vLLM answer it: no expectation, no retry past its max_tokens.
DEFAULT_JOB: dict[str, Any] = {"expectations": {"require_stop": False}, "retry": {"max_passes": 0},
                               "sampling": {"max_tokens": 256}}


LINE_OVERRIDES = {"max_tokens": MAX_TOKENS, "temperature": TEMPERATURE}  # a line's own budget and temperature


def job_for_group(base: dict[str, Any], requests: list[BatchRequest], items_path: Path,
                  out_dir: Path) -> dict[str, Any]:
    """The batch-generation job of one group: the base job (--job, engine flags), the group's settings and items."""
    first = requests[0]
    prompt = ({"style": "chat", "messages_column": MESSAGES} if first.url == CHAT
              else {"style": "completion", "template": "{{ " + PROMPT + " }}"})
    sampling = {**base.get("sampling", {}), **first.sampling, "overrides": LINE_OVERRIDES}
    return {**base, "name": f"{base.get('name', 'openai-batch')}-{group_name(first)}",
            "input": {"path": str(items_path), "format": "jsonl", "id_column": ID},
            "prompt": prompt, "sampling": sampling, "output": {"dir": str(out_dir), "jsonl": False}}


@dataclass
class Publication:
    """What result lines need of a publication: accepted ids, rejections, and every attempt."""

    accepted: set[str]
    rejected: pd.DataFrame  # item_id, stage, reasons, detail
    attempts: pd.DataFrame  # item_id, candidate, attempt, request_key, n_prompt_tokens, text, token_ids, ...
    created: int


def read_publication(directory: Path) -> Publication:
    """The one place that reads a publication's tables (the publication layout lives in batchgen.publish)."""
    import pyarrow.parquet as pq

    from batchgen.publish import ATTEMPTS, REJECTED, RESULTS, read_manifest

    directory = Path(os.path.realpath(directory))
    accepted = pq.read_table(directory / RESULTS, columns=["item_id"]).column("item_id").to_pylist()
    rejected = pq.read_table(directory / REJECTED,
                             columns=["item_id", "stage", "reasons", "detail"]).to_pandas()
    attempts = pq.read_table(directory / ATTEMPTS, columns=[
        "item_id", "candidate", "attempt", "request_key", "n_prompt_tokens", "text", "token_ids", "finish_reason",
        "stop_reason", "logprobs"]).to_pandas()
    manifest = read_manifest(directory)
    created = manifest.finished_at or manifest.started_at
    stamp = int(datetime.fromisoformat(created).timestamp()) if created else int(datetime.now(timezone.utc).timestamp())
    return Publication(set(accepted), rejected, attempts, stamp)


def _short(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


def _chat_logprobs(positions: Any, token_ids: list[int], k: int) -> dict[str, Any]:
    content = []
    for token_id, entries in zip(token_ids, positions):
        entries = list(entries)
        chosen = next((e for e in entries if e["token_id"] == token_id), entries[0])
        top = [e for e in entries if e.get("rank") is not None and e["rank"] <= k][:k]
        content.append({"token": chosen["token"], "logprob": chosen["logprob"],
                        "bytes": list(chosen["token"].encode("utf-8")),
                        "top_logprobs": [{"token": e["token"], "logprob": e["logprob"],
                                          "bytes": list(e["token"].encode("utf-8"))} for e in top]})
    return {"content": content}


def _completion_logprobs(positions: Any, token_ids: list[int], k: int) -> dict[str, Any]:
    tokens, logprobs, tops, offsets, offset = [], [], [], [], 0
    for token_id, entries in zip(token_ids, positions):
        entries = list(entries)
        chosen = next((e for e in entries if e["token_id"] == token_id), entries[0])
        tokens.append(chosen["token"])
        logprobs.append(chosen["logprob"])
        tops.append({e["token"]: e["logprob"] for e in entries
                     if e.get("rank") is not None and e["rank"] <= k or e is chosen})
        offsets.append(offset)
        offset += len(chosen["token"])
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": tops}


def response_body(request: BatchRequest, attempts: pd.DataFrame, model: str, created: int) -> dict[str, Any]:
    """A chat.completion or text_completion body from a request's attempts: each candidate's last attempt is a
    choice; usage counts the prompt's tokens once and every choice's output tokens."""
    last = attempts.sort_values(["candidate", "attempt"]).groupby("candidate", sort=True).tail(1)
    chat = request.url == CHAT
    k = request.sampling.get("logprobs")
    choices, completion_tokens = [], 0
    for row in last.itertuples(index=False):
        token_ids = [int(t) for t in row.token_ids]
        completion_tokens += len(token_ids)
        logprobs = None
        if k is not None and row.logprobs is not None and (request.logprobs or not chat):
            logprobs = (_chat_logprobs if chat else _completion_logprobs)(row.logprobs, token_ids, k)
        choice: dict[str, Any] = {"index": int(row.candidate)}
        if chat:
            choice["message"] = {"role": "assistant", "content": row.text, "refusal": None, "annotations": None,
                                 "audio": None, "function_call": None}
        else:
            choice["text"] = row.text
        choice.update({"logprobs": logprobs, "finish_reason": row.finish_reason,
                       "stop_reason": None if pd.isna(row.stop_reason) else row.stop_reason})
        choices.append(choice)
    prompt_tokens = int(last["n_prompt_tokens"].iloc[0])
    key = str(last["request_key"].iloc[0])
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{key}", "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "choices": choices, "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": None,
                      "completion_tokens_details": None}}


STATUS = {"load": 400, "prompt": 400, "validate": 422, "generate": 500}


def outcomes(requests: list[BatchRequest], publication: Publication, model: str
             ) -> dict[int, dict[str, Any] | LineError]:
    """Each request's response body (accepted) or LineError (rejected), by input line."""
    attempts = {item_id: frame for item_id, frame in publication.attempts.groupby("item_id", sort=False)}
    rejected = {row.item_id: row for row in publication.rejected.itertuples(index=False)}
    done: dict[int, dict[str, Any] | LineError] = {}
    for request in requests:
        model_name = request.model or model
        if request.custom_id in publication.accepted:
            done[request.line] = response_body(request, attempts[request.custom_id], model_name, publication.created)
        elif request.custom_id in rejected:
            row = rejected[request.custom_id]
            reasons = list(row.reasons)
            body = (response_body(request, attempts[request.custom_id], model_name, publication.created)
                    if request.custom_id in attempts else None)
            detail = row.detail or f"failed: {', '.join(reasons)}"
            done[request.line] = LineError(request.line, request.custom_id, reasons[0] if reasons else row.stage,
                                           f"line {request.line}: {detail}", None, STATUS.get(row.stage, 400), body)
        else:  # the flow publishes every item once; a missing one is a bug, never a data problem
            raise AssertionError(f"line {request.line} ({request.custom_id!r}) is missing from the publication")
    return done


def result_line(line: int, custom_id: str | None, outcome: dict[str, Any] | LineError, batch: str) -> dict[str, Any]:
    """One line of the output (a response) or the error file (an error, and the response when there was one)."""
    request_id = f"batchgen-{_short(batch, str(line), custom_id or '')}"
    if isinstance(outcome, LineError):
        error = {"code": outcome.code, "message": outcome.message, "param": outcome.param, "line": outcome.line}
        return {"id": f"batch_req_{_short(batch, 'line', str(line))}", "custom_id": outcome.custom_id,
                "response": {"status_code": outcome.status_code, "request_id": request_id, "body": outcome.body},
                "error": error}
    return {"id": f"batch_req_{_short(batch, 'line', str(line))}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": outcome}, "error": None}


def write_jsonl_atomic(records: list[dict[str, Any]], path: Path) -> None:
    """Write JSONL lines to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_results(parsed: ParsedBatch, done: dict[int, dict[str, Any] | LineError], output: Path, errors: Path,
                  batch: str) -> dict[str, int]:
    """The output file (responses) and the error file (errors), each in input order; returns their counts."""
    custom_ids = {r.line: r.custom_id for r in parsed.requests}
    everything = {**done, **{e.line: e for e in parsed.errors}}
    missing = [r.line for r in parsed.requests if r.line not in everything]
    if missing:
        raise AssertionError(f"lines without a result: {missing[:10]}")
    answered, failed = [], []
    for line in sorted(everything):
        outcome = everything[line]
        record = result_line(line, custom_ids.get(line), outcome, batch)
        (failed if isinstance(outcome, LineError) else answered).append(record)
    write_jsonl_atomic(answered, output)
    write_jsonl_atomic(failed, errors)
    return {"lines": len(everything), "completed": len(answered), "failed": len(failed)}


def default_error_file(output: Path) -> Path:
    """results.jsonl -> results.errors.jsonl, beside it."""
    output = Path(output)
    return output.with_name(f"{output.stem}.errors{output.suffix or '.jsonl'}")


def default_work_dir(output: Path) -> Path:
    """Where the groups' runs keep their publications and result stores: results.jsonl -> results.batchgen/."""
    output = Path(output)
    return output.with_name(f"{output.stem}.batchgen")


def base_job(job_file: Path | None, engine: dict[str, Any]) -> dict[str, Any]:
    """The settings every group's job shares: --job's sections (all but input, prompt and output, which the batch
    file gives), the engine flags over its engine section. Checked here, so a mistake names the job file's field."""
    from batchgen.job import JobError, job_from_dict

    data: dict[str, Any] = {}
    source = "run-batch"
    if job_file is not None:
        import yaml

        job_file = Path(job_file)
        if not job_file.is_file():
            raise JobError(f"{job_file}: no such job file")
        try:
            data = yaml.safe_load(job_file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise JobError(f"{job_file}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise JobError(f"{job_file}: the job must be a mapping of sections (engine, sampling, expectations, ...)")
        source = str(job_file)
        for section in FORBIDDEN_SECTIONS:
            if section in data:
                raise JobError(f"{job_file}: {section}: run-batch takes it from the batch file; leave it out")
        if "overrides" in (data.get("sampling") or {}):
            raise JobError(f"{job_file}: sampling.overrides: run-batch sets them (max_tokens, temperature per line)")
    base = {**DEFAULT_JOB, **data}
    base["sampling"] = {**DEFAULT_JOB["sampling"], **(data.get("sampling") or {})}
    base["engine"] = {**(data.get("engine") or {}), **{k: v for k, v in engine.items() if v is not None}}
    # every section but the batch's own, checked once with stand-ins for input, prompt and output, and the per-line
    # budgets and temperatures every group's job has (job_for_group)
    job_from_dict({**base, "input": {"path": "requests.jsonl"}, "prompt": {"template": "x"},
                   "output": {"dir": "out"}, "sampling": {**base["sampling"], "overrides": LINE_OVERRIDES}},
                  base_dir=job_file.parent.resolve() if job_file else None, source=source)
    return base


def served_names(model: str | None, served: list[str] | None) -> set[str]:
    """The names a line's body.model may use: --served-model-name, else --model as given and its folder name."""
    from batchgen.models import DEFAULT_MODEL

    if served:
        return set(served)
    if model is None:
        return {DEFAULT_MODEL}
    return {model, os.path.basename(os.path.normpath(model))}


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def run_batch_file(input_file: Path, output_file: Path, error_file: Path, work_dir: Path, base: dict[str, Any],
                   served: set[str], run_flow: Any, log: Any = print) -> dict[str, Any]:
    """Read the batch file, run the batch-generation flow once per group (`run_flow(JobSpec)`), write both files.

    A group whose job is refused (e.g. a response_format schema the flow cannot use) gives each of its lines an
    error line with the job's message; the other groups run."""
    from batchgen.job import JobError, job_from_dict

    parsed = read_batch(input_file, served)
    batch = file_digest(input_file)
    model = min(served)
    done: dict[int, dict[str, Any] | LineError] = {}
    groups = group_requests(parsed.requests)
    log(f"run-batch: {len(parsed.requests) + len(parsed.errors)} lines, {len(parsed.errors)} refused, "
        f"{len(groups)} group(s) of sampling settings")
    for name, requests in groups.items():
        folder = Path(work_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        items = folder / "requests.jsonl"
        write_jsonl_atomic(item_rows(requests), items)
        try:
            spec = job_from_dict(job_for_group(base, requests, items, folder), source=f"group {name}")
        except JobError as exc:
            message = str(exc).replace("\n", ";")
            for request in requests:
                done[request.line] = LineError(request.line, request.custom_id, "invalid_body",
                                               f"line {request.line}: {message}", "body")
            continue
        log(f"run-batch: group {name}: {len(requests)} lines -> {folder}")
        run_flow(spec)
        done.update(outcomes(requests, read_publication(folder / "current"), model))
    counts = write_results(parsed, done, output_file, error_file, batch)
    return {"output_file": str(output_file), "error_file": str(error_file), "work_dir": str(work_dir),
            "groups": list(groups), **counts}
