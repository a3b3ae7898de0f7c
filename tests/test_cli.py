"""The command line as a user meets it: help, job errors, data errors, check, run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, product_job
from tests.servers import prefect_home

BATCHGEN = [sys.executable, "-m", "batchgen.cli"]


def run_cli(args, tmp_path, timeout=600, module=None):
    env = {**os.environ, "PREFECT_HOME": str(prefect_home(tmp_path / "prefect-home"))}
    command = [sys.executable, "-m", module, *args] if module else [*BATCHGEN, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def write_job(tmp_path: Path, job: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, allow_unicode=True), encoding="utf-8")
    return path


def _cli():
    """The command line as click sees it: the typer app's group, its commands and their parameters."""
    import typer.main

    from batchgen.cli import app

    return typer.main.get_command(app)


def _shown(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


@pytest.mark.parametrize("command", [[], *([name] for name in sorted(_cli().commands))],
                         ids=lambda command: " ".join(command) or "batchgen")
def test_help_documents_every_option(command, tmp_path, monkeypatch):
    """Every command's --help names each of its options and arguments with the help text the parser holds."""
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option: help text is not wrapped in the table
    result = run_cli([*command, "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    group = _cli()
    if not command:
        for name, sub in group.commands.items():
            assert _shown(name, shown), f"{name} is not listed in batchgen --help"
            assert sub.help, f"batchgen {name} has no help text"
        return
    params = [p for p in group.commands[command[0]].params if not getattr(p, "hidden", False)]
    assert params
    for param in params:
        if param.param_type_name == "option":
            for name in param.opts + param.secondary_opts:
                assert _shown(name, shown), f"batchgen {command[0]} --help does not show {name}"
        else:
            shown_as = (param.metavar or param.name).upper()  # e.g. DATA_FILE in the usage line and the table
            assert _shown(shown_as, shown.upper()), f"batchgen {command[0]} --help lacks {shown_as}"
        assert param.help, f"batchgen {command[0]}: {param.name} has no help text"
        assert " ".join(param.help.split()) in shown, f"batchgen {command[0]} --help lacks the help of {param.name}"


@pytest.mark.parametrize(
    "change, field",
    [
        ({"sampling": {"max_tokn": 5}}, "sampling.max_tokn"),
        ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
        ({"sampling": {"seed": 3}}, "sampling.seed: not on a CPU build of vLLM"),
        ({"expectations": {"must_match": ["(unclosed"]}}, "expectations.must_match"),
        ({"retry": {"strategy": "louder"}}, "retry.strategy"),
    ],
)
def test_bad_job_exits_2_naming_the_field(change, field, tmp_path):
    job = product_job(tmp_path, 3)
    for section, values in change.items():
        job[section] = {**job.get(section, {}), **values}
    for command in ("run", "check"):
        result = run_cli([command, str(write_job(tmp_path, job))], tmp_path)
        assert result.returncode == 2, result.stderr
        assert field in result.stderr
        assert "Traceback" not in result.stderr


def test_template_with_an_unknown_column_fails_before_the_engine(tmp_path):
    job = product_job(tmp_path, 3, prompt={"template": "Describe {{ title }}"})
    result = run_cli(["run", str(write_job(tmp_path, job))], tmp_path)
    assert result.returncode == 2
    assert "'title'" in result.stderr and "product_id, name, feature, audience" in result.stderr
    assert not (tmp_path / "out" / ".batchgen").exists()  # nothing was generated


def test_unreadable_input_exits_3_naming_the_file_and_line(tmp_path):
    job = product_job(tmp_path, 3)
    (tmp_path / "products.csv").write_text("product_id,name,feature,audience\np1,A,b,c\np2,B,c\n")
    result = run_cli(["check", str(write_job(tmp_path, job))], tmp_path)
    assert result.returncode == 3
    assert "products.csv: line 3: expected 4 fields" in result.stderr
    job["input"]["path"] = str(tmp_path / "nope.csv")
    result = run_cli(["run", str(write_job(tmp_path, job))], tmp_path)
    assert result.returncode == 3 and "nope.csv: input file not found" in result.stderr, result.stderr[-3000:]


def test_check_lists_exactly_the_rows_that_would_be_rejected(tmp_path):
    job = product_job(tmp_path, 3)
    (tmp_path / "products.csv").write_text(
        "product_id,name,feature,audience\n"
        "p1,Lamp,bright,students\n"
        "p2,,quiet,parents\n"       # no name: the template needs it
        "p1,Lamp again,bright,students\n"  # duplicate id
        "p4,Kettle,fast,cooks\n",
        encoding="utf-8",
    )
    result = run_cli(["check", str(write_job(tmp_path, job)), "--set", "sampling.max_tokens=50"], tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["items"] == 4 and report["would_generate"] == 2
    assert sorted((r["row"], r["reasons"][0]) for r in report["would_reject"]) == [
        (2, "missing_field"), (3, "duplicate_id")]  # data rows, from 1
    assert report["estimate"]["max_output_tokens_first_pass"] == 2 * 50
    assert 0 < report["prompt_tokens"]["min"] <= report["prompt_tokens"]["max"] < report["prompt_tokens"]["model_limit"]


# What vLLM, torch, GX and Prefect print unless `--verbose`: none of it may reach a default run's terminal.
NOISE = ("[vllm", "Loading safetensors", "Calculating Metrics", "Warning", "NUMA", "| INFO", "Task run", "Flow run",
         "it/s]")


@pytest.mark.engine
def test_job_runs_from_the_command_line_both_ways(tmp_path, monkeypatch):
    """`batchgen run`, then `python -m batchgen run` on the same job: the second reuses every result.

    Both as a user's terminal shows them (stderr not a terminal here, as in a log): no library noise, a
    progress line of the whole job every BATCHGEN_PROGRESS_SECONDS, and a last line naming the report."""
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)  # the tests' own quieting: the user's default instead
    monkeypatch.setenv("BATCHGEN_PROGRESS_SECONDS", "1")
    job = product_job(tmp_path, 6, retry={"max_passes": 1})
    path = write_job(tmp_path, job)
    manifests = []
    for way in ("batchgen run", "python -m batchgen run"):
        if way == "batchgen run":
            result = run_cli(["run", str(path), "--limit", "4", "--set", "sampling.max_tokens=24"], tmp_path)
        else:
            result = run_cli(["run", str(path), "--limit", "4", "--set", "sampling.max_tokens=24"], tmp_path,
                             module="batchgen")
        assert result.returncode == 0, f"{way}: {result.stderr[-3000:]}"
        summary = json.loads(result.stdout)
        lines = result.stderr.splitlines()
        assert not [line for line in lines if any(noise in line for noise in NOISE)], result.stderr[-3000:]
        progress = [line for line in lines if line.startswith("test-products: ")]
        assert progress and progress[-1].startswith("test-products: 4/4 items (100%)"), lines
        assert len(lines) - len(progress) <= 3, lines  # the last line, and at most a warning or two of substance
        published = (tmp_path / "out" / "current").resolve()
        assert lines[-1].endswith(f"in {published}; report: {published / 'report.html'}"), lines[-1]
        assert summary["report"] == str(published / "report.html") and (published / "report.html").is_file()
        manifest = json.loads((tmp_path / "out" / "current" / "manifest.json").read_text())
        assert summary["counts"] == manifest["counts"], way
        assert manifest["counts"]["items"] == 4, way  # --limit
        assert manifest["sampling"]["max_tokens"] == 24, way  # --set
        assert manifest["flow_name"] == "batch-generation", way
        manifests.append(manifest)
    first, second = manifests
    assert first["tokens"]["generated_this_run"] > 0 and first["counts"]["reused"] == 0
    assert second["flow_run_id"] != first["flow_run_id"]
    assert second["tokens"]["generated_this_run"] == 0  # same job, same output: nothing generated again
    assert second["counts"]["reused"] == first["counts"]["attempts"]
    assert {k: v for k, v in second["counts"].items() if k != "reused"} == \
        {k: v for k, v in first["counts"].items() if k != "reused"}

    # `check` says, without the engine, what a run of the whole file (6 items) would reuse and generate
    result = run_cli(["check", str(path), "--set", "sampling.max_tokens=24"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    store = tmp_path / "out" / ".batchgen" / "results"
    assert json.loads(result.stdout)["resume"] == {"committed": 4, "to_generate": 2, "store": str(store)}
    assert f"4 of 6 first-pass outputs are already committed in {store}: a run reuses them and generates the " \
           "other 2" in result.stderr
    other = json.loads(run_cli(["check", str(path), "-q"], tmp_path).stdout)["resume"]  # another max_tokens
    assert (other["committed"], other["to_generate"]) == (0, 6)


def test_keyword_column_missing_from_the_input_is_a_job_error(tmp_path):
    job = product_job(tmp_path, 3, expectations={"keyword_column": "title"})
    for command in ("check", "run"):
        result = run_cli([command, str(write_job(tmp_path, job))], tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "expectations.keyword_column: 'title' is not a column" in result.stderr
