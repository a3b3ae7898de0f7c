"""The report's numbers: finish reasons per attempt, output lengths, pass rates per expectation, throughput."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from batchgen.report.read import SAMPLE_SIZE, Publication

THROUGHPUT_BINS = 60


def pass_label(index: int) -> str:
    """validation.json holds one result per pass, in order: the first pass, then each retry pass."""
    return "first pass" if index == 0 else f"retry {index}"


def finish_reasons_per_attempt(pub: Publication) -> pd.DataFrame:
    """Rows: attempt number; columns: finish reason; values: outputs."""
    return pub.finish


def pass_rate_per_expectation(validation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (pass, expectation): rows checked, rows failed, pass rate."""
    lines = []
    for index, result in enumerate(validation):
        for outcome in result.get("results", []):
            config = outcome.get("expectation_config", {})
            res = outcome.get("result", {}) or {}
            total, failed = res.get("element_count"), res.get("unexpected_count")
            lines.append({
                "pass": pass_label(index),
                "expectation": (config.get("meta") or {}).get("batchgen_id", config.get("type")),
                "description": config.get("description") or config.get("type"),
                "rows": total,
                "failed": failed,
                "pass_rate": round(1 - failed / total, 4) if total and failed is not None else None,
            })
    return lines


def pass_rate_all_passes(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per expectation, over every pass, weighted by rows: a 4-row retry pass counts 4 rows, not one pass."""
    totals: dict[str, list[Any]] = {}
    for line in lines:
        if line["rows"] is None or line["failed"] is None:
            continue
        entry = totals.setdefault(line["expectation"], [line["description"], 0, 0])
        entry[1] += line["rows"]
        entry[2] += line["failed"]
    return [{"pass": "all passes (by rows)", "expectation": name, "description": description, "rows": rows,
             "failed": failed, "pass_rate": round(1 - failed / rows, 4) if rows else None}
            for name, (description, rows, failed) in totals.items()]


def pass_rates(validation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pass-rate table: one line per (pass, expectation), then the totals over all passes when there was a retry
    pass."""
    per_pass = pass_rate_per_expectation(validation)
    return per_pass + (pass_rate_all_passes(per_pass) if len(validation) > 1 else [])


def output_lengths(pub: Publication) -> pd.DataFrame:
    """Characters of every published output: accepted, and rejected ones that have a text."""
    return pub.lengths


def throughput(pub: Publication) -> pd.DataFrame:
    """One row per engine chunk generated in this run: seconds since the run started, tokens/s, cumulative tokens."""
    chunks = pub.chunks.copy()
    if chunks.empty:
        return pd.DataFrame(columns=["seconds", "tokens", "tokens_per_second", "cumulative_tokens"])
    chunks["seconds"] = (chunks["chunk_finished_at"] - pd.Timestamp(pub.started_at)).dt.total_seconds()
    chunks["tokens_per_second"] = chunks["tokens"] / chunks["chunk_seconds"].where(chunks["chunk_seconds"] > 0)
    chunks["cumulative_tokens"] = chunks["tokens"].cumsum()
    return chunks[["seconds", "tokens", "tokens_per_second", "cumulative_tokens"]]


def throughput_over_time(pub: Publication, bins: int = THROUGHPUT_BINS) -> pd.DataFrame:
    """Output tokens/s of the whole engine over the run, on a grid of at most `bins` intervals.

    Each chunk's tokens are spread evenly over the time it took (`chunk_seconds` before it finished), and
    chunks of windows that overlap add up: one chunk gives one flat interval at its own rate, a thousand
    a curve, and the area under it is the tokens generated in this run.
    """
    chunks = throughput(pub)
    columns = ["start", "end", "tokens_per_second"]
    if chunks.empty:
        return pd.DataFrame(columns=columns)
    spans = pub.chunks["chunk_seconds"].fillna(0).clip(lower=0).to_numpy(float)
    ends = chunks["seconds"].to_numpy(float)
    starts = ends - spans
    tokens = chunks["tokens"].to_numpy(float)
    first, last = float(starts.min()), float(ends.max())
    if last <= first:
        return pd.DataFrame(columns=columns)
    edges = np.linspace(first, last, min(bins, max(1, len(chunks))) + 1)
    width = edges[1:] - edges[:-1]
    rates = np.zeros(len(width))
    for start, end, count in zip(starts, ends, tokens):
        if end <= start:  # no duration recorded: all its tokens at its finish
            at = min(np.searchsorted(edges, end, side="right") - 1, len(width) - 1)
            rates[max(at, 0)] += count / width[max(at, 0)]
            continue
        overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0, None)
        rates += count * overlap / (end - start) / width
    return pd.DataFrame({"start": edges[:-1], "end": edges[1:], "tokens_per_second": rates})


def samples(pub: Publication, size: int = SAMPLE_SIZE) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A fixed-seed sample of accepted and of rejected rows, in input order."""
    return pub.accepted_sample[:size], pub.rejected_sample[:size]
