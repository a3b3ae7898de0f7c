"""Issue 15: every user mistake stops before the engine starts, with a message naming the field, file or row.

`batchgen check` (and `batchgen run`, which runs the same checks first) on each mistake a new user
made: a template that compiles but fails, values vLLM refuses, a model that is not there, an
output folder that cannot be written, long cells, ids equal to batchgen's own labels. Either the
command exits 2 (the job) or 3 (the input) with one line and no traceback, or it exits 0 and
the row is in `would_reject` with its reason while the other rows are still generated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from batchgen.cli import EXIT_BAD_DATA, EXIT_BAD_JOB, app

CSV = "product_id,name,price\np1,Mug,3.50\np2,Lamp,4\np3,Kettle,12\n"


def job_file(tmp_path: Path, data: Path | None = None, **sections: Any) -> Path:
    if data is None:
        data = tmp_path / "items.csv"
        data.write_text(CSV, encoding="utf-8")
    spec: dict[str, Any] = {
        "input": {"path": str(data), "id_column": "product_id"},
        "prompt": {"template": "Describe {{ name }}."},
        "sampling": {"max_tokens": 8},
        "output": {"dir": str(tmp_path / "out")},
    }
    for section, values in sections.items():
        spec[section] = {**spec.get(section, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    return path


def invoke(*args: str) -> tuple[int, str, dict | None]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    report = json.loads(result.stdout) if result.exit_code == 0 and args[0] == "check" else None
    return result.exit_code, result.stderr, report


def rejects(report: dict) -> dict[str, tuple[list[str], str]]:
    return {r["item_id"]: (r["reasons"], r["detail"]) for r in report["would_reject"]}


def assert_stops(code: int, err: str, expected_code: int, message: str) -> None:
    assert code == expected_code, err
    # one line, the last (libraries imported on the way may warn before it under pytest)
    assert err.strip().splitlines()[-1] == f"batchgen: {message}", err


# ------------------------------------------------------------------ templates

@pytest.mark.parametrize("command", ["check", "run"])
def test_unknown_filter_stops_check_and_run_naming_the_field_and_line(tmp_path, command):
    job = job_file(tmp_path, prompt={"template": "Describe\n{{ name | shout }}."})
    assert_stops(*invoke(command, job)[:2], EXIT_BAD_JOB, "prompt.template: line 2: No filter named 'shout'.")


def test_unknown_test_inside_an_if_is_caught_before_any_row(tmp_path):
    job = job_file(tmp_path, prompt={"template": "{% if price is cheap %}Cheap {% endif %}{{ name }}"})
    assert_stops(*invoke("check", job)[:2], EXIT_BAD_JOB, "prompt.template: line 1: No test named 'cheap'.")


def test_runtime_error_of_a_template_rejects_each_row_it_fails_on(tmp_path):
    # CSV cells are text: '%.2f' % price fails on every row, as the README's template_error says
    job = job_file(tmp_path, prompt={"template": "{{ name }} at {{ '%.2f' % price }}"})
    code, err, report = invoke("check", job)
    assert code == 0, err
    assert report["would_generate"] == 0
    assert rejects(report)["p2"] == (["template_error"], "row 2: prompt.template: TypeError: must be real number, "
                                                         "not str")
    # the same template on numbers renders: only the row whose cell is text is rejected
    data = tmp_path / "items.jsonl"
    data.write_text('{"product_id": "p1", "name": "Mug", "price": 3.5}\n'
                    '{"product_id": "p2", "name": "Lamp", "price": "4"}\n', encoding="utf-8")
    code, err, report = invoke("check", job_file(tmp_path, data, prompt={"template": "{{ name }} {{ '%.2f' % price }}"}))
    assert (code, report["would_generate"], list(rejects(report))) == (0, 1, ["p2"])


# ------------------------------------------------------------------ --set

def test_set_value_that_is_not_yaml_exits_2(tmp_path):
    code, err, _ = invoke("check", job_file(tmp_path), "--set", 'sampling.stop=["\\n\\n"')
    assert code == EXIT_BAD_JOB
    assert err.startswith("batchgen: override 'sampling.stop=[\"\\\\n\\\\n\"': the value is not valid YAML")


# ------------------------------------------------------------------ the model

def test_model_folder_that_does_not_exist_exits_2(tmp_path):
    code, err, _ = invoke("check", job_file(tmp_path, engine={"model": str(tmp_path / "no-model")}))
    assert_stops(code, err, EXIT_BAD_JOB, f"engine.model: {tmp_path / 'no-model'} does not exist (engine.model is a "
                                          f"model folder, or a hub id of the form org/name)")


def test_model_folder_without_weights_or_tokenizer_exits_2(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    job = job_file(tmp_path, engine={"model": str(folder)})
    assert_stops(*invoke("check", job)[:2], EXIT_BAD_JOB,
                 f"engine.model: {folder} holds no weights (*.safetensors, *.bin, *.pt, *.pth)")
    (folder / "model.safetensors").write_bytes(b"")
    assert_stops(*invoke("check", job)[:2], EXIT_BAD_JOB,
                 f"engine.model: {folder} holds no tokenizer (tokenizer.json, tokenizer_config.json, "
                 f"tokenizer.model, vocab.json)")
    (folder / "config.json").write_text("{not json")
    code, err, _ = invoke("check", job)
    assert code == EXIT_BAD_JOB and err.startswith(f"batchgen: engine.model: {folder / 'config.json'} cannot be read "
                                                   f"as JSON"), err


def test_hub_id_that_cannot_be_reached_offline_exits_2(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported: the constant too
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, err, _ = invoke("check", job_file(tmp_path, engine={"model": "nobody/no-such-model"}))
    assert code == EXIT_BAD_JOB, err
    assert err.startswith("batchgen: engine.model: 'nobody/no-such-model' is not a local folder, and as a hub id it "
                          "cannot be loaded: "), err


def test_max_model_len_above_the_models_exits_2_in_one_line(tmp_path):
    code, err, _ = invoke("check", job_file(tmp_path, engine={"max_model_len": 100000}))
    assert_stops(code, err, EXIT_BAD_JOB,
                 "engine.max_model_len: vLLM refuses it: User-specified max_model_len (100000) is greater than the "
                 "derived max_model_len (max_position_embeddings=8192.0 or model_max_length=None in model's "
                 "config.json).")


def test_dtype_vllm_does_not_know_exits_2_with_vllms_choices(tmp_path):
    assert_stops(*invoke("check", job_file(tmp_path, engine={"dtype": "float9"}))[:2], EXIT_BAD_JOB,
                 "engine.dtype: vLLM refuses it: Input should be 'auto', 'half', 'float16', 'bfloat16', 'float' or "
                 "'float32'")


def test_unknown_engine_extra_arg_exits_2(tmp_path):
    code, err, _ = invoke("check", job_file(tmp_path, engine={"extra_args": {"max_num_batched_tokenz": 8}}))
    assert_stops(code, err, EXIT_BAD_JOB, "engine.extra_args: 'max_num_batched_tokenz' is not an argument of vllm.LLM")


# ------------------------------------------------------------------ sampling, by vLLM's own rules

@pytest.mark.parametrize("command", ["check", "run"])
def test_temperature_vllm_refuses_stops_check_and_run(tmp_path, command):
    job = job_file(tmp_path, sampling={"temperature": 5})
    assert_stops(*invoke(command, job)[:2], EXIT_BAD_JOB,
                 "sampling.temperature: vLLM refuses it: temperature must be in [0, 2], got 5.0.")


# ------------------------------------------------------------------ the job's own GX expectations

@pytest.mark.parametrize("command", ["check", "run"])
def test_gx_expectation_that_cannot_evaluate_the_outputs_stops_before_the_engine(tmp_path, command):
    """GX accepts the expectation's arguments, but comparing the text with a number raises in its metric: evaluated
    on a sample output before the engine starts, it stops the job naming it (GX would otherwise pass every output)."""
    job = job_file(tmp_path, expectations={"gx": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "text", "min_value": 5}}]})
    code, err, _ = invoke(command, job)
    assert code == EXIT_BAD_JOB, err
    assert err.strip().splitlines()[-1].startswith(
        "batchgen: expectations.gx.0: Great Expectations could not evaluate expect_column_values_to_be_between on "
        "the outputs: "), err
    assert not (tmp_path / "out" / "publications").exists()


def test_stop_token_outside_the_vocabulary_exits_2(tmp_path):
    job = job_file(tmp_path, sampling={"stop_token_ids": [10_000_000]})
    assert_stops(*invoke("check", job)[:2], EXIT_BAD_JOB,
                 "sampling.stop_token_ids: vLLM refuses it: token_id(s) [10000000] in stop_token_ids contain "
                 "out-of-vocab token ids.")


def test_row_override_vllm_refuses_rejects_only_that_row(tmp_path):
    data = tmp_path / "items.csv"
    data.write_text("product_id,name,temp\np1,Mug,0.2\np2,Lamp,3\np3,Kettle,\n", encoding="utf-8")
    code, err, report = invoke("check", job_file(tmp_path, data, sampling={"overrides": {"temperature": "temp"}}))
    assert code == 0, err
    assert report["would_generate"] == 2
    assert rejects(report) == {"p2": (["invalid_override"], "row 2: sampling.overrides.temperature (column temp): 3.0 "
                                                            "is refused by vLLM: temperature must be in [0, 2], got 3.0.")}


# ------------------------------------------------------------------ the output folder

def test_output_dir_that_is_a_file_or_under_a_file_exits_2(tmp_path):
    (tmp_path / "taken").write_text("x")
    job = job_file(tmp_path, output={"dir": str(tmp_path / "taken")})
    assert_stops(*invoke("check", job)[:2], EXIT_BAD_JOB, f"output.dir: {tmp_path / 'taken'} is a file, not a folder")
    job = job_file(tmp_path, output={"dir": str(tmp_path / "taken" / "out")})
    assert_stops(*invoke("run", job)[:2], EXIT_BAD_JOB,
                 f"output.dir: {tmp_path / 'taken' / 'out'} cannot be created: {tmp_path / 'taken'} is a file")


def test_output_dir_that_is_not_writable_exits_2(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    if os.geteuid() != 0:
        out.chmod(0o500)
    else:  # root writes anywhere: this user's answer for that folder is faked
        real = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == out else real(path, mode, **kw))
    try:
        assert_stops(*invoke("check", job_file(tmp_path))[:2], EXIT_BAD_JOB,
                     f"output.dir: {out} is not writable by this user")
    finally:
        out.chmod(0o755)


# ------------------------------------------------------------------ the input

def test_csv_cell_over_pythons_field_limit_is_rejected_per_row(tmp_path):
    data = tmp_path / "items.csv"
    data.write_text(f"product_id,name,price\np1,Mug,3\np2,{'Lamp ' * 30000},4\np3,Kettle,5\n", encoding="utf-8")
    code, err, report = invoke("check", job_file(tmp_path, data))
    assert code == 0, err
    assert report["would_generate"] == 2
    assert rejects(report)["p2"][0] == ["prompt_too_long"]


def test_ids_equal_to_batchgens_own_labels_are_all_accounted_for(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text('{"product_id": "line-2", "name": "Mug"}\n{not json\n{"product_id": "row-4", "name": "Lamp"}\n'
                    '{"name": "no id"}\n', encoding="utf-8")
    code, err, report = invoke("check", job_file(tmp_path, data))
    assert code == 0, err
    assert report["would_generate"] == 2
    assert rejects(report) == {"line-2~2": (["invalid_json"], "line 2: Expecting property name enclosed in double "
                                                              "quotes"),
                               "row-4~2": (["missing_id"], "row 4: product_id is empty")}
    ids = {"line-2", "row-4"} | set(rejects(report))
    assert len(ids) == report["items"] == 4


def test_jsonl_whose_every_line_is_invalid_lists_each_line(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text("{oops\n[1, 2]\n", encoding="utf-8")
    code, err, report = invoke("check", job_file(tmp_path, data, expectations={"keyword_column": "name"}))
    assert code == 0, err
    assert report["would_generate"] == 0
    assert {k: v[0] for k, v in rejects(report).items()} == {"line-1": ["invalid_json"], "line-2": ["invalid_json"]}


def test_symlink_loop_and_dangling_link_say_so(tmp_path):
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    assert_stops(*invoke("check", job_file(tmp_path, loop))[:2], EXIT_BAD_DATA,
                 f"{loop}: the input is a symbolic link that loops back on itself")
    dangling = tmp_path / "gone.csv"
    dangling.symlink_to(tmp_path / "nowhere.csv")
    assert_stops(*invoke("check", job_file(tmp_path, dangling))[:2], EXIT_BAD_DATA,
                 f"{dangling}: the input is a symbolic link to {tmp_path / 'nowhere.csv'}, which does not exist")


def test_input_this_user_cannot_read_exits_3(tmp_path, monkeypatch):
    data = tmp_path / "items.csv"
    data.write_text(CSV, encoding="utf-8")
    import builtins

    real = builtins.open

    def refuse(file, *args, **kwargs):
        if str(file) == str(data):
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)  # root reads everything: the refusal is faked
    assert_stops(*invoke("check", job_file(tmp_path, data))[:2], EXIT_BAD_DATA,
                 f"{data}: the input cannot be read: Permission denied")


def batchgen(*args: str) -> tuple[int, str]:
    """The command in a process of its own, as a user runs it (Prefect binds its log handler to the first
    stderr it sees, which CliRunner closes after each command)."""
    import subprocess
    import sys

    result = subprocess.run([str(Path(sys.executable).with_name("batchgen")), *map(str, args)], capture_output=True,
                            text=True, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr


def test_run_sharded_stops_on_the_same_mistakes_before_any_shard(tmp_path):
    job = job_file(tmp_path, prompt={"template": "{{ name | shout }}"}, sampling={"temperature": 5})
    assert_stops(*batchgen("run-sharded", job, "--shards", "2"), EXIT_BAD_JOB,
                 "prompt.template: line 1: No filter named 'shout'.")
    assert_stops(*batchgen("run-sharded", job, "--set", 'prompt.template="{{ name }}"'), EXIT_BAD_JOB,
                 "sampling.temperature: vLLM refuses it: temperature must be in [0, 2], got 5.0.")


def test_clean_removes_what_killed_publishes_left_and_names_a_folder_that_is_no_output(tmp_path):
    from batchgen import publish

    job = job_file(tmp_path)
    out = tmp_path / "out"
    left = out / "publications" / "20260101T000000000000Z-deadbeef"  # a staging whose writer was killed
    left.mkdir(parents=True)
    (left / "results.parquet").write_bytes(b"x")
    (left / publish.LOCK).write_text("")
    first = CliRunner().invoke(app, ["clean", str(job)])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"output": str(out), "removed": [str(left)]}
    assert not left.exists()
    again = CliRunner().invoke(app, ["clean", str(out)])
    assert json.loads(again.stdout) == {"output": str(out), "removed": []}
    code, err, _ = invoke("clean", tmp_path / "items.csv")  # not a job file
    assert code == EXIT_BAD_JOB and "the job must be a mapping of sections" in err, err
    assert_stops(*invoke("clean", tmp_path)[:2], 4, f"{tmp_path}: not a batchgen output folder (no publications/ in it)")


def test_engine_extra_args_holding_a_mapping_pass_to_vllm_unchanged(tmp_path):
    # vLLM takes some arguments as mappings (hf_overrides, compilation_config): checked as given
    code, err, report = invoke("check", job_file(tmp_path, engine={"extra_args": {"hf_overrides": {"foo": 1}}}))
    assert code == 0, err
    assert report["would_generate"] == 3


# ------------------------------------------------------------------ what check shows before a run

def test_check_shows_the_first_prompts_as_the_model_sees_them(tmp_path):
    job = job_file(tmp_path, prompt={"system": "You sell things.", "template": "Describe {{ name }}."})
    result = CliRunner().invoke(app, ["check", str(job)])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    first = report["prompts"][0]
    assert (first["item_id"], first["row"]) == ("p1", 1)  # the first data row (row numbers count data rows from 1)
    # after the model's chat template: the system and user turns, and the assistant turn it answers in
    assert first["text"].endswith("<|im_start|>system\nYou sell things.<|im_end|>\n<|im_start|>user\nDescribe Mug."
                                  "<|im_end|>\n<|im_start|>assistant\n")
    assert [p["item_id"] for p in report["prompts"]] == ["p1", "p2", "p3"]
    assert report["prompt_tokens"]["min"] <= first["n_prompt_tokens"] <= report["prompt_tokens"]["max"]
    assert "--- prompt of row 1 (item p1" in result.stderr and "Describe Mug.<|im_end|>" in result.stderr
    quiet = CliRunner().invoke(app, ["check", str(job), "--quiet"])
    assert quiet.exit_code == 0 and "--- prompt" not in quiet.stderr


def test_check_warns_when_the_budget_cannot_hold_the_shortest_acceptable_output(tmp_path):
    job = job_file(tmp_path, expectations={"min_chars": 200}, sampling={"max_tokens": 8})
    result = CliRunner().invoke(app, ["check", str(job)])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    truncation = report["truncation"]
    assert truncation["basis"] == "expectations" and 2 < truncation["chars_per_token"] < 8
    assert truncation["min_chars_tokens"] > 8 and truncation["budget_chars"] < 200
    [warning] = report["warnings"]
    assert warning.startswith("sampling.max_tokens 8 holds about ") and "expectations.min_chars 200" in warning
    assert f"batchgen: warning: {warning}" in result.stderr.splitlines()

    # a budget that holds min_chars: no warning, and the note says how to measure the model's own length
    _, err, report = invoke("check", job_file(tmp_path, expectations={"min_chars": 20}, sampling={"max_tokens": 64}))
    assert report["warnings"] == [] and "--sample N" in report["truncation"]["note"]
    assert "warning" not in err
