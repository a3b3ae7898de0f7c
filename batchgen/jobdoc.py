"""The job model for people and editors: its JSON Schema, its Markdown reference, a starter job for a data file.

Everything here is derived from `batchgen.job.JobSpec`, so the reference (`docs/job-reference.md`) and the
schema (`docs/job.schema.json`) cannot drift from what `load_job` accepts: `batchgen schema --markdown`
regenerates them and a test fails when the committed files differ.
"""

from __future__ import annotations

import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from batchgen.job import JobSpec

REFERENCE_PATH = Path("docs") / "job-reference.md"
SCHEMA_PATH = Path("docs") / "job.schema.json"
REGENERATE = ("`make reference` (or `batchgen schema --markdown -o docs/job-reference.md` and "
              "`batchgen schema -o docs/job.schema.json`)")
SECTION_ORDER = ("input", "prompt", "engine", "sampling", "expectations", "retry", "output")
STARTER_MAX_TOKENS = 128
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def job_schema() -> dict[str, Any]:
    """The job file's JSON Schema (draft 2020-12), as pydantic derives it from JobSpec; `sampling` also names the
    installed vLLM's other SamplingParams fields (passed through, their types checked when the job loads), and
    nothing else, so an editor flags a misspelt field as load_job does."""
    from batchgen.vllm_sampling import MANAGED_PARAMS, vllm_sampling_fields

    schema = JobSpec.model_json_schema()
    sampling = schema["$defs"]["SamplingSpec"]
    for name in vllm_sampling_fields():
        if name not in sampling["properties"] and name not in MANAGED_PARAMS:
            sampling["properties"][name] = {"description": f"vllm.SamplingParams.{name} of the installed vLLM, "
                                                           "passed through as it is."}
    sampling["additionalProperties"] = False
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "batchgen job",
            "description": "A batchgen job file (YAML): what to read, how to prompt, generate, check, retry and "
                           "publish. Reference: docs/job-reference.md."}


def schema_text() -> str:
    """The JSON Schema as the committed file holds it."""
    return json.dumps(job_schema(), indent=2, ensure_ascii=False) + "\n"


def _is_section(annotation: Any) -> bool:
    """A field whose type is a model of its own: a section of the job (a table of its own in the reference)."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _type_name(annotation: Any) -> str:
    """A YAML reader's name for a field's type: `integer or null`, `one of: grow, continue`, `list of text`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return "one of: " + ", ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        key, value = args
        if typing.get_origin(key) is Literal:
            return f"mapping of {', '.join(f'`{k}`' for k in typing.get_args(key))} to {_type_name(value)}"
        return "mapping" if value is Any else f"mapping of text to {_type_name(value)}"
    if _is_section(annotation):
        return "section"
    return {str: "text", int: "integer", float: "number", bool: "boolean"}.get(annotation, "any")


def _bounds(field: FieldInfo) -> str:
    signs = {annotated_types.Ge: ("≥", "ge"), annotated_types.Gt: (">", "gt"), annotated_types.Le: ("≤", "le"),
             annotated_types.Lt: ("<", "lt")}
    parts = []
    for item in field.metadata:
        if type(item) in signs:
            sign, attr = signs[type(item)]
            parts.append(f"{sign} {getattr(item, attr)}")
        elif isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length} character{'s' if item.min_length != 1 else ''}")
        elif isinstance(item, annotated_types.MaxLen):
            parts.append(f"at most {item.max_length}")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(model: type[BaseModel], prefix: str) -> list[str]:
    lines = ["| field | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if _is_section(field.annotation):
            continue  # a section: its own table
        lines.append(f"| `{prefix}{name}` | {_cell(_type_name(field.annotation))} | {_default(field)} | "
                     f"{_cell(_bounds(field))} | {_cell(field.description or '')} |")
    return lines


def missing_descriptions() -> list[str]:
    """Job fields without a description (the reference would show an empty cell for them)."""
    missing = []
    for section, model in [("", JobSpec), *_sections()]:
        for name, field in model.model_fields.items():
            if not field.description and not _is_section(field.annotation):
                missing.append(f"{section + '.' if section else ''}{name}")
    return missing


def _sections() -> list[tuple[str, type[BaseModel]]]:
    found = [(name, field.annotation) for name, field in JobSpec.model_fields.items() if _is_section(field.annotation)]
    order = {name: i for i, name in enumerate(SECTION_ORDER)}
    return sorted(found, key=lambda pair: order.get(pair[0], len(order)))


def reference_markdown() -> str:
    """docs/job-reference.md: every job field with its type, default, bounds and description."""
    sections = [f"`{name}`" for name, field in JobSpec.model_fields.items() if field.is_required()]
    required = [f"`{section}.{name}`" for section, model in _sections()
                for name, field in model.model_fields.items() if field.is_required()]
    lines = [
        "# Job file reference",
        "",
        f"<!-- Generated from batchgen/job.py by {REGENERATE}; do not edit by hand. -->",
        "",
        "A job is one YAML file. The sections " + ", ".join(sections) + " are required, and in them "
        + ", ".join(required) + ", and in `prompt` either `template` or `messages_column`; every other field "
        "has the default shown. Unknown fields are errors. Relative paths (`input.path`, `output.dir`) are "
        "relative to the job file. Any field can be overridden for one run with `--set section.field=value` "
        "(the value is YAML).",
        "",
        ("Editors can complete and check job files from the JSON Schema: put "
         "`# yaml-language-server: $schema=PATH/TO/job.schema.json` on the first line (the YAML extension of "
         "VS Code, and other editors using yaml-language-server, read it); write the schema with "
         "`batchgen schema -o job.schema.json`, or point at [job.schema.json](job.schema.json) of this "
         "repository. `batchgen init DATA_FILE` writes a starter job for a table of your own."),
        "",
        "## Top level",
        "",
        *_table(JobSpec, ""),
    ]
    for section, model in _sections():
        lines += ["", f"## `{section}`", "", *_table(model, f"{section}.")]
    return "\n".join(lines) + "\n"


# --- the starter job ---------------------------------------------------------------------------------------


def _id_column(columns: list[str], rows: list[dict[str, Any]]) -> str | None:
    """A column named like an id whose sampled values are all present and distinct."""
    for name in columns:
        lowered = name.lower()
        if lowered == "id" or lowered.endswith("_id") or lowered.endswith("id") and len(lowered) <= 4:
            values = [row.get(name) for row in rows]
            if all(value not in (None, "") for value in values) and len(set(map(str, values))) == len(values):
                return name
    return None


def _scalar(value: str) -> str:
    """A YAML scalar for a text value, quoted only when YAML needs it."""
    import yaml

    return yaml.safe_dump(value, allow_unicode=True, width=10_000).removesuffix("\n...\n").strip()


def _line(text: str, comment: str | None = None) -> str:
    """A job line with its comment aligned at column 35, as in the example jobs."""
    return text if comment is None else f"{text.ljust(34)} # {comment}"


def starter_job(data_file: Path, job_path: Path, sample_rows: int = 200) -> str:
    """A commented job for `data_file`, to be written at `job_path`: a template naming its columns, sensible
    defaults, the fields a user changes first. Raises batchgen.items.DataError for a file that cannot be read."""
    from batchgen.items import load_items
    from batchgen.job import InputSpec

    data_file, job_path = Path(data_file).resolve(), Path(job_path).resolve()
    loaded = load_items(InputSpec(path=str(data_file), limit=sample_rows))
    columns = loaded.columns
    rows = loaded.items[columns].to_dict("records")
    id_column = _id_column(columns, rows)
    usable = [c for c in columns if c != id_column and _IDENTIFIER.match(c)]
    unusable = [c for c in columns if c != id_column and not _IDENTIFIER.match(c)]
    if not usable:
        from batchgen.items import DataError

        raise DataError(f"{data_file}: no column a template can name (columns: {', '.join(columns) or 'none'}); "
                        f"column names must be letters, digits and underscores")
    shown = usable[:8]
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", data_file.stem).strip("-") or "batch-job"
    rel_input = os.path.relpath(data_file, job_path.parent)
    rel_output = os.path.relpath(job_path.parent / "out" / name, job_path.parent)
    template = ["Write a short description of this item.", *[f"{c}: {{{{ {c} }}}}" for c in shown]]

    lines = [
        (f"# A starter job for {data_file.name}, written by `batchgen init`. Check it with "
         f"`batchgen check {job_path.name}`,"),
        f"# run it with `batchgen run {job_path.name} --limit 20`. Every field: docs/job-reference.md.",
        "# Editor completion: `batchgen schema -o job.schema.json`, then start this file with the line",
        "# `# yaml-language-server: $schema=job.schema.json`.",
        f"name: {_scalar(name)}",
        "input:",
        _line(f"  path: {_scalar(rel_input)}", "CSV, JSONL or Parquet; relative to this file"),
        _line(f"  id_column: {_scalar(id_column)}", "unique per row; without it, an id is hashed from the row")
        if id_column else _line("  # id_column: ...", "a column with a unique id per row; else a hash of the row"),
        "prompt:",
        _line("  style: chat", "the model's chat template; `completion` sends the text as it is"),
        "  system: You are a helpful assistant. Answer in one short paragraph.",
        _line("  template: |-", "Jinja over the row's columns: {{ column }}"),
        *[f"    {line}" for line in template],
    ]
    if len(usable) > len(shown):
        lines.append(f"  # more columns: {', '.join(usable[len(shown):])}")
    if unusable:
        lines.append(f"  # not usable as {{{{ name }}}} (rename them to letters, digits, _): {', '.join(unusable)}")
    lines += [
        "engine:",
        _line("  model: null", "the embedded SmolLM2-135M-Instruct; or a model folder or hub id"),
        "sampling:",
        "  temperature: 0.7",
        "  top_p: 0.9",
        _line(f"  max_tokens: {STARTER_MAX_TOKENS}", "the first pass's budget; cut-off outputs are retried with more"),
        "expectations:",
        _line("  min_chars: 10", "shorter outputs are rejected"),
        _line(f"  # keyword_column: {shown[0]}", "this column's value must appear in the output"),
        _line("  require_stop: true", "an output cut off by max_tokens is retried, then rejected"),
        "retry:",
        _line("  max_passes: 2", "extra passes for outputs cut off by max_tokens"),
        _line("  strategy: continue_then_grow", "extend cut-off text once, then regenerate; grow: regenerate"),
        "output:",
        _line(f"  dir: {_scalar(rel_output)}", "read the results from <dir>/current/"),
    ]
    return "\n".join(lines) + "\n"
