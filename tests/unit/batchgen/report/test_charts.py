
"""The report's charts (batchgen.report.charts): PNG images inlined in the page, also when there is nothing to draw."""

from __future__ import annotations

import base64
import io
import re

import matplotlib.image
import pandas as pd

from batchgen.report.charts import chart_expectations, chart_finish_reasons, chart_lengths, chart_throughput


def test_four_charts_are_embedded_pngs_and_nothing_is_fetched(published):
    _, _, page = published
    charts = re.findall(r'<img class="chart" alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert [title for title, _ in charts] == ["Finish reasons per attempt", "Output length against the expected bounds",
                                              "Pass rate per expectation", "Throughput over the run"]
    for _, data in charts:
        png = base64.b64decode(data)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert not re.search(r'(src|href)="(https?:)?//', page)  # readable offline: no CDN, no remote asset


def test_a_run_with_nothing_to_draw_still_gets_readable_images():
    images = [chart_finish_reasons(pd.DataFrame()), chart_lengths(pd.DataFrame(columns=["chars", "status"]), 10, 40),
              chart_expectations([]), chart_throughput(pd.DataFrame(columns=["start", "end", "tokens_per_second"]))]
    for src in images:
        header, data = src.split(",", 1)
        assert header == "data:image/png;base64"
        height, width, _ = matplotlib.image.imread(io.BytesIO(base64.b64decode(data)), format="png").shape
        assert height > 200 and width > 400
