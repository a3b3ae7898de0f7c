"""The report page (`report.html`, one offline page from a Jinja template) and the same figures as markdown."""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from typing import Any

from batchgen.records import Manifest
from batchgen.report.charts import report_charts
from batchgen.report.datadocs import DATA_DOCS
from batchgen.report.figures import finish_reasons_per_attempt, output_lengths, pass_rates, samples, throughput
from batchgen.report.read import Publication

REPORT = "report.html"

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
{% for reason, n in m.counts.rescued_by_reason.items() %}
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


def cards(manifest: Manifest) -> list[tuple[str, str, Any]]:
    """The key counts, as (manifest key, label, value shown)."""
    counts, tokens = manifest.counts, manifest.tokens
    return [
        ("items", "items", counts.items),
        ("accepted", f"accepted ({_pct(manifest.rates.pass_rate)})", counts.accepted),
        ("rejected", "rejected", counts.rejected),
        ("truncated_first_pass", "cut off, first pass", counts.truncated_first_pass),
        ("truncated_final", "cut off, final", counts.truncated_final),
        ("retry_attempts", "retry attempts", counts.retry_attempts),
        ("rescued", "accepted after a retry", counts.rescued),
        ("reused", "reused from earlier commits", counts.reused),
        ("generated_this_run", "output tokens this run", tokens.generated_this_run),
        ("output_per_second", "output tokens/s", tokens.output_per_second),
    ]


def render_html(pub: Publication, docs: dict[str, Any] | None, charts: list[dict[str, str]] | None = None) -> str:
    """The report page: counts, Data Docs links, charts, prompt and settings, rejections, pass rates, samples.
    `charts`: `report_charts(pub)` when already drawn (by the chart worker), else drawn here."""
    m = pub.manifest
    accepted, rejected = samples(pub)
    return page_template().render(
        m=m, cards=cards(m), charts=report_charts(pub) if charts is None else charts,
        expectations=pass_rates(pub.validation), accepted=accepted, rejected=rejected, pct=_pct, when=_when,
        docs=docs, settings=settings(m), keyword=pub.expectations.get("keyword_column"), prompt=m.prompt,
    )


@functools.cache
def page_template() -> Any:
    """The page's Jinja template, compiled once per process (tens of milliseconds: batchgen.report.preload compiles
    it while the engine works)."""
    import jinja2

    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(PAGE)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def settings(manifest: Manifest) -> list[tuple[str, list[tuple[str, str]]]]:
    """What the run ran with, as (group, [(name, value)]): model, engine (and what vLLM loaded), sampling,
    retry, expectations, input. Unset (null) values are left out."""
    model, loaded = manifest.model, manifest.engine_loaded or {}
    package = model.get("package") or {}
    hub = model.get("hub") or {}
    model_rows = [("name", model.get("name")), ("source", model.get("source")),
                  ("package", f"{package.get('name')} {package.get('version')}" if package else None),
                  ("hub revision", hub.get("revision")), ("files SHA-256", model.get("files_sha256"))]
    engine_rows = list(manifest.engine.items())
    engine_rows += [("dtype vLLM loaded", loaded.get("dtype")), ("max_model_len vLLM used", loaded.get("max_model_len"))]
    source = manifest.input_file or {}
    input_rows = list(manifest.input.items())
    input_rows += [("file size (bytes)", source.get("size_bytes")), ("file SHA-256", source.get("sha256"))]
    groups = [("model", model_rows), ("engine", engine_rows),
              ("sampling", list(manifest.sampling.items())), ("retry", list(manifest.retry.items())),
              ("expectations", list(manifest.expectations.items())), ("input", input_rows)]
    return [(group, [(name, _shown(value)) for name, value in rows if value not in (None, [], {})])
            for group, rows in groups]


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
    bounds = pub.expectations
    lines += ["", "**Output length (characters)**", "", "| min | median | max | expected min | expected max |",
              "| --- | --- | --- | --- | --- |"]
    if len(lengths):
        lines.append(f"| {int(lengths.min())} | {float(lengths.median()):g} | {int(lengths.max())} | "
                     f"{bounds.get('min_chars')} | {bounds.get('max_chars')} |")
    lines += ["", "**Pass rate per expectation**", "", "| pass | expectation | rows | failed | pass rate |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {e['pass']} | {e['expectation']} | {e['rows']} | {e['failed']} | {_pct(e['pass_rate'])} |"
              for e in pass_rates(pub.validation)]
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
