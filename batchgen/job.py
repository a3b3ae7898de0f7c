"""The job: one typed config per run, validated before anything heavy starts.

Engine arguments and sampling parameters are separate groups and use vLLM's own names,
so a user who knows `LLM(...)` and `SamplingParams(...)` already knows the job file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class JobError(ValueError):
    """A job that cannot run. The message names the field and says why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(_Section):
    path: str = Field(description="CSV, JSONL or Parquet file, one item per row.")
    format: Literal["csv", "jsonl", "parquet"] | None = Field(
        None, description="File format; taken from the suffix when absent."
    )
    id_column: str | None = Field(
        None, description="Column with a unique item id; otherwise a stable id is hashed from the row."
    )
    limit: int | None = Field(None, ge=1, description="Use only the first N rows.")


class PromptSpec(_Section):
    style: Literal["chat", "completion"] = Field(
        "chat",
        description="chat: system + user messages through the model's chat template; completion: raw text.",
    )
    system: str | None = Field(None, description="System message template (chat style only).")
    template: str = Field(
        min_length=1,
        description="User message (chat) or the whole prompt (completion): a Jinja template over the row's columns.",
    )

    @model_validator(mode="after")
    def _system_needs_chat(self) -> PromptSpec:
        if self.system is not None and self.style != "chat":
            raise ValueError("a system message needs style 'chat'")
        return self


class EngineSpec(_Section):
    model: str | None = Field(
        None,
        description="Local model folder or hub id; the embedded SmolLM2-135M-Instruct when absent.",
    )
    dtype: str = Field("auto", description="vLLM dtype: auto, bfloat16, float16, float32.")
    max_model_len: int | None = Field(None, ge=16, description="Context length; the model's own when absent.")
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may use (default 0.9). On CPU builds: share of RAM kept for "
        "the KV cache (default 0.1).",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split across (tensor parallel).")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages one model is split across.")
    enforce_eager: bool | None = Field(
        None,
        description="Skip graph capture. Default: on for CPU builds (3x faster start, same speed), off on GPUs.",
    )
    seed: int = Field(0, description="Engine seed (vLLM seeds the engine, not each request).")
    max_num_seqs: int | None = Field(None, ge=1, description="Sequences batched at once; vLLM's default when absent.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Any other vllm.LLM keyword argument, passed through unchanged."
    )


class SamplingSpec(_Section):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, description="Keep the k most likely tokens; all when absent.")
    min_p: float = Field(0.0, ge=0, le=1)
    max_tokens: int = Field(16, ge=1, description="Token budget of the first pass.")
    min_tokens: int = Field(0, ge=0)
    n: int = Field(1, ge=1, le=64, description="Candidates per item.")
    stop: list[str] = Field(default_factory=list, description="Strings that end generation (not kept in the text).")
    stop_token_ids: list[int] = Field(default_factory=list)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    logprobs: int | None = Field(None, ge=0, description="Top logprobs per generated token; also fills cumulative_logprob.")
    ignore_eos: bool = False

    @model_validator(mode="before")
    @classmethod
    def _explain_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "seed" in data:
                raise ValueError(
                    "'seed' is set per engine, not per request: use engine.seed "
                    "(a per-request seed with temperature > 0 crashes the CPU engine)"
                )
            if "best_of" in data:
                raise ValueError("vLLM V1 has no best_of: set n to the number of candidates instead")
        return data

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingSpec:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) is larger than max_tokens ({self.max_tokens})")
        return self

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ExpectationsSpec(_Section):
    min_chars: int | None = Field(None, ge=0, description="Shortest acceptable output, in characters.")
    max_chars: int | None = Field(None, ge=1, description="Longest acceptable output, in characters.")
    keyword_column: str | None = Field(
        None, description="Input column whose value must appear in the output (case-insensitive)."
    )
    must_match: list[str] = Field(default_factory=list, description="Regexes every output must match.")
    must_not_match: list[str] = Field(default_factory=list, description="Regexes no output may match.")
    require_stop: bool = Field(True, description="Reject outputs cut off by max_tokens (finish_reason != stop).")

    @field_validator("must_match", "must_not_match")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a valid regex: {exc}") from None
        return patterns

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ExpectationsSpec:
        if self.min_chars is not None and self.max_chars is not None and self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) is larger than max_chars ({self.max_chars})")
        return self


class RetrySpec(_Section):
    max_passes: int = Field(2, ge=0, le=10, description="Extra passes for outputs cut off by max_tokens.")
    strategy: Literal["grow", "continue"] = Field(
        "grow",
        description="grow: regenerate with a bigger budget; continue: extend the cut-off text.",
    )
    growth_factor: float = Field(2.0, gt=1, description="Each pass's total budget is the last one times this.")
    max_tokens_cap: int = Field(1024, ge=1, description="No pass gets a total budget above this.")


class OutputSpec(_Section):
    dir: str = Field(description="Folder the dataset is published to.")
    jsonl: bool = Field(False, description="Also write JSONL mirrors of the Parquet files.")


class JobSpec(_Section):
    name: str = Field("batch-job", min_length=1, description="Shown in logs, the manifest and Prefect.")
    input: InputSpec
    prompt: PromptSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    expectations: ExpectationsSpec = Field(default_factory=ExpectationsSpec)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    output: OutputSpec
    chunk_size: int = Field(
        512, ge=1, description="Prompts per engine call; each finished chunk is committed to disk."
    )

    def fingerprint(self) -> str:
        """Hash of everything that shapes the outputs (not where they are written)."""
        payload = self.model_dump(mode="json", exclude={"output": True, "name": True})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: the job is not valid"]
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see the README for the job file fields)"
        elif err["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn `key.sub=value` strings into a nested dict; values are parsed as YAML scalars."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"override {pair!r}: expected key=value, e.g. sampling.max_tokens=64")
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise JobError(f"override {pair!r}: {part} is set twice")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _anchor_paths(data: dict[str, Any], base_dir: Path) -> None:
    """Relative input and output paths are relative to the job file, not the working directory."""
    for section, key in (("input", "path"), ("output", "dir")):
        value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        if isinstance(value, str) and value and "://" not in value and not Path(value).is_absolute():
            data[section][key] = str((base_dir / value).resolve())


def job_from_dict(data: dict[str, Any], base_dir: Path | None = None, source: str = "job",
                  overrides: dict[str, Any] | None = None) -> JobSpec:
    """Validate a job given as a mapping; relative paths resolve against base_dir (default: cwd)."""
    if not isinstance(data, dict):
        raise JobError(f"{source}: the job must be a mapping of sections (input, prompt, ...), got {type(data).__name__}")
    data = _merge(data, overrides or {})
    _anchor_paths(data, (base_dir or Path.cwd()))
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise JobError(_format_validation_error(exc, source)) from None


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read and validate a YAML job file."""
    path = Path(path)
    if not path.is_file():
        raise JobError(f"{path}: no such job file" if not path.exists() else f"{path}: is not a file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise JobError(f"{path}: not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise JobError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return job_from_dict(data, base_dir=path.parent.resolve(), source=str(path), overrides=overrides)
