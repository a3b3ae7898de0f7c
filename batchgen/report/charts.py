"""The report's charts: matplotlib PNGs inlined as data URIs, so the page needs no network and no JavaScript."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from batchgen.report.figures import (
    finish_reasons_per_attempt,
    output_lengths,
    pass_label,
    pass_rate_per_expectation,
    throughput_over_time,
)
from batchgen.report.read import Publication


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


CHART_COUNT = 4  # the page's charts, in order: finish reasons, lengths, expectations, throughput


def report_charts(pub: Publication, which: Sequence[int] | None = None) -> list[dict[str, str]]:
    """The page's charts as {title, src}: all four in order, or those at the indices `which` (in that order), each
    drawn from its own figures only, so that several processes can draw a page's charts between them."""
    bounds = pub.expectations
    draw = [
        ("Finish reasons per attempt", lambda: chart_finish_reasons(finish_reasons_per_attempt(pub))),
        ("Output length against the expected bounds",
         lambda: chart_lengths(output_lengths(pub), bounds.get("min_chars"), bounds.get("max_chars"))),
        ("Pass rate per expectation", lambda: chart_expectations(pass_rate_per_expectation(pub.validation))),
        ("Throughput over the run",
         lambda: chart_throughput(throughput_over_time(pub), pub.manifest.tokens.output_per_second)),
    ]
    return [{"title": draw[i][0], "src": draw[i][1]()} for i in (range(CHART_COUNT) if which is None else which)]
