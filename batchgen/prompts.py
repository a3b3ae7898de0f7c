"""Prompt construction: sandboxed templates, the model's chat template, token counts.

Prompts are tokenized here, once, so that every length check happens before the engine
sees a prompt (vLLM fails a whole `generate` call when one prompt is too long) and the
engine is handed token ids, not text to tokenize again.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import jinja2
import pandas as pd
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from batchgen.items import Rejection
from batchgen.job import JobError, PromptSpec

_ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...
    def __call__(self, text: list[str], **kwargs: Any) -> Any: ...


@dataclass
class BuiltPrompts:
    prompts: pd.DataFrame  # item_id, prompt, prompt_token_ids, n_prompt_tokens
    rejected: list[Rejection] = field(default_factory=list)


@functools.lru_cache(maxsize=32)
def compile_template(source: str, where: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise JobError(f"{where}: template syntax error on line {exc.lineno}: {exc.message}") from None


def template_fields(spec: PromptSpec) -> list[str]:
    """Columns the templates (or the conversation column) read, in order of first use."""
    names: list[str] = [spec.messages_column] if spec.messages_column else []
    for where, source in (("prompt.system", spec.system), ("prompt.template", spec.template)):
        if source is None:
            continue
        try:
            parsed = _ENV.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            raise JobError(f"{where}: template syntax error on line {exc.lineno}: {exc.message}") from None
        for name in sorted(meta.find_undeclared_variables(parsed)):
            if name not in names:
                names.append(name)
    return names


def check_template_columns(spec: PromptSpec, columns: list[str], source: str | None = None) -> list[str]:
    """Fail before the engine loads when a template names a column the input lacks."""
    fields = template_fields(spec)
    missing = [name for name in fields if name not in columns]
    if missing and missing[0] == spec.messages_column:
        raise JobError(f"prompt.messages_column: {missing[0]!r} is not a column of the input "
                       f"(columns: {', '.join(columns) or 'none'})")
    if missing:
        raise JobError(
            f"prompt: the template uses column {missing[0]!r}, which the input "
            f"{f'{source} ' if source else ''}does not have "
            f"(columns: {', '.join(columns) or 'none'})"
        )
    return fields


def check_keyword_column(column: str | None, columns: list[str]) -> None:
    """The keyword expectation reads an input column: fail before the engine loads when there is none."""
    if column is not None and column not in columns:
        raise JobError(
            f"expectations.keyword_column: {column!r} is not a column of the input "
            f"(columns: {', '.join(columns) or 'none'})"
        )


def _is_blank(value: Any) -> bool:
    if value is None:
        return True
    try:
        if pd.isna(value):
            return True
    except (TypeError, ValueError):
        pass  # lists and dicts are not blank
    return isinstance(value, str) and not value.strip()


ROLES = ("system", "user", "assistant")


class MessagesError(ValueError):
    """A conversation cell that is not a list of chat messages; the message says what is wrong."""


def conversation(value: Any, column: str) -> list[dict[str, str]]:
    """A cell of prompt.messages_column as chat messages: a list (JSON text in CSV) of {role, content}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise MessagesError(f"{column} is not a JSON list of messages ({exc})") from None
    if hasattr(value, "tolist"):  # Parquet lists arrive as numpy arrays
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise MessagesError(f"{column} must be a non-empty list of {{role, content}} messages, "
                            f"got {type(value).__name__}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            raise MessagesError(f"{column}[{i}] must be an object with role and content")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise MessagesError(f"{column}[{i}].role is {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise MessagesError(f"{column}[{i}].content must be text, got {type(content).__name__}")
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
        raise MessagesError(f"{column}: the last message is from the {messages[-1]['role']}; "
                            f"the model answers a user message")
    return messages


def render_messages(spec: PromptSpec, row: dict[str, Any]) -> list[dict[str, str]] | str:
    """The rendered prompt of one row: chat messages, or completion text."""
    if spec.messages_column is not None:
        messages = conversation(row[spec.messages_column], spec.messages_column)
        if spec.system is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": _render(spec.system, row, "prompt.system")})
        return messages
    user = _render(spec.template, row, "prompt.template")
    if spec.style == "completion":
        return user
    messages = []
    if spec.system is not None:
        messages.append({"role": "system", "content": _render(spec.system, row, "prompt.system")})
    messages.append({"role": "user", "content": user})
    return messages


def _render(source: str, row: dict[str, Any], where: str) -> str:
    template = compile_template(source, where)
    try:
        return template.render(**row)
    except jinja2.exceptions.SecurityError as exc:
        raise JobError(f"{where}: the template tried something the sandbox forbids: {exc}") from None


def wrong_type(values: dict[str, Any], fields: list[str], keyword_column: str | None = None) -> str | None:
    """Why a row's values cannot be used as the job uses them, or None.

    Templates take text, numbers, lists and mappings (Jinja can loop over and index the
    last two), but not bytes: they would render as b'...'. The keyword column is compared
    as text, so it must hold text or a number.
    """
    for name in fields:
        if isinstance(values.get(name), (bytes, bytearray)):
            return f"{name} is bytes; a template needs text, numbers, lists or mappings"
    keyword = values.get(keyword_column) if keyword_column else None
    if keyword is not None and (isinstance(keyword, (bytes, bytearray, list, tuple, dict))
                                or hasattr(keyword, "tolist")):
        return (f"{keyword_column} (expectations.keyword_column) is {type(keyword).__name__}; "
                f"a keyword must be text or a number")
    return None


TOKENIZE_BATCH = 1024


def build_prompts(
    items: pd.DataFrame, spec: PromptSpec, tokenizer: Tokenizer, max_model_len: int, columns: list[str],
    keyword_column: str | None = None,
) -> BuiltPrompts:
    """Render, template and tokenize every item's prompt; reject the rows that cannot be prompted."""
    fields = check_template_columns(spec, columns)
    rejected: list[Rejection] = []
    ids, texts, numbers, inputs = [], [], [], []
    for row in items.to_dict(orient="records"):
        values = {name: row[name] for name in columns}
        problem = wrong_type(values, fields, keyword_column)
        if problem:
            rejected.append(Rejection(row["item_id"], row["row_number"], "prompt", ["wrong_type"],
                                      f"row {row['row_number']}: {problem}", values))
            continue
        blank = [name for name in fields if _is_blank(values.get(name))]
        if blank:
            rejected.append(Rejection(row["item_id"], row["row_number"], "prompt", ["missing_field"],
                                      f"row {row['row_number']}: {', '.join(blank)} is empty", values))
            continue
        try:
            rendered = render_messages(spec, values)
        except jinja2.TemplateError as exc:
            rejected.append(Rejection(row["item_id"], row["row_number"], "prompt", ["template_error"],
                                      f"row {row['row_number']}: {exc}", values))
            continue
        except MessagesError as exc:
            rejected.append(Rejection(row["item_id"], row["row_number"], "prompt", ["invalid_messages"],
                                      f"row {row['row_number']}: {exc}", values))
            continue
        user_text = rendered if isinstance(rendered, str) else rendered[-1]["content"]
        if not user_text.strip():
            rejected.append(Rejection(row["item_id"], row["row_number"], "prompt", ["empty_prompt"],
                                      f"row {row['row_number']}: the prompt renders to nothing", values))
            continue
        if isinstance(rendered, str):
            text = rendered
        else:
            text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
        ids.append(row["item_id"])
        texts.append(text)
        numbers.append(row["row_number"])
        inputs.append(values)

    # The chat template already holds the special tokens; raw completion text gets the
    # tokenizer's own (BOS), exactly as vLLM would add them.
    # In batches, without attention masks: only the ids are kept, and the tokenizer's per-text encodings
    # of one batch at a time are alive (all at once cost ~10 KB per prompt at the peak).
    token_ids: list[list[int]] = []
    for start in range(0, len(texts), TOKENIZE_BATCH):
        token_ids.extend(tokenizer(texts[start:start + TOKENIZE_BATCH], add_special_tokens=spec.style == "completion",
                                   return_attention_mask=False)["input_ids"])
    keep = []
    for i, tokens in enumerate(token_ids):
        if len(tokens) >= max_model_len:
            rejected.append(Rejection(ids[i], numbers[i], "prompt", ["prompt_too_long"],
                                      f"row {numbers[i]}: prompt has {len(tokens)} tokens; "
                                      f"the model allows {max_model_len} in all", inputs[i]))
        else:
            keep.append(i)
    prompts = pd.DataFrame({
        "item_id": pd.Series([ids[i] for i in keep], dtype="string"),
        "prompt": [texts[i] for i in keep],
        "prompt_token_ids": [list(token_ids[i]) for i in keep],
        "n_prompt_tokens": pd.Series([len(token_ids[i]) for i in keep], dtype="int64"),
    })
    return BuiltPrompts(prompts=prompts, rejected=rejected)
