"""The run summary as markdown, for the Prefect UI and the terminal."""

from __future__ import annotations

from typing import Any

from batchgen.records import Manifest


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _code(code: dict[str, Any] | None) -> str:
    if not code:
        return "not a git checkout"
    return f"`{code['commit'][:12]}`" + (" (with uncommitted changes)" if code.get("dirty") else "")


def summary_markdown(manifest: Manifest) -> str:
    counts, rates, tokens = manifest.counts, manifest.rates, manifest.tokens
    lines = [
        f"# {manifest.job}: batch generation summary",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| items | {counts.items} |",
        f"| accepted | {counts.accepted} ({_pct(rates.pass_rate)}) |",
        f"| rejected | {counts.rejected} |",
        f"| truncated, first pass | {counts.truncated_first_pass} ({_pct(rates.truncation_first_pass)}) |",
        f"| truncated, final | {counts.truncated_final} ({_pct(rates.truncation_final)}) |",
        f"| retry attempts | {counts.retry_attempts} |",
        f"| accepted after a retry | {counts.rescued} |",
        f"| results reused from earlier commits | {counts.reused} |",
        f"| output tokens (generated this run) | {tokens.generated_this_run} |",
        f"| output tokens/s (generation) | {tokens.output_per_second} |",
        f"| model | {manifest.model.get('name')} |",
        f"| dtype vLLM used | {(manifest.engine_loaded or {}).get('dtype') or 'n/a (no engine ran)'} |",
        f"| input SHA-256 | `{((manifest.input_file or {}).get('sha256') or 'n/a')[:16]}` |",
        f"| code | {_code(manifest.code)} |",
        f"| published as | `current` -> `publications/{manifest.publication or '?'}` |",
        "",
        "**Rejected by reason**",
        "",
        "| reason | items |",
        "| --- | --- |",
    ]
    lines += [f"| {reason} | {n} |" for reason, n in counts.rejected_by_reason.items()] or ["| (none) | 0 |"]
    if counts.rescued_by_reason:
        lines += ["", "**Rescued by retries, by the reason an earlier attempt failed**", "", "| reason | items |",
                  "| --- | --- |"]
        lines += [f"| {reason} | {n} |" for reason, n in counts.rescued_by_reason.items()]
    lines += ["", "**Timings (s)**", "", "| step | seconds |", "| --- | --- |"]
    lines += [f"| {step} | {seconds} |" for step, seconds in manifest.timings_seconds.items()]
    return "\n".join(lines) + "\n"
