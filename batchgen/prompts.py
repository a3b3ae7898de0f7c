"""Prompt construction: sandboxed templates, the model's chat template, token counts.

Prompts are tokenized here, once, so that every length check happens before the engine
sees a prompt (vLLM fails a whole `generate` call when one prompt is too long) and the
engine is handed token ids, not text to tokenize again.
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import jinja2
import pandas as pd
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from batchgen.items import Rejection
from batchgen.job import JobError, PromptSpec
from batchgen.workers import usable_cores

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
    """The sandboxed template, compiled once; a JobError naming the field and line when it cannot compile.

    Compiling catches more than parsing does: an unknown filter or test (`{{ name | shout }}`) is
    an error of the compiler, not the parser.
    """
    try:
        parsed = _ENV.parse(source)
        template = _ENV.from_string(parsed)
    except jinja2.TemplateAssertionError as exc:
        raise JobError(f"{where}: line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise JobError(f"{where}: template syntax error on line {exc.lineno}: {exc.message}") from None
    # Jinja defers unknown filters and tests inside {% if %} to render time: find them all now.
    for kind, known, label in ((nodes.Filter, _ENV.filters, "filter"), (nodes.Test, _ENV.tests, "test")):
        for node in parsed.find_all(kind):
            if node.name not in known:
                raise JobError(f"{where}: line {node.lineno}: No {label} named {node.name!r}.")
    return template


def _sources(spec: PromptSpec) -> list[tuple[str, str]]:
    return [(where, source) for where, source in (("prompt.system", spec.system), ("prompt.template", spec.template))
            if source is not None]


def template_fields(spec: PromptSpec) -> list[str]:
    """Columns the templates (or the conversation column) read, in order of first use."""
    names: list[str] = [spec.messages_column] if spec.messages_column else []
    for where, source in _sources(spec):
        compile_template(source, where)  # syntax, unknown filters and tests: a JobError naming the field
        for name in sorted(meta.find_undeclared_variables(_ENV.parse(source))):
            if name not in names:
                names.append(name)
    return names


def check_template_columns(spec: PromptSpec, columns: list[str], source: str | None = None) -> list[str]:
    """Fail before the engine loads when a template names a column the input lacks."""
    fields = template_fields(spec)
    if not columns:  # no row could be read (every JSONL line invalid): each is rejected for its own reason
        return fields
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
    if column is not None and columns and column not in columns:
        raise JobError(
            f"expectations.keyword_column: {column!r} is not a column of the input "
            f"(columns: {', '.join(columns) or 'none'})"
        )


def is_blank(value: Any) -> bool:
    """An empty cell: None, NaN / NA, or text of only spaces (a list or a dict is never blank)."""
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


class RenderError(ValueError):
    """A template that compiled but failed on one row's values (a runtime error of the user's template)."""


def render_messages(spec: PromptSpec, row: dict[str, Any]) -> list[dict[str, str]] | str:
    """The rendered prompt of one row: chat messages, or completion text."""
    return _Renderer(spec).render(row)


def _render(source: str, row: dict[str, Any], where: str) -> str:
    return _Template.of(source, where).render(row)


class _Template:
    """A compiled template rendered as `Template.render` does, without copying Jinja's globals ChainMap per row
    (that copy was a third of the rendering time)."""

    def __init__(self, source: str, where: str):
        self.template = compile_template(source, where)
        self.where = where
        self.globals = dict(self.template.globals)
        self.globals_keys = set(self.globals)
        # no Jinja syntax at all: the same text for every row (lipsum() or a cycler would not be)
        self.static = "{" not in source

    @classmethod
    @functools.lru_cache(maxsize=32)
    def of(cls, source: str, where: str) -> _Template:
        return cls(source, where)

    def render(self, row: dict[str, Any]) -> str:
        template = self.template
        context = _context(template, {**self.globals, **row}, self.globals_keys)
        try:
            try:
                return template.environment.concat(template.root_render_func(context))
            except Exception:
                template.environment.handle_exception()  # re-raises with the template's own line numbers
        except jinja2.exceptions.SecurityError as exc:
            raise JobError(f"{self.where}: the template tried something the sandbox forbids: {exc}") from None
        except Exception as exc:  # the user's template code failed on this row's values: the row's error
            raise RenderError(f"{self.where}: {_describe_error(exc)}") from exc
        raise AssertionError("unreachable")


def _context(template: jinja2.Template, variables: dict[str, Any], globals_keys: set[str]) -> jinja2.runtime.Context:
    """The context `template.new_context(variables, shared=True)` makes (`variables` already hold the template's
    globals), without its set() of the globals ChainMap per call (a quarter of a short template's rendering): the
    names of the globals, known once, are what the context keeps of them."""
    context = template.environment.context_class(template.environment, variables, template.name, template.blocks)
    context.globals_keys = globals_keys
    return context


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, jinja2.TemplateError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _Renderer:
    """A job's templates for many rows: compiled once, a system message without variables rendered once."""

    def __init__(self, spec: PromptSpec):
        self.spec = spec
        self.user = _Template.of(spec.template, "prompt.template") if spec.template is not None else None
        self.system = _Template.of(spec.system, "prompt.system") if spec.system is not None else None
        self._static_system: tuple[str | None, BaseException | None] | None = None

    def _system(self, row: dict[str, Any]) -> str:
        if not self.system.static:
            return self.system.render(row)
        if self._static_system is None:
            try:
                self._static_system = (self.system.render(row), None)
            except RenderError as exc:
                self._static_system = (None, exc)
        text, error = self._static_system
        if error is not None:
            raise RenderError(str(error))
        return text

    def render(self, row: dict[str, Any]) -> list[dict[str, str]] | str:
        spec = self.spec
        if spec.messages_column is not None:
            messages = conversation(row[spec.messages_column], spec.messages_column)
            if self.system is not None and messages[0]["role"] != "system":
                messages.insert(0, {"role": "system", "content": self._system(row)})
            return messages
        user = self.user.render(row)
        if spec.style == "completion":
            return user
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self._system(row)})
        messages.append({"role": "user", "content": user})
        return messages


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


def _reject(rejected: list[Rejection], item_id: str, number: int, reason: str, detail: str,
            values: dict[str, Any]) -> None:
    rejected.append(Rejection(item_id, number, "prompt", [reason], f"row {number}: {detail}", values))


def _token_ids(tokenizer: Tokenizer, texts: list[str], special: bool) -> list[list[int]]:
    """Token ids of a batch of texts, a list of its own each. A Hugging Face fast tokenizer with no truncation or
    padding set is asked through its Rust tokenizer's `encode_batch_fast` (no character offsets: 20% faster, the
    same ids), a slice of the batch per core (`tokenize_threads`)."""
    fast = getattr(tokenizer, "_tokenizer", None)
    if (fast is not None and hasattr(fast, "encode_batch_fast") and getattr(fast, "truncation", True) is None
            and getattr(fast, "padding", True) is None):
        threads = min(tokenize_threads(), len(texts) // MIN_TEXTS_PER_THREAD)
        if threads <= 1:
            return [encoding.ids for encoding in fast.encode_batch_fast(texts, add_special_tokens=special)]
        step = -(-len(texts) // threads)
        parts = _tokenize_pool().map(lambda start: [encoding.ids for encoding in fast.encode_batch_fast(
            texts[start:start + step], add_special_tokens=special)], range(0, len(texts), step))
        return [ids for part in parts for ids in part]
    encoded = tokenizer(texts, add_special_tokens=special, return_attention_mask=False)
    return [list(ids) for ids in encoded["input_ids"]]


MIN_TEXTS_PER_THREAD = 64  # below this a thread's hand-off costs more than it saves


def tokenize_threads() -> int:
    """Threads that tokenize a batch side by side: the cores this process may use, at most 16.

    The Rust tokenizer releases the GIL while it encodes, so Python threads each encoding a slice of the batch run
    on as many cores. Its own thread pool (rayon) stays off where batchgen sets TOKENIZERS_PARALLELISM=false: the
    engine's processes are forked, and a pool used before a fork is unsafe in the child."""
    return min(usable_cores(), 16)


@functools.lru_cache(maxsize=1)
def _tokenize_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=tokenize_threads(), thread_name_prefix="batchgen-tokenize")


def _chat_texts(tokenizer: Tokenizer, conversations: list[list[dict[str, str]]],
                options: dict[str, Any] | None = None) -> list[str | Exception]:
    """The chat template applied to a batch of conversations: by `_ChatTemplate` where it renders the batch's first
    conversation exactly as apply_chat_template does, else by apply_chat_template, in one call; where the template
    refuses a conversation (a `raise_exception` in it), only that one fails. `options`: the job's chat_template
    (its text) and chat_template_kwargs, as apply_chat_template takes them."""
    options = options or {}
    if not conversations:
        return []
    quick = _ChatTemplate.of(tokenizer, options)
    if quick is not None:
        try:
            same = quick.render(conversations[0]) == tokenizer.apply_chat_template(
                conversations[0], tokenize=False, add_generation_prompt=True, **options)
        except Exception:  # one of them refused it: apply_chat_template says why, below
            same = False
        if same:
            texts: list[str | Exception] = []
            for messages in conversations:
                try:
                    texts.append(quick.render(messages))
                except Exception as exc:  # the model's own template refused this conversation: the row's error
                    texts.append(exc)
            return texts
    try:
        return list(tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                                  **options))
    except Exception:
        pass
    texts = []
    for messages in conversations:
        try:
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                       **options))
        except Exception as exc:  # the model's own template refused this conversation: the row's error
            texts.append(exc)
    return texts


class _ChatTemplate:
    """A Hugging Face tokenizer's chat template rendered as its apply_chat_template renders it (transformers' own
    compiled template, with the variables it passes: the special tokens, no tools or documents, the generation
    prompt and the job's chat_template_kwargs), without Jinja's copy of the template's globals per conversation
    (a ChainMap, half of apply_chat_template's time for a short conversation). `_chat_texts` checks it against
    apply_chat_template on every batch's first conversation and uses apply_chat_template where they differ."""

    def __init__(self, template: jinja2.Template, variables: dict[str, Any]):
        self.template, self.variables = template, variables
        self.globals_keys = set(template.globals)

    @classmethod
    def of(cls, tokenizer: Any, options: dict[str, Any]) -> _ChatTemplate | None:
        """The tokenizer's template for the job's options, or None where this tokenizer has no such template."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            template = _compile_jinja_template(tokenizer.get_chat_template(options.get("chat_template"), None))
            special = dict(tokenizer.special_tokens_map)
        except Exception:  # not a transformers tokenizer, no chat template, or another transformers
            return None
        extra = {k: v for k, v in options.items() if k != "chat_template"}
        variables = {**dict(template.globals), "tools": None, "documents": None, "add_generation_prompt": True,
                     **special, **extra}
        return cls(template, variables)

    def render(self, messages: list[dict[str, str]]) -> str:
        template = self.template
        context = _context(template, {**self.variables, "messages": messages}, self.globals_keys)
        try:
            return template.environment.concat(template.root_render_func(context))
        except Exception:
            template.environment.handle_exception()  # re-raises as Template.render does
            raise


def chat_options(spec: PromptSpec) -> dict[str, Any]:
    """apply_chat_template's keyword arguments for the job: its chat template and the template's variables."""
    options = dict(spec.chat_template_kwargs)
    template = spec.chat_template_text()
    if template is not None:
        options["chat_template"] = template
    return options


def build_prompts(
    items: pd.DataFrame, spec: PromptSpec, tokenizer: Tokenizer, max_model_len: int, columns: list[str],
    keyword_column: str | None = None,
) -> BuiltPrompts:
    """Render, template and tokenize every item's prompt; reject the rows that cannot be prompted.

    Rows are rejected with a reason, in this order of checks: wrong_type, missing_field (a template field, then
    the keyword column),
    template_error (the user's template failed on the row's values) or invalid_messages,
    empty_prompt, template_error (the model's chat template refused the conversation),
    prompt_too_long. Templates are compiled once, the chat template is applied to a batch of
    conversations at a time, and prompts are tokenized a batch at a time.
    """
    fields = check_template_columns(spec, columns)
    renderer = _Renderer(spec)
    rejected: list[Rejection] = []
    ids, numbers, inputs, rendered_all = [], [], [], []
    cells = zip(items["item_id"].tolist(), items["row_number"].tolist(), *(items[name].tolist() for name in columns))
    for item_id, number, *row in cells:
        values = dict(zip(columns, row))
        problem = wrong_type(values, fields, keyword_column)
        if problem:
            _reject(rejected, item_id, number, "wrong_type", problem, values)
            continue
        blank = [name for name in fields if is_blank(values.get(name))]
        if blank:
            _reject(rejected, item_id, number, "missing_field", f"{', '.join(blank)} is empty", values)
            continue
        if keyword_column is not None and is_blank(values.get(keyword_column)):
            # no keyword to look for: the output could only fail the keyword expectation, whatever it said
            _reject(rejected, item_id, number, "missing_field",
                    f"{keyword_column} (expectations.keyword_column) is empty: no keyword to look for", values)
            continue
        try:
            rendered = renderer.render(values)
        except RenderError as exc:
            _reject(rejected, item_id, number, "template_error", str(exc), values)
            continue
        except MessagesError as exc:
            _reject(rejected, item_id, number, "invalid_messages", str(exc), values)
            continue
        user_text = rendered if isinstance(rendered, str) else rendered[-1]["content"]
        if not user_text.strip():
            _reject(rejected, item_id, number, "empty_prompt", "the prompt renders to nothing", values)
            continue
        ids.append(item_id)
        numbers.append(number)
        inputs.append(values)
        rendered_all.append(rendered)

    texts: list[str] = []
    if spec.style == "completion":
        texts = rendered_all
    else:
        chat = []
        options = chat_options(spec)
        for start in range(0, len(rendered_all), TOKENIZE_BATCH):
            chat.extend(_chat_texts(tokenizer, rendered_all[start:start + TOKENIZE_BATCH], options))
        keep = [i for i, text in enumerate(chat) if not isinstance(text, Exception)]
        for i, text in enumerate(chat):
            if isinstance(text, Exception):
                _reject(rejected, ids[i], numbers[i], "template_error",
                        f"the model's chat template refused the conversation: {_describe_error(text)}", inputs[i])
        if len(keep) < len(chat):
            ids, numbers, inputs = [ids[i] for i in keep], [numbers[i] for i in keep], [inputs[i] for i in keep]
        texts = [chat[i] for i in keep]
    del rendered_all

    # The chat template already holds the special tokens; raw completion text gets the
    # tokenizer's own (BOS), exactly as vLLM would add them.
    # In batches, without attention masks: only the ids are kept, and the tokenizer's per-text encodings
    # of one batch at a time are alive (all at once cost ~10 KB per prompt at the peak).
    token_ids: list[list[int]] = []
    for start in range(0, len(texts), TOKENIZE_BATCH):
        token_ids.extend(_token_ids(tokenizer, texts[start:start + TOKENIZE_BATCH], spec.style == "completion"))
    keep = []
    for i, tokens in enumerate(token_ids):
        if len(tokens) >= max_model_len:
            _reject(rejected, ids[i], numbers[i], "prompt_too_long",
                    f"prompt has {len(tokens)} tokens; the model allows {max_model_len} in all", inputs[i])
        else:
            keep.append(i)
    prompts = pd.DataFrame({
        "item_id": pd.Series([ids[i] for i in keep], dtype="string"),
        "prompt": [texts[i] for i in keep],
        "prompt_token_ids": [token_ids[i] for i in keep],  # lists of their own (_token_ids)
        "n_prompt_tokens": pd.Series([len(token_ids[i]) for i in keep], dtype="int64"),
    })
    return BuiltPrompts(prompts=prompts, rejected=rejected)
