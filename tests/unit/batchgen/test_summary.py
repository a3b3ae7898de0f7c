"""The run summary a user reads in the Prefect UI and the terminal, from a hand-made manifest."""

from __future__ import annotations

from batchgen.records import Counts, Manifest, Tokens
from batchgen.summary import summary_markdown


def manifest(**changes) -> Manifest:
    counts = Counts(items=4, accepted=3, rejected=1, generated_items=4, truncated_first_pass=2, truncated_final=0,
                    attempts=6, retry_attempts=2, reused=1, rejected_by_reason={"keyword": 1}, rescued=2,
                    rescued_by_reason={"truncated": 2})
    values = {"job": "products", "counts": counts, "rates": counts.rates(),
              "tokens": Tokens(prompt=120, output=80, generated_this_run=64, output_per_second=21.5),
              "timings_seconds": {"load": 0.5, "generate": 3.0}, "model": {"name": "SmolLM2-135M-Instruct"},
              "engine_loaded": {"dtype": "bfloat16"}, "input_file": {"sha256": "0123456789abcdef" * 4},
              "code": {"commit": "fedcba9876543210" * 2, "dirty": True}, "publication": "20261201T120000Z-ab12"}
    return Manifest(**(values | changes))


def rows(markdown: str) -> dict[str, str]:
    """The two-column table rows, first cell to second."""
    cells = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return {first.strip(): second.strip() for first, second in (c[:2] for c in cells if len(c) >= 2)}


def test_the_summary_shows_the_runs_counts_rates_and_provenance():
    markdown = summary_markdown(manifest())
    table = rows(markdown)

    assert markdown.startswith("# products: batch generation summary\n")
    assert table["items"] == "4" and table["accepted"] == "3 (75.0%)" and table["rejected"] == "1"
    assert table["truncated, first pass"] == "2 (50.0%)" and table["truncated, final"] == "0 (0.0%)"
    assert table["retry attempts"] == "2" and table["accepted after a retry"] == "2"
    assert table["results reused from earlier commits"] == "1"
    assert table["output tokens (generated this run)"] == "64" and table["output tokens/s (generation)"] == "21.5"
    assert table["model"] == "SmolLM2-135M-Instruct" and table["dtype vLLM used"] == "bfloat16"
    assert table["input SHA-256"] == "`0123456789abcdef`"
    assert table["code"] == "`fedcba987654` (with uncommitted changes)"
    assert table["published as"] == "`current` -> `publications/20261201T120000Z-ab12`"
    assert table["keyword"] == "1"  # rejected by reason
    assert "**Rescued by retries, by the reason an earlier attempt failed**" in markdown
    assert table["truncated"] == "2"
    assert table["load"] == "0.5" and table["generate"] == "3.0"


def test_a_run_without_rejections_engine_or_checkout_says_so():
    empty = Counts(items=0)
    markdown = summary_markdown(manifest(counts=empty, rates=empty.rates(), engine_loaded=None, code=None,
                                         input_file=None, publication=None))
    table = rows(markdown)

    assert table["accepted"] == "0 (n/a)" and table["truncated, final"] == "0 (n/a)"
    assert table["dtype vLLM used"] == "n/a (no engine ran)"
    assert table["code"] == "not a git checkout" and table["input SHA-256"] == "`n/a`"
    assert table["published as"] == "`current` -> `publications/?`"
    assert table["(none)"] == "0"
    assert "Rescued by retries" not in markdown
