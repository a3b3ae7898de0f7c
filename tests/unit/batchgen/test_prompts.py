"""Prompt building with the default model's real tokenizer and chat template: conversations, rejections,
and the same prompts as the one-row-at-a-time reference implementation."""

from __future__ import annotations

import json
from typing import Any

import make_products  # examples/, which tests/conftest.py puts on the path
import pandas as pd
import pytest

from batchgen.items import load_items
from batchgen.job import InputSpec, JobError, PromptSpec, load_job
from batchgen.prompts import MessagesError, build_prompts, check_template_columns, conversation, template_fields
from tests.conftest import ROOT
from tests.prompts_reference import compare, rows_to_reject

COLUMNS = ["name", "feature"]


def make_items(rows: list[dict[str, Any]], columns: list[str] = COLUMNS) -> pd.DataFrame:
    """Items as load_items gives them: item_id, row_number, then the input columns."""
    frame = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    frame.insert(0, "row_number", pd.Series(range(2, len(rows) + 2), dtype="int64"))
    frame.insert(0, "item_id", pd.Series([r["id"] for r in rows], dtype="string"))
    return frame


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def test_chat_prompt_uses_the_model_chat_template_and_counts_tokens(tokenizer):
    items = make_items([{"id": "p1", "name": "Aurora Mug", "feature": "keeps coffee hot"},
                        {"id": "p2", "name": "Trail Boots", "feature": "waterproof"}])
    spec = PromptSpec(system="You write short product copy.", template="Describe {{ name }}: {{ feature }}.")

    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    assert built.rejected == []
    prompts = built.prompts
    assert list(prompts["item_id"]) == ["p1", "p2"]
    first = prompts["prompt"].iloc[0]
    assert "<|im_start|>system\nYou write short product copy.<|im_end|>" in first
    assert "<|im_start|>user\nDescribe Aurora Mug: keeps coffee hot.<|im_end|>" in first
    assert first.endswith("<|im_start|>assistant\n")  # the generation prompt is added
    for row in prompts.itertuples():
        expected = tokenizer(row.prompt, add_special_tokens=False).input_ids
        assert list(row.prompt_token_ids) == expected
        assert row.n_prompt_tokens == len(expected)
    # chat markers are single special tokens, not spelled out
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert prompts["prompt_token_ids"].iloc[0][0] == im_start


def test_chat_prompt_without_system_uses_the_template_default(tokenizer):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    built = build_prompts(items, PromptSpec(template="Describe {{ name }}"), tokenizer, 2048, COLUMNS)
    prompt = built.prompts["prompt"].iloc[0]
    assert "<|im_start|>user\nDescribe Mug<|im_end|>" in prompt
    assert built.prompts["n_prompt_tokens"].iloc[0] == n_tokens(tokenizer, prompt)


def test_completion_prompt_is_the_raw_text(tokenizer):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    spec = PromptSpec(style="completion", template="Product: {{ name }}\nDescription:")

    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    assert built.prompts["prompt"].iloc[0] == "Product: Mug\nDescription:"
    assert "<|im_start|>" not in built.prompts["prompt"].iloc[0]
    # vLLM would add the tokenizer's own special tokens to raw text: the count must match
    assert list(built.prompts["prompt_token_ids"].iloc[0]) == tokenizer("Product: Mug\nDescription:").input_ids


@pytest.mark.parametrize("blank", [None, "", "   ", float("nan")])
def test_blank_template_field_is_rejected_as_missing_field(tokenizer, blank):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"},
                        {"id": "p2", "name": "Boots", "feature": blank}])
    spec = PromptSpec(template="Describe {{ name }}: {{ feature }}")

    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    assert list(built.prompts["item_id"]) == ["p1"]
    [rejection] = built.rejected
    assert rejection.item_id == "p2"
    assert rejection.reasons == ["missing_field"]
    assert rejection.stage == "prompt"
    assert rejection.row_number == 3
    assert "feature is empty" in rejection.detail
    assert rejection.input["name"] == "Boots"


@pytest.mark.parametrize("blank", [None, "", "  "])
def test_blank_keyword_is_rejected_as_missing_field_naming_the_keyword_column(tokenizer, blank):
    # the keyword expectation could only fail such an item: rejected before its prompt reaches the engine
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"},
                        {"id": "p2", "name": blank, "feature": "cold"}])

    built = build_prompts(items, PromptSpec(template="Describe something {{ feature }}"), tokenizer, 2048, COLUMNS,
                          keyword_column="name")

    assert list(built.prompts["item_id"]) == ["p1"]
    [rejection] = built.rejected
    assert (rejection.item_id, rejection.reasons, rejection.row_number) == ("p2", ["missing_field"], 3)
    assert "name (expectations.keyword_column) is empty" in rejection.detail
    keyword_unset = build_prompts(items, PromptSpec(template="Describe something {{ feature }}"), tokenizer, 2048,
                                  COLUMNS)
    assert keyword_unset.rejected == [] and list(keyword_unset.prompts["item_id"]) == ["p1", "p2"]


def test_blank_column_the_template_does_not_use_is_fine(tokenizer):
    items = make_items([{"id": "p1", "name": "Mug", "feature": None}])
    built = build_prompts(items, PromptSpec(template="Describe {{ name }}"), tokenizer, 2048, COLUMNS)
    assert built.rejected == []
    assert list(built.prompts["item_id"]) == ["p1"]


def test_empty_csv_cell_is_a_missing_field(tokenizer, tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("product_id,name,feature\np1,Mug,hot\np2,Boots,\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="product_id"))

    built = build_prompts(loaded.items, PromptSpec(template="{{ name }}: {{ feature }}"), tokenizer, 2048,
                          loaded.columns)

    assert list(built.prompts["item_id"]) == ["p1"]
    assert [(r.item_id, r.reasons, r.row_number) for r in built.rejected] == [("p2", ["missing_field"], 2)]  # data row 2


def test_template_naming_an_absent_column_fails_before_anything(tokenizer):
    class NoTokenizer:
        def __call__(self, *args, **kwargs):
            raise AssertionError("tokenized before checking the template's columns")

        def apply_chat_template(self, *args, **kwargs):
            raise AssertionError("rendered before checking the template's columns")

    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    spec = PromptSpec(template="Describe {{ name }} in {{ colour }}")

    with pytest.raises(JobError) as info:
        build_prompts(items, spec, NoTokenizer(), 2048, COLUMNS)

    assert "'colour'" in str(info.value)
    assert "columns: name, feature" in str(info.value)


def test_system_template_columns_are_checked_too():
    spec = PromptSpec(system="You sell to {{ audience }}.", template="Describe {{ name }}")
    assert template_fields(spec) == ["audience", "name"]
    with pytest.raises(JobError, match="'audience'"):
        check_template_columns(spec, COLUMNS)


def test_template_syntax_error_is_a_job_error():
    with pytest.raises(JobError, match=r"prompt.template: template syntax error on line 1"):
        check_template_columns(PromptSpec(template="Describe {{ name "), COLUMNS)


def test_prompt_longer_than_the_context_is_rejected(tokenizer):
    long_feature = "waterproof leather, breathable lining, and a grippy sole " * 6
    items = make_items([{"id": "short", "name": "Mug", "feature": "hot"},
                        {"id": "long", "name": "Boots", "feature": long_feature}])
    spec = PromptSpec(template="Describe {{ name }}: {{ feature }}")

    built = build_prompts(items, spec, tokenizer, 50, COLUMNS)

    assert list(built.prompts["item_id"]) == ["short"]
    assert built.prompts["n_prompt_tokens"].iloc[0] < 50
    [rejection] = built.rejected
    assert rejection.item_id == "long"
    assert rejection.reasons == ["prompt_too_long"]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Describe Boots: {long_feature}"}], tokenize=False, add_generation_prompt=True
    )
    assert f"prompt has {n_tokens(tokenizer, text)} tokens" in rejection.detail
    assert "allows 50" in rejection.detail


def test_prompt_exactly_at_the_context_length_is_rejected(tokenizer):
    # vLLM needs room for at least one generated token.
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    spec = PromptSpec(template="Describe {{ name }}")
    size = build_prompts(items, spec, tokenizer, 2048, COLUMNS).prompts["n_prompt_tokens"].iloc[0]

    assert [r.reasons for r in build_prompts(items, spec, tokenizer, int(size), COLUMNS).rejected] == [
        ["prompt_too_long"]]
    assert build_prompts(items, spec, tokenizer, int(size) + 1, COLUMNS).rejected == []


@pytest.mark.parametrize("style", ["chat", "completion"])
def test_prompt_rendering_to_whitespace_is_rejected_as_empty_prompt(tokenizer, style):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"},
                        {"id": "p2", "name": "skip", "feature": "hot"}])
    spec = PromptSpec(style=style, template="{% if name != 'skip' %}Describe {{ name }}{% endif %}  \n ")

    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    assert list(built.prompts["item_id"]) == ["p1"]
    assert [(r.item_id, r.reasons) for r in built.rejected] == [("p2", ["empty_prompt"])]


# what a leaked object looks like once rendered (reprs of classes, functions, modules, dicts of globals)
REPRS = ["<class", "<function", "<module", "<built-in", "'__name__':", "uid="]
INTERNALS = [*REPRS, "__subclasses__", "__globals__", "__builtins__"]


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ name.__class__.__base__.__subclasses__() }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ name.format.__self__ }}",
    "{{ (name|attr('__class__')) }}",
])
def test_sandbox_never_renders_python_internals(tokenizer, template):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    spec = PromptSpec(template=template)
    try:
        built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)
    except JobError as exc:
        assert str(exc).startswith("prompt.template: the template tried something the sandbox forbids")
        for marker in REPRS:
            assert marker not in str(exc)
        return
    rendered = " ".join(built.prompts["prompt"])
    for marker in INTERNALS:
        assert marker not in rendered
    # nothing useful could have been rendered: the row is rejected, not generated
    assert list(built.prompts["item_id"]) == []
    assert [r.reasons for r in built.rejected] == [["template_error"]]


def test_sandbox_blocks_class_access_with_a_job_error(tokenizer):
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}])
    with pytest.raises(JobError, match="sandbox forbids"):
        build_prompts(items, PromptSpec(template="{{ ''.__class__.__mro__[1].__subclasses__() }}"), tokenizer, 2048,
                      COLUMNS)


def test_sandbox_keeps_input_values_immutable(tokenizer):
    # ImmutableSandboxedEnvironment: a template cannot change the row it renders
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}], columns=["name", "feature"])
    items["tags"] = [["a", "b"]]
    spec = PromptSpec(template="{{ tags.append('x') }}{{ name }} {{ tags | join(',') }}")
    try:
        built = build_prompts(items, spec, tokenizer, 2048, ["name", "feature", "tags"])
    except JobError:
        return
    assert "a,b,x" not in " ".join(built.prompts["prompt"])


def test_chinese_text_survives_rendering_and_tokenization(tokenizer):
    items = make_items([{"id": "p00001", "name": "星辰保温杯", "feature": "一键研磨"}])
    spec = PromptSpec(system="你是一名电商文案。",
                      template="请为以下商品撰写营销描述：\n商品名称：{{ name }}\n核心卖点：{{ feature }}")

    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    assert built.rejected == []
    prompt = built.prompts["prompt"].iloc[0]
    assert "商品名称：星辰保温杯" in prompt and "你是一名电商文案。" in prompt
    decoded = tokenizer.decode(built.prompts["prompt_token_ids"].iloc[0])
    assert "星辰保温杯" in decoded
    assert "核心卖点：一键研磨" in decoded
    assert decoded == prompt  # tokenization is lossless


@pytest.mark.parametrize("spec, message", [
    (PromptSpec(template="Describe {{ name | shout }}."), "prompt.template: line 1: No filter named 'shout'."),
    (PromptSpec(template="Describe\n{% if name is loud %}{{ name }}{% endif %}"),
     "prompt.template: line 2: No test named 'loud'."),
    (PromptSpec(system="{{ feature | nope }}", template="{{ name }}"), "prompt.system: line 1: No filter named 'nope'."),
], ids=["filter", "test", "system"])
def test_unknown_filter_or_test_is_a_job_error_naming_field_and_line(spec, message):
    with pytest.raises(JobError) as caught:
        check_template_columns(spec, COLUMNS)
    assert str(caught.value) == message


def test_runtime_error_of_a_template_rejects_only_that_row(tokenizer):
    items = make_items([{"id": "p1", "name": "Mug", "feature": 3.5}, {"id": "p2", "name": "Lamp", "feature": "3.5"},
                        {"id": "p3", "name": "Kettle", "feature": 2}])
    built = build_prompts(items, PromptSpec(template="{{ name }} for {{ '%.2f' % feature }}"), tokenizer, 2048,
                          COLUMNS)
    assert list(built.prompts["item_id"]) == ["p1", "p3"]
    assert "Mug for 3.50" in built.prompts["prompt"][0]
    [rejection] = built.rejected
    assert (rejection.item_id, rejection.reasons) == ("p2", ["template_error"])
    assert rejection.detail == "row 3: prompt.template: TypeError: must be real number, not str"


def test_chat_template_refusing_one_conversation_rejects_only_that_row(tokenizer):
    class Refusing:
        """The real tokenizer, whose chat template raises (as `raise_exception` does) on one conversation."""

        def apply_chat_template(self, conversation, **kwargs):
            batch = conversation if isinstance(conversation[0], list) else [conversation]
            if any("Boom" in m["content"] for c in batch for m in c):
                raise ValueError("Conversation roles must alternate user/assistant")
            return tokenizer.apply_chat_template(conversation, **kwargs)

        def __call__(self, texts, **kwargs):
            return tokenizer(texts, **kwargs)

    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}, {"id": "p2", "name": "Boom", "feature": "x"},
                        {"id": "p3", "name": "Lamp", "feature": "bright"}])
    built = build_prompts(items, PromptSpec(template="{{ name }}: {{ feature }}"), Refusing(), 2048, COLUMNS)
    assert list(built.prompts["item_id"]) == ["p1", "p3"]
    [rejection] = built.rejected
    assert rejection.reasons == ["template_error"]
    assert rejection.detail == ("row 3: the model's chat template refused the conversation: "
                                "ValueError: Conversation roles must alternate user/assistant")


PLAIN_TEMPLATE = ("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}[ASSISTANT]{% if terse %} (terse){% endif %}{% endif %}")


@pytest.mark.parametrize("from_file", [False, True])
def test_a_jobs_chat_template_and_its_variables_replace_the_models_own(tokenizer, tmp_path, from_file):
    from batchgen.job import job_from_dict

    if from_file:
        (tmp_path / "plain.jinja").write_text(PLAIN_TEMPLATE, encoding="utf-8")
    job = job_from_dict({
        "input": {"path": "items.csv"}, "output": {"dir": "out"},
        "prompt": {"system": "Be brief.", "template": "Describe {{ name }}.",
                   "chat_template": "plain.jinja" if from_file else PLAIN_TEMPLATE,
                   "chat_template_kwargs": {"terse": True}},
    }, base_dir=tmp_path)
    items = make_items([{"id": "p1", "name": "Aurora Mug", "feature": "hot"}])

    built = build_prompts(items, job.prompt, tokenizer, 2048, COLUMNS)

    prompt = built.prompts["prompt"].iloc[0]
    assert prompt == "[SYSTEM] Be brief.\n[USER] Describe Aurora Mug.\n[ASSISTANT] (terse)"
    assert "<|im_start|>" not in prompt  # not the model's template
    assert built.prompts["prompt_token_ids"].iloc[0] == tokenizer(prompt, add_special_tokens=False).input_ids


@pytest.mark.parametrize(("prompt", "message"), [
    ({"chat_template": "missing.jinja"}, "prompt.chat_template: ", ),
    ({"chat_template": "{% for m in messages %}"}, "prompt.chat_template: not a valid Jinja template"),
    ({"chat_template_kwargs": {"tokenize": True}}, "prompt.chat_template_kwargs: tokenize is set by batchgen"),
    ({"style": "completion", "system": None, "chat_template_kwargs": {"a": 1}},
     "prompt.chat_template_kwargs: needs style 'chat'"),
])
def test_a_chat_template_that_cannot_work_is_a_job_error(tmp_path, prompt, message):
    from batchgen.job import job_from_dict

    with pytest.raises(JobError) as err:
        job_from_dict({"input": {"path": "items.csv"}, "output": {"dir": "out"},
                       "prompt": {"system": "Be brief.", "template": "Describe {{ name }}.", **prompt}},
                      base_dir=tmp_path)
    assert message in str(err.value)


CHAT = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another one?"}]


@pytest.mark.parametrize("value", [CHAT, json.dumps(CHAT), tuple(CHAT)])
def test_conversation_accepts_lists_and_json_text(value):
    assert conversation(value, "chat") == CHAT


@pytest.mark.parametrize(("value", "message"), [
    ("[{", "chat is not a JSON list"),
    ([], "non-empty list"),
    ([{"role": "user"}], r"chat\[0\] must be an object with role and content"),
    ([{"role": "robot", "content": "x"}], r"chat\[0\].role is 'robot'"),
    ([{"role": "user", "content": 3}], r"chat\[0\].content must be text"),
    (CHAT[:2], "the last message is from the assistant"),
])
def test_conversation_rejects_what_is_not_a_chat(value, message):
    with pytest.raises(MessagesError, match=message):
        conversation(value, "chat")


def test_conversation_column_renders_every_turn_with_the_chat_template(tmp_path, tokenizer):
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [
        {"id": "c1", "chat": CHAT},
        {"id": "c2", "chat": [{"role": "assistant", "content": "Hi"}]},
        {"id": "c3", "chat": "not a list"},
    ]) + "\n", encoding="utf-8")
    loaded = load_items(InputSpec(path=str(path), id_column="id"))
    spec = PromptSpec(messages_column="chat", system="Answer in one word.")
    assert check_template_columns(spec, loaded.columns) == ["chat"]
    built = build_prompts(loaded.items, spec, tokenizer, 2048, loaded.columns)

    assert list(built.prompts["item_id"]) == ["c1"]
    expected = tokenizer.apply_chat_template([{"role": "system", "content": "Answer in one word."}, *CHAT],
                                             tokenize=False, add_generation_prompt=True)
    assert built.prompts["prompt"].iloc[0] == expected
    assert "Apple.<|im_end|>" in expected and expected.endswith("<|im_start|>assistant\n")
    reasons = {r.item_id: (r.reasons, r.detail) for r in built.rejected}
    assert reasons["c2"] == (["invalid_messages"], "row 2: chat: the last message is from the assistant; "
                                                   "the model answers a user message")
    assert reasons["c3"][0] == ["invalid_messages"]


def test_a_missing_conversation_column_is_a_job_error():
    with pytest.raises(JobError, match=r"prompt.messages_column: 'chat' is not a column"):
        check_template_columns(PromptSpec(messages_column="chat"), ["name"])


@pytest.mark.parametrize("job", ["product_descriptions.yaml", "product_descriptions_zh.yaml"])
def test_example_jobs_give_the_same_prompts_and_token_ids(job, tokenizer, tmp_path):
    spec = load_job(ROOT / "examples" / job)
    table = make_products.ZH if job.endswith("_zh.yaml") else make_products.EN
    make_products.write_csv(tmp_path / "products.csv", make_products.products(table, 2000, 7))
    loaded = load_items(InputSpec(path=str(tmp_path / "products.csv"), id_column="product_id"))
    assert compare(loaded.items, spec.prompt, tokenizer, 8192, loaded.columns, "name") == 2000


@pytest.mark.parametrize("spec", [
    PromptSpec(system="You write copy.", template="Describe {{ name }} ({{ feature }})."),
    PromptSpec(system="You write copy for {{ feature }}.", template="Describe {{ name }}."),
    PromptSpec(template="Describe {{ name }}."),
    PromptSpec(style="completion", template="{{ name }}: {{ feature }} ->"),
    PromptSpec(template="{% if feature == 'hot' %}   {% else %}{{ name }}{% endif %}"),  # empty_prompt rows
    PromptSpec(system="Be brief.", messages_column="chat"),
], ids=["chat", "system-with-column", "no-system", "completion", "empty", "messages"])
def test_rejections_and_prompts_match_row_for_row(spec, tokenizer):
    items, columns = rows_to_reject()
    compare(items, spec, tokenizer, 512, columns, "name")


def _many_items(n: int) -> pd.DataFrame:
    return make_items([{"id": f"p{i}", "name": f"Mug {i} " + "deluxe " * (i % 7), "feature": f"holds {i} ml ✓"}
                       for i in range(n)])


def test_many_prompts_are_the_chat_template_and_token_ids_of_each_row(tokenizer, monkeypatch):
    """A batch is rendered by the quick chat template and tokenized a slice per thread: the texts and ids must be
    apply_chat_template's and the tokenizer's own for every row, in the rows' order."""
    import batchgen.prompts as prompting

    monkeypatch.setattr(prompting, "tokenize_threads", lambda: 4)
    items = _many_items(300)
    spec = PromptSpec(system="You write short product copy.", template="Describe {{ name }}: {{ feature }}.")
    built = build_prompts(items, spec, tokenizer, 2048, COLUMNS)

    expected = [tokenizer.apply_chat_template(
        [{"role": "system", "content": "You write short product copy."},
         {"role": "user", "content": f"Describe {name}: {feature}."}], tokenize=False, add_generation_prompt=True)
        for name, feature in zip(items["name"], items["feature"])]
    assert built.prompts["prompt"].tolist() == expected
    assert built.prompts["prompt_token_ids"].tolist() == [
        tokenizer(text, add_special_tokens=False).input_ids for text in expected]
    assert built.prompts["item_id"].tolist() == items["item_id"].tolist()


def test_the_quick_chat_template_steps_aside_where_it_differs_from_apply_chat_template(tokenizer, monkeypatch):
    import batchgen.prompts as prompting

    monkeypatch.setattr(prompting._ChatTemplate, "render", lambda self, messages: "not what transformers renders")
    items = _many_items(5)
    built = build_prompts(items, PromptSpec(template="{{ name }}"), tokenizer, 2048, COLUMNS)
    assert built.prompts["prompt"].tolist() == [
        tokenizer.apply_chat_template([{"role": "user", "content": name}], tokenize=False, add_generation_prompt=True)
        for name in items["name"]]


def test_a_jobs_chat_template_that_refuses_one_conversation_rejects_only_that_row(tokenizer):
    """raise_exception in the job's own chat template, rendered by the quick path: that row is rejected with the
    template's message, the others keep their prompts."""
    template = ("{% for m in messages %}{% if 'Boom' in m['content'] %}{{ raise_exception('no booms here') }}"
                "{% endif %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    items = make_items([{"id": "p1", "name": "Mug", "feature": "hot"}, {"id": "p2", "name": "Boom", "feature": "x"},
                        {"id": "p3", "name": "Lamp", "feature": "bright"}])
    built = build_prompts(items, PromptSpec(template="{{ name }}: {{ feature }}", chat_template=template),
                          tokenizer, 2048, COLUMNS)
    assert built.prompts["prompt"].tolist() == ["<user>Mug: hot\n<assistant>", "<user>Lamp: bright\n<assistant>"]
    [rejection] = built.rejected
    assert rejection.item_id == "p2" and rejection.reasons == ["template_error"]
    assert "no booms here" in rejection.detail
