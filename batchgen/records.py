"""The records that travel between the flow's stages, each column named once.

A request goes into the engine; an attempt comes out (one per candidate); a rejection says why an item is not
published; a tally counts a set of items and adds up across windows and shards; the manifest describes a whole
publication. The Arrow schemas of the stored and published tables are derived from these classes
(`arrow_schema`), so a column's name and type are written here and nowhere else.

This module is the bottom layer with the job config: it imports nothing of batchgen.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

# The top-k logprobs of each generated token (sampling.logprobs), best first.
LOGPROBS_TYPE = pa.list_(pa.list_(pa.struct([
    ("token_id", pa.int32()), ("token", pa.string()), ("logprob", pa.float64()), ("rank", pa.int32()),
])))

I32, I64, F64, TEXT, FLAG = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()
TOKENS, NAMES = pa.list_(pa.int32()), pa.list_(pa.string())
WALL_CLOCK = pa.timestamp("us", tz="UTC")


def arrow_schema(record: type, names: Iterable[str] | None = None) -> pa.Schema:
    """The Arrow schema of a record class: its fields (or `names` of them, in that order), each field's Arrow
    type the `Annotated[..., <pa.DataType>]` of its annotation."""
    hints = get_type_hints(record, include_extras=True)
    chosen = list(names) if names is not None else [f.name for f in dataclasses.fields(record)]
    return pa.schema([pa.field(name, _arrow_type(hints[name], record, name)) for name in chosen])


def _arrow_type(hint: Any, record: type, name: str) -> pa.DataType:
    if get_origin(hint) is Annotated:
        for extra in get_args(hint)[1:]:
            if isinstance(extra, pa.DataType):
                return extra
    raise TypeError(f"{record.__name__}.{name}: no Arrow type in its annotation")


def columns_of(records: list[Any], record: type) -> dict[str, list[Any]]:
    """Records as columns {field: values} (for pa.Table.from_pydict or a DataFrame), without a dict per record."""
    return {f.name: list(map(operator.attrgetter(f.name), records)) for f in dataclasses.fields(record)}


@dataclass
class GenRequest:
    """One engine request. A retry of a cut-off candidate is a request of its own (n=1)."""

    item_id: str
    prompt: str
    prompt_token_ids: list[int]
    max_tokens: int  # the total budget of this attempt, prefix included
    attempt: int = 1
    strategy: str = "first"  # first | grow | continue | resample
    candidate: int | None = None  # None on the first pass: candidates come from n
    n: int = 1
    prefix_text: str = ""
    prefix_token_ids: list[int] = field(default_factory=list)
    prefix_logprob: float | None = 0.0
    prefix_logprobs: list[Any] | None = None  # top logprobs of the prefix tokens, when the job asks for them
    temperature: float | None = None  # the row's own temperature (sampling.overrides), else the job's
    lora: str | None = None  # the LoRA adapter's name (engine.lora_adapters), None: the base model
    fresh_seed: bool = False  # with sampling.seed: a seed no other attempt of the candidate had (retry.next_strategy)


@dataclass(slots=True)
class Attempt:
    """One generated candidate of one attempt: a row of the result store and of the published attempts table."""

    item_id: Annotated[str, TEXT]
    candidate: Annotated[int, I32]
    attempt: Annotated[int, I32]
    strategy: Annotated[str, TEXT]
    request_key: Annotated[str, TEXT]
    request_id: Annotated[str, TEXT]
    prompt: Annotated[str, TEXT]
    prompt_token_ids: Annotated[list[int], TOKENS]
    n_prompt_tokens: Annotated[int, I32]
    text: Annotated[str, TEXT]
    token_ids: Annotated[list[int], TOKENS]
    n_output_tokens: Annotated[int, I32]
    new_output_tokens: Annotated[int, I32]
    cumulative_logprob: Annotated[float | None, F64]
    finish_reason: Annotated[str, TEXT]
    stop_reason: Annotated[str | None, TEXT]
    max_tokens: Annotated[int, I32]
    temperature: Annotated[float | None, F64]  # the row's own temperature (sampling.overrides); null: the job's
    lora: Annotated[str | None, TEXT]  # the LoRA adapter's name (engine.lora_adapters); null: the base model
    logprobs: Annotated[list | None, LOGPROBS_TYPE]  # null unless sampling.logprobs is set
    prompt_logprobs: Annotated[list | None, LOGPROBS_TYPE]  # null unless sampling.prompt_logprobs; first position empty
    chunk_seconds: Annotated[float, F64]
    chunk_finished_at: Annotated[datetime | None, WALL_CLOCK]  # wall clock: throughput over the run


@dataclass
class Verdict:
    """What validation adds to an attempt."""

    passed: Annotated[bool, FLAG]
    failed: Annotated[list[str], NAMES]  # the expectation ids it failed


ATTEMPT_SCHEMA = arrow_schema(Attempt)  # the result store's rows
ATTEMPTS_SCHEMA = pa.schema([*ATTEMPT_SCHEMA, *arrow_schema(Verdict)])  # the published attempts table


@dataclass
class Rejection:
    """One input item that is not published as accepted, and why: a row of the rejected table (its input columns
    are added flat when the table is written)."""

    item_id: Annotated[str, TEXT]
    row_number: Annotated[int | None, I64]
    stage: Annotated[str, TEXT]  # load | prompt | generate | validate
    reasons: Annotated[list[str], NAMES]
    detail: Annotated[str, TEXT] = ""
    input: dict[str, Any] | None = None
    # The published candidate that failed (stage validate), else null.
    candidate: Annotated[int | None, I32] = None
    attempt: Annotated[int | None, I32] = None
    text: Annotated[str | None, TEXT] = None
    finish_reason: Annotated[str | None, TEXT] = None
    n_output_tokens: Annotated[int | None, I32] = None


REJECTED_FIELDS = [f.name for f in dataclasses.fields(Rejection)]
REJECTED_SCHEMA = arrow_schema(Rejection, [name for name in REJECTED_FIELDS if name != "input"])


@dataclass
class Published:
    """The columns of an accepted row beyond an attempt's: where it came from and how it was chosen."""

    row_number: Annotated[int, I64]  # the input's data row, from 1
    n_candidates: Annotated[int, I32]
    n_passing: Annotated[int, I32]
    selection: Annotated[str, TEXT]


# The accepted table: the item, then the chosen attempt's columns a reader needs, then the input's own columns.
_ACCEPTED_FROM_ATTEMPT = ("candidate", "attempt", "strategy", "text", "finish_reason", "n_prompt_tokens",
                          "n_output_tokens", "cumulative_logprob", "max_tokens", "request_id", "prompt")
ACCEPTED_BASE_SCHEMA = pa.schema([ATTEMPT_SCHEMA.field("item_id"), arrow_schema(Published).field("row_number"),
                                  *(ATTEMPT_SCHEMA.field(name) for name in _ACCEPTED_FROM_ATTEMPT)])
# Columns a job may add: candidates and selection with n > 1, the row's temperature, logprobs, the adapter.
CHOICE_FIELDS = ["n_candidates", "n_passing", "selection"]  # how the published candidate was chosen
OPTIONAL_RESULT_SCHEMA = pa.schema([*arrow_schema(Published, CHOICE_FIELDS),
                                    *(ATTEMPT_SCHEMA.field(name) for name in ("temperature", "logprobs", "lora"))])
ACCEPTED_FIELDS = [*ACCEPTED_BASE_SCHEMA.names, "input"]  # `input`: the item's input columns, flattened on write


class _Model(BaseModel):
    """A record read as attributes (`manifest.counts.accepted`) or as the JSON it is written as
    (`manifest["counts"]["accepted"]`, `.get`, and equal to that JSON as a dict)."""

    model_config = ConfigDict(extra="allow")  # a newer batchgen's manifest stays readable

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and getattr(self, key, None) is not None

    def keys(self) -> list[str]:
        return [key for key in self.to_json()]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return self.to_json() == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


class Counts(_Model):
    """A manifest's counts: additive, so the counts of disjoint windows (or shards) of a run sum to the run's with
    `+`."""

    items: int = 0
    accepted: int = 0
    rejected: int = 0
    generated_items: int = 0
    truncated_first_pass: int = 0
    truncated_final: int = 0
    attempts: int = 0
    retry_attempts: int = 0
    reused: int = 0  # requests answered from earlier commits
    rejected_by_reason: dict[str, int] = {}
    rescued: int = 0  # accepted on a later attempt
    rescued_by_reason: dict[str, int] = {}

    def __add__(self, other: Counts) -> Counts:
        values = {}
        for name in type(self).model_fields:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, dict):
                summed = Counter(mine)
                summed.update(theirs)
                values[name] = dict(sorted(summed.items()))
            else:
                values[name] = mine + theirs
        return type(self)(**values)

    def rates(self) -> Rates:
        def share(part: int, whole: int) -> float | None:
            return round(part / whole, 4) if whole else None

        return Rates(pass_rate=share(self.accepted, self.items),
                     truncation_first_pass=share(self.truncated_first_pass, self.generated_items),
                     truncation_final=share(self.truncated_final, self.generated_items))


class Tally(Counts):
    """The counts of a set of items with their token sums (which the manifest keeps under `tokens`)."""

    prompt_tokens: int = 0
    output_tokens: int = 0

    def counts(self) -> Counts:
        return Counts(**self.model_dump(exclude={"prompt_tokens", "output_tokens"}))


class Rates(_Model):
    pass_rate: float | None = None
    truncation_first_pass: float | None = None
    truncation_final: float | None = None


class Tokens(_Model):
    prompt: int = 0
    output: int = 0
    generated_this_run: int = 0
    output_per_second: float | None = None


class FileEntry(_Model):
    sha256: str
    rows: int | None = None


class Manifest(_Model):
    """manifest.json: what a publication holds and how it was made (written last: its presence means done)."""

    job: str
    job_fingerprint: str | None = None
    flow_name: str | None = None
    flow_run_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    counts: Counts = Counts()
    rates: Rates = Rates()
    tokens: Tokens = Tokens()
    timings_seconds: dict[str, float] = {}
    model: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    engine_loaded: dict[str, Any] | None = None
    prompt: dict[str, Any] = {}
    input_file: dict[str, Any] | None = None
    sampling: dict[str, Any] = {}
    retry: dict[str, Any] = {}
    expectations: dict[str, Any] = {}
    input: dict[str, Any] = {}
    versions: dict[str, Any] = {}
    machine: dict[str, Any] = {}
    code: dict[str, Any] | None = None
    shards: list[dict[str, Any]] | None = None  # a merged publication: each shard's run and counts
    publication: str | None = None  # set when sealed
    files: dict[str, FileEntry] = {}  # set when sealed: every file's SHA-256 (and rows, for tables)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"shards"} if self.shards is None else None)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class EngineStats:
    """What generate tasks did in the engine; the stats of several tasks (overlapping in time) add up with `+`.
    The times are time.perf_counter() values."""

    reused: int = 0  # requests answered from earlier commits
    fresh_output_tokens: int = 0  # output tokens generated by this run
    engine_seconds: float = 0.0  # each task's first request to its last output, summed
    first_added_at: float | None = None  # the first new request entered the engine
    last_output_at: float | None = None  # the last new output came back
    first_commit_at: float | None = None  # the first new rows were committed
    engine_args: dict[str, Any] = field(default_factory=dict)  # the vLLM arguments the engine was built with

    def __add__(self, other: EngineStats) -> EngineStats:
        return EngineStats(
            reused=self.reused + other.reused, fresh_output_tokens=self.fresh_output_tokens + other.fresh_output_tokens,
            engine_seconds=self.engine_seconds + other.engine_seconds,
            first_added_at=_earliest(self.first_added_at, other.first_added_at),
            last_output_at=_latest(self.last_output_at, other.last_output_at),
            first_commit_at=_earliest(self.first_commit_at, other.first_commit_at),
            engine_args=other.engine_args or self.engine_args)


@dataclass
class RunTotals:
    """What a run keeps of its windows once they are staged: counts, GX results and figures, never their rows.
    The totals of windows add up with `+` (the publication writer sums them)."""

    tally: Tally = field(default_factory=Tally)
    engine: EngineStats = field(default_factory=EngineStats)
    # per pass: the windows' GX results, folded into one as windows add up (batchgen.gx_results.fold_results)
    validation: list[list[dict[str, Any]]] = field(default_factory=list)
    seconds: Counter = field(default_factory=Counter)  # per step: load_and_prompts, validate_and_stage
    model: Any = None  # the model the prompts were built for (batchgen.models.ModelRef)

    def __add__(self, other: RunTotals) -> RunTotals:
        from batchgen.gx_results import fold_results

        validation = []
        for index in range(max(len(self.validation), len(other.validation))):
            folded = None  # one bounded result per pass: a run does not keep every window's result
            for one in [*(self.validation[index] if index < len(self.validation) else []),
                        *(other.validation[index] if index < len(other.validation) else [])]:
                folded = fold_results(folded, one)
            validation.append([] if folded is None else [folded])
        return RunTotals(tally=self.tally + other.tally, engine=self.engine + other.engine, validation=validation,
                         seconds=self.seconds + other.seconds, model=other.model or self.model)

    def timings(self, started: float, before_publish: float) -> dict[str, float]:
        """The manifest's timings_seconds, from perf_counter values: the run's start and the end of its windows.

        generate: from the first request entering the engine to the last output; engine_calls: the tasks' time in
        the engine, summed, at most generate (windows overlap); first_request / first_output / last_output: from the
        start to the first request entering the engine / the first committed output / the engine's last output (what
        follows it, to total_before_publish, is the last windows' validation and staging)."""
        engine = self.engine
        span = (engine.last_output_at - engine.first_added_at) if engine.first_added_at is not None else 0.0
        timings = {"load_and_prompts": self.seconds["load_and_prompts"],
                   "validate_and_stage": self.seconds["validate_and_stage"], "generate": span,
                   "engine_calls": min(engine.engine_seconds, span), "total_before_publish": before_publish - started}
        if engine.first_added_at is not None:
            timings["first_request"] = engine.first_added_at - started
        if engine.first_commit_at is not None:
            timings["first_output"] = engine.first_commit_at - started
        if engine.last_output_at is not None and engine.first_added_at is not None:
            timings["last_output"] = engine.last_output_at - started
        return timings


@dataclass
class Window:
    """A slice of a run's items that goes through prompts, generation, validation and retries together."""

    index: int  # from 1; its piece of each table is staged under this number
    label: str  # in task run names and the progress: "all" for a run of one window, else "w1", "w2", ...
    items: Any  # pandas.DataFrame: item_id, row_number, then the input columns
    columns: list[str]  # the input's columns
    inputs: Any = None  # how an input row is encoded for the tables: the same for every window of a run
    rejected: list[Rejection] = field(default_factory=list)  # rows rejected on load, published with this window

    def keywords(self, job: Any) -> Any:
        """Each item's expected keyword (expectations.keyword_column) by item id, or None."""
        column = job.expectations.keyword_column
        return self.items.set_index("item_id")[column].astype("string") if column else None
