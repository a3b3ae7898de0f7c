"""The one-row-at-a-time implementation of build_prompts, kept in its plain form, to compare the batched one with.

`reference_build_prompts` is the earlier implementation: every row rendered with `Template.render`, the chat
template applied to one conversation at a time, the texts tokenized by the tokenizer's `__call__`. `compare`
asserts the same prompts, token ids and rejections (with their order and details) from both.
"""

from __future__ import annotations

from typing import Any

import jinja2
import pandas as pd

from batchgen.items import Rejection
from batchgen.job import PromptSpec
from batchgen.prompts import (
    _ENV,
    MessagesError,
    build_prompts,
    check_template_columns,
    conversation,
    is_blank,
    wrong_type,
)


def _render(source: str, row: dict[str, Any]) -> str:
    return _ENV.from_string(source).render(**row)


def reference_build_prompts(items: pd.DataFrame, spec: PromptSpec, tokenizer: Any, max_model_len: int,
                            columns: list[str], keyword_column: str | None = None) -> tuple[list, list]:
    fields = check_template_columns(spec, columns)
    rejected, kept = [], []
    for row in items.to_dict(orient="records"):
        values = {name: row[name] for name in columns}
        number = row["row_number"]

        def reject(reason: str, detail: str) -> None:
            rejected.append(Rejection(row["item_id"], number, "prompt", [reason], f"row {number}: {detail}", values))

        problem = wrong_type(values, fields, keyword_column)
        if problem:
            reject("wrong_type", problem)
            continue
        blank = [name for name in fields if is_blank(values.get(name))]
        if blank:
            reject("missing_field", f"{', '.join(blank)} is empty")
            continue
        if keyword_column is not None and is_blank(values.get(keyword_column)):
            reject("missing_field", f"{keyword_column} (expectations.keyword_column) is empty: no keyword to look for")
            continue
        try:
            if spec.messages_column is not None:
                rendered = conversation(values[spec.messages_column], spec.messages_column)
                if spec.system is not None and rendered[0]["role"] != "system":
                    rendered.insert(0, {"role": "system", "content": _render(spec.system, values)})
            else:
                user = _render(spec.template, values)
                rendered = user if spec.style == "completion" else (
                    ([{"role": "system", "content": _render(spec.system, values)}] if spec.system else [])
                    + [{"role": "user", "content": user}])
        except jinja2.TemplateError as exc:
            reject("template_error", f"prompt.template: {exc}")
            continue
        except MessagesError as exc:
            reject("invalid_messages", str(exc))
            continue
        user_text = rendered if isinstance(rendered, str) else rendered[-1]["content"]
        if not user_text.strip():
            reject("empty_prompt", "the prompt renders to nothing")
            continue
        text = rendered if isinstance(rendered, str) else tokenizer.apply_chat_template(
            rendered, tokenize=False, add_generation_prompt=True)
        kept.append((row["item_id"], number, text, values))
    tokens = tokenizer([t for _, _, t, _ in kept], add_special_tokens=spec.style == "completion",
                       return_attention_mask=False)["input_ids"] if kept else []
    prompts = []
    for (item_id, number, text, values), ids in zip(kept, tokens):
        if len(ids) >= max_model_len:
            rejected.append(Rejection(item_id, number, "prompt", ["prompt_too_long"],
                                      f"row {number}: prompt has {len(ids)} tokens; the model allows "
                                      f"{max_model_len} in all", values))
        else:
            prompts.append((item_id, text, list(ids), len(ids)))
    return prompts, rejected


def compare(items: pd.DataFrame, spec: PromptSpec, tokenizer: Any, max_len: int, columns: list[str],
            keyword: str | None = None) -> int:
    built = build_prompts(items, spec, tokenizer, max_len, columns, keyword)
    prompts, rejected = reference_build_prompts(items, spec, tokenizer, max_len, columns, keyword)
    got = list(zip(built.prompts["item_id"], built.prompts["prompt"],
                   [list(ids) for ids in built.prompts["prompt_token_ids"]], built.prompts["n_prompt_tokens"]))
    assert got == prompts
    assert [(r.item_id, r.row_number, r.reasons, r.detail, r.input) for r in built.rejected] == \
        [(r.item_id, r.row_number, r.reasons, r.detail, r.input) for r in rejected]
    return len(got)


def rows_to_reject() -> tuple[pd.DataFrame, list[str]]:
    columns = ["name", "feature", "chat"]
    rows = [
        {"name": "Mug", "feature": "hot", "chat": '[{"role": "user", "content": "hi"}]'},
        {"name": "", "feature": "hot", "chat": None},                                   # missing_field
        {"name": b"bytes", "feature": "x", "chat": None},                               # wrong_type
        {"name": "   ", "feature": "  ", "chat": "[]"},                                 # missing_field
        {"name": "Lamp " * 400, "feature": "bright", "chat": "not json"},              # prompt_too_long
        {"name": "星辰保温杯", "feature": "一键研磨", "chat": '[{"role": "assistant", "content": "x"}]'},
        {"name": "Kettle", "feature": "fast", "chat": '[{"role": "user", "content": 3}]'},
    ]
    frame = pd.DataFrame(rows, columns=columns, dtype=object)
    frame.insert(0, "row_number", pd.Series(range(2, len(rows) + 2), dtype="int64"))
    frame.insert(0, "item_id", pd.Series([f"i{i}" for i in range(len(rows))], dtype="string"))
    return frame, columns
