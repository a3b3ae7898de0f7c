"""The run report: `report.html` (offline, charts embedded) and GX Data Docs in a publication directory.

Everything here is a function of the publication directory alone (manifest.json, the
Parquet tables, validation.json), so `batchgen report RUN_DIR` rebuilds exactly what the
publish step wrote. Charts are matplotlib PNGs inlined as data URIs: the page needs no
network and no JavaScript. Data Docs come from GX's own site builder, written into
`data_docs/` with relative links, so the folder can be moved or copied as a whole.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchgen.offline_docs import Page, make_offline
from batchgen.files import write_text as write_text_atomic
from batchgen.publish import ATTEMPTS, MANIFEST, REJECTED, RESULTS, VALIDATION

REPORT = "report.html"
DATA_DOCS = "data_docs"
SAMPLE_SIZE = 10

log = logging.getLogger("batchgen.report")


class NotAPublicationError(ValueError):
    """The directory does not hold a complete batchgen publication."""


@dataclass
class Publication:
    """What the report shows of a publication: its manifest and GX results, and aggregates of its tables
    (one scan, a batch of rows at a time: the report's memory does not grow with the run)."""

    root: Path
    manifest: dict[str, Any]
    validation: list[dict[str, Any]]
    finish: pd.DataFrame  # outputs per (attempt, finish reason)
    lengths: pd.DataFrame  # chars, status: one row per published output with a text
    chunks: pd.DataFrame  # per engine chunk of this run: chunk_finished_at, tokens, chunk_seconds
    accepted_sample: list[dict[str, Any]]
    rejected_sample: list[dict[str, Any]]


BATCH_ROWS = 8192


def _batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    reader = pq.ParquetFile(path)
    present = [c for c in columns if c in reader.schema_arrow.names]
    yield from reader.iter_batches(batch_size=BATCH_ROWS, columns=present)


def _lengths(path: Path, status: str) -> np.ndarray:
    """Characters of every output with a text (accepted: a missing text counts as 0)."""
    parts = []
    for batch in _batches(path, ["text"]):
        text = batch.column(0)
        if status == "rejected":
            text = pc.drop_null(text)
        parts.append(pc.fill_null(pc.utf8_length(text), 0).to_numpy(zero_copy_only=False).astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _sample(path: Path, columns: list[str], size: int) -> list[dict[str, Any]]:
    """A fixed-seed sample of `size` rows (pandas' `sample(random_state=0)` draw), in input order."""
    rows = pq.ParquetFile(path).metadata.num_rows
    wanted = (np.sort(np.random.RandomState(0).choice(rows, size=size, replace=False)) if rows > size
              else np.arange(rows))
    picked, offset = [], 0
    for batch in _batches(path, columns):
        inside = wanted[(wanted >= offset) & (wanted < offset + batch.num_rows)] - offset
        if len(inside):
            picked.extend(batch.take(pa.array(inside)).to_pylist())
        offset += batch.num_rows
    return sorted(picked, key=lambda row: (row.get("row_number") is None, row.get("row_number") or 0))


def _input_field(path: Path, column: str | None) -> str | None:
    """The published name of the input's `column` in a table (its own, or `input_<name>` where it clashed with one of
    batchgen's columns: the field's metadata keeps the input's name), or None."""
    if not column:
        return None
    from batchgen.schema import INPUT_COLUMN_KEY

    for field in pq.read_schema(path):
        if (field.metadata or {}).get(INPUT_COLUMN_KEY) == column.encode():
            return field.name
    return None


def _attempt_aggregates(path: Path, started: pd.Timestamp | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Outputs per (attempt, finish reason), and tokens per engine chunk finished after `started`."""
    finish: Counter = Counter()
    chunks: dict[Any, list[Any]] = {}
    for batch in _batches(path, ["attempt", "finish_reason", "new_output_tokens", "chunk_seconds",
                                 "chunk_finished_at"]):
        frame = batch.to_pandas()
        if frame.empty:
            continue
        finish.update(zip(frame["attempt"].astype(int), frame["finish_reason"].fillna("unknown")))
        if "chunk_finished_at" not in frame:
            continue
        timed = frame.dropna(subset=["chunk_finished_at"])
        if started is not None:
            timed = timed[timed["chunk_finished_at"] >= started]  # reused results are not this run's work
        for at, group in timed.groupby("chunk_finished_at"):
            entry = chunks.setdefault(at, [0, group["chunk_seconds"].iloc[0]])
            entry[0] += int(group["new_output_tokens"].sum())
    table = pd.Series(finish, dtype="int64").unstack(fill_value=0) if finish else pd.DataFrame()
    if not table.empty:
        table.index.name, table.columns.name = None, None
        table = table.sort_index()
    frame = pd.DataFrame([{"chunk_finished_at": at, "tokens": tokens, "chunk_seconds": seconds}
                          for at, (tokens, seconds) in sorted(chunks.items())],
                         columns=["chunk_finished_at", "tokens", "chunk_seconds"])
    return table, frame


def load_publication(run_dir: Path) -> Publication:
    """Read what the report needs; a missing or unreadable file is a NotAPublicationError naming it."""
    root = Path(run_dir)
    if not root.is_dir():
        raise NotAPublicationError(f"{root} is not a directory")
    missing = [name for name in (MANIFEST, RESULTS, REJECTED, ATTEMPTS, VALIDATION) if not (root / name).is_file()]
    if missing:
        raise NotAPublicationError(f"{root} is not a batchgen publication: missing {', '.join(missing)}")
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        validation = json.loads((root / VALIDATION).read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or "counts" not in manifest:
            raise NotAPublicationError(f"{root / MANIFEST} has no counts: not a batchgen manifest")
        started = pd.Timestamp(manifest["started_at"]) if manifest.get("started_at") else None
        finish, chunks = _attempt_aggregates(root / ATTEMPTS, started)
        lengths = pd.concat([pd.DataFrame({"chars": _lengths(root / RESULTS, "accepted"), "status": "accepted"}),
                             pd.DataFrame({"chars": _lengths(root / REJECTED, "rejected"), "status": "rejected"})],
                            ignore_index=True)
        accepted = _sample(root / RESULTS, ["item_id", "row_number", "attempt", "text", "finish_reason",
                                            "n_output_tokens"], SAMPLE_SIZE)
        keyword = (manifest.get("expectations") or {}).get("keyword_column")
        keyword_field = _input_field(root / REJECTED, keyword)
        rejected = _sample(root / REJECTED, ["item_id", "row_number", "stage", "reasons", "detail", "attempt", "text",
                                             "finish_reason", "n_output_tokens"]
                           + ([keyword_field] if keyword_field else []), SAMPLE_SIZE)
    except NotAPublicationError:
        raise
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise NotAPublicationError(f"{root}: cannot read the publication: {exc}") from exc
    for row in rejected:
        row["reasons"] = list(row.get("reasons") or [])
        row["expected"] = expected_keyword({keyword: row.pop(keyword_field)} if keyword_field else None, keyword)
    if isinstance(validation, dict):
        validation = [validation]
    return Publication(root, manifest, validation, finish, lengths, chunks, accepted, rejected)


# ---------------------------------------------------------------- figures


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


def expected_keyword(row_input: Any, column: str | None) -> str | None:
    """The value the keyword expectation looked for in this row's output (its input's keyword column)."""
    if not column or row_input is None:
        return None
    if isinstance(row_input, str):  # inputs whose columns change type are published as JSON text
        try:
            row_input = json.loads(row_input)
        except ValueError:
            return None
    value = row_input.get(column) if isinstance(row_input, dict) else None
    return None if value is None else str(value)


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


def output_lengths(pub: Publication) -> pd.DataFrame:
    """Characters of every published output: accepted, and rejected ones that have a text."""
    return pub.lengths


def throughput(pub: Publication) -> pd.DataFrame:
    """One row per engine chunk generated in this run: seconds since the run started, tokens/s, cumulative tokens."""
    chunks = pub.chunks.copy()
    if chunks.empty:
        return pd.DataFrame(columns=["seconds", "tokens", "tokens_per_second", "cumulative_tokens"])
    started = pd.Timestamp(pub.manifest["started_at"])
    chunks["seconds"] = (chunks["chunk_finished_at"] - started).dt.total_seconds()
    chunks["tokens_per_second"] = chunks["tokens"] / chunks["chunk_seconds"].where(chunks["chunk_seconds"] > 0)
    chunks["cumulative_tokens"] = chunks["tokens"].cumsum()
    return chunks[["seconds", "tokens", "tokens_per_second", "cumulative_tokens"]]


THROUGHPUT_BINS = 60


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


# ---------------------------------------------------------------- charts


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 6.4, height: float = 3.4):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height))
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def chart_finish_reasons(table: pd.DataFrame) -> str:
    fig, ax = _figure()
    if table.empty:
        _empty(ax, "no outputs were generated")
    else:
        bottom = [0] * len(table)
        labels = [pass_label(int(a) - 1) + f"\n(attempt {int(a)})" for a in table.index]
        colours = {"stop": "#2e7d32", "length": "#e65100", "abort": "#6a1b9a"}
        for reason in table.columns:
            values = list(table[reason])
            bars = ax.bar(labels, values, bottom=bottom, label=reason, color=colours.get(reason))
            ax.bar_label(bars, labels=[str(v) if v else "" for v in values], label_type="center", color="white")
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylabel("outputs")
        ax.legend(title="finish reason", frameon=False)
    ax.set_title("Finish reasons per attempt")
    return _png(fig)


def chart_lengths(lengths: pd.DataFrame, min_chars: int | None, max_chars: int | None) -> str:
    fig, ax = _figure()
    if lengths.empty:
        _empty(ax, "no outputs")
    else:
        import numpy as np

        top = max(int(lengths["chars"].max()), max_chars or 0, min_chars or 0, 1)
        bins = np.linspace(0, top * 1.02 + 1, 31)
        groups = [lengths.loc[lengths["status"] == s, "chars"] for s in ("accepted", "rejected")]
        ax.hist(groups, bins=bins, stacked=True, label=["accepted", "rejected"], color=["#1565c0", "#c62828"])
        for bound, name in ((min_chars, "min_chars"), (max_chars, "max_chars")):
            if bound is not None:
                ax.axvline(bound, color="black", linestyle="--", linewidth=1.2)
                ax.annotate(f"{name} = {bound}", (bound, 1), xycoords=("data", "axes fraction"),
                            xytext=(4, -12), textcoords="offset points", fontsize=9)
        ax.set_xlabel("characters")
        ax.set_ylabel("outputs")
        ax.legend(frameon=False)
    ax.set_title("Output length against the expected bounds")
    return _png(fig)


def chart_expectations(lines: list[dict[str, Any]]) -> str:
    """Rows passing and failing each expectation, per pass, as bars of their row counts: a small retry pass is a
    short bar beside the first pass, not a bar of the same weight."""
    fig, ax = _figure(height=3.8)
    rated = [line for line in lines if line["rows"]]
    if not rated:
        _empty(ax, "no expectation was evaluated")
    else:
        labels = [f"{line['expectation']} · {line['pass']}" for line in rated][::-1]
        passed = [line["rows"] - line["failed"] for line in rated][::-1]
        failed = [line["failed"] for line in rated][::-1]
        ax.barh(labels, passed, color="#2e7d32", label="passed")
        ax.barh(labels, failed, left=passed, color="#c62828", label="failed")
        top = max(p + f for p, f in zip(passed, failed))
        for y, (p, f) in enumerate(zip(passed, failed)):
            ax.text(p + f + top * 0.01, y, f"{100 * p / (p + f):.0f}% of {p + f}", va="center", fontsize=8)
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel("rows")
        ax.tick_params(axis="y", labelsize=8)
        ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.set_title("Pass rate per expectation (rows per pass)")
    return _png(fig)


def chart_throughput(rates: pd.DataFrame, average: float | None = None) -> str:
    fig, ax = _figure()
    if rates.empty:
        _empty(ax, "no engine chunk finished in this run\n(all results reused, or no chunk times recorded)")
    else:
        xs = np.append(rates["start"].to_numpy(), rates["end"].iloc[-1])
        ys = np.append(rates["tokens_per_second"].to_numpy(), rates["tokens_per_second"].iloc[-1])
        ax.fill_between(xs, ys, step="post", color="#90caf9")
        ax.step(xs, ys, where="post", color="#1565c0", label="engine output tokens/s")
        if average:
            ax.axhline(average, color="#e65100", linestyle="--", linewidth=1.2,
                       label=f"run average {average:.0f} tokens/s")
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel("output tokens/s")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0, top=max(float(ys.max()), average or 0) * 1.2 or 1)
        ax.legend(frameon=False, fontsize=8, loc="lower right")
    ax.set_title("Throughput over the run")
    return _png(fig)


# ---------------------------------------------------------------- Data Docs


def build_data_docs(pub: Publication) -> dict[str, Any] | None:
    """GX Data Docs of the run's validation results in `<run>/data_docs/`; None when nothing was validated.

    Returns the pages relative to the run directory: the site index, the suite, one page per pass.
    GX's pages pull their styles and scripts from CDNs: `make_offline` rewrites them to read offline,
    styled by a local stylesheet, with a static index (batchgen.offline_docs).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    import expectations.suite  # noqa: F401  (registers batchgen's own expectation classes for rendering)

    site = pub.root / DATA_DOCS
    if site.exists():
        shutil.rmtree(site)
    validated = [(i, r) for i, r in enumerate(pub.validation) if r.get("results") and r.get("suite_name")]
    if not validated:
        return None
    context = gx.get_context(mode="ephemeral")
    context.add_data_docs_site("batchgen", {
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    })
    started = datetime.fromisoformat(pub.manifest["started_at"]) if pub.manifest.get("started_at") else (
        datetime.now(timezone.utc))
    suite_name = validated[0][1]["suite_name"]
    configs = [ExpectationConfiguration(**{k: v for k, v in outcome["expectation_config"].items()
                                           if k not in ("id", "rendered_content")})
               for outcome in validated[0][1]["results"]]
    for config in configs:
        config.kwargs.pop("batch_id", None)
    context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=[c.to_domain_obj() for c in configs]))
    keys = []
    for index, result in validated:
        label = pass_label(index)
        run_id = RunIdentifier(run_name=label.replace(" ", "-"), run_time=started)  # a path part: no spaces
        key = ValidationResultIdentifier(ExpectationSuiteIdentifier(name=result["suite_name"]), run_id,
                                         label.replace(" ", "-"))
        meta = {**(result.get("meta") or {}), "run_id": run_id.to_json_dict()}
        context.validation_results_store.set(key, ExpectationSuiteValidationResult(**{**result, "meta": meta}))
        keys.append((label, key))
    context.build_data_docs(site_names=["batchgen"])

    def relative(identifier) -> str:
        [url] = [u["site_url"] for u in context.get_docs_sites_urls(resource_identifier=identifier,
                                                                     site_name="batchgen")]
        return Path(url.removeprefix("file://")).relative_to(pub.root).as_posix()

    docs = {
        "index": f"{DATA_DOCS}/index.html",
        "suite": relative(ExpectationSuiteIdentifier(name=suite_name)),
        "passes": [{"label": label, "href": relative(key)} for label, key in keys],
    }
    inside = len(DATA_DOCS) + 1  # the pages' paths inside the site folder
    make_offline(site, [Page(label, docs["passes"][i]["href"][inside:], result.get("success"),
                             (result.get("statistics") or {}).get("evaluated_expectations"),
                             (result.get("statistics") or {}).get("successful_expectations"))
                        for i, (label, (_, result)) in enumerate(zip([k[0] for k in keys], validated))],
                 docs["suite"][inside:])
    return docs


# ---------------------------------------------------------------- page

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>{{ m.job }}: run report</title>
<style>
 body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
        padding: 0 1rem; color: #222; }
 h1 { margin-bottom: .2rem; } .sub { color: #666; margin-top: 0; }
 .cards { display: flex; flex-wrap: wrap; gap: .8rem; margin: 1.2rem 0; }
 .card { border: 1px solid #ddd; border-radius: 6px; padding: .6rem 1rem; min-width: 8rem; }
 .card .v { font-size: 1.6rem; font-weight: 600; } .card .k { color: #666; font-size: .85rem; }
 .charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 1rem; }
 .charts figure { margin: 0; border: 1px solid #eee; border-radius: 6px; padding: .5rem; }
 .charts img { max-width: 100%; height: auto; }
 table { border-collapse: collapse; margin: .5rem 0 1.5rem; font-size: .9rem; width: 100%; }
 th, td { border-bottom: 1px solid #e5e5e5; padding: .3rem .5rem; text-align: left; vertical-align: top; }
 th { background: #fafafa; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
 td.text { white-space: pre-wrap; max-width: 40rem; }
 .reason { display: inline-block; background: #fdecea; color: #b71c1c; border-radius: 3px; padding: 0 .3rem;
           margin-right: .2rem; font-size: .8rem; }
 .muted { color: #777; }
 .settings { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 0 1rem; }
 table.setting td.v { font-family: ui-monospace, monospace; font-size: .8rem; word-break: break-all; }
 td.expected { font-weight: 600; }
</style></head>
<body>
<h1>{{ m.job }}: run report</h1>
<p class="sub">flow run {{ m.flow_run_id or "n/a" }} &middot; started {{ when(m.started_at) }} &middot; finished
 {{ when(m.finished_at) }} &middot; model {{ m.model.name }}</p>

<div class="cards" id="counts">
{% for key, label, value in cards %}
 <div class="card"><div class="v" data-count="{{ key }}">{{ value }}</div><div class="k">{{ label }}</div></div>
{% endfor %}
</div>

{% if docs %}
<p><a id="data-docs" href="{{ docs.index }}">Great Expectations Data Docs of this run's validation</a>
 &middot; the suite: <a class="docs-page" href="{{ docs.suite }}">expectations</a>
 &middot; results: {% for p in docs.passes %}<a class="docs-page" href="{{ p.href }}">{{ p.label }}</a>{{ ", " if not loop.last }}{% endfor %}</p>
{% else %}<p class="muted">Nothing was validated: no Data Docs.</p>{% endif %}

<h2>Charts</h2>
<div class="charts">
{% for chart in charts %}
 <figure><img class="chart" alt="{{ chart.title }}" src="{{ chart.src }}"></figure>
{% endfor %}
</div>

<h2>Prompt and settings</h2>
{% if prompt %}
<table id="prompt"><tr><th>prompt</th><th>text</th><th>SHA-256</th></tr>
 <tr><td>style</td><td>{{ prompt.style }}</td><td></td></tr>
 {% if prompt.system is not none %}<tr><td>system</td><td class="text"><code>{{ prompt.system }}</code></td>
 <td class="muted">{{ prompt.system_sha256[:16] }}</td></tr>{% endif %}
 {% if prompt.template is not none %}<tr><td>template</td><td class="text"><code>{{ prompt.template }}</code></td>
 <td class="muted">{{ prompt.template_sha256[:16] }}</td></tr>{% endif %}
 {% if prompt.messages_column %}<tr><td>messages column</td><td>{{ prompt.messages_column }}</td><td></td></tr>{% endif %}
</table>
{% else %}<p class="muted">This manifest does not record the prompt.</p>{% endif %}
<div class="settings">
{% for group, rows in settings if rows %}
 <table class="setting" id="settings-{{ group }}"><tr><th colspan="2">{{ group }}</th></tr>
 {% for name, value in rows %}<tr><td>{{ name }}</td><td class="v">{{ value }}</td></tr>{% endfor %}
 </table>
{% endfor %}
</div>

<h2>Rejected by reason</h2>
<table id="reasons"><tr><th>reason</th><th>items</th></tr>
{% for reason, n in m.counts.rejected_by_reason.items() %}
 <tr><td>{{ reason }}</td><td class="n" data-reason="{{ reason }}">{{ n }}</td></tr>
{% else %}<tr><td colspan="2" class="muted">none</td></tr>{% endfor %}
</table>

<h2>Rescued by retries</h2>
<p class="muted">Accepted items whose published candidate failed on an earlier attempt, by the reason it failed.</p>
<table id="rescued"><tr><th>reason</th><th>items</th></tr>
{% for reason, n in m.counts.get('rescued_by_reason', {}).items() %}
 <tr><td>{{ reason }}</td><td class="n" data-rescued="{{ reason }}">{{ n }}</td></tr>
{% else %}<tr><td colspan="2" class="muted">none</td></tr>{% endfor %}
</table>

<h2>Expectations</h2>
<table id="expectations"><tr><th>pass</th><th>expectation</th><th>description</th><th>rows</th><th>failed</th>
<th>pass rate</th></tr>
{% for e in expectations %}
 <tr><td>{{ e.pass }}</td><td>{{ e.expectation }}</td><td>{{ e.description }}</td><td class="n">{{ e.rows }}</td>
 <td class="n">{{ e.failed }}</td><td class="n">{{ pct(e.pass_rate) }}</td></tr>
{% else %}<tr><td colspan="6" class="muted">no expectation was evaluated</td></tr>{% endfor %}
</table>

<h2>Sample of accepted outputs ({{ accepted|length }} of {{ m.counts.accepted }})</h2>
<table id="accepted-sample"><tr><th>row</th><th>item</th><th>attempt</th><th>text</th></tr>
{% for r in accepted %}
 <tr><td class="n">{{ r.row_number }}</td><td>{{ r.item_id }}</td><td class="n">{{ r.attempt }}</td>
 <td class="text">{{ r.text }}</td></tr>
{% else %}<tr><td colspan="4" class="muted">none</td></tr>{% endfor %}
</table>

<h2>Sample of rejected items ({{ rejected|length }} of {{ m.counts.rejected }})</h2>
<table id="rejected-sample"><tr><th>row</th><th>item</th><th>stage</th><th>reasons</th><th>detail</th>
{% if keyword %}<th>expected keyword ({{ keyword }})</th>{% endif %}<th>text</th></tr>
{% for r in rejected %}
 <tr><td class="n">{{ r.row_number }}</td><td>{{ r.item_id }}</td><td>{{ r.stage }}</td>
 <td>{% for reason in r.reasons %}<span class="reason">{{ reason }}</span>{% endfor %}</td>
 <td>{{ r.detail }}</td>{% if keyword %}<td class="expected">{{ r.expected if r.expected is not none else "" }}</td>{% endif %}
 <td class="text">{{ r.text if r.text is not none else "" }}</td></tr>
{% else %}<tr><td colspan="{{ 7 if keyword else 6 }}" class="muted">none</td></tr>{% endfor %}
</table>

<h2>Timings (s)</h2>
<table id="timings"><tr><th>step</th><th>seconds</th></tr>
{% for step, seconds in m.timings_seconds.items() %}<tr><td>{{ step }}</td><td class="n">{{ seconds }}</td></tr>
{% endfor %}</table>
<p class="muted">Files: README.md (the dataset card), accepted/, rejected/, attempts/ (one Parquet table each), manifest.json, validation.json.
Rebuild this page and data_docs/ with <code>batchgen report</code> on this folder.</p>
</body></html>
"""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _when(iso: str | None) -> str:
    if not iso:
        return "n/a"
    return datetime.fromisoformat(iso).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def cards(manifest: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """The key counts, as (manifest key, label, value shown)."""
    counts, rates, tokens = manifest["counts"], manifest["rates"], manifest["tokens"]
    return [
        ("items", "items", counts["items"]),
        ("accepted", f"accepted ({_pct(rates.get('pass_rate'))})", counts["accepted"]),
        ("rejected", "rejected", counts["rejected"]),
        ("truncated_first_pass", "cut off, first pass", counts["truncated_first_pass"]),
        ("truncated_final", "cut off, final", counts["truncated_final"]),
        ("retry_attempts", "retry attempts", counts["retry_attempts"]),
        ("rescued", "accepted after a retry", counts.get("rescued", 0)),
        ("reused", "reused from earlier commits", counts["reused"]),
        ("generated_this_run", "output tokens this run", tokens["generated_this_run"]),
        ("output_per_second", "output tokens/s", tokens["output_per_second"]),
    ]


def render_html(pub: Publication, docs: dict[str, Any] | None) -> str:
    import jinja2

    m = pub.manifest
    bounds = m.get("expectations", {}) or {}
    per_pass = pass_rate_per_expectation(pub.validation)
    lines = per_pass + (pass_rate_all_passes(per_pass) if len(pub.validation) > 1 else [])
    charts = [
        {"title": "Finish reasons per attempt", "src": chart_finish_reasons(finish_reasons_per_attempt(pub))},
        {"title": "Output length against the expected bounds",
         "src": chart_lengths(output_lengths(pub), bounds.get("min_chars"), bounds.get("max_chars"))},
        {"title": "Pass rate per expectation", "src": chart_expectations(per_pass)},
        {"title": "Throughput over the run", "src": chart_throughput(throughput_over_time(pub),
                                                                      (m.get("tokens") or {}).get("output_per_second"))},
    ]
    accepted, rejected = samples(pub)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(PAGE).render(
        m=m, cards=cards(m), charts=charts, expectations=lines, accepted=accepted, rejected=rejected, pct=_pct, when=_when,
        docs=docs, settings=settings(m), keyword=(m.get("expectations") or {}).get("keyword_column"),
        prompt=m.get("prompt") or {},
    )


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def settings(manifest: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """What the run ran with, as (group, [(name, value)]): model, engine (and what vLLM loaded), sampling,
    retry, expectations, input. Unset (null) values are left out."""
    model = manifest.get("model") or {}
    loaded = manifest.get("engine_loaded") or {}
    package = model.get("package") or {}
    hub = model.get("hub") or {}
    model_rows = [("name", model.get("name")), ("source", model.get("source")),
                  ("package", f"{package.get('name')} {package.get('version')}" if package else None),
                  ("hub revision", hub.get("revision")), ("files SHA-256", model.get("files_sha256"))]
    engine_rows = [(k, v) for k, v in (manifest.get("engine") or {}).items()]
    engine_rows += [("dtype vLLM loaded", loaded.get("dtype")), ("max_model_len vLLM used", loaded.get("max_model_len"))]
    source = manifest.get("input_file") or {}
    input_rows = [(k, v) for k, v in (manifest.get("input") or {}).items()]
    input_rows += [("file size (bytes)", source.get("size_bytes")), ("file SHA-256", source.get("sha256"))]
    groups = [("model", model_rows), ("engine", engine_rows),
              ("sampling", list((manifest.get("sampling") or {}).items())),
              ("retry", list((manifest.get("retry") or {}).items())),
              ("expectations", list((manifest.get("expectations") or {}).items())), ("input", input_rows)]
    return [(group, [(name, _shown(value)) for name, value in rows if value not in (None, [], {})])
            for group, rows in groups]


def write_report(run_dir: Path) -> Path:
    """Build `data_docs/` and `report.html` in a publication directory; returns the report's path."""
    pub = load_publication(Path(run_dir))
    docs = build_data_docs(pub)
    path = pub.root / REPORT
    write_text_atomic(render_html(pub, docs), path)
    return path


# ---------------------------------------------------------------- markdown


def figures_markdown(pub: Publication) -> str:
    """The report's figures as markdown: finish reasons, lengths, expectations, throughput."""
    lines = ["", "**Finish reasons per attempt**", ""]
    table = finish_reasons_per_attempt(pub)
    if table.empty:
        lines.append("(no outputs)")
    else:
        lines += ["| attempt | " + " | ".join(table.columns) + " |", "| --- " * (len(table.columns) + 1) + "|"]
        lines += [f"| {a} | " + " | ".join(str(int(v)) for v in row) + " |" for a, row in table.iterrows()]
    lengths = output_lengths(pub)["chars"]
    bounds = pub.manifest.get("expectations", {}) or {}
    lines += ["", "**Output length (characters)**", "", "| min | median | max | expected min | expected max |",
              "| --- | --- | --- | --- | --- |"]
    if len(lengths):
        lines.append(f"| {int(lengths.min())} | {float(lengths.median()):g} | {int(lengths.max())} | "
                     f"{bounds.get('min_chars')} | {bounds.get('max_chars')} |")
    lines += ["", "**Pass rate per expectation**", "", "| pass | expectation | rows | failed | pass rate |",
              "| --- | --- | --- | --- | --- |"]
    per_pass = pass_rate_per_expectation(pub.validation)
    lines += [f"| {e['pass']} | {e['expectation']} | {e['rows']} | {e['failed']} | {_pct(e['pass_rate'])} |"
              for e in per_pass + (pass_rate_all_passes(per_pass) if len(pub.validation) > 1 else [])]
    chunks = throughput(pub)
    lines += ["", "**Throughput**", ""]
    if chunks.empty:
        lines.append("no engine chunk finished in this run")
    else:
        rates = chunks["tokens_per_second"].dropna()
        lines.append(f"{len(chunks)} engine chunks, {int(chunks['tokens'].sum())} output tokens, "
                     f"{float(rates.min()):.1f}-{float(rates.max()):.1f} tokens/s per chunk, "
                     f"last chunk done {float(chunks['seconds'].iloc[-1]):.1f} s after the start")
    lines += ["", f"Report: `{pub.root / REPORT}`; Data Docs: `{pub.root / DATA_DOCS / 'index.html'}`"]
    return "\n".join(lines) + "\n"


def report_markdown(run_dir: Path) -> str:
    return figures_markdown(load_publication(Path(run_dir)))
