"""Property: whatever job file and input a user writes, `batchgen check` ends with a documented exit code and no
traceback, and when the input can be used every row is accounted for exactly once.

Hypothesis writes job files (sections and fields missing, extra, of the wrong type, values out of vLLM's
ranges, templates that do not compile or fail on a row) and inputs (CSV or JSONL; text, numbers, blanks,
control characters, long cells; UTF-8, UTF-8 with a BOM, UTF-16, Latin-1; no rows to many). `check` runs
in-process and starts no engine; the examples are few so the test takes seconds (vLLM's import aside).
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from batchgen.cli import EXIT_BAD_DATA, EXIT_BAD_JOB, app

DOCUMENTED = {0, EXIT_BAD_JOB, EXIT_BAD_DATA}

odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                                   max_size=2),
)
templates = st.sampled_from([
    "Describe {{ name }}.", "{{ name }} / {{ price }}", "{{ name | shout }}", "{% if name %}{{ name }}",
    "{{ '%.2f' % price }}", "{{ name }} {{ missing_column }}", "{{ price * 2 }} {{ name | upper }}",
    "{{ name[0] }}{{ name[100] }}", "{{ 1 / 0 }}", "{% for c in name %}{{ c }}{% endfor %}", "   ",
])
# name: (values vLLM takes, values around and past its limits)
SAMPLING = {
    "temperature": (st.floats(0, 2), st.floats(-1, 6)), "top_p": (st.floats(0.01, 1), st.floats(-0.5, 1.5)),
    "top_k": (st.integers(1, 100), st.integers(-3, 100)), "max_tokens": (st.integers(1, 100), st.integers(-2, 100)),
    "min_tokens": (st.integers(0, 1), st.integers(-1, 200)), "n": (st.integers(1, 3), st.integers(0, 3)),
    "stop": (st.lists(st.text(min_size=1, max_size=3), max_size=2), st.lists(st.text(max_size=3), max_size=2)),
    "stop_token_ids": (st.lists(st.integers(0, 1000), max_size=2), st.lists(st.integers(-5, 10**6), max_size=2)),
    "logprobs": (st.integers(0, 20), st.integers(-1, 25)),
    "repetition_penalty": (st.floats(0.5, 2), st.floats(-1, 3)),
    "overrides": (st.sampled_from([{"temperature": "temp"}, {"max_tokens": "temp"}]), st.just({"seed": "x"})),
}


@st.composite
def sampling_values(draw: Any, usable: bool) -> dict[str, Any]:
    """Up to two sampling fields: in vLLM's ranges, or (not usable) in or out of them, or of the wrong type."""
    names = draw(st.lists(st.sampled_from(sorted(SAMPLING)), max_size=2, unique=True))
    if usable:
        return {name: draw(SAMPLING[name][0]) for name in names}
    return {name: draw(st.one_of(SAMPLING[name][0], SAMPLING[name][1], odd_values)) for name in names}


cells = st.one_of(
    st.text(max_size=20), st.sampled_from(["", " ", "3.5", "-1", "0", "2.5", "nan", "\x00", "\u2028", "é" * 5]),
    st.integers(-5, 10**9).map(str), st.builds(lambda n: "x" * n, st.sampled_from([140_000, 50_000])),
)


@st.composite
def inputs(draw: Any, usable: bool) -> tuple[str, str, bytes, int]:
    """(suffix, encoding, bytes, rows written): a table a run can read (its rows may still be rejected), or any."""
    columns = draw(st.sampled_from([["product_id", "name", "price", "temp"]] if usable else [
        ["product_id", "name", "price", "temp"], ["product_id", "name"], ["id", "title"]]))
    rows = draw(st.lists(st.lists(cells, min_size=len(columns), max_size=len(columns)), min_size=int(usable),
                         max_size=6))
    ids = draw(st.sampled_from(["unique", "duplicate", "labels", "blank"]))
    for i, row in enumerate(rows):
        row[0] = {"unique": f"p{i}", "duplicate": "p0", "labels": f"line-{i + 2}", "blank": ""}[ids] if i % 2 \
            else row[0]
    suffix = draw(st.sampled_from([".csv", ".jsonl"]))
    if suffix == ".csv":
        buffer = io.StringIO(newline="")
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        text = buffer.getvalue()
    else:
        lines = [json.dumps(dict(zip(columns, row))) for row in rows]
        if rows and draw(st.booleans()):
            lines[0] = "{not json"
        text = "".join(line + "\n" for line in lines)
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig"] if usable else ["utf-8", "utf-8-sig", "utf-16", "latin-1"]))
    return suffix, encoding, text.encode(encoding, errors="replace"), len(rows)


USABLE_TEMPLATES = ["Describe {{ name }}.", "{{ name }} / {{ price | default('?') }}", "{{ '%.2f' % price }}",
                    "{% for c in name %}{{ c }}{% endfor %}", "{{ name[0] }}{{ name[100] }}", "{{ 1 / 0 }}", "   "]


@st.composite
def jobs(draw: Any, data: Path, out: Path, usable: bool) -> dict[str, Any]:
    """A job file's contents: one a run could use (its rows may still fail), or one with mistakes of every kind."""
    if usable:
        return {"name": "prop", "input": {"path": str(data), "id_column": "product_id",
                                          **({"limit": draw(st.integers(1, 4))} if draw(st.booleans()) else {})},
                "prompt": {"template": draw(st.sampled_from(USABLE_TEMPLATES))},
                "sampling": draw(sampling_values(usable=True)), "output": {"dir": str(out)}}
    job: dict[str, Any] = {
        "name": draw(st.one_of(st.just("prop"), odd_values)),
        "input": {"path": str(data), "id_column": draw(st.sampled_from(["product_id", None, "nope", "name"]))},
        "prompt": {"template": draw(templates)},
        "sampling": draw(sampling_values(usable=False)),
        "output": {"dir": str(draw(st.sampled_from([out, out / "sub", data, data / "under-a-file"])))},
    }
    if draw(st.booleans()):
        job["input"]["limit"] = draw(st.one_of(st.integers(-1, 4), odd_values))
    if draw(st.booleans()):
        job["expectations"] = {"keyword_column": draw(st.sampled_from(["name", "nope", None]))}
    if draw(st.booleans()):
        job["engine"] = draw(st.sampled_from([{"max_model_len": 100_000}, {"max_model_len": 64}, {"dtype": "float9"},
                                              {"model": str(out / "no-model")}, {"extra_args": {"nope": 1}},
                                              {"seed": "x"}, {"max_model_len": 512}]))
    mutation = draw(st.sampled_from(["none", "drop", "extra", "retype"]))
    section = draw(st.sampled_from(["input", "prompt", "output", "sampling", "name"]))
    if mutation == "drop":
        job.pop(section, None)
    elif mutation == "extra":
        job[draw(st.sampled_from(["extra", section]))] = draw(odd_values)
    elif mutation == "retype":
        job[section] = draw(odd_values)
    return job


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_check_ends_in_a_documented_code_without_traceback_and_accounts_for_every_row(data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        usable = data.draw(st.booleans(), label="usable")
        suffix, encoding, body, rows = data.draw(inputs(usable), label="input")
        path = tmp / f"items{suffix}"
        path.write_bytes(body)
        job = data.draw(jobs(path, tmp / "out", usable), label="job")
        job_path = tmp / "job.yaml"
        job_path.write_text(yaml.safe_dump(job, allow_unicode=True), encoding="utf-8")

        result = CliRunner().invoke(app, ["check", str(job_path)])

        event(f"exit {result.exit_code}")
        assert result.exit_code in DOCUMENTED, (result.exit_code, result.output)
        assert "Traceback" not in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        if usable:  # a readable table and a valid job: check reports on every row
            assert result.exit_code == 0, result.output
        if result.exit_code != 0:
            assert any(line.startswith("batchgen: ") for line in result.stderr.splitlines()), result.stderr
            return
        report = json.loads(result.stdout)
        ids = [r["item_id"] for r in report["would_reject"]]
        assert len(set(ids)) == len(ids), ids
        limit = job["input"].get("limit") if isinstance(job.get("input"), dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool):  # N usable rows, and the invalid lines among them
            assert min(rows, limit) <= report["items"] <= rows
        else:
            assert report["items"] == rows
        assert report["would_generate"] + len(report["would_reject"]) == report["items"]
