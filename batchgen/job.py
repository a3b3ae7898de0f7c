"""The job: one typed config per run, validated before anything heavy starts.

Engine arguments and sampling parameters are separate groups and use vLLM's own names,
so a user who knows `LLM(...)` and `SamplingParams(...)` already knows the job file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from batchgen.records import ACCEPTED_FIELDS, OPTIONAL_RESULT_SCHEMA
from batchgen.vllm_sampling import passthrough_problem


class JobError(ValueError):
    """A job that cannot run. The message names the field and says why."""


JOB_MISTAKE_TAG = "batchgen-job-mistake"  # on a flow run that failed on a JobError: not to be run again as it is


AT = "@"  # a model validator's message "@field: ..." is about that field of the model (see _format_validation_error)


def _top_types(annotation: Any) -> set[Any]:
    """The types a field's value may have, through unions and Annotated (list[int] is a list: its items are not
    looked into)."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return set().union(*(_top_types(arg) for arg in get_args(annotation)))
    if origin is Annotated:
        return _top_types(get_args(annotation)[0])
    return {annotation if origin is None else origin}


def _number_not_bool(annotation: Any) -> bool:
    """Whether a field takes a number and not true/false: pydantic would read true as 1 there."""
    types = _top_types(annotation)
    return bool(types & {int, float}) and not types & {bool, Any}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's true/false where a number is expected is a mistake, not 1 or 0 (pydantic would take it as one:
        `limit: true` would read one row)."""
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _number_not_bool(field.annotation):
                raise ValueError(f"a number is expected, not {str(value).lower()}")
        return value


class InputSpec(_Section):
    path: str = Field(description="The items, one per row: a CSV, JSONL, JSON-array or Parquet file, a folder or "
                      "glob of Parquet files, a datasets save_to_disk folder; local or an s3:// or gs:// URL.")
    format: Literal["csv", "jsonl", "json", "parquet"] | None = Field(
        None, description="File format; taken from the suffix when absent (a folder: Parquet)."
    )
    id_column: str | None = Field(
        None, description="Column with a unique item id; otherwise a stable id is hashed from the row."
    )
    limit: int | None = Field(None, ge=1, description="Use only the first N rows.")
    shard_count: int | None = Field(
        None, ge=1, description="Split the input into this many shards by a stable hash of the item id...")
    shard_index: int | None = Field(None, ge=0, description="...and take only this one (0-based).")

    @model_validator(mode="after")
    def _shard_pair(self) -> InputSpec:
        if (self.shard_count is None) != (self.shard_index is None):
            raise ValueError("set shard_count and shard_index together")
        if self.shard_count is not None and self.shard_index >= self.shard_count:
            raise ValueError(f"shard_index {self.shard_index} is not below shard_count {self.shard_count}")
        return self


# apply_chat_template arguments batchgen sets itself: not variables chat_template_kwargs may pass.
CHAT_TEMPLATE_OWN = {"conversation", "chat_template", "tokenize", "add_generation_prompt", "return_dict",
                     "return_tensors", "padding", "truncation", "max_length", "return_assistant_tokens_mask"}


class PromptSpec(_Section):
    style: Literal["chat", "completion"] = Field(
        "chat",
        description="chat: system + user messages through the model's chat template; completion: raw text.",
    )
    system: str | None = Field(None, description="System message template (chat style only).")
    template: str | None = Field(
        None,
        min_length=1,
        description="User message (chat) or the whole prompt (completion): a Jinja template over the row's columns.",
    )
    messages_column: str | None = Field(
        None,
        min_length=1,
        description="Instead of a template: an input column holding a whole conversation, a list of "
        "{role, content} messages (a JSON string in CSV), rendered with the model's chat template.",
    )
    chat_template: str | None = Field(
        None, min_length=1,
        description="The chat template to render conversations with instead of the model's own: a file "
        "(relative to the job file) or the template itself (any text with a Jinja tag).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the chat template, e.g. {enable_thinking: false} for a model whose "
        "template reads it (passed to the tokenizer's apply_chat_template).",
    )

    def chat_template_text(self) -> str | None:
        """The chat template itself: the file's text, or the string given."""
        if self.chat_template is None or is_template_text(self.chat_template):
            return self.chat_template
        return Path(self.chat_template).read_text(encoding="utf-8")

    @model_validator(mode="after")
    def _system_needs_chat(self) -> PromptSpec:
        if self.system is not None and self.style != "chat":
            raise ValueError("a system message needs style 'chat'")
        if self.template is None and self.messages_column is None:
            raise ValueError("prompt.template is missing: set a template (Jinja) or messages_column (a column of chat messages)")
        if self.template is not None and self.messages_column is not None:
            raise ValueError("set either template or messages_column, not both")
        if self.messages_column is not None and self.style != "chat":
            raise ValueError("messages_column needs style 'chat'")
        for name in ("chat_template", "chat_template_kwargs"):
            if getattr(self, name) and self.style != "chat":
                raise ValueError(f"{AT}{name}: needs style 'chat' (a completion prompt is sent as it is)")
        taken = sorted(set(self.chat_template_kwargs) & CHAT_TEMPLATE_OWN)
        if taken:
            raise ValueError(f"{AT}chat_template_kwargs: {', '.join(taken)} is set by batchgen, not a template "
                             f"variable")
        if self.chat_template is not None and not is_template_text(self.chat_template):
            path = Path(self.chat_template)
            if not path.is_file():
                raise ValueError(f"{AT}chat_template: {path}: no such file (a chat template given inline needs a "
                                 f"Jinja tag such as {{{{ or {{%)")
            try:
                path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{AT}chat_template: {path}: cannot be read ({exc})") from None
        if self.chat_template is not None:
            import jinja2.sandbox

            try:  # as transformers compiles it: a sandboxed environment with the loop controls extension
                jinja2.sandbox.ImmutableSandboxedEnvironment(
                    extensions=["jinja2.ext.loopcontrols"]).parse(self.chat_template_text())
            except jinja2.TemplateSyntaxError as exc:
                raise ValueError(f"{AT}chat_template: not a valid Jinja template: line {exc.lineno}: "
                                 f"{exc.message}") from None
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
        description="Share of GPU memory vLLM may use (default 0.9). On CPU builds: share of RAM to reserve, "
        "model included; when absent a CPU engine gets a fixed 2 GiB KV cache (kv_cache_memory_bytes).",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split across (tensor parallel).")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages one model is split across.")
    enforce_eager: bool | None = Field(
        None,
        description="Skip graph capture. Default: on for CPU builds (3x faster start, same speed), off on GPUs.",
    )
    seed: int = Field(0, description="Engine seed (vLLM seeds the engine, not each request).")
    multiprocessing: bool | None = Field(
        None,
        description="Run vLLM's engine core and model worker in processes of their own "
        "(VLLM_ENABLE_V1_MULTIPROCESSING). Default: vLLM's (on) on GPUs and with tensor or pipeline "
        "parallelism; off on CPU builds, where one process started 3.6x faster and generated 1.7x "
        "faster on 2 cores. The first engine of a process decides for the process.",
    )
    front_end_process: bool | None = Field(
        None,
        description="Run vLLM's front end (adding requests, detokenizing, building outputs) and batchgen's engine "
        "stream in a process of their own, so that the pipeline's own work (prompts, validation, staging, "
        "Prefect) never shares an interpreter lock with it. Default: on GPUs yes; on CPU builds no, where the "
        "engine needs every core.",
    )
    max_num_seqs: int | None = Field(None, ge=1, description="Sequences batched at once; vLLM's default when absent.")
    enable_lora: bool = Field(False, description="Load the model with LoRA support (vllm.LLM enable_lora), so "
                              "requests can use the adapters of lora_adapters.")
    max_lora_rank: int | None = Field(None, ge=1, description="Largest adapter rank (vLLM's max_lora_rank, 16 "
                                      "when absent); an adapter of a higher rank is a job error.")
    max_loras: int | None = Field(None, ge=1, description="Adapters in one batch at once (vLLM's max_loras).")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters by name: {name: folder} (a PEFT adapter folder, relative "
        "to the job file, with adapter_config.json).")
    lora: str | None = Field(None, min_length=1, description="The adapter (a name in lora_adapters) every "
                             "request uses, unless its row names another in lora_column.")
    lora_column: str | None = Field(None, min_length=1, description="An input column naming each row's adapter "
                                    "(a blank cell: lora, else the base model); an unknown name rejects the row.")

    @model_validator(mode="after")
    def _lora_complete(self) -> EngineSpec:
        asks = [name for name in ("max_lora_rank", "max_loras", "lora", "lora_column") if getattr(self, name)]
        if (asks or self.lora_adapters) and not self.enable_lora:
            raise ValueError(f"{', '.join(asks or ['lora_adapters'])} needs enable_lora: true")
        if (self.lora or self.lora_column) and not self.lora_adapters:
            raise ValueError(f"{AT}lora_adapters: name the adapters {'lora' if self.lora else 'lora_column'} "
                             f"may choose, as {{name: folder}}")
        if self.lora is not None and self.lora not in self.lora_adapters:
            raise ValueError(f"{AT}lora: {self.lora!r} is not in lora_adapters ({', '.join(self.lora_adapters)})")
        rank_limit = self.max_lora_rank or 16
        for name, folder in self.lora_adapters.items():
            config = Path(folder) / "adapter_config.json"
            if not config.is_file():
                raise ValueError(f"{AT}lora_adapters.{name}: {folder}: no adapter_config.json (a PEFT LoRA adapter "
                                 f"folder holds it and adapter_model.safetensors)")
            try:
                rank = int(json.loads(config.read_text(encoding="utf-8")).get("r") or 0)
            except (ValueError, OSError) as exc:
                raise ValueError(f"{AT}lora_adapters.{name}: {config}: not readable JSON ({exc})") from None
            if rank > rank_limit:
                raise ValueError(f"{AT}lora_adapters.{name}: rank {rank} is above max_lora_rank {rank_limit}; "
                                 f"set engine.max_lora_rank: {rank}")
        return self
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Any other vllm.LLM keyword argument, passed through unchanged."
    )


SELECTIONS = ("first_passing", "max_logprob", "all")
OVERRIDABLE = ("max_tokens", "temperature")
STRUCTURED = ("json_schema", "regex", "choice", "grammar")  # sampling fields that constrain decoding

class SamplingSpec(_Section):
    # Any other field of vllm.SamplingParams is accepted under its own name (checked against the installed
    # vLLM's class, types included) and passed through; see `passthrough`.
    model_config = ConfigDict(extra="allow")

    temperature: float = Field(1.0, ge=0, description="Randomness of sampling; 0 is greedy (always the most likely token).")
    top_p: float = Field(1.0, gt=0, le=1, description="Sample from the smallest set of tokens whose probabilities add up to this; 1 keeps all.")
    top_k: int | None = Field(None, description="Keep the k most likely tokens; all when absent.")
    min_p: float = Field(0.0, ge=0, le=1, description="Drop tokens less likely than this fraction of the most likely one; 0 keeps all.")
    max_tokens: int = Field(16, ge=1, description="Token budget of the first pass.")
    min_tokens: int = Field(0, ge=0, description="Tokens generated before end-of-sequence or a stop string may end the output.")
    n: int = Field(1, ge=1, le=64, description="Candidates per item.")
    stop: list[str] = Field(default_factory=list, description="Strings that end generation (not kept in the text).")
    stop_token_ids: list[int] = Field(default_factory=list, description="Token ids that end generation.")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="Penalise tokens already in the output (> 0: new topics; < 0: repetition).")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="Penalise tokens by how often they are already in the output.")
    repetition_penalty: float = Field(1.0, gt=0, description="Penalise tokens of the prompt and output; > 1 repeats less, 1 is off.")
    logprobs: int | None = Field(
        None, ge=0, le=20,
        description="Top logprobs per generated token, published in the logprobs column; cumulative_logprob is kept too.",
    )
    ignore_eos: bool = Field(False, description="Keep generating past the end-of-sequence token, up to max_tokens.")
    seed: int | None = Field(
        None,
        description="Per-request seed (SamplingParams.seed): each request draws the same random numbers in every "
        "run (its output may still change with what shares its engine step: docs/generation.md); candidate i "
        "gets seed+i, a resampled attempt a fresh seed. CPU builds: only with temperature 0 (a seeded request "
        "with temperature > 0 crashes the CPU engine); engine.seed seeds the engine instead.",
    )
    keep_logprob: bool = Field(
        False,
        description="Ask the engine for cumulative_logprob even when nothing needs it. It is asked for only when "
        "the job ranks candidates by it (n > 1, selection max_logprob, beam search) or sets logprobs: on a GPU "
        "it cost ~40% of the throughput of a small model.",
    )
    selection: Literal["first_passing", "max_logprob", "all"] = Field(
        "first_passing",
        description="Which of an item's candidates is published. first_passing: the best-scored candidate that "
        "passes every expectation; max_logprob: the candidate with the highest cumulative_logprob (rejected "
        "when it fails an expectation); all: every passing candidate, one results row each (the item is "
        "rejected when none passes).",
    )
    best_of: int | None = Field(
        None, ge=1, le=64,
        description="vLLM V0's best_of, which V1 dropped: read as n=best_of candidates and selection max_logprob.",
    )
    use_beam_search: bool = Field(False, description="Beam search (LLM.beam_search) instead of sampling.")
    beam_width: int | None = Field(None, ge=1, le=64, description="Beams kept per step; n when absent. Each "
                                   "finished beam is a candidate, ranked by vLLM's beam score.")
    length_penalty: float = Field(1.0, description="Beam search: score = cumulative_logprob / length**length_penalty.")
    json_schema: dict[str, Any] | None = Field(
        None,
        description="A JSON schema that constrains decoding (vLLM structured outputs, StructuredOutputsParams(json=...)); "
        "outputs are checked against it and its top-level properties are published as columns.",
    )
    regex: str | None = Field(
        None, min_length=1,
        description="A regex every output must match as a whole, enforced while decoding (StructuredOutputsParams"
        "(regex=...)) and checked by the expectation `regex`.",
    )
    choice: list[str] | None = Field(
        None, min_length=1,
        description="The output is exactly one of these strings (StructuredOutputsParams(choice=...)); checked by "
        "the expectation `choice`.",
    )
    grammar: str | None = Field(
        None, min_length=1,
        description="An EBNF (GBNF) grammar the output follows (StructuredOutputsParams(grammar=...)); checked by "
        "the expectation `grammar` with the same grammar engine (xgrammar).",
    )
    overrides: dict[Literal["max_tokens", "temperature"], str] = Field(
        default_factory=dict,
        description="Per-row values: {max_tokens: COLUMN, temperature: COLUMN}; a row's own value replaces the "
        "job's, a blank cell keeps the job's, an invalid one rejects the row.",
    )

    @model_validator(mode="before")
    @classmethod
    def _explain_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("best_of") is not None:
                best_of, n = data["best_of"], data.get("n", 1)
                if isinstance(best_of, int) and n not in (1, best_of):
                    raise ValueError(
                        f"best_of ({best_of}) with n ({n}): batchgen publishes one answer per item, chosen among "
                        f"n candidates; set n to the number of candidates and leave best_of out"
                    )
                data = {**data, "n": best_of}
                data.setdefault("selection", "max_logprob")
        return data

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingSpec:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) is larger than max_tokens ({self.max_tokens})")
        if self.use_beam_search:
            if self.beam_width is not None and self.n not in (1, self.beam_width):
                raise ValueError(f"beam_width ({self.beam_width}) and n ({self.n}) disagree: beam search returns "
                                 f"beam_width candidates; set one of them")
            if self.json_schema is not None:
                raise ValueError("json_schema with use_beam_search is not supported: vLLM's beam search "
                                 "applies no stop strings and only filters structured output per step")
        elif self.beam_width is not None:
            raise ValueError("beam_width needs use_beam_search: true")
        constrained = [name for name in STRUCTURED if getattr(self, name) is not None]
        if len(constrained) > 1:
            raise ValueError(f"{' and '.join(constrained)}: set one structured output constraint, not several")
        if self.use_beam_search and (self.passthrough or self.seed is not None):
            names = [*self.passthrough, *(["seed"] if self.seed is not None else [])]
            raise ValueError(f"{', '.join(names)} with use_beam_search: vLLM's beam search takes only beam_width, "
                             f"max_tokens, length_penalty, temperature and ignore_eos")
        if constrained and self.use_beam_search:
            raise ValueError(f"{constrained[0]} with use_beam_search is not supported: vLLM's beam search "
                             f"only filters structured output per step")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} is not a valid regex: {exc}") from None
        if self.grammar is not None:
            import xgrammar  # the grammar engine of vLLM's structured outputs, installed with vllm

            try:
                xgrammar.Grammar.from_ebnf(self.grammar)
            except Exception as exc:  # xgrammar raises RuntimeError with the parser's message
                raise ValueError(f"grammar is not a valid EBNF grammar: {first_line(str(exc))}") from None
        self._check_passthrough()
        if self.json_schema is not None:
            from jsonschema import Draft202012Validator, SchemaError

            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValueError(f"json_schema is not a valid JSON schema: {exc.message}") from None
        return self

    @property
    def passthrough(self) -> dict[str, Any]:
        """The job's other SamplingParams fields, under vLLM's names, as given."""
        return dict(self.model_extra or {})

    @property
    def structured(self) -> tuple[str, Any] | None:
        """(constraint, value) of the structured output the job asks for, or None."""
        return next(((name, getattr(self, name)) for name in STRUCTURED if getattr(self, name) is not None), None)

    def _check_passthrough(self) -> None:
        if not self.passthrough:
            return  # vLLM is imported only for a job that names one of its other fields
        problem = passthrough_problem(self.passthrough, SamplingSpec.model_fields)
        if problem is not None:
            name, message = problem
            raise ValueError(f"{AT}{name}: {message}" if name else message)

    @property
    def needs_logprob(self) -> bool:
        """Whether the engine must return logprobs: candidates are ranked by them, or the job asks for them."""
        return (self.keep_logprob or self.logprobs is not None or self.candidates > 1
                or self.selection == "max_logprob")

    @property
    def candidates(self) -> int:
        """Candidates per item: the beam width under beam search, n otherwise."""
        if self.use_beam_search:
            return self.beam_width or self.n
        return self.n

    def notes(self) -> list[str]:
        """How the job's sampling settings were read, for the run's log."""
        notes = []
        if self.best_of is not None:
            notes.append(f"best_of={self.best_of} read as n={self.n} candidates per item, selection {self.selection} "
                         f"(vLLM V1 has no best_of: every candidate is generated, validated and kept in attempts)")
        if self.use_beam_search:
            notes.append(f"beam search: beam_width {self.candidates}, length_penalty {self.length_penalty}; "
                         f"stop strings, penalties, top_p/top_k do not apply to vLLM's beam search")
        return notes

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


BUILT_IN_IDS = ("length", "keyword", "must_match", "must_not_match", "truncated", *STRUCTURED)


class GxExpectationSpec(_Section):
    type: str = Field(min_length=1, description="A Great Expectations expectation type as GX names it, e.g. "
                      "expect_column_values_to_match_regex; it must judge each output (a column map expectation).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Its arguments as GX names them; `column` "
                                   "is one of the output columns (text, finish_reason, n_output_tokens, ...).")
    id: str | None = Field(None, min_length=1, description="The name rejected rows' reasons and retry.on use "
                           "for it; the type when absent.")

    @property
    def name(self) -> str:
        return self.id or self.type


class ExpectationsSpec(_Section):
    min_chars: int | None = Field(None, ge=0, description="Shortest acceptable output, in characters.")
    max_chars: int | None = Field(None, ge=1, description="Longest acceptable output, in characters.")
    keyword_column: str | None = Field(
        None, description="Input column whose value must appear in the output (case-insensitive)."
    )
    must_match: list[str] = Field(default_factory=list, description="Regexes every output must match.")
    must_not_match: list[str] = Field(default_factory=list, description="Regexes no output may match.")
    require_stop: bool = Field(True, description="Reject outputs cut off by max_tokens (finish_reason != stop).")
    gx: list[GxExpectationSpec] = Field(
        default_factory=list,
        description="Great Expectations' own expectations, besides the ones above: each a type and its kwargs "
        "as GX names them, applied to the output columns; an output failing one is rejected with its id.",
    )

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
        seen: set[str] = set()
        for number, entry in enumerate(self.gx):
            where = f"{AT}gx.{number}"
            if entry.name in BUILT_IN_IDS:
                raise ValueError(f"{where}: id {entry.name!r} is a built-in expectation's; choose another")
            if "keyword_present" in entry.kwargs.values() and not self.keyword_column:
                raise ValueError(f"{where}: keyword_present needs expectations.keyword_column")
            if entry.name in seen:
                raise ValueError(f"{where}: {entry.name!r} is used twice; give each an id of its own")
            seen.add(entry.name)
        if self.gx:
            from batchgen.gx_expectations import gx_expectation  # GX is imported only for a job that names one

            for number, entry in enumerate(self.gx):
                try:
                    gx_expectation(entry)
                except ValueError as exc:
                    raise ValueError(f"{AT}gx.{number}: {exc}") from None
        return self

    def ids(self, structured: str | None = None) -> list[str]:
        """The ids of the job's expectations, as rejected rows' reasons name them (the suite's meta.batchgen_id);
        `structured`: the job's structured output constraint (json_schema, regex, choice, grammar), if any."""
        ids = [structured] if structured else []
        if self.min_chars is not None or self.max_chars is not None:
            ids.append("length")
        if self.keyword_column:
            ids.append("keyword")
        ids += ["must_match"] * bool(self.must_match) + ["must_not_match"] * bool(self.must_not_match)
        if self.require_stop:
            ids.append("truncated")
        return ids + [entry.name for entry in self.gx]


CONTINUES = ("continue", "continue_then_grow")  # the retry strategies that continue cut-off text

# Failures retry.on may name beside the expectations' own ids: `regex` stands for every regex expectation.
RETRY_ALIASES = {"regex": ("must_match", "must_not_match", "regex")}


class RetrySpec(_Section):
    max_passes: int = Field(2, ge=0, le=10, description="Extra passes for outputs that fail one of `on`.")
    on: list[str] = Field(
        default_factory=lambda: ["truncated"], min_length=1,
        description="Failures that earn another attempt: truncated (cut off by max_tokens: the budget grows), or "
        "any expectation by its id (length, keyword, must_match, must_not_match, regex for both, json_schema, "
        "a gx expectation's id): the output is sampled again at the same budget.",
    )
    temperature_step: float = Field(
        0.0, ge=-2, le=2,
        description="Resampled attempts: each one's temperature is the last attempt's plus this (within 0 and "
        "max_temperature). With 0 a resample draws again at the same temperature.",
    )
    max_temperature: float = Field(2.0, ge=0, description="No resampled attempt gets a temperature above this.")
    strategy: Literal["grow", "continue", "continue_then_grow"] = Field(
        "grow",
        description="grow: regenerate with a bigger budget; continue: extend the cut-off text; "
        "continue_then_grow: extend it once, and draw a continuation cut off again afresh (with sampling.seed, "
        "under a seed of its own). With sampling.json_schema, regex, choice or grammar only grow: vLLM "
        "would start the constraint over after the cut.",
    )
    growth_factor: float = Field(2.0, gt=1, description="Each pass's total budget is the last one times this.")
    max_tokens_cap: int = Field(1024, ge=1, description="No pass gets a total budget above this; above "
                                "sampling.max_tokens while cut-off outputs are retried (else none could grow).")
    in_stream: bool = Field(
        True,
        description="Cut-off outputs go back into the engine as soon as they are committed, beside the first "
        "pass's requests still running (true), or in a retry pass once their window is validated (false). The "
        "same attempts either way; other failures are always retried in passes, after validation.",
    )
    ahead: bool = Field(
        False,
        description="With grow or continue_then_grow in the stream: a cut-off output's retry also starts the "
        "attempt after it (the one it gets if the retry is cut off too: a draw afresh) while the engine has "
        "room, and drops it if the retry is not cut off. The same attempts and outputs; a chain of cut-offs at "
        "the end of a run takes its longest attempt's time, not the sum of its attempts'. Off by default "
        "(docs/generation.md says what it measured). Refused where it would start nothing: under continue, with "
        "in_stream false, with beam search.",
    )

    @property
    def grows_cut_off(self) -> bool:
        """Whether an output cut off by max_tokens gets another attempt (`truncated` in `on`, passes left)."""
        return self.max_passes > 0 and "truncated" in self.on


class OutputSpec(_Section):
    dir: str = Field(description="Folder the dataset is published to; readers use its `current` link.")
    jsonl: bool = Field(False, description="Also write JSONL mirrors of the Parquet files.")
    keep: int = Field(3, ge=1, description="Publications kept under publications/ (the current one included).")
    publish_to: str | None = Field(
        None, description="Also copy each committed publication to this shared location (`s3://bucket/prefix`, "
        "`gs://…`, or an absolute path); credentials come from the environment, never from the job.")

    @field_validator("publish_to")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from batchgen.urls import check_url

        return check_url(value)


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
        512, ge=1, description="Finished outputs per commit: the engine is fed as a stream, and finished outputs "
        "are committed to disk every chunk_size outputs or commit_seconds, whichever comes first; a crash "
        "loses at most the uncommitted ones."
    )
    commit_seconds: float = Field(
        10.0, gt=0, description="Longest time finished outputs wait before they are committed to disk (a cut-off "
        "output whose retry follows in the stream waits at most 0.25 s: its retry is sent once it is committed)."
    )
    window_size: int = Field(
        2048, ge=1, description="Items in flight: prompts, generation, validation, retries and staging run a "
                                "window of items at a time (a few windows at once, windows_in_flight), so memory does "
                                "not grow with the input. Each window costs a fixed amount besides its items (four "
                                "Prefect task runs and a GX validation): a larger window spends less on them and holds "
                                "more rows in memory (the pipeline alone, 2 cores: 8192 ran 1.37x faster than 2048, "
                                "with twice the memory; docs/benchmarks.md)."
    )
    windows_in_flight: int | None = Field(
        None, ge=1, le=8, description="Windows feeding the engine their first pass at once: while the engine "
        "generates one window, the next one's prompts are built; a window whose first pass is done leaves its "
        "place to the next one while its retries, validation and staging go on (at most eight times this many "
        "windows are held: a cut-off output's retries take far longer than a window's first pass). Default: 3 on GPUs; 1 on CPU builds, where the engine itself needs every core."
    )

    @model_validator(mode="after")
    def _structured_columns_free(self) -> JobSpec:
        # the published columns a JSON field must not shadow
        reserved = set(ACCEPTED_FIELDS) | set(OPTIONAL_RESULT_SCHEMA.names)
        for name in (self.sampling.json_schema or {}).get("properties", {}):
            if name in reserved:
                raise ValueError(f"{AT}sampling.json_schema: property {name!r} would be published as a column, but "
                                 f"results already have a column {name!r}; rename the property")
        return self

    @model_validator(mode="after")
    def _lora_with_sampling(self) -> JobSpec:
        if self.sampling.use_beam_search and (self.engine.lora or self.engine.lora_column):
            raise ValueError("engine.lora with use_beam_search is not supported: batchgen's beam search calls "
                             "LLM.beam_search without adapters")
        return self

    @model_validator(mode="after")
    def _retry_on_known(self) -> JobSpec:
        structured = self.sampling.structured
        known = set(self.expectations.ids(structured[0] if structured else None)) | {"truncated"}
        for name in self.retry.on:
            covered = RETRY_ALIASES.get(name, (name,))
            if not known.intersection(covered):
                raise ValueError(f"{AT}retry.on: {name!r} is not an expectation of this job; it has "
                                 f"{', '.join(sorted(known))}")
        resamples = set(self.retry.on) - {"truncated"}
        if resamples and self.sampling.use_beam_search:
            raise ValueError(f"{AT}retry.on: {', '.join(sorted(resamples))} would resample, but beam search is "
                             f"deterministic; with use_beam_search only truncated is retried")
        if (resamples and self.sampling.temperature == 0 and self.retry.temperature_step <= 0
                and "temperature" not in self.sampling.overrides):
            raise ValueError(f"{AT}retry.on: {', '.join(sorted(resamples))} resamples at temperature 0, which repeats "
                             f"the same output; set retry.temperature_step above 0 (e.g. 0.3)")
        return self

    @model_validator(mode="after")
    def _continue_unconstrained(self) -> JobSpec:
        # vLLM's structured outputs constrain the generated tokens from the first, never the prompt: a
        # continuation of cut-off constrained text would start the constraint over after the cut (a second JSON
        # value inside the first), and every continued output would fail its own check.
        structured = self.sampling.structured
        if structured is not None and self.retry.strategy in CONTINUES and self.retry.grows_cut_off:
            raise ValueError(
                f"{AT}retry.strategy: {self.retry.strategy} cannot extend an output constrained by "
                f"sampling.{structured[0]}: vLLM applies the constraint from the continuation's first token, so "
                f"the text after the cut would start it over (a second JSON value inside the first); use "
                f"retry.strategy: grow (a fresh draw with a bigger budget)")
        return self

    @model_validator(mode="after")
    def _ahead_has_something_to_start(self) -> JobSpec:
        # retry.ahead starts a retry's own retry in the generate task's stream (batchgen.retry.stream_retry): where
        # that stream retries nothing, or each retry needs the output before it, the setting would do nothing.
        retry = self.retry
        if not retry.ahead:
            return self
        if retry.strategy == "continue":
            raise ValueError(f"{AT}retry.ahead: under retry.strategy: continue there is nothing to start ahead (each "
                             f"continuation needs the output it continues); use continue_then_grow or grow with it, "
                             f"or drop retry.ahead")
        if not retry.in_stream:
            raise ValueError(f"{AT}retry.ahead: it starts retries in the generate task's stream, and retry.in_stream "
                             f"is false (retries in passes after validation); set retry.in_stream: true or drop "
                             f"retry.ahead")
        if self.sampling.use_beam_search:
            raise ValueError(f"{AT}retry.ahead: with sampling.use_beam_search cut-off outputs are retried in passes, "
                             f"not in the stream; drop retry.ahead")
        return self

    @model_validator(mode="after")
    def _cut_off_outputs_can_grow(self) -> JobSpec:
        # a budget that cannot grow gives a cut-off output no retry at all (batchgen.retry.grow_request): it would be
        # rejected as truncated while the job says it is retried. Rows with budgets of their own (a max_tokens
        # column, as run-batch's lines have) are not the job's setting.
        budget, cap = self.sampling.max_tokens, self.retry.max_tokens_cap
        if self.retry.grows_cut_off and cap <= budget and "max_tokens" not in self.sampling.overrides:
            raise ValueError(
                f"{AT}retry.max_tokens_cap: {cap} is not above sampling.max_tokens {budget}, so an output cut off by "
                f"max_tokens could not get a bigger budget and would be rejected without a retry; raise "
                f"retry.max_tokens_cap (e.g. {budget * 4}), or set retry.max_passes: 0 to reject cut-off outputs "
                f"as they are")
        return self

    def fingerprint(self) -> str:
        """Hash of everything that shapes the outputs (not where they are written)."""
        payload = self.model_dump(mode="json", exclude={"output": True, "name": True})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def is_template_text(value: str) -> bool:
    """A chat template given inline (it has a Jinja tag), not a file name."""
    return "{{" in value or "{%" in value


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: the job is not valid"]
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        located = re.match(rf"{AT}([\w.]+): (.*)", message, re.S)
        if located:  # a model validator's message about one of the model's fields
            where, message = f"{where}.{located.group(1)}" if where != "(top level)" else located.group(1), located.group(2)
        if err["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; docs/job-reference.md lists every field)"
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
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise JobError(f"override {pair!r}: the value is not valid YAML ({problem}); "
                           f"quote a text value, close every [ and {{") from None
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

    def anchored(value: Any) -> Any:
        if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
            return str((base_dir / value).resolve())
        return value

    engine = data.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("lora_adapters"), dict):
        engine["lora_adapters"] = {name: anchored(folder) for name, folder in engine["lora_adapters"].items()}
    for section, key in (("input", "path"), ("output", "dir"), ("output", "publish_to"), ("prompt", "chat_template")):
        value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        if key == "chat_template" and isinstance(value, str) and is_template_text(value):
            continue  # a template given inline
        if value:
            data[section][key] = anchored(value)


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
